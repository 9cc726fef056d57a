"""Read-side queries over the live versions of the core views (status, recovery)."""

from __future__ import annotations

from typing import Any, TypedDict

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain.errors import IntegrityFailure
from ledger.log.sqltypes import dec
from projections.framework import code_mismatch, load_states
from projections.lifecycle_views import (
    INSTALLED_PACK,
    PACK_ACTIVATION,
    PACK_GENERATION,
    InstalledPackView,
    PackActivationView,
    PackGenerationView,
)


def _code_versions() -> dict[str, int]:
    """Each view's code version in this program (imported late: the registry imports us)."""
    from projections.registry import ALL_PROJECTIONS

    return {p.name: p.version for p in ALL_PROJECTIONS}


def require_running(conn: Connection, *names: str) -> dict[str, int]:
    """Live versions of ``names``; fail closed when one is stopped, missing, or built by
    other view code than this program's (R25)."""
    states = load_states(conn)
    versions = {}
    for name in names:
        state = states.get(name)
        if state is None:
            raise IntegrityFailure(f"view {name} is not initialized; run `catalog-ledger init`")
        if state.stopped:
            raise IntegrityFailure(
                f"view {name} stopped at position {state.error and state.error.get('position')}; "
                "run `catalog-ledger projections rebuild`",
                view=name,
                error=state.error,
            )
        code = _code_versions().get(name)
        if code is not None and state.code_version != code:
            raise code_mismatch(name, state.code_version, code)
        versions[name] = state.live_version
    return versions


def preparing_generations(conn: Connection) -> list[tuple[str, str]]:
    """(pack, install_id) of every attempt still ``preparing``, bytewise order."""
    version = require_running(conn, PackGenerationView.name)[PackGenerationView.name]
    t = PACK_GENERATION.physical
    rows = conn.execute(
        sa.select(t.c.pack, t.c.install_id)
        .where(t.c.view_version == version, t.c.status == b"preparing")
        .order_by(t.c.pack, t.c.install_id)
    )
    return [(dec(p), dec(i)) for p, i in rows]


class NewestAttempt(TypedDict):
    install_id: str
    ordinal: int
    status: str
    revision: str | None


class PackStatus(TypedDict):
    """One pack as ``status`` shows it: selected generation, newest attempt, dirty."""

    pack: str
    source_kind: str | None
    status: str | None
    active_install_id: str | None
    revision: str | None
    epoch: int | None
    installed_install_id: str | None
    newest_attempt: NewestAttempt | None
    dirty: bool


def pack_status(conn: Connection) -> list[PackStatus]:
    """Per pack: selected generation, newest attempt and whether it is dirty."""
    versions = require_running(
        conn, InstalledPackView.name, PackGenerationView.name, PackActivationView.name
    )
    ip, gen, act = INSTALLED_PACK.physical, PACK_GENERATION.physical, PACK_ACTIVATION.physical
    installed = {
        dec(r.pack): r
        for r in conn.execute(
            sa.select(ip).where(ip.c.view_version == versions[InstalledPackView.name])
        )
    }
    activations = {
        dec(r.pack): r
        for r in conn.execute(
            sa.select(act).where(act.c.view_version == versions[PackActivationView.name])
        )
    }
    newest: dict[str, Any] = {}
    for r in conn.execute(
        sa.select(gen)
        .where(gen.c.view_version == versions[PackGenerationView.name])
        .order_by(gen.c.pack, gen.c.ordinal)
    ):
        newest[dec(r.pack)] = r
    out: list[PackStatus] = []
    for pack in sorted(set(installed) | set(newest)):
        row = installed.get(pack)
        attempt = newest.get(pack)
        activation = activations.get(pack)
        out.append(
            {
                "pack": pack,
                "source_kind": dec(row.source_kind) if row is not None else None,
                "status": dec(row.status) if row is not None else None,
                "active_install_id": dec(activation.install_id) if activation else None,
                "revision": dec(activation.revision) if activation else None,
                "epoch": activation.epoch if activation else None,
                "installed_install_id": dec(row.install_id) if row is not None else None,
                "newest_attempt": {
                    "install_id": dec(attempt.install_id),
                    "ordinal": attempt.ordinal,
                    "status": dec(attempt.status),
                    "revision": dec(attempt.revision) if attempt.revision else None,
                }
                if attempt is not None
                else None,
                "dirty": attempt is not None and dec(attempt.status) == "failed_dirty",
            }
        )
    return out
