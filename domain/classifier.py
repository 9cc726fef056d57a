"""The one classifier of a pack's lifecycle state (R13).

``classify`` decides every state a pack can be in from the aggregates read in
one snapshot; an unknown or inconsistent state fails closed and names what it
found. The command service calls it before any append and again inside the
append transaction against the locked current state.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from uuid import UUID

from eventsourcing.domain import Aggregate

from domain.errors import LifecycleRejected
from domain.identity import PackName, identity_problem
from domain.lifecycle import (
    Generation,
    GenerationStatus,
    Origin,
    PackActivation,
    PackHistory,
    SourceKind,
    activation_id,
    history_id,
)
from domain.records import LegacyRecord, LocalPack, legacy_id, local_id

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
    #: The pack's history ends in removal (R7): nothing is selected, nothing is shown, and
    #: it may be installed again as a fresh incarnation.
    REMOVED = "removed"


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
#: Conditions in which a pack is installed (it has a compatibility-view row the ledger
#: owns) and so may be named by a manifest's ``remove``.
REMOVABLE = frozenset({Condition.LOCAL, *ACTIVATED})


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


def pointer_problem(
    install_id: object,
    epoch: object,
    payload_hash: object,
    status: str | None,
    generation_epoch: object,
    applied_payload_hash: object,
) -> str | None:
    """R13's pointer check, the one definition: does the activation pointer (``install_id``
    at ``epoch`` with ``payload_hash``) select a generation that is active and agrees with
    it? ``status`` is the selected generation's (``None``: it is not in the log). Returns
    what was found when it does not; the classifier, the publisher's input and the reader
    all fail closed with it."""
    if status is None:
        return "the activation names a generation that is not in the log"
    if status != GenerationStatus.ACTIVE.value:
        return f"the activation names generation {install_id} which is {status}"
    if generation_epoch != epoch or applied_payload_hash != payload_hash:
        return "the active generation and the activation disagree"
    return None


def classify(state: PackState) -> Condition:
    """The one classifier: every admitted state exactly once; anything else fails closed.

    Removal (R7) ends an incarnation: a removed pointer (``activation.removed``) or a
    removed local record is history, and what follows it is judged like a pack that
    was never installed, except that the history must agree with the removal.
    """
    activation = state.activation
    removed = activation is not None and activation.removed
    if state.local is not None and not state.local.removed:
        return _classify_local(state, removed)
    if removed:
        return _classify_removed(state)
    has_history = state.history is not None
    if not has_history:
        if activation is not None:
            raise _inconsistent(state, "an activation pointer without generation history")
        if state.local is not None:  # a removed local_path record, nothing after it
            return Condition.REMOVED
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
    if activation is None:
        # A legacy record is consumed by adoption, or by a local_path record since removed.
        if state.legacy is not None and state.local is None:
            raise _inconsistent(state, "generation history for a legacy pack without adoption")
        return _first_attempt(state, newest)
    active = state.active
    _check_identity(state, "activation install id", activation.install_id)
    if active is not None and active.install_id != activation.install_id:
        active = None
    problem = pointer_problem(
        activation.install_id,
        activation.epoch,
        activation.payload_hash,
        None if active is None else active.status.value,
        None if active is None else active.epoch,
        None if active is None else active.applied_payload_hash,
    )
    if problem is not None:
        raise _inconsistent(state, problem)
    assert active is not None
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


def _first_attempt(state: PackState, newest: Generation) -> Condition:
    """A pack with attempts but nothing selected in this incarnation."""
    if newest.status is GenerationStatus.PREPARING:
        return Condition.FIRST_PREPARING
    if newest.status is GenerationStatus.FAILED_CLEAN:
        return Condition.FIRST_FAILED_CLEAN
    if newest.status is GenerationStatus.FAILED_DIRTY:
        return Condition.FIRST_FAILED_DIRTY
    raise _inconsistent(state, f"newest attempt is {newest.status.value} but nothing is active")


def _ends_in_removal(state: PackState, newest: Generation) -> bool:
    """Whether the newest attempt belongs to the incarnation the removal ended.

    It is either the generation the removal retired, or an attempt to advance that
    incarnation which failed before the removal; an attempt made after the removal
    is an install (R7: a fresh incarnation), never an advance.
    """
    activation = state.activation
    assert activation is not None
    if newest.install_id == activation.removed_install_id:
        if newest.status is not GenerationStatus.RETIRED:
            raise _inconsistent(
                state,
                f"the removed generation {newest.install_id} is {newest.status.value}, not retired",
            )
        return True
    if newest.origin is Origin.INSTALL:
        if newest.status in (GenerationStatus.ACTIVE, GenerationStatus.RETIRED):
            raise _inconsistent(
                state,
                f"attempt {newest.install_id} after the removal is {newest.status.value} "
                "but nothing is selected",
            )
        return False
    if newest.status not in (GenerationStatus.FAILED_CLEAN, GenerationStatus.FAILED_DIRTY):
        raise _inconsistent(
            state,
            f"attempt {newest.install_id} of the removed incarnation is {newest.status.value}",
        )
    return True


def _classify_removed(state: PackState) -> Condition:
    """The pointer selects nothing: the pack was removed (R7)."""
    activation = state.activation
    assert activation is not None
    if state.history is None or activation.removed_install_id is None:
        raise _inconsistent(state, "a removed activation pointer without generation history")
    if activation.epoch < 2:
        raise _inconsistent(state, f"a removed pointer at epoch {activation.epoch}")
    newest = state.newest
    if newest is None or newest.install_id != state.history.newest:
        raise _inconsistent(state, "the newest attempt named by the history is missing")
    if _ends_in_removal(state, newest):
        return Condition.REMOVED
    return _first_attempt(state, newest)


def _classify_local(state: PackState, removed: bool) -> Condition:
    """A live local_path record: development content, never authority (R5).

    Official history beside it is admitted only when it ended in removal before the
    local_path incarnation began.
    """
    if state.activation is not None and not removed:
        raise _inconsistent(state, "a local_path record next to an active official generation")
    if state.history is not None:
        newest = state.newest
        if not removed or newest is None or not _ends_in_removal(state, newest):
            raise _inconsistent(state, "a local_path record next to generation history")
    elif state.legacy is not None and state.legacy.source_kind != SourceKind.LOCAL_PATH:
        raise _inconsistent(state, "a local_path record next to an official legacy record")
    return Condition.LOCAL
