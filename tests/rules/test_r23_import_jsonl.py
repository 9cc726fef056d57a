"""R23 / R2 / R22: ``import --jsonl`` restores an export byte for byte on any engine.

A store exported on SQLite, imported into MariaDB, exported again and imported
into a fresh SQLite file keeps its audit root, chain head and every view's
digest at every step, and the exports are byte-identical. A line that does not
verify (a changed state byte, a changed chain, a position gap, a malformed or
ill-typed line, an unknown type) is refused with the exact code, naming the
line and position, and the target store is left exactly as it was: empty.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa

from domain.digests import ZERO_CHAIN, event_id, next_chain
from domain.errors import IntegrityFailure, InvalidInput
from ledger.api import open_store
from ledger.log.db import open_database
from ledger.store.restore import import_jsonl, read_lines
from tests.conformance.test_r23_golden_v0 import without_payload_hashes
from tests.conformance.test_r23_log_format import realistic
from tests.support import reference_verifier as ref
from tests.support.cli_inprocess import cli, cli_json
from tests.support.cli_support import SCRIPT
from tests.support.history import bulk_history
from tests.support.lifecycle_support import World

GOLDEN = Path(__file__).resolve().parents[1] / "conformance" / "fixtures" / "golden_v0"
EXPECTED: dict[str, Any] = json.loads((GOLDEN / "expected.json").read_text(encoding="utf-8"))
#: A line of the golden log inside the first catalog revision's bindings.
TAMPERED_LINE = 40


def _init(url: str) -> None:
    code, out = cli_json("--db", url, "init")
    assert code == 0, out


def _export(url: str, out: Path) -> bytes:
    result = cli("--db", url, "export", "--jsonl", "--out", str(out))
    assert result.code == 0, result.stderr
    return out.read_bytes()


def _import(url: str, path: Path, *flags: str) -> tuple[int, Any]:
    return cli_json("--db", url, "import", "--jsonl", str(path), "--workers", "1", *flags)


def _fingerprint(url: str, audiences: list[str]) -> dict[str, Any]:
    """Everything that must survive a move: audit root and chain, head, every view's
    digest and row count, and what every audience is served (live and at revision 1)."""
    code, audit = cli_json("--db", url, "audit", "verify")
    assert code == 0 and audit["ok"] is True, audit
    code, verified = cli_json("--db", url, "projections", "verify")
    assert code == 0 and verified["ok"] is True, verified
    code, status = cli_json("--db", url, "projections", "status")
    assert code == 0 and all(v["lag"] == 0 and v["state"] == "running" for v in status["views"])
    served = {a: cli_json("--db", url, "view", a) for a in audiences}
    past = {a: cli_json("--db", url, "view", a, "--at-revision", "1") for a in audiences}
    code, log = cli_json("--db", url, "log", "--from", "1", "--limit", "1")
    return {
        "audit": (audit["size"], audit["root"], audit["chain"], audit["catalog_revisions"]),
        "head": log["head"],
        "views": {v["name"]: (v["rows"], v["digest"], v["position"]) for v in verified["views"]},
        "served": served,
        "past": past,
    }


def _tables(url: str) -> dict[str, list[str]]:
    """Every row of every table but the Merkle cache: "nothing written" is all of it equal."""
    db = open_database(url, create=False)
    try:
        out: dict[str, list[str]] = {}
        with db.read() as conn:
            for name in sorted(sa.inspect(conn).get_table_names()):
                if name != "ledger_merkle":
                    rows = conn.execute(sa.text(f"SELECT * FROM {name}")).fetchall()
                    out[name] = sorted(repr(tuple(r)) for r in rows)
        return out
    finally:
        db.close()


def _is_empty(url: str) -> None:
    code, log = cli_json("--db", url, "log", "--from", "1", "--limit", "10")
    assert code == 0
    assert log == {"head": {"position": 0, "chain": ZERO_CHAIN.hex()}, "events": []}


# -- moving a realistic store between engines -------------------------------------------------


def test_r23_r2_a_store_moves_sqlite_to_mariadb_to_sqlite_with_identical_root_chain_and_views(
    tmp_path: Path, sqlite_url: str, mysql_url: str
) -> None:
    world = World(tmp_path, sqlite_url)
    try:
        audiences = realistic(world)  # installs, an advance, a local pack, 3 audiences, a revoke
        bulk_history(world.ledger, packs=40, rounds=3, components=1, fail_every=7)
        world.apply(world.official("sales", world.commit("sales", 3)))  # one more revision
    finally:
        world.close()
    assert cli("--db", sqlite_url, "projections", "catch-up").code == 0  # command_log
    source = _fingerprint(sqlite_url, audiences)
    assert source["audit"][0] > 300 and source["audit"][3] >= 2
    earlier = tmp_path / "source.checkpoint"
    earlier.write_text(cli("--db", sqlite_url, "audit", "checkpoint").stdout, encoding="utf-8")
    first = _export(sqlite_url, tmp_path / "sqlite.jsonl")

    _init(mysql_url)
    code, imported = _import(mysql_url, tmp_path / "sqlite.jsonl")
    assert code == 0, imported
    size, root, chain, _ = source["audit"]
    assert (imported["imported"], imported["head_position"]) == (size, size)
    assert (imported["root"], imported["chain"]) == (root, chain)
    assert len(imported["views_rebuilt"]) == len(source["views"])
    assert _fingerprint(mysql_url, audiences) == source
    second = _export(mysql_url, tmp_path / "mariadb.jsonl")
    assert second == first

    back = f"sqlite:///{tmp_path / 'back.db'}"
    _init(back)
    code, again = _import(back, tmp_path / "mariadb.jsonl")
    assert code == 0, again
    assert _fingerprint(back, audiences) == source
    assert _export(back, tmp_path / "back.jsonl") == first
    # Each store keeps its own id, the origin of a log never named (R29: a signed log is
    # named, and keeps its origin); the source's checkpoint still proves the restored log
    # extends it.
    assert len({_origin(u) for u in (sqlite_url, mysql_url, back)}) == 3
    assert again["origin"] == _origin(back)
    code, report = cli_json("--db", back, "audit", "verify", "--from-checkpoint", str(earlier))
    assert code == 0 and "checkpoint" in report["checks"], report


def _origin(url: str) -> str:
    return str(cli("--db", url, "audit", "checkpoint").stdout.splitlines()[0])


# -- the golden v0 store -------------------------------------------------------------------


def test_r23_the_golden_v0_export_imports_to_the_root_and_views_0_1_served(
    engine_url: str, tmp_path: Path
) -> None:
    """0.1 exports carry no state_b64: the bytes are the canonical encoding of ``state``,
    and the stated event ids prove they are exactly the bytes 0.1 stored."""
    export = tmp_path / "export-v0.jsonl"
    shutil.copy(GOLDEN / "export-v0.jsonl", export)  # never touch the fixture
    _init(engine_url)
    code, imported = _import(engine_url, export, "--legacy-no-trailer")  # 0.1 wrote none
    assert code == 0, imported
    want = EXPECTED["audit_verify"]
    assert (imported["imported"], imported["root"], imported["chain"]) == (
        want["size"],
        want["root"],
        want["chain"],
    )
    code, report = cli_json("--db", engine_url, "audit", "verify")
    assert code == 0 and report["ok"] is True, report
    assert (report["size"], report["root"], report["chain"]) == (
        want["size"],
        want["root"],
        want["chain"],
    )
    for audience, per in EXPECTED["views"].items():
        code, live = cli_json("--db", engine_url, "view", audience)
        assert (code, without_payload_hashes(live)) == (
            per["live"]["code"],
            per["live"]["out"],
        ), audience
        for revision in ("1", "2"):
            got = cli_json("--db", engine_url, "view", audience, "--at-revision", revision)
            assert got == (per[revision]["code"], per[revision]["out"]), (audience, revision)
    assert cli_json("--db", engine_url, "log", "--from", "1", "--limit", "100000") == (
        0,
        EXPECTED["log"],
    )
    # Each view's digest covers its rows: one edited row changes that view's digest only.
    code, verified = cli_json("--db", engine_url, "projections", "verify")
    assert code == 0
    digests = {v["name"]: v["digest"] for v in verified["views"]}
    assert len(set(digests.values())) == len(digests)
    db = open_database(engine_url, create=False)
    try:
        with db.write() as conn:
            edited = conn.execute(
                sa.text("UPDATE view_installed_pack SET category = :c WHERE pack = :p"),
                {"c": b"edited", "p": b"billing"},
            )
            assert edited.rowcount == 1
    finally:
        db.close()
    code, failed = cli_json("--db", engine_url, "projections", "verify")
    assert code == 6
    after = {v["name"]: v["digest"] for v in failed["details"]["views"]}
    assert {n for n in digests if digests[n] != after[n]} == {"installed_pack"}
    # Re-exported by this release: every stored field is what 0.1 exported.
    *mine, _trailer = [
        json.loads(x) for x in _export(engine_url, tmp_path / "again.jsonl").splitlines()
    ]
    theirs = [json.loads(x) for x in export.read_bytes().splitlines()]
    fields = ("position", "aggregate_id", "version", "topic", "event_id", "chain", "state")
    assert [{k: m[k] for k in fields} for m in mine] == [{k: t[k] for k in fields} for t in theirs]


# -- refusals: nothing committed -----------------------------------------------------------


@pytest.fixture(scope="module")
def golden_lines(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """The golden log as this release exports it (with state_b64), line by line."""
    folder = tmp_path_factory.mktemp("golden-export")
    url = f"sqlite:///{folder / 'store.db'}"
    _init(url)
    code, out = _import(url, GOLDEN / "export-v0.jsonl", "--legacy-no-trailer")
    assert code == 0, out
    return _export(url, folder / "export.jsonl").splitlines(keepends=True)


def _doc(lines: list[bytes], number: int) -> dict[str, Any]:
    return dict(json.loads(lines[number - 1]))


def _put(lines: list[bytes], number: int, doc: dict[str, Any]) -> None:
    lines[number - 1] = json.dumps(doc).encode() + b"\n"


def _rehash(lines: list[bytes], number: int, doc: dict[str, Any]) -> None:
    """Write ``doc`` at line ``number`` with its event id and chain recomputed, as a
    forger who knows the format would (the line's bytes then verify)."""
    previous = bytes.fromhex(_doc(lines, number - 1)["chain"]) if number > 1 else ZERO_CHAIN
    eid = event_id(
        UUID(doc["aggregate_id"]).bytes,
        doc["version"],
        doc["topic"].encode(),
        base64.b64decode(doc["state_b64"]),
    )
    _put(lines, number, {**doc, "event_id": eid.hex(), "chain": next_chain(previous, eid).hex()})


def _state_byte(lines: list[bytes], n: int) -> None:
    doc = _doc(lines, n)
    state = bytearray(base64.b64decode(doc["state_b64"]))
    state[state.index(b'"') + 1] ^= 0x01  # first key's first letter: still JSON
    _put(lines, n, {**doc, "state_b64": base64.b64encode(bytes(state)).decode()})


def _chain(lines: list[bytes], n: int) -> None:
    doc = _doc(lines, n)
    _put(lines, n, {**doc, "chain": hashlib.sha256(b"forged").hexdigest()})


def _gap(lines: list[bytes], n: int) -> None:
    del lines[n - 1]


def _malformed(lines: list[bytes], n: int) -> None:
    lines[n - 1] = lines[n - 1][:25] + b"\n"


def _missing(lines: list[bytes], n: int) -> None:
    doc = _doc(lines, n)
    del doc["event_id"]
    _put(lines, n, doc)


def _ill_typed(lines: list[bytes], n: int) -> None:
    doc = _doc(lines, n)
    _put(lines, n, {**doc, "version": str(doc["version"])})


def _upper_uuid(lines: list[bytes], n: int) -> None:
    doc = _doc(lines, n)
    _put(lines, n, {**doc, "aggregate_id": doc["aggregate_id"].upper()})  # same 16 bytes


def _not_base64(lines: list[bytes], n: int) -> None:
    _put(lines, n, {**_doc(lines, n), "state_b64": "not base64!"})


def _unknown_type(lines: list[bytes], n: int) -> None:
    _rehash(lines, n, {**_doc(lines, n), "topic": "binding.exploded@1"})


def _edited_label(lines: list[bytes], n: int) -> None:
    doc = _doc(lines, n)
    _put(lines, n, {**doc, "state": {**doc["state"], "audience_id": "someone-else"}})


def _repeated_version(lines: list[bytes], n: int) -> None:
    _rehash(lines, n, {**_doc(lines, n), "version": 1})  # the aggregate is at a later version


Tamper = Callable[[list[bytes], int], None]
#: tamper -> (exit code, error, details that must be reported exactly)
REFUSALS: dict[str, tuple[Tamper, int, str, dict[str, Any]]] = {
    "state_byte": (_state_byte, 6, "INTEGRITY", {"check": "event_id", "position": 40}),
    "chain": (_chain, 6, "INTEGRITY", {"check": "chain", "position": 40}),
    "position_gap": (_gap, 6, "INTEGRITY", {"check": "position", "position": 40}),
    "unknown_type": (_unknown_type, 6, "INTEGRITY", {"check": "type", "position": 40}),
    "edited_state_field": (_edited_label, 6, "INTEGRITY", {"check": "state", "position": 40}),
    "repeated_version": (_repeated_version, 6, "INTEGRITY", {"check": "version", "position": 40}),
    "malformed": (_malformed, 3, "INVALID", {"field": "line"}),
    "missing_field": (_missing, 3, "INVALID", {"field": "event_id"}),
    "ill_typed_field": (_ill_typed, 3, "INVALID", {"field": "version"}),
    "bad_base64": (_not_base64, 3, "INVALID", {"field": "state_b64"}),
    "non_canonical_uuid": (_upper_uuid, 3, "INVALID", {"field": "aggregate_id"}),
}


def test_r22_r23_a_bad_line_is_refused_naming_it_and_nothing_is_committed(
    engine_url: str, tmp_path: Path, golden_lines: list[bytes]
) -> None:
    """Every refusal against one target: each must leave it exactly as it was (empty),
    or the next refusal would find a store that is not empty."""
    assert _doc(golden_lines, TAMPERED_LINE)["position"] == TAMPERED_LINE
    assert _doc(golden_lines, TAMPERED_LINE)["type"] == "binding.granted"  # has audience_id
    _init(engine_url)
    before = _tables(engine_url)
    for kind, (tamper, exit_code, error, details) in sorted(REFUSALS.items()):
        lines = list(golden_lines)
        tamper(lines, TAMPERED_LINE)
        path = tmp_path / f"{kind}.jsonl"
        path.write_bytes(b"".join(lines))
        code, out = _import(engine_url, path)
        assert (code, out["error"]) == (exit_code, error), (kind, out)
        assert out["details"]["line"] == TAMPERED_LINE, (kind, out)
        assert {k: out["details"][k] for k in details} == details, (kind, out)
        assert out["message"].startswith(f"line {TAMPERED_LINE}"), (kind, out)
        _is_empty(engine_url)
        assert _tables(engine_url) == before, kind  # nothing written: no row, view or head


def test_r22_a_bad_line_past_the_first_batch_still_commits_nothing(
    engine_url: str, tmp_path: Path, golden_lines: list[bytes]
) -> None:
    """Rows of earlier batches were already sent to the engine: the one transaction
    takes them back too."""
    lines = list(golden_lines)
    _chain(lines, 75)
    path = tmp_path / "tampered.jsonl"
    path.write_bytes(b"".join(lines))
    with open_store(engine_url) as store:
        store.init()
        with pytest.raises(IntegrityFailure) as caught, path.open("rb") as handle:
            import_jsonl(store.ledger, handle, batch=10)
    assert caught.value.details == {"line": 75, "position": 75, "check": "chain"}
    _is_empty(engine_url)


def test_r23_import_refuses_a_store_that_is_not_empty_and_writes_nothing(
    engine_url: str, tmp_path: Path, golden_lines: list[bytes]
) -> None:
    path = tmp_path / "export.jsonl"
    path.write_bytes(b"".join(golden_lines))
    _init(engine_url)
    assert _import(engine_url, path)[0] == 0
    before = _tables(engine_url)
    code, out = _import(engine_url, path)
    assert (code, out["error"], out["details"]) == (
        3,
        "INVALID",
        {"field": "db", "head_position": 75},
    ), out
    assert _tables(engine_url) == before


def test_r23_import_needs_an_initialized_store(tmp_path: Path, golden_lines: list[bytes]) -> None:
    path = tmp_path / "export.jsonl"
    path.write_bytes(b"".join(golden_lines))
    url = f"sqlite:///{tmp_path / 'never-initialized.db'}"
    code, out = _import(url, path)
    assert (code, out["error"], out["details"]["field"]) == (3, "INVALID", "db"), out
    assert not (tmp_path / "never-initialized.db").exists()
    code, out = cli_json("--db", sqlite_of(tmp_path), "import", "--jsonl", str(tmp_path / "nope"))
    assert (code, out["error"], out["details"]) == (3, "INVALID", {"field": "file"}), out


def sqlite_of(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'initialized.db'}"
    _init(url)
    return url


def test_r23_import_reads_standard_input_and_the_api_takes_an_open_file(
    tmp_path: Path, golden_lines: list[bytes]
) -> None:
    data = b"".join(golden_lines)
    url = f"sqlite:///{tmp_path / 'stdin.db'}"
    _init(url)
    proc = subprocess.run(
        [str(SCRIPT), "--db", url, "import", "--jsonl", "-", "--workers", "1", "--json"],
        input=data,
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    piped = json.loads(proc.stdout)
    assert (piped["imported"], piped["root"]) == (75, EXPECTED["audit_verify"]["root"])
    other = f"sqlite:///{tmp_path / 'api.db'}"
    with open_store(other) as store:
        store.init()
        result = store.import_jsonl(io.BytesIO(data), workers=1)
    assert {k: v for k, v in result.items() if k != "origin"} == {
        k: v for k, v in piped.items() if k != "origin"
    }
    assert _export(other, tmp_path / "a.jsonl") == _export(url, tmp_path / "b.jsonl") == data


def test_r23_import_refuses_devices_directories_and_endless_lines(tmp_path: Path) -> None:
    url = sqlite_of(tmp_path)
    before = _tables(url)
    for path, says in (("/dev/zero", "not a file or a pipe"), (str(tmp_path), "cannot read")):
        code, out = cli_json("--db", url, "import", "--jsonl", path)
        assert (code, out["error"], out["details"]) == (3, "INVALID", {"field": "file"}), out
        assert says in out["message"]
    endless = io.BytesIO(b"x" * 100)
    with pytest.raises(InvalidInput) as caught:
        list(read_lines(endless, name="stream", limit=64))
    assert caught.value.details == {"field": "line", "line": 1}
    _is_empty(url)
    assert _tables(url) == before


# -- the trailer: a backup cannot be cut short silently (issue 25.4) -------------------------


@pytest.fixture(scope="module")
def small_lines(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """A small real export (one pack installed), line by line, its trailer last."""
    folder = tmp_path_factory.mktemp("small-export")
    url = f"sqlite:///{folder / 'store.db'}"
    world = World(folder, url)
    try:
        world.apply(world.official("sales", world.commit("sales", 1)))
    finally:
        world.close()
    return _export(url, folder / "export.jsonl").splitlines(keepends=True)


Snapshot = tuple[dict[str, list[str]], bytes | None]


def _snapshot(url: str) -> Snapshot:
    """Every row of every table (the Merkle cache too) and, on SQLite, the file's bytes."""
    db = open_database(url, create=False)
    try:
        tables: dict[str, list[str]] = {}
        with db.read() as conn:
            for name in sorted(sa.inspect(conn).get_table_names()):
                rows = conn.execute(sa.text(f"SELECT * FROM {name}")).fetchall()
                tables[name] = sorted(repr(tuple(r)) for r in rows)
    finally:
        db.close()
    if not url.startswith("sqlite"):
        return tables, None
    path = Path(url.removeprefix("sqlite:///"))
    wal = path.with_name(path.name + "-wal")
    return tables, path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


def _refused(url: str, path: Path, *flags: str, before: Snapshot | None = None) -> dict[str, Any]:
    """Import ``path``: INTEGRITY (exit 6), and the target exactly as it was (``before``)."""
    before = before or _snapshot(url)
    code, out = _import(url, path, *flags)
    assert (code, out["error"]) == (6, "INTEGRITY"), out
    assert _snapshot(url) == before, out["message"]
    return dict(out)


def _trailer(lines: list[bytes]) -> dict[str, Any]:
    doc = _doc(lines, len(lines))
    assert doc["trailer"] == 1, doc
    return doc


def test_r23_an_export_cut_at_every_line_boundary_is_refused_and_nothing_is_written(
    engine_url: str, tmp_path: Path, small_lines: list[bytes]
) -> None:
    """Every prefix of an export is itself a well-formed log: only the trailer tells a
    backup cut short from a complete one. Each cut is refused naming the line where the
    trailer should be; the target stays byte for byte (SQLite) / row for row as it was."""
    events = len(small_lines) - 1
    assert 8 <= events <= 40 and _trailer(small_lines)["count"] == events
    _init(engine_url)
    before = _snapshot(engine_url)
    path = tmp_path / "cut.jsonl"
    path.write_bytes(b"".join(small_lines[:events]))  # the trailer lost: through the CLI
    out = _refused(engine_url, path, before=before)
    assert out["details"] == {"line": events + 1, "field": "trailer", "check": "trailer"}, out
    assert "--legacy-no-trailer" in out["message"]
    with open_store(engine_url) as store:  # every other cut (the empty file: its own test)
        for kept in range(1, events + 1):
            path.write_bytes(b"".join(small_lines[:kept]))
            with pytest.raises(IntegrityFailure) as caught:
                store.import_jsonl(path, workers=1)
            assert caught.value.details == {
                "line": kept + 1,
                "field": "trailer",
                "check": "trailer",
            }
            assert caught.value.message.startswith(
                f"line {kept + 1}: no trailer: the file ends after line {kept} (position {kept})"
            ), caught.value.message
            assert _snapshot(engine_url) == before, kept
            with pytest.raises(ref.Mismatch, match="no trailer"):  # the outside verifier agrees
                ref.verify_export([x.decode() for x in small_lines[:kept]])
    path.write_bytes(b"".join(small_lines)[:-10])  # cut inside the trailer: not JSON
    code, out = _import(engine_url, path)
    assert (code, out["error"], out["details"]) == (
        3,
        "INVALID",
        {"field": "line", "line": events + 1},
    ), out
    assert _snapshot(engine_url) == before
    path.write_bytes(b"".join(small_lines))  # the whole file imports
    code, out = _import(engine_url, path)
    assert (code, out["imported"], out["head_position"]) == (0, events, events), out


def test_r23_an_empty_file_is_refused_even_with_the_legacy_flag(
    engine_url: str, tmp_path: Path
) -> None:
    _init(engine_url)
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    for flags in ((), ("--legacy-no-trailer",)):
        out = _refused(engine_url, empty, *flags)
        assert out["details"] == {"line": 1, "field": "file", "check": "trailer"}, out
        assert out["message"].startswith("the file is empty: no events and no trailer"), out
    with open_store(engine_url) as store, pytest.raises(IntegrityFailure) as caught:
        store.import_jsonl(io.BytesIO(b""), workers=1)  # an empty stream (stdin) too
    assert caught.value.details == {"line": 1, "field": "file", "check": "trailer"}


def _set(key: str, value: object) -> Tamper:
    def tamper(lines: list[bytes], n: int) -> None:
        _put(lines, n, {**_doc(lines, n), key: value})

    return tamper


def _move_trailer_up(lines: list[bytes], n: int) -> None:
    lines.insert(n - 2, lines.pop())  # the trailer now precedes the last event line


def _second_trailer(lines: list[bytes], n: int) -> None:
    lines.append(lines[-1])


OTHER_ROOT = base64.b64encode(hashlib.sha256(b"another log").digest()).decode()
#: tamper of the trailer (line n = the trailer's) -> (line named, details, message fragment)
TRAILER_REFUSALS: dict[str, tuple[Tamper, int, dict[str, Any], str]] = {
    "wrong_count": (_set("count", 7), 0, {"field": "trailer.count"}, "trailer's count is 7"),
    "wrong_head_position": (
        _set("head_position", 99),
        0,
        {"field": "trailer.head_position"},
        "trailer's head_position is 99",
    ),
    "wrong_head_chain": (
        _set("head_chain", "ab" * 32),
        0,
        {"field": "trailer.head_chain"},
        "trailer's head_chain is " + "ab" * 32,
    ),
    "wrong_root": (_set("root", OTHER_ROOT), 0, {"field": "trailer.root"}, OTHER_ROOT),
    "says_damaged": (_set("damaged", 2), 0, {"field": "trailer.damaged"}, "2 row(s)"),
    "unknown_version": (
        _set("trailer", 3),  # 2 exists since R29: it counts checkpoint lines
        0,
        {"field": "trailer.trailer"},
        "trailer version 3 is not one this release reads",
    ),
    "not_last": (
        _move_trailer_up,
        0,
        {"field": "trailer", "trailer_line": -1},
        "an event line after the trailer at line",
    ),
    "two_trailers": (
        _second_trailer,
        1,
        {"field": "trailer", "trailer_line": 0},
        "a second trailer after the trailer at line",
    ),
}


def test_r23_a_trailer_that_differs_from_the_lines_or_is_misplaced_is_refused_naming_it(
    engine_url: str, tmp_path: Path, small_lines: list[bytes]
) -> None:
    """Each refusal names the trailer field and line; nothing is written (the next case
    would otherwise find a store that is not empty)."""
    trailer_line = len(small_lines)
    _init(engine_url)
    before = _snapshot(engine_url)
    for kind, (tamper, offset, details, says) in sorted(TRAILER_REFUSALS.items()):
        lines = list(small_lines)
        tamper(lines, trailer_line)
        path = tmp_path / f"{kind}.jsonl"
        path.write_bytes(b"".join(lines))
        out = _refused(engine_url, path, before=before)
        want = {k: trailer_line + v if k == "trailer_line" else v for k, v in details.items()}
        assert out["details"]["line"] == trailer_line + offset, (kind, out)
        assert {k: out["details"][k] for k in want} == want, (kind, out)
        assert out["details"]["check"] == "trailer", (kind, out)
        assert says in out["message"] and "nothing was imported" in out["message"], (kind, out)
    # --legacy-no-trailer only accepts a missing trailer: one that is there is still checked.
    lines = list(small_lines)
    _set("root", OTHER_ROOT)(lines, trailer_line)
    path = tmp_path / "legacy-flag.jsonl"
    path.write_bytes(b"".join(lines))
    out = _refused(engine_url, path, "--legacy-no-trailer")
    assert out["details"] == {"line": trailer_line, "field": "trailer.root", "check": "trailer"}


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("count", "5", "must be an integer between 0 and 2^63-1, found '5'"),
        ("count", -1, "must be an integer between 0 and 2^63-1, found -1"),
        ("head_chain", "AB" * 32, "is not 64 lowercase hex digits (32 bytes)"),
        ("root", "ab" * 32, "is not canonical padded base64 of 32 bytes (RFC 4648)"),
        ("root", 5, "must be a string or null, found 5"),
        ("extra", 1, "is not a trailer field"),
    ],
)
def test_r23_a_malformed_trailer_is_invalid_naming_its_field(
    sqlite_url: str, tmp_path: Path, small_lines: list[bytes], key: str, value: object, says: str
) -> None:
    lines = list(small_lines)
    _set(key, value)(lines, len(lines))
    path = tmp_path / "malformed.jsonl"
    path.write_bytes(b"".join(lines))
    _init(sqlite_url)
    before = _snapshot(sqlite_url)
    code, out = _import(sqlite_url, path)
    assert (code, out["error"], out["details"]) == (
        3,
        "INVALID",
        {"field": f"trailer.{key}", "line": len(lines)},
    ), out
    assert out["message"] == f"line {len(lines)}: trailer field {key} {says}"
    assert _snapshot(sqlite_url) == before


def test_r23_the_export_of_an_empty_store_is_its_trailer_alone_and_imports(
    engine_url: str, sibling_url: str, tmp_path: Path
) -> None:
    _init(engine_url)
    data = _export(engine_url, tmp_path / "empty-store.jsonl")
    code, checkpoint = cli_json("--db", engine_url, "audit", "checkpoint")
    assert code == 0
    assert json.loads(data) == {
        "trailer": 1,
        "count": 0,
        "head_position": 0,
        "head_chain": ZERO_CHAIN.hex(),
        "root": checkpoint["root"],  # the same Merkle root definition: SHA-256("")
        "damaged": 0,
    }
    assert data.count(b"\n") == 1
    _init(sibling_url)
    code, out = _import(sibling_url, tmp_path / "empty-store.jsonl")
    assert (code, out["imported"], out["root"]) == (0, 0, checkpoint["root"]), out


def test_r23_the_trailer_states_the_checkpoint_root_and_head_of_the_exported_store(
    tmp_path: Path, small_lines: list[bytes]
) -> None:
    """The trailer's root is the checkpoint's (one Merkle definition), its head the log's."""
    url = sqlite_of(tmp_path)
    path = tmp_path / "small.jsonl"
    path.write_bytes(b"".join(small_lines))
    assert _import(url, path)[0] == 0
    trailer = _trailer(small_lines)
    code, checkpoint = cli_json("--db", url, "audit", "checkpoint")
    assert code == 0, checkpoint
    code, log = cli_json("--db", url, "log", "--from", "1", "--limit", "1")
    assert code == 0, log
    assert (trailer["count"], trailer["root"]) == (checkpoint["size"], checkpoint["root"])
    assert (trailer["head_position"], trailer["head_chain"]) == (
        log["head"]["position"],
        log["head"]["chain"],
    )
    verified = ref.verify_export([x.decode() for x in small_lines])
    assert base64.b64encode(verified.root).decode() == trailer["root"]
