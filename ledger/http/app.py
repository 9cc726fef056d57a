"""The HTTP read service: audience views over FastAPI/uvicorn, failing closed (R18, R19).

This module builds the app (``create_app``) from its parts: the read routes
(``ledger.http.views``), the operations routes (``ledger.http.health``), the caller's
authentication (``ledger.http.caller``), the errors' HTTP shape (``ledger.http.errors``),
the OpenAPI models (``ledger.http.models``) and the state the routes share
(``ledger.http.state``).

``GET /v1/audiences/{kind}/{id}/view`` serves what ``CatalogReader.view``
returns, with ``ETag`` = the revision's content digest and ``304`` for a
matching ``If-None-Match`` (after the same verification, so a stale or
tampered view is never confirmed). Errors use the DESIGN.md JSON shape:
404 MISSING, 409 STALE, 400 INVALID, 500 INTEGRITY. Catch-up views are kept
current by a background thread, but only where this process may write: on a
read-only server or through an account that may only SELECT (a read replica,
R19) the service never writes, and ``/healthz`` reports the replication state
and lag the replica knows of. The OpenAPI document is generated from the
response models and checked in as ``schema/openapi.json``. ``/metrics``
serves Prometheus metrics (``ledger.http.metrics``) and, being operations
rather than API, is left out of that document.

Runtime reads are authenticated (R26, ``ledger.http.auth``): the view and the
head need a credential's bearer token or, over TLS with a client CA, a client
certificate (``ledger.http.tls``); 401 UNAUTHENTICATED otherwise. Another
audience than the caller's answers as an unknown one (R19). ``/healthz`` and
``/metrics`` need nothing. ``create_app(..., auth=False)`` is ``serve --no-auth``.
"""

from __future__ import annotations

import asyncio
import gc
import html
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from types import FrameType
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from ledger.http.auth import (
    REFRESH_SECONDS,
    Authenticator,
    CredentialCache,
    log_confirmer,
    view_loader,
)
from ledger.http.errors import install_error_handlers
from ledger.http.health import add_health_routes
from ledger.http.metrics import HttpMetrics, MetricsMiddleware, StoreCollector, multiprocess_dir
from ledger.http.rotations import add_rotation_routes
from ledger.http.settings import MAX_WAITERS
from ledger.http.state import ServiceState
from ledger.http.views import add_read_routes
from ledger.http.watch import POLL_SECONDS, WatchHub
from ledger.observability import configure_from_environment

API_VERSION = "1"

#: Environment switches of ``serve --workers N`` (read by each worker).
MAX_WAITERS_ENV = "CATALOG_LEDGER_SERVE_MAX_WAITERS"
DOCS_ENV = "CATALOG_LEDGER_SERVE_DOCS"
NO_AUTH_ENV = "CATALOG_LEDGER_SERVE_NO_AUTH"


