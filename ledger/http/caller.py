"""Who is calling: the audience a request authenticated as (R26), as a FastAPI
dependency. The token is checked by ``ledger.http.auth.Authenticator``; a client
certificate by ``ledger.http.tls``; here the request's one ``Authorization`` header is
found and handed to them.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import Scope

from domain.errors import InvalidInput, Unavailable
from ledger.http.auth import Authenticator, Caller
from ledger.http.tls import client_certificate

#: Documents the scheme in the OpenAPI document; the header is parsed by the
#: ``Authenticator``, so that a missing and a malformed header are told apart.
BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="credential",
    description="The token of an audience credential (`catalog-ledger credentials issue`). "
    "It reads that audience only; any other audience answers as an unknown one (404). "
    "Over TLS with `serve --tls-client-ca`, a client certificate naming one audience by "
    "its SAN URI `catalog-ledger:audience:<kind>:<id>` authenticates in place of a token.",
)


def authenticated(
    request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]
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
