"""Merkle roots, checkpoints and RFC 9162 proofs over the stored event ids (R22).

``MerkleLog`` caches perfect subtree hashes (levels >= 10), so a proof over a
million events reads one chunk of leaves plus O(log n) cached nodes;
``verify_proof`` checks a proof file offline against a checkpoint.
"""

from __future__ import annotations

import base64
from typing import Any

import sqlalchemy as sa

from domain import merkle
from domain.errors import IntegrityFailure, InvalidInput
from domain.notes import Checkpoint
from ledger.audit.results import ConsistencyProof, InclusionProof, ProofCheck
from ledger.log import tables as schema
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
    """The checkpoint origin: a property of the log (its ``log.named`` event), else the
    store's ``catalog-ledger/<store id>`` (``ledger.store.log_identity``)."""
    from ledger.store.log_identity import origin_of as log_origin

    return log_origin(ledger)


def checkpoint(ledger: Ledger) -> Checkpoint:
    log = MerkleLog(ledger)
    size = log.size()
    return Checkpoint(origin_of(ledger), size, log.root(size) if size else merkle.EMPTY_ROOT)


_PROOF_FIELDS: dict[str, dict[str, type]] = {
    "inclusion": {
        "position": int,
        "leaf_index": int,
        "tree_size": int,
        "event_id": str,
        "leaf_hash": str,
        "proof": list,
        "root": str,
    },
    "consistency": {"size1": int, "size2": int, "root1": str, "root2": str, "proof": list},
}


def _typed_fields(document: dict[str, Any], kind: str) -> None:
    """Every field a proof of ``kind`` needs, of its JSON type: INVALID naming the field."""
    for name, expected in _PROOF_FIELDS[kind].items():
        field = name  # its JSON path in the proof file, as parse_json names fields
        if name not in document:
            raise InvalidInput(f"the proof file has no {name!r}", field=field)
        value = document[name]
        if not isinstance(value, expected) or isinstance(value, bool):
            wanted = {int: "an integer", str: "a string", list: "a list"}[expected]
            raise InvalidInput(f"the proof file's {name!r} must be {wanted}", field=field)
        if isinstance(value, int) and value < 0:
            raise InvalidInput(f"the proof file's {name!r} must not be negative", field=field)
    for n, item in enumerate(document["proof"]):
        if not isinstance(item, str):
            raise InvalidInput("the proof's hashes must be strings", field=f"proof[{n}]")


def _hex32(document: dict[str, Any], name: str) -> bytes:
    try:
        value = bytes.fromhex(document[name])
    except ValueError:
        raise InvalidInput(f"the proof file's {name!r} is not hex", field=name) from None
    if len(value) != 32:
        raise InvalidInput(f"the proof file's {name!r} is not 32 bytes", field=name)
    return value


def _agree(
    first: str, a: object, second: str, b: object, what: str, *, ok: bool | None = None
) -> None:
    """Two fields that repeat one fact must say the same (``ok``, by default ``a == b``):
    INTEGRITY naming both."""
    if a == b if ok is None else ok:
        return
    raise IntegrityFailure(
        f"the proof's {first} and {second} disagree ({what}): a proof proves only what "
        "all its fields say",
        fields=[first, second],
        **{first.replace(".", "_"): _shown(a), second.replace(".", "_"): _shown(b)},
    )


def _shown(value: object) -> object:
    return b64(value) if isinstance(value, bytes) else value


def verify_proof(document: dict[str, Any], cp: Checkpoint) -> ProofCheck:
    """Check a proof document against a checkpoint, offline (no database).

    A malformed document is INVALID naming its field; a well-formed proof that
    does not check against the checkpoint is INTEGRITY (R22). Every field that
    repeats another (``position`` is ``leaf_index + 1``; ``tree_size``/``size2``
    and ``root``/``root2`` are the checkpoint's size and root; ``leaf_hash`` is
    the leaf hash of ``event_id``) is checked against it, so no field can claim
    what the proof does not prove: a disagreement is INTEGRITY naming both.
    """
    kind = document.get("type")
    if kind == "inclusion":
        _typed_fields(document, kind)
        position, index = document["position"], document["leaf_index"]
        _agree(
            "position",
            position,
            "leaf_index",
            index,
            f"position {position} is not leaf_index {index} + 1",
            ok=position == index + 1,
        )
        _agree("tree_size", document["tree_size"], "checkpoint.size", cp.size, "tree sizes")
        root = unb64(document["root"], "root")
        _agree("root", root, "checkpoint.root", cp.root, "root hashes")
        event_id = _hex32(document, "event_id")
        leaf = merkle.leaf_hash(event_id)
        _agree(
            "leaf_hash",
            unb64(document["leaf_hash"], "leaf_hash"),
            "event_id",
            document["event_id"],
            "leaf_hash is not the leaf hash of event_id",
            ok=unb64(document["leaf_hash"], "leaf_hash") == leaf,
        )
        merkle.verify_inclusion(
            document["leaf_index"],
            cp.size,
            leaf,
            [unb64(p, "proof") for p in document["proof"]],
            cp.root,
        )
        return {"ok": True, "type": kind, "position": document["position"], "size": cp.size}
    if kind == "consistency":
        _typed_fields(document, kind)
        _agree("size2", document["size2"], "checkpoint.size", cp.size, "tree sizes")
        root2 = unb64(document["root2"], "root2")
        _agree("root2", root2, "checkpoint.root", cp.root, "root hashes")
        merkle.verify_consistency(
            document["size1"],
            cp.size,
            [unb64(p, "proof") for p in document["proof"]],
            unb64(document["root1"], "root1"),
            cp.root,
        )
        return {"ok": True, "type": kind, "size1": document["size1"], "size2": cp.size}
    raise InvalidInput("the proof file has no known type", field="file")
