"""Core lifecycle views, applied inline: installed packs, generations, activations, components.

* ``_System_InstalledPack`` — the compatibility view: one row per pack,
  describing only the *selected* generation (never the newest attempt), or the
  in-place record of a ``local_path`` pack, or a not-yet-adopted legacy row.
* ``_System_PackGeneration`` — every attempt with its status and frozen facts.
* ``_System_PackActivation`` — pack, selected install id, epoch.
* ``_System_PackComponent`` — the immutable components of every generation,
  materialized at preparation so publication never reopens a source.
"""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy as sa
from eventsourcing.utils import get_topic

from domain.canonical import canonical_bytes_trusted
from domain.content import Component, fact_digest
from domain.lifecycle import (
    Generation,
    GenerationStatus,
    LegacyRecord,
    LocalPack,
    PackActivation,
    SourceKind,
)
from projections.framework import Projection, RowStore, ViewEvent, view_table
from projections.sqltypes import BigInt, Binary, Blob, enc

T_PREPARED = get_topic(Generation.Prepared)
T_ACTIVATED = get_topic(Generation.Activated)
T_RETIRED = get_topic(Generation.Retired)
T_FAILED = get_topic(Generation.Failed)
T_STARTED = get_topic(PackActivation.Started)
T_ADVANCED = get_topic(PackActivation.Advanced)
T_LOCAL_INSTALLED = get_topic(LocalPack.Installed)
T_LOCAL_UPDATED = get_topic(LocalPack.Updated)
T_LEGACY = get_topic(LegacyRecord.Imported)


def _opt(value: str | None) -> bytes | None:
    return enc(value) if value is not None else None


INSTALLED_PACK = view_table(
    "_System_InstalledPack",
    "view_installed_pack",
    ["pack"],
    sa.Column("pack", Binary(255)),
    sa.Column("install_id", Binary(255), nullable=False),
    sa.Column("category", Binary(255), nullable=False),
    sa.Column("source_kind", Binary(32), nullable=False),
    sa.Column("locator", Blob(), nullable=False),
    sa.Column("revision", Binary(255), nullable=True),
    sa.Column("applied_payload_hash", Blob(), nullable=True),
    sa.Column("status", Binary(255), nullable=False),
    sa.Column("epoch", sa.BigInteger(), nullable=True),
)


class InstalledPackView(Projection):
    """``_System_InstalledPack`` follows the activation pointer, never attempts (R8)."""

    name = "installed_pack"
    version = 1
    tables = (INSTALLED_PACK,)
    topics: ClassVar[frozenset[str]] = frozenset(
        {T_STARTED, T_ADVANCED, T_LOCAL_INSTALLED, T_LOCAL_UPDATED, T_LEGACY}
    )

    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        d = event.data
        topic = event.topic
        if topic in (T_STARTED, T_ADVANCED):
            source = d["source"]
            row = {
                "pack": enc(d["pack"]),
                "install_id": enc(d["install_id"]),
                "category": enc(d["category"]),
                "source_kind": enc(source["kind"]),
                "locator": enc(source["locator"]),
                "revision": enc(d["revision"]),
                "applied_payload_hash": enc(d["payload_hash"]),
                "status": enc(GenerationStatus.ACTIVE.value),
                "epoch": d["epoch"],
            }
        elif topic == T_LOCAL_INSTALLED:
            row = self._local(d, enc(d["install_id"]))
        elif topic == T_LOCAL_UPDATED:
            current = rows.get(INSTALLED_PACK, (enc(d["pack"]),))
            if current is None:
                raise LookupError(f"local pack {d['pack']!r} updated before it was installed")
            row = self._local(d, current["install_id"])
        else:  # legacy record
            source = d["source"]
            row = {
                "pack": enc(d["pack"]),
                "install_id": enc(d["install_id"]),
                "category": enc(d["category"]),
                "source_kind": enc(str(source.get("kind", ""))),
                "locator": enc(str(source.get("repo") or source.get("path") or "")),
                "revision": _opt(source.get("revision")),
                "applied_payload_hash": _opt(d["applied_payload_hash"]),
                "status": enc(d["status"]),
                "epoch": None,
            }
        rows.put(INSTALLED_PACK, row)

    @staticmethod
    def _local(d: dict[str, Any], install_id: bytes) -> dict[str, Any]:
        return {
            "pack": enc(d["pack"]),
            "install_id": install_id,
            "category": enc(d["category"]),
            "source_kind": enc(SourceKind.LOCAL_PATH.value),
            "locator": enc(d["locator"]),
            "revision": None,
            "applied_payload_hash": enc(d["payload_hash"]),
            "status": enc(GenerationStatus.ACTIVE.value),
            "epoch": None,
        }


