"""R29: ``GET .../view?proof=1[&since_size=N]`` serves the view with its proof bundle, on
SQLite and MariaDB (the app in process; the witnesses are in-process fakes that only fill
``ledger_checkpoint`` through the collector's logic).

Each piece of a served bundle is checked here with the pure functions a client uses
(``domain.notes``, ``domain.digests.event_id``, ``domain.merkle``,
``domain.audience_map``), not with the client's verifier: the served view's digest leads
through the audience map to the revision event's ``audiences_root``; that event's id is
the last leaf of the cosigned checkpoint's tree; ``since_size`` adds a consistency proof
that verifies from the older root. The reference verifier (``tests/support``, written
from LOG-FORMAT and the C2SP specs alone) accepts the served bundles too. The cache,
``checkpoint_pending``, the bad inputs, a tampered stored checkpoint or map node
(INTEGRITY, never served) and the age gauge too.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from domain import merkle
from domain.audience_map import key_of, root_from_proof
from domain.digests import event_id
from domain.errors import Conflict
from domain.notes import Checkpoint, SignerKey
from ledger.api import Store, open_store
from ledger.http.app import create_app
from tests.support import reference_verifier as reference
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World
from tests.support.witness_fakes import Witnesses

A, B = "integration:a", "integration:b"
PATH = "/v1/audiences/integration/a/view"


def publish(world: World, version: int) -> None:
    world.service.apply(
        world.manifest(
            [world.official("sales", world.commit("sales", version))],
            push_closure(A, "sales") + push_closure(B, "sales", "erp-test"),
        )
    )


class Collector:
    def __init__(self, world: World, tmp_path: Path) -> None:
        self.world = world
        self.now = [1_700_000_000]
        self.signer = SignerKey.generate("log")
        self.key = tmp_path / "log.key"
        self.key.write_text(self.signer.text() + "\n", encoding="utf-8")
        self.witnesses = Witnesses(self.now)
        with open_store(world.url) as store:
            origin = store.checkpoint(log="catalog")["origin"]
        self.policy = self.witnesses.policy(tmp_path / "policy.json", origin, self.signer)

    def run(self) -> dict[str, Any]:
        with open_store(self.world.url) as store:
            return dict(
                store.cosign(
                    sign=self.key,
                    policy=self.policy,
                    add_checkpoint=self.witnesses.add_checkpoint,
                    clock=self.witnesses.clock,
                )
            )


@pytest.fixture
def served(world: World, tmp_path: Path) -> Iterator[tuple[World, Collector, TestClient]]:
    publish(world, 1)
    collector = Collector(world, tmp_path)
    with TestClient(create_app(Store(world.url).opener(), auth=False)) as client:
        yield world, collector, client


def b64s(values: list[str]) -> list[bytes]:
    return [base64.b64decode(v) for v in values]


def check_bundle(document: dict[str, Any], plain: dict[str, Any], signer: SignerKey) -> bytes:
    """Every piece of the bundle, as a client checks it; the checkpoint root."""
    proof = document.pop("proof")
    assert document == plain  # the same view, plus the bundle
    assert proof["format"] == 1
    checkpoint = signer.verifier.verify(proof["checkpoint"])
    revision = plain["revision"]
    assert checkpoint.size == revision
    event = proof["revision_event"]
    state = base64.b64decode(event["state_b64"])
    leaf = event_id(UUID(event["aggregate_id"]).bytes, event["version"], event["topic"].encode(),
                    state)  # fmt: skip
    data = orjson.loads(state)
    assert data["revision"] == revision and event["topic"].startswith("catalog.published@")
    merkle.verify_inclusion(
        revision - 1, checkpoint.size, merkle.leaf_hash(leaf), b64s(proof["inclusion"]),
        checkpoint.root,
    )  # fmt: skip
    kind, _, ident = plain["audience"].partition(":")
    value = bytes.fromhex(plain["audience_digest"])
    assert root_from_proof(key_of(kind, ident), value, b64s(proof["audience"])) == bytes.fromhex(
        data["audiences_root"]
    )
    # Another audience's proof does not lead there (R19: a view is tied to its audience).
    assert root_from_proof(key_of("integration", "b"), value, b64s(proof["audience"])) != (
        bytes.fromhex(data["audiences_root"])
    )
    return checkpoint.root


def test_r29_a_proven_view_carries_a_bundle_that_verifies_piece_by_piece(
    served: tuple[World, Collector, TestClient],
) -> None:
    world, collector, client = served
    pending = client.get(PATH, params={"proof": "1"})
    assert pending.status_code == 503
    assert pending.json()["details"]["reason"] == "checkpoint_pending"
    collector.run()
    plain = client.get(PATH).json()
    answer = client.get(PATH, params={"proof": "1"})
    assert answer.status_code == 200 and "etag" not in answer.headers
    policy = json.loads(collector.policy.read_text())
    kept = reference.verify_bundle(answer.json(), policy, None, collector.now[0] + 10)
    first_root = check_bundle(answer.json(), plain, collector.signer)
    # Cached per (stored note, audience): a second read builds nothing.
    proofs = client.app.state.service.proofs  # type: ignore[attr-defined]
    built = proofs.misses
    assert client.get(PATH, params={"proof": "1"}).content == answer.content
    assert (proofs.misses, proofs.hits >= 1) == (built, True)
    never_304 = client.get(PATH, params={"proof": "1"}, headers={"If-None-Match": "*"})
    assert never_304.status_code == 200
    # A new revision: pending until the collector runs again; then a consistency proof
    # from the size the client accepted.
    publish(world, 2)
    pending = client.get(PATH, params={"proof": "1", "since_size": "1"})
    assert (pending.status_code, pending.json()["details"]["reason"]) == (
        503,
        "checkpoint_pending",
    )
    collector.run()
    plain = client.get(PATH).json()
    answer = client.get(PATH, params={"proof": "1", "since_size": "1"}).json()
    assert reference.verify_bundle(answer, policy, kept, collector.now[0] + 10)["size"] == 2
    consistency = answer["proof"]["consistency"]
    root = check_bundle(answer, plain, collector.signer)
    assert consistency["from_size"] == 1
    merkle.verify_consistency(1, 2, b64s(consistency["proof"]), first_root, root)
    same = client.get(PATH, params={"proof": "1", "since_size": "2"}).json()["proof"]
    assert same["consistency"] == {"from_size": 2, "proof": []}
    # A client ahead of this server (a lagging replica): no consistency proof to give,
    # the bundle proves the smaller head, and the client answers STALE (LOG-FORMAT).
    ahead = client.get(PATH, params={"proof": "1", "since_size": "3"})
    assert ahead.status_code == 200 and "consistency" not in ahead.json()["proof"]
    assert proofs.misses == built + 1  # one bundle per (note, audience), whatever since_size
    # The age gauge: from the stored cosignatures' time.
    metrics = client.get("/metrics").text
    (line,) = [x for x in metrics.splitlines() if x.startswith("catalog_ledger_checkpoint_age")]
    assert float(line.split()[1]) > 0


BAD_PARAMETERS = [
    ({"proof": "1", "since_size": "0"}, "since_size"),
    ({"proof": "1", "since_size": "x"}, "since_size"),
    ({"since_size": "1"}, "since_size"),  # needs proof=1
    ({"proof": "yes"}, "proof"),
]


def test_r29_bad_proof_parameters_are_invalid_naming_them(
    served: tuple[World, Collector, TestClient],
) -> None:
    _, collector, client = served
    collector.run()
    for params, field in BAD_PARAMETERS:
        answer = client.get(PATH, params=params)
        assert (answer.status_code, answer.json()["error"], answer.json()["details"]["field"]) == (
            400,
            "INVALID",
            field,
        ), params


def test_r29_a_stored_checkpoint_or_map_node_that_lies_is_never_served(
    served: tuple[World, Collector, TestClient],
) -> None:
    world, collector, client = served
    collector.run()
    with world.db.write() as conn:
        conn.execute(sa.text("UPDATE ledger_checkpoint SET root = :r"), {"r": bytes(32)})
    answer = client.get(PATH, params={"proof": "1"})
    assert (answer.status_code, answer.json()["error"]) == (500, "INTEGRITY")
    assert answer.json()["details"]["table"] == "ledger_checkpoint"
    # The collector does not write over the edited row (same size, another root: the
    # compare-and-swap refuses it); the operator removes it, then a true note again.
    with pytest.raises(Conflict):
        collector.run()
    with world.db.write() as conn:
        conn.execute(sa.text("DELETE FROM ledger_checkpoint"))
    collector.run()
    with world.db.write() as conn:  # the other audience's leaf: a sibling on A's path
        conn.execute(
            sa.text("UPDATE view_audience_map SET hash = :h WHERE leaf_key = :k"),
            {"h": bytes(32), "k": key_of("integration", "b")},
        )
    answer = client.get(PATH, params={"proof": "1"})
    assert (answer.status_code, answer.json()["error"]) == (500, "INTEGRITY")
    assert answer.json()["details"]["table"] == "view_audience_map"


def test_r29_checkpoint_text_matches_the_stored_row(
    served: tuple[World, Collector, TestClient],
) -> None:
    _, collector, client = served
    stored = collector.run()
    note = client.get(PATH, params={"proof": "1"}).json()["proof"]["checkpoint"]
    assert note == stored["note"]
    assert Checkpoint.parse(note).origin.endswith("/catalog")
    assert note.count("\n\u2014 ") == 4  # the log's signature and three cosignatures


def test_r29_a_schema_v1_revision_cannot_be_proven(tmp_path: Path) -> None:
    """The 0.1 golden store's revisions are of schema v1 (no audience map): once migrated
    and cosigned, ``proof=1`` is UNAVAILABLE naming why, and the plain view is served."""
    from tests.conformance.test_r23_golden_v0 import GOLDEN

    db = tmp_path / "store.db"
    db.write_bytes((GOLDEN / "store.db").read_bytes())
    url = f"sqlite:///{db}"
    with open_store(url) as store:
        store.migrate()
    world = type("W", (), {"url": url})()
    collector = Collector(world, tmp_path)
    assert collector.run()["size"] >= 1
    with TestClient(create_app(Store(url).opener(), auth=False)) as client:
        path = "/v1/audiences/integration/billing-reader/view"
        assert client.get(path).status_code == 200
        answer = client.get(path, params={"proof": "1"})
        assert (answer.status_code, answer.json()["details"]["reason"]) == (
            503,
            "unprovable_revision",
        )
