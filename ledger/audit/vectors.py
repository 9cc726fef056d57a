"""Conformance vectors of the log format (``schema/vectors/log/*.json``), made by this code.

The vectors are the log's rules as data: for fixed inputs (aggregate id,
version, topic, exact state bytes) they give the length-prefixed bytes that
are hashed, every ``event_id``, every chain link, the Merkle root at every
tree size, inclusion and consistency proofs, and a checkpoint. An outside
verifier written from ``schema/LOG-FORMAT.md`` alone must reproduce them;
the test suite runs one (``tests/support/reference_verifier.py``). ``catalog-ledger
schema dump`` regenerates them and a test checks they are not stale.

Inputs are fixed (no clock, no randomness), so the files are byte-stable.
"""

from __future__ import annotations

import base64
from typing import Any
from uuid import UUID

import orjson

from domain import audience_map, merkle
from domain.digests import ZERO_CHAIN, Purpose, aggregate_id, digest, event_id, lp, next_chain, u64
from domain.notes import Checkpoint
from ledger.audit.bundle_vectors import bundle_vectors, catalog_log_vectors
from ledger.log.trailer import Trailer

ORIGIN = "catalog-ledger/00000000000000000000000000000000"
_STAMP = "2026-12-01T00:00:00+00:00"


def _state(**fields: Any) -> bytes:
    """State bytes as the transcoder writes them: orjson, sorted keys, UTF-8."""
    return orjson.dumps({**fields, "timestamp": _STAMP}, option=orjson.OPT_SORT_KEYS)


def _inputs() -> list[tuple[UUID, int, str, bytes, str]]:
    """(aggregate id, version, topic, state bytes, what the case shows)."""
    lease = aggregate_id("lease", "writer")
    gen = aggregate_id("generation", "café", "0" * 32)
    aud = aggregate_id("audience", "app", "CRM")
    big = {f"k{i:04d}": "ü" * 40 for i in range(1500)}  # ~130 KB of state
    cases: list[tuple[UUID, int, str, bytes, str]] = [
        (
            lease,
            1,
            "lease.opened@1",
            _state(name="writer"),
            "first event: chain from 32 zero bytes",
        ),
        (lease, 2, "lease.acquired@1", _state(epoch=1, expires_at_us=1, holder="h"), "plain"),
        (UUID(int=0), 1, "catalog.opened@1", b"{}", "smallest state: an empty object"),
        (
            UUID(int=(1 << 128) - 1),
            9_223_372_036_854_775_807,
            "x.y@1",
            b"{}",
            "largest version (2^63 - 1), all-ones aggregate id, shortest type name",
        ),
        (
            gen,
            1,
            "generation.prepared@1",
            _state(pack="café", install_id="0" * 32, components=[], note="NFC é"),
            "non-ASCII identity (NFC)",
        ),
        (
            aggregate_id("generation", "cafe\u0301", "0" * 32),
            1,
            "generation.prepared@1",
            _state(pack="cafe\u0301", install_id="0" * 32, components=[], note="NFD e + U+0301"),
            "non-ASCII identity (NFD): other bytes, other id",
        ),
        (
            aud,
            1,
            "audience.opened@1",
            _state(audience_kind="app", audience_id="CRM"),
            "case variant CRM",
        ),
        (
            aggregate_id("audience", "app", "crm"),
            1,
            "audience.opened@1",
            _state(audience_kind="app", audience_id="crm"),
            "case variant crm",
        ),
        (
            aud,
            2,
            "binding.revoked@2",
            _state(
                audience_kind="app",
                audience_id="CRM",
                pack="sales",
                kind="k",
                key="K",
                credential_set=None,
                install_id="1" * 32,
            ),
            "schema version 2 of a type",
        ),
        (
            aud,
            3,
            "binding.revoked@1",
            _state(
                audience_kind="app",
                audience_id="CRM",
                pack="sales",
                kind="k",
                key="K",
                credential_set="erp-prod",
            ),
            "schema version 1 of the same type (read upcast, install_id null)",
        ),
        (
            gen,
            2,
            "domain.lifecycle:Generation.Activated",
            _state(pack="café", install_id="0" * 32, epoch=1, applied_payload_hash="v1:00"),
            "format v0 topic (a 0.1 Python path)",
        ),
        (
            aggregate_id("legacy", "billing"),
            1,
            "domain.lifecycle:LegacyRecord.Imported",
            _state(
                pack="billing",
                install_id="L-7",
                status="active",
                category="app",
                source={"kind": "official_repo"},
                applied_payload_hash=None,
                originator_topic="domain.lifecycle:LegacyRecord",
            ),
            "format v0 creating event: originator_topic in the state",
        ),
        (
            aggregate_id("generation", "big", "1" * 32),
            1,
            "generation.prepared@1",
            _state(pack="big", payload=big),
            "large state (> 64 KiB)",
        ),
        (
            aggregate_id("x", "emoji"),
            1,
            "command.recorded@1",
            _state(command_id="😀" * 10, kind="apply", request_digest="00", result={}),
            "4-byte UTF-8 in the state",
        ),
        (
            aggregate_id("x", "escapes"),
            1,
            "command.recorded@1",
            _state(command_id='q"\\\n\t\u0000', kind="apply", request_digest="00", result={}),
            "JSON escapes in the state: hashed as stored, never re-serialized",
        ),
        (
            aggregate_id("x", "ints"),
            1,
            "catalog.published@1",
            _state(
                revision=1,
                content_digest="ab",
                parent_digest=None,
                activations=[],
                released_packs=[],
                audiences=[],
                counts={"min": -(2**63), "max": 2**63 - 1},
                bindings_position=None,
            ),
            "integers at the edges of the canonical range",
        ),
        (
            aggregate_id("x", "not-json"),
            1,
            "x.y@1",
            b"\xff\x00 not json",
            "the hash covers stored bytes whatever they are",
        ),
        (
            aggregate_id("x", "length"),
            1,
            "ab@1",
            b'{"c":1}',
            "length prefixes: topic 'ab@1' + state '{\"c\":1}' ...",
        ),
        (
            aggregate_id("x", "length"),
            2,
            "ab@1{",
            b'"c":1}',
            "... and 'ab@1{' + '\"c\":1}': same concatenation, other event_id",
        ),
        (lease, 3, "lease.released@1", _state(epoch=1), "plain"),
        (aggregate_id("x", "version-bytes"), 256, "x.y@1", b"{}", "version 256: big-endian u64"),
    ]
    return cases


