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

from typing import Any, ClassVar, cast

import sqlalchemy as sa

from domain.canonical import canonical_bytes_trusted
from domain.digests import Purpose, hasher, lp, u64
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
from domain.served import fact_hasher
from ledger.log.sqltypes import BigInt, Binary, Blob, enc
from projections.framework import (
    Key,
    Projection,
    Replayer,
    RowStore,
    TableReplayer,
    ViewEvent,
    ViewTable,
    view_table,
)


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

    def replayer(self, view_version: int) -> Replayer:
        return _InstalledPackReplay(view_version)

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


def _columns_are(table: ViewTable, *names: str) -> None:
    """The kernels below write rows positionally: pin the column order they assume."""
    if table.columns != names:
        raise AssertionError(f"{table.name}: columns {table.columns}, a kernel assumes {names}")


_columns_are(
    INSTALLED_PACK,
    "pack",
    "install_id",
    "category",
    "source_kind",
    "locator",
    "revision",
    "applied_payload_hash",
    "status",
    "epoch",
)
_LOCAL_PATH = SourceKind.LOCAL_PATH.value.encode()


class _InstalledPackReplay(TableReplayer):
    """``InstalledPackView.apply`` as a rebuild kernel (same rows, as tuples)."""

    table = INSTALLED_PACK

    def __init__(self, view_version: int) -> None:
        super().__init__(view_version)
        rows, vv = self.rows, view_version

        def removed(_position: int, d: dict[str, Any]) -> None:
            del rows[(d["pack"].encode(),)]  # KeyError: apply names the poison event

        def activated(_position: int, d: dict[str, Any]) -> None:
            source = d["source"]
            pack = d["pack"].encode()
            rows[(pack,)] = (
                vv,
                pack,
                d["install_id"].encode(),
                d["category"].encode(),
                source["kind"].encode(),
                source["locator"].encode(),
                d["revision"].encode(),
                d["payload_hash"].encode(),
                _ACTIVE,
                d["epoch"],
            )

        def local(d: dict[str, Any], install_id: bytes) -> None:
            pack = d["pack"].encode()
            rows[(pack,)] = (
                vv,
                pack,
                install_id,
                d["category"].encode(),
                _LOCAL_PATH,
                d["locator"].encode(),
                None,
                d["payload_hash"].encode(),
                _ACTIVE,
                None,
            )

        def local_installed(_position: int, d: dict[str, Any]) -> None:
            local(d, d["install_id"].encode())

        def local_updated(_position: int, d: dict[str, Any]) -> None:
            local(d, rows[(d["pack"].encode(),)][2])

        def legacy(_position: int, d: dict[str, Any]) -> None:
            source = d["source"]
            pack = d["pack"].encode()
            rows[(pack,)] = (
                vv,
                pack,
                d["install_id"].encode(),
                d["category"].encode(),
                str(source.get("kind", "")).encode(),
                str(source.get("repo") or source.get("path") or "").encode(),
                _opt(source.get("revision")),
                _opt(d["applied_payload_hash"]),
                d["status"].encode(),
                None,
            )

        self.handlers = {
            T_REMOVED: removed,
            T_LOCAL_REMOVED: removed,
            T_STARTED: activated,
            T_ADVANCED: activated,
            T_REINSTALLED: activated,
            T_LOCAL_INSTALLED: local_installed,
            T_LOCAL_REINSTALLED: local_installed,
            T_LOCAL_UPDATED: local_updated,
            T_LEGACY: legacy,
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

    def replayer(self, view_version: int) -> Replayer:
        return _PackGenerationReplay(view_version)


_columns_are(
    PACK_GENERATION,
    "pack",
    "install_id",
    "ordinal",
    "origin",
    "status",
    "category",
    "source_kind",
    "locator",
    "revision",
    "path",
    "payload_hash",
    "applied_payload_hash",
    "epoch",
    "from_install_id",
    "failure_reason",
)


class _PackGenerationReplay(TableReplayer):
    """``PackGenerationView.apply`` as a rebuild kernel; rows are lists updated in place
    (index 0 is ``view_version``, then the columns above)."""

    table = PACK_GENERATION

    def __init__(self, view_version: int) -> None:
        super().__init__(view_version)
        rows, vv = cast(dict[Key, list[Any]], self.rows), view_version  # updated in place

        def prepared(_position: int, d: dict[str, Any]) -> None:
            pack, install_id = d["pack"].encode(), d["install_id"].encode()
            source = d["source"]
            revision = source.get("revision")
            previous = d.get("from_install_id")
            rows[(pack, install_id)] = [
                vv,
                pack,
                install_id,
                d["ordinal"],
                d["origin"].encode(),
                _PREPARING,
                d["category"].encode(),
                source["kind"].encode(),
                source["locator"].encode(),
                None if revision is None else revision.encode(),
                source["path"].encode(),
                d["payload_hash"].encode(),
                None,
                None,
                None if previous is None else previous.encode(),
                None,
            ]

        def activated(_position: int, d: dict[str, Any]) -> None:
            row = rows[(d["pack"].encode(), d["install_id"].encode())]
            row[5] = _ACTIVE
            row[12] = d["applied_payload_hash"].encode()
            row[13] = d["epoch"]

        def retired(_position: int, d: dict[str, Any]) -> None:
            rows[(d["pack"].encode(), d["install_id"].encode())][5] = _RETIRED

        def failed(_position: int, d: dict[str, Any]) -> None:
            row = rows[(d["pack"].encode(), d["install_id"].encode())]
            row[5] = _FAILED_DIRTY if d["dirty"] else _FAILED_CLEAN
            row[15] = d["reason"].encode()

        self.handlers = {
            T_PREPARED: prepared,
            T_ACTIVATED: activated,
            T_RETIRED: retired,
            T_FAILED: failed,
        }


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

    def replayer(self, view_version: int) -> Replayer:
        return _PackActivationReplay(view_version)


_columns_are(PACK_ACTIVATION, "pack", "install_id", "epoch", "revision", "payload_hash", "position")


class _PackActivationReplay(TableReplayer):
    """``PackActivationView.apply`` as a rebuild kernel."""

    table = PACK_ACTIVATION

    def __init__(self, view_version: int) -> None:
        super().__init__(view_version)
        rows, vv = self.rows, view_version

        def removed(_position: int, d: dict[str, Any]) -> None:
            rows.pop((d["pack"].encode(),), None)

        def moved(position: int, d: dict[str, Any]) -> None:
            pack = d["pack"].encode()
            rows[(pack,)] = (
                vv,
                pack,
                d["install_id"].encode(),
                d["epoch"],
                d["revision"].encode(),
                d["payload_hash"].encode(),
                position,
            )

        self.handlers = {
            T_REMOVED: removed,
            T_STARTED: moved,
            T_ADVANCED: moved,
            T_REINSTALLED: moved,
        }


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

    def replayer(self, view_version: int) -> Replayer:
        return _PackComponentReplay(view_version)


_columns_are(
    PACK_COMPONENT, "pack", "install_id", "kind", "key", "payload_hash", "fact", "fact_digest"
)


class _PackComponentReplay(TableReplayer):
    """``PackComponentView.apply`` as a rebuild kernel. The fact digest is
    ``domain.content.fact_hasher``'s, computed without its per-generation cache
    (every generation is new in a replay)."""

    table = PACK_COMPONENT

    def __init__(self, view_version: int) -> None:
        super().__init__(view_version)
        rows, vv = self.rows, view_version
        fact_base = hasher(Purpose.FACT)

        def prepared(_position: int, d: dict[str, Any]) -> None:
            pack, install_id = d["pack"].encode(), d["install_id"].encode()
            payload_hash = d["payload_hash"].encode()
            base = fact_base.copy()
            base.update(lp(pack, install_id, payload_hash))
            for data in d["components"]:
                fact = canonical_bytes_trusted(data)
                h = base.copy()
                h.update(u64(len(fact)))
                h.update(fact)
                kind, key = data["kind"].encode(), data["key"].encode()
                rows[(pack, install_id, kind, key)] = (
                    vv,
                    pack,
                    install_id,
                    kind,
                    key,
                    payload_hash,
                    fact,
                    bytes(h.digest()),
                )

        self.handlers = {T_PREPARED: prepared}


LIFECYCLE_PROJECTIONS: tuple[Projection, ...] = (
    InstalledPackView(),
    PackGenerationView(),
    PackActivationView(),
    PackComponentView(),
)
