"""Core lifecycle views, applied inline: installed packs, generations, activations, components.

* ``_System_InstalledPack`` — the compatibility view: one row per pack,
  describing only the *selected* generation (never the newest attempt), or the
  in-place record of a ``local_path`` pack, or a not-yet-adopted legacy row. A
  removed pack has no row (R7); the log keeps its history.
* ``_System_PackGeneration`` — every attempt with its status and frozen facts.
* ``_System_PackActivation`` — pack, selected install id, epoch (no row while the
  pack is removed: the pointer selects nothing).
* ``_System_PackComponent`` — the immutable components of every generation,
  materialized at preparation so publication never reopens a source.
"""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy as sa

from domain.canonical import canonical_bytes_trusted
from domain.content import fact_hasher
from domain.event_types import (
    T_ACTIVATED,
    T_ADVANCED,
    T_FAILED,
    T_LEGACY,
    T_LOCAL_INSTALLED,
    T_LOCAL_REINSTALLED,
    T_LOCAL_REMOVED,
    T_LOCAL_UPDATED,
    T_PREPARED,
    T_REINSTALLED,
    T_REMOVED,
    T_RETIRED,
    T_STARTED,
)
from domain.lifecycle import GenerationStatus, SourceKind
from ledger.log.sqltypes import BigInt, Binary, Blob, enc
from projections.framework import Projection, RowStore, ViewEvent, view_table


def _opt(value: str | None) -> bytes | None:
    return value.encode() if value is not None else None


# Status bytes as stored; precomputed because rebuilds apply millions of events.
_ACTIVE = GenerationStatus.ACTIVE.value.encode()
_PREPARING = GenerationStatus.PREPARING.value.encode()
_RETIRED = GenerationStatus.RETIRED.value.encode()
_FAILED_CLEAN = GenerationStatus.FAILED_CLEAN.value.encode()
_FAILED_DIRTY = GenerationStatus.FAILED_DIRTY.value.encode()


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
    """``_System_InstalledPack`` follows the activation pointer, never attempts (R8);
    a removal deletes the row (R7)."""

    name = "installed_pack"
    # Removal and re-installation (issue 15) added types but change no row of any log
    # without them, so views built before stay exact: the version is unchanged.
    version = 1
    tables = (INSTALLED_PACK,)
    types: ClassVar[frozenset[str]] = frozenset(
        {
            T_STARTED,
            T_ADVANCED,
            T_REMOVED,
            T_REINSTALLED,
            T_LOCAL_INSTALLED,
            T_LOCAL_UPDATED,
            T_LOCAL_REMOVED,
            T_LOCAL_REINSTALLED,
            T_LEGACY,
        }
    )

    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        d = event.data
        topic = event.type
        if topic in (T_REMOVED, T_LOCAL_REMOVED):
            key = (enc(d["pack"]),)
            if rows.get(INSTALLED_PACK, key) is None:
                raise LookupError(f"pack {d['pack']!r} removed while it had no row")
            rows.delete(INSTALLED_PACK, key)
            return
        if topic in (T_STARTED, T_ADVANCED, T_REINSTALLED):
            source = d["source"]
            row = {
                "pack": enc(d["pack"]),
                "install_id": enc(d["install_id"]),
                "category": enc(d["category"]),
                "source_kind": enc(source["kind"]),
                "locator": enc(source["locator"]),
                "revision": enc(d["revision"]),
                "applied_payload_hash": enc(d["payload_hash"]),
                "status": _ACTIVE,
                "epoch": d["epoch"],
            }
        elif topic in (T_LOCAL_INSTALLED, T_LOCAL_REINSTALLED):
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
            "status": _ACTIVE,
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
    weight = 4.5
    tables = (PACK_GENERATION,)
    types: ClassVar[frozenset[str]] = frozenset({T_PREPARED, T_ACTIVATED, T_RETIRED, T_FAILED})

    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        d = event.data
        key = (d["pack"].encode(), d["install_id"].encode())
        if event.type == T_PREPARED:
            source = d["source"]
            rows.put(
                PACK_GENERATION,
                {
                    "pack": key[0],
                    "install_id": key[1],
                    "ordinal": d["ordinal"],
                    "origin": d["origin"].encode(),
                    "status": _PREPARING,
                    "category": d["category"].encode(),
                    "source_kind": source["kind"].encode(),
                    "locator": source["locator"].encode(),
                    "revision": _opt(source.get("revision")),
                    "path": source["path"].encode(),
                    "payload_hash": d["payload_hash"].encode(),
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
        row = dict(row)  # never mutate a row another store layer may still hold
        if event.type == T_ACTIVATED:
            row["status"] = _ACTIVE
            row["applied_payload_hash"] = d["applied_payload_hash"].encode()
            row["epoch"] = d["epoch"]
        elif event.type == T_RETIRED:
            row["status"] = _RETIRED
        else:
            row["status"] = _FAILED_DIRTY if d["dirty"] else _FAILED_CLEAN
            row["failure_reason"] = d["reason"].encode()
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
    """``_System_PackActivation``: the pointer, with the log position it moved at; no row
    while the pack is removed (R7)."""

    name = "pack_activation"
    version = 1  # removal added types, no row of an older log changes (see above)
    tables = (PACK_ACTIVATION,)
    types: ClassVar[frozenset[str]] = frozenset({T_STARTED, T_ADVANCED, T_REMOVED, T_REINSTALLED})

    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        d = event.data
        if event.type == T_REMOVED:
            rows.delete(PACK_ACTIVATION, (enc(d["pack"]),))
            return
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
    weight = 5.0
    tables = (PACK_COMPONENT,)
    types: ClassVar[frozenset[str]] = frozenset({T_PREPARED})

    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        d = event.data
        pack, install_id, payload_hash = d["pack"], d["install_id"], d["payload_hash"]
        pack_b, install_b, hash_b = enc(pack), enc(install_id), enc(payload_hash)
        digest_of = fact_hasher(pack, install_id, payload_hash)
        for data in d["components"]:
            # Stored components are already canonical dicts (Component.to_json on
            # write), so their canonical bytes need no re-validation here.
            fact = canonical_bytes_trusted(data)
            rows.put(
                PACK_COMPONENT,
                {
                    "pack": pack_b,
                    "install_id": install_b,
                    "kind": data["kind"].encode(),
                    "key": data["key"].encode(),
                    "payload_hash": hash_b,
                    "fact": fact,
                    "fact_digest": digest_of(fact),
                },
            )


LIFECYCLE_PROJECTIONS: tuple[Projection, ...] = (
    InstalledPackView(),
    PackGenerationView(),
    PackActivationView(),
    PackComponentView(),
)
