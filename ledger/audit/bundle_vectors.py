"""Conformance vectors of the catalog log and the proof bundle (R29), made by this code.

``catalog_log.json``: four ``catalog.published`` v2 revision events, their event ids,
the catalog log's root at every size, the inclusion proof of the last leaf at every
size, consistency proofs, and the checkpoint of the whole log signed by the log key and
cosigned by three witnesses (LOG-FORMAT "Catalog log"). ``bundle.json``: the served
view of one audience at revision 3 with its ``proof`` member, the trust policy, a
``now``, the state a client keeps on accepting it, and tampered variants (RFC 6902 JSON
Patch operations on the body, a client state, a later ``now``) each with what a client
must answer (LOG-FORMAT "Proof bundle", "Verifying a bundle").

Everything is fixed: Ed25519 seeds (signatures are deterministic, RFC 8032),
cosignature timestamps, the made-up views, so the files are byte-stable. The other
audiences' views are made up the same way; only their digests are written.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson

from domain import audience_map, merkle
from domain.canonical import canonical_bytes
from domain.digests import Purpose, aggregate_id, digest, event_id, lp
from domain.notes import Checkpoint, SignerKey, WitnessSigner
from domain.served import audience_digest, fact_bytes, fact_digest

#: The main log's origin of the other vectors (``vectors.ORIGIN``), and its catalog log's.
MAIN_ORIGIN = "catalog-ledger/00000000000000000000000000000000"
ORIGIN = f"{MAIN_ORIGIN}/catalog"
CATALOG = aggregate_id("catalog", "catalog")
TOPIC = "catalog.published@2"
STAMP = "2026-12-01T00:00:00+00:00"
#: The client's clock of bundle.json (POSIX seconds, 2027-01-15T08:00:00Z).
NOW = 1_800_000_000
MAX_AGE = 3600
THRESHOLD = 2
REVISIONS = 4
SERVED = 3  # the bundle's revision
AUDIENCE = ("integration", "a")
AUDIENCES = (("app", "crm"), ("app", "portal"), AUDIENCE, ("integration", "b"))

LOG_KEY = SignerKey(MAIN_ORIGIN, bytes(range(32)))  # named after the main log's origin
WITNESSES = tuple(
    WitnessSigner(f"witness{n}.example", bytes(range(32 * (n + 3), 32 * (n + 4)))) for n in range(3)
)
STRANGER = SignerKey(MAIN_ORIGIN, bytes(range(64, 96)))  # same name, a key nobody pinned
#: When each witness cosigned the checkpoint of size 3 (bundle.json) and of size 4.
TIMES = {SERVED: (NOW - 300, NOW - 200, NOW - 100), REVISIONS: (NOW + 100, NOW + 200, NOW + 300)}


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _flip(text: str, at: int) -> str:
    raw = bytearray(base64.b64decode(text))
    raw[at] ^= 1
    return _b64(bytes(raw))


# -- a made-up catalog --------------------------------------------------------------------


def view(kind: str, ident: str, revision: int) -> dict[str, Any]:
    """The view body of ``kind:ident`` at ``revision`` (no proof), every digest right:
    the connector of pack ``sales`` (a new edition each revision), and for integrations
    the ``billing`` connector under the credential set ``default``."""
    packs: list[tuple[str, int, str | None]] = []
    if kind == "integration":
        packs.append(("billing", 1, "default"))
    packs.append(("sales", revision, None))
    grants, facts = [], []
    for pack, edition, credential_set in packs:
        payload_hash = "v1:" + digest(Purpose.PAYLOAD_V1, lp(pack.encode(), b"%d" % edition)).hex()
        install_id = digest(
            Purpose.INSTALL_ID, lp(pack.encode(), b"%d" % edition, payload_hash.encode(), b"1")
        )[:16].hex()
        fact: dict[str, Any] = {
            "kind": "connector",
            "key": f"{pack}-api",
            "payload": {"edition": edition, "url": f"https://{pack}.example/v{edition}"},
            "requires": [],
            "credential_sets": [credential_set] if credential_set else [],
        }
        stored = fact_bytes(**fact)
        fd = fact_digest(pack, install_id, payload_hash, stored).hex()
        grants.append(
            {
                "pack": pack,
                "kind": "connector",
                "key": fact["key"],
                "credential_set": credential_set,
                "install_id": install_id,
            }
        )
        facts.append(
            {"pack": pack, "install_id": install_id, **fact, "payload_hash": payload_hash}
            | {"fact_digest": fd}
        )
    return {
        "audience": f"{kind}:{ident}",
        "revision": revision,
        "content_digest": _content_digest(revision),
        "audience_digest": _audience_digest(kind, ident, grants, facts),
        "grants": grants,
        "facts": facts,
    }


def _audience_digest(
    kind: str, ident: str, grants: list[dict[str, Any]], facts: list[dict[str, Any]]
) -> str:
    g = [[x["pack"], x["kind"], x["key"], x["credential_set"], x["install_id"]] for x in grants]
    f = [[x["pack"], x["install_id"], x["kind"], x["key"], x["fact_digest"]] for x in facts]
    return audience_digest((kind, ident), g, f)


def _content_digest(revision: int) -> str:
    """A stand-in: the content digest covers every audience's view (not checked here)."""
    return digest(Purpose.CATALOG, canonical_bytes({"revision": revision})).hex()


