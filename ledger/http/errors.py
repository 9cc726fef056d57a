"""Typed errors as HTTP answers: the DESIGN.md JSON shape and its status codes.

404 MISSING, 409 STALE or CONFLICT, 400 INVALID, 401 UNAUTHENTICATED (with
``WWW-Authenticate``), 500 INTEGRITY, 503 UNAVAILABLE (with ``Retry-After`` when known);
a request the framework refuses (validation, unknown path, wrong method) answers in the
same shape, and anything unexpected is a 503 naming only the exception's type.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match

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
from ledger.http.auth import www_authenticate

_STATUS: list[tuple[type[LedgerError], int]] = [
    (Unauthenticated, 401),
    (Missing, 404),
    (Stale, 409),
    (InvalidInput, 400),
    (IntegrityFailure, 500),
    (Conflict, 409),
    (Unavailable, 503),
]


def status_of(error: LedgerError) -> int:
    for cls, status in _STATUS:
        if isinstance(error, cls):
            return status
    return 500


def error_response(error: LedgerError) -> JSONResponse:
    """``error`` in the JSON shape, with its status and headers."""
    if isinstance(error, InvalidInput) and error.details.get("field") == "db":
        # Not the request's fault: the store the server opened is gone (dropped, deleted).
        error = Unavailable(f"the store is unavailable: {error.message}", **error.details)
    headers = {}
    if isinstance(error, Unauthenticated):
        headers["WWW-Authenticate"] = www_authenticate(error)
    if isinstance(error, Unavailable) and "retry_after" in error.details:
        headers["Retry-After"] = str(error.details["retry_after"])
    return JSONResponse(error.to_json(), status_code=status_of(error), headers=headers or None)


def internal_error(exc: Exception) -> JSONResponse:
    """The last-resort answer: 503 naming the exception's type, nothing of its text."""
    body = {"error": "ERROR", "message": f"internal error: {type(exc).__name__}", "details": {}}
    return JSONResponse(body, status_code=503)


def install_error_handlers(app: FastAPI) -> None:
    """Every error ``app`` can raise answers in the JSON shape."""

    @app.exception_handler(LedgerError)
    async def ledger_error(_: Request, exc: LedgerError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": ["request"], "msg": "invalid"}
        field = ".".join(str(p) for p in first.get("loc", ["request"]))
        return error_response(InvalidInput(f"{field}: {first.get('msg', 'invalid')}", field=field))

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
        return internal_error(exc)


def _allowed(app: FastAPI, scope: Any) -> set[str]:
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, BaseRoute) and route.matches(scope)[0] != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return methods
