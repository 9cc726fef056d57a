"""The preflight/terminal matrix (R11) and what ``apply`` does with one pack.

``rejection`` is the single matrix of every lifecycle rule: the preflight half
runs before any append and the terminal half re-runs it on locked current
state. ``decide`` turns a pack's state and its manifest target into one
decision (install, adopt, advance, local update, unchanged); ``decide_removal``
judges a manifest's ``remove`` entry (R7).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from domain.classifier import (
    ACTIVATED,
    LEGACY,
    NEVER_ACTIVATED,
    PREPARING,
    REMOVABLE,
    Condition,
    PackState,
    classify,
)
from domain.content import hash_problem
from domain.errors import InvalidInput, LifecycleRejected
from domain.lifecycle import MAX_EPOCH, GenerationStatus, SourceFacts, SourceKind

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


@dataclass(frozen=True)
class Remove:
    """Retire the active generation with no successor, or remove a local_path record (R7)."""


Command = Install | Adopt | Advance | Activate | Fail | LocalUpdate | ImportLegacy | Remove


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
        case Remove():
            return _remove(condition, state, max_epoch)
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
    if condition in (
        Condition.ABSENT,
        Condition.FIRST_FAILED_CLEAN,
        Condition.FIRST_FAILED_DIRTY,
        Condition.REMOVED,
    ):
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


def _remove(condition: Condition, state: PackState, max_epoch: int) -> Rejection | None:
    """R7 remove: the pointer moves from the active generation to none, epoch + 1.

    A failed newest attempt (clean or dirty) belongs to the incarnation being removed
    and stays in its history; removal serves nothing of the pack, so a dirty attempt
    no longer holds publication back (R12 guards what is served).
    """
    if condition is Condition.LOCAL:
        return None
    if condition is Condition.ACTIVE_PREPARING:
        return _reject("ATTEMPT_IN_PROGRESS", "an attempt is still preparing; recover it first")
    if condition in ACTIVATED:
        assert state.activation is not None
        if state.activation.epoch >= max_epoch:
            return _reject(
                "EPOCH_EXHAUSTED",
                f"the activation epoch {state.activation.epoch} cannot increase further",
                epoch=state.activation.epoch,
            )
        return None
    if condition in LEGACY:
        return _reject(
            "LEGACY_NOT_ADOPTED",
            "a legacy record is not under ledger authority: adopt it (or apply it as "
            "local_path) before removing it",
        )
    return _reject(
        "NOT_INSTALLED",
        f"there is no installed pack to remove (the pack is {condition.value})",
        condition=condition.value,
    )


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
    REMOVE = "remove"


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
        assert state.activation is not None and state.activation.revision is not None
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


def decide_removal(state: PackState, index: int, *, file: str) -> tuple[Decision, Command]:
    """A manifest's ``remove[index]`` entry: INVALID, naming it, unless the pack is
    installed (R7); what else may stop it is the matrix's ``Remove`` row."""
    condition = classify(state)
    if condition not in REMOVABLE and condition not in LEGACY and condition not in PREPARING:
        field = f"remove[{index}]"
        raise InvalidInput(
            f"{file}: {field}: {state.pack!r} names no installed pack "
            f"(it is {condition.value}); there is nothing to remove",
            field=field,
            file=file,
            pack=state.pack,
            condition=condition.value,
            rule="R7",
        )
    return Decision.REMOVE, Remove()
