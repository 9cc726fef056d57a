"""The read routes: an audience's view (with its watch) and the catalog head (R18, R19).

``GET /v1/audiences/{kind}/{id}/view`` serves what ``CatalogReader.view`` returns, with
``ETag`` = the audience's digest and ``304`` for a matching ``If-None-Match`` (after the
same verification, so a stale or tampered view is never confirmed); with ``wait`` it
waits for the audience's own content to change (``ledger.http.watch``). ``GET`` and
``HEAD`` of the view are answered by ``ViewFastPath`` ahead of the framework's routing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any
from urllib.parse import unquote_to_bytes

import anyio.to_thread
from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.types import ASGIApp, Receive, Scope, Send

from domain.errors import InvalidInput, LedgerError
from domain.identity import Audience
from domain.served import AudienceView
from ledger.http.caller import authenticated
from ledger.http.errors import error_response, internal_error
from ledger.http.models import AUTH_ERRORS, VIEW_PARAMETERS, VIEW_PATH, VIEW_RESPONSES, Head, View
from ledger.http.proofs import parse_proof, parse_since_size
from ledger.http.state import ServiceState
from ledger.http.watch import MAX_WAIT, MIN_WAIT, confirms
from projections.reader import parse_audience, parse_revision


class _AnyText(PathConvertor):
    """Starlette's ``path`` convertor (``.*``) stops at a newline, so an id holding one
    fell through to a route-level 404; this one takes every character, letting the
    reader reject the id as INVALID naming it (R19)."""

    regex = r"[\s\S]*"


register_url_convertor("anytext", _AnyText())


def add_read_routes(app: FastAPI, state: ServiceState) -> None:
    """The view (``GET``, ``HEAD``, its fast path) and the head, reading ``state``."""

    async def view(request: Request) -> Response:
        """The audience's facts at the active catalog revision, verified. Another audience
        than the token's answers exactly as an unknown audience does (R19, R26). With
        ``wait`` and a matching ``If-None-Match``, waits for the audience's own content
        to change (``ledger.http.watch``)."""
        who = authenticated(request, None)
        audience = parse_audience(request.path_params["kind"], request.path_params["audience_id"])
        if "\ufffd" in audience.id:  # perhaps bytes that are not UTF-8: judge the raw path
            audience = parse_audience(audience.kind.value, _raw_path_id(request))
        target = audience if who is None else who.scope(audience)
        query = request.query_params if request.scope["query_string"] else _NO_QUERY
        min_revision = parse_revision(query.get("min_revision"))
        wait = parse_wait(query.get("wait"))
        proof = parse_proof(query.get("proof"))
        since = parse_since_size(query.get("since_size"), proof)
        if proof:
            return await proven_view(target, min_revision, since)
        etags = _etags(_header(request.scope, b"if-none-match"))
        found, seen = await read_view(target, min_revision)
        if wait is not None and etags and confirms(found, etags):
            changed = await state.watch_hub().wait(target, etags, wait, seen)
            if changed is not None:
                found = changed
        if confirms(found, etags):
            return _Prepared(304, [(b"etag", found.etag.encode())])
        return _Prepared(200, _view_headers(found), found.body)

    app.add_api_route(
        VIEW_PATH,
        view,
        methods=["GET"],
        response_model=View,
        responses=VIEW_RESPONSES,
        openapi_extra={"parameters": VIEW_PARAMETERS, "security": [{"credential": []}]},
    )
    view_route = app.router.routes[-1]
    assert isinstance(view_route, APIRoute)
    app.add_api_route(VIEW_PATH, view, methods=["HEAD"], include_in_schema=False)
    # Added before the metrics middleware, so inside it: GET and HEAD of the view skip
    # the framework's routing and exception layers; any other method (405) or path goes
    # through them.
    app.add_middleware(ViewFastPath, route=view_route, handler=view)

    async def read_view(
        audience: Audience, min_revision: int | None
    ) -> tuple[AudienceView, tuple[Any, ...]]:
        """The verified view and its serving state: on SQLite, in line (a local read of
        microseconds); over the network, through the shared state read of ``StateGate``
        and, when the view must be read afresh, in a worker thread."""
        catalog = state.reader()
        gate = state.gate
        if gate is None:
            return catalog.view_at(audience, min_revision=min_revision)
        seen = await gate.current()
        found = catalog.cached(audience, seen, min_revision=min_revision)
        if found is not None:
            return found, seen
        return await anyio.to_thread.run_sync(
            partial(catalog.view_at, audience, min_revision=min_revision)
        )

    async def proven_view(
        audience: Audience, min_revision: int | None, since: int | None
    ) -> Response:
        """The view with its proof bundle (R29, ``ledger.http.proofs``): the stored
        checkpoint is read first, so a view newer than it is ``checkpoint_pending``;
        never a 304."""
        proofs = state.proof_service()
        gate = state.note_gate
        if gate is None:
            stored = proofs.stored()
            found, _ = await read_view(audience, min_revision)
            body = proofs.body(found, stored, since)
            return _Prepared(200, _proof_headers(body), body)
        pending = asyncio.ensure_future(gate.current())  # alongside the view's state read
        try:
            found, _ = await read_view(audience, min_revision)
        except BaseException:
            pending.cancel()
            raise
        stored = await pending
        cached = proofs.cached(found, stored, since)
        if cached is None:
            cached = await anyio.to_thread.run_sync(partial(proofs.body, found, stored, since))
        return _Prepared(200, _proof_headers(cached), cached)

    @app.get(
        "/v1/catalog/head",
        response_model=Head,
        responses=AUTH_ERRORS,
        dependencies=[Depends(authenticated)],  # any valid credential (R26)
    )
    def head() -> Head:
        """The active catalog revision and its content digest."""
        found = state.reader().head()
        return Head(revision=found.revision, content_digest=found.content_digest)


class ViewFastPath:
    """ASGI middleware answering ``GET`` and ``HEAD`` of the view route itself.

    The view is the hot path of a runtime fleet: matching its template here and calling
    its handler directly spares every read the router's scan, the exception middleware
    and the framework's per-request scaffolding. It is the same handler, with the same
    typed errors (``error_response``) and the same ``scope["route"]`` for the metrics;
    the route stays declared in the application for the OpenAPI document and a 405's
    ``Allow``."""

    def __init__(
        self, app: ASGIApp, route: APIRoute, handler: Callable[[Request], Awaitable[Response]]
    ) -> None:
        self.app = app
        self.route = route
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = None
        if scope["type"] == "http" and scope["method"] in ("GET", "HEAD"):
            found = self.route.path_regex.match(scope["path"])
        if found is None:
            await self.app(scope, receive, send)
            return
        scope["route"] = self.route
        scope["path_params"] = found.groupdict()
        response: Response
        try:
            response = await self.handler(Request(scope, receive))
        except LedgerError as exc:
            response = error_response(exc)
        except Exception as exc:  # as the application's last-resort handler answers
            response = internal_error(exc)
        await response(scope, receive, send)


def _header(scope: Scope, name: bytes) -> str | None:
    """One request header (ASGI gives names lower-cased), without building a mapping."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")  # type: ignore[no-any-return]
    return None


