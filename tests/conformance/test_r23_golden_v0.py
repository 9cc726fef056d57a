"""R23: the golden store written by 0.1.0 (log format v0) stays readable, forever.

``tests/conformance/fixtures/golden_v0/store.db`` was written by catalog-ledger 0.1.0
(commit 132e5f9) with ``build.py`` beside it; ``expected.json`` holds what
0.1.0 answered on it. Every release must open that exact file, audit it to
the same root and chain, rebuild identical views, serve identical view
digests live and at each revision, and append new events onto it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from domain.served import fact_bytes, fact_digest
from tests.support.cli_inprocess import cli, cli_json
from tests.support.gitrepo import component, manifest, pack_json

GOLDEN = Path(__file__).parent / "fixtures" / "golden_v0"
#: The fixture files themselves: any change to them fails here first.
FIXTURE_SHA256 = {
    "store.db": "cf48b1f56ffb0f51f435db45975bab49e328857c9ab063be3f09b72036932268",
    "export-v0.jsonl": "cbb965e3d44327ade5598b60a85ca06b3ff7eda8f00c6990f32f577cec7fddf7",
    "expected.json": "cdf8d6c711d222971a0da3d195849fb5a152a18f8e8dfd82020a7f6ff46a8a59",
}
#: The type-name table of schema/LOG-FORMAT.md for the lifecycle events, written out
#: by hand (0.1 class name -> 0.2 type name): frozen history, not derived from code.
V0_TYPE_NAMES = {
    "Generation.Prepared": "generation.prepared",
    "Generation.Activated": "generation.activated",
    "Generation.Retired": "generation.retired",
    "Generation.Failed": "generation.failed",
    "PackActivation.Started": "activation.started",
    "PackActivation.Advanced": "activation.advanced",
    "PackHistory.Opened": "pack_history.opened",
    "PackHistory.Attempted": "pack_history.attempted",
    "LocalPack.Installed": "local_pack.installed",
    "LocalPack.Updated": "local_pack.updated",
    "LegacyRecord.Imported": "legacy.imported",
}
EXPECTED: dict[str, Any] = json.loads((GOLDEN / "expected.json").read_text(encoding="utf-8"))


@pytest.fixture
def golden(tmp_path: Path) -> str:
    """A private copy of the golden store (tests never touch the fixture)."""
    shutil.copy(GOLDEN / "store.db", tmp_path / "store.db")
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def migrated(golden: str) -> str:
    """The private copy, migrated to this program's schema version (R24): the commands
    that are not read-only audits refuse an unmigrated store."""
    code, result = cli_json("--db", golden, "migrate")
    assert code == 0 and result["from"] == 1, result
    return golden


def live_rows(url: str) -> dict[str, list[list[Any]]]:
    """Every view table's rows of its newest view version, without the version column."""
    path = url.removeprefix("sqlite:///")
    conn = sqlite3.connect(path)
    try:
        out = {}
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'view_%'"
        ):
            newest = conn.execute(f'SELECT MAX(view_version) FROM "{name}"').fetchone()[0]
            rows = conn.execute(
                f'SELECT * FROM "{name}" WHERE view_version = ?', (newest,)
            ).fetchall()
            out[name] = sorted(
                [[v.hex() if isinstance(v, bytes) else v for v in row[1:]] for row in rows],
                key=json.dumps,
            )
        return out
    finally:
        conn.close()


#: View tables added since 0.1 (schema version 2): a 0.1 log has no event they show.
VIEWS_SINCE_0_1 = ("view_credential", "view_audience_map", "view_audience_map_pending")


def expected_view_rows(which: str = "tables") -> dict[str, list[list[Any]]]:
    """0.1.0's live rows (``tables``) or what its rebuild wrote (``rebuilt_tables``),
    and the views added since, empty."""
    out: dict[str, list[list[Any]]] = {name: [] for name in VIEWS_SINCE_0_1}
    for name, rows in EXPECTED[which].items():
        if name.startswith("view_"):
            newest = max((row[0] for row in rows), default=None)
            out[name] = sorted([row[1:] for row in rows if row[0] == newest], key=json.dumps)
    return out


