"""R23: log format v1 — product type names, versioned states, spec, vectors, outside verifier."""

from __future__ import annotations

import ast
import base64
import json
import re
import sqlite3
import types
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import StoredEvent

from domain.errors import IntegrityFailure
from domain.event_types import EVENT_TYPES, UnknownEventType
from ledger.audit.vectors import all_vectors
from ledger.cli.app import dump_json
from ledger.log.db import open_database
from ledger.log.recorder import LedgerRecorder
from ledger.store.init import init_store
from tests.support import reference_verifier as ref
from tests.support.cli_inprocess import cli, cli_json
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "schema" / "vectors" / "log"
V1_TOPIC = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+@[1-9][0-9]*")


def _vectors() -> dict[str, Any]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in VECTORS.glob("*.json")}


def realistic(world: World) -> list[str]:
    """Installs, an advance, a local pack, bindings for three audiences, one revoked."""
    c1 = world.release(
        {
            "sales/pack.json": world_content("sales", 1),
            "Sales/pack.json": world_content("Sales", 1),
            "café/pack.json": world_content("café", 1),
        }
    )
    c2 = world.commit("sales", 2)
    packs = [world.official(p, c1) for p in ("sales", "Sales", "café")]
    bindings = [
        *push_closure("integration:erp-sync", "sales"),
        *push_closure("app:CRM", "Sales"),
        *push_closure("app:café", "café"),
    ]
    world.service.apply(world.manifest(packs, bindings))
    packs[0] = world.official("sales", c2)
    world.service.apply(world.manifest(packs, bindings[:4]))  # advance; café revoked
    return ["integration:erp-sync", "app:CRM", "app:café"]


def world_content(name: str, version: int) -> bytes:
    from tests.support.lifecycle_support import content

    return content(name, version)


def export_lines(url: str, tmp_path: Path) -> list[str]:
    out = tmp_path / f"export-{len(list(tmp_path.iterdir()))}.jsonl"
    assert cli("--db", url, "export", "--jsonl", "--out", str(out)).code == 0
    return out.read_text(encoding="utf-8").splitlines()


# -- the type table ---------------------------------------------------------------------------


def test_r23_every_type_has_a_product_name_and_resolves_all_its_stored_topics() -> None:
    seen = set()
    for t in EVENT_TYPES:
        assert V1_TOPIC.fullmatch(t.topic), t.topic
        assert ":" not in t.topic and "domain" not in t.topic
        for topic in t.stored_topics():
            assert topic not in seen
            seen.add(topic)
            assert EVENT_TYPES.resolve(topic).type is t
    assert EVENT_TYPES.named("binding.revoked").version == 2
    assert EVENT_TYPES.resolve("binding.revoked@1").version == 1
    assert EVENT_TYPES.resolve("domain.catalog:AudienceBindings.Revoked").format == 0


@pytest.mark.parametrize(
    ("topic", "says"),
    [
        ("binding.revoked@3", "version 3"),
        ("binding.revoked@0", "version 0"),
        ("generation.exploded@1", "unknown event type"),
        ("domain.lifecycle:Generation.Exploded", "unknown event type"),
        ("generation.prepared", "unknown event type"),
    ],
)
def test_r23_unknown_type_or_version_fails_closed_naming_it(topic: str, says: str) -> None:
    with pytest.raises(UnknownEventType) as info:
        EVENT_TYPES.resolve(topic)
    assert isinstance(info.value, IntegrityFailure) and info.value.exit_code == 6
    assert says in info.value.message and info.value.details["topic"] == topic


def test_r23_v1_binding_revoked_upcasts_to_v2_with_a_null_install_id() -> None:
    v1 = b'{"audience_id":"a","audience_kind":"app","credential_set":null,"key":"k","kind":"x",'
    v1 += b'"pack":"p","timestamp":"2026-12-01T00:00:00+00:00"}'
    for topic in ("binding.revoked@1", "domain.catalog:AudienceBindings.Revoked"):
        name, state = EVENT_TYPES.decode(topic, v1)
        assert name == "binding.revoked" and state["install_id"] is None
    name, state = EVENT_TYPES.decode("binding.revoked@2", v1[:-1] + b',"install_id":"i"}')
    assert state["install_id"] == "i"


def test_r23_one_module_owns_the_type_table() -> None:
    """Projections, audit and the schema read the table; no module lists topics itself."""
    product = [
        p
        for d in ("domain", "ledger", "projections", "publisher")
        for p in (ROOT / d).rglob("*.py")
    ]
    for path in product:
        text = path.read_text(encoding="utf-8")
        if path.name in ("event_types.py", "vectors.py"):  # the table; frozen v0 vectors
            continue
        assert "get_topic(" not in text or path.name in ("mapper.py", "runtime.py"), path
        assert not re.search(r"[\"']domain\.(lifecycle|catalog|coordination):", text), path


