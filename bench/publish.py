"""Publish wall time and peak memory as the catalog grows (1x, 4x, 16x a base size).

Base: 250 packs x 20 components, 1,000 audiences, 10,000 bindings. For each
scale a fresh SQLite store gets the packs (one git commit) and the bindings
through `apply --no-publish`; then `catalog-ledger publish` runs in a child
process, whose wall time and peak RSS are measured. Printed next to each
figure: the ratio to the 1x run and the ratio an n log n algorithm would have,
so super-linear growth is visible.

Usage:
  python -m bench.publish [--scales 1,4,16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ledger.commands.service import CommandService
from ledger.log.db import open_database
from ledger.store.init import init_store
from ledger.store.runtime import Ledger
from tests.gitrepo import Repo

BASE_PACKS, COMPONENTS, BASE_AUDIENCES, PER_AUDIENCE = 250, 20, 1000, 10
CLI = str(Path(sys.executable).with_name("catalog-ledger"))


def pack_document(n: int) -> dict[str, Any]:
    components = []
    for c in range(COMPONENTS):
        comp: dict[str, Any] = {
            "kind": "callout_profile" if c % 2 == 0 else "push_contract",
            "key": f"p{n}.c{c}",
            "payload": {"pack": n, "component": c, "url": f"https://svc-{n}.example/{c}"},
        }
        if c % 2 == 1:  # each contract requires the profile before it
            comp["requires"] = [{"kind": "callout_profile", "key": f"p{n}.c{c - 1}"}]
        if c % 4 == 0:
            comp["credential_sets"] = ["prod", "test"]
        components.append(comp)
    return {"name": f"pack-{n:05d}", "category": "app", "components": components}


def setup(folder: Path, scale: int) -> tuple[str, dict[str, int]]:
    """A fresh SQLite store in ``folder`` with the scaled catalog applied, unpublished."""
    url = f"sqlite:///{folder / 'catalog.db'}"
    return url, setup_store(folder, url, scale)


def setup_store(folder: Path, url: str, scale: int) -> dict[str, int]:
    """Apply the scaled packs and bindings to the store at ``url`` (not published)."""
    packs, audiences = BASE_PACKS * scale, BASE_AUDIENCES * scale
    repo = Repo(folder / "repo")
    files = {f"pack-{n:05d}/pack.json": json.dumps(pack_document(n)).encode() for n in range(packs)}
    commit = repo.commit(files)
    bindings = []
    for a in range(audiences):
        n = a % packs
        for c in range(PER_AUDIENCE):
            binding = {
                "audience": f"integration:workload-{a:06d}",
                "pack": f"pack-{n:05d}",
                "kind": "callout_profile" if c % 2 == 0 else "push_contract",
                "key": f"p{n}.c{c}",
            }
            if c % 4 == 0:
                binding["credential_set"] = "prod"
            bindings.append(binding)
    manifest = {
        "packs": [
            {
                "name": f"pack-{n:05d}",
                "source": {
                    "kind": "official_repo",
                    "repo": str(repo.path),
                    "revision": commit,
                    "path": f"pack-{n:05d}/pack.json",
                },
            }
            for n in range(packs)
        ],
        "bindings": bindings,
    }
    path = folder / "release.json"
    path.write_text(json.dumps(manifest))
    db = open_database(url)
    init_store(db)
    CommandService(Ledger(db)).apply(path, publish=False)
    db.close()
    return {
        "packs": packs,
        "components": packs * COMPONENTS,
        "audiences": audiences,
        "bindings": len(bindings),
    }


# The benchmark process is large after setup, and a forked child's peak RSS counts the
# parent's pages it inherited before exec; a tiny wrapper process starts the CLI instead.
_WRAPPER = """
import json, os, subprocess, sys, time
started = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
_, status, usage = os.wait4(proc.pid, 0)
wall = time.perf_counter() - started
print(json.dumps({"wall": wall, "maxrss_kib": usage.ru_maxrss, "status": status,
                  "stdout": proc.stdout.read().decode(), "stderr": proc.stderr.read().decode()}))
"""


def timed_publish(url: str) -> tuple[float, float, dict[str, Any]]:
    """Wall seconds and peak RSS (MiB) of `catalog-ledger publish` in a child process."""
    out = subprocess.run(
        [sys.executable, "-c", _WRAPPER, CLI, "--db", url, "publish", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(out.stdout)
    if report["status"] != 0:
        raise SystemExit(f"publish failed: {report['stdout']} {report['stderr']}")
    return report["wall"], report["maxrss_kib"] / 1024, json.loads(report["stdout"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scales", default="1,4,16")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(
        "publish benchmark (SQLite, WAL, synchronous=FULL); child-process wall time and peak "
        f"RSS, median of {args.repeat}"
    )
    print(
        f"{'scale':>5} {'packs':>6} {'facts':>7} {'audiences':>9} {'bindings':>8} "
        f"{'wall s':>7} {'x 1x':>6} {'nlogn x':>7} {'peak MiB':>8}"
    )
    base_wall: float | None = None
    base_n = BASE_AUDIENCES * PER_AUDIENCE
    for scale in (int(s) for s in args.scales.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            url, sizes = setup(folder, scale)
            unpublished = folder / "catalog.db"
            walls, peaks = [], []
            doc: dict[str, Any] = {}
            for attempt in range(args.repeat):
                # Each run publishes the same unpublished state from a fresh copy.
                copy = folder / f"run-{attempt}.db"
                shutil.copyfile(unpublished, copy)
                wall, peak, doc = timed_publish(f"sqlite:///{copy}")
                assert not doc["noop"], doc
                walls.append(wall)
                peaks.append(peak)
                copy.unlink()
            wall, peak = statistics.median(walls), statistics.median(peaks)
            n = sizes["bindings"]
            base_wall = base_wall or wall
            nlogn = (n * math.log(n)) / (base_n * math.log(base_n))
            print(
                f"{scale:>5} {sizes['packs']:>6} {doc['counts']['facts']:>7} "
                f"{sizes['audiences']:>9} {n:>8} {wall:>7.2f} {wall / base_wall:>6.1f} "
                f"{nlogn:>7.1f} {peak:>8.0f}"
            )
            sys.stdout.flush()
            del url


if __name__ == "__main__":
    main()
