"""Pack lifecycle: generations, the activation pointer, and the one classifier (R5-R13).

An attempt, a selected generation and the compatibility view are different
facts. Each has one owner here:

* ``Generation`` — one attempt to install one pack content: ``preparing`` →
  ``active`` | ``failed_clean`` | ``failed_dirty``; ``active`` → ``retired``.
  Its frozen facts (source, revision, install id, category, payload hash,
  components) never change (R9); it has an applied payload hash only once
  activated (R6).
* ``PackActivation`` — the only selector of a pack's serving generation (R7),
  with an epoch that increases by one on every move.
* ``PackHistory`` — the ordered list of a pack's attempts (which install ids,
  in which order), so the newest attempt is known from the log alone.
* ``LocalPack`` — the mutable in-place record of a ``local_path`` pack (R5):
  shown in the compatibility view, never catalog authority.
* ``LegacyRecord`` — a pre-existing ``_System_InstalledPack`` row, recorded
  once so that it can be adopted.

``classify`` is the single classifier of a pack's state (R13) and
``rejection`` is the single preflight/terminal matrix (R11): the command
service calls both before any append and again inside the append transaction
against the locked current state.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.content import hash_problem
from domain.digests import Purpose, aggregate_id, digest, lp
from domain.errors import LifecycleRejected
from domain.identity import InstallId, PackName, identity_problem

#: Largest activation epoch; the pointer cannot move past it (R11 "exhausted epoch").
MAX_EPOCH = 2**63 - 1


class GenerationStatus(StrEnum):
    PREPARING = "preparing"
    ACTIVE = "active"
    FAILED_CLEAN = "failed_clean"
    FAILED_DIRTY = "failed_dirty"
    RETIRED = "retired"


TERMINAL = frozenset(
    {GenerationStatus.FAILED_CLEAN, GenerationStatus.FAILED_DIRTY, GenerationStatus.RETIRED}
)


class Origin(StrEnum):
    """How a generation came to be: the three ways the pointer may move (R7)."""

    INSTALL = "install"
    ADOPT = "adopt"
    ADVANCE = "advance"


class SourceKind(StrEnum):
    OFFICIAL_REPO = "official_repo"
    LOCAL_PATH = "local_path"


@dataclass(frozen=True)
class SourceFacts:
    """Where content came from: frozen into a generation, shown in the views."""

    kind: SourceKind
    locator: str
    revision: str | None
    path: str

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "locator": self.locator,
            "revision": self.revision,
            "path": self.path,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SourceFacts:
        return cls(SourceKind(data["kind"]), data["locator"], data.get("revision"), data["path"])

    @property
    def is_authority(self) -> bool:
        """R5: only ``official_repo@<full commit>`` is catalog authority."""
        return self.kind is SourceKind.OFFICIAL_REPO and self.revision is not None


def install_id_for(pack: str, revision: str, payload_hash: str, ordinal: int) -> InstallId:
    """A fresh, reproducible incarnation id for attempt number ``ordinal`` of ``pack``."""
    data = lp(pack.encode(), revision.encode(), payload_hash.encode(), str(ordinal).encode())
    return InstallId(digest(Purpose.INSTALL_ID, data)[:16].hex())


class Generation(Aggregate):
    """One attempt to install one pack content (R6, R9)."""

    class Prepared(Aggregate.Created):
        pack: str
        install_id: str
        ordinal: int
        origin: str
        category: str
        source: dict[str, Any]
        payload_hash: str
        components: list[dict[str, Any]]
        from_install_id: str | None

    # Later events repeat (pack, install_id) so every event is self-describing
    # for projections and for auditors reading an export.
    class Activated(Aggregate.Event):
        pack: str
        install_id: str
        epoch: int
        applied_payload_hash: str

    class Retired(Aggregate.Event):
        pack: str
        install_id: str
        successor_install_id: str
        epoch: int

    class Failed(Aggregate.Event):
        pack: str
        install_id: str
        dirty: bool
        reason: str

    @staticmethod
    def create_id(pack: str, install_id: str, **_: Any) -> UUID:
        return generation_id(pack, install_id)

    @event(Prepared)
    def __init__(
        self,
        pack: str,
        install_id: str,
        ordinal: int,
        origin: str,
        category: str,
        source: dict[str, Any],
        payload_hash: str,
        components: list[dict[str, Any]],
        from_install_id: str | None,
    ) -> None:
        self.pack = pack
        self.install_id = install_id
        self.ordinal = ordinal
        self.origin = Origin(origin)
        self.category = category
        self.source = SourceFacts.from_json(source)
        self.payload_hash = payload_hash
        self.components = components
        self.from_install_id = from_install_id
        self.status = GenerationStatus.PREPARING
        self.applied_payload_hash: str | None = None
        self.epoch: int | None = None
        self.failure_reason: str | None = None

    @event(Activated)
    def _activated(self, pack: str, install_id: str, epoch: int, applied_payload_hash: str) -> None:
        self.status = GenerationStatus.ACTIVE
        self.epoch = epoch
        self.applied_payload_hash = applied_payload_hash

    @event(Retired)
    def _retired(self, pack: str, install_id: str, successor_install_id: str, epoch: int) -> None:
        self.status = GenerationStatus.RETIRED

    @event(Failed)
    def _failed(self, pack: str, install_id: str, dirty: bool, reason: str) -> None:
        self.status = GenerationStatus.FAILED_DIRTY if dirty else GenerationStatus.FAILED_CLEAN
        self.failure_reason = reason

    def activate(self, epoch: int) -> None:
        self._require(GenerationStatus.PREPARING, "activate")
        self._activated(
            pack=self.pack,
            install_id=self.install_id,
            epoch=epoch,
            applied_payload_hash=self.payload_hash,
        )

    def retire(self, successor_install_id: str, epoch: int) -> None:
        self._require(GenerationStatus.ACTIVE, "retire")
        self._retired(
            pack=self.pack,
            install_id=self.install_id,
            successor_install_id=successor_install_id,
            epoch=epoch,
        )

    def fail(self, *, dirty: bool, reason: str) -> None:
        self._require(GenerationStatus.PREPARING, "fail")
        self._failed(pack=self.pack, install_id=self.install_id, dirty=dirty, reason=reason)

    def _require(self, status: GenerationStatus, verb: str) -> None:
        if self.status is not status:
            raise LifecycleRejected(
                f"cannot {verb} generation {self.install_id} of pack {self.pack!r}: it is "
                f"{self.status.value}, not {status.value}",
                reason="ILLEGAL_TRANSITION",
                pack=self.pack,
                install_id=self.install_id,
                status=self.status.value,
            )


class PackActivation(Aggregate):
    """The single pointer to a pack's serving generation (R7, R8)."""

    # Category and source are copied from the selected generation so the
    # compatibility view follows from activation events alone (R8).
    class Started(Aggregate.Created):
        pack: str
        install_id: str
        revision: str
        payload_hash: str
        category: str
        source: dict[str, Any]
        origin: str
        epoch: int

    class Advanced(Aggregate.Event):
        pack: str
        from_install_id: str
        from_revision: str
        install_id: str
        revision: str
        payload_hash: str
        category: str
        source: dict[str, Any]
        epoch: int

    @staticmethod
    def create_id(pack: str, **_: Any) -> UUID:
        return activation_id(pack)

    @event(Started)
    def __init__(
        self,
        pack: str,
        install_id: str,
        revision: str,
        payload_hash: str,
        category: str,
        source: dict[str, Any],
        origin: str,
        epoch: int,
    ) -> None:
        self.pack = pack
        self.install_id = install_id
        self.revision = revision
        self.payload_hash = payload_hash
        self.category = category
        self.epoch = epoch

    @event(Advanced)
    def _advanced(
        self,
        pack: str,
        from_install_id: str,
        from_revision: str,
        install_id: str,
        revision: str,
        payload_hash: str,
        category: str,
        source: dict[str, Any],
        epoch: int,
    ) -> None:
        self.install_id = install_id
        self.revision = revision
        self.payload_hash = payload_hash
        self.category = category
        self.epoch = epoch

    @classmethod
    def start(cls, generation: Generation) -> PackActivation:
        """First authority for a pack (install or adopt), epoch 1."""
        assert generation.source.revision is not None
        return cls(
            pack=generation.pack,
            install_id=generation.install_id,
            revision=generation.source.revision,
            payload_hash=generation.payload_hash,
            category=generation.category,
            source=generation.source.to_json(),
            origin=generation.origin.value,
            epoch=1,
        )

    def advance(self, generation: Generation) -> None:
        """Move the pointer to ``generation`` with epoch + 1 (R8)."""
        assert generation.source.revision is not None
        self._advanced(
            pack=self.pack,
            from_install_id=self.install_id,
            from_revision=self.revision,
            install_id=generation.install_id,
            revision=generation.source.revision,
            payload_hash=generation.payload_hash,
            category=generation.category,
            source=generation.source.to_json(),
            epoch=self.epoch + 1,
        )


