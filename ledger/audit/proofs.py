"""Merkle roots, checkpoints and RFC 9162 proofs over the stored event ids (R22).

``MerkleLog`` caches perfect subtree hashes (levels >= 10), so a proof over a
million events reads one chunk of leaves plus O(log n) cached nodes;
``verify_proof`` checks a proof file offline against a checkpoint.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from domain.errors import IntegrityFailure, InvalidInput
from ledger.audit.results import ConsistencyProof, InclusionProof, ProofCheck
from ledger.log import merkle
from ledger.log import tables as schema
from ledger.log.checkpoint import Checkpoint
from ledger.store.runtime import Ledger

CHUNK_LEVEL = 10  # perfect subtrees of 2^10 leaves and larger are cached
# -- Merkle over the stored log ---------------------------------------------------------------


class MerkleLog:
    """Roots and proofs over the stored ``event_id``s, with a subtree cache."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._cache: dict[tuple[int, int], bytes] = {}
        self._new: dict[tuple[int, int], bytes] = {}
        self._leaves: dict[int, list[bytes]] = {}

    def size(self) -> int:
        return self.ledger.recorder.head().position

    def _chunk(self, start: int) -> list[bytes]:
        """Leaf hashes of the 1024-leaf chunk beginning at ``start`` (0-based)."""
        if start not in self._leaves:
            with self.ledger.db.read() as conn:
                ids = self.ledger.recorder.event_ids(
                    conn, after=start, upto=start + (1 << CHUNK_LEVEL)
                )
            self._leaves[start] = [merkle.leaf_hash(i) for i in ids]
        return self._leaves[start]

    def node(self, start: int, end: int) -> bytes:
        """Hash of the perfect, aligned subtree over leaves ``[start, end)``."""
        size = end - start
        level = size.bit_length() - 1
        if level <= CHUNK_LEVEL:
            base = start - start % (1 << CHUNK_LEVEL)
            leaves = self._chunk(base)
            if len(leaves) < end - base:
                raise InvalidInput("the requested tree is larger than the log", field="size")
            return merkle.subtree_root(leaves, start - base, end - base)
        key = (level, start >> level)
        if key not in self._cache:
            self._load([key])
        if key not in self._cache:
            mid = start + size // 2
            value = merkle.node_hash(self.node(start, mid), self.node(mid, end))
            self._cache[key] = self._new[key] = value
        return self._cache[key]

    def _load(self, keys: list[tuple[int, int]]) -> None:
        t = schema.merkle
        with self.ledger.db.read() as conn:
            for level, idx in keys:
                found = conn.execute(
                    sa.select(t.c.hash).where(t.c.level == level, t.c.idx == idx)
                ).scalar()
                if found is not None:
                    self._cache[(level, idx)] = bytes(found)

    def flush(self) -> None:
        """Persist newly computed subtree hashes (idempotent)."""
        if not self._new:
            return
        t = schema.merkle
        with self.ledger.db.write() as conn:
            existing = {
                (int(r.level), int(r.idx))
                for r in conn.execute(
                    sa.select(t.c.level, t.c.idx).where(
                        sa.tuple_(t.c.level, t.c.idx).in_(list(self._new))
                    )
                )
            }
            rows = [
                {"level": lv, "idx": ix, "hash": h}
                for (lv, ix), h in self._new.items()
                if (lv, ix) not in existing
            ]
            if rows:
                conn.execute(t.insert(), rows)
        self._new.clear()

    def root(self, size: int) -> bytes:
        value = merkle.root_from(self.node, size)
        self.flush()
        return value

    def inclusion(self, position: int, size: int) -> InclusionProof:
        head = self.size()
        if not 1 <= position <= size <= head:
            raise InvalidInput(
                f"need 1 <= position <= size <= {head} (log size)",
                field="position",
                position=position,
                size=size,
            )
        proof = merkle.inclusion_proof_from(self.node, position - 1, size)
        with self.ledger.db.read() as conn:
            (event_id,) = self.ledger.recorder.event_ids(conn, after=position - 1, upto=position)
        document: InclusionProof = {
            "type": "inclusion",
            "position": position,
            "leaf_index": position - 1,
            "tree_size": size,
            "event_id": event_id.hex(),
            "leaf_hash": b64(merkle.leaf_hash(event_id)),
            "proof": [b64(p) for p in proof],
            "root": b64(self.root(size)),
        }
        self.flush()
        return document

    def consistency(self, size1: int, size2: int) -> ConsistencyProof:
        head = self.size()
        if not 1 <= size1 <= size2 <= head:
            raise InvalidInput(
                f"need 1 <= from-size <= to-size <= {head} (log size)",
                field="from_size",
                size1=size1,
                size2=size2,
            )
        proof = merkle.consistency_proof_from(self.node, size1, size2)
        document: ConsistencyProof = {
            "type": "consistency",
            "size1": size1,
            "size2": size2,
            "root1": b64(self.root(size1)),
            "root2": b64(self.root(size2)),
            "proof": [b64(p) for p in proof],
        }
        self.flush()
        return document


