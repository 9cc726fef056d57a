"""An independent verifier of the log format, written from schema/LOG-FORMAT.md alone.

It imports nothing of this project (no ``domain``, ``ledger``, ``projections``
or ``publisher``): only ``hashlib``, ``blake3``, ``cryptography`` (Ed25519) and the
standard library, plus ``reference_audience_map`` (the spec's audience map, likewise
spec-only), the way an auditor in any language would work from the spec. The test
suite runs it against the conformance vectors and against real exported stores; if
the project's code and this file ever disagree, one of them broke the format.

``verify_bundle`` checks a view with its proof bundle end to end (R29), from
LOG-FORMAT "Catalog log", "Proof bundle" and "Verifying a bundle" and the C2SP specs
signed-note, tlog-checkpoint and tlog-cosignature; it raises ``BundleRejected``
(INTEGRITY, with LOG-FORMAT's reason) or ``BundleStale`` (axis freshness or checkpoint).
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
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tests.support import reference_audience_map as audience_map

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


def check_trailer(record: dict[str, Any], verified: Verified, checkpoints: int = 0) -> None:
    """LOG-FORMAT.md "Trailer": what the last line says about the lines before it
    (version 2 exactly when checkpoint lines precede it, counting them)."""
    _expect("trailer version", record.get("trailer"), 2 if checkpoints else 1)
    fields = (*TRAILER_FIELDS, "checkpoints") if checkpoints else TRAILER_FIELDS
    _expect("trailer fields", sorted(record), sorted(fields))
    if checkpoints:
        _expect("trailer checkpoints", record["checkpoints"], checkpoints)
    _expect("trailer damaged", record["damaged"], 0)
    _expect("trailer count", record["count"], verified.size)
    _expect("trailer head_position", record["head_position"], verified.size)
    _expect("trailer head_chain", record["head_chain"], verified.chain.hex())
    _expect("trailer root", record["root"], base64.b64encode(verified.root).decode())


TRAILER_FIELDS = ("trailer", "count", "head_position", "head_chain", "root", "damaged")
CHECKPOINT_FIELDS = ("checkpoint", "origin", "size", "root", "note", "stored_at_us")


def check_checkpoint_line(
    record: dict[str, Any], leaves: list[bytes], catalog: list[bytes]
) -> None:
    """LOG-FORMAT.md "Checkpoint lines": the note's body is the line's origin, size and
    root, and that is the tree (the log's, or its catalog log's) at that size."""
    _expect("checkpoint line version", record.get("checkpoint"), 1)
    _expect("checkpoint line fields", sorted(record), sorted(CHECKPOINT_FIELDS))
    body = record["note"].split("\n\n", 1)[0].split("\n")
    _expect(
        "checkpoint note body", body[:3], [record["origin"], str(record["size"]), record["root"]]
    )
    tree = catalog if record["origin"].endswith("/catalog") else leaves
    if record["size"] > len(tree):
        raise Mismatch(f"checkpoint of {record['origin']}: size {record['size']} past the tree")
    _expect(
        "checkpoint root", record["root"], base64.b64encode(mth(tree[: record["size"]])).decode()
    )


def verify_export(lines: Iterable[str], *, legacy_no_trailer: bool = False) -> Verified:
    """Recompute every event id, chain link and the Merkle root of an ``export --jsonl``,
    and check its trailer, the last line (required unless ``legacy_no_trailer``)."""
    chain = bytes(32)
    leaves: list[bytes] = []
    trailer: dict[str, Any] | None = None
    carried: list[dict[str, Any]] = []
    catalog: list[bytes] = []  # the catalog log's leaves: catalog.published event ids
    number = 0
    for number, text in enumerate(lines, start=1):
        record = json.loads(text)
        if trailer is not None:
            raise Mismatch(f"line {number} follows the trailer")
        if "trailer" in record:
            trailer = record
            continue
        if "checkpoint" in record:
            carried.append(record)
            continue
        if carried:
            raise Mismatch(f"line {number}: an event line after a checkpoint line")
        _expect("position", record["position"], number)
        agg = uuid.UUID(record["aggregate_id"]).bytes
        state = base64.b64decode(record["state_b64"], validate=True)
        eid = event_id(agg, record["version"], record["topic"].encode(), state)
        _expect(f"{number}: event_id", eid.hex(), record["event_id"])
        chain = chain_link(chain, eid)
        _expect(f"{number}: chain", chain.hex(), record["chain"])
        leaves.append(leaf(eid))
        if record["topic"].startswith("catalog.published@"):
            catalog.append(leaf(eid))
    verified = Verified(len(leaves), mth(leaves), chain)
    if number == 0:
        raise Mismatch("an empty file is not an export")
    for record in carried:
        check_checkpoint_line(record, leaves, catalog)
    if trailer is not None:
        check_trailer(trailer, verified, len(carried))
    elif not legacy_no_trailer:
        raise Mismatch(f"no trailer after line {number}: the export is cut short")
    return verified


# -- proof bundles (LOG-FORMAT.md "Catalog log", "Proof bundle", "Verifying a bundle") --------
#
# Written from LOG-FORMAT.md and the C2SP specs signed-note, tlog-checkpoint and
# tlog-cosignature; ``cryptography`` verifies Ed25519 (RFC 8032). Nothing of the project.

AGGREGATE_CONTEXT = "catalog-ledger 2026-11 aggregate id v1"
FACT_CONTEXT = "catalog-ledger 2026-11 catalog fact v1"
AUDIENCE_VIEW_CONTEXT = "catalog-ledger 2026-11 audience view v1"
LOG_KEY_TYPE = 0x01  # signed-note: Ed25519
COSIGNATURE_TYPE = 0x04  # tlog-cosignature: timestamped Ed25519
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
HEX = frozenset("0123456789abcdef")


class BundleRejected(Exception):
    """INTEGRITY: the view or its proof does not verify; ``reason`` names the check."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class BundleStale(Exception):
    """STALE: a verified head that is older than allowed (``axis`` freshness or checkpoint)."""

    def __init__(self, axis: str, required: int, served: int) -> None:
        super().__init__(f"stale {axis}: required {required}, served {served}")
        self.axis, self.required, self.served = axis, required, served