class PackHistory(Aggregate):
    """The ordered install ids of a pack's attempts."""

    class Opened(Aggregate.Created):
        pack: str
        install_id: str
        origin: str

    class Attempted(Aggregate.Event):
        pack: str
        install_id: str
        origin: str

    @staticmethod
    def create_id(pack: str, **_: Any) -> UUID:
        return history_id(pack)

    @event(Opened)
    def __init__(self, pack: str, install_id: str, origin: str) -> None:
        self.pack = pack
        self.attempts = [install_id]

    @event(Attempted)
    def _attempted(self, pack: str, install_id: str, origin: str) -> None:
        self.attempts.append(install_id)

    def attempt(self, install_id: str, origin: str) -> None:
        self._attempted(pack=self.pack, install_id=install_id, origin=origin)

    @property
    def newest(self) -> str:
        return self.attempts[-1]


class LocalPack(Aggregate):
    """A ``local_path`` pack's in-place record (R5): development only, never authority."""

    class Installed(Aggregate.Created):
        pack: str
        install_id: str
        category: str
        locator: str
        path: str
        payload_hash: str

    class Updated(Aggregate.Event):
        pack: str
        category: str
        locator: str
        path: str
        payload_hash: str

    @staticmethod
    def create_id(pack: str, **_: Any) -> UUID:
        return local_id(pack)

    @event(Installed)
    def __init__(
        self, pack: str, install_id: str, category: str, locator: str, path: str, payload_hash: str
    ) -> None:
        self.pack = pack
        self.install_id = install_id
        self.category = category
        self.locator = locator
        self.path = path
        self.payload_hash = payload_hash

    @event(Updated)
    def _updated(
        self, pack: str, category: str, locator: str, path: str, payload_hash: str
    ) -> None:
        self.category = category
        self.locator = locator
        self.path = path
        self.payload_hash = payload_hash

    def update(self, category: str, locator: str, path: str, payload_hash: str) -> None:
        self._updated(
            pack=self.pack, category=category, locator=locator, path=path, payload_hash=payload_hash
        )


