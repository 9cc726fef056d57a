"""Purpose-separated BLAKE3 digests (R4) — every derive-key context lives here.

Each purpose has its own derive-key context, so a digest computed for one
purpose can never be mistaken for another. The only non-BLAKE3 digests in the
project are the Merkle tree (SHA-256, RFC 6962/9162, R22) and the legacy v0
payload hash (SHA-256 hex), which exist for interoperability.

``lp`` is the length-prefixed encoding used wherever several byte strings are
digested together (R2): each part is an unsigned 64-bit big-endian length
followed by the bytes, so no choice of part contents can alias another tuple.
"""

from __future__ import annotations

import struct
from enum import StrEnum
from functools import lru_cache
from uuid import UUID

from blake3 import blake3


class Purpose(StrEnum):
    """The derive-key context of every digest purpose (one per purpose)."""

    EVENT_ID = "catalog-ledger 2026-11 event v1"
    CHAIN = "catalog-ledger 2026-11 chain v1"
    AGGREGATE_ID = "catalog-ledger 2026-11 aggregate id v1"
    PAYLOAD_V1 = "catalog-ledger 2026-11 payload v1"
    INSTALL_ID = "catalog-ledger 2026-11 install id v1"
    REQUEST = "catalog-ledger 2026-11 command request v1"
    MANIFEST = "catalog-ledger 2026-11 manifest v1"
    FACT = "catalog-ledger 2026-11 catalog fact v1"
    CATALOG = "catalog-ledger 2026-11 catalog content v1"
    AUDIENCE_VIEW = "catalog-ledger 2026-11 audience view v1"
    PROJECTION = "catalog-ledger 2026-11 projection rows v1"
    #: A credential's bearer token (R26): the log holds only this digest, never the token.
    CREDENTIAL_TOKEN = "catalog-ledger 2026-11 credential token v1"
    #: The audience map (R28, R29): a sparse Merkle tree of every audience's view digest,
    #: its root carried by each revision (``domain.audience_map``).
    AUDIENCE_MAP_KEY = "catalog-ledger 2026-12 audience map key v1"
    AUDIENCE_MAP_LEAF = "catalog-ledger 2026-12 audience map leaf v1"
    AUDIENCE_MAP_NODE = "catalog-ledger 2026-12 audience map node v1"
    #: What a revision serves, by payload only (``publisher.equivalence``): equal for two
    #: revisions serving the same facts and grants under other install ids and epochs.
    PAYLOAD_EQUIVALENCE = "catalog-ledger 2026-12 payload equivalence v1"


_U64 = struct.Struct(">Q")
_pack = _U64.pack
ZERO_CHAIN = bytes(32)

#: One derive-key hasher per purpose, made once at import. A digest copies it, so the
#: context key is derived once per process instead of once per digest (a copy and an
#: update cost less than half of a fresh derive-key hash of a short input).
_KEYED: dict[Purpose, blake3] = {p: blake3(derive_key_context=p.value) for p in Purpose}
_EVENT_ID = _KEYED[Purpose.EVENT_ID]
_CHAIN = _KEYED[Purpose.CHAIN]


def digest(purpose: Purpose, data: bytes) -> bytes:
    """BLAKE3 in derive-key mode for ``purpose``: 32 bytes."""
    return _keyed(_KEYED[purpose], data)


def hasher(purpose: Purpose) -> blake3:
    """An incremental BLAKE3 hasher for ``purpose`` (for streamed input)."""
    return _KEYED[purpose].copy()


def _keyed(template: blake3, data: bytes) -> bytes:
    h = template.copy()
    h.update(data)
    return h.digest()


def u64(value: int) -> bytes:
    return _pack(value)


def lp(*parts: bytes) -> bytes:
    """Length-prefixed concatenation: ``len(p) as u64 BE || p`` for each part."""
    out: list[bytes] = []
    for part in parts:
        out.append(_pack(len(part)))
        out.append(part)
    return b"".join(out)


@lru_cache(maxsize=1 << 15)
def aggregate_id(kind: str, *name_parts: str) -> UUID:
    """A stable aggregate id derived from a typed name (e.g. a pack name).

    Memoized: a release derives the same pack's and audience's ids many times over."""
    data = lp(kind.encode("utf-8"), *(p.encode("utf-8") for p in name_parts))
    return UUID(bytes=digest(Purpose.AGGREGATE_ID, data)[:16])


def event_id(aggregate: bytes, version: int, topic: bytes, state: bytes) -> bytes:
    """``event_id`` of DESIGN "The log": over the stored bytes, length-prefixed."""
    return _keyed(_EVENT_ID, lp(aggregate, u64(version), topic, state))


def next_chain(previous: bytes, event: bytes) -> bytes:
    """``chain[n] = BLAKE3(chain ctx, chain[n-1] || event_id[n])``."""
    return _keyed(_CHAIN, previous + event)