def test_r23_golden_fixture_files_are_unchanged() -> None:
    for name, sha in FIXTURE_SHA256.items():
        assert hashlib.sha256((GOLDEN / name).read_bytes()).hexdigest() == sha, name


def test_r23_golden_v0_audits_to_the_same_root_and_chain(golden: str) -> None:
    code, report = cli_json("--db", golden, "audit", "verify")
    want = EXPECTED["audit_verify"]
    assert code == 0 and report["ok"] is True, report
    assert (report["size"], report["root"], report["chain"]) == (
        want["size"],
        want["root"],
        want["chain"],
    )
    checkpoint = cli("--db", golden, "audit", "checkpoint")
    # Line 1 is the origin (the store id); size and root follow.
    assert checkpoint.stdout.splitlines()[:3] == EXPECTED["checkpoint"].splitlines()[:3]


def without_payload_hashes(out: Any) -> Any:
    """A live view as 0.1 served it: 0.3 adds each fact's payload hash (so that a
    runtime can recompute the fact digest), which must prove that fact's digest."""
    if not isinstance(out, dict) or "facts" not in out:
        return out
    facts = []
    for fact in out["facts"]:
        rest = dict(fact)
        payload_hash = rest.pop("payload_hash")
        stored = fact_bytes(
            rest["kind"], rest["key"], rest["payload"], rest["requires"], rest["credential_sets"]
        )
        proved = fact_digest(rest["pack"], rest["install_id"], payload_hash, stored)
        assert proved.hex() == rest["fact_digest"], (payload_hash, rest)
        facts.append(rest)
    return {**out, "facts": facts}


def test_r23_golden_v0_serves_identical_views_live_and_at_each_revision(migrated: str) -> None:
    for audience, per in EXPECTED["views"].items():
        code, live = cli_json("--db", migrated, "view", audience)
        assert (code, without_payload_hashes(live)) == (
            per["live"]["code"],
            per["live"]["out"],
        ), audience
        for revision in ("1", "2"):
            got = cli_json("--db", migrated, "view", audience, "--at-revision", revision)
            assert got == (per[revision]["code"], per[revision]["out"]), (audience, revision)


def test_r23_golden_v0_live_views_are_what_0_1_wrote(migrated: str) -> None:
    assert live_rows(migrated) == expected_view_rows()


def test_r23_golden_v0_rebuilds_to_identical_views(migrated: str) -> None:
    assert cli("--db", migrated, "projections", "rebuild").code == 0
    assert live_rows(migrated) == expected_view_rows("rebuilt_tables")
    code, report = cli_json("--db", migrated, "projections", "verify")
    assert code == 0 and report["ok"] is True, report


def test_r23_golden_v0_log_status_and_history_read_identically(migrated: str) -> None:
    assert cli_json("--db", migrated, "status") == (0, EXPECTED["status"])
    assert cli_json("--db", migrated, "log", "--from", "1", "--limit", "100000") == (
        0,
        EXPECTED["log"],
    )
    # 0.2 names events by their product type (0.1 showed the class name); all else holds.
    for pack, history in EXPECTED["history"].items():
        renamed = [{**e, "event": V0_TYPE_NAMES[e["event"]]} for e in history["events"]]
        assert cli_json("--db", migrated, "history", "--pack", pack) == (
            0,
            {**history, "events": renamed},
        ), pack


def _records(jsonl: str) -> list[dict[str, Any]]:
    """The event records of an export (a format header line, if any, is not an event)."""
    lines = [json.loads(line) for line in jsonl.splitlines() if line.strip()]
    return [line for line in lines if "position" in line]