def aggregate_id(kind: str, *name: str) -> bytes:
    data = lp(kind.encode(), *(p.encode() for p in name))
    return blake3(data, derive_key_context=AGGREGATE_CONTEXT).digest()[:16]


CATALOG_ID = aggregate_id("catalog", "catalog")


def canonical_json(value: Any) -> bytes:
    """LOG-FORMAT "Encodings": sorted keys, no whitespace, UTF-8, integers in 64 bits."""

    def check(v: Any) -> None:
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return
        if isinstance(v, int):
            if not INT_MIN <= v <= INT_MAX:
                raise ValueError(f"integer out of range: {v}")
        elif isinstance(v, list):
            for item in v:
                check(item)
        elif isinstance(v, dict):
            for k, item in v.items():
                if not isinstance(k, str):
                    raise ValueError("an object key is not a string")
                check(item)
        else:
            raise ValueError(f"not canonical JSON: {type(v).__name__}")

    check(value)
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def fact_digest(pack: str, install_id: str, payload_hash: str, fact: bytes) -> bytes:
    data = lp(pack.encode(), install_id.encode(), payload_hash.encode(), fact)
    return blake3(data, derive_key_context=FACT_CONTEXT).digest()


def audience_digest(kind: str, ident: str, grants: list[list[Any]], facts: list[list[Any]]) -> str:
    body = canonical_json({"audience": [kind, ident], "grants": grants, "facts": facts})
    return blake3(body, derive_key_context=AUDIENCE_VIEW_CONTEXT).hexdigest()


def key_id(name: str, key_type: int, public: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + bytes([key_type]) + public).digest()[:4]


