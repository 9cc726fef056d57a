"""Replaying the lifecycle from the log and checking every transition was legal (R6-R13).

An auditor must not trust the command service that wrote the log, so this is
an independent, event-by-event state machine over the decoded events, fed in
position order. ``feed`` returns the problem with the event (or ``None``);
``finish`` checks what must hold once every event has been seen (exactly one
active generation per activated pack, the pointer naming it, nothing
retired still selected). Removal (R7) moves the pointer to none and retires
the active generation with no successor; a removed pack may be installed
again as a fresh incarnation. A credential (R26) is issued once, for a valid
audience, and revoked at most once, for that same audience.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from domain.canonical import canonical_bytes_trusted
from domain.content import hash_problem
from domain.digests import Purpose, digest
from domain.identity import identity_problem

_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass
class _Gen:
    status: str
    origin: str
    payload_hash: str
    epoch: int | None = None


@dataclass
class _Pack:
    generations: dict[str, _Gen] = field(default_factory=dict)
    active: str | None = None  # the pointer's install id
    epoch: int = 0
    revision: str | None = None
    legacy: dict[str, Any] | None = None
    local: bool = False
    #: The pack's history ends in removal (R7): cleared by the next install.
    removed: bool = False
    #: The generation the last removal of the pointer retired (retirement pending).
    removing: str | None = None


class LifecycleAuditor:
    """Independent replay of pack lifecycles; names the first illegal transition."""

    def __init__(self) -> None:
        self.packs: dict[str, _Pack] = {}
        self.leases: dict[str, int] = {}
        self.catalog_revision = 0
        self.catalog_digest: str | None = None
        #: credential id -> (audience kind, audience id, issued at, revoked at or None).
        self.credentials: dict[str, tuple[str, str, int, int | None]] = {}
        #: Event type name -> its transition check (``None``: no rule), looked up once.
        self._handlers: dict[str, Callable[[dict[str, Any]], str | None] | None] = {}

    def _pack(self, name: str) -> _Pack:
        pack = self.packs.get(name)
        if pack is None:
            pack = self.packs[name] = _Pack()
        return pack

    def feed(self, name: str, data: dict[str, Any]) -> str | None:
        """The problem with event type ``name``, or ``None`` when the transition is legal."""
        try:
            handler = self._handlers[name]
        except KeyError:
            handler = self._handlers[name] = getattr(self, "_" + name.replace(".", "_"), None)
        if handler is None:
            return None
        try:
            result: str | None = handler(data)
        except (KeyError, TypeError, ValueError) as exc:
            return f"{name} event is malformed: {type(exc).__name__}: {exc}"
        return result

    # -- generations ---------------------------------------------------------------------

    def _generation_prepared(self, d: dict[str, Any]) -> str | None:
        pack = self._pack(d["pack"])
        install_id, origin = d["install_id"], d["origin"]
        if install_id in pack.generations:
            return f"generation {install_id} of {d['pack']!r} prepared twice (R9)"
        if pack.local:
            return f"a generation of local_path pack {d['pack']!r} (R5)"
        if pack.removing is not None:
            return f"prepared before removed generation {pack.removing} was retired (R7)"
        preparing = [i for i, g in pack.generations.items() if g.status == "preparing"]
        if preparing:
            return f"prepared while attempt {preparing[0]} is still preparing (R12)"
        # The components were parsed from the stored JSON, so every leaf is a JSON value:
        # their canonical bytes need no Python-level walk, and any non-canonical value
        # (a float) simply fails to match the recorded hash.
        components = canonical_bytes_trusted(d["components"])
        expected = "v1:" + digest(Purpose.PAYLOAD_V1, components).hex()
        if d["payload_hash"] != expected:
            return "the payload hash does not match the generation's components (R9)"
        source = d["source"]
        if source.get("kind") != "official_repo" or not source.get("revision"):
            return "a generation without official_repo@revision authority (R5)"
        if origin == "install":
            # The pointer must select nothing: never activated, or removed (R7). A legacy
            # record is authority until adopted or taken over by a local_path record.
            unconsumed = pack.legacy is not None and not pack.generations and not pack.removed
            if pack.active is not None or unconsumed:
                return "install of a pack that already has authority (R7)"
        elif origin == "advance":
            if pack.active is None or d.get("from_install_id") != pack.active:
                return "advance from a generation that is not the active one (R7)"
        elif origin == "adopt":
            problem = self._adoption(pack, d)
            if problem:
                return problem
        else:
            return f"unknown origin {origin!r} (R13)"
        pack.generations[install_id] = _Gen("preparing", origin, d["payload_hash"])
        if origin == "install":
            pack.removed = False  # a fresh incarnation begins
        return None

    @staticmethod
    def _adoption(pack: _Pack, d: dict[str, Any]) -> str | None:
        legacy = pack.legacy
        if legacy is None or pack.active is not None or pack.generations:
            return "adoption without a legacy record, or of a pack with history (R7)"
        if legacy["status"] != "active" or legacy["source"].get("kind") != "official_repo":
            return "adoption of a legacy record that is not an active official pack (R7)"
        if d["install_id"] != legacy["install_id"]:
            return "adoption did not preserve the legacy install id (R7)"
        stored = legacy["applied_payload_hash"]
        if hash_problem(stored) is not None:
            return "adoption without a usable legacy payload hash (R7)"
        v0 = "v0:" + hashlib.sha256(canonical_bytes_trusted(d["components"])).hexdigest()
        if stored not in (d["payload_hash"], v0):
            return "adoption whose content the legacy payload hash does not prove (R7)"
        return None

    def _gen(self, d: dict[str, Any]) -> _Gen | None:
        return self._pack(d["pack"]).generations.get(d["install_id"])

    def _generation_activated(self, d: dict[str, Any]) -> str | None:
        gen = self._gen(d)
        if gen is None or gen.status != "preparing":
            return "activation of a generation that is not preparing (R6)"
        if d["applied_payload_hash"] != gen.payload_hash:
            return "applied payload hash differs from the prepared one (R6)"
        gen.status, gen.epoch = "active", d["epoch"]
        return None

    def _generation_failed(self, d: dict[str, Any]) -> str | None:
        gen = self._gen(d)
        if gen is None or gen.status != "preparing":
            return "failure of a generation that is not preparing (R6)"
        gen.status = "failed_dirty" if d["dirty"] else "failed_clean"
        return None

    def _generation_retired(self, d: dict[str, Any]) -> str | None:
        gen = self._gen(d)
        pack = self._pack(d["pack"])
        if gen is None or gen.status != "active":
            return "retirement of a generation that is not active (R6)"
        if pack.active == d["install_id"]:
            return "retirement of the generation the activation still selects (R8)"
        removal = d["successor_install_id"] is None
        if removal != bool(d["removed"]):
            return "a retirement whose successor and removal flag disagree (R7)"
        if removal:
            if pack.removing != d["install_id"]:
                return "retirement without a successor of a generation no removal moved from (R7)"
            if d["epoch"] != pack.epoch:
                return f"removal retired at epoch {d['epoch']}, the pointer is at {pack.epoch} (R7)"
            pack.removing = None
        elif pack.active != d["successor_install_id"]:
            return "retirement naming a successor the pointer does not select (R8)"
        gen.status = "retired"
        return None

    # -- the activation pointer ----------------------------------------------------------

    def _activation_started(self, d: dict[str, Any]) -> str | None:
        pack = self._pack(d["pack"])
        gen = pack.generations.get(d["install_id"])
        if pack.active is not None or pack.epoch != 0:
            return "a second first activation (R7)"
        if d["epoch"] != 1:
            return f"first activation at epoch {d['epoch']}, not 1 (R7)"
        if gen is None or gen.status != "active" or gen.epoch != 1:
            return "the pointer names a generation that was not activated at epoch 1 (R8)"
        pack.active, pack.epoch, pack.revision = d["install_id"], 1, d["revision"]
        return None

    def _activation_advanced(self, d: dict[str, Any]) -> str | None:
        pack = self._pack(d["pack"])
        gen = pack.generations.get(d["install_id"])
        if pack.active != d["from_install_id"] or pack.revision != d["from_revision"]:
            return "the pointer moved from a generation it did not select (R7)"
        if d["epoch"] != pack.epoch + 1:
            return f"epoch {d['epoch']} does not follow {pack.epoch} (R8)"
        if gen is None or gen.status != "active" or gen.epoch != d["epoch"]:
            return "the pointer moved to a generation not activated at that epoch (R8)"
        pack.active, pack.epoch, pack.revision = d["install_id"], d["epoch"], d["revision"]
        return None

    def _activation_removed(self, d: dict[str, Any]) -> str | None:
        pack = self._pack(d["pack"])
        if pack.active is None:
            return f"removal of pack {d['pack']!r}, which has no active generation (R7)"
        if pack.active != d["from_install_id"] or pack.revision != d["from_revision"]:
            return "the pointer was removed from a generation it did not select (R7)"
        if d["epoch"] != pack.epoch + 1:
            return f"removal at epoch {d['epoch']} does not follow {pack.epoch} (R7)"
        pack.removing, pack.active, pack.revision = pack.active, None, None
        pack.epoch, pack.removed = d["epoch"], True
        return None

    def _activation_reinstalled(self, d: dict[str, Any]) -> str | None:
        pack = self._pack(d["pack"])
        gen = pack.generations.get(d["install_id"])
        if pack.active is not None or pack.epoch == 0 or pack.removing is not None:
            return "a re-installation of a pack that was not removed (R7)"
        if d["epoch"] != pack.epoch + 1:
            return f"epoch {d['epoch']} does not follow {pack.epoch} (R8)"
        if gen is None or gen.status != "active" or gen.epoch != d["epoch"]:
            return "the pointer moved to a generation not activated at that epoch (R8)"
        if gen.origin != "install":
            return "a re-installation selects a generation that is not an install (R7)"
        pack.active, pack.epoch, pack.revision = d["install_id"], d["epoch"], d["revision"]
        return None

    # -- other pack records --------------------------------------------------------------

    def _legacy_imported(self, d: dict[str, Any]) -> str | None:
        pack = self._pack(d["pack"])
        if pack.generations or pack.local or pack.legacy is not None:
            return "legacy record imported for a pack that already has history"
        pack.legacy = d
        return None

    def _local_pack_installed(self, d: dict[str, Any]) -> str | None:
        pack = self._pack(d["pack"])
        if pack.active is not None or pack.removing is not None:
            return "a local_path record for a pack with an active generation (R5)"
        if pack.generations and not pack.removed:
            return "a local_path record for a pack with generations (R5)"
        if (
            not pack.generations
            and pack.legacy is not None
            and pack.legacy["source"].get("kind") != "local_path"
        ):
            return "a local_path record replacing an official legacy pack (R5)"
        pack.local, pack.removed = True, False
        return None

    def _local_pack_updated(self, d: dict[str, Any]) -> str | None:
        return None if self._pack(d["pack"]).local else "update of an unknown local pack"

    def _local_pack_removed(self, d: dict[str, Any]) -> str | None:
        pack = self._pack(d["pack"])
        if not pack.local:
            return f"removal of local_path pack {d['pack']!r}, which is not installed (R7)"
        pack.local, pack.removed = False, True
        return None

    def _local_pack_reinstalled(self, d: dict[str, Any]) -> str | None:
        pack = self._pack(d["pack"])
        if pack.local or not pack.removed or pack.active is not None:
            return f"re-installation of local_path pack {d['pack']!r}, which was not removed (R7)"
        pack.local, pack.removed = True, False
        return None

    # -- coordination and the catalog lineage ---------------------------------------------

    def _lease_acquired(self, d: dict[str, Any]) -> str | None:
        previous = self.leases.get("writer", 0)
        if d["epoch"] != previous + 1:
            return f"lease epoch {d['epoch']} does not follow {previous} (R12)"
        self.leases["writer"] = d["epoch"]
        return None

    def _lease_broken(self, d: dict[str, Any]) -> str | None:
        previous = self.leases.get("writer", 0)
        if d["epoch"] != previous + 1:
            return f"lease break epoch {d['epoch']} does not follow {previous} (R27)"
        self.leases["writer"] = d["epoch"]
        return None

    def _catalog_published(self, d: dict[str, Any]) -> str | None:
        if d["revision"] != self.catalog_revision + 1:
            return f"revision {d['revision']} does not follow {self.catalog_revision} (R17)"
        if d["parent_digest"] != self.catalog_digest:
            return "the parent digest is not the previous revision's digest (R17)"
        self.catalog_revision, self.catalog_digest = d["revision"], d["content_digest"]
        return None

    # -- audience credentials (R26) -------------------------------------------------------

    def _credential_issued(self, d: dict[str, Any]) -> str | None:
        cid = d["credential_id"]
        if cid in self.credentials:
            return f"credential {cid} issued twice (R26)"
        if d["audience_kind"] not in ("app", "integration") or identity_problem(d["audience_id"]):
            return f"credential {cid} names no valid audience (R26)"
        if not _HEX_DIGEST.fullmatch(d["token_digest"]):
            return f"credential {cid} holds no 32-byte token digest (R26)"
        issued, expires = d["issued_at_us"], d["expires_at_us"]
        if expires is not None and expires <= issued:
            return f"credential {cid} expires before it was issued (R26)"
        self.credentials[cid] = (d["audience_kind"], d["audience_id"], issued, None)
        return None

    def _credential_revoked(self, d: dict[str, Any]) -> str | None:
        cid = d["credential_id"]
        known = self.credentials.get(cid)
        if known is None:
            return f"revocation of credential {cid}, which was never issued (R26)"
        kind, ident, issued, revoked = known
        if revoked is not None:
            return f"credential {cid} revoked twice (R26)"
        if (d["audience_kind"], d["audience_id"]) != (kind, ident):
            return f"revocation of credential {cid} names another audience than its issue (R26)"
        if d["revoked_at_us"] < issued:
            return f"credential {cid} revoked before it was issued (R26)"
        self.credentials[cid] = (kind, ident, issued, d["revoked_at_us"])
        return None

    def finish(self) -> list[str]:
        """What must hold at the head: one active generation per pack, the pointer's."""
        problems = []
        for name, pack in sorted(self.packs.items()):
            active = sorted(i for i, g in pack.generations.items() if g.status == "active")
            expected = [pack.active] if pack.active is not None else []
            if active != expected:
                problems.append(
                    f"pack {name!r}: active generations {active} but the pointer selects "
                    f"{pack.active} (R8, R13)"
                )
        return problems
