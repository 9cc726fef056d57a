"""Read-side queries over the live versions of the core views (status, recovery)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NotRequired, TypedDict

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain.errors import IntegrityFailure
from ledger.log.sqltypes import dec
from projections.framework import code_mismatch
from projections.registry import ALL_PROJECTIONS
from projections.state import load_states
from projections.views.installed_pack import INSTALLED_PACK, InstalledPackView
from projections.views.pack_activation import PACK_ACTIVATION, PackActivationView
from projections.views.pack_generation import PACK_GENERATION, PackGenerationView


def _code_versions() -> dict[str, int]:
    """Each view's code version in this program."""
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


class RemovedPack(TypedDict):
    """What the last removal of a pack retired (R7): the generation or local_path record,
    and, for an official pack, the epoch it was active at."""

    install_id: str
    source_kind: str
    revision: str | None
    active_epoch: int | None  # the retired generation's epoch; None for local_path
    position: int  # log position of the removal


class PackStatus(TypedDict):
    """One pack as ``status`` shows it: selected generation, newest attempt, dirty.

    A removed pack (R7) has ``status`` ``removed``, ``epoch`` the pointer's epoch after
    the removal (``None`` for local_path, which has no pointer) and ``removed`` what
    the removal retired. Only a removed pack has ``removed``: the status of stores
    without removals reads exactly as before (the golden stores, R23)."""

    pack: str
    source_kind: str | None
    status: str | None
    active_install_id: str | None
    revision: str | None
    epoch: int | None
    installed_install_id: str | None
    newest_attempt: NewestAttempt | None
    dirty: bool
    removed: NotRequired[RemovedPack]


#: A removal event as the log holds it: (position, type name, current-version state).
Removal = tuple[int, str, dict[str, Any]]


def pack_status(conn: Connection, removals: Sequence[Removal] = ()) -> list[PackStatus]:
    """Per pack: selected generation, newest attempt and whether it is dirty.

    ``removals`` are the log's removal events (``activation.removed``,
    ``local_pack.removed``): the views keep no row of a removed pack (R7), so a pack
    whose last removal is not followed by a selected generation or a compatibility row
    is shown as removed from them."""
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
    generations: dict[tuple[str, str], Any] = {}
    for r in conn.execute(
        sa.select(gen)
        .where(gen.c.view_version == versions[PackGenerationView.name])
        .order_by(gen.c.pack, gen.c.ordinal)
    ):
        newest[dec(r.pack)] = r
        generations[(dec(r.pack), dec(r.install_id))] = r
    last_removal: dict[str, Removal] = {}
    for removal in sorted(removals, key=lambda r: r[0]):
        last_removal[str(removal[2].get("pack"))] = removal
    out: list[PackStatus] = []
    for pack in sorted(set(installed) | set(newest) | set(last_removal)):
        row = installed.get(pack)
        attempt = newest.get(pack)
        activation = activations.get(pack)
        removed = (
            _removed(last_removal[pack], generations)
            if pack in last_removal and row is None and activation is None
            else None
        )
        out.append(
            {
                "pack": pack,
                "source_kind": dec(row.source_kind)
                if row is not None
                else (removed["source_kind"] if removed else None),
                "status": dec(row.status) if row is not None else ("removed" if removed else None),
                "active_install_id": dec(activation.install_id) if activation else None,
                "revision": dec(activation.revision) if activation else None,
                "epoch": activation.epoch
                if activation
                else (_removal_epoch(last_removal[pack]) if removed else None),
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
        if removed is not None:
            out[-1]["removed"] = removed
    return out


def _removal_epoch(removal: Removal) -> int | None:
    """The pointer's epoch after an official pack's removal; a local_path pack has none."""
    epoch = removal[2].get("epoch")
    return epoch if isinstance(epoch, int) else None


def _removed(removal: Removal, generations: dict[tuple[str, str], Any]) -> RemovedPack:
    """What ``removal`` retired, with the retired generation's facts from the view."""
    position, _name, data = removal
    pack = str(data.get("pack"))
    if "from_install_id" not in data:  # local_pack.removed: a local_path record
        return {
            "install_id": str(data.get("install_id")),
            "source_kind": "local_path",
            "revision": None,
            "active_epoch": None,
            "position": position,
        }
    install_id, revision = data["from_install_id"], data.get("from_revision")
    retired = generations.get((pack, str(install_id)))
    if retired is None or not isinstance(revision, str):
        raise IntegrityFailure(
            f"pack {pack!r} was removed from generation {install_id}, which the generation "
            "view does not hold; run `catalog-ledger projections verify`",
            pack=pack,
            install_id=install_id,
            position=position,
        )
    return {
        "install_id": str(install_id),
        "source_kind": dec(retired.source_kind),
        "revision": revision,
        "active_epoch": retired.epoch,
        "position": position,
    }