class LegacyRecord(Aggregate):
    """A legacy ``_System_InstalledPack`` row, recorded once per pack."""

    class Imported(Aggregate.Created):
        pack: str
        install_id: str
        status: str
        category: str
        source: dict[str, Any]
        applied_payload_hash: str | None

    @staticmethod
    def create_id(pack: str, **_: Any) -> UUID:
        return legacy_id(pack)

    @event(Imported)
    def __init__(
        self,
        pack: str,
        install_id: str,
        status: str,
        category: str,
        source: dict[str, Any],
        applied_payload_hash: str | None,
    ) -> None:
        self.pack = pack
        self.install_id = install_id
        self.status = status
        self.category = category
        self.source = source
        self.applied_payload_hash = applied_payload_hash

    @property
    def source_kind(self) -> str:
        return str(self.source.get("kind", ""))

    def facts(self) -> dict[str, Any]:
        return {
            "pack": self.pack,
            "install_id": self.install_id,
            "status": self.status,
            "category": self.category,
            "source": self.source,
            "applied_payload_hash": self.applied_payload_hash,
        }


def generation_id(pack: str, install_id: str) -> UUID:
    return aggregate_id("generation", pack, install_id)


def activation_id(pack: str) -> UUID:
    return aggregate_id("activation", pack)


def history_id(pack: str) -> UUID:
    return aggregate_id("history", pack)


def local_id(pack: str) -> UUID:
    return aggregate_id("local", pack)


def legacy_id(pack: str) -> UUID:
    return aggregate_id("legacy", pack)


# -- the classifier (R13) ------------------------------------------------------------------


