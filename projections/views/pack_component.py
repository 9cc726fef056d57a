"""``_System_PackComponent``: the immutable components of every generation, materialized
at preparation so publication never reopens a source; its table, ``apply`` and rebuild
kernel.
"""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy as sa

from domain.canonical import canonical_bytes_trusted
from domain.digests import Purpose, hasher, lp, u64
from domain.event_types import (
    T_PREPARED,
)
from domain.served import fact_hasher
from ledger.log.sqltypes import Binary, Blob, enc
from projections.framework import Projection, Replayer, TableReplayer, ViewEvent
from projections.rows import RowStore
from projections.tables import view_table
from projections.views.cells import (
    columns_are,
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

    def replayer(self, view_version: int) -> Replayer:
        return _PackComponentReplay(view_version)


columns_are(
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
