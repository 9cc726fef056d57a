"""R29's attack matrix, end to end: what a runtime with a trust policy refuses.

One scenario per engine (the restored backup on the same engine), every party real:
three ``catalog-ledger witness serve`` processes on loopback (k = 2), the collector
(``catalog-ledger cosign``), ``catalog-ledger serve`` as a child process, the runtime
client (``CatalogClient(trust=..., state_file=...)``) and, for the hostile cases, a proxy
that rewrites bodies on the way (``TamperingProxy``) or a server whose store the attacker
controls. Each case names what refused it; after each refusal the client kept nothing
and its state file did not move.

| attack | refused by |
| --- | --- |
| a newer head without the consistency proof from the accepted one | ``missing_consistency`` |
| a newer head with another tree's consistency proof | ``inconsistent_tree`` |
| a fact edited on the way (digests left) | the fact digest (INTEGRITY ``bad_fact_digest``) |
| a fact edited and every digest recomputed | the audience map proof (``bad_audience_proof``) |
| another audience's view, as it is | the audience the body names (INTEGRITY at ``$.audience``) |
| another audience's view, relabelled and re-digested | ``bad_audience_proof`` |
| a head cosigned longer ago than the maximum age (frozen) | STALE, axis ``freshness`` |
| an older backup served after a newer head was accepted (rollback) | STALE, axis ``checkpoint`` |
| the backup publishing another revision 2 (a fork, a split view) | the witnesses (evidence |
|   kept): nothing is cosigned, the server answers ``checkpoint_pending`` | |
| the fork's head signed by the log key with the honest cosignatures copied | ``bad_cosignature`` |
| the fork's head signed by the log key alone | ``too_few_cosignatures`` |

And the log key rotates: ``audit rotate-key``, then ``cosign`` signing with both keys has
the real witnesses cosign the main log's checkpoint covering the rotation; the client
pinned to the old key learns the new one from the log and keeps it across a restart.
Last, disaster recovery: the newest backup moved to another engine keeps the origin, the
same witnesses cosign it again, and the runtime reads on from it with its kept state.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from domain.errors import IntegrityFailure, LedgerError, Stale, Unavailable
from domain.notes import Checkpoint, SignerKey
from domain.served import audience_digest, fact_bytes, fact_digest
from ledger.client import CatalogClient, load_trust
from ledger.log.db import open_database
from ledger.store.catalog_log import StoredCheckpoint, store_checkpoint
from tests.support.cli_inprocess import cli, cli_json
from tests.support.cli_support import ServedStore
from tests.support.gitrepo import push_closure
from tests.support.http_proxy import TamperingProxy
from tests.support.lifecycle_support import World
from tests.support.witness_processes import Witness

A, B = "integration:a", "integration:b"
MAX_AGE = 3600


def publish(world: World, version: int) -> None:
    world.service.apply(
        world.manifest(
            [world.official("sales", world.commit("sales", version))],
            push_closure(A, "sales") + push_closure(B, "sales", "erp-test"),
        )
    )


class Scene:
    def __init__(self, world: World, tmp: Path) -> None:
        self.world, self.tmp = world, tmp
        self.signer = SignerKey.generate("log")
        self.key = tmp / "log.key"
        self.key.write_text(self.signer.text() + "\n", encoding="utf-8")
        self.origin = self.checkpoint(world.url)["origin"]
        self.witnesses = [
            Witness(tmp, f"w{n}", self.origin, self.signer.verifier.text()) for n in range(3)
        ]
        self.policy = tmp / "policy.json"
        self.state = tmp / "state.json"
        self.servers: list[ServedStore] = []
        self.tokens = {a: str(world.service.credentials_issue(a)["token"]) for a in (A, B)}

    def checkpoint(self, url: str) -> dict[str, Any]:
        code, document = cli_json("--db", url, "audit", "checkpoint", "--log", "catalog")
        assert code == 0, document
        return dict(document)

    def start(self) -> None:
        for witness in self.witnesses:
            witness.wait_ready()
        self.policy.write_text(
            json.dumps(
                {
                    "origin": self.origin,
                    "log_keys": [self.signer.verifier.text()],
                    "witnesses": [{"key": w.key.text(), "url": w.url} for w in self.witnesses],
                    "threshold": 2,
                    "max_age_seconds": MAX_AGE,
                }
            ),
            encoding="utf-8",
        )

    def cosign(self, url: str) -> tuple[int, dict[str, Any]]:
        return cli_json(
            "--db", url, "cosign", "--sign", str(self.key), "--policy", str(self.policy)
        )

    def serve(self, url: str) -> ServedStore:
        server = ServedStore(url, auth=True)
        self.servers.append(server)
        return server

    def client(self, base: str, *, later: float = 0, audience: str = A) -> CatalogClient:
        return CatalogClient(
            base,
            token=self.tokens[audience],
            trust=load_trust(self.policy),
            state_file=self.state,
            clock=lambda: time.time() + later,
            retry_total=0,
        )

    def refused(self, base: str, kind: type[LedgerError], *, later: float = 0) -> dict[str, Any]:
        """The client's refusal of a proven read of A: nothing cached, state unmoved."""
        before = self.state.read_bytes()
        with self.client(base, later=later) as client:
            with pytest.raises(kind) as caught:
                client.view(A)
            assert client._cache == {}
        assert self.state.read_bytes() == before
        return caught.value.details

    def close(self) -> None:
        for server in self.servers:
            server.close()
        for witness in self.witnesses:
            err = witness.stop()
            assert "Traceback" not in err, err


