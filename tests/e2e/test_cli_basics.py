"""CLI basics: init/log on both engines, exit codes, the --json error shape, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ledger.log.application import LedgerApplication
from ledger.log.db import open_database
from tests.support.cli_inprocess import cli
from tests.support.cli_support import run_cli
from tests.support.notes import Note


def test_r22_init_is_idempotent_and_log_shows_chain(engine_url: str, tmp_path: Path) -> None:
    """In-process (``tests.support.cli_inprocess``): init's and log's output is the point;
    the tests below keep the real script for its exit codes and start-up."""
    first = cli("--db", engine_url, "init", "--json")
    assert first.code == 0, first.stdout + first.stderr
    assert first.json()["created"] is True
    assert first.json()["schema_version"] == 3
    again = cli("--db", engine_url, "init", "--json")
    assert again.code == 0 and again.json()["created"] is False

    db = open_database(engine_url)
    app = LedgerApplication(db)
    note = Note(name="n")
    note.write(text="t")
    app.save(note)
    db.close()

    shown = cli("--db", engine_url, "log", "--json")
    assert shown.code == 0
    doc = shown.json()
    assert doc["head"]["position"] == 2
    assert [e["position"] for e in doc["events"]] == [1, 2]
    assert doc["events"][1]["chain"] == doc["head"]["chain"]
    assert doc["events"][0]["aggregate_id"] == str(note.id)
    assert len(bytes.fromhex(doc["events"][0]["event_id"])) == 32

    window = cli("--db", engine_url, "log", "--from", "2", "--limit", "1", "--json").json()
    assert [e["position"] for e in window["events"]] == [2]
    human = cli("--db", engine_url, "log")
    assert human.code == 0 and "test.note_written@1" in human.stdout


def test_default_db_is_catalog_db_in_working_directory(tmp_path: Path) -> None:
    result = run_cli("init", cwd=tmp_path)
    assert result.code == 0
    assert (tmp_path / "catalog.db").exists()
    via_env = run_cli(
        "init",
        "--json",
        cwd=tmp_path,
        env={"CATALOG_LEDGER_DB": f"sqlite:///{tmp_path / 'env.db'}"},
    )
    assert via_env.code == 0 and (tmp_path / "env.db").exists()


@pytest.mark.parametrize(
    ("url", "code", "error"),
    [
        ("mysql+pymysql://root@127.0.0.1:1/test", 1, "UNAVAILABLE"),
        ("not a url at all", 3, "INVALID"),
        ("postgresql://u@localhost/x", 3, "INVALID"),
        ("sqlite://", 3, "INVALID"),
        ("sqlite:////proc/catalog.db", 1, "UNAVAILABLE"),
        ("sqlite:////no/such/dir/catalog.db", 1, "UNAVAILABLE"),
    ],
)
def test_unusable_store_gives_typed_error_without_traceback(
    url: str, code: int, error: str
) -> None:
    result = run_cli("--db", url, "init", "--json")
    assert result.code == code
    doc = result.json()
    assert doc["error"] == error
    assert set(doc) == {"error", "message", "details"}
    human = run_cli("--db", url, "init")
    assert human.code == code
    assert f"error [{error}]" in human.stderr


def test_non_database_file_is_invalid_input(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("this is not a database\n" * 100)
    result = run_cli("--db", f"sqlite:///{path}", "log", "--json")
    assert result.code == 3
    assert result.json()["details"]["field"] == "db"
    assert path.read_text().startswith("this is not a database")


def test_log_on_uninitialized_store_says_run_init(tmp_path: Path) -> None:
    result = run_cli("--db", f"sqlite:///{tmp_path / 'fresh.db'}", "log", "--json")
    assert result.code == 3
    assert "catalog-ledger init" in result.json()["message"]


@pytest.mark.parametrize(
    "args",
    [
        ["log", "--from", "0", "--json"],
        ["log", "--limit", "x", "--json"],
        ["nosuch", "--json"],
        ["log", "--json", "--bogus"],
    ],
)
def test_usage_errors_exit_2_with_json_shape(args: list[str], tmp_path: Path) -> None:
    result = run_cli("--db", f"sqlite:///{tmp_path / 'x.db'}", *args)
    assert result.code == 2
    assert result.json()["error"] == "USAGE"


def test_help_everywhere() -> None:
    for args in (["--help"], ["init", "--help"], ["log", "--help"], ["schema", "dump", "--help"]):
        result = run_cli(*args)
        assert result.code == 0 and "Usage:" in result.stdout


# -- issue 25.7: a CLI that starts fast, guarded by what it imports (not by a clock) ------

#: Never imported by `import ledger.cli`, `--help` or `--version`: the command tree is
#: declared with click alone and each command imports what it uses when it runs.
NOT_AT_START = (
    "sqlalchemy",
    "fastapi",
    "uvicorn",
    "starlette",
    "eventsourcing",
    "pymysql",
    "pydantic",
    "prometheus_client",
    "cryptography",
    "tqdm",
    "ledger.api",
    "ledger.log.db",
    "ledger.http.app",
    # serve's defaults come from ledger.http.settings (stdlib only), not ledger.http.limits
    "ledger.http.limits",
    "asyncio",
    "ssl",
    "ledger.store",
    "ledger.commands",
    "ledger.audit",
    "projections",
    "publisher",
)
#: Never imported by `status` or `view` on a SQLite store: the HTTP server, the audit
#: and export code, the commands (apply, publish), signing, the MySQL driver and dialect,
#: input validation (pydantic: reads validate no input document) and the publisher.
NOT_FOR_READS = (
    "fastapi",
    "uvicorn",
    "starlette",
    "prometheus_client",
    "ledger.http.app",
    "ledger.http.limits",
    "ledger.audit",
    "ledger.commands.service",
    "ledger.commands.apply",
    "domain.notes",
    "pymysql",
    "sqlalchemy.dialects.mysql",
    "cryptography",
    "pydantic",
    "domain.content_schema",
    "domain.manifest",
    "publisher",
    "tqdm",
)

_PROBE = """
import contextlib, io, json, sys
from ledger.cli import run
runs = []
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run(argv)
    runs.append({"argv": argv, "code": code, "stdout": out.getvalue()})