@dataclass(frozen=True)
class _Revision:
    number: int
    event: dict[str, Any]
    event_id: bytes
    digests: dict[tuple[str, str], bytes]
    nodes: dict[audience_map.Position, audience_map.Node]

    def audience_proof(self, kind: str, ident: str) -> list[str]:
        fetch = audience_map.memory_fetch(self.nodes)
        siblings, _ = audience_map.inclusion_proof(fetch, audience_map.key_of(kind, ident))
        return [_b64(h) for h in siblings]


@cache
def _revisions() -> tuple[_Revision, ...]:
    out: list[_Revision] = []
    for number in range(1, REVISIONS + 1):
        digests = {
            (k, i): bytes.fromhex(view(k, i, number)["audience_digest"]) for k, i in AUDIENCES
        }
        leaves = {audience_map.key_of(*a): d for a, d in digests.items()}
        sales = view("app", "crm", number)["facts"][0]
        activations = [["sales", sales["install_id"], f"r{number}", number, sales["payload_hash"]]]
        if number == 1:
            billing = view("integration", "a", 1)["facts"][0]
            activations.insert(
                0, ["billing", billing["install_id"], "r1", 1, billing["payload_hash"]]
            )
        state = {
            "revision": number,
            "content_digest": _content_digest(number),
            "parent_digest": _content_digest(number - 1) if number > 1 else None,
            "activations": activations,
            "released_packs": [],
            "audiences": [],
            "counts": {"audiences": 4, "activations": 2, "facts": 2, "grants": 6},
            "bindings_position": None,
            "audiences_root": audience_map.root_of(leaves).hex(),
            "timestamp": STAMP,
        }
        raw = orjson.dumps(state, option=orjson.OPT_SORT_KEYS)
        version = number + 1  # the catalog's version 1 is catalog.opened
        event = {
            "aggregate_id": str(CATALOG),
            "version": version,
            "topic": TOPIC,
            "state_b64": _b64(raw),
        }
        ident = event_id(CATALOG.bytes, version, TOPIC.encode(), raw)
        out.append(_Revision(number, event, ident, digests, audience_map.nodes_of(leaves)))
    return tuple(out)


def _leaves(size: int) -> list[bytes]:
    return [merkle.leaf_hash(r.event_id) for r in _revisions()[:size]]


def _root(size: int) -> bytes:
    return merkle.root(_leaves(size))


def _body(size: int, origin: str = ORIGIN) -> str:
    return Checkpoint(origin, size, _root(size)).text()


