"""R29: the catalog log, the stored cosigned checkpoints, the collector's logic and the
audit's tie from them to the main log, on SQLite and MariaDB.

The catalog log is checked against a reference recomputed here from the stored rows
(LOG-FORMAT "Catalog log": leaf i is revision i+1's ``catalog.published`` event id)
after publications, an ``apply --no-publish`` and a rollback. The collector runs against
in-process fake witnesses (``tests.support.witness_fakes``: its unit logic only; the
real witnesses are processes, tested end to end with them).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from domain import merkle
from domain.catalog import catalog_id
from domain.digests import event_id
from domain.errors import Conflict, IntegrityFailure, Unavailable
from domain.notes import Checkpoint, SignerKey
from ledger.api import open_store
from ledger.store.catalog_log import (
    CatalogLog,
    StoredCheckpoint,
    cosignature_times,
    store_checkpoint,
)
from tests.support import reference_catalog_log as ref_log
from tests.support import reference_verifier as ref_verifier
from tests.support.cli_inprocess import cli_json
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World
from tests.support.witness_fakes import Witnesses


def publish(world: World, version: int, *, publish: bool = True) -> None:
    world.service.apply(
        world.manifest(
            [world.official("sales", world.commit("sales", version))],
            push_closure("integration:a", "sales"),
        ),
        publish=publish,
    )


def reference(world: World) -> tuple[int, bytes, list[bytes]]:
    """(size, root, event ids) of the catalog log, recomputed from every stored row."""
    ids = []
    with world.db.read() as conn:
        rows = conn.exec_driver_sql(
            "SELECT aggregate_id, version, topic, state FROM ledger_events ORDER BY position"
        ).all()
    for aggregate, version, topic, state in rows:
        if bytes(aggregate) == catalog_id().bytes and bytes(topic).startswith(b"catalog.published"):
            ids.append(event_id(bytes(aggregate), int(version), bytes(topic), bytes(state)))
    return len(ids), merkle.root([merkle.leaf_hash(i) for i in ids]), ids


def catalog_checkpoint(world: World) -> dict[str, Any]:
    code, document = cli_json("--db", world.url, "audit", "checkpoint", "--log", "catalog")
    assert code == 0, document
    return dict(document)


def test_r29_catalog_log_is_every_revision_event_in_order(world: World, tmp_path: Path) -> None:
    publish(world, 1)
    publish(world, 2, publish=False)  # applied, not published: no revision
    first = catalog_checkpoint(world)
    assert (first["size"], first["root"]) == (1, base64.b64encode(reference(world)[1]).decode())
    publish(world, 3)
    assert cli_json("--db", world.url, "rollback", "--to-revision", "1")[0] == 0
    size, root, ids = reference(world)
    assert size == 3
    document = catalog_checkpoint(world)
    main = cli_json("--db", world.url, "audit", "checkpoint")[1]
    assert document["origin"] == main["origin"] + "/catalog"
    assert (document["size"], document["root"]) == (3, base64.b64encode(root).decode())
    assert Checkpoint.parse(document["note"]) == Checkpoint(document["origin"], 3, root)
    assert main["size"] > 3  # the main log holds every event, not only revisions
    # And the reference, written from LOG-FORMAT alone, recomputes it from an export.
    exported = tmp_path / "export.jsonl"
    assert cli_json("--db", world.url, "export", "--jsonl", "--out", str(exported))[0] == 0
    lines = exported.read_text(encoding="utf-8").splitlines()
    assert ref_verifier.mth(ref_log.leaves(ref_log.records(lines))) == root
    # The store's log: same leaves, proofs that verify, a refresh that reads nothing new.
    log = CatalogLog(world.db)
    assert log.refresh() == 3 and log.refresh() == 3
    assert [log.event_id(r) for r in (1, 2, 3)] == ids
    for revision in (1, 2, 3):
        merkle.verify_inclusion(
            revision - 1, 3, merkle.leaf_hash(ids[revision - 1]), log.inclusion(revision, 3), root
        )
    merkle.verify_consistency(1, 3, log.consistency(1, 3), log.root(1), root)
    assert log.revision_event(3).data()["revision"] == 3


def test_r29_checkpoint_of_the_catalog_log_signs_with_the_log_key(
    world: World, tmp_path: Path
) -> None:
    publish(world, 1)
    key = tmp_path / "log.key"
    assert cli_json("audit", "keygen", "log", "--out", str(key))[0] == 0
    code, document = cli_json(
        "--db", world.url, "audit", "checkpoint", "--log", "catalog", "--sign", str(key)
    )
    assert code == 0
    signer = SignerKey.parse(key.read_text())
    assert signer.verifier.verify(document["note"]).size == 1


# -- the collector (unit logic, fake witnesses) ----------------------------------------------


def collector(world: World, tmp_path: Path, now: list[int]) -> tuple[Witnesses, Path, Path]:
    signer = SignerKey.generate("log")
    key = tmp_path / "log.key"
    key.write_text(signer.text() + "\n", encoding="utf-8")
    witnesses = Witnesses(now)
    origin = catalog_checkpoint(world)["origin"]
    return witnesses, key, witnesses.policy(tmp_path / "policy.json", origin, signer)


def stored_rows(world: World) -> list[tuple[Any, ...]]:
    with world.db.read() as conn:
        return [
            tuple(r)
            for r in conn.exec_driver_sql("SELECT origin, size, root, note FROM ledger_checkpoint")
        ]


def catalog_row(world: World) -> tuple[Any, ...]:
    """The stored row of the catalog log (the collector stores the main log's too)."""
    (row,) = [r for r in stored_rows(world) if bytes(r[0]).endswith(b"/catalog")]
    return row


def test_r29_cosign_stores_the_signed_note_with_every_cosignature(
    world: World, tmp_path: Path
) -> None:
    publish(world, 1)
    now = [1_700_000_000]
    witnesses, key, policy = collector(world, tmp_path, now)
    with open_store(world.url) as store:
        first = store.cosign(
            sign=key, policy=policy, add_checkpoint=witnesses.add_checkpoint, clock=witnesses.clock
        )
        assert (first["size"], first["cosigned"], first["failed"]) == (1, ["w0", "w1", "w2"], {})
        origin, size, root, note = catalog_row(world)
        # The main log's checkpoint too (it covers the key rotations), by the same key.
        main = first["main"]
        assert sorted(bytes(r[0]).decode() for r in stored_rows(world)) == sorted(
            [first["origin"], main["origin"]]
        )
        assert main["origin"] + "/catalog" == first["origin"]
        assert main["cosigned"] == ["w0", "w1", "w2"] and main["size"] > 1
        assert SignerKey.parse(key.read_text()).verifier.verify(main["note"]).size == main["size"]
        assert (bytes(origin).decode(), size, bytes(note).decode()) == (
            first["origin"],
            1,
            first["note"],
        )
        signer = SignerKey.parse(key.read_text())
        assert signer.verifier.verify(first["note"]) == Checkpoint(first["origin"], 1, bytes(root))
        assert cosignature_times(first["note"]) == [now[0]] * 3
        # Unchanged catalog: the same size is re-cosigned, with fresh timestamps.
        now[0] += 600
        again = store.cosign(
            sign=key, policy=policy, add_checkpoint=witnesses.add_checkpoint, clock=witnesses.clock
        )
        assert (again["size"], again["root"]) == (1, first["root"])
        assert cosignature_times(bytes(catalog_row(world)[3]).decode()) == [now[0]] * 3
        # A new revision: each witness is told the size it cosigned, with a consistency
        # proof from it (the fake checks it); one that lost its memory answers 409 and is
        # asked again from the size it knows.
        publish(world, 2)
        witnesses.all[2].size, witnesses.all[2].root = 0, merkle.EMPTY_ROOT
        grown = store.cosign(
            sign=key, policy=policy, add_checkpoint=witnesses.add_checkpoint, clock=witnesses.clock
        )
        assert grown["size"] == 2 and grown["cosigned"] == ["w0", "w1", "w2"]
        assert [w.calls[-1] for w in witnesses.all] == [1, 1, 0]
        assert witnesses.all[2].calls[-2:] == [1, 0]


def test_r29_cosign_below_the_threshold_stores_nothing_and_names_the_failed(
    world: World, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    publish(world, 1)
    witnesses, key, policy = collector(world, tmp_path, [1_700_000_000])
    witnesses.all[0].down = witnesses.all[2].down = True
    with open_store(world.url) as store, pytest.raises(Unavailable) as raised:
        store.cosign(
            sign=key, policy=policy, add_checkpoint=witnesses.add_checkpoint, clock=witnesses.clock
        )
    assert sorted(raised.value.details["failed"]) == ["w0", "w2"]
    assert raised.value.details["cosigned"] == ["w1"]
    assert "w0" in raised.value.message and "w2" in raised.value.message
    assert stored_rows(world) == []
    assert any("not cosigned" in r.getMessage() for r in caplog.records)


def test_r29_cosign_refuses_a_policy_of_another_log_or_key(world: World, tmp_path: Path) -> None:
    publish(world, 1)
    _witnesses, key, policy = collector(world, tmp_path, [1_700_000_000])
    document = json.loads(policy.read_text())
    for field, value in (("origin", "another/catalog"), ("log_keys", [_other_key()])):
        policy.write_text(json.dumps({**document, field: value}), encoding="utf-8")
        code, error = cli_json(
            "--db", world.url, "cosign", "--sign", str(key), "--policy", str(policy)
        )
        assert (code, error["error"], error["details"].get("field")) == (3, "INVALID", field), error
    policy.write_text(json.dumps({**document, "threshold": 4}), encoding="utf-8")
    code, error = cli_json("--db", world.url, "cosign", "--sign", str(key), "--policy", str(policy))
    assert (code, error["details"]["field"]) == (3, "threshold")
    assert stored_rows(world) == []


def test_r29_a_refused_cosign_appends_nothing(world: World, tmp_path: Path) -> None:
    """``cosign`` named the log (``log.named``) before checking the policy: a refused run
    still appended an event. The policy (and the key) are checked first now."""
    publish(world, 1)
    _witnesses, key, policy = collector(world, tmp_path, [1_700_000_000])
    size = cli_json("--db", world.url, "audit", "checkpoint")[1]["size"]
    document = json.loads(policy.read_text())
    policy.write_text(json.dumps({**document, "log_keys": [_other_key()]}), encoding="utf-8")
    code, error = cli_json("--db", world.url, "cosign", "--sign", str(key), "--policy", str(policy))
    assert (code, error["details"].get("field")) == (3, "log_keys"), error
    assert cli_json("--db", world.url, "audit", "checkpoint")[1]["size"] == size


def test_r29_overlapping_cosign_runs_never_store_a_smaller_tree(
    world: World, tmp_path: Path
) -> None:
    """``store_checkpoint`` was an unconditional UPDATE: a run that read size 1, slower
    than one that stored size 2, replaced 2 with 1. Now a compare-and-swap: the slower
    run is CONFLICT naming the origin, and the stored row stays."""
    publish(world, 1)
    witnesses, key, policy = collector(world, tmp_path, [1_700_000_000])
    origin = catalog_checkpoint(world)["origin"]
    larger = StoredCheckpoint(origin, 2, bytes(32), "another run's note\n", 1)
    calls: list[str] = []

    def add_checkpoint(url: str, note: str, old: int, proof: Sequence[bytes]) -> list[str]:
        calls.append(url)
        if len(calls) == 3:  # the last witness answered: meanwhile another run stored 2
            store_checkpoint(world.db, larger)
        return witnesses.add_checkpoint(url, note, old, proof)

    with open_store(world.url) as store, pytest.raises(Conflict) as lost:
        store.cosign(sign=key, policy=policy, add_checkpoint=add_checkpoint, clock=witnesses.clock)
    assert (lost.value.details["origin"], lost.value.details["stored_size"]) == (origin, 2)
    assert lost.value.exit_code == 4
    assert catalog_row(world)[1:3] == (2, bytes(32))
    # The same size with the same root replaces the note (fresh cosignatures); with
    # another root, or a smaller size, nothing is replaced.
    store_checkpoint(world.db, StoredCheckpoint(origin, 2, bytes(32), "newer note\n", 2))
    for size, root in ((2, b"\x01" * 32), (1, bytes(32))):
        with pytest.raises(Conflict):
            store_checkpoint(world.db, StoredCheckpoint(origin, size, root, "x\n", 3))
    assert bytes(catalog_row(world)[3]) == b"newer note\n"
    store_checkpoint(world.db, StoredCheckpoint(origin, 3, b"\x02" * 32, "grown\n", 4))
    assert catalog_row(world)[1] == 3


def test_r29_a_revision_row_gone_is_integrity_naming_it(world: World) -> None:
    """A deleted revision row made ``.one()`` raise NoResultFound (a traceback, a 500):
    now INTEGRITY naming ``ledger_events``, the position and the version."""
    publish(world, 1)
    log = CatalogLog(world.db)
    log.refresh()
    event = log.revision_event(1)
    with world.db.write() as conn:
        conn.execute(
            sa.text("DELETE FROM ledger_events WHERE position = :p"), {"p": event.position}
        )
    with pytest.raises(IntegrityFailure) as gone:
        log.revision_event(1)
    assert gone.value.details == {
        "table": "ledger_events",
        "position": event.position,
        "version": event.version,
    }


def test_r29_a_bundle_the_log_no_longer_reaches_is_checkpoint_pending(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ProofService.body`` asserted that the log reached the checkpoint's size after
    its build (``python -O`` strips that; a concurrent refresh that starts the log again
    breaks it): an AssertionError, a 500. Now UNAVAILABLE ``checkpoint_pending``."""
    from domain.served import AudienceView
    from ledger.http.proofs import ProofService

    publish(world, 1)
    witnesses, key, policy = collector(world, tmp_path, [1_700_000_000])
    with open_store(world.url) as store:
        store.cosign(
            sign=key, policy=policy, add_checkpoint=witnesses.add_checkpoint, clock=witnesses.clock
        )
        found = store.view("integration:a")
        assert isinstance(found, AudienceView)
        proofs = ProofService(store.ledger, lambda: catalog_checkpoint(world)["origin"])
        stored = proofs.stored()
        assert b'"consistency"' in proofs.body(found, stored, 1)
        monkeypatch.setattr(proofs, "_consistency_member", lambda stored, since: None)
        with pytest.raises(Unavailable) as pending:
            proofs.body(found, stored, 1)
    assert pending.value.details["reason"] == "checkpoint_pending"


def _other_key() -> str:
    return SignerKey.generate("other").verifier.text()


# -- the audit's tie -----------------------------------------------------------------------------


def test_r29_audit_verify_ties_each_stored_checkpoint_to_the_main_log(
    world: World, tmp_path: Path
) -> None:
    publish(world, 1)
    publish(world, 2)
    witnesses, key, policy = collector(world, tmp_path, [1_700_000_000])
    with open_store(world.url) as store:
        store.cosign(
            sign=key, policy=policy, add_checkpoint=witnesses.add_checkpoint, clock=witnesses.clock
        )
    code, report = cli_json("--db", world.url, "audit", "verify", "--no-views")
    assert code == 0 and "checkpoints" in report["checks"], report
    origin, _, root, note = catalog_row(world)
    ((main, main_size, main_root, main_note),) = [r for r in stored_rows(world) if r[0] != origin]
    # A note of another tree (revision 1's root under size 2), re-stored consistently with
    # its row: signatures aside, the audit finds it is not the log's.
    wrong = CatalogLog(world.db)
    wrong.refresh()
    forged = Checkpoint(bytes(origin).decode(), 2, wrong.root(1))
    update = "UPDATE ledger_checkpoint SET root = :r, note = :n WHERE origin = :o"
    with world.db.write() as conn:
        conn.execute(sa.text(update), {"r": forged.root, "n": forged.text().encode(), "o": origin})
    code, error = cli_json("--db", world.url, "audit", "verify", "--no-views")
    assert (code, error["error"]) == (6, "INTEGRITY")
    assert "ledger_checkpoint" in error["message"] and forged.origin in error["message"]
    assert "root is not the catalog log's" in error["message"]
    # The main log's row is tied to the main log (not to the catalog log): the catalog
    # log's root of its size under the main origin is refused.
    with world.db.write() as conn:
        conn.execute(sa.text(update), {"r": bytes(root), "n": bytes(note), "o": origin})
        other = Checkpoint(bytes(main).decode(), 2, bytes(root))
        conn.execute(
            sa.text(
                "UPDATE ledger_checkpoint SET size = 2, root = :r, note = :n WHERE origin = :o"
            ),
            {"r": other.root, "n": other.text().encode(), "o": main},
        )
    code, error = cli_json("--db", world.url, "audit", "verify", "--no-views")
    assert (code, error["error"]) == (6, "INTEGRITY")
    assert f"origin {other.origin!r} (size 2)" in error["message"]
    assert "root is not the main log's at size 2" in error["message"]
    # A row whose note is not its own size.
    with world.db.write() as conn:
        conn.execute(
            sa.text(
                "UPDATE ledger_checkpoint SET size = :s, root = :r, note = :n WHERE origin = :o"
            ),
            {"s": main_size, "r": bytes(main_root), "n": bytes(main_note), "o": main},
        )
        conn.execute(
            sa.text(
                "UPDATE ledger_checkpoint SET root = :r, note = :n, size = 1 WHERE origin = :o"
            ),
            {"r": bytes(root), "n": bytes(note), "o": origin},
        )
    code, error = cli_json("--db", world.url, "audit", "verify", "--no-views")
    assert (code, error["error"]) == (6, "INTEGRITY")
    assert "not the row's own origin, size and root" in error["message"]


# -- the migration ---------------------------------------------------------------------------


def test_r29_schema_step_3_adds_ledger_checkpoint_to_a_version_2_store(world: World) -> None:
    publish(world, 1)
    with world.db.write() as conn:
        conn.exec_driver_sql("DROP TABLE ledger_checkpoint")
        conn.execute(
            sa.text("UPDATE ledger_meta SET value = :v WHERE name = :n"),
            {"v": b"2", "n": b"schema_version"},
        )
    world.db.engine.dispose()
    code, error = cli_json("--db", world.url, "status")
    assert (code, error["error"], error["details"]["found"]) == (5, "MIGRATION_REQUIRED", 2)
    # The read-only audit reads a version 2 store (no stored checkpoints to tie yet).
    code, report = cli_json("--db", world.url, "audit", "verify", "--no-views")
    assert code == 0 and report["ok"]
    assert catalog_checkpoint(world)["size"] == 1
    code, migrated = cli_json("--db", world.url, "migrate")
    assert (code, migrated["from"], migrated["to"]) == (0, 2, 3)
    assert [s["version"] for s in migrated["applied"]] == [3]
    assert stored_rows(world) == []
    assert cli_json("--db", world.url, "doctor") == (0, {"ok": True, "differences": []})
