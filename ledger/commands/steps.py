"""Single lifecycle steps: prepare candidates, activate them atomically, fail them (R6-R9);
removal (R7) is part of the one final append. Each step is one checked append through
the unit of work, and can be built and run alone (``LifecycleSteps(UnitOfWork(ledger))``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from uuid import UUID

from eventsourcing.domain import Aggregate

from domain.classifier import PackState
from domain.coordination import CommandRecord
from domain.identity import PackName
from domain.lifecycle import (
    Generation,
    Origin,
    PackActivation,
    PackHistory,
    install_id_for,
)
from domain.matrix import Activate, Adopt, Command, Fail, LocalUpdate, Remove
from domain.records import LocalPack
from ledger.commands.unit_of_work import UnitOfWork
from ledger.commands.writer_lease import LeaseHandle
from ledger.log.append import Precommit
from ledger.sources.resolve import ResolvedPack


class LifecycleSteps:
    """One checked append per step, through ``uow``; ``apply`` composes them."""

    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow

    def prepare(
        self,
        handle: LeaseHandle,
        items: Sequence[tuple[ResolvedPack, Command]],
        *,
        states: Mapping[PackName, PackState] | None = None,
    ) -> dict[str, str]:
        """Record fresh candidates (install or advance); returns pack -> install id.

        ``states``: the prepared packs' states as the caller just read them under the
        lease (the decision's own snapshot; the append is fenced on their versions), else
        read here."""
        commands = {PackName.trusted(r.name): cmd for r, cmd in items}
        created: dict[str, str] = {}

        def build(states: Mapping[PackName, PackState]) -> list[Aggregate]:
            out: list[Aggregate] = []
            for resolved, _ in items:
                state = states[PackName.trusted(resolved.name)]
                revision = resolved.source.revision
                assert revision is not None
                # A removed pack is installed again: a fresh incarnation (R7).
                live = state.activation is not None and not state.activation.removed
                origin = Origin.ADVANCE if live else Origin.INSTALL
                install_id = install_id_for(
                    resolved.name, revision, resolved.content.payload_hash_v1, state.next_ordinal
                )
                generation = Generation(
                    pack=resolved.name,
                    install_id=install_id,
                    ordinal=state.next_ordinal,
                    origin=origin.value,
                    category=resolved.content.category,
                    source=resolved.source.to_json(),
                    payload_hash=resolved.content.payload_hash_v1,
                    components=resolved.content.canonical_set(),
                    # None for an install, a removed pointer included: it selects nothing.
                    from_install_id=state.activation.install_id if state.activation else None,
                )
                history = state.history
                if history is None:
                    history = PackHistory(
                        pack=resolved.name, install_id=install_id, origin=origin.value
                    )
                else:
                    history.attempt(install_id=install_id, origin=origin.value)
                out.extend([generation, history])
                created[resolved.name] = install_id
            return out

        self.uow.checked_append(handle, commands, build, states=states)
        return created

    def activate(
        self,
        handle: LeaseHandle,
        candidates: Mapping[str, str],
        *,
        adoptions: Sequence[ResolvedPack] = (),
        local_updates: Sequence[ResolvedPack] = (),
        removals: Sequence[PackName] = (),
        record: CommandRecord | None = None,
        extra: Sequence[Aggregate] = (),
        fence: Mapping[UUID, int] | None = None,
        states: Mapping[PackName, PackState] | None = None,
        precommit: Precommit | None = None,
    ) -> dict[str, int]:
        """One append (R8): candidates active, pointers +1, predecessors retired,
        adoptions, local in-place updates and removals recorded; returns pack -> epoch
        (a removed local_path pack has no epoch)."""
        commands: dict[PackName, Command] = {
            PackName.trusted(p): Activate(i) for p, i in candidates.items()
        }
        for resolved in adoptions:
            commands[PackName.trusted(resolved.name)] = Adopt(resolved.target)
        for resolved in local_updates:
            commands[PackName.trusted(resolved.name)] = LocalUpdate(resolved.target)
        for pack in removals:
            commands[pack] = Remove()
        epochs: dict[str, int] = {}

        def build(states: Mapping[PackName, PackState]) -> list[Aggregate]:
            out: list[Aggregate] = []
            for pack in candidates:
                state = states[PackName.trusted(pack)]
                generation = state.newest
                assert generation is not None
                if state.activation is None:
                    generation.activate(epoch=1)
                    out.extend([generation, PackActivation.start(generation)])
                    epochs[pack] = 1
                elif state.activation.removed:  # a fresh incarnation of a removed pack
                    epoch = state.activation.epoch + 1
                    generation.activate(epoch=epoch)
                    state.activation.reinstall(generation)
                    out.extend([generation, state.activation])
                    epochs[pack] = epoch
                else:
                    epoch = state.activation.epoch + 1
                    previous = state.active
                    assert previous is not None
                    generation.activate(epoch=epoch)
                    state.activation.advance(generation)
                    previous.retire(successor_install_id=generation.install_id, epoch=epoch)
                    out.extend([generation, state.activation, previous])
                    epochs[pack] = epoch
            for resolved in adoptions:
                out.extend(self._adopt(states[PackName.trusted(resolved.name)], resolved))
                epochs[resolved.name] = 1
            for resolved in local_updates:
                out.append(self._local(states[PackName.trusted(resolved.name)], resolved))
            for pack in removals:
                out.extend(self._remove(states[pack], epochs))
            return out

        self.uow.checked_append(
            handle,
            commands,
            build,
            extra=[*extra, *([record] if record else [])],
            fence=fence,
            states=states,
            precommit=precommit,
        )
        return epochs

    @staticmethod
    def _adopt(state: PackState, resolved: ResolvedPack) -> list[Aggregate]:
        legacy = state.legacy
        assert legacy is not None
        generation = Generation(
            pack=resolved.name,
            install_id=legacy.install_id,
            ordinal=1,
            origin=Origin.ADOPT.value,
            category=resolved.content.category,
            source=resolved.source.to_json(),
            payload_hash=resolved.content.payload_hash_v1,
            components=resolved.content.canonical_set(),
            from_install_id=None,
        )
        generation.activate(epoch=1)
        history = PackHistory(
            pack=resolved.name, install_id=legacy.install_id, origin=Origin.ADOPT.value
        )
        return [generation, PackActivation.start(generation), history]

    @staticmethod
    def _remove(state: PackState, epochs: dict[str, int]) -> list[Aggregate]:
        """R7 remove: the pointer moves to no generation with epoch + 1 and the active
        generation retires with no successor; a local_path record is removed."""
        if state.local is not None and not state.local.removed:
            state.local.remove()
            return [state.local]
        activation, active = state.activation, state.active
        assert activation is not None and active is not None
        activation.remove()
        active.retire(successor_install_id=None, epoch=activation.epoch)
        epochs[state.pack] = activation.epoch
        return [activation, active]

    @staticmethod
    def _local(state: PackState, resolved: ResolvedPack) -> LocalPack:
        facts = {
            "category": resolved.content.category,
            "locator": resolved.source.locator,
            "path": resolved.source.path,
            "payload_hash": resolved.content.payload_hash_v1,
        }
        # The raw file's digest: the next apply parses the pack only if it changed (R30).
        digest = resolved.file_digest
        if state.local is not None:
            if state.local.removed:  # installed again: a fresh incarnation (R7)
                state.local.reinstall(**facts, file_digest=digest)
            else:
                state.local.update(**facts, file_digest=digest)
            return state.local
        # A legacy local_path record is taken over with its install id; after an official
        # incarnation was removed, the legacy record belongs to that history.
        install_id = (
            state.legacy.install_id
            if state.legacy is not None and state.history is None
            else install_id_for(resolved.name, "local_path", resolved.content.payload_hash_v1, 1)
        )
        return LocalPack(pack=resolved.name, install_id=install_id, **facts, file_digest=digest)

    def fail(
        self, handle: LeaseHandle, pack: str, install_id: str, *, dirty: bool, reason: str
    ) -> None:
        """Terminate the attempt in progress as ``failed_clean`` or ``failed_dirty``."""
        commands: dict[PackName, Command] = {PackName(pack): Fail(install_id)}

        def build(states: Mapping[PackName, PackState]) -> list[Aggregate]:
            newest = states[PackName(pack)].newest
            assert newest is not None
            newest.fail(dirty=dirty, reason=reason)
            return [newest]

        self.uow.checked_append(handle, commands, build)