def event_vectors() -> dict[str, Any]:
    events = []
    chain = ZERO_CHAIN
    for position, (agg, version, topic, state, note) in enumerate(_inputs(), start=1):
        encoded = lp(agg.bytes, u64(version), topic.encode(), state)
        eid = event_id(agg.bytes, version, topic.encode(), state)
        chain = next_chain(chain, eid)
        events.append(
            {
                "position": position,
                "note": note,
                "aggregate_id": str(agg),
                "version": version,
                "topic": topic,
                "state_b64": base64.b64encode(state).decode(),
                "hashed_hex": encoded.hex() if len(encoded) <= 512 else None,
                "hashed_length": len(encoded),
                "event_id": eid.hex(),
                "chain": chain.hex(),
            }
        )
    return {
        "description": "event_id and chain of every event, in position order "
        "(schema/LOG-FORMAT.md: 'Event id', 'Chain'). hashed_hex is the exact "
        "length-prefixed input of event_id (omitted above 512 bytes).",
        "contexts": {"event_id": Purpose.EVENT_ID.value, "chain": Purpose.CHAIN.value},
        "chain_0": ZERO_CHAIN.hex(),
        "events": events,
    }


def merkle_vectors(event_ids: list[bytes]) -> dict[str, Any]:
    leaves = [merkle.leaf_hash(e) for e in event_ids]
    n = len(leaves)
    roots = [{"size": size, "root": merkle.root(leaves[:size]).hex()} for size in range(1, n + 1)]
    inclusion = [
        {
            "index": index,
            "size": size,
            "leaf_hash": leaves[index].hex(),
            "proof": [h.hex() for h in merkle.inclusion_proof(leaves, index, size)],
        }
        for index, size in ((0, 1), (0, n), (n - 1, n), (5, 13), (12, 13), (7, 16))
        if index < size <= n
    ]
    consistency = [
        {
            "size1": a,
            "size2": b,
            "proof": [h.hex() for h in merkle.consistency_proof(leaves, a, b)],
        }
        for a, b in ((1, n), (4, 8), (6, 13), (13, n), (n, n))
        if 1 <= a <= b <= n
    ]
    checkpoint = Checkpoint(ORIGIN, n, merkle.root(leaves))
    return {
        "description": "RFC 9162 Merkle tree over the event ids of events.json: leaf = "
        "SHA-256(0x00 || event_id), node = SHA-256(0x01 || left || right).",
        "leaf_data": "event_id",
        "roots": roots,
        "inclusion": inclusion,
        "consistency": consistency,
        "checkpoint": {"origin": ORIGIN, "size": n, "text": checkpoint.text()},
    }


