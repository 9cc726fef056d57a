"""The public Python API: the README's example runs, and the API mirrors the CLI one to one."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from domain.errors import IntegrityFailure, Missing, UsageError
from ledger.api import Store, open_store
from ledger.cli import cli
from tests.support.cli_inprocess import cli_json

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@contextlib.contextmanager
def demo_folder(tmp_path: Path) -> Iterator[Path]:
    """The demo's inputs (pack repository, release 1, local pack) as the working directory."""
    subprocess.run(
        ["sh", str(EXAMPLES / "make-repo.sh"), str(tmp_path / "repos" / "catalog")],
        capture_output=True,
        check=True,
    )
    shutil.copy(EXAMPLES / "release-1.json", tmp_path / "release.json")
    shutil.copytree(EXAMPLES / "packs", tmp_path / "packs")
    before = Path.cwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(before)


def readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Python API") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "README's Python API section has no example"
    return match.group(1)


def test_r16_readme_python_example_runs_and_publishes(tmp_path: Path) -> None:
    with demo_folder(tmp_path):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(readme_example(), "README.md", "exec"), {})
        lines = out.getvalue().splitlines()
        code, view = cli_json("--db", "sqlite:///catalog.db", "view", "integration:erp-sync")
        assert code == 0
        code, audit = cli_json("--db", "sqlite:///catalog.db", "audit", "verify")
        assert code == 0
    revision, digest = lines[0].split()
    assert (int(revision), digest) == (view["revision"], view["content_digest"])
    assert lines[1].split()[0] == view["audience_digest"]
    assert lines[2] == f"True {audit['size']}"


def test_r16_every_cli_command_has_its_api_method() -> None:
    """sqlite-utils style: the CLI's commands and the API's methods are the same set."""
    names: set[str] = set()
    for name, command in cli.commands.items():
        if isinstance(command, click.Group):
            names |= {f"{name} {sub}" for sub in command.commands}
        else:
            names.add(name)
    mirror = {
        "init": Store.init,
        "doctor": Store.doctor,
        "migrate": Store.migrate,
        "lease status": Store.lease_status,
        "lease break": Store.lease_break,
        "log": Store.log,
        "status": Store.status,
        "apply": Store.apply,
        "publish": Store.publish,
        "rollback": Store.rollback,
        "import-legacy": Store.import_legacy,
        "credentials issue": Store.credentials_issue,
        "credentials revoke": Store.credentials_revoke,
        "credentials list": Store.credentials_list,
        "view": Store.view,
        "diff": Store.diff,
        "history": Store.history,
        "export": Store.export,
        "import": Store.import_jsonl,
        "audit verify": Store.audit,
        "audit checkpoint": Store.checkpoint,
        "audit prove": Store.prove,
        "cosign": Store.cosign,
        "audit origin": Store.origin,
        "audit rotate-key": Store.rotate_key,
        "audit resume-check": Store.resume_check,
        "projections status": Store.projections_status,
        "projections rebuild": Store.rebuild,
        "projections verify": Store.verify_projections,
        "projections catch-up": Store.catch_up,
    }
    # Commands without a store (or that run the server) are module functions / CLI only.
    # The witness runs on its own file, never on a store (issue 28 item 5).
    standalone = {"pack hash", "audit keygen", "audit verify-proof", "schema dump", "serve"}
    standalone |= {"witness keygen", "witness serve", "witness evidence", "witness status"}
    assert names == set(mirror) | standalone


def test_r18_api_results_are_what_the_cli_prints(tmp_path: Path) -> None:
    with demo_folder(tmp_path):
        url = "sqlite:///catalog.db"
        with open_store(url) as store:
            store.init()
            applied = store.apply("release.json")
            assert cli_json("--db", url, "status") == (0, json.loads(json.dumps(store.status())))
            assert cli_json("--db", url, "history", "--pack", "sales") == (
                0,
                json.loads(json.dumps(store.history("sales"))),
            )
            live = store.view("app:crm-main")
            assert not isinstance(live, dict)
            assert cli_json("--db", url, "view", "app:crm-main") == (0, live.to_json())
            past = store.view("app:crm-main", at_revision=1)
            assert cli_json("--db", url, "view", "app:crm-main", "--at-revision", "1") == (0, past)
            again = store.apply("release.json", command_id=applied["command_id"])
            assert again == {**applied, "replayed": True}


def test_r19_api_raises_the_cli_typed_errors(tmp_path: Path) -> None:
    with demo_folder(tmp_path), open_store("sqlite:///catalog.db") as store:
        store.init()
        store.apply("release.json")
        with pytest.raises(Missing):
            store.view("app:nobody")
        with pytest.raises(UsageError):
            store.view("app:crm-main", min_revision=1, at_revision=1)
        assert store.audit().ok is True
    path = tmp_path / "catalog.db"
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("UPDATE ledger_events SET state = CAST('{}' AS BLOB) WHERE position = 5")
    conn.commit()
    conn.close()
    with open_store(f"sqlite:///{path}") as store, pytest.raises(IntegrityFailure) as info:
        store.audit()
    assert info.value.details["first_problem"]["position"] == 5