print(json.dumps({"runs": runs, "modules": sorted(sys.modules)}))
"""


def _probe(*commands: list[str], cwd: Path) -> tuple[list[dict[str, Any]], set[str]]:
    """Run ``commands`` in one fresh interpreter (this test process has imported
    everything already); their results and every module that process imported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CATALOG_LEDGER_")}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(list(commands))],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.splitlines()[-1])
    return found["runs"], set(found["modules"])


def _loaded(modules: set[str], names: Sequence[str]) -> list[str]:
    return sorted(n for n in names if n in modules or any(m.startswith(n + ".") for m in modules))


def test_r25_cli_start_imports_no_database_server_or_framework(tmp_path: Path) -> None:
    """Issue 25.7: `--version` and `--help` (of the group and of `serve`, whose option
    defaults come from the server's settings) load none of the heavy modules."""
    runs, modules = _probe(
        ["--version"], ["--help"], ["serve", "--help"], ["status", "--help"], cwd=tmp_path
    )
    assert [r["code"] for r in runs] == [0, 0, 0, 0]
    assert runs[0]["stdout"].startswith("catalog-ledger, version ")
    assert "--max-waiters INTEGER RANGE" in runs[2]["stdout"]
    assert "[default: 1000; x>=0]" in runs[2]["stdout"]
    assert _loaded(modules, NOT_AT_START) == []
    assert "click" in modules  # the probe saw the CLI's own imports


