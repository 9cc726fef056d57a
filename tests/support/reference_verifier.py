"""An independent verifier of the log format, written from schema/LOG-FORMAT.md alone.

It imports nothing of this project (no ``domain``, ``ledger``, ``projections``
or ``publisher``): only ``hashlib``, ``blake3`` and the standard library, the
way an auditor in any language would work from the spec. The test suite runs
it against the conformance vectors and against real exported stores; if the
project's code and this file ever disagree, one of them broke the format.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from blake3 import blake3

EVENT_CONTEXT = "catalog-ledger 2026-11 event v1"
CHAIN_CONTEXT = "catalog-ledger 2026-11 chain v1"


class Mismatch(AssertionError):
    """What the spec computes differs from what was given."""


def u64(n: int) -> bytes:
    return struct.pack(">Q", n)


def lp(*parts: bytes) -> bytes:
    return b"".join(u64(len(p)) + p for p in parts)


def event_id(aggregate: bytes, version: int, topic: bytes, state: bytes) -> bytes:
    data = lp(aggregate, u64(version), topic, state)
    return blake3(data, derive_key_context=EVENT_CONTEXT).digest()


def chain_link(previous: bytes, eid: bytes) -> bytes:
    return blake3(previous + eid, derive_key_context=CHAIN_CONTEXT).digest()


def leaf(eid: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + eid).digest()


def node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def mth(leaves: Sequence[bytes]) -> bytes:
    """RFC 9162 2.1.1 over leaf hashes."""
    n = len(leaves)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return leaves[0]
    k = 1
    while k * 2 < n:
        k *= 2
    return node(mth(leaves[:k]), mth(leaves[k:]))


def root_from_inclusion(index: int, size: int, leaf_hash: bytes, proof: Sequence[bytes]) -> bytes:
    """RFC 9162 2.1.3.2."""
    if index >= size:
        raise Mismatch("index beyond the tree")
    fn, sn, r = index, size - 1, leaf_hash
    for p in proof:
        if sn == 0:
            raise Mismatch("inclusion proof too long")
        if fn & 1 or fn == sn:
            r = node(p, r)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise Mismatch("inclusion proof too short")
    return r


def roots_from_consistency(
    size1: int, size2: int, proof: Sequence[bytes], root1: bytes
) -> tuple[bytes, bytes]:
    """RFC 9162 2.1.4.2: (root of size1, root of size2) the proof implies."""
    if size1 == size2:
        if proof:
            raise Mismatch("a proof between equal sizes must be empty")
        return root1, root1
    path = list(proof)
    if size1 & (size1 - 1) == 0:  # a power of two: root1 starts the path
        path = [root1, *path]
    fn, sn = size1 - 1, size2 - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise Mismatch("consistency proof too long")
        if fn & 1 or fn == sn:
            fr, sr = node(c, fr), node(c, sr)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise Mismatch("consistency proof too short")
    return fr, sr


def checkpoint_text(origin: str, size: int, root: bytes) -> str:
    return f"{origin}\n{size}\n{base64.b64encode(root).decode()}\n"


def _expect(what: str, got: Any, want: Any) -> None:
    if got != want:
        raise Mismatch(f"{what}: computed {got!r}, given {want!r}")


# -- conformance vectors ----------------------------------------------------------------------


def check_event_vectors(doc: dict[str, Any]) -> list[bytes]:
    """Recompute every vector of events.json; return the event ids in position order."""
    _expect("event context", doc["contexts"]["event_id"], EVENT_CONTEXT)
    _expect("chain context", doc["contexts"]["chain"], CHAIN_CONTEXT)
    chain = bytes.fromhex(doc["chain_0"])
    _expect("chain[0]", chain, bytes(32))
    ids = []
    for number, e in enumerate(doc["events"], start=1):
        _expect("position", e["position"], number)
        agg = uuid.UUID(e["aggregate_id"]).bytes
        topic, state = e["topic"].encode(), base64.b64decode(e["state_b64"], validate=True)
        hashed = lp(agg, u64(e["version"]), topic, state)
        _expect(f"{number}: hashed length", len(hashed), e["hashed_length"])
        if e["hashed_hex"] is not None:
            _expect(f"{number}: hashed bytes", hashed.hex(), e["hashed_hex"])
        eid = event_id(agg, e["version"], topic, state)
        _expect(f"{number}: event_id", eid.hex(), e["event_id"])
        chain = chain_link(chain, eid)
        _expect(f"{number}: chain", chain.hex(), e["chain"])
        ids.append(eid)
    return ids


def check_merkle_vectors(doc: dict[str, Any], event_ids: list[bytes]) -> None:
    leaves = [leaf(e) for e in event_ids]
    roots = {r["size"]: bytes.fromhex(r["root"]) for r in doc["roots"]}
    _expect("root sizes", sorted(roots), list(range(1, len(leaves) + 1)))
    for size, root in roots.items():
        _expect(f"root of {size}", mth(leaves[:size]), root)
    for case in doc["inclusion"]:
        proof = [bytes.fromhex(h) for h in case["proof"]]
        _expect("leaf hash", leaves[case["index"]].hex(), case["leaf_hash"])
        got = root_from_inclusion(case["index"], case["size"], leaves[case["index"]], proof)
        _expect(f"inclusion {case['index']}/{case['size']}", got, roots[case["size"]])
    for case in doc["consistency"]:
        a, b = case["size1"], case["size2"]
        proof = [bytes.fromhex(h) for h in case["proof"]]
        pair = roots_from_consistency(a, b, proof, roots[a])
        _expect(f"consistency {a}->{b}", pair, (roots[a], roots[b]))
    cp = doc["checkpoint"]
    _expect("checkpoint", checkpoint_text(cp["origin"], cp["size"], roots[cp["size"]]), cp["text"])


# -- a whole exported log ---------------------------------------------------------------------


@dataclass(frozen=True)
class Verified:
    size: int
    root: bytes
    chain: bytes

    def checkpoint(self, origin: str) -> str:
        return checkpoint_text(origin, self.size, self.root)


def check_export_vectors(doc: dict[str, Any], events: dict[str, Any]) -> None:
    """Recompute the trailer of every prefix in export.json from the events of events.json."""
    chain, leaves = bytes(32), []
    chains = [chain]
    for e in events["events"]:
        eid = bytes.fromhex(e["event_id"])
        chain = chain_link(chain, eid)
        chains.append(chain)
        leaves.append(leaf(eid))
    for case in doc["trailers"]:
        size = case["size"]
        want = {
            "trailer": 1,
            "count": size,
            "head_position": size,
            "head_chain": chains[size].hex(),
            "root": base64.b64encode(mth(leaves[:size])).decode(),
            "damaged": 0,
        }
        _expect(f"trailer of {size}", json.loads(case["line"]), want)


def check_trailer(record: dict[str, Any], verified: Verified) -> None:
    """LOG-FORMAT.md "Trailer": what the last line says about the lines before it."""
    _expect("trailer version", record.get("trailer"), 1)
    _expect("trailer fields", sorted(record), sorted(TRAILER_FIELDS))
    _expect("trailer damaged", record["damaged"], 0)
    _expect("trailer count", record["count"], verified.size)
    _expect("trailer head_position", record["head_position"], verified.size)
    _expect("trailer head_chain", record["head_chain"], verified.chain.hex())
    _expect("trailer root", record["root"], base64.b64encode(verified.root).decode())


TRAILER_FIELDS = ("trailer", "count", "head_position", "head_chain", "root", "damaged")


def verify_export(lines: Iterable[str], *, legacy_no_trailer: bool = False) -> Verified:
    """Recompute every event id, chain link and the Merkle root of an ``export --jsonl``,
    and check its trailer, the last line (required unless ``legacy_no_trailer``)."""
    chain = bytes(32)
    leaves: list[bytes] = []
    trailer: dict[str, Any] | None = None
    number = 0
    for number, text in enumerate(lines, start=1):
        record = json.loads(text)
        if trailer is not None:
            raise Mismatch(f"line {number} follows the trailer")
        if "trailer" in record:
            trailer = record
            continue
        _expect("position", record["position"], number)
        agg = uuid.UUID(record["aggregate_id"]).bytes
        state = base64.b64decode(record["state_b64"], validate=True)
        eid = event_id(agg, record["version"], record["topic"].encode(), state)
        _expect(f"{number}: event_id", eid.hex(), record["event_id"])
        chain = chain_link(chain, eid)
        _expect(f"{number}: chain", chain.hex(), record["chain"])
        leaves.append(leaf(eid))
    verified = Verified(len(leaves), mth(leaves), chain)
    if number == 0:
        raise Mismatch("an empty file is not an export")
    if trailer is not None:
        check_trailer(trailer, verified)
    elif not legacy_no_trailer:
        raise Mismatch(f"no trailer after line {number}: the export is cut short")
    return verified
