"""R29 end to end: ``catalog-ledger cosign`` against three real ``catalog-ledger witness
serve`` processes on loopback (k = 2), then ``serve``'s proof bundle carries what they
cosigned, on SQLite and MariaDB.

One test per engine (the witnesses are configured with the store's own catalog origin,
so they start for the store): the collector stores the note with the log's signature
and three cosignatures that verify under the witnesses' keys; a proven read serves that
note, its revision event the last leaf of the cosigned tree; after a publication the
witnesses are asked from the size they cosigned (a consistency proof) and the client's
``since_size`` proof verifies; with one witness down the threshold still holds (the
failed one is named); with two down nothing is stored and the command exits UNAVAILABLE
naming both.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import orjson
import pytest
from fastapi.testclient import TestClient

from domain import merkle
from domain.digests import event_id
from domain.notes import SignerKey, verify_cosignatures
from ledger.api import Store
from ledger.http.app import create_app
from tests.support.cli_inprocess import cli, cli_json
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World
from tests.support.witness_processes import Witness

PATH = "/v1/audiences/integration/a/view"
W0, W1, W2 = (f"witness.example/w{n}" for n in range(3))


def publish(world: World, version: int) -> None:
    world.service.apply(
        world.manifest(
            [world.official("sales", world.commit("sales", version))],
            push_closure("integration:a", "sales"),
        )
    )


@pytest.fixture
def witnessed(world: World, tmp_path: Path) -> Iterator[tuple[World, list[Witness], Path, Path]]:
    publish(world, 1)
    signer = SignerKey.generate("log")
    key = tmp_path / "log.key"
    key.write_text(signer.text() + "\n", encoding="utf-8")
    origin = cli_json("--db", world.url, "audit", "checkpoint", "--log", "catalog")[1]["origin"]
    group = [Witness(tmp_path, f"w{n}", origin, signer.verifier.text()) for n in range(3)]
    try:
        for witness in group:
            witness.wait_ready()
        policy = tmp_path / "policy.json"
        policy.write_text(
            json.dumps(
                {
                    "origin": origin,
                    "log_keys": [signer.verifier.text()],
                    "witnesses": [{"key": w.key.text(), "url": w.url} for w in group],
                    "threshold": 2,
                    "max_age_seconds": 3600,
                }
            ),
            encoding="utf-8",
        )
        yield world, group, key, policy
    finally:
        for witness in group:
            err = witness.stop()
            assert "Traceback" not in err, err


def _stored(world: World) -> list[dict[str, str]]:
    with world.db.read() as conn:
        rows = conn.exec_driver_sql("SELECT origin, note FROM ledger_checkpoint").all()
    return [{"origin": bytes(o).decode(), "note": bytes(n).decode()} for o, n in rows]


def stored_note(world: World) -> str | None:
    with world.db.read() as conn:
        rows = conn.exec_driver_sql("SELECT origin, note FROM ledger_checkpoint").all()
    notes = [bytes(n).decode() for o, n in rows if bytes(o).endswith(b"/catalog")]
    return notes[0] if notes else None


def test_r29_cosign_with_real_witnesses_feeds_the_proof_bundle(
    witnessed: tuple[World, list[Witness], Path, Path],
) -> None:
    world, group, key, policy = witnessed
    cosign = ("--db", world.url, "cosign", "--sign", str(key), "--policy", str(policy))
    code, first = cli_json(*cosign)
    assert code == 0, first
    assert (first["size"], first["cosigned"], first["failed"]) == (1, [W0, W1, W2], {})
    keys = [w.key for w in group]
    assert len(verify_cosignatures(first["note"], keys)) == 3
    assert SignerKey.parse(key.read_text()).verifier.verify(first["note"]).size == 1
    with TestClient(create_app(Store(world.url).opener(), auth=False)) as client:
        proof = client.get(PATH, params={"proof": "1"}).json()["proof"]
        assert proof["checkpoint"] == first["note"] == stored_note(world)
        event = proof["revision_event"]
        leaf = event_id(UUID(event["aggregate_id"]).bytes, event["version"],
                        event["topic"].encode(), base64.b64decode(event["state_b64"]))  # fmt: skip
        root1 = base64.b64decode(first["root"])
        merkle.verify_inclusion(0, 1, merkle.leaf_hash(leaf), [], root1)
        # A publication: each witness is asked from size 1 with a consistency proof.
        publish(world, 2)
        code, second = cli_json(*cosign)
        assert (code, second["size"], second["cosigned"]) == (0, 2, [W0, W1, W2])
        answer = client.get(PATH, params={"proof": "1", "since_size": "1"}).json()
        state = orjson.loads(base64.b64decode(answer["proof"]["revision_event"]["state_b64"]))
        assert state["revision"] == answer["revision"] == 2
        merkle.verify_consistency(
            1, 2, [base64.b64decode(h) for h in answer["proof"]["consistency"]["proof"]],
            root1, base64.b64decode(second["root"]),
        )  # fmt: skip
    # An auditor holds a proof to the runtime's policy (audit verify-proof --policy): the
    # stored note passes; the same note without its cosignatures does not.
    proof_file, note_file = world.tmp / "proof.json", world.tmp / "note"
    code, document = cli_json("--db", world.url, "audit", "prove", "--from-size", "1")
    assert code == 0, document
    proof_file.write_text(json.dumps(document), encoding="utf-8")
    (main_note,) = [x["note"] for x in _stored(world) if not x["origin"].endswith("/catalog")]
    note_file.write_text(main_note, encoding="utf-8")
    check = ("audit", "verify-proof", str(proof_file), "--checkpoint", str(note_file))
    code, ok = cli_json(*check, "--policy", str(policy))
    assert (code, ok["type"]) == (0, "consistency"), ok
    body, lines = main_note.split("\n\n")
    (signature,) = [x for x in lines.splitlines() if x.split(" ")[1] == "log"]
    bare = f"{body}\n\n{signature}\n"  # the log's signature, no cosignature
    note_file.write_text(bare, encoding="utf-8")
    code, refused = cli_json(*check, "--policy", str(policy))
    assert (code, refused["details"]["reason"]) == (6, "too_few_cosignatures"), refused
    # One witness down: two still cosign (k = 2), the failed one is named.
    group[0].stop()
    code, third = cli_json(*cosign)
    assert (code, third["cosigned"], list(third["failed"])) == (0, [W1, W2], [W0])
    assert len(verify_cosignatures(third["note"], keys)) == 2
    # Two down: nothing stored, UNAVAILABLE naming both.
    group[1].stop()
    kept = stored_note(world)
    failed = cli("--log-format", "json", *cosign, "--json")
    code, error = failed.code, json.loads(failed.stdout)
    assert (code, error["error"]) == (1, "UNAVAILABLE")
    assert sorted(error["details"]["failed"]) == [W0, W1]
    (line,) = [json.loads(x) for x in failed.stderr.splitlines() if "not cosigned" in x]
    assert (line["level"], line["cosigned"], line["threshold"]) == ("error", 1, 2)
    assert stored_note(world) == kept == third["note"]