def test_r23_golden_v0_exports_every_stored_byte_as_0_1_did(golden: str, tmp_path: Path) -> None:
    out = tmp_path / "export.jsonl"
    assert cli("--db", golden, "export", "--jsonl", "--out", str(out)).code == 0
    got = _records(out.read_text(encoding="utf-8"))
    want = _records((GOLDEN / "export-v0.jsonl").read_text(encoding="utf-8"))
    assert len(got) == len(want) == EXPECTED["audit_verify"]["size"]
    for mine, theirs in zip(got, want, strict=True):
        for field in ("position", "aggregate_id", "version", "topic", "event_id", "chain", "state"):
            assert mine[field] == theirs[field], (mine["position"], field)


def test_r23_new_events_append_onto_a_golden_v0_store(migrated: str, tmp_path: Path) -> None:
    """A later release appends onto the 0.1 log: the chain goes on, old rows are untouched."""
    local = tmp_path / "devsample"
    local.mkdir()
    (local / "pack.json").write_bytes(
        pack_json("devsample", "app", [component("push_contract", "Dev.push", {"dev": 2})])
    )
    release = manifest(
        tmp_path / "release-3.json",
        [{"name": "devsample", "source": {"kind": "local_path", "path": str(local)}}],
        [
            {
                "audience": "integration:billing-reader",
                "pack": "billing",
                "kind": "push_contract",
                "key": "Invoice.push",
            }
        ],
    )
    code, applied = cli_json("--db", migrated, "apply", str(release))
    assert code == 0, applied
    assert applied["catalog"]["revision"] == 3 and applied["catalog"]["published"] is True
    code, report = cli_json("--db", migrated, "audit", "verify")
    assert code == 0 and report["ok"] is True, report
    assert report["size"] > EXPECTED["audit_verify"]["size"]
    # The old rows are byte for byte what 0.1 wrote.
    code, log = cli_json("--db", migrated, "log", "--from", "1", "--limit", "100000")
    size = EXPECTED["audit_verify"]["size"]
    assert log["events"][:size] == EXPECTED["log"]["events"]
    # Revision 2 still replays as 0.1 served it; app:crm lost its bindings at revision 3.
    billing = EXPECTED["views"]["integration:billing-reader"]
    assert cli_json(
        "--db", migrated, "view", "integration:billing-reader", "--at-revision", "2"
    ) == (
        billing["2"]["code"],
        billing["2"]["out"],
    )
    assert cli_json("--db", migrated, "view", "app:crm")[0] == 5
    code, view = cli_json("--db", migrated, "view", "integration:billing-reader")
    assert code == 0 and view["revision"] == 3
    assert view["audience_digest"] == billing["live"]["out"]["audience_digest"]


def test_r23_the_golden_0_1_export_has_no_trailer_and_imports_only_with_legacy_no_trailer(
    engine_url: str, tmp_path: Path
) -> None:
    """0.1 (and 0.2) wrote no trailer: without the flag the file is refused as possibly cut
    short, naming the flag; with it, it imports as before, to the root 0.1 audited."""
    export = tmp_path / "export-v0.jsonl"
    shutil.copy(GOLDEN / "export-v0.jsonl", export)  # never touch the fixture
    size = EXPECTED["audit_verify"]["size"]
    assert cli_json("--db", engine_url, "init")[0] == 0
    args = ("--db", engine_url, "import", "--jsonl", str(export), "--workers", "1")
    code, refused = cli_json(*args)
    assert (code, refused["error"], refused["details"]) == (
        6,
        "INTEGRITY",
        {"line": size + 1, "field": "trailer", "check": "trailer"},
    ), refused
    assert "import it with --legacy-no-trailer" in refused["message"]
    assert cli_json("--db", engine_url, "log", "--from", "1", "--limit", "1")[1]["head"] == {
        "position": 0,
        "chain": "00" * 32,
    }
    code, imported = cli_json(*args, "--legacy-no-trailer")
    assert code == 0, imported
    want = EXPECTED["audit_verify"]
    assert (imported["imported"], imported["root"], imported["chain"]) == (
        size,
        want["root"],
        want["chain"],
    )