def tune_gc_for_serving() -> None:
    """Fewer, cheaper collections in a long-running read process.

    A reader keeps caches of verified views; with the default thresholds the
    cyclic collector rescans them every few hundred allocations, which shows up
    directly in tail latency (measured: cold reads 190 -> 120 us). Objects alive
    at startup are frozen out of collection and young collections run less often.
    """
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def create_app(
    ledger_factory: Callable[[], Any] | None = None,
    *,
    catch_up_every: float = 1.0,
    auth: bool = True,
    clock: Callable[[], float] = time.time,
    refresh_clock: Callable[[], float] = time.monotonic,
    credential_refresh: float = REFRESH_SECONDS,
    max_waiters: int = MAX_WAITERS,
    watch_poll: float = POLL_SECONDS,
    docs: bool = False,
) -> FastAPI:
    """The ASGI app; ``ledger_factory`` opens the store (``None``: schema only).

    ``auth`` (the default) requires a credential's bearer token on every runtime read
    (R26); ``clock`` decides expiry and ``refresh_clock`` when the live credentials are
    re-read (every ``credential_refresh`` seconds). At most ``max_waiters`` watches wait
    at once (``ledger.http.watch``). ``docs`` serves a self-contained ``/docs`` page."""
    state = ServiceState()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if ledger_factory is not None:
            ledger = ledger_factory()
            catalog = state.open(ledger)
            state.watch = WatchHub(
                catalog,
                max_waiters=max_waiters,
                poll=watch_poll,
                counted=metrics.watchers.inc,
            )
            _release_waiters_on_exit(state.watch)
            if auth:
                cache = CredentialCache(
                    view_loader(ledger.db),
                    refresh=credential_refresh,
                    monotonic=refresh_clock,
                    confirm=log_confirmer(ledger),
                )
                app.state.authenticator = Authenticator(cache, clock=clock)
            state.probe()
            tune_gc_for_serving()
            if state.writes:  # a replica's views follow its primary, never this process
                follow = partial(state.follow, catch_up_every)
                thread = threading.Thread(target=follow, name="catch-up", daemon=True)
                thread.start()
        try:
            yield
        finally:
            state.close()

    app = FastAPI(
        title="Catalog Ledger read service",
        version=API_VERSION,
        description="Fail-closed audience views of the active catalog revision.",
        lifespan=lifespan,
        # No redirect is ever built from the client's Host header: a path with a trailing
        # slash is 404, like any other path that is not a route (issue 25.2).
        redirect_slashes=False,
        docs_url=None,  # the stock pages load their assets from a CDN
        redoc_url=None,
        # No OpenTelemetry here (``/metrics`` is Prometheus): skip its per-request probe.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.auth_required = auth
    app.state.service = state  # what the routes share (tests read its caches' counters)
    # Request metrics by route template and outcome; store gauges computed per scrape.
    metrics = HttpMetrics(StoreCollector(lambda: state.ledger), multiprocess_dir=multiprocess_dir())

    install_error_handlers(app)
    add_read_routes(app, state)
    add_rotation_routes(app, state)
    add_health_routes(app, state, metrics)
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: sees every request
    if docs:
        app.add_api_route("/docs", lambda: HTMLResponse(docs_page(app.openapi())),
                          include_in_schema=False)  # fmt: skip
    return app


def _release_waiters_on_exit(hub: WatchHub) -> None:
    """Answer every waiting watch as soon as the server is told to stop, so that waits
    never delay a shutdown: uvicorn waits for open requests before it runs the
    lifespan's shutdown. Chains to the handler uvicorn installed (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(signum)

        def handler(sig: int, frame: FrameType | None, previous: Any = previous) -> None:
            loop.call_soon_threadsafe(hub.close)
            if callable(previous):
                previous(sig, frame)

        signal.signal(signum, handler)


def docs_page(document: dict[str, Any]) -> str:
    """A self-contained page (no outside assets, no script) describing the routes."""
    rows = []
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            summary = html.escape(operation.get("summary", ""))
            text = html.escape(operation.get("description", ""))
            rows.append(
                f"<h2><code>{method.upper()} {html.escape(path)}</code></h2>"
                f"<p><b>{summary}</b></p><pre>{text}</pre>"
            )
    title = html.escape(document["info"]["title"])
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head>"
        f"<body><h1>{title}</h1><p><a href='/openapi.json'>OpenAPI document</a></p>"
        f"{''.join(rows)}</body></html>"
    )


def app_from_environment() -> FastAPI:
    """The app of one ``serve --workers N`` worker process (an import string for uvicorn):
    the store URL (``CATALOG_LEDGER_DB``), the log settings and the metrics folder come
    from the environment the serve command set for its workers."""
    from ledger.api import Store

    configure_from_environment()
    return create_app(
        Store().opener(),
        auth=os.environ.get(NO_AUTH_ENV) != "1",
        max_waiters=int(os.environ.get(MAX_WAITERS_ENV, MAX_WAITERS)),
        docs=os.environ.get(DOCS_ENV) == "1",
    )


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document, as checked in at ``schema/openapi.json``."""
    return create_app().openapi()
