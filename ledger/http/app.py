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

import gc
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.exceptions import HTTPException as StarletteHTTPException

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
from ledger.http.auth import (
    REFRESH_SECONDS,
    Authenticator,
    Caller,
    CredentialCache,
    view_loader,
    www_authenticate,
)
from ledger.http.metrics import HttpMetrics, MetricsMiddleware, StoreCollector, multiprocess_dir
from ledger.http.tls import client_certificate
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
        request.headers.get("authorization"), client_certificate(request.scope)
    )


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
    headers = (
        {"WWW-Authenticate": www_authenticate(error)}
        if isinstance(error, Unauthenticated)
        else None
    )
    return JSONResponse(error.to_json(), status_code=status_of(error), headers=headers)


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
#: Environment switch of ``serve --no-auth --workers N`` (read by each worker).
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
) -> FastAPI:
    """The ASGI app; ``ledger_factory`` opens the store (``None``: schema only).

    ``auth`` (the default) requires a credential's bearer token on every runtime read
    (R26); ``clock`` decides expiry and ``refresh_clock`` when the live credentials are
    re-read (every ``credential_refresh`` seconds)."""
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
            if auth:
                cache = CredentialCache(
                    view_loader(ledger.db), refresh=credential_refresh, monotonic=refresh_clock
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
            if "ledger" in state:
                state["ledger"].close()

    app = FastAPI(
        title="Catalog Ledger read service",
        version=API_VERSION,
        description="Fail-closed audience views of the active catalog revision.",
        lifespan=lifespan,
    )
    app.state.auth_required = auth
    # Request metrics by route template and outcome; store gauges computed per scrape.
    metrics = HttpMetrics(
        StoreCollector(lambda: state.get("ledger")), multiprocess_dir=multiprocess_dir()
    )
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    @app.exception_handler(LedgerError)
    async def ledger_error(_: Request, exc: LedgerError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": ["request"], "msg": "invalid"}
        field = ".".join(str(p) for p in first.get("loc", ["request"]))
        return _error(InvalidInput(f"{field}: {first.get('msg', 'invalid')}", field=field))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "MISSING" if exc.status_code == 404 else "INVALID"
        body = {"error": code, "message": str(exc.detail), "details": {}}
        return JSONResponse(body, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception) -> JSONResponse:
        body = {"error": "ERROR", "message": f"internal error: {type(exc).__name__}", "details": {}}
        return JSONResponse(body, status_code=503)

    def reader() -> CatalogReader:
        if "reader" not in state:
            raise Unavailable("the read service has no store")
        found: CatalogReader = state["reader"]
        return found

    @app.get(
        "/v1/audiences/{kind}/{audience_id:anytext}/view",
        response_model=View,
        responses={304: {"description": "Not modified (ETag matches)"}, **_AUTH_ERRORS},
    )
    def view(
        kind: Annotated[str, Path(description=_KIND_DOC, json_schema_extra=_KIND_SCHEMA)],
        audience_id: Annotated[str, Path(description=_ID_DOC, json_schema_extra=_ID_SCHEMA)],
        request: Request,
        who: Authenticated,
        min_revision: Annotated[
            str | None, Query(description=_REVISION_DOC, json_schema_extra=_REVISION_SCHEMA)
        ] = None,
    ) -> Response:
        """The audience's facts at the active catalog revision, verified. Another audience
        than the token's answers exactly as an unknown audience does (R19, R26)."""
        audience = parse_audience(kind, audience_id)
        target = audience if who is None else who.scope(audience)
        result = reader().view(target, min_revision=parse_revision(min_revision))
        etag = f'"{result.content_digest}"'
        if etag in _etags(request.headers.get("if-none-match")):
            return Response(status_code=304, headers={"ETag": etag})
        return JSONResponse(result.to_json(), headers={"ETag": etag})

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
        if "ledger" not in state:
            raise Unavailable("the read service has no store")
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

    return app


def app_from_environment() -> FastAPI:
    """The app of one ``serve --workers N`` worker process (an import string for uvicorn):
    the store URL (``CATALOG_LEDGER_DB``), the log settings and the metrics folder come
    from the environment the serve command set for its workers."""
    from ledger.api import Store

    configure_from_environment()
    return create_app(Store().opener(), auth=os.environ.get(NO_AUTH_ENV) != "1")


def _etags(header: str | None) -> set[str]:
    if not header:
        return set()
    return {part.strip().removeprefix("W/") for part in header.split(",")}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document, as checked in at ``schema/openapi.json``."""
    return create_app().openapi()