@pytest.fixture
def scene(world: World, tmp_path: Path) -> Iterator[Scene]:
    publish(world, 1)
    made = Scene(world, tmp_path)
    try:
        made.start()
        yield made
    finally:
        made.close()


def _refacted(
    body: dict[str, Any], *, audience: str | None = None, payload: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``body`` relabelled as ``audience`` and/or with its first fact's payload replaced,
    every digest recomputed as a capable proxy would."""
    kind, ident = (audience or body["audience"]).split(":", 1)
    facts = body["facts"]
    if payload is not None:
        f = facts[0]
        f["payload"] = payload
        raw = fact_bytes(f["kind"], f["key"], payload, f["requires"], f["credential_sets"])
        f["fact_digest"] = fact_digest(f["pack"], f["install_id"], f["payload_hash"], raw).hex()
    grants = [
        [g["pack"], g["kind"], g["key"], g["credential_set"], g["install_id"]]
        for g in body["grants"]
    ]
    rows = [[f["pack"], f["install_id"], f["kind"], f["key"], f["fact_digest"]] for f in facts]
    body["audience"] = f"{kind}:{ident}"
    body["audience_digest"] = audience_digest((kind, ident), grants, rows)
    return body


def _without_consistency(body: dict[str, Any]) -> dict[str, Any]:
    assert body["proof"]["consistency"]["from_size"] == 1  # the client asked since_size=1
    del body["proof"]["consistency"]
    return body


def _bent_consistency(body: dict[str, Any]) -> dict[str, Any]:
    """The consistency proof of another tree: a forked history's, to the client."""
    proof = body["proof"]["consistency"]["proof"]
    proof[0] = base64.b64encode(bytes(32)).decode()
    return body


def _edited(body: dict[str, Any]) -> dict[str, Any]:
    body["facts"][0]["payload"] = {"endpoint": "https://attacker.example"}
    return body


def _as_b(scene: Scene, base: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A proxy's rewrite that answers A's request with B's proven view."""

    def rewrite(_: dict[str, Any]) -> dict[str, Any]:
        with scene.client(base, audience=B) as other:
            other.trust = load_trust(scene.policy)
            response = other._http.get("/v1/audiences/integration/b/view", params={"proof": 1})
        body: dict[str, Any] = orjson.loads(response.content)
        return body

    return rewrite


def test_r29_attack_matrix_every_forged_stale_rolled_back_frozen_split_or_other_audience_read_is_refused(  # noqa: E501
    scene: Scene, sibling_url: str
) -> None:
    url = scene.world.url
    assert scene.cosign(url)[0] == 0
    backup = scene.tmp / "backup.jsonl"  # an older backup: revision 1, cosigned
    assert cli("--db", url, "export", "--jsonl", "--out", str(backup)).code == 0
    honest = scene.serve(url)
    with scene.client(honest.base) as client:
        assert client.view(A).revision == 1
    publish(scene.world, 2)
    code, cosigned = scene.cosign(url)
    assert code == 0 and cosigned["size"] == 2, cosigned

    # Moving from the accepted size 1 to 2 needs the consistency proof from 1.
    with TamperingProxy(honest.base) as proxy:
        proxy.rewrite = _without_consistency
        assert scene.refused(proxy.base, IntegrityFailure)["reason"] == "missing_consistency"
        proxy.rewrite = _bent_consistency
        assert scene.refused(proxy.base, IntegrityFailure)["reason"] == "inconsistent_tree"
    with scene.client(honest.base) as client:
        assert client.view(A).revision == 2
    assert json.loads(scene.state.read_text())["size"] == 2

    # Bodies rewritten on the way.
    with TamperingProxy(honest.base) as proxy:
        proxy.rewrite = _edited
        assert scene.refused(proxy.base, IntegrityFailure)["reason"] == "bad_fact_digest"
        proxy.rewrite = lambda b: _refacted(b, payload={"endpoint": "https://attacker.example"})
        assert scene.refused(proxy.base, IntegrityFailure)["reason"] == "bad_audience_proof"
        proxy.rewrite = _as_b(scene, honest.base)
        assert scene.refused(proxy.base, IntegrityFailure)["field"] == "$.audience"
        other = _as_b(scene, honest.base)
        proxy.rewrite = lambda b: _refacted(other(b), audience=A)
        assert scene.refused(proxy.base, IntegrityFailure)["reason"] == "bad_audience_proof"

    # A frozen head: the witnesses' newest cosignatures are older than the maximum age.
    frozen = scene.refused(honest.base, Stale, later=MAX_AGE + 60)
    assert frozen["axis"] == "freshness"

    # Rollback: the older backup restored (on the same engine) and served (a lagging
    # replica looks the same).
    other_url = sibling_url
    assert cli_json("--db", other_url, "init")[0] == 0
    code, doc = cli_json("--db", other_url, "import", "--jsonl", str(backup), "--workers", "1")
    assert code == 0, doc
    restored = scene.serve(other_url)
    rollback = scene.refused(restored.base, Stale)
    assert (rollback["axis"], rollback["required"], rollback["served"]) == ("checkpoint", 2, 1)

    # A split view: the backup publishes another revision 2 and the log key signs it.
    fork = World(scene.tmp / "fork", other_url)
    try:
        fork.service.apply(
            fork.manifest(
                [fork.official("sales", fork.commit("sales", 7))], push_closure(A, "sales")
            )
        )
    finally:
        fork.close()
    code, refused = scene.cosign(other_url)  # every witness cosigned the honest size 2
    assert code != 0 and refused["error"] in {"UNAVAILABLE", "INTEGRITY"}, refused
    for witness in scene.witnesses:
        code, evidence = cli_json(
            "witness", "evidence", "--db", str(witness.folder / f"{witness.name}.db")
        )
        assert code == 0 and evidence["evidence"], evidence
    pending = scene.refused(restored.base, Unavailable)
    assert pending["reason"] == "checkpoint_pending"

    # The attacker writes the fork's head into the store itself, signed by the log key.
    body = Checkpoint(scene.origin, 2, _root(scene, other_url)).text()
    signed = scene.signer.sign(body)
    lines = cosigned["note"].split("\n\n", 1)[1].splitlines()
    copied = [x for x in lines if x.split(" ")[1] != scene.signer.name]  # the witnesses'
    _store_note(
        other_url, scene.origin, body, signed.rstrip("\n") + "\n" + "\n".join(copied) + "\n"
    )
    assert scene.refused(restored.base, IntegrityFailure)["reason"] == "bad_cosignature"
    _store_note(other_url, scene.origin, body, signed)
    assert scene.refused(restored.base, IntegrityFailure)["reason"] == "too_few_cosignatures"

    # The honest server still proves its head to the same client, which moves on.
    with scene.client(honest.base) as client:
        assert client.view(A).revision == 2

    # A key rotation, witnessed by the real witnesses (item 6): the client pinned to the
    # old key learns the new one from the log, and keeps it in its state file.
    new_key = scene.tmp / "new.key"
    assert cli_json("audit", "keygen", "log-2", "--out", str(new_key))[0] == 0
    code, rotated = cli_json(
        "--db", url, "audit", "rotate-key", "--old", str(scene.key),
        "--new", str(new_key), "--overlap", "3600",
    )  # fmt: skip
    assert code == 0, rotated
    new = SignerKey.parse(new_key.read_text()).verifier
    overlap = scene.tmp / "overlap-policy.json"  # the collector's: both keys sign
    document = json.loads(scene.policy.read_text())
    overlap.write_text(json.dumps({**document, "log_keys": [*document["log_keys"], new.text()]}))
    code, both = cli_json(
        "--db", url, "cosign", "--sign", str(scene.key), "--sign", str(new_key),
        "--policy", str(overlap),
    )  # fmt: skip
    assert code == 0 and both["size"] == 2, both
    with scene.client(honest.base) as client:
        assert new not in [k.key for k in client.log_keys]
        client.refresh_keys()
        assert new in [k.key for k in client.log_keys]
        assert client.view(A).revision == 2
    with scene.client(honest.base) as again:  # a restarted runtime remembers it
        assert new in [k.key for k in again.log_keys]

    # Disaster recovery (item 7): the newest backup, taken after the last collector run,
    # moved to another engine (SQLite) keeps the log's origin; the same witnesses cosign
    # it again, and the runtime goes on reading from it with its kept state.
    newest = scene.tmp / "newest.jsonl"
    assert cli("--db", url, "export", "--jsonl", "--out", str(newest)).code == 0
    moved_url = f"sqlite:///{scene.tmp / 'moved.db'}"
    assert cli_json("--db", moved_url, "init")[0] == 0
    code, doc = cli_json("--db", moved_url, "import", "--jsonl", str(newest), "--workers", "1")
    assert code == 0, doc
    assert scene.checkpoint(moved_url) == scene.checkpoint(url)  # same origin, size, root
    code, again_cosigned = cli_json(
        "--db", moved_url, "cosign", "--sign", str(scene.key), "--sign", str(new_key),
        "--policy", str(overlap),
    )  # fmt: skip
    assert code == 0 and again_cosigned["failed"] == {}, again_cosigned
    moved = scene.serve(moved_url)
    with scene.client(moved.base) as client:
        assert client.view(A).revision == 2


def _root(scene: Scene, url: str) -> bytes:
    return base64.b64decode(scene.checkpoint(url)["root"])


def _store_note(url: str, origin: str, body: str, note: str) -> None:
    """What an attacker with the database does: the row ``cosign`` would have written."""
    cp = Checkpoint.parse(body)
    db = open_database(url)
    try:
        store_checkpoint(db, StoredCheckpoint(origin, cp.size, cp.root, note, 0))
    finally:
        db.close()