# -- what is written --------------------------------------------------------------------------


def test_r23_new_events_carry_no_python_paths(world: World) -> None:
    realistic(world)
    rows = list(world.ledger.recorder.iter_rows())
    assert len(rows) >= 40
    for row in rows:
        assert V1_TOPIC.fullmatch(row.topic), (row.position, row.topic)
        assert b"originator_topic" not in row.state and b"domain." not in row.state, row.position
    assert "binding.revoked@2" in {row.topic for row in rows}


# -- spec, vectors and the outside verifier ---------------------------------------------------


def test_r23_vectors_are_what_the_code_generates() -> None:
    for name, document in all_vectors().items():
        checked_in = (VECTORS / name).read_text(encoding="utf-8")
        assert checked_in == dump_json(document), f"{name} is stale: run catalog-ledger schema dump"
    events = _vectors()["events.json"]["events"]
    assert len(events) >= 20
    topics = {e["topic"] for e in events}
    assert any(":" in t for t in topics) and "binding.revoked@1" in topics


def test_r23_reference_verifier_agrees_with_every_vector() -> None:
    docs = _vectors()
    ids = ref.check_event_vectors(docs["events.json"])
    ref.check_merkle_vectors(docs["merkle.json"], ids)
    ref.check_export_vectors(docs["export.json"], docs["events.json"])


#: What a reference module may import: the stdlib modules it uses, ``blake3``, and
#: ``cryptography`` (Ed25519, RFC 8032, for the checkpoint notes of proof bundles, R29).
SPEC_ONLY = {
    "__future__",
    "base64",
    "hashlib",
    "json",
    "struct",
    "uuid",
    "collections",
    "dataclasses",
    "typing",
    "blake3",
    "cryptography",
}


