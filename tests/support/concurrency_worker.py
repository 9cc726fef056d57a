"""One racing writer for the concurrency campaign (run as a child process).

    python -m tests.support.concurrency_worker URL WORKDIR SECONDS SEED [--rebuild]

Until the deadline: apply a random manifest, publish, or (with --rebuild)
rebuild projections. Lost races are expected (CONFLICT, a busy lease); every
other failure is reported. Prints one JSON summary line.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from domain.errors import Conflict, LedgerError
from ledger.commands.service import CommandService
from ledger.log.db import open_database
from ledger.store.rebuild import process_builder
from ledger.store.runtime import Ledger
from tests.support.gitrepo import Repo, manifest, official, push_pack

PACKS = ["p0", "p1", "p2", "p3"]


def _content(name: str, version: int) -> bytes:
    return push_pack(name, version, profile_payload={"v": version}, credential_sets=("prod",))


def build(workdir: Path, manifests: int = 8) -> list[Path]:
    """Deterministic repo and manifests (built once per workdir)."""
    index = workdir / "manifests.json"
    if index.exists():
        return [Path(p) for p in json.loads(index.read_text())]
    repo = Repo(workdir / "repo")
    commits = [repo.commit({f"{p}/pack.json": _content(p, v) for p in PACKS}) for v in (1, 2, 3)]
    rng = random.Random(42)
    paths = []
    for m in range(manifests):
        packs = [official(p, repo.path, rng.choice(commits), f"{p}/pack.json") for p in PACKS]
        bindings = []
        for a in range(rng.randint(1, 4)):
            pack = rng.choice(PACKS)
            for kind, key in (("push_contract", "Order.push"), ("callout_profile", "erp")):
                binding = {"audience": f"integration:w{a}", "pack": pack, "kind": kind, "key": key}
                if kind == "callout_profile":  # only the profile declares credential sets
                    binding["credential_set"] = "prod"
                bindings.append(binding)
        seen: set[tuple[str, ...]] = set()
        unique = []
        for b in bindings:
            ident = (b["audience"], b["pack"], b["kind"], b["key"])
            if ident not in seen:
                seen.add(ident)
                unique.append(b)
        paths.append(manifest(workdir / f"m{m}.json", packs, unique))
    index.write_text(json.dumps([str(p) for p in paths]))
    return paths


def main() -> None:
    url, workdir, seconds, seed = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    rebuild = "--rebuild" in sys.argv
    manifests = build(workdir)
    rng = random.Random(seed)
    db = open_database(url)
    ledger = Ledger(db)
    service = CommandService(ledger, lease_ttl=30.0, lease_wait=2.0)
    counts: dict[str, int] = {}
    errors: list[str] = []
    deadline = time.monotonic() + seconds

    def count(name: str) -> None:
        counts[name] = counts.get(name, 0) + 1

    while time.monotonic() < deadline:
        # Each writer's first action is an apply, so that however slowly a loaded machine
        # runs the race, it always applies (and publishes) something; then at random.
        action = (
            rng.choice(["apply", "apply", "apply", "publish"] + (["rebuild"] if rebuild else []))
            if counts
            else "apply"
        )
        try:
            if action == "apply":
                result: Any = service.apply(rng.choice(manifests))
                count("apply:noop" if result["noop"] else "apply:ok")
            elif action == "publish":
                result = service.publish()
                count("publish:noop" if result["noop"] else "publish:ok")
            else:
                ledger.runner.rebuild(db, builder=process_builder(url), workers=1)
                count("rebuild:ok")
        except Conflict:
            count(f"{action}:conflict")
        except LedgerError as exc:
            count(f"{action}:{exc.code}")
            errors.append(f"{action}: {exc.code}: {exc.message}"[:300])
    db.close()
    print(json.dumps({"counts": counts, "errors": errors}))


if __name__ == "__main__":
    main()