class Condition(StrEnum):
    """Every state a pack can be in; anything else is inconsistent and fails closed."""

    ABSENT = "absent"
    LEGACY_ACTIVE = "legacy_active"
    LEGACY_INACTIVE = "legacy_inactive"
    LEGACY_LOCAL = "legacy_local"
    LOCAL = "local"
    FIRST_PREPARING = "first_preparing"
    FIRST_FAILED_CLEAN = "first_failed_clean"
    FIRST_FAILED_DIRTY = "first_failed_dirty"
    ACTIVE = "active"
    ACTIVE_PREPARING = "active_preparing"
    ACTIVE_FAILED_CLEAN = "active_failed_clean"
    ACTIVE_FAILED_DIRTY = "active_failed_dirty"


ACTIVATED = frozenset(
    {
        Condition.ACTIVE,
        Condition.ACTIVE_PREPARING,
        Condition.ACTIVE_FAILED_CLEAN,
        Condition.ACTIVE_FAILED_DIRTY,
    }
)
NEVER_ACTIVATED = frozenset(
    {Condition.FIRST_PREPARING, Condition.FIRST_FAILED_CLEAN, Condition.FIRST_FAILED_DIRTY}
)
LEGACY = frozenset({Condition.LEGACY_ACTIVE, Condition.LEGACY_INACTIVE, Condition.LEGACY_LOCAL})
PREPARING = frozenset({Condition.FIRST_PREPARING, Condition.ACTIVE_PREPARING})
DIRTY = frozenset({Condition.FIRST_FAILED_DIRTY, Condition.ACTIVE_FAILED_DIRTY})


@dataclass(frozen=True)
class PackState:
    """Everything the log says about one pack, read in one consistent snapshot."""

    pack: PackName
    legacy: LegacyRecord | None = None
    local: LocalPack | None = None
    activation: PackActivation | None = None
    history: PackHistory | None = None
    newest: Generation | None = None
    active: Generation | None = None

    def fence(self) -> dict[UUID, int]:
        """The version of every aggregate a decision about this pack was based on."""
        versions = {
            legacy_id(self.pack): _version(self.legacy),
            local_id(self.pack): _version(self.local),
            activation_id(self.pack): _version(self.activation),
            history_id(self.pack): _version(self.history),
        }
        for gen in (self.newest, self.active):
            if gen is not None:
                versions[gen.id] = gen.version
        return versions

    @property
    def next_ordinal(self) -> int:
        return (len(self.history.attempts) if self.history else 0) + 1


def _version(aggregate: Aggregate | None) -> int:
    return aggregate.version if aggregate is not None else 0


def _inconsistent(state: PackState, found: str) -> LifecycleRejected:
    return LifecycleRejected(
        f"pack {state.pack!r} is in an inconsistent state: {found}",
        reason="INCONSISTENT_STATE",
        rule="R13",
        pack=state.pack,
        found=found,
    )


def _check_identity(state: PackState, what: str, value: object) -> None:
    problem = identity_problem(value)
    if problem is not None:
        raise _inconsistent(state, f"{what} {value!r} is not canonical: {problem}")