PACK_GENERATION = view_table(
    "_System_PackGeneration",
    "view_pack_generation",
    ["pack", "install_id"],
    sa.Column("pack", Binary(255)),
    sa.Column("install_id", Binary(255)),
    sa.Column("ordinal", sa.BigInteger(), nullable=False),
    sa.Column("origin", Binary(16), nullable=False),
    sa.Column("status", Binary(16), nullable=False),
    sa.Column("category", Binary(255), nullable=False),
    sa.Column("source_kind", Binary(32), nullable=False),
    sa.Column("locator", Blob(), nullable=False),
    sa.Column("revision", Binary(255), nullable=True),
    sa.Column("path", Blob(), nullable=False),
    sa.Column("payload_hash", Binary(80), nullable=False),
    sa.Column("applied_payload_hash", Binary(80), nullable=True),
    sa.Column("epoch", sa.BigInteger(), nullable=True),
    sa.Column("from_install_id", Binary(255), nullable=True),
    sa.Column("failure_reason", Blob(), nullable=True),
    indexes=[["status"]],
)


class PackGenerationView(Projection):
    """``_System_PackGeneration``: every attempt, its status and frozen facts."""

    name = "pack_generation"
    version = 1
    tables = (PACK_GENERATION,)
    topics: ClassVar[frozenset[str]] = frozenset({T_PREPARED, T_ACTIVATED, T_RETIRED, T_FAILED})

    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        d = event.data
        key = (enc(d["pack"]), enc(d["install_id"]))
        if event.topic == T_PREPARED:
            source = d["source"]
            rows.put(
                PACK_GENERATION,
                {
                    "pack": key[0],
                    "install_id": key[1],
                    "ordinal": d["ordinal"],
                    "origin": enc(d["origin"]),
                    "status": enc(GenerationStatus.PREPARING.value),
                    "category": enc(d["category"]),
                    "source_kind": enc(source["kind"]),
                    "locator": enc(source["locator"]),
                    "revision": _opt(source.get("revision")),
                    "path": enc(source["path"]),
                    "payload_hash": enc(d["payload_hash"]),
                    "applied_payload_hash": None,
                    "epoch": None,
                    "from_install_id": _opt(d.get("from_install_id")),
                    "failure_reason": None,
                },
            )
            return
        row = rows.get(PACK_GENERATION, key)
        if row is None:
            raise LookupError(f"generation {d['install_id']} of {d['pack']!r} was never prepared")
        row = dict(row)
        if event.topic == T_ACTIVATED:
            row.update(
                status=enc(GenerationStatus.ACTIVE.value),
                applied_payload_hash=enc(d["applied_payload_hash"]),
                epoch=d["epoch"],
            )
        elif event.topic == T_RETIRED:
            row["status"] = enc(GenerationStatus.RETIRED.value)
        else:
            status = GenerationStatus.FAILED_DIRTY if d["dirty"] else GenerationStatus.FAILED_CLEAN
            row.update(status=enc(status.value), failure_reason=enc(d["reason"]))
        rows.put(PACK_GENERATION, row)


PACK_ACTIVATION = view_table(
    "_System_PackActivation",
    "view_pack_activation",
    ["pack"],
    sa.Column("pack", Binary(255)),
    sa.Column("install_id", Binary(255), nullable=False),
    sa.Column("epoch", sa.BigInteger(), nullable=False),
    sa.Column("revision", Binary(255), nullable=False),
    sa.Column("payload_hash", Binary(80), nullable=False),
    sa.Column("position", BigInt(), nullable=False),
)


class PackActivationView(Projection):
    """``_System_PackActivation``: the pointer, with the log position it moved at."""

    name = "pack_activation"
    version = 1
    tables = (PACK_ACTIVATION,)
    topics: ClassVar[frozenset[str]] = frozenset({T_STARTED, T_ADVANCED})

    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        d = event.data
        rows.put(
            PACK_ACTIVATION,
            {
                "pack": enc(d["pack"]),
                "install_id": enc(d["install_id"]),
                "epoch": d["epoch"],
                "revision": enc(d["revision"]),
                "payload_hash": enc(d["payload_hash"]),
                "position": event.position,
            },
        )


PACK_COMPONENT = view_table(
    "_System_PackComponent",
    "view_pack_component",
    ["pack", "install_id", "kind", "key"],
    sa.Column("pack", Binary(255)),
    sa.Column("install_id", Binary(255)),
    sa.Column("kind", Binary(255)),
    sa.Column("key", Binary(255)),
    sa.Column("payload_hash", Binary(80), nullable=False),
    sa.Column("fact", Blob(), nullable=False),
    sa.Column("fact_digest", Binary(32), nullable=False),
)


class PackComponentView(Projection):
    """``_System_PackComponent``: each generation's components, canonical bytes + digest."""

    name = "pack_component"
    version = 1
    tables = (PACK_COMPONENT,)
    topics: ClassVar[frozenset[str]] = frozenset({T_PREPARED})

    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        d = event.data
        pack, install_id, payload_hash = d["pack"], d["install_id"], d["payload_hash"]
        for data in d["components"]:
            component = Component.from_json(data)
            fact = canonical_bytes_trusted(component.to_json())
            rows.put(
                PACK_COMPONENT,
                {
                    "pack": enc(pack),
                    "install_id": enc(install_id),
                    "kind": enc(component.kind),
                    "key": enc(component.key),
                    "payload_hash": enc(payload_hash),
                    "fact": fact,
                    "fact_digest": fact_digest(pack, install_id, payload_hash, fact),
                },
            )


LIFECYCLE_PROJECTIONS: tuple[Projection, ...] = (
    InstalledPackView(),
    PackGenerationView(),
    PackActivationView(),
    PackComponentView(),
)