@dataclass(frozen=True)
class PinnedKey:
    name: str
    id: bytes
    raw: bytes  # the 32-byte public key

    @classmethod
    def parse(cls, vkey: str, key_type: int) -> PinnedKey:
        """signed-note "Verifier keys": ``<name>+<hex key id>+<base64(type || public key)>``."""
        name, hex_id, material = vkey.split("+", 2)
        raw = base64.b64decode(material, validate=True)
        if not name or raw[:1] != bytes([key_type]) or len(raw) != 33:
            raise ValueError(f"not a type {key_type:#04x} Ed25519 verifier key: {vkey}")
        if bytes.fromhex(hex_id) != key_id(name, key_type, raw[1:]):
            raise ValueError(f"the key id of {vkey} is not the one its key gives")
        return cls(name, bytes.fromhex(hex_id), raw[1:])

    def verifies(self, signature: bytes, message: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.raw).verify(signature, message)
        except InvalidSignature:
            return False
        return True


def split_note(note: str) -> tuple[str, list[tuple[str, bytes]]]:
    """signed-note "Format": (text, [(key name, base64-decoded signature)]).

    The text ends in a newline and is separated from the signature lines by the last
    blank line; a text with no blank line is a note without signatures (then
    ``no_signature``). Anything else is not a signed note (``malformed_proof``)."""
    if any(ord(c) < 0x20 and c != "\n" for c in note) or not note.endswith("\n"):
        raise BundleRejected("malformed_proof", "the checkpoint is not a signed note")
    cut = note.rfind("\n\n")
    if cut < 0:
        return note, []
    text, rest, signatures = note[: cut + 1], note[cut + 2 :], []
    for line in rest[:-1].split("\n") if rest else []:
        name, _, encoded = line.removeprefix("\u2014 ").partition(" ")
        try:
            if not line.startswith("\u2014 ") or not name or "+" in name:
                raise ValueError(line)
            signature = base64.b64decode(encoded, validate=True)
        except ValueError:
            raise BundleRejected("malformed_proof", f"not a signature line: {line!r}") from None
        if len(signature) < 4:
            raise BundleRejected("malformed_proof", f"a signature without a key id: {line!r}")
        signatures.append((name, signature))
    return text, signatures


def parse_checkpoint(text: str) -> tuple[str, int, bytes]:
    """tlog-checkpoint "Note text": origin, size (decimal, no leading zero), root (base64)."""
    lines = text.split("\n")[:-1]
    if len(lines) < 3 or not all(lines):
        raise BundleRejected("malformed_proof", "the note text is not a checkpoint")
    origin, size, root = lines[:3]
    try:
        if not size.isdigit() or not size.isascii() or (size != "0" and size[0] == "0"):
            raise ValueError(size)
        digest = base64.b64decode(root, validate=True)
    except ValueError:
        raise BundleRejected("malformed_proof", "the checkpoint's size or root") from None
    if len(digest) != 32:
        raise BundleRejected("malformed_proof", "the checkpoint's root is not 32 bytes")
    return origin, int(size), digest


def _hashes(items: Any, what: str) -> list[bytes]:
    try:
        hashes = [base64.b64decode(h, validate=True) for h in items]
    except (TypeError, ValueError):
        raise BundleRejected("malformed_proof", f"{what} is not a list of base64 hashes") from None
    if not isinstance(items, list) or any(len(h) != 32 for h in hashes):
        raise BundleRejected("malformed_proof", f"{what} holds a hash that is not 32 bytes")
    return hashes


