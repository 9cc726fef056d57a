"""What ``apply`` decided in its preflight, and the checks that keep that decision
whole until the final append (R11, R30): the preview still holds, the frozen packs are
still frozen, the unchanged packs are fenced on the states the plan read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from domain.classifier import PackState
from domain.errors import LedgerError
from domain.identity import PackName
from domain.manifest import Manifest
from ledger.commands.publishing import Anchor
from ledger.commands.release import FrozenPack, frozen_packs
from ledger.commands.simulate import Pack, Plan, Release
from ledger.store.runtime import Ledger, Repository


@dataclass(frozen=True)
class Decided:
    """A release that has work to do: its command id, its packs (the frozen ones
    confirmed at this snapshot), the states it read, the anchor it built on (``None``:
    a full build), a busy lease."""

    cid: str
    packs: list[Pack]
    states: dict[PackName, PackState]
    anchor: Anchor | None
    busy: LedgerError | None
    #: The decision and what it previewed (reused under the lease when nothing moved).
    plan: Plan
    preview: Release
    #: The manifest and the folder its paths are relative to (to check frozen packs).
    manifest: Manifest
    base: Path


def still_preview(
    decided: Decided, anchor: Anchor, plan: Plan, candidates: Mapping[str, str]
) -> Release | None:
    """The preflight's release when it is still the one to append: the same plan, the
    same revision in force, binding events and moved packs but the candidates' own
    prepare, and each candidate the install id it predicted (R6: ``prepare`` mints
    them deterministically). The final append stays fenced from ``anchor`` on."""
    seen, preview = decided.anchor, decided.preview
    if seen is None or preview.fast is None or decided.plan != plan:
        return None
    ours = set(candidates)
    if (
        anchor.head != seen.head
        or anchor.changes != seen.changes
        or anchor.moved - ours != seen.moved - ours
    ):
        return None
    for pack, install_id in candidates.items():
        authority = preview.authorities.get(pack)
        if authority is None or authority.install_id != install_id:
            return None
    return preview


def still_frozen(ledger: Ledger, reader: Repository, decided: Decided, anchor: Anchor) -> bool:
    """Is every pack the release found frozen still frozen, at the same generation, at
    ``anchor``? Checked again from the log when another revision was published since."""
    assert decided.anchor is not None
    frozen = [r for r in decided.packs if isinstance(r, FrozenPack)]
    if anchor.head == decided.anchor.head:
        return not any(r.name in anchor.moved for r in frozen)
    if not frozen:
        return True
    again = frozen_packs(ledger.recorder, reader.conn, anchor, decided.manifest, decided.base)
    return all(again.get(r.index) == r for r in frozen)


def fenced_states(
    plan: Plan, planned: Mapping[PackName, PackState], read: Mapping[PackName, PackState]
) -> dict[PackName, PackState]:
    """The states the final append is fenced on: a pack with a step as just read (the
    step re-checks it inside the append), an unchanged one as the plan read it."""
    out = {p: s for p, s in planned.items() if plan.get(p, (None, None))[1] is None}
    out.update({p: s for p, s in read.items() if plan.get(p, (None, None))[1] is not None})
    return out
