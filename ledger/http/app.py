"""The HTTP read service: audience views over FastAPI/uvicorn, failing closed (R18, R19).

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
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from functools import partial
from types import FrameType
from typing import Annotated, Any
from urllib.parse import unquote_to_bytes

import anyio.to_thread
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from domain.errors import (
    Conflict,
    IntegrityFailure,
    InvalidInput,
    LedgerError,
    Missing,
    Stale,
    Unauthenticated,
    Unavailable,
)
from domain.identity import Audience
from domain.served import AudienceView
from ledger.http.auth import (
    REFRESH_SECONDS,
    Authenticator,
    Caller,
    CredentialCache,
    log_confirmer,
    view_loader,
    www_authenticate,
)
from ledger.http.metrics import HttpMetrics, MetricsMiddleware, StoreCollector, multiprocess_dir
from ledger.http.serving import StateGate
from ledger.http.settings import MAX_WAITERS
from ledger.http.tls import client_certificate
from ledger.http.watch import (
    MAX_WAIT,
    MIN_WAIT,
    POLL_SECONDS,
    WatchHub,
    confirms,
)
from ledger.observability import configure_from_environment
from ledger.store import contract
from ledger.store.replica import replication, writable
from projections.reader import CatalogReader, parse_audience, parse_revision

API_VERSION = "1"


class _AnyText(PathConvertor):
    """Starlette's ``path`` convertor (``.*``) stops at a newline, so an id holding one
    fell through to a route-level 404; this one takes every character, letting the
    reader reject the id as INVALID naming it (R19)."""

    regex = r"[\s\S]*"


register_url_convertor("anytext", _AnyText())

# The view's parameters as the OpenAPI document describes them (R1, R19). Validation
# stays in ``parse_audience`` / ``parse_revision``, so every rejection is INVALID naming
# the part; these schemas only tell clients (and schemathesis) what is accepted.
_KIND_DOC = "Audience kind."
_KIND_SCHEMA: dict[str, Any] = {"enum": ["app", "integration"]}
_ID_DOC = (
    "Audience id (R1): exact UTF-8, at most 255 bytes, no control characters, "
    "no leading or trailing whitespace; case and normalization are significant."
)
_ID_SCHEMA: dict[str, Any] = {
    "minLength": 1,
    "maxLength": 255,
    "pattern": r"^[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$",
}
_REVISION_DOC = "Serve only a catalog revision at least this high (else 409 STALE)."
_REVISION_SCHEMA: dict[str, Any] = {"pattern": "^[0-9]{1,18}$"}
_WAIT_DOC = (
    "Watch: with `If-None-Match` matching the audience's current ETag, wait up to this "
    "many seconds for its own content to change (200 with the new view), else 304."
)
_INM_DOC = (
    'ETags seen (`W/"<audience digest>"`) or `*`: 304 when the audience\'s content is '
    "unchanged, even when the revision moved."
)

_STATUS: list[tuple[type[LedgerError], int]] = [
    (Unauthenticated, 401),
    (Missing, 404),
    (Stale, 409),
    (InvalidInput, 400),
    (IntegrityFailure, 500),
    (Conflict, 409),
    (Unavailable, 503),
]


class ErrorBody(BaseModel):
    error: str
    message: str
    details: dict[str, Any]


class Grant(BaseModel):
    pack: str
    kind: str
    key: str
    credential_set: str | None
    install_id: str


class Fact(BaseModel):
    pack: str
    install_id: str
    kind: str
    key: str
    payload: Any
    requires: list[dict[str, str | None]]
    credential_sets: list[str] | None
    #: The generation's payload hash: with the fields above it lets a client recompute
    #: ``fact_digest`` (``domain.served.fact_digest``), and so the audience digest.
    payload_hash: str
    fact_digest: str


class View(BaseModel):
    audience: str
    revision: int
    content_digest: str
    audience_digest: str
    grants: list[Grant]
    facts: list[Fact]


class Head(BaseModel):
    revision: int
    content_digest: str


class Replication(BaseModel):
    io_running: bool
    sql_running: bool
    seconds_behind_primary: int | None
    last_error: str | None


class Health(BaseModel):
    healthy: bool
    log_head: int
    catalog_revision: int | None
    projections: dict[str, dict[str, Any]]
    #: False when this service writes nothing (read-only server or SELECT-only account).
    writes: bool = True
    #: The replica's replication from its primary (None: not a replica, or not visible).
    replication: Replication | None = None
    #: The schema contract (R24), checked once when the service started.
    schema_ok: bool = True
    schema_differences: list[dict[str, Any]] = []


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


def authenticated(
    request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]
) -> Caller | None:
    """The audience a request authenticated as (``None`` with auth off), or 401 (R26).

    The header is parsed by the ``Authenticator``, not by ``HTTPBearer`` (which only
    documents the scheme), so a missing and a malformed header are told apart."""
    settings = request.app.state
    if not settings.auth_required:
        return None
    authenticator: Authenticator | None = getattr(settings, "authenticator", None)
    if authenticator is None:
        raise Unavailable("the read service has no store")
    return authenticator.authenticate(
        _authorization(request.scope), client_certificate(request.scope)
    )


REPEATED_AUTHORIZATION = (
    "the Authorization header is repeated: send exactly one (a proxy and this server "
    "could otherwise disagree about who is calling)"
)


def _authorization(scope: Scope) -> str | None:
    """The request's one ``Authorization`` header; sent twice it is INVALID (400), never
    "the first one wins" (R26: a read is authenticated as exactly one audience)."""
    found: str | None = None
    for key, value in scope["headers"]:
        if key == b"authorization":
            if found is not None:
                raise InvalidInput(REPEATED_AUTHORIZATION, field="Authorization")
            found = value.decode("latin-1")
    return found


Authenticated = Annotated[Caller | None, Depends(authenticated)]


def tune_gc_for_serving() -> None:
    """Fewer, cheaper collections in a long-running read process.

    A reader keeps caches of verified views; with the default thresholds the
    cyclic collector rescans them every few hundred allocations, which shows up
    directly in tail latency (measured: cold reads 190 -> 120 us). Objects alive
    at startup are frozen out of collection and young collections run less often.
    """
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def status_of(error: LedgerError) -> int:
    for cls, status in _STATUS:
        if isinstance(error, cls):
            return status
    return 500


def _error(error: LedgerError) -> JSONResponse:
    if isinstance(error, InvalidInput) and error.details.get("field") == "db":
        # Not the request's fault: the store the server opened is gone (dropped, deleted).
        error = Unavailable(f"the store is unavailable: {error.message}", **error.details)
    headers = {}
    if isinstance(error, Unauthenticated):
        headers["WWW-Authenticate"] = www_authenticate(error)
    if isinstance(error, Unavailable) and "retry_after" in error.details:
        headers["Retry-After"] = str(error.details["retry_after"])
    return JSONResponse(error.to_json(), status_code=status_of(error), headers=headers or None)


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in ((400, "INVALID"), (404, "MISSING"), (409, "STALE"), (500, "INTEGRITY"))
}
#: The answers of a route that needs a credential (R26).
_AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {
        "model": ErrorBody,
        "description": "UNAUTHENTICATED: the bearer token is missing, malformed, unknown, "
        "revoked or expired (with `WWW-Authenticate: Bearer`)",
    },
    **_ERRORS,
}
_VIEW_PATH = "/v1/audiences/{kind}/{audience_id:anytext}/view"
_VIEW_PARAMETERS: list[dict[str, Any]] = [
    {"name": "kind", "in": "path", "required": True, "description": _KIND_DOC,
     "schema": {"type": "string", **_KIND_SCHEMA}},
    {"name": "audience_id", "in": "path", "required": True, "description": _ID_DOC,
     "schema": {"type": "string", **_ID_SCHEMA}},
    {"name": "min_revision", "in": "query", "required": False, "description": _REVISION_DOC,
     "schema": {"type": "string", **_REVISION_SCHEMA}},
    {"name": "wait", "in": "query", "required": False, "description": _WAIT_DOC,
     "schema": {"type": "integer", "minimum": MIN_WAIT, "maximum": MAX_WAIT}},
    {"name": "If-None-Match", "in": "header", "required": False, "description": _INM_DOC,
     "schema": {"type": "string"}},
]  # fmt: skip
#: Environment switches of ``serve --workers N`` (read by each worker).
MAX_WAITERS_ENV = "CATALOG_LEDGER_SERVE_MAX_WAITERS"
DOCS_ENV = "CATALOG_LEDGER_SERVE_DOCS"
NO_AUTH_ENV = "CATALOG_LEDGER_SERVE_NO_AUTH"
_BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="credential",
    description="The token of an audience credential (`catalog-ledger credentials issue`). "
    "It reads that audience only; any other audience answers as an unknown one (404). "
    "Over TLS with `serve --tls-client-ca`, a client certificate naming one audience by "
    "its SAN URI `catalog-ledger:audience:<kind>:<id>` authenticates in place of a token.",
)


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
    state: dict[str, Any] = {}
    stop = threading.Event()

    def follow() -> None:
        ledger = state["ledger"]
        while not stop.wait(catch_up_every):
            for projection in ledger.runner.projections:
                if not projection.inline:
                    with suppress(LedgerError):
                        ledger.runner.catch_up(ledger.db, projection.name)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if ledger_factory is not None:
            ledger = ledger_factory()
            state["ledger"] = ledger
            state["reader"] = CatalogReader(ledger.db)
            if not ledger.db.is_sqlite:
                state["gate"] = StateGate(state["reader"].serving_state)
            state["watch"] = WatchHub(
                state["reader"],
                max_waiters=max_waiters,
                poll=watch_poll,
                counted=metrics.watchers.inc,
            )
            _release_waiters_on_exit(state["watch"])
            if auth:
                cache = CredentialCache(
                    view_loader(ledger.db),
                    refresh=credential_refresh,
                    monotonic=refresh_clock,
                    confirm=log_confirmer(ledger),
                )
                app.state.authenticator = Authenticator(cache, clock=clock)
            state["writes"] = writable(ledger.db)
            state["schema"] = [d.to_json() for d in contract.check(ledger.db)]
            tune_gc_for_serving()
            if state["writes"]:  # a replica's views follow its primary, never this process
                thread = threading.Thread(target=follow, name="catch-up", daemon=True)
                thread.start()
        try:
            yield
        finally:
            stop.set()
            if "watch" in state:
                state["watch"].close()
            if "ledger" in state:
                state["ledger"].close()

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
    # Request metrics by route template and outcome; store gauges computed per scrape.
    metrics = HttpMetrics(
        StoreCollector(lambda: state.get("ledger")), multiprocess_dir=multiprocess_dir()
    )

    @app.exception_handler(LedgerError)
    async def ledger_error(_: Request, exc: LedgerError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": ["request"], "msg": "invalid"}
        field = ".".join(str(p) for p in first.get("loc", ["request"]))
        return _error(InvalidInput(f"{field}: {first.get('msg', 'invalid')}", field=field))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "MISSING" if exc.status_code == 404 else "INVALID"
        body = {"error": code, "message": str(exc.detail), "details": {}}
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method of every route of this path
            headers["Allow"] = ", ".join(sorted(_allowed(app, request.scope)))
        return JSONResponse(body, status_code=exc.status_code, headers=headers or None)

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception) -> JSONResponse:
        return _internal(exc)

    def reader() -> CatalogReader:
        if "reader" not in state:
            raise Unavailable("the read service has no store")
        found: CatalogReader = state["reader"]
        gone = state["ledger"].db.vanished()
        if gone is not None:  # never serve a store that is no longer there
            raise Unavailable(f"the store is unavailable: {gone}")
        return found

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
        etags = _etags(_header(request.scope, b"if-none-match"))
        found, seen = await read_view(target, min_revision)
        if wait is not None and etags and confirms(found, etags):
            changed = await watch_hub().wait(target, etags, wait, seen)
            if changed is not None:
                found = changed
        if confirms(found, etags):
            return _Prepared(304, [(b"etag", found.etag.encode())])
        return _Prepared(200, _view_headers(found), found.body)

    app.add_api_route(
        _VIEW_PATH,
        view,
        methods=["GET"],
        response_model=View,
        responses={
            304: {"description": "Not modified: the audience's content is unchanged"},
            **_AUTH_ERRORS,
            503: {
                "model": ErrorBody,
                "description": "UNAVAILABLE (too many waiters: "
                "`Retry-After`; the store is unreachable)",
            },
        },
        openapi_extra={"parameters": _VIEW_PARAMETERS, "security": [{"credential": []}]},
    )
    view_route = app.router.routes[-1]
    assert isinstance(view_route, APIRoute)
    app.add_api_route(_VIEW_PATH, view, methods=["HEAD"], include_in_schema=False)
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
        catalog = reader()
        gate: StateGate | None = state.get("gate")
        if gate is None:
            return catalog.view_at(audience, min_revision=min_revision)
        seen = await gate.current()
        found = catalog.cached(audience, seen, min_revision=min_revision)
        if found is not None:
            return found, seen
        return await anyio.to_thread.run_sync(
            partial(catalog.view_at, audience, min_revision=min_revision)
        )

    def watch_hub() -> WatchHub:
        if "watch" not in state:
            raise Unavailable("the read service has no store")
        hub: WatchHub = state["watch"]
        return hub

    @app.get(
        "/v1/catalog/head",
        response_model=Head,
        responses=_AUTH_ERRORS,
        dependencies=[Depends(authenticated)],  # any valid credential (R26)
    )
    def head() -> Head:
        """The active catalog revision and its content digest."""
        found = reader().head()
        return Head(revision=found.revision, content_digest=found.content_digest)

    @app.get("/healthz", response_model=Health, responses={503: {"model": Health}})
    def healthz() -> JSONResponse:
        """Log head, served catalog revision, projection lag and, on a replica, its
        replication state and lag; 503 when a view has stopped."""
        reader()  # UNAVAILABLE when the store is gone
        ledger = state["ledger"]
        status = ledger.runner.status(ledger.db)
        try:
            revision: int | None = reader().head().revision
        except Missing:
            revision = None
        views = {
            v["name"]: {
                "lag": v.get("lag"),
                "state": v.get("state"),
                "mode": v.get("mode"),
                "error": v.get("error"),
                "rebuild_needed": v.get("rebuild_needed"),
            }
            for v in status["views"]
        }
        # A view built by other view code is not served (R25): not healthy either.
        healthy = all(v["state"] == "running" and not v["rebuild_needed"] for v in views.values())
        differences: list[dict[str, Any]] = state.get("schema", [])
        schema_ok = all(d["safe"] for d in differences)
        healthy = healthy and schema_ok
        replica = replication(ledger.db)
        body = Health(
            healthy=healthy,
            log_head=status["head"],
            catalog_revision=revision,
            projections=views,
            writes=state["writes"],
            replication=Replication(**replica) if replica is not None else None,
            schema_ok=schema_ok,
            schema_differences=differences,
        )
        return JSONResponse(body.model_dump(), status_code=200 if healthy else 503)

    @app.get("/metrics", include_in_schema=False)
    def prometheus_metrics() -> Response:
        """Prometheus text format (``ledger.http.metrics``); not part of the API document."""
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: sees every request
    if docs:
        app.add_api_route("/docs", lambda: HTMLResponse(docs_page(app.openapi())),
                          include_in_schema=False)  # fmt: skip
    return app


class ViewFastPath:
    """ASGI middleware answering ``GET`` and ``HEAD`` of the view route itself.

    The view is the hot path of a runtime fleet: matching its template here and calling
    its handler directly spares every read the router's scan, the exception middleware
    and the framework's per-request scaffolding. It is the same handler, with the same
    typed errors (``_error``) and the same ``scope["route"]`` for the metrics; the route
    stays declared in the application for the OpenAPI document and a 405's ``Allow``."""

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
            response = _error(exc)
        except Exception as exc:  # as the application's last-resort handler answers
            response = _internal(exc)
        await response(scope, receive, send)


def _internal(exc: Exception) -> JSONResponse:
    body = {"error": "ERROR", "message": f"internal error: {type(exc).__name__}", "details": {}}
    return JSONResponse(body, status_code=503)


def _allowed(app: FastAPI, scope: Any) -> set[str]:
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, BaseRoute) and route.matches(scope)[0] != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return methods


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


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document, as checked in at ``schema/openapi.json``."""
    return create_app().openapi()
