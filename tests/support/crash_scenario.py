"""A realistic release sequence for crash sweeps, run as a child process.

    python -m tests.support.crash_scenario URL WORKDIR

Every step is idempotent (fixed command ids; the failed attempt is only made
once), so re-running the whole sequence after a crash converges. ``build``
creates the deterministic git repository, manifests and legacy file the
sequence applies; ``final_state`` describes the outcome with install ids
masked, which is what must match an uninterrupted run (a candidate abandoned
by a crash is recovered as failed_dirty and replaced by a fresh incarnation,
R12, so install ids may legitimately differ).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from domain.identity import Audience
from domain.matrix import Advance
from ledger.commands.service import CommandService
from ledger.log.db import open_database
from ledger.sources.resolve import resolve_manifest
from ledger.store.init import init_store
from ledger.store.runtime import Ledger
from projections.reader import CatalogReader
from tests.support.gitrepo import Repo, local, manifest, official, push_closure, push_pack

AUDIENCES = ["integration:erp-sync", "app:crm", "integration:audit"]


def _content(name: str, version: int) -> bytes:
    return push_pack(
        name,
        version,
        push_payload={"v": version, "pack": name},
        profile_payload={"url": f"https://{name}.example"},
    )


_closure = push_closure


def build(workdir: Path) -> dict[str, Path]:
    """The repository and input files (fixed git dates); built once per ``workdir``."""
    index = workdir / "files.json"
    if index.exists():
        return {k: Path(v) for k, v in json.loads(index.read_text()).items()}
    workdir.mkdir(parents=True, exist_ok=True)
    repo = Repo(workdir / "repo")
    commits = [
        repo.commit({f"{p}/pack.json": _content(p, v) for p in ("sales", "core", "billing")})
        for v in (1, 2, 3)
    ]
    dev = workdir / "dev"
    dev.mkdir(exist_ok=True)
    (dev / "pack.json").write_bytes(_content("dev", 1))

    def packs(sales: int, core: int) -> list[dict[str, Any]]:
        return [
            official("sales", repo.path, commits[sales - 1], "sales/pack.json"),
            official("core", repo.path, commits[core - 1], "core/pack.json"),
            official("billing", repo.path, commits[0], "billing/pack.json"),
            local("dev", dev),
        ]

    files = {
        "r1": manifest(workdir / "r1.json", packs(1, 1), _closure("integration:erp-sync", "sales")),
        "r2": manifest(
            workdir / "r2.json",
            packs(2, 1),
            _closure("integration:erp-sync", "sales") + _closure("app:crm", "billing", "erp-test"),
        ),
        "r3": manifest(
            workdir / "r3.json",
            packs(3, 2),
            _closure("integration:erp-sync", "sales")
            + _closure("app:crm", "billing", "erp-test")
            + _closure("integration:audit", "core"),
        ),
    }
    (_, resolved) = resolve_manifest(files["r1"])
    billing = next(r for r in resolved if r.name == "billing")
    legacy = workdir / "legacy.json"
    legacy.write_text(
        json.dumps(
            [
                {
                    "pack": "billing",
                    "install_id": "LEGACY-billing-1",
                    "status": "active",
                    "category": "app",
                    "source": {"kind": "official_repo", "repo": "old/billing"},
                    "applied_payload_hash": billing.content.payload_hash_v0,
                }
            ]
        )
    )
    files["legacy"] = legacy
    index.write_text(json.dumps({k: str(v) for k, v in files.items()}))
    return files


def run(url: str, workdir: Path) -> None:
    """Apply the whole sequence (each step once, whatever ran before)."""
    files = build(workdir)
    db = open_database(url)
    init_store(db)
    ledger = Ledger(db)
    service = CommandService(ledger, lease_ttl=2.0, lease_wait=60.0)
    service.import_legacy(files["legacy"], command_id="legacy-1")
    service.apply(files["r1"], command_id="release-1")
    service.apply(files["r2"], command_id="release-2")
    _failed_attempt(service, files["r3"])
    service.apply(files["r3"], command_id="release-3", publish=False)
    service.publish(command_id="publish-3")
    db.close()


def _failed_attempt(service: CommandService, r3: Path) -> None:
    """An attempt to advance sales to v3 that fails cleanly (made once)."""
    (_, resolved) = resolve_manifest(r3)
    sales = next(r for r in resolved if r.name == "sales")
    with service.ledger.db.read() as conn:
        tried = conn.execute(
            sa.text(
                "SELECT count(*) FROM _System_PackGeneration WHERE pack = :p AND payload_hash = :h"
            ),
            {"p": b"sales", "h": sales.content.payload_hash_v1.encode()},
        ).scalar()
    if tried:
        return
    with service.leased() as handle:
        with service.ledger.snapshot() as reader:
            from domain.identity import PackName

            state = reader.pack_state(PackName("sales"))
        assert state.activation is not None and state.activation.revision is not None
        (candidate,) = service.prepare(
            handle, [(sales, Advance(sales.target, state.activation.revision))]
        ).values()
        service.fail(handle, "sales", candidate, dirty=False, reason="step failed (scenario)")


def final_state(url: str) -> dict[str, Any]:
    """What the sequence produced, install ids masked (see the module docstring)."""
    db = open_database(url)
    try:
        ledger = Ledger(db)
        with db.read() as conn:
            packs = {
                bytes(r[0]).decode(): (bytes(r[1]).decode(), int(r[2]), bytes(r[3]).decode())
                for r in conn.execute(
                    sa.text(
                        "SELECT pack, revision, epoch, payload_hash FROM _System_PackActivation"
                    )
                )
            }
            head = conn.execute(
                sa.text(
                    "SELECT revision, content_digest FROM _System_CatalogRevision "
                    "ORDER BY revision DESC LIMIT 1"
                )
            ).one()
            # Every generation that was ever activated (active now, or retired since).
            activated = sorted(
                bytes(r[0]).decode()
                for r in conn.execute(
                    sa.text(
                        "SELECT install_id FROM _System_PackGeneration WHERE status IN (:a, :r)"
                    ),
                    {"a": b"active", "r": b"retired"},
                )
            )
        reader = CatalogReader(db)
        views = {}
        for audience in AUDIENCES:
            view = reader.view(Audience.parse(audience))
            views[audience] = sorted(
                (f["pack"], f["kind"], f["key"], json.dumps(f["payload"], sort_keys=True))
                for f in view.facts
            )
        return {
            "packs": packs,
            "revision": int(head[0]),
            "views": views,
            "content_digest": bytes(head[1]).decode(),
            "head": ledger.recorder.head().position,
            "activated_install_ids": activated,
        }
    finally:
        db.close()


if __name__ == "__main__":
    run(sys.argv[1], Path(sys.argv[2]))