def note(
    size: int,
    *,
    origin: str = ORIGIN,
    signer: SignerKey | None = LOG_KEY,
    times: tuple[int | None, ...] | None = None,
) -> str:
    """The catalog checkpoint of ``size`` signed by ``signer`` (None: unsigned lines
    only) and cosigned by witness n at ``times[n]`` (None: not by that one)."""
    body = _body(size, origin)
    lines = [signer.sign(body).partition("\n\n")[2]] if signer is not None else []
    for witness, at in zip(WITNESSES, times or TIMES[size], strict=True):
        if at is not None:
            lines.append(witness.cosign(body, at) + "\n")
    return body + "\n" + "".join(lines)


def _state(size: int, root: bytes | None = None) -> dict[str, Any]:
    return {"size": size, "root": _b64(root or _root(size)), "revision": size}


# -- catalog_log.json ---------------------------------------------------------------------


def catalog_log_vectors() -> dict[str, Any]:
    revisions = _revisions()
    n = len(revisions)
    leaves = _leaves(n)
    return {
        "about": "The catalog log (schema/LOG-FORMAT.md, 'Catalog log'): leaf i is the event "
        "id of revision i + 1's catalog.published event (hashes hex, as merkle.json). The "
        "checkpoint of size 4 is signed by log_key (Ed25519 seed bytes 0..31) and cosigned "
        "(cosignature/v1) by the three witnesses (seeds 96..127, 128..159, 160..191) at "
        "the given timestamps. The states' views are those of bundle.json's builder.",
        "origin": ORIGIN,
        "log_key": LOG_KEY.verifier.text(),
        "witnesses": [w.verifier.text() for w in WITNESSES],
        "revisions": [
            {**r.event, "event_id": r.event_id.hex(), "leaf_hash": leaves[i].hex()}
            for i, r in enumerate(revisions)
        ],
        "roots": [{"size": s, "root": _root(s).hex()} for s in range(1, n + 1)],
        "inclusion": [
            {
                "index": s - 1,
                "size": s,
                "proof": [h.hex() for h in merkle.inclusion_proof(leaves, s - 1, s)],
            }
            for s in range(1, n + 1)
        ],
        "consistency": [
            {
                "size1": a,
                "size2": b,
                "proof": [h.hex() for h in merkle.consistency_proof(leaves, a, b)],
            }
            for a, b in ((1, 4), (2, 3), (2, 4), (3, 4))
        ],
        "checkpoint": {
            "size": n,
            "body": _body(n),
            "cosigned_at": list(TIMES[n]),
            "note": note(n),
        },
    }


# -- bundle.json --------------------------------------------------------------------------


def served() -> dict[str, Any]:
    """The body ``GET /v1/audiences/integration/a/view?proof=1&since_size=2`` answers."""
    rev = _revisions()[SERVED - 1]
    return view(*AUDIENCE, SERVED) | {
        "proof": {
            "format": 1,
            "checkpoint": note(SERVED),
            "revision_event": rev.event,
            "inclusion": [_b64(h) for h in merkle.inclusion_proof(_leaves(SERVED), 2, SERVED)],
            "audience": rev.audience_proof(*AUDIENCE),
            "consistency": {
                "from_size": 2,
                "proof": [_b64(h) for h in merkle.consistency_proof(_leaves(SERVED), 2, SERVED)],
            },
        }
    }


def _replace(path: str, value: Any) -> dict[str, Any]:
    return {"op": "replace", "path": path, "value": value}


def _remove(path: str) -> dict[str, Any]:
    return {"op": "remove", "path": path}


def _lines(text: str) -> tuple[str, list[str]]:
    body, _, lines = text.partition("\n\n")
    return body + "\n\n", lines.splitlines(keepends=True)


def _edit_line(text: str, n: int, at: int) -> str:
    """``text`` with byte ``at`` of signature line ``n``'s base64 flipped."""
    head, lines = _lines(text)
    dash, name, signature = lines[n].split(" ")
    lines[n] = f"{dash} {name} {_flip(signature.strip(), at)}\n"
    return head + "".join(lines)


