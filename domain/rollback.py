"""Rolling back to a revision: the release that restores revision N's content (pure).

Inputs are what the log says (read by ``ledger.audit.revision_state``, R28): every
official pack active when N was published, with the frozen source of its generation
(``generation.prepared``), N's bindings and N's digests; and the store now (official
packs active, ``local_path`` packs, bindings, the revision in force).

The release, as a manifest for the normal ``apply``:

* every pack N had active is listed with the source N's generation froze: a pack at
  another revision now **advances** to a fresh generation of it, a pack removed since
  N is **reinstalled** as a fresh incarnation (R7), a pack at N's revision and payload
  is **unchanged**;
* every official pack active now that N did not have is **removed**;
* the bindings are exactly N's (``bindings`` present: that set, R14 binds them to the
  generations the release activates);
* ``local_path`` packs are not listed, so they are left as they are; credentials are
  not part of a release and are not rolled back.

Install ids and epochs are new, so the published content digest is not N's (R7, R17);
the payload-equivalence digest (``publisher.equivalence``) is, when the rollback
restored N's content.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.errors import IntegrityFailure, InvalidInput

__all__ = [
    "ActivePack",
    "FrozenSource",
    "Grant",
    "PackStep",
    "RevisionContent",
    "RollbackPlan",
    "StoreNow",
    "plan_rollback",
]

#: What a rollback does to one pack (``unchanged``: N's revision and payload are active).
ADVANCE, REINSTALL, REMOVE, UNCHANGED = "advance", "reinstall", "remove", "unchanged"


@dataclass(frozen=True)
class FrozenSource:
    """The ``official_repo`` source a generation froze: repository (as resolved, an
    absolute path), commit and path of ``pack.json``."""

    repo: str
    revision: str
    path: str


@dataclass(frozen=True)
class ActivePack:
    """An official pack's active generation (``source``: what it froze, when read)."""

    pack: str
    install_id: str
    revision: str
    epoch: int
    payload_hash: str
    source: FrozenSource | None = None


@dataclass(frozen=True)
class Grant:
    """A binding as a manifest names it: audience and component, no install id."""

    audience_kind: str
    audience_id: str
    pack: str
    kind: str
    key: str
    credential_set: str | None

    def sort_key(self) -> tuple[str, str, str, str, str, str]:
        """Bytewise order of ``BindingRow.ident`` (no credential set sorts first)."""
        a_kind, a_id, pack, kind, key = (
            self.audience_kind,
            self.audience_id,
            self.pack,
            self.kind,
            self.key,
        )
        return (a_kind, a_id, pack, kind, key, self.credential_set or "")

    @property
    def audience(self) -> str:
        return f"{self.audience_kind}:{self.audience_id}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "audience": self.audience,
            "pack": self.pack,
            "kind": self.kind,
            "key": self.key,
        }
        if self.credential_set is not None:
            out["credential_set"] = self.credential_set
        return out


@dataclass(frozen=True)
class RevisionContent:
    """A published revision as the log holds it: the official packs active when it was
    published, its bindings, its content digest and payload-equivalence digests."""

    revision: int
    content_digest: str
    equivalence_digest: str
    audiences: Mapping[tuple[str, str], str]  # each audience's equivalence digest
    packs: Mapping[str, ActivePack]
    grants: tuple[Grant, ...]

    def digests(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "content_digest": self.content_digest,
            "payload_equivalence_digest": self.equivalence_digest,
        }


@dataclass(frozen=True)
class StoreNow:
    """The store at the head of the log: official packs active, ``local_path`` packs,
    the bindings recorded (published or not) and the revision in force."""

    packs: Mapping[str, ActivePack]
    local: frozenset[str]
    grants: tuple[Grant, ...]
    revision: RevisionContent | None


@dataclass(frozen=True)
class PackStep:
    """One pack's part of the rollback: from what is active now to N's generation."""

    pack: str
    action: str
    now: ActivePack | None
    then: ActivePack | None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pack": self.pack, "action": self.action}
        if self.now is not None:
            out["from"] = {
                "revision": self.now.revision,
                "install_id": self.now.install_id,
                "epoch": self.now.epoch,
                "payload_hash": self.now.payload_hash,
            }
        if self.then is not None:
            out["to"] = {
                "revision": self.then.revision,
                "payload_hash": self.then.payload_hash,
                "restores_install_id": self.then.install_id,
            }
            if self.then.source is not None:
                out["to"]["repo"] = self.then.source.repo
                out["to"]["path"] = self.then.source.path
        return out


