"""Records of packs that are not catalog authority (R5, R7): what a pack may also be.

* ``LocalPack`` — the mutable in-place record of a ``local_path`` pack (R5):
  shown in the compatibility view, never catalog authority; removable, and
  installable again as a fresh incarnation.
* ``LegacyRecord`` — a pre-existing ``_System_InstalledPack`` row, recorded
  once so that it can be adopted (R7 "adopt").

The authority itself (generations, the activation pointer, the history of attempts)
is ``domain.lifecycle``. The classes' stored topics are the event type table's
(``domain.event_types``), never these Python paths.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.digests import aggregate_id
from domain.lifecycle import install_id_for


class LocalPack(Aggregate):
    """A ``local_path`` pack's in-place record (R5): development only, never authority."""

    class Installed(Aggregate.Created):
        pack: str
        install_id: str
        category: str
        locator: str
        path: str
        payload_hash: str
        #: Schema v2: SHA-256 hex of the raw ``pack.json`` bytes as read (v1 rows: None).
        file_digest: str | None

    class Updated(Aggregate.Event):
        pack: str
        category: str
        locator: str
        path: str
        payload_hash: str
        #: Schema v2: as ``Installed.file_digest``.
        file_digest: str | None

    class Removed(Aggregate.Event):
        """The local_path pack is removed: its compatibility-view row goes (R7)."""

        pack: str
        install_id: str

    class Reinstalled(Aggregate.Event):
        """A removed local_path pack installed again: a fresh incarnation and install id."""

        pack: str
        install_id: str
        incarnation: int
        category: str
        locator: str
        path: str
        payload_hash: str
        #: Schema v2: as ``Installed.file_digest``.
        file_digest: str | None

    @staticmethod
    def create_id(pack: str, **_: Any) -> UUID:
        return local_id(pack)

    @event(Installed)
    def __init__(
        self,
        pack: str,
        install_id: str,
        category: str,
        locator: str,
        path: str,
        payload_hash: str,
        file_digest: str | None,
    ) -> None:
        self.pack = pack
        self.install_id = install_id
        self._facts(category, locator, path, payload_hash, file_digest)
        self.incarnation = 1
        self.removed = False

    @event(Updated)
    def _updated(
        self,
        pack: str,
        category: str,
        locator: str,
        path: str,
        payload_hash: str,
        file_digest: str | None,
    ) -> None:
        self._facts(category, locator, path, payload_hash, file_digest)

    @event(Removed)
    def _removed(self, pack: str, install_id: str) -> None:
        self.removed = True

    @event(Reinstalled)
    def _reinstalled(
        self,
        pack: str,
        install_id: str,
        incarnation: int,
        category: str,
        locator: str,
        path: str,
        payload_hash: str,
        file_digest: str | None,
    ) -> None:
        self.install_id = install_id
        self.incarnation = incarnation
        self._facts(category, locator, path, payload_hash, file_digest)

    def _facts(
        self,
        category: str,
        locator: str,
        path: str,
        payload_hash: str,
        file_digest: str | None,
    ) -> None:
        """The record's content facts, as an install, update or reinstall sets them."""
        self.category = category
        self.locator = locator
        self.path = path
        self.payload_hash = payload_hash
        #: The raw ``pack.json`` digest the record was made from (None: a v1 row).
        self.file_digest = file_digest
        self.removed = False

    def update(
        self, category: str, locator: str, path: str, payload_hash: str, file_digest: str | None
    ) -> None:
        self._updated(
            pack=self.pack,
            category=category,
            locator=locator,
            path=path,
            payload_hash=payload_hash,
            file_digest=file_digest,
        )

    def remove(self) -> None:
        self._removed(pack=self.pack, install_id=self.install_id)

    def reinstall(
        self, category: str, locator: str, path: str, payload_hash: str, file_digest: str | None
    ) -> None:
        """Install a removed local_path pack again under a fresh install id."""
        incarnation = self.incarnation + 1
        self._reinstalled(
            pack=self.pack,
            install_id=install_id_for(self.pack, "local_path", payload_hash, incarnation),
            incarnation=incarnation,
            category=category,
            locator=locator,
            path=path,
            payload_hash=payload_hash,
            file_digest=file_digest,
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


def local_id(pack: str) -> UUID:
    return aggregate_id("local", pack)


def legacy_id(pack: str) -> UUID:
    return aggregate_id("legacy", pack)