def test_r25_cli_help_lists_every_command_with_its_help() -> None:
    """Lazy imports keep the command tree declared: `--help` names every command of the
    group, each with the first line of its help, and every group DESIGN lists."""
    from ledger.cli import cli as group

    result = run_cli("--help")
    assert result.code == 0
    lines = result.stdout.splitlines()
    assert set(group.commands) >= {
        "init", "doctor", "migrate", "apply", "publish", "status", "view", "serve",
        "credentials", "lease", "projections", "audit", "history", "export", "log",
        "schema", "pack",
    }  # fmt: skip
    for name, command in group.commands.items():
        short = command.get_short_help_str(limit=45)
        assert short, name
        assert any(line.split()[:1] == [name] and short[:20] in line for line in lines), (
            name,
            short,
        )


def test_r25_status_and_view_on_sqlite_import_no_server_audit_or_commands(
    tmp_path: Path,
) -> None:
    """Issue 25.7: `status` and `view` on a SQLite store answer without importing the
    HTTP server, the audit and export modules, the commands, signing or PyMySQL."""
    from tests.support.gitrepo import push_closure
    from tests.support.lifecycle_support import World

    world = World(tmp_path, f"sqlite:///{tmp_path / 'catalog.db'}")
    try:
        commit = world.commit("sales", 1)
        bindings = push_closure("integration:erp", "sales")
        world.service.apply(world.manifest([world.official("sales", commit)], bindings))
    finally:
        world.close()

    runs, modules = _probe(
        ["--db", world.url, "status", "--json"],
        ["--db", world.url, "view", "integration:erp", "--json"],
        cwd=tmp_path,
    )

    assert [r["code"] for r in runs] == [0, 0]
    status, view = (json.loads(r["stdout"]) for r in runs)
    assert [p["pack"] for p in status["packs"]] == ["sales"]
    assert status["packs"][0]["status"] == "active"
    assert (view["audience"], view["revision"]) == ("integration:erp", 1)
    assert {f["pack"] for f in view["facts"]} == {"sales"}
    assert _loaded(modules, NOT_FOR_READS) == []
    # No command machinery: of ledger.commands, at most its result types.
    assert {m for m in modules if m.startswith("ledger.commands.")} <= {"ledger.commands.results"}
    assert "sqlalchemy" in modules  # the probe really read the store


_GC_PROBE = """
import contextlib, gc, io, json, sys
from ledger.cli import app, run
mode, url = sys.argv[1], sys.argv[2]
out = io.StringIO()
with contextlib.redirect_stdout(out):
    if mode == "console":
        sys.argv = ["catalog-ledger", "--db", url, "status", "--json"]
        try:
            app.main()
        except SystemExit as exc:
            code = exc.code
    else:
        code = run(["--db", url, "status", "--json"])
print(json.dumps({"code": code, "status": json.loads(out.getvalue()),
                  "enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
"""


def test_r25_console_script_imports_the_store_without_gc_then_collects_again(
    tmp_path: Path,
) -> None:
    """Issue 25.7: the console script imports the store's modules with the cyclic
    collector off and freezes what they built (collections in the middle of an import
    find no garbage); after that the collector runs again, so a long command (serve,
    apply, import) collects as always. An in-process caller of ``run`` keeps its
    collector as it was: nothing is frozen."""
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    assert run_cli("--db", url, "init").code == 0
    found = {}
    for mode in ("console", "run"):
        proc = subprocess.run(
            [sys.executable, "-c", _GC_PROBE, mode, url],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if not k.startswith("CATALOG_LEDGER_")},
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        found[mode] = json.loads(proc.stdout.splitlines()[-1])
    for mode in ("console", "run"):
        assert found[mode]["code"] == 0
        assert found[mode]["status"] == {"head": found[mode]["status"]["head"], "packs": []}
        assert found[mode]["enabled"] is True
    assert found["console"]["frozen"] > 1000  # the store's modules, frozen once imported
    assert found["run"]["frozen"] == 0
