"""R28: a credential row of the view authenticates no one until the log confirms it.

The HTTP authenticator reads the live credentials from the ``credential`` view (a cache).
A view editor who rewrites a row's audience, forges a row for a token of their own, or
un-revokes a revoked credential gets INTEGRITY — never a caller. With the check off
(``projections.checks.CREDENTIAL``, test-only) the same edits would authenticate: the
test bites.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from domain.credentials import token_digest
from domain.errors import IntegrityFailure
from domain.identity import Audience, AudienceKind, Identity
from ledger.http.auth import Authenticator, CredentialCache, log_confirmer, view_loader
from projections import checks
from projections.views.credential import CREDENTIAL
from tests.support.lifecycle_support import World

FORGED = "A" * 43  # a token the attacker chose; the log never issued its digest


def _authenticator(world: World) -> Authenticator:
    world.ledger.runner.catch_up(world.db, "credential")
    cache = CredentialCache(view_loader(world.db), refresh=0.0, confirm=log_confirmer(world.ledger))
    return Authenticator(cache)


def _edit(world: World, sql: str, **params: object) -> None:
    with world.db.write() as conn:
        conn.execute(sa.text(sql.format(t=CREDENTIAL.physical.name)), params)


def _rewrite_audience(world: World, cid: str, token: str) -> str:
    _edit(
        world, "UPDATE {t} SET audience_id = :a WHERE credential_id = :c", a=b"two", c=cid.encode()
    )
    return token


def _forge_row(world: World, cid: str, token: str) -> str:
    with world.db.write() as conn:
        t = CREDENTIAL.physical
        row = conn.execute(sa.select(t).where(t.c.credential_id == cid.encode())).one()._asdict()
        row.update(credential_id=b"cred_" + b"f" * 24, token_digest=token_digest(FORGED))
        conn.execute(t.insert().values(row))
    return FORGED


def _unrevoke(world: World, cid: str, token: str) -> str:
    world.service.credentials_revoke(cid)
    world.ledger.runner.catch_up(world.db, "credential")
    _edit(world, "UPDATE {t} SET revoked_at_us = NULL WHERE credential_id = :c", c=cid.encode())
    return token


EDITS: dict[str, Callable[[World, str, str], str]] = {
    "audience rewritten": _rewrite_audience,
    "row forged for another token": _forge_row,
    "revocation erased": _unrevoke,
}


def test_r28_an_untampered_credential_authenticates_its_audience(world: World) -> None:
    issued = world.service.credentials_issue("app:one")
    caller = _authenticator(world).authenticate(f"Bearer {issued['token']}")
    assert caller.audience == Audience(AudienceKind("app"), Identity.trusted("one"))
    assert caller.credential_id == issued["credential_id"]


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_r28_an_edited_credential_row_is_integrity_never_a_caller(world: World, edit: str) -> None:
    issued = world.service.credentials_issue("app:one")
    authenticator = _authenticator(world)
    token = EDITS[edit](world, issued["credential_id"], issued["token"])
    with pytest.raises(IntegrityFailure) as caught:
        authenticator.authenticate(f"Bearer {token}")
    assert caught.value.details["table"] == "view_credential"


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_r28_with_the_credential_check_off_the_edit_would_authenticate(
    world: World, edit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check bites: without it, each edit gives the attacker a caller."""
    monkeypatch.setattr(checks, "DISABLED", {checks.CREDENTIAL})
    issued = world.service.credentials_issue("app:one")
    authenticator = _authenticator(world)
    token = EDITS[edit](world, issued["credential_id"], issued["token"])
    assert authenticator.authenticate(f"Bearer {token}").audience.kind.value == "app"


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_r28_credentials_list_shows_no_row_the_log_does_not_confirm(
    world: World, edit: str
) -> None:
    issued = world.service.credentials_issue("app:one")
    world.ledger.runner.catch_up(world.db, "credential")
    EDITS[edit](world, issued["credential_id"], issued["token"])
    with pytest.raises(IntegrityFailure) as caught:
        world.service.credentials_list()
    assert caught.value.details["table"] == "view_credential"


@pytest.mark.parametrize(
    ("column", "value"), [("issued_at_us", "abc"), ("expires_at_us", "zz"), ("token_digest", "ab")]
)
def test_r28_a_credential_cell_of_another_type_is_integrity_never_an_internal_error(
    sqlite_url: str, tmp_path: Path, column: str, value: str
) -> None:
    """Found by a hostile pass: such a cell was a 503 "internal error" over HTTP."""
    world = World(tmp_path, sqlite_url)
    issued = world.service.credentials_issue("app:one")
    authenticator = _authenticator(world)
    _edit(world, f"UPDATE {{t}} SET {column} = :v", v=value)
    with pytest.raises(IntegrityFailure) as caught:
        authenticator.authenticate(f"Bearer {issued['token']}")
    assert caught.value.details["table"] == "view_credential"
    with pytest.raises(IntegrityFailure):
        world.service.credentials_list()
    world.close()
