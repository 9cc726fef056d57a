"""Pack lifecycle: generations, the activation pointer, and the one classifier (R5-R13).

An attempt, a selected generation and the compatibility view are different
facts. Each has one owner here:

* ``Generation`` — one attempt to install one pack content: ``preparing`` →
  ``active`` | ``failed_clean`` | ``failed_dirty``; ``active`` → ``retired``.
  Its frozen facts (source, revision, install id, category, payload hash,
  components) never change (R9); it has an applied payload hash only once
  activated (R6).
* ``PackActivation`` — the only selector of a pack's serving generation (R7),
  with an epoch that increases by one on every move. Removal is a move to no
  generation; a removed pack's pointer may later select a fresh incarnation.
* ``PackHistory`` — the ordered list of a pack's attempts (which install ids,
  in which order), so the newest attempt is known from the log alone.

The records of packs that are not authority (``LocalPack``, ``LegacyRecord``) are
``domain.records``.

The classifier of a pack's state is ``domain.classifier`` (R13) and the
preflight/terminal matrix ``domain.matrix`` (R11).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.digests import Purpose, aggregate_id, digest, lp
from domain.errors import LifecycleRejected
from domain.identity import InstallId

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
    """How a generation came to be: the ways the pointer may move to a generation (R7).

    The fourth move, remove, takes the pointer to no generation and creates none."""

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

    # v2: ``removed`` tells retirement by removal (no successor: the pointer moved to
    # no generation) from retirement by advance; v1 rows are read as ``removed=False``.
    class Retired(Aggregate.Event):
        pack: str
        install_id: str
        successor_install_id: str | None
        epoch: int
        removed: bool

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
    def _retired(
        self,
        pack: str,
        install_id: str,
        successor_install_id: str | None,
        epoch: int,
        removed: bool,
    ) -> None:
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

    def retire(self, successor_install_id: str | None, epoch: int) -> None:
        """Retire the active generation: replaced by ``successor_install_id`` (advance),
        or with no successor when its pack is removed (R7)."""
        self._require(GenerationStatus.ACTIVE, "retire")
        self._retired(
            pack=self.pack,
            install_id=self.install_id,
            successor_install_id=successor_install_id,
            epoch=epoch,
            removed=successor_install_id is None,
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

    class Removed(Aggregate.Event):
        """The pointer moves from the active generation to none (R7 remove)."""

        pack: str
        from_install_id: str
        from_revision: str
        epoch: int

    class Reinstalled(Aggregate.Event):
        """A removed pack's pointer selects the first generation of a fresh incarnation."""

        pack: str
        install_id: str
        revision: str
        payload_hash: str
        category: str
        source: dict[str, Any]
        origin: str
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
        # All ``None`` while the pack is removed: the pointer selects no generation.
        self.install_id: str | None = install_id
        self.revision: str | None = revision
        self.payload_hash: str | None = payload_hash
        self.category: str | None = category
        self.epoch = epoch
        #: The generation the last removal retired (``None`` until a removal).
        self.removed_install_id: str | None = None

    @property
    def removed(self) -> bool:
        """Whether the pack's pointer selects no generation (its history ends in removal)."""
        return self.install_id is None

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

    @event(Removed)
    def _removed(self, pack: str, from_install_id: str, from_revision: str, epoch: int) -> None:
        self.install_id = self.revision = self.payload_hash = self.category = None
        self.removed_install_id = from_install_id
        self.epoch = epoch

    @event(Reinstalled)
    def _reinstalled(
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
        assert self.install_id is not None and self.revision is not None
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

    def remove(self) -> None:
        """Move the pointer from the active generation to none, epoch + 1 (R7)."""
        assert self.install_id is not None and self.revision is not None
        self._removed(
            pack=self.pack,
            from_install_id=self.install_id,
            from_revision=self.revision,
            epoch=self.epoch + 1,
        )

    def reinstall(self, generation: Generation) -> None:
        """A removed pack installed again: the pointer selects ``generation``, epoch + 1."""
        assert self.install_id is None and generation.source.revision is not None
        self._reinstalled(
            pack=self.pack,
            install_id=generation.install_id,
            revision=generation.source.revision,
            payload_hash=generation.payload_hash,
            category=generation.category,
            source=generation.source.to_json(),
            origin=generation.origin.value,
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


def generation_id(pack: str, install_id: str) -> UUID:
    return aggregate_id("generation", pack, install_id)


def activation_id(pack: str) -> UUID:
    return aggregate_id("activation", pack)


def history_id(pack: str) -> UUID:
    return aggregate_id("history", pack)
