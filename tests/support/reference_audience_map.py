"""An independent computation of the audience map, written from schema/LOG-FORMAT.md alone.

Like ``reference_verifier``, it imports only ``blake3`` and the standard library:
it is the spec's recursive definition, with none of the project's incremental code.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from blake3 import blake3

KEY = "catalog-ledger 2026-12 audience map key v1"
LEAF = "catalog-ledger 2026-12 audience map leaf v1"
NODE = "catalog-ledger 2026-12 audience map node v1"
EMPTY = bytes(32)


def _lp(*parts: bytes) -> bytes:
    return b"".join(struct.pack(">Q", len(p)) + p for p in parts)


def key(kind: str, ident: str) -> bytes:
    return blake3(_lp(kind.encode(), ident.encode()), derive_key_context=KEY).digest()


def leaf(k: bytes, digest: bytes) -> bytes:
    return blake3(k + digest, derive_key_context=LEAF).digest()


def node(left: bytes, right: bytes) -> bytes:
    return blake3(left + right, derive_key_context=NODE).digest()


def _bit(k: bytes, depth: int) -> int:
    return (k[depth // 8] >> (7 - depth % 8)) & 1


def root(leaves: Mapping[bytes, bytes], depth: int = 0) -> bytes:
    """The root of ``leaves`` (key -> 32-byte digest) at ``depth``, by the definition."""
    if not leaves:
        return EMPTY
    if len(leaves) == 1:
        ((k, v),) = leaves.items()
        return leaf(k, v)
    zeros = {k: v for k, v in leaves.items() if _bit(k, depth) == 0}
    ones = {k: v for k, v in leaves.items() if _bit(k, depth) == 1}
    return node(root(zeros, depth + 1), root(ones, depth + 1))


def root_from_proof(k: bytes, digest: bytes, siblings: Sequence[bytes]) -> bytes:
    h = leaf(k, digest)
    for depth in reversed(range(len(siblings))):
        h = node(siblings[depth], h) if _bit(k, depth) else node(h, siblings[depth])
    return h