@dataclass(frozen=True)
class RollbackPlan:
    """The rollback release: its steps, bindings and manifest, and what it leaves alone."""

    target: RevisionContent
    current: RevisionContent | None
    steps: tuple[PackStep, ...]
    restore: tuple[Grant, ...]
    revoke: tuple[Grant, ...]
    local: tuple[str, ...]
    changed_audiences: tuple[str, ...] = field(default=())

    def count(self, action: str) -> int:
        return sum(1 for s in self.steps if s.action == action)

    @property
    def empty(self) -> bool:
        """Nothing to do: every pack unchanged and the bindings already N's."""
        return all(s.action == UNCHANGED for s in self.steps) and not (self.restore or self.revoke)

    def summary(self) -> str:
        """What the rollback does, in one line: "2 packs advance, 1 reinstalled,
        1 removed; bindings 2 restored; 1 audience changes"."""
        words = [
            (ADVANCE, "advance", "advances"),
            (REINSTALL, "reinstalled", "reinstalled"),
            (REMOVE, "removed", "removed"),
        ]
        parts: list[str] = []
        for action, plural, single in words:
            n = self.count(action)
            if n:
                noun = "" if parts else (" pack" if n == 1 else " packs")
                parts.append(f"{n}{noun} {single if n == 1 else plural}")
        packs = ", ".join(parts) if parts else "no pack moves"
        bindings = [f"{len(self.restore)} restored"] if self.restore else []
        bindings += [f"{len(self.revoke)} revoked"] if self.revoke else []
        grants = "bindings " + ", ".join(bindings) if bindings else "bindings unchanged"
        n = len(self.changed_audiences)
        if self.empty and not n:
            n_ = self.target.revision
            return f"nothing to change: the store already has revision {n_}'s packs and bindings"
        audiences = f"{n} audience{'s' if n != 1 else ''} change{'s' if n == 1 else ''}"
        return f"{packs}; {grants}; {audiences if n else 'no audience changes'}"

    def manifest(self) -> dict[str, Any]:
        """The release manifest ``apply`` converges to (absolute repository paths)."""
        packs = []
        for step in self.steps:
            if step.then is None:
                continue
            assert step.then.source is not None
            source = step.then.source
            packs.append(
                {
                    "name": step.pack,
                    "source": {
                        "kind": "official_repo",
                        "repo": source.repo,
                        "revision": source.revision,
                        "path": source.path,
                    },
                }
            )
        out: dict[str, Any] = {
            "packs": packs,
            "bindings": [g.to_json() for g in self.target.grants],
        }
        removed = [s.pack for s in self.steps if s.action == REMOVE]
        if removed:
            out["remove"] = removed
        return out


def plan_rollback(target: RevisionContent, now: StoreNow) -> RollbackPlan:
    """The release that restores ``target``'s content over the store ``now``.

    Every pack of ``target`` needs the source its generation froze (else INTEGRITY:
    the log lacks what it must hold). A pack N had as an official pack that is a
    ``local_path`` pack now cannot be restored without touching a ``local_path`` pack:
    INVALID, naming it, before anything is appended."""
    clash = sorted(set(target.packs) & now.local)
    if clash:
        raise InvalidInput(
            f"pack {clash[0]!r} was an official pack at revision {target.revision} and is a "
            "local_path pack now; rollback leaves local_path packs alone, so it cannot "
            f"restore revision {target.revision} (remove {clash[0]!r} first)",
            field="to_revision",
            pack=clash[0],
            revision=target.revision,
        )
    for active in target.packs.values():
        if active.source is None:
            raise IntegrityFailure(
                f"pack {active.pack!r}'s generation {active.install_id}, active at revision "
                f"{target.revision}, has no official_repo generation.prepared event in the log",
                pack=active.pack,
                install_id=active.install_id,
            )
    steps: list[PackStep] = []
    for name in sorted(set(target.packs) | set(now.packs)):
        then, current = target.packs.get(name), now.packs.get(name)
        if then is None:
            action = REMOVE
        elif current is None:
            action = REINSTALL
        elif (current.revision, current.payload_hash) == (then.revision, then.payload_hash):
            action = UNCHANGED
        else:
            action = ADVANCE
        steps.append(PackStep(name, action, current, then))
    wanted, present = set(target.grants), set(now.grants)
    served = now.revision.audiences if now.revision is not None else {}
    changed = sorted(
        f"{a[0]}:{a[1]}"
        for a in set(served) | set(target.audiences)
        if served.get(a) != target.audiences.get(a)
    )
    return RollbackPlan(
        target=target,
        current=now.revision,
        steps=tuple(steps),
        restore=tuple(sorted(wanted - present, key=Grant.sort_key)),
        revoke=tuple(sorted(present - wanted, key=Grant.sort_key)),
        local=tuple(sorted(now.local)),
        changed_audiences=tuple(changed),
    )
