"""The README's main job: the example releases are reproducible and the demo runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def test_r5_example_repository_reproduces_the_commits_the_manifests_name(tmp_path: Path) -> None:
    out = subprocess.run(
        ["sh", str(EXAMPLES / "make-repo.sh"), str(tmp_path / "repo")],
        capture_output=True,
        text=True,
        check=True,
    )
    commits = out.stdout.split()
    for release, commit in zip(("release-1.json", "release-2.json"), commits, strict=True):
        manifest = json.loads((EXAMPLES / release).read_text())
        revisions = {p["source"].get("revision") for p in manifest["packs"]} - {None}
        assert revisions == {commit}


def test_r8_demo_script_applies_both_releases_on_sqlite(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        DEMO_DIR=str(tmp_path / "demo"),
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    )
    env.pop("CATALOG_LEDGER_DB", None)
    out = subprocess.run(
        ["sh", str(EXAMPLES / "demo.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert "sales: advance" in out.stdout
    assert "no changes" in out.stdout
    assert (tmp_path / "demo" / "catalog.db").exists()