def b64(data: bytes) -> str:

    return base64.b64encode(data).decode()


def unb64(text: str, field: str) -> bytes:

    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        raise InvalidInput(f"{field} is not base64", field=field) from None


def origin_of(ledger: Ledger) -> str:
    """The checkpoint origin: a stable name for this store (its id in ledger_meta)."""
    t = schema.meta
    with ledger.db.read() as conn:
        found = conn.execute(sa.select(t.c.value).where(t.c.name == b"store_id")).scalar()
    if found is None:
        raise InvalidInput("the store has no id; run `catalog-ledger init`", field="db")
    return f"catalog-ledger/{bytes(found).decode()}"


def checkpoint(ledger: Ledger) -> Checkpoint:
    log = MerkleLog(ledger)
    size = log.size()
    return Checkpoint(origin_of(ledger), size, log.root(size) if size else merkle.EMPTY_ROOT)


def _proof_value(document: dict[str, Any], name: str, convert: Callable[[Any], Any]) -> Any:
    """``document[name]`` through ``convert``; missing or malformed is INVALID, not a crash."""
    if name not in document:
        raise InvalidInput(f"the proof file has no {name!r}", field=f"file.{name}")
    try:
        return convert(document[name])
    except (TypeError, ValueError):
        raise InvalidInput(
            f"the proof file's {name!r} is malformed", field=f"file.{name}"
        ) from None


def _proof_hashes(value: Any) -> list[bytes]:
    if not isinstance(value, list):
        raise TypeError("not a list")
    return [unb64(p, "proof") for p in value]


def verify_proof(document: dict[str, Any], cp: Checkpoint) -> ProofCheck:
    """Check a proof document against a checkpoint, offline (no database)."""
    kind = document.get("type")
    if kind == "inclusion":
        if document.get("tree_size") != cp.size:
            raise IntegrityFailure(
                "the proof is for another tree size than the checkpoint",
                proof_size=document.get("tree_size"),
                checkpoint_size=cp.size,
            )
        event_id = _proof_value(document, "event_id", lambda v: bytes.fromhex(str(v)))
        leaf = merkle.leaf_hash(event_id)
        if leaf != _proof_value(document, "leaf_hash", lambda v: unb64(str(v), "leaf_hash")):
            raise IntegrityFailure("the leaf hash does not match the event id")
        merkle.verify_inclusion(
            _proof_value(document, "leaf_index", int),
            cp.size,
            leaf,
            _proof_value(document, "proof", _proof_hashes),
            cp.root,
        )
        position = _proof_value(document, "position", lambda v: v)
        return {"ok": True, "type": kind, "position": position, "size": cp.size}
    if kind == "consistency":
        if document.get("size2") != cp.size:
            raise IntegrityFailure(
                "the proof does not end at the checkpoint's size",
                proof_size=document.get("size2"),
                checkpoint_size=cp.size,
            )
        size1 = _proof_value(document, "size1", int)
        merkle.verify_consistency(
            size1,
            cp.size,
            _proof_value(document, "proof", _proof_hashes),
            _proof_value(document, "root1", lambda v: unb64(str(v), "root1")),
            cp.root,
        )
        return {"ok": True, "type": kind, "size1": size1, "size2": cp.size}
    raise InvalidInput("the proof file has no known type", field="file")