def classify(state: PackState) -> Condition:
    """The one classifier: every admitted state exactly once; anything else fails closed."""
    has_history = state.history is not None
    if state.local is not None:
        if has_history or state.activation is not None:
            raise _inconsistent(state, "a local_path record next to generation history")
        if state.legacy is not None and state.legacy.source_kind != SourceKind.LOCAL_PATH:
            raise _inconsistent(state, "a local_path record next to an official legacy record")
        return Condition.LOCAL
    if not has_history:
        if state.activation is not None:
            raise _inconsistent(state, "an activation pointer without generation history")
        if state.legacy is None:
            return Condition.ABSENT
        _check_identity(state, "legacy install id", state.legacy.install_id)
        if state.legacy.source_kind == SourceKind.LOCAL_PATH:
            return Condition.LEGACY_LOCAL
        if state.legacy.status == "active":
            return Condition.LEGACY_ACTIVE
        return Condition.LEGACY_INACTIVE
    assert state.history is not None
    newest = state.newest
    if newest is None or newest.install_id != state.history.newest:
        raise _inconsistent(state, "the newest attempt named by the history is missing")
    if state.activation is None:
        if state.legacy is not None:
            raise _inconsistent(state, "generation history for a legacy pack without adoption")
        if newest.status is GenerationStatus.PREPARING:
            return Condition.FIRST_PREPARING
        if newest.status is GenerationStatus.FAILED_CLEAN:
            return Condition.FIRST_FAILED_CLEAN
        if newest.status is GenerationStatus.FAILED_DIRTY:
            return Condition.FIRST_FAILED_DIRTY
        raise _inconsistent(state, f"newest attempt is {newest.status.value} but nothing is active")
    activation = state.activation
    active = state.active
    _check_identity(state, "activation install id", activation.install_id)
    if active is None or active.install_id != activation.install_id:
        raise _inconsistent(state, "the activation names a generation that is not in the log")
    if active.status is not GenerationStatus.ACTIVE:
        raise _inconsistent(
            state,
            f"the activation names generation {active.install_id} which is {active.status.value}",
        )
    if active.epoch != activation.epoch or active.applied_payload_hash != activation.payload_hash:
        raise _inconsistent(state, "the active generation and the activation disagree")
    if activation.epoch < 1:
        raise _inconsistent(state, f"activation epoch {activation.epoch} is not positive")
    if newest.install_id == active.install_id:
        return Condition.ACTIVE
    if newest.ordinal < active.ordinal:
        raise _inconsistent(state, "the newest attempt is older than the active generation")
    if newest.status is GenerationStatus.PREPARING:
        return Condition.ACTIVE_PREPARING
    if newest.status is GenerationStatus.FAILED_CLEAN:
        return Condition.ACTIVE_FAILED_CLEAN
    if newest.status is GenerationStatus.FAILED_DIRTY:
        return Condition.ACTIVE_FAILED_DIRTY
    raise _inconsistent(
        state, f"newest attempt {newest.install_id} is {newest.status.value} but not selected"
    )


# -- the preflight/terminal matrix (R11) --------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The content a command wants a pack to serve."""

    category: str
    source: SourceFacts
    payload_hash: str
    payload_hash_v0: str = ""


@dataclass(frozen=True)
class Install:
    target: Target


@dataclass(frozen=True)
class Adopt:
    target: Target


@dataclass(frozen=True)
class Advance:
    target: Target
    from_revision: str


@dataclass(frozen=True)
class Activate:
    install_id: str


@dataclass(frozen=True)
class Fail:
    install_id: str


@dataclass(frozen=True)
class LocalUpdate:
    target: Target


@dataclass(frozen=True)
class ImportLegacy:
    facts: dict[str, Any] = field(hash=False)


Command = Install | Adopt | Advance | Activate | Fail | LocalUpdate | ImportLegacy


@dataclass(frozen=True)
class Rejection:
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict, hash=False)

    def error(self, pack: str) -> LifecycleRejected:
        return LifecycleRejected(
            f"pack {pack!r}: {self.message}", reason=self.reason, pack=pack, **self.details
        )


def _reject(reason: str, message: str, **details: Any) -> Rejection:
    return Rejection(reason, message, details)


def _current_category(state: PackState, condition: Condition) -> str | None:
    if condition in ACTIVATED and state.active is not None:
        return state.active.category
    if condition is Condition.LOCAL and state.local is not None:
        return state.local.category
    if condition in LEGACY and state.legacy is not None:
        return state.legacy.category
    return None


