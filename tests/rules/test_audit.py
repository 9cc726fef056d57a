"""Audit (R17, R20-R22) on SQLite and MariaDB: tamper sweep, checkpoints, proofs, sources,
as-of queries and the export with its JSON Schema."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import sqlalchemy as sa

from domain import merkle
from domain.digests import ZERO_CHAIN, event_id, next_chain
from domain.notes import SignerKey
from ledger.audit.proofs import MerkleLog, checkpoint
from ledger.audit.verify import verify_log
from ledger.log import tables as schema
from ledger.log.db import Database
from tests.support.cli_inprocess import cli
from tests.support.gitrepo import git, push_closure
from tests.support.history import bulk_history
from tests.support.lifecycle_support import World

ROOT = Path(__file__).resolve().parents[2]
EV = schema.events


def _history(world: World) -> None:
    """A few thousand events: bulk lifecycle history plus a release with a catalog."""
    bulk_history(world.ledger, packs=150, rounds=4, components=1, fail_every=9)
    commit = world.commit("sales", 1)
    bindings = push_closure("integration:a", "sales")
    world.service.apply(world.manifest([world.official("sales", commit)], bindings))
    world.service.apply(
        world.manifest([world.official("sales", world.commit("sales", 2))], bindings)
    )


def _rows(db: Database, *positions: int) -> list[dict[str, Any]]:
    with db.read() as conn:
        return [
            r._asdict()
            for r in conn.execute(
                sa.select(EV).where(EV.c.position.in_(positions)).order_by(EV.c.position)
            )
        ]


def _flip(value: bytes, at: int = -1) -> bytes:
    data = bytearray(value)
    data[at] ^= 0x01
    return bytes(data)


def _first(db: Database, world: World, **kwargs: Any) -> tuple[int | None, str]:
    report = verify_log(world.ledger, views=False, **kwargs)
    first = report.first()
    assert first is not None, "the tampering was not detected"
    return first.position, first.check


def _shift(conn: sa.Connection, start: int, by: int) -> None:
    """Move positions >= start by ``by`` without transient primary-key collisions."""
    conn.execute(EV.update().where(EV.c.position >= start).values(position=-EV.c.position))
    conn.execute(EV.update().where(EV.c.position < 0).values(position=-EV.c.position + by))


def test_r22_tamper_sweep_names_the_first_bad_position(world: World) -> None:
    _history(world)
    db = world.db
    head = world.head()
    assert head > 2000
    assert verify_log(world.ledger, views=False).ok
    earlier = checkpoint(world.ledger).text()
    p, q = head // 3, head // 2

    def column_flip(column: str) -> Callable[[], Callable[[], None]]:
        def tamper() -> Callable[[], None]:
            (row,) = _rows(db, p)
            with db.write() as conn:
                conn.execute(
                    EV.update()
                    .where(EV.c.position == p)
                    .values({column: _flip(bytes(row[column]))})
                )

            def restore() -> None:
                with db.write() as conn:
                    conn.execute(
                        EV.update().where(EV.c.position == p).values({column: bytes(row[column])})
                    )

            return restore

        return tamper

    def delete() -> Callable[[], None]:
        (row,) = _rows(db, p)
        with db.write() as conn:
            conn.execute(EV.delete().where(EV.c.position == p))
        return lambda: _insert(db, row)

    def swap() -> Callable[[], None]:
        a, b = _rows(db, p, q)
        content = ("aggregate_id", "version", "topic", "state", "event_id", "chain")
        with db.write() as conn:
            conn.execute(EV.delete().where(EV.c.position.in_([p, q])))
            conn.execute(
                EV.insert(),
                [
                    {**{k: b[k] for k in content}, "position": p},
                    {**{k: a[k] for k in content}, "position": q},
                ],
            )

        def restore() -> None:
            with db.write() as conn:
                conn.execute(EV.delete().where(EV.c.position.in_([p, q])))
                conn.execute(EV.insert(), [a, b])

        return restore

    def insert() -> Callable[[], None]:
        (row,) = _rows(db, p)
        forged = {
            **row,
            "aggregate_id": bytes(range(16)),
            "state": b'{"forged":true}',
            "event_id": bytes(32),
            "chain": bytes(32),
        }
        with db.write() as conn:
            _shift(conn, p, 1)
            conn.execute(EV.insert(), [forged])

        def restore() -> None:
            with db.write() as conn:
                conn.execute(EV.delete().where(EV.c.position == p))
                _shift(conn, p + 1, -1)

        return restore

    cases: list[tuple[str, Callable[[], Callable[[], None]], int, str]] = [
        ("state byte", column_flip("state"), p, "event_id"),
        ("event_id byte", column_flip("event_id"), p, "event_id"),
        ("chain byte", column_flip("chain"), p, "chain"),
        ("deleted row", delete, p, "position"),
        ("swapped rows", swap, p, "chain"),
        ("inserted forged row", insert, p, "event_id"),
    ]
    for name, tamper, position, check in cases:
        restore = tamper()
        try:
            assert _first(db, world) == (position, check), name
        finally:
            restore()
        assert verify_log(world.ledger, views=False).ok, f"restore after {name}"

    # Truncating the tail (and the head row with it) is internally consistent:
    # only an earlier checkpoint can tell.
    keep = head - 25
    tail = _rows(db, *range(keep + 1, head + 1))
    (last,) = _rows(db, keep)
    with db.write() as conn:
        conn.execute(EV.delete().where(EV.c.position > keep))
        conn.execute(schema.head.update().values(position=keep, chain=last["chain"]))
    assert verify_log(world.ledger, views=False, replay=False).ok
    assert _first(db, world, from_checkpoint=earlier, replay=False) == (keep + 1, "checkpoint")
    del tail


def _insert(db: Database, row: dict[str, Any]) -> None:
    with db.write() as conn:
        conn.execute(EV.insert(), [row])


def test_r22_rewritten_but_consistent_history_is_caught_by_the_checkpoint(world: World) -> None:
    _history(world)
    db = world.db
    key = SignerKey.generate("auditor")
    note = key.sign(checkpoint(world.ledger).text())
    head = world.head()
    target = head // 2
    # Rewrite one event and recompute every event_id and chain after it: the log is
    # internally consistent again, as a careful forger would leave it.
    with db.write() as conn:
        rows = [
            r._asdict()
            for r in conn.execute(
                sa.select(EV).where(EV.c.position >= target - 1).order_by(EV.c.position)
            )
        ]
        chain = bytes(rows[0]["chain"])
        for row in rows[1:]:
            state = bytes(row["state"])
            if row["position"] == target:
                state = state.replace(b'"', b'"', 1) + b" "
            eid = event_id(bytes(row["aggregate_id"]), row["version"], bytes(row["topic"]), state)
            chain = next_chain(chain, eid)
            conn.execute(
                EV.update()
                .where(EV.c.position == row["position"])
                .values(state=state, event_id=eid, chain=chain)
            )
        conn.execute(schema.head.update().values(chain=chain))
    assert verify_log(world.ledger, views=False).ok  # nothing internal is wrong ...
    report = verify_log(world.ledger, views=False, from_checkpoint=note, verifier=key.verifier)
    assert not report.ok  # ... but it is not the history the auditor checkpointed
    assert report.first() is not None and report.first().check == "checkpoint"  # type: ignore[union-attr]
    out = cli("--db", world.url, "audit", "verify", "--no-views", "--json")
    assert out.code == 0


def test_r22_sources_detect_a_git_object_that_no_longer_matches(world: World) -> None:
    commit = world.commit("sales", 1)
    world.apply(world.official("sales", commit))
    assert verify_log(world.ledger, views=False, sources=True).ok
    blob = git(world.repo.path, "rev-parse", f"{commit}:sales/pack.json")
    obj = world.repo.path / ".git" / "objects" / blob[:2] / blob[2:]
    original = obj.read_bytes()
    content = zlib.decompress(original)
    _header, body = content.split(b"\0", 1)
    changed = body.replace(b'"v": 1', b'"v": 9')
    obj.chmod(0o644)
    obj.write_bytes(zlib.compress(f"blob {len(changed)}".encode() + b"\0" + changed))
    report = verify_log(world.ledger, views=False, sources=True)
    first = report.first()
    assert first is not None and first.check == "sources"
    assert "no longer matches" in first.message
    # A rewritten history whose commit is gone is reported too.
    obj.write_bytes(original)
    world.repo.commit({"other.txt": b"x"})
    git(world.repo.path, "checkout", "-q", "--orphan", "rewritten")
    git(world.repo.path, "commit", "-q", "--allow-empty", "-m", "rewritten")
    git(world.repo.path, "branch", "-D", "main")
    git(world.repo.path, "reflog", "expire", "--expire=now", "--all")
    git(world.repo.path, "gc", "-q", "--prune=now")
    report = verify_log(world.ledger, views=False, sources=True)
    first = report.first()
    assert first is not None and first.check == "sources"
    assert "cannot be re-read" in first.message


def test_r22_stored_log_proofs_match_the_pure_tree(world: World) -> None:
    bulk_history(world.ledger, packs=300, rounds=2, components=1)
    head = world.head()
    with world.db.read() as conn:
        leaves = [
            merkle.leaf_hash(i) for i in world.ledger.recorder.event_ids(conn, after=0, upto=head)
        ]
    log = MerkleLog(world.ledger)
    for size in (1, 1024, 1025, head - 1, head):
        assert log.root(size) == merkle.root(leaves[:size])
    proof = log.inclusion(head // 2, head)
    import base64

    merkle.verify_inclusion(
        head // 2 - 1,
        head,
        base64.b64decode(proof["leaf_hash"]),
        [base64.b64decode(p) for p in proof["proof"]],
        merkle.root(leaves),
    )
    cp = checkpoint(world.ledger)
    assert cp.root == merkle.root(leaves) and cp.size == head
    # A second MerkleLog reads the persisted subtree cache and agrees.
    assert MerkleLog(world.ledger).root(head) == cp.root


def test_r22_checkpoint_and_proof_cli_round_trip_offline(world: World, tmp_path: Path) -> None:
    world.apply(world.official("sales", world.commit("sales", 1)))
    world.apply(world.official("sales", world.commit("sales", 2)))
    key = tmp_path / "auditor.key"
    assert cli("audit", "keygen", "auditor", "--out", str(key)).code == 0
    signed = cli("--db", world.url, "audit", "checkpoint", "--sign", str(key))
    assert signed.code == 0 and "\u2014 auditor " in signed.stdout
    (tmp_path / "cp.txt").write_text(signed.stdout)
    inclusion = cli("--db", world.url, "audit", "prove", "--position", "3")
    (tmp_path / "inc.json").write_text(inclusion.stdout)
    consistency = cli("--db", world.url, "audit", "prove", "--from-size", "4")
    (tmp_path / "con.json").write_text(consistency.stdout)
    for proof in ("inc.json", "con.json"):
        ok = cli(
            "audit",
            "verify-proof",
            str(tmp_path / proof),
            "--checkpoint",
            str(tmp_path / "cp.txt"),
            "--key",
            str(key) + ".pub",
            "--json",
        )
        assert ok.code == 0 and ok.json()["ok"] is True, ok.stdout
    other = tmp_path / "other.key"
    cli("audit", "keygen", "other", "--out", str(other))
    wrong = cli(
        "audit",
        "verify-proof",
        str(tmp_path / "inc.json"),
        "--checkpoint",
        str(tmp_path / "cp.txt"),
        "--key",
        str(other) + ".pub",
        "--json",
    )
    assert wrong.code == 6 and wrong.json()["error"] == "INTEGRITY"
    doc = json.loads(inclusion.stdout)
    doc["proof"][0] = doc["proof"][1] if len(doc["proof"]) > 1 else doc["leaf_hash"]
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    bad = cli(
        "audit",
        "verify-proof",
        str(tmp_path / "bad.json"),
        "--checkpoint",
        str(tmp_path / "cp.txt"),
        "--json",
    )
    assert bad.code == 6
    assert cli("--db", world.url, "audit", "prove", "--position", "999999").code == 3


def test_r20_history_view_at_revision_and_export_from_the_log(world: World, tmp_path: Path) -> None:
    bindings = push_closure("integration:a", "sales")
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    first = world.service.apply(world.manifest([world.official("sales", c1)], bindings))
    world.service.apply(world.manifest([world.official("sales", c2)], bindings))
    events = cli("--db", world.url, "history", "--pack", "sales", "--json").json()["events"]
    names = [e["event"] for e in events]
    assert names.count("generation.prepared") == 2 and "generation.retired" in names
    past = cli("--db", world.url, "view", "integration:a", "--at-revision", "1", "--json")
    assert past.code == 0
    install_ids = {f["install_id"] for f in past.json()["facts"]}
    assert install_ids == {first["packs"][0]["install_id"]}
    assert past.json()["content_digest"] == first["catalog"]["content_digest"]
    assert cli("--db", world.url, "view", "integration:a", "--at-revision", "9", "--json").code == 5
    out = tmp_path / "events.jsonl"
    assert cli("--db", world.url, "export", "--jsonl", "--out", str(out)).code == 0
    schema_doc = json.loads((ROOT / "schema" / "events.schema.json").read_text())
    *lines, trailer = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == world.head() == trailer["count"]  # the trailer is not an event
    # ``jsonschema.validate`` checks the schema itself on every call (~0.25 s each here):
    # check it once, then validate every line against it.
    validator_class = jsonschema.validators.validator_for(schema_doc)
    validator_class.check_schema(schema_doc)
    validator = validator_class(schema_doc)
    for line in lines:
        validator.validate(line)
    chain = ZERO_CHAIN
    for line in lines:  # an auditor in another language can recheck the chain
        chain = next_chain(chain, bytes.fromhex(line["event_id"]))
        assert chain.hex() == line["chain"]


def test_r22_events_schema_is_current() -> None:
    from ledger.audit.event_schema import events_schema
    from ledger.cli.app import dump_json

    checked_in = (ROOT / "schema" / "events.schema.json").read_text(encoding="utf-8")
    assert checked_in == dump_json(events_schema()), (
        "schema/events.schema.json is stale: run `catalog-ledger schema dump` and commit it"
    )


def test_r22_audit_verify_cli_reports_first_bad_position(world: World) -> None:
    world.apply(world.official("sales", world.commit("sales", 1)))
    assert cli("--db", world.url, "audit", "verify", "--json").json()["ok"] is True
    (row,) = _rows(world.db, 4)
    with world.db.write() as conn:
        conn.execute(EV.update().where(EV.c.position == 4).values(state=bytes(row["state"]) + b" "))
    out = cli("--db", world.url, "audit", "verify", "--json")
    assert out.code == 6
    assert out.json()["details"]["first_problem"]["position"] == 4


def test_r22_parallel_byte_checks_agree_with_a_single_pass(world: World) -> None:
    bulk_history(world.ledger, packs=400, rounds=3, components=1)
    head = world.head()
    single = verify_log(world.ledger, views=False)
    # Small chunks: both workers get several whole chunks and one a partial tail.
    parallel = verify_log(world.ledger, views=False, workers=2, chunk=512)
    assert single.ok and parallel.ok
    assert (
        (parallel.size, parallel.root, parallel.chain)
        == (single.size, single.root, single.chain)
        == (head, checkpoint(world.ledger).root, single.chain)
    )
    position = head - 3
    (row,) = _rows(world.db, position)
    with world.db.write() as conn:
        conn.execute(
            EV.update().where(EV.c.position == position).values(chain=_flip(bytes(row["chain"])))
        )
    report = verify_log(world.ledger, views=False, workers=2, chunk=512)
    first = report.first()
    assert first is not None and (first.position, first.check) == (position, "chain")