def _tampered() -> list[tuple[str, list[dict[str, Any]], dict[str, Any]]]:
    """(case, edits, expected outcome) with no client state and ``now`` = NOW."""
    body = served()
    fact = body["facts"][1]
    evil = {**fact["payload"], "url": "https://evil.example/"}
    redigested = fact_digest(
        fact["pack"],
        fact["install_id"],
        fact["payload_hash"],
        fact_bytes(fact["kind"], fact["key"], evil, fact["requires"], fact["credential_sets"]),
    ).hex()
    facts = [body["facts"][0], {**fact, "payload": evil, "fact_digest": redigested}]
    forged_digest = _audience_digest(*AUDIENCE, body["grants"], facts)
    signed = note(SERVED)
    inclusion = body["proof"]["inclusion"]

    def integrity(reason: str) -> dict[str, Any]:
        return {"integrity": reason}

    return [
        (
            "a fact's payload altered, its digests kept",
            [_replace("/facts/1/payload", evil)],
            integrity("bad_fact_digest"),
        ),
        (
            "a fact altered and its fact digest recomputed, the audience digest kept",
            [_replace("/facts/1/payload", evil), _replace("/facts/1/fact_digest", redigested)],
            integrity("bad_audience_digest"),
        ),
        ("a grant dropped", [_remove("/grants/0")], integrity("bad_audience_digest")),
        (
            "a forged view with every digest recomputed",
            [
                _replace("/facts/1/payload", evil),
                _replace("/facts/1/fact_digest", redigested),
                _replace("/audience_digest", forged_digest),
            ],
            integrity("bad_audience_proof"),
        ),
        (
            "another audience's map proof",
            [_replace("/proof/audience", _revisions()[SERVED - 1].audience_proof("app", "crm"))],
            integrity("bad_audience_proof"),
        ),
        (
            "the main log's origin (same tree, signed and cosigned)",
            [_replace("/proof/checkpoint", note(SERVED, origin=MAIN_ORIGIN))],
            integrity("wrong_origin"),
        ),
        (
            "the log's signature altered",
            [_replace("/proof/checkpoint", _edit_line(signed, 0, 10))],
            integrity("bad_signature"),
        ),
        (
            "the log's signature removed",
            [_replace("/proof/checkpoint", note(SERVED, signer=None))],
            integrity("no_signature"),
        ),
        (
            "signed by a key that is not pinned",
            [_replace("/proof/checkpoint", note(SERVED, signer=STRANGER))],
            integrity("no_signature"),
        ),
        (
            "a cosignature altered",
            [_replace("/proof/checkpoint", _edit_line(signed, 2, 40))],
            integrity("bad_cosignature"),
        ),
        (
            "a cosignature's timestamp altered",
            [_replace("/proof/checkpoint", _edit_line(signed, 2, 11))],
            integrity("bad_cosignature"),
        ),
        (
            "one cosignature of the two required",
            [_replace("/proof/checkpoint", note(SERVED, times=(None, None, NOW - 100)))],
            integrity("too_few_cosignatures"),
        ),
        (
            "one witness's two cosignatures count once",
            [
                _replace(
                    "/proof/checkpoint",
                    note(SERVED, times=(NOW - 300, None, None))
                    + WITNESSES[0].cosign(_body(SERVED), NOW - 10)
                    + "\n",
                )
            ],
            integrity("too_few_cosignatures"),
        ),
        (
            "the view claims revision 2 (revision 3's event)",
            [_replace("/revision", 2)],
            integrity("wrong_revision_event"),
        ),
        (
            "the event's topic is catalog.published@1",
            [_replace("/proof/revision_event/topic", "catalog.published@1")],
            integrity("wrong_revision_event"),
        ),
        (
            "another aggregate's event",
            [_replace("/proof/revision_event/aggregate_id", str(aggregate_id("catalog", "x")))],
            integrity("wrong_revision_event"),
        ),
        (
            "revision 3 under the checkpoint of size 4",
            [
                _replace("/proof/checkpoint", note(REVISIONS)),
                _replace(
                    "/proof/inclusion",
                    [_b64(h) for h in merkle.inclusion_proof(_leaves(REVISIONS), 2, REVISIONS)],
                ),
            ],
            integrity("not_current"),
        ),
        (
            "an inclusion hash altered",
            [_replace("/proof/inclusion/0", _flip(inclusion[0], 0))],
            integrity("bad_inclusion"),
        ),
        (
            "the inclusion proof emptied",
            [_remove("/proof/inclusion/0")],
            integrity("bad_inclusion"),
        ),
        ("proof format 2", [_replace("/proof/format", 2)], integrity("malformed_proof")),
        ("no proof member", [_remove("/proof")], integrity("malformed_proof")),
        (
            "an inclusion hash of 31 bytes",
            [_replace("/proof/inclusion/0", _b64(base64.b64decode(inclusion[0])[:31]))],
            integrity("malformed_proof"),
        ),
    ]


