"""A tiny proof-bundle builder, written from schema/LOG-FORMAT.md and the C2SP specs alone.

Like ``reference_verifier`` it imports nothing of this project: a catalog log of a few
revisions of a few audiences, their views, the audience map, the catalog log's
checkpoint signed by a fixed-seed Ed25519 log key and cosigned by fixed-seed witnesses,
and the bundle a server would attach to a view (LOG-FORMAT "Proof bundle"). The
conformance test tampers with what it builds, one field at a time.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from blake3 import blake3
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.support import reference_audience_map as amap

STORE_ID = "5eed0000000000000000000000000001"
MAIN_ORIGIN = f"catalog-ledger/{STORE_ID}"
ORIGIN = f"{MAIN_ORIGIN}/catalog"
NOW = 1_800_000_000
MAX_AGE = 3600
AUDIENCES = (("app", "CRM"), ("integration", "erp-sync"), ("app", "café"))


def _lp(*parts: bytes) -> bytes:
    return b"".join(struct.pack(">Q", len(p)) + p for p in parts)


def _derive(context: str, data: bytes) -> bytes:
    return blake3(data, derive_key_context=context).digest()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


CATALOG_ID = uuid.UUID(
    bytes=_derive("catalog-ledger 2026-11 aggregate id v1", _lp(b"catalog", b"catalog"))[:16]
)


# -- RFC 9162 2.1 ------------------------------------------------------------------------------


def _leaf(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def mth(leaves: Sequence[bytes]) -> bytes:
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = _split(len(leaves))
    return _node(mth(leaves[:k]), mth(leaves[k:]))


def inclusion_path(m: int, leaves: Sequence[bytes]) -> list[bytes]:
    """RFC 9162 2.1.3.1 PATH(m, D[n])."""
    if len(leaves) <= 1:
        return []
    k = _split(len(leaves))
    if m < k:
        return [*inclusion_path(m, leaves[:k]), mth(leaves[k:])]
    return [*inclusion_path(m - k, leaves[k:]), mth(leaves[:k])]


def consistency_path(m: int, leaves: Sequence[bytes], complete: bool = True) -> list[bytes]:
    """RFC 9162 2.1.4.1 SUBPROOF(m, D[n], b); PROOF(m, D[n]) is ``complete=True``."""
    n = len(leaves)
    if m == n:
        return [] if complete else [mth(leaves)]
    k = _split(n)
    if m <= k:
        return [*consistency_path(m, leaves[:k], complete), mth(leaves[k:])]
    return [*consistency_path(m - k, leaves[k:], False), mth(leaves[:k])]


def audience_path(leaves: dict[bytes, bytes], key: bytes, depth: int = 0) -> list[bytes]:
    """LOG-FORMAT "Audience map": the sibling hashes from the root down to ``key``'s leaf."""
    if len(leaves) == 1:
        return []
    bit = (key[depth // 8] >> (7 - depth % 8)) & 1
    side = {k: v for k, v in leaves.items() if (k[depth // 8] >> (7 - depth % 8)) & 1 == bit}
    other = {k: v for k, v in leaves.items() if k not in side}
    return [amap.root(other, depth + 1), *audience_path(side, key, depth + 1)]


# -- keys and notes (C2SP signed-note, tlog-checkpoint, tlog-cosignature) ------------------------


@dataclass(frozen=True)
class Signer:
    name: str
    key: Ed25519PrivateKey
    type: int  # 0x01 a log key (signed-note Ed25519), 0x04 a witness (cosignature/v1)

    @classmethod
    def of(cls, name: str, seed: int, key_type: int) -> Signer:
        return cls(name, Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32), key_type)

    @property
    def public(self) -> bytes:
        return self.key.public_key().public_bytes_raw()

    @property
    def id(self) -> bytes:
        return hashlib.sha256(
            f"{self.name}\n".encode() + bytes([self.type]) + self.public
        ).digest()[:4]

    def vkey(self) -> str:
        return f"{self.name}+{self.id.hex()}+{b64(bytes([self.type]) + self.public)}"

    def line(self, body: str, stamp: int | None = None) -> str:
        """A signature line over ``body``: a log signature, or a cosignature at ``stamp``."""
        if self.type == 0x01:
            signature = self.key.sign(body.encode())
        else:
            assert stamp is not None
            message = f"cosignature/v1\ntime {stamp}\n{body}".encode()
            signature = stamp.to_bytes(8, "big") + self.key.sign(message)
        return f"\u2014 {self.name} {b64(self.id + signature)}\n"


LOG = Signer.of(MAIN_ORIGIN, 1, 0x01)  # named after the main log's origin (LOG-FORMAT)
WITNESSES = tuple(Signer.of(f"witness.example/w{n}", 10 + n, 0x04) for n in (1, 2, 3))


def policy(threshold: int = 2) -> dict[str, Any]:
    return {
        "origin": ORIGIN,
        "log_keys": [LOG.vkey()],
        "witnesses": [{"key": w.vkey()} for w in WITNESSES],
        "threshold": threshold,
        "max_age_seconds": MAX_AGE,
    }


def note(
    size: int,
    root: bytes,
    *,
    origin: str = ORIGIN,
    signers: Sequence[Signer] = (LOG,),
    cosigners: Sequence[tuple[Signer, int]] | None = None,
) -> str:
    body = f"{origin}\n{size}\n{b64(root)}\n"
    if cosigners is None:
        cosigners = [(w, NOW - 60 * (n + 1)) for n, w in enumerate(WITNESSES)]
    lines = [s.line(body) for s in signers] + [w.line(body, t) for w, t in cosigners]
    return body + "\n" + "".join(lines)


# -- a store's catalog: revisions, views, the audience map, the catalog log --------------------


def view(revision: int, kind: str, ident: str, *, fork: bool = False) -> dict[str, Any]:
    """The audience's view at ``revision`` (no proof): one grant and fact per pack it uses."""
    packs = ["sales", "support"] if kind == "app" else ["sales"]
    edition = revision + (100 if fork and revision >= 3 else 0)
    grants, facts = [], []
    for pack in packs:
        install_id = hashlib.sha256(f"{pack} {min(edition, 2)}".encode()).hexdigest()[:32]
        payload_hash = "v1:" + hashlib.sha256(pack.encode()).hexdigest()
        fact = {
            "kind": "connector",
            "key": f"{pack}-api",
            "payload": {"edition": edition, "url": f"https://{pack}.example/é"},
            "requires": [],
            "credential_sets": None if kind == "app" else ["default"],
        }
        data = _lp(pack.encode(), install_id.encode(), payload_hash.encode(), _canonical(fact))
        digest = _derive("catalog-ledger 2026-11 catalog fact v1", data).hex()
        facts.append({"pack": pack, "install_id": install_id, **fact})
        facts[-1].update(payload_hash=payload_hash, fact_digest=digest)
        credential_set = None if kind == "app" else "default"
        grants.append(
            {
                "pack": pack,
                "kind": "connector",
                "key": f"{pack}-api",
                "credential_set": credential_set,
                "install_id": install_id,
            }
        )
    body = {
        "audience": f"{kind}:{ident}",
        "revision": revision,
        "content_digest": hashlib.sha256(f"content {edition}".encode()).hexdigest(),
        "grants": grants,
        "facts": facts,
    }
    return redigest(body)


def redigest(body: dict[str, Any]) -> dict[str, Any]:
    """Recompute every fact digest and the audience digest (what a forger re-digests)."""
    kind, _, ident = body["audience"].partition(":")
    facts = []
    for f in body["facts"]:
        fact = {p: f[p] for p in ("kind", "key", "payload", "requires", "credential_sets")}
        data = _lp(
            *(f[p].encode() for p in ("pack", "install_id", "payload_hash")), _canonical(fact)
        )
        f["fact_digest"] = _derive("catalog-ledger 2026-11 catalog fact v1", data).hex()
        facts.append([f["pack"], f["install_id"], f["kind"], f["key"], f["fact_digest"]])
    grants = [
        [g[p] for p in ("pack", "kind", "key", "credential_set", "install_id")]
        for g in body["grants"]
    ]
    digest = _canonical({"audience": [kind, ident], "grants": grants, "facts": facts})
    body["audience_digest"] = _derive("catalog-ledger 2026-11 audience view v1", digest).hex()
    return body


def audiences_at(revision: int) -> tuple[tuple[str, str], ...]:
    return AUDIENCES if revision >= 2 else AUDIENCES[:2]


def map_leaves(views: dict[tuple[str, str], dict[str, Any]]) -> dict[bytes, bytes]:
    return {amap.key(k, i): bytes.fromhex(v["audience_digest"]) for (k, i), v in views.items()}


def revision_event(revision: int, audiences_root: bytes, **state: Any) -> dict[str, Any]:
    """The stored ``catalog.published@2`` of ``revision`` (catalog.opened is version 1)."""
    fields = {
        "activations": [],
        "audiences": [],
        "audiences_root": audiences_root.hex(),
        "revision": revision,
        "timestamp": f"2026-12-0{revision}T00:00:00+00:00",
        **state,
    }
    return {
        "aggregate_id": str(CATALOG_ID),
        "version": revision + 1,
        "topic": "catalog.published@2",
        "state_b64": b64(_canonical(fields)),
    }


def event_id(event: dict[str, Any]) -> bytes:
    data = _lp(
        uuid.UUID(event["aggregate_id"]).bytes,
        struct.pack(">Q", event["version"]),
        event["topic"].encode(),
        base64.b64decode(event["state_b64"]),
    )
    return _derive("catalog-ledger 2026-11 event v1", data)


class Catalog:
    """``revisions`` publications; ``fork`` rewrites revision 3 on (a split view)."""

    def __init__(self, revisions: int, *, fork: bool = False) -> None:
        self.views: list[dict[tuple[str, str], dict[str, Any]]] = []
        self.events: list[dict[str, Any]] = []
        for r in range(1, revisions + 1):
            views = {a: view(r, *a, fork=fork) for a in audiences_at(r)}
            self.views.append(views)
            self.events.append(revision_event(r, amap.root(map_leaves(views))))
        self.leaves = [_leaf(event_id(e)) for e in self.events]

    def root(self, size: int) -> bytes:
        return mth(self.leaves[:size])

    def bundle(
        self,
        audience: tuple[str, str] = AUDIENCES[0],
        *,
        revision: int | None = None,
        size: int | None = None,
        since: int | None = None,
        checkpoint: str | None = None,
    ) -> dict[str, Any]:
        """The view of ``audience`` at ``revision`` (default: the last) with its proof under
        the checkpoint of ``size`` (default: the revision), as a server would serve it."""
        revision = revision or len(self.events)
        size = size or revision
        in_force = {
            a: bytes.fromhex(v["audience_digest"]) for a, v in self.views[revision - 1].items()
        }
        return prove(
            self.views[revision - 1][audience],
            checkpoint=checkpoint or note(size, self.root(size)),
            event=self.events[revision - 1],
            leaves=self.leaves[:size],
            in_force=in_force,
            since=since,
        )


def prove(
    view: dict[str, Any],
    *,
    checkpoint: str,
    event: dict[str, Any],
    leaves: Sequence[bytes],
    in_force: dict[tuple[str, str], bytes],
    since: int | None = None,
) -> dict[str, Any]:
    """``view`` with the proof member a server attaches (LOG-FORMAT "Proof bundle"):
    ``event`` is its revision's stored ``catalog.published``, ``leaves`` the catalog log
    of the checkpoint's size, ``in_force`` every audience's digest at the revision."""
    kind, _, ident = view["audience"].partition(":")
    body: dict[str, Any] = json.loads(json.dumps(view))
    mapped = {amap.key(*a): d for a, d in in_force.items()}
    body["proof"] = {
        "format": 1,
        "checkpoint": checkpoint,
        "revision_event": {k: event[k] for k in ("aggregate_id", "version", "topic", "state_b64")},
        "inclusion": [b64(h) for h in inclusion_path(view["revision"] - 1, leaves)],
        "audience": [b64(h) for h in audience_path(mapped, amap.key(kind, ident))],
    }
    if since is not None:
        proof = consistency_path(since, leaves)
        body["proof"]["consistency"] = {"from_size": since, "proof": [b64(h) for h in proof]}
    return body
