"""Proof bundles built from pure parts, for tests of the client's verification (R29).

A ``CatalogLog`` publishes revisions in memory exactly as the store would record them
(``catalog.published`` v2 state bytes, event ids per LOG-FORMAT "Event id", an audience
map per revision over every audience's view digest, the catalog log over the revision
event ids), signs its checkpoints with a log ``SignerKey`` and cosigns them with
witness keys (C2SP tlog-cosignature ``cosignature/v1``, ``domain.notes.WitnessSigner``).
No server, no store: what it serves is what a server's bundle would hold, so a test can
change any one part.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import orjson

from domain import audience_map, merkle
from domain.bundle import CATALOG_ID, TrustPolicy
from domain.digests import event_id
from domain.notes import Checkpoint, SignerKey, WitnessSigner
from domain.served import AudienceView, audience_digest, fact_bytes, fact_digest

STORE_ID = "0123456789abcdef0123456789abcdef"
ORIGIN = f"catalog-ledger/{STORE_ID}/catalog"
#: The POSIX time the tests call "now" (2026-12-04T21:00:00Z).
NOW = 1_796_418_000


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def make_view(audience: str, revision: int, payload: Any) -> AudienceView:
    """A view of ``audience`` at ``revision`` serving one fact with ``payload``, every
    digest right (what ``ledger.client`` would have verified)."""
    kind, _, ident = audience.partition(":")
    pack, install_id, payload_hash = "sales", "0" * 32, "v1:" + "0" * 64
    component = ("push_contract", "Order.push")
    stored = fact_bytes(*component, payload, [], [])
    digest = fact_digest(pack, install_id, payload_hash, stored).hex()
    grants = [[pack, *component, None, install_id]]
    facts = [[pack, install_id, *component, digest]]
    return AudienceView(
        audience=audience,
        revision=revision,
        content_digest="c" * 64,
        audience_digest=audience_digest((kind, ident), grants, facts),
        grants=[
            dict(zip(("pack", "kind", "key", "credential_set", "install_id"), g, strict=True))
            for g in grants
        ],
        facts=[
            {
                "pack": pack,
                "install_id": install_id,
                "kind": component[0],
                "key": component[1],
                "payload": payload,
                "requires": [],
                "credential_sets": [],
                "payload_hash": payload_hash,
                "fact_digest": digest,
            }
        ],
    )


@dataclass
class Revision:
    number: int
    event: dict[str, Any]
    event_id: bytes
    views: dict[str, AudienceView]
    nodes: dict[audience_map.Position, audience_map.Node]


@dataclass
class CatalogLog:
    """The catalog log of an in-memory store, with its keys (see the module docstring)."""

    log_key: SignerKey = field(
        default_factory=lambda: SignerKey.generate(f"catalog-ledger/{STORE_ID}")
    )
    witnesses: list[WitnessSigner] = field(
        default_factory=lambda: [WitnessSigner.generate(f"witness{n}.example") for n in range(3)]
    )
    origin: str = ORIGIN
    revisions: list[Revision] = field(default_factory=list)

    def publish(self, payloads: dict[str, Any]) -> Revision:
        """The next revision, serving each audience of ``payloads`` one fact."""
        number = len(self.revisions) + 1
        views = {a: make_view(a, number, p) for a, p in payloads.items()}
        leaves = {
            audience_map.key_of(*a.partition(":")[::2]): bytes.fromhex(v.audience_digest)
            for a, v in views.items()
        }
        nodes = audience_map.nodes_of(leaves)
        state: dict[str, Any] = {
            "activations": [],
            "audiences": [],
            "audiences_root": audience_map.root_of(leaves).hex(),
            "bindings_position": None,
            "content_digest": "c" * 64,
            "counts": {},
            "parent_digest": None,
            "released_packs": [],
            "revision": number,
            "timestamp": "2026-12-04T21:00:00+00:00",
        }
        raw = orjson.dumps(state, option=orjson.OPT_SORT_KEYS)
        topic = "catalog.published@2"
        event: dict[str, Any] = {
            "aggregate_id": str(CATALOG_ID),
            "version": number + 1,  # the catalog's version 1 is catalog.opened
            "topic": topic,
            "state_b64": b64(raw),
        }
        ident = event_id(CATALOG_ID.bytes, number + 1, topic.encode(), raw)
        revision = Revision(number, event, ident, views, nodes)
        self.revisions.append(revision)
        return revision

    def leaves(self, size: int) -> list[bytes]:
        return [merkle.leaf_hash(r.event_id) for r in self.revisions[:size]]

    def checkpoint(self, size: int | None = None) -> Checkpoint:
        size = len(self.revisions) if size is None else size
        return Checkpoint(self.origin, size, merkle.root(self.leaves(size)))

    def note(
        self,
        size: int | None = None,
        *,
        times: list[int | None] | None = None,
        body: str | None = None,
    ) -> str:
        """The signed checkpoint of ``size`` cosigned by witness n at ``times[n]`` (None:
        not by that one); by default every witness at ``NOW``."""
        text = body if body is not None else self.checkpoint(size).text()
        times = [NOW] * len(self.witnesses) if times is None else times
        note = self.log_key.sign(text)
        for witness, at in zip(self.witnesses, times, strict=False):
            if at is not None:
                note += witness.cosign(text, at) + "\n"
        return note

    def policy(self, *, threshold: int = 2, max_age: int = 3600) -> TrustPolicy:
        return TrustPolicy.parse(self.policy_json(threshold=threshold, max_age=max_age))

    def policy_json(self, *, threshold: int = 2, max_age: int = 3600) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "log_keys": [self.log_key.verifier.text()],
            "witnesses": [
                {"key": w.verifier.text(), "url": f"http://127.0.0.1:{9000 + n}"}
                for n, w in enumerate(self.witnesses)
            ],
            "threshold": threshold,
            "max_age_seconds": max_age,
        }

    def bundle(
        self,
        audience: str,
        *,
        revision: int | None = None,
        size: int | None = None,
        since_size: int | None = None,
        note: str | None = None,
    ) -> dict[str, Any]:
        """The ``proof`` member a server would send for ``audience`` at ``revision``
        under the checkpoint of ``size`` (both default to the latest)."""
        size = len(self.revisions) if size is None else size
        number = size if revision is None else revision
        rev = self.revisions[number - 1]
        key = audience_map.key_of(*audience.partition(":")[::2])
        siblings, _ = audience_map.inclusion_proof(audience_map.memory_fetch(rev.nodes), key)
        out: dict[str, Any] = {
            "format": 1,
            "checkpoint": self.note(size) if note is None else note,
            "revision_event": dict(rev.event),
            "inclusion": [
                b64(h) for h in merkle.inclusion_proof(self.leaves(size), number - 1, size)
            ],
            "audience": [b64(h) for h in siblings],
        }
        if since_size is not None and 0 < since_size <= size:
            proof = merkle.consistency_proof(self.leaves(size), since_size, size)
            out["consistency"] = {"from_size": since_size, "proof": [b64(h) for h in proof]}
        return out
