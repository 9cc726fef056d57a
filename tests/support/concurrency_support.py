"""Racing writers against one store, then every invariant of the log (R8, R12, R16-R22)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from domain.log import first_chain_break
from ledger.audit.verify import verify_log
from ledger.log.db import open_database
from ledger.store.init import init_store
from ledger.store.runtime import Ledger
from tests.support.concurrency_worker import build

ROOT = Path(__file__).resolve().parents[2]


def race(url: str, workdir: Path, writers: int, seconds: float) -> dict[str, Any]:
    """Run ``writers`` processes for ``seconds``; return merged counts and checks."""
    db = open_database(url)
    init_store(db)
    db.close()
    build(workdir)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.concurrency_worker",
                url,
                str(workdir),
                str(seconds),
                f"seed-{n}",
                *(["--rebuild"] if n == 0 else []),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(writers)
    ]
    counts: dict[str, int] = {}
    errors: list[str] = []
    for proc in procs:
        out, err = proc.communicate(timeout=seconds + 600)
        if proc.returncode != 0 or "Traceback" in err:
            errors.append(f"writer exited {proc.returncode}: {err[-1500:]}")
            continue
        summary = json.loads(out.strip().splitlines()[-1])
        for key, value in summary["counts"].items():
            counts[key] = counts.get(key, 0) + value
        errors.extend(summary["errors"])
    db = open_database(url)
    try:
        ledger = Ledger(db)
        rows = list(ledger.recorder.iter_rows())
        gapless = [r.position for r in rows] == list(range(1, len(rows) + 1))
        report = verify_log(ledger)
        return {
            "counts": counts,
            "errors": errors,
            "events": len(rows),
            "gapless": gapless,
            "chain_ok": first_chain_break(rows) is None,
            "audit_ok": report.ok,
            "audit_first": str(report.first()),
            "revisions": report.revisions,
        }
    finally:
        db.close()