def verify_view(body: dict[str, Any]) -> tuple[str, str, int, bytes]:
    """The view's own digests: every fact digest, then the audience digest over the
    grants and facts received. Returns (kind, id, revision, audience digest bytes)."""
    kind, colon, ident = str(body.get("audience")).partition(":")
    revision = body.get("revision")
    if not colon or type(revision) is not int or revision < 1:
        raise BundleRejected("malformed_proof", "the view's audience or revision")
    grants = [
        [g[f] for f in ("pack", "kind", "key", "credential_set", "install_id")]
        for g in body["grants"]
    ]
    facts = []
    for f in body["facts"]:
        fact = canonical_json(
            {p: f[p] for p in ("kind", "key", "payload", "requires", "credential_sets")}
        )
        recomputed = fact_digest(f["pack"], f["install_id"], f["payload_hash"], fact).hex()
        if recomputed != f["fact_digest"]:
            raise BundleRejected("bad_fact_digest", f"{f['pack']}/{f['kind']}/{f['key']}")
        facts.append([f["pack"], f["install_id"], f["kind"], f["key"], recomputed])
    recorded = body["audience_digest"]
    if audience_digest(kind, ident, grants, facts) != recorded:
        raise BundleRejected("bad_audience_digest", "the grants and facts received")
    return kind, ident, revision, bytes.fromhex(recorded)


def verify_revision_event(event: Any, revision: int) -> tuple[bytes, bytes]:
    """Step 3: (event id, audiences_root) of the served revision's ``catalog.published``."""
    try:
        aggregate = uuid.UUID(event["aggregate_id"]).bytes
        version, topic = event["version"], event["topic"].encode()
        state_bytes = base64.b64decode(event["state_b64"], validate=True)
        state = json.loads(state_bytes)
        name, at, schema = event["topic"].partition("@")
        if type(version) is not int or version < 1 or not at or not schema.isdigit():
            raise ValueError("version or topic")
        audiences_root = state["audiences_root"]
        revision_stated = state["revision"]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BundleRejected("wrong_revision_event", f"not a stored event: {exc}") from None
    if aggregate != CATALOG_ID:
        raise BundleRejected("wrong_revision_event", "its aggregate is not the catalog")
    if name != "catalog.published" or schema[0] == "0" or int(schema) < 2:
        raise BundleRejected("wrong_revision_event", f"topic {event['topic']!r}")
    if type(revision_stated) is not int or revision_stated != revision:
        raise BundleRejected("wrong_revision_event", f"revision {revision_stated!r}")
    if (
        not isinstance(audiences_root, str)
        or len(audiences_root) != 64
        or set(audiences_root) - HEX
    ):
        raise BundleRejected("wrong_revision_event", "audiences_root is not 64 hex digits")
    return event_id(aggregate, version, topic, state_bytes), bytes.fromhex(audiences_root)


def audience_map_root(kind: str, ident: str, digest: bytes, siblings: list[bytes]) -> bytes:
    """LOG-FORMAT "Audience map": the root an inclusion proof gives for one audience."""
    return audience_map.root_from_proof(audience_map.key(kind, ident), digest, siblings)


def _pinned(policy: dict[str, Any]) -> tuple[list[PinnedKey], list[PinnedKey]]:
    logs = [PinnedKey.parse(k, LOG_KEY_TYPE) for k in policy["log_keys"]]
    witnesses = [PinnedKey.parse(w["key"], COSIGNATURE_TYPE) for w in policy["witnesses"]]
    return logs, witnesses