def reference_imports(module: str) -> set[str]:
    """What ``tests/support/<module>.py`` imports: top-level module names, and
    ``tests.support.<name>`` for another reference module."""
    tree = ast.parse((ROOT / "tests" / "support" / f"{module}.py").read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported |= {
                f"{node.module}.{a.name}" if node.module == "tests.support" else str(node.module)
                for a in node.names
            }
    return imported


def test_r23_reference_verifier_imports_only_hashlib_blake3_cryptography_and_the_stdlib() -> None:
    imported = reference_imports("reference_verifier")
    assert {m.split(".")[0] for m in imported} - {"tests"} <= SPEC_ONLY, imported
    # The one test-support module it reads is another spec-only reference (R29).
    assert {m for m in imported if m.startswith("tests")} == {
        "tests.support.reference_audience_map"
    }, imported


def test_r23_reference_verifier_agrees_with_an_exported_store(world: World, tmp_path: Path) -> None:
    """On SQLite and MariaDB: the outside verifier recomputes what audit verify reports."""
    realistic(world)
    lines = export_lines(world.url, tmp_path)
    verified = ref.verify_export(lines)
    code, report = cli_json("--db", world.url, "audit", "verify")
    assert code == 0 and report["ok"] is True
    assert (verified.size, base64.b64encode(verified.root).decode(), verified.chain.hex()) == (
        report["size"],
        report["root"],
        report["chain"],
    )
    checkpoint = cli("--db", world.url, "audit", "checkpoint").stdout
    origin = checkpoint.splitlines()[0]
    assert checkpoint == verified.checkpoint(origin)
    *records, trailer = [json.loads(line) for line in lines]
    assert trailer["trailer"] == 1 and trailer["count"] == report["size"]
    assert {r["format"] for r in records} == {1}
    revoked = [r for r in records if r["type"] == "binding.revoked"]
    assert revoked and all(r["type_version"] == 2 for r in revoked)


def test_r23_reference_verifier_agrees_with_the_golden_v0_export() -> None:
    golden = ROOT / "tests" / "conformance" / "fixtures" / "golden_v0"
    expected = json.loads((golden / "expected.json").read_text(encoding="utf-8"))["audit_verify"]
    # 0.1's export had no state_b64; its rows were JSON, stored as orjson sorted-key bytes.
    conn = sqlite3.connect(golden / "store.db")
    try:
        rows = conn.execute(
            "SELECT position, aggregate_id, version, topic, state, event_id, chain "
            "FROM ledger_events ORDER BY position"
        ).fetchall()
    finally:
        conn.close()
    lines = [
        json.dumps(
            {
                "position": p,
                "aggregate_id": str(__import__("uuid").UUID(bytes=a)),
                "version": v,
                "topic": t.decode(),
                "state_b64": base64.b64encode(s).decode(),
                "event_id": e.hex(),
                "chain": c.hex(),
            }
        )
        for p, a, v, t, s, e, c in rows
    ]
    verified = ref.verify_export(lines, legacy_no_trailer=True)  # 0.1 wrote no trailer
    assert (verified.size, base64.b64encode(verified.root).decode(), verified.chain.hex()) == (
        expected["size"],
        expected["root"],
        expected["chain"],
    )


MUTATIONS = {
    "a wrong context string": (
        '"catalog-ledger 2026-11 event v1"',
        '"catalog-ledger 2026-11 event v2"',
    ),
    "a dropped field": ("lp(aggregate, u64(version), topic, state)", "lp(aggregate, topic, state)"),
    "a changed length prefix": ('struct.Struct(">Q")', 'struct.Struct("<Q")'),
    "a wrong chain context": (
        '"catalog-ledger 2026-11 chain v1"',
        '"catalog-ledger 2026-11 chain"',
    ),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_r23_reference_verifier_rejects_a_mutated_copy_of_the_project_code(mutation: str) -> None:
    """The verifier is not an echo of the code: a mutated digests module must fail it."""
    source = (ROOT / "domain" / "digests.py").read_text(encoding="utf-8")
    old, new = MUTATIONS[mutation]
    assert source.count(old) == 1, old
    mutated = types.ModuleType("mutated_digests")
    exec(compile(source.replace(old, new), "mutated_digests", "exec"), mutated.__dict__)
    doc = json.loads((VECTORS / "events.json").read_text(encoding="utf-8"))
    # The unmutated copy reproduces the vectors exactly (so only the mutation can fail).
    for module, should_pass in ((types.ModuleType("copy"), True), (mutated, False)):
        if should_pass:
            exec(compile(source, "copy", "exec"), module.__dict__)
        chain = bytes(32)
        produced = json.loads(json.dumps(doc))
        for e in produced["events"]:
            agg = __import__("uuid").UUID(e["aggregate_id"]).bytes
            state = base64.b64decode(e["state_b64"])
            eid = module.event_id(agg, e["version"], e["topic"].encode(), state)
            chain = module.next_chain(chain, eid)
            e["event_id"], e["chain"] = eid.hex(), chain.hex()
            encoded = module.lp(agg, module.u64(e["version"]), e["topic"].encode(), state)
            e["hashed_length"] = len(encoded)
            e["hashed_hex"] = encoded.hex() if e["hashed_hex"] is not None else None
        produced["contexts"] = {
            "event_id": module.Purpose.EVENT_ID.value,
            "chain": module.Purpose.CHAIN.value,
        }
        if should_pass:
            ref.check_event_vectors(produced)
        else:
            with pytest.raises(ref.Mismatch):
                ref.check_event_vectors(produced)


# -- a schema change, proven on real rows -----------------------------------------------------


def _twin_with_v1_revocations(url: str, twin_url: str) -> int:
    """Copy every row of ``url`` into a fresh store, writing each revocation as v1."""
    source, twin = open_database(url), open_database(twin_url)
    try:
        init_store(twin)
        stored = []
        rewritten = 0
        for row in LedgerRecorder(source).iter_rows():
            topic, state = row.topic, row.state
            if topic == "binding.revoked@2":
                data = json.loads(state)
                del data["install_id"]
                topic, state = "binding.revoked@1", json.dumps(data, sort_keys=True).encode()
                rewritten += 1
            stored.append(StoredEvent(row.aggregate_id, row.version, topic, state))
        LedgerRecorder(twin).append(stored)
        return rewritten
    finally:
        source.close()
        twin.close()


def test_r23_a_v1_row_replays_rebuilds_and_audits_like_its_v2_twin(
    world: World, sibling_url: str
) -> None:
    audiences = realistic(world)
    assert _twin_with_v1_revocations(world.url, sibling_url) == 2
    for url in (world.url, sibling_url):
        assert cli("--db", url, "projections", "rebuild").code == 0
        code, report = cli_json("--db", url, "audit", "verify")
        assert code == 0 and report["ok"] is True, report
        code, verified = cli_json("--db", url, "projections", "verify")
        assert code == 0 and verified["ok"] is True, verified
    for audience in audiences:
        for extra in ((), ("--at-revision", "1"), ("--at-revision", "2")):
            mine = cli_json("--db", world.url, "view", audience, *extra)
            twin = cli_json("--db", sibling_url, "view", audience, *extra)
            assert mine == twin, (audience, extra)
    assert cli_json("--db", world.url, "view", "app:café")[0] == 5
    for pack in ("sales", "café"):  # lifecycle rows are byte-identical in both stores
        assert cli_json("--db", world.url, "history", "--pack", pack) == cli_json(
            "--db", sibling_url, "history", "--pack", pack
        )