def audience_map_vectors() -> dict[str, Any]:
    """The audience map (R28): keys, leaves, the root as audiences join and leave, and
    an inclusion proof of every leaf of the largest set."""
    names = [("app", "crm-main"), ("app", "CRM-Main"), ("integration", "ünïcode"), ("app", "")]
    names += [("app", f"tenant-{i:02d}") for i in range(12)]
    digests = {a: digest(Purpose.CATALOG, lp(*(p.encode() for p in a))) for a in names}
    audiences = [
        {
            "kind": kind,
            "id": ident,
            "key": audience_map.key_of(kind, ident).hex(),
            "digest": digests[(kind, ident)].hex(),
            "leaf": audience_map.leaf_hash(
                audience_map.key_of(kind, ident), digests[(kind, ident)]
            ).hex(),
        }
        for kind, ident in names
    ]
    roots = []
    leaves: dict[bytes, bytes] = {}
    for n, (kind, ident) in enumerate(names, 1):
        leaves[audience_map.key_of(kind, ident)] = digests[(kind, ident)]
        roots.append({"audiences": n, "root": audience_map.root_of(leaves).hex()})
    nodes = audience_map.nodes_of(leaves)
    fetch = audience_map.memory_fetch(nodes)
    proofs = []
    for kind, ident in names:
        siblings, _ = audience_map.inclusion_proof(fetch, audience_map.key_of(kind, ident))
        proofs.append({"kind": kind, "id": ident, "siblings": [h.hex() for h in siblings]})
    removed = dict(leaves)
    for kind, ident in names[:4]:
        del removed[audience_map.key_of(kind, ident)]
    return {
        "about": "Audience map (schema/LOG-FORMAT.md, 'Audience map'). Digests are stand-ins: "
        "BLAKE3-derive-key('catalog-ledger 2026-11 catalog content v1', lp(kind, id)).",
        "empty_root": audience_map.EMPTY.hex(),
        "audiences": audiences,
        "roots": roots,
        "inclusion": {"root": audience_map.root_of(leaves).hex(), "proofs": proofs},
        "after_removing_first_four": audience_map.root_of(removed).hex(),
    }


def export_vectors(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The trailer line an export of the first ``size`` events of events.json ends with."""
    leaves = [merkle.leaf_hash(bytes.fromhex(e["event_id"])) for e in events]
    cases = []
    for size in sorted({0, 1, 13, len(events)}):
        chain = bytes.fromhex(events[size - 1]["chain"]) if size else ZERO_CHAIN
        trailer = Trailer(
            count=size, head_position=size, head_chain=chain, root=merkle.root(leaves[:size])
        )
        cases.append({"size": size, "line": orjson.dumps(trailer.to_json()).decode()})
    return {
        "description": "The trailer: the last line of an export of the first `size` events "
        "of events.json (schema/LOG-FORMAT.md: 'Trailer'). count and head_position = size, "
        "head_chain = chain[size] (hex), root = the Merkle root of size (base64), damaged = 0. "
        "Compare parsed JSON, not bytes: key order is not significant.",
        "trailers": cases,
    }


def log_identity_vectors() -> dict[str, Any]:
    """``log.named``, a key rotation statement by fixed keys, and what a client's rule
    (``apply_rotation``) makes of it and of tampered variants (R29)."""
    from domain.errors import IntegrityFailure
    from domain.key_rotation import Rotation, apply_rotation, rotation_statement
    from domain.notes import SignerKey
    from domain.origin import log_identity_id

    identity = log_identity_id()
    state = _state(origin=ORIGIN)
    named = event_id(identity.bytes, 1, b"log.named@1", state)
    old = SignerKey(ORIGIN, bytes(range(32)))
    new = SignerKey(ORIGIN, bytes(range(32, 64)))
    until = 1_800_000_000
    statement = rotation_statement(ORIGIN, old, new.verifier, until)
    body, _, signature = statement.partition("\n\n")
    stranger = SignerKey("stranger", bytes(range(64, 96)))
    variants = {
        "accepted at until": (statement, ORIGIN, until),
        "past until": (statement, ORIGIN, until + 1),
        "another origin": (statement, ORIGIN + "/catalog", until),
        "until edited": (
            body.replace(str(until), str(until + 1)) + "\n\n" + signature,
            ORIGIN,
            until,
        ),
        "signed by another key": (
            stranger.sign(Rotation(ORIGIN, old.verifier, new.verifier, until).body()),
            ORIGIN,
            until,
        ),
    }
    cases = []
    for name, (text, origin, now) in variants.items():
        try:
            keys = apply_rotation([old.verifier], text, origin=origin, now=now)
            outcome: dict[str, Any] = {
                "keys": [{"key": k.key.text(), "until": k.until} for k in keys]
            }
        except IntegrityFailure as exc:
            outcome = {"refused": exc.details["reason"]}
        cases.append({"case": name, "statement": text, "origin": origin, "now": now, **outcome})
    return {
        "about": "The log identity (schema/LOG-FORMAT.md, 'Log identity'): the log.named "
        "event of ORIGIN, and a key rotation statement (a signed note by the old key) with "
        "what a client holding only the old key makes of it. Keys are Ed25519 seeds "
        "0..31 (old), 32..63 (new), 64..95 (stranger).",
        "named": {
            "aggregate_id": str(identity),
            "version": 1,
            "topic": "log.named@1",
            "state_b64": base64.b64encode(state).decode(),
            "event_id": named.hex(),
        },
        "old_key": old.verifier.text(),
        "new_key": new.verifier.text(),
        "rotations": cases,
    }


def all_vectors() -> dict[str, dict[str, Any]]:
    """File name -> document, for ``schema/vectors/log/``."""
    events = event_vectors()
    ids = [bytes.fromhex(e["event_id"]) for e in events["events"]]
    return {
        "events.json": events,
        "merkle.json": merkle_vectors(ids),
        "audience_map.json": audience_map_vectors(),
        "export.json": export_vectors(events["events"]),
        "log_identity.json": log_identity_vectors(),
        "catalog_log.json": catalog_log_vectors(),
        "bundle.json": bundle_vectors(),
    }