def bundle_vectors() -> dict[str, Any]:
    root = _revisions()[SERVED - 1]
    limit = sorted(TIMES[SERVED], reverse=True)[THRESHOLD - 1]  # the threshold-th newest
    kept: list[tuple[str, dict[str, Any] | None, int, list[dict[str, Any]], dict[str, Any]]] = [
        ("no kept state", None, NOW, [], {"state": _state(SERVED)}),
        ("kept size 2: the consistency proof", _state(2), NOW, [], {"state": _state(SERVED)}),
        ("kept the same head", _state(SERVED), NOW, [], {"state": _state(SERVED)}),
        (
            "the threshold-th newest cosignature exactly max_age_seconds old",
            None,
            limit + MAX_AGE,
            [],
            {"state": _state(SERVED)},
        ),
        (
            "one second later: a frozen head",
            None,
            limit + MAX_AGE + 1,
            [],
            {"stale": "freshness", "required": limit + 1, "served": limit},
        ),
        (
            "kept size 4: a rollback or a lagging replica",
            _state(REVISIONS),
            NOW,
            [],
            {"stale": "checkpoint", "required": REVISIONS, "served": SERVED},
        ),
        (
            "kept another root at size 3: a split view",
            _state(SERVED, _root(2)),
            NOW,
            [],
            {"integrity": "inconsistent_tree"},
        ),
        (
            "kept another root at size 2",
            _state(2, _root(1)),
            NOW,
            [],
            {"integrity": "inconsistent_tree"},
        ),
        (
            "kept size 2, no consistency proof",
            _state(2),
            NOW,
            [_remove("/proof/consistency")],
            {"integrity": "missing_consistency"},
        ),
        (
            "kept size 1, a consistency proof from size 2",
            _state(1),
            NOW,
            [],
            {"integrity": "missing_consistency"},
        ),
    ]
    cases = [
        {"case": c, "edits": e, "state": None, "now": NOW, "expect": x} for c, e, x in _tampered()
    ]
    cases += [{"case": c, "edits": e, "state": s, "now": t, "expect": x} for c, s, t, e, x in kept]
    return {
        "about": "A proof bundle (schema/LOG-FORMAT.md, 'Proof bundle', 'Verifying a "
        "bundle'): the view of integration:a at revision 3 as served with ?proof=1&"
        "since_size=2, under the catalog log of catalog_log.json at size 3 (its checkpoint "
        "cosigned at the given times), and the audience map of revision 3. Each case "
        "applies RFC 6902 JSON Patch 'edits' to 'view', verifies with 'policy', the client "
        "state 'state' ({size, root base64, revision} or null) and the clock 'now' (POSIX "
        "seconds), and expects the state kept, an INTEGRITY reason, or STALE with its axis "
        "and required/served (POSIX seconds for freshness, sizes for checkpoint).",
        "policy": {
            "origin": ORIGIN,
            "log_keys": [LOG_KEY.verifier.text()],
            "witnesses": [{"key": w.verifier.text()} for w in WITNESSES],
            "threshold": THRESHOLD,
            "max_age_seconds": MAX_AGE,
        },
        "audience_map": {
            "root": audience_map.root_of(
                {audience_map.key_of(*a): d for a, d in root.digests.items()}
            ).hex(),
            "audiences": [
                {"audience": f"{k}:{i}", "digest": d.hex()} for (k, i), d in root.digests.items()
            ],
        },
        "cosigned_at": list(TIMES[SERVED]),
        "view": served(),
        "cases": cases,
    }