def rejection(
    command: Command, state: PackState, *, max_epoch: int = MAX_EPOCH
) -> Rejection | None:
    """Why ``command`` may not run on ``state`` now, or ``None`` when it may.

    Called in preflight and again inside the append transaction (R11). Raises
    ``LifecycleRejected`` (INCONSISTENT_STATE) when the state itself is not one
    the classifier admits (R13).
    """
    condition = classify(state)
    target = getattr(command, "target", None)
    if isinstance(target, Target):
        current = _current_category(state, condition)
        if current is not None and current != target.category:
            return _reject(
                "CATEGORY_CHANGE",
                f"category would change from {current!r} to {target.category!r}",
                current=current,
                requested=target.category,
            )
    match command:
        case Install(target=target):
            return _install(condition, target)
        case Adopt(target=target):
            return _adopt(condition, state, target)
        case Advance(target=target, from_revision=from_revision):
            return _advance(condition, state, target, from_revision, max_epoch)
        case Activate(install_id=install_id):
            return _activate(condition, state, install_id, max_epoch)
        case Fail(install_id=install_id):
            if condition not in PREPARING or state.newest is None:
                return _reject("NOT_PREPARING", "there is no attempt in progress to fail")
            if state.newest.install_id != install_id:
                return _reject(
                    "UNKNOWN_CANDIDATE",
                    f"the attempt in progress is {state.newest.install_id}, not {install_id}",
                )
            return None
        case LocalUpdate(target=target):
            if condition in ACTIVATED or condition in NEVER_ACTIVATED:
                return _reject(
                    "LOCAL_PATH_NOT_AUTHORITY",
                    "a pack with official generations cannot be switched to local_path",
                )
            if condition in (Condition.LEGACY_ACTIVE, Condition.LEGACY_INACTIVE):
                return _reject(
                    "LOCAL_PATH_NOT_AUTHORITY",
                    "an official legacy pack must be adopted from its official source, "
                    "not replaced by a local_path",
                )
            return None
        case ImportLegacy(facts=facts):
            if condition in (Condition.ABSENT,):
                return None
            if condition in LEGACY and state.legacy is not None:
                if state.legacy.facts() == facts:
                    return None
                return _reject(
                    "LEGACY_RECORD_EXISTS",
                    "a different legacy record was already imported for this pack",
                )
            return _reject(
                "PACK_HAS_HISTORY",
                f"the pack already has ledger history ({condition.value}); a legacy record "
                "can only be imported before it",
            )
    raise AssertionError(f"unhandled command {command!r}")  # pragma: no cover


def _install(condition: Condition, target: Target) -> Rejection | None:
    if not target.source.is_authority:
        return _reject("LOCAL_PATH_NOT_AUTHORITY", "install needs an official_repo source")
    if condition in (Condition.ABSENT, Condition.FIRST_FAILED_CLEAN, Condition.FIRST_FAILED_DIRTY):
        return None
    if condition in PREPARING:
        return _reject("ATTEMPT_IN_PROGRESS", "an attempt is still preparing; recover it first")
    if condition in LEGACY:
        return _reject(
            "LEGACY_RECORD_EXISTS", "the pack has a legacy record: adopt it instead of installing"
        )
    if condition is Condition.LOCAL:
        return _reject(
            "SOURCE_KIND_CHANGE", "a local_path pack cannot become an official pack by install"
        )
    return _reject("ALREADY_ACTIVE", "the pack is already active: advance it instead")


def _adopt(condition: Condition, state: PackState, target: Target) -> Rejection | None:
    if not target.source.is_authority:
        return _reject("LOCAL_PATH_NOT_AUTHORITY", "adoption needs an official_repo source")
    if condition is Condition.LEGACY_ACTIVE:
        assert state.legacy is not None
        stored = state.legacy.applied_payload_hash
        problem = hash_problem(stored)
        if problem is not None:
            return _reject(
                "PAYLOAD_HASH_UNUSABLE",
                f"the legacy record's applied payload hash is {problem}; it cannot prove "
                "the resolved content",
                stored=stored,
            )
        if stored not in (target.payload_hash, target.payload_hash_v0):
            return _reject(
                "PAYLOAD_HASH_MISMATCH",
                "the legacy record's applied payload hash does not prove the resolved content",
                stored=stored,
                resolved_v1=target.payload_hash,
                resolved_v0=target.payload_hash_v0,
            )
        return None
    if condition is Condition.ABSENT:
        return _reject("NO_LEGACY_RECORD", "there is no legacy record to adopt")
    if condition is Condition.LEGACY_INACTIVE:
        assert state.legacy is not None
        return _reject(
            "LEGACY_NOT_ACTIVE",
            f"only an active legacy pack can be adopted; it is {state.legacy.status!r}",
            legacy_status=state.legacy.status,
        )
    if condition is Condition.LEGACY_LOCAL:
        return _reject("LOCAL_PATH_NOT_AUTHORITY", "a local_path legacy pack is not authority")
    if condition is Condition.LOCAL:
        return _reject("SOURCE_KIND_CHANGE", "a local_path pack cannot be adopted")
    if condition in ACTIVATED:
        return _reject("ALREADY_ACTIVE", "the pack already has an activation")
    return _reject("PACK_HAS_HISTORY", "the pack already has generation history")


