"""A loopback HTTP proxy in front of ``catalog-ledger serve`` that misbehaves on cue.

Why: the runtime client must not take a view on a network path's word (R19, R29's
first half). Tests point a ``CatalogClient`` at this proxy, which forwards every GET
to the real server over real sockets and, as told, rewrites the JSON body of a 200
(``rewrite``: the body as parsed, returns the body to send; the ETag and the other
headers are kept, as a tampering middlebox that does not recompute digests would),
rewrites the request (``route``: path and headers, e.g. another audience's path with
that audience's token, as a shared cache that mixes up tenants would), or drops
query parameters and request headers (``If-None-Match``, ``wait``). Nothing is mocked.

``refuse(status, retry_after, times)`` answers the next ``times`` requests itself
(a busy balancer's 429 or 503 with ``Retry-After``). ``requests`` counts the requests
received; ``tampered`` the bodies rewritten.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import orjson

#: Hop-by-hop and framing headers the proxy sets itself.
_OWN = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"}

Route = Callable[[str, dict[str, str]], tuple[str, dict[str, str]]]


class TamperingProxy:
    """``base`` is the proxy's URL; ``rewrite``, ``route``, ``drop_params`` and
    ``drop_headers`` may be changed while it runs."""

    def __init__(self, upstream: str) -> None:
        self.rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self.route: Route | None = None
        self.drop_params: frozenset[str] = frozenset()
        self.drop_headers: frozenset[str] = frozenset()
        self.requests = 0
        self.tampered = 0
        self._refusals: list[tuple[int, str]] = []
        self._lock = threading.Lock()
        self._upstream = httpx.Client(base_url=upstream, timeout=httpx.Timeout(10.0, read=400.0))
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                proxy._forward(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def refuse(self, status: int, retry_after: str, times: int = 1) -> None:
        """Answer the next ``times`` requests with ``status`` and ``Retry-After``."""
        with self._lock:
            self._refusals.extend([(status, retry_after)] * times)

    def _forward(self, handler: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.requests += 1
            refusal = self._refusals.pop(0) if self._refusals else None
        if refusal is not None:
            status, retry_after = refusal
            body = orjson.dumps(
                {"error": "UNAVAILABLE", "message": "busy", "details": {}} if status == 503 else {}
            )
            handler.send_response(status)
            handler.send_header("retry-after", retry_after)
            handler.send_header("content-type", "application/json")
            handler.send_header("content-length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
            return
        parts = urlsplit(handler.path)
        query = [(k, v) for k, v in parse_qsl(parts.query) if k not in self.drop_params]
        path = parts.path
        headers = {
            k.lower(): v
            for k, v in handler.headers.items()
            if k.lower() not in _OWN | {"host"} | self.drop_headers
        }
        if self.route is not None:
            path, headers = self.route(path, headers)
        try:
            upstream = self._upstream.get(path, params=urlencode(query), headers=headers)
        except (httpx.TransportError, RuntimeError):  # the upstream is gone, or closing
            handler.send_error(502)
            return
        body = upstream.content
        rewrite = self.rewrite
        if upstream.status_code == 200 and rewrite is not None:
            body = orjson.dumps(rewrite(orjson.loads(body)))
            with self._lock:
                self.tampered += 1
        handler.send_response(upstream.status_code)
        for key, value in upstream.headers.multi_items():
            if key.lower() not in _OWN:
                handler.send_header(key, value)
        handler.send_header("content-length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._upstream.close()

    def __enter__(self) -> TamperingProxy:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