class _Prepared(Response):
    """A response whose header block is already built (the view's is built once per
    verified view, ``_view_headers``)."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes = b"") -> None:
        self.status_code = status
        self.raw_headers = headers
        self.body = body
        self.background = None


def _proof_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    """The headers of a view with its proof bundle (no ETag: a bundle is never a 304)."""
    return [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
    ]


#: Header blocks by verified view (the reader's cache keeps serving the same objects).
_HEADERS: dict[int, tuple[AudienceView, list[tuple[bytes, bytes]]]] = {}


def _view_headers(view: AudienceView) -> list[tuple[bytes, bytes]]:
    found = _HEADERS.get(id(view))
    if found is not None and found[0] is view:
        return found[1]
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(view.body)).encode()),
        (b"etag", view.etag.encode()),
    ]
    if len(_HEADERS) >= 4096:
        _HEADERS.clear()
    _HEADERS[id(view)] = (view, headers)
    return headers


_NO_QUERY: dict[str, str] = {}


def _etags(header: str | None) -> frozenset[str]:
    """The validators of ``If-None-Match``, compared weakly (RFC 9110 section 13.1.2)."""
    if not header:
        return frozenset()
    return frozenset(part.strip().removeprefix("W/") for part in header.split(","))


def parse_wait(value: str | None) -> int | None:
    """``wait`` seconds of a watch: an integer from 1 to 300, else INVALID naming it."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or not MIN_WAIT <= int(value) <= MAX_WAIT:
        raise InvalidInput(
            f"wait must be a whole number of seconds from {MIN_WAIT} to {MAX_WAIT}, got {value!r}",
            field="wait",
            part="wait",
        )
    return int(value)


def _raw_path_id(request: Request) -> str:
    """The audience id of the path from its exact bytes: Starlette replaces bytes that
    are not UTF-8 by U+FFFD, while R1 ids are exact UTF-8 (INVALID naming the id)."""
    raw: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    segments = raw.split(b"?", 1)[0].split(b"/")  # '', v1, audiences, kind, id..., view
    try:
        return unquote_to_bytes(b"/".join(segments[4:-1])).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(
            "audience id is invalid: it is not valid UTF-8 (percent-decoded)",
            field="audience.id",
            part="id",
        ) from None