def _advance(
    condition: Condition, state: PackState, target: Target, from_revision: str, max_epoch: int
) -> Rejection | None:
    if not target.source.is_authority:
        return _reject("LOCAL_PATH_NOT_AUTHORITY", "advance needs an official_repo source")
    if condition not in ACTIVATED:
        return _reject(
            "MISSING_AUTHORITY",
            f"advance needs an active generation at {from_revision}; the pack is "
            f"{condition.value} (missing authority is never turned into generation 1)",
            condition=condition.value,
        )
    assert state.activation is not None
    if condition is Condition.ACTIVE_PREPARING:
        return _reject("ATTEMPT_IN_PROGRESS", "an attempt is still preparing; recover it first")
    if state.activation.revision != from_revision:
        return _reject(
            "FROM_REVISION_MISMATCH",
            f"the active generation is at {state.activation.revision}, not {from_revision}",
            active_revision=state.activation.revision,
            from_revision=from_revision,
        )
    if state.activation.epoch >= max_epoch:
        return _reject(
            "EPOCH_EXHAUSTED",
            f"the activation epoch {state.activation.epoch} cannot increase further",
            epoch=state.activation.epoch,
        )
    return None


def _activate(
    condition: Condition, state: PackState, install_id: str, max_epoch: int
) -> Rejection | None:
    if condition not in PREPARING or state.newest is None:
        return _reject("NOT_PREPARING", "there is no prepared candidate to activate")
    if state.newest.install_id != install_id:
        return _reject(
            "UNKNOWN_CANDIDATE",
            f"the prepared candidate is {state.newest.install_id}, not {install_id}",
        )
    if condition is Condition.ACTIVE_PREPARING:
        assert state.activation is not None
        if state.newest.from_install_id != state.activation.install_id:
            return _reject(
                "STALE_CANDIDATE",
                "the candidate was prepared against another active generation",
                prepared_from=state.newest.from_install_id,
                active=state.activation.install_id,
            )
        if state.activation.epoch >= max_epoch:
            return _reject(
                "EPOCH_EXHAUSTED",
                f"the activation epoch {state.activation.epoch} cannot increase further",
                epoch=state.activation.epoch,
            )
    return None


# -- what `apply` does with one pack ------------------------------------------------------


class Decision(StrEnum):
    UNCHANGED = "unchanged"
    INSTALL = "install"
    ADOPT = "adopt"
    ADVANCE = "advance"
    LOCAL_UPDATE = "local_update"


def after_recovery(state: PackState) -> PackState:
    """The state the next lease holder leaves behind: abandoned attempts become dirty (R12).

    Preflight runs before the lease is taken, so it judges a command against
    the state recovery will produce; the same matrix runs again for real once
    recovery has been appended.
    """
    newest = state.newest
    if newest is None or newest.status is not GenerationStatus.PREPARING:
        return state
    simulated = copy.deepcopy(newest)
    simulated.fail(dirty=True, reason="abandoned attempt (simulated recovery)")
    simulated.collect_events()
    active = (
        simulated if state.active is not None and state.active.id == simulated.id else state.active
    )
    return replace(state, newest=simulated, active=active)


def decide(state: PackState, target: Target) -> tuple[Decision, Command | None]:
    """Classify what converging ``state`` to ``target`` takes; ``None`` when nothing."""
    condition = classify(state)
    if target.source.kind is SourceKind.LOCAL_PATH:
        local = state.local
        if (
            condition is Condition.LOCAL
            and local is not None
            and local.payload_hash == target.payload_hash
            and local.category == target.category
            and local.locator == target.source.locator
        ):
            return Decision.UNCHANGED, None
        return Decision.LOCAL_UPDATE, LocalUpdate(target)
    if condition in LEGACY:
        return Decision.ADOPT, Adopt(target)
    if condition in ACTIVATED:
        assert state.activation is not None
        same = (
            state.activation.revision == target.source.revision
            and state.activation.payload_hash == target.payload_hash
        )
        if same and condition is not Condition.ACTIVE_FAILED_DIRTY:
            return Decision.UNCHANGED, None
        # A dirty pack whose wanted content is already active is repaired by a
        # fresh generation of that content: only a later activation clears it (R12).
        return Decision.ADVANCE, Advance(target, from_revision=state.activation.revision)
    return Decision.INSTALL, Install(target)