def verify_bundle(
    view_body: dict[str, Any], policy: dict[str, Any], accepted: dict[str, Any] | None, now: int
) -> dict[str, Any]:
    """LOG-FORMAT "Verifying a bundle", in its order. Returns the state to keep,
    ``{"size", "root" (base64), "revision"}``; raises ``BundleRejected`` (INTEGRITY) or
    ``BundleStale``. ``accepted`` is the kept state or None; nothing is mutated."""
    logs, witnesses = _pinned(policy)
    threshold, max_age = policy["threshold"], policy["max_age_seconds"]
    try:
        kind, ident, revision, view_digest = verify_view(view_body)
        proof = view_body["proof"]
        if proof["format"] != 1 or not isinstance(proof["checkpoint"], str):
            raise ValueError("format")
        inclusion, audience = proof["inclusion"], proof["audience"]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BundleRejected("malformed_proof", f"the view or its proof: {exc!r}") from None
    # 1. origin and the log's signature
    text, signatures = split_note(proof["checkpoint"])
    origin, size, root = parse_checkpoint(text)
    if origin != policy["origin"]:
        raise BundleRejected("wrong_origin", f"{origin!r} is not {policy['origin']!r}")
    signed = False
    for name, signature in signatures:
        for key in logs:
            if (name, signature[:4]) == (key.name, key.id):
                if not key.verifies(signature[4:], text.encode()):
                    raise BundleRejected("bad_signature", f"by the pinned log key {name}")
                signed = True
    if not signed:
        raise BundleRejected("no_signature", "no line by a pinned log key")
    # 2. cosignatures: one newest valid timestamp per distinct witness *key*: an Ed25519
    # cosignature does not commit to the witness's name (tlog-cosignature), so one key
    # pinned under two names would otherwise count twice from one signature.
    times: dict[bytes, int] = {}
    for name, signature in signatures:
        for key in witnesses:
            if (name, signature[:4]) != (key.name, key.id):
                continue
            stamp = int.from_bytes(signature[4:12], "big")
            message = f"cosignature/v1\ntime {stamp}\n{text}".encode()
            if len(signature) != 76 or stamp > INT_MAX or not key.verifies(signature[12:], message):
                raise BundleRejected("bad_cosignature", f"by the pinned witness {name}")
            times[key.raw] = max(times.get(key.raw, stamp), stamp)
    # ... and one witness is one name too: a witness pinned with its old and new key
    # (a rotation) that cosigned with both counts once.
    by_name: dict[str, int] = {}
    for key in witnesses:
        if key.raw in times:
            by_name[key.name] = max(by_name.get(key.name, 0), times.pop(key.raw))
    times = {name.encode(): stamp for name, stamp in by_name.items()}
    if len(times) < threshold:
        raise BundleRejected("too_few_cosignatures", f"{len(times)} of {threshold} required")
    # 3. the revision event
    eid, audiences_root = verify_revision_event(proof["revision_event"], revision)
    # 4. current: the last leaf of the catalog log is this revision
    if size != revision:
        raise BundleRejected("not_current", f"checkpoint size {size}, view revision {revision}")
    try:
        got = root_from_inclusion(revision - 1, size, leaf(eid), _hashes(inclusion, "inclusion"))
    except Mismatch as exc:
        raise BundleRejected("bad_inclusion", str(exc)) from None
    if got != root:
        raise BundleRejected("bad_inclusion", "the inclusion proof gives another root")
    # 5. the audience's own leaf under audiences_root
    siblings = _hashes(audience, "audience")
    if (
        len(siblings) > 256
        or audience_map_root(kind, ident, view_digest, siblings) != audiences_root
    ):
        raise BundleRejected("bad_audience_proof", f"{kind}:{ident} is not under audiences_root")
    # 6. freshness: the threshold-th newest witness timestamp
    newest = sorted(times.values(), reverse=True)[threshold - 1]
    if now - newest > max_age:
        raise BundleStale("freshness", now - max_age, newest)
    # 7. against the kept state
    if accepted is not None:
        size0, root0 = accepted["size"], base64.b64decode(accepted["root"], validate=True)
        if size < size0:
            raise BundleStale("checkpoint", size0, size)
        if size == size0 and root != root0:
            raise BundleRejected("inconsistent_tree", f"another root at size {size}")
        if size > size0:
            consistency = proof.get("consistency")
            if not isinstance(consistency, dict) or consistency.get("from_size") != size0:
                raise BundleRejected("missing_consistency", f"none from size {size0}")
            path = _hashes(consistency.get("proof"), "consistency")
            try:
                pair = roots_from_consistency(size0, size, path, root0)
            except (Mismatch, IndexError) as exc:
                raise BundleRejected("inconsistent_tree", f"bad proof: {exc!r}") from None
            if pair != (root0, root):
                raise BundleRejected("inconsistent_tree", f"{size0} -> {size} does not verify")
    # 8. accept
    return {"size": size, "root": base64.b64encode(root).decode(), "revision": revision}
