"""The crash sweep: SIGKILL a release at each crash point, then check and converge."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledger.audit.verify import verify_log
from ledger.commands.service import CommandService
from ledger.log import crashpoints
from ledger.log.db import open_database
from ledger.store.runtime import Ledger
from projections.queries.status import preparing_generations
from tests.conftest import Server
from tests.support import crash_scenario
from tests.support.crash_scenario import final_state

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def fresh_store(kind: str, folder: Path, server: Server | None) -> Iterator[str]:
    """A new, empty store URL on ``kind`` ("sqlite" or "mariadb"), dropped afterwards."""
    if kind == "sqlite":
        folder.mkdir(parents=True, exist_ok=True)
        yield f"sqlite:///{folder / ('store-' + secrets.token_hex(4) + '.db')}"
        return
    assert server is not None
    with server.scratch() as url:
        yield url


def run_scenario(
    url: str, workdir: Path, *, crash_at: int = 0, count_file: Path | None = None
) -> int:
    """Run the release sequence in a child process; its return code (-9: killed)."""
    env = dict(os.environ)
    env.pop("CATALOG_LEDGER_CRASH_AT", None)
    env.pop("CATALOG_LEDGER_CRASH_COUNT", None)
    if crash_at:
        env["CATALOG_LEDGER_CRASH_AT"] = str(crash_at)
    if count_file is not None:
        env["CATALOG_LEDGER_CRASH_COUNT"] = str(count_file)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.crash_scenario", url, str(workdir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"scenario failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.returncode


def rerun(url: str, workdir: Path) -> None:
    """The re-run after a kill, in this process: what it must show is that the store
    converges (the restart is a fresh store handle, service and lease), not a process;
    the killed run stays a child, whose death is the point. Crash points are off here
    (they are read from the environment the children get, never this process's)."""
    assert not crashpoints.ENABLED, "crash points would kill the test process"
    crash_scenario.run(url, workdir)


@dataclass
class SweepResult:
    points: int = 0
    killed: int = 0
    exact_digest: int = 0
    fresh_incarnation: int = 0
    failures: list[str] = field(default_factory=list)


def count_points(kind: str, folder: Path, server: Server | None) -> tuple[int, dict[str, Any]]:
    """Kill points of an uninterrupted run, and its final state (the reference)."""
    count_file = folder / "points.txt"
    with fresh_store(kind, folder / "reference", server) as url:
        assert run_scenario(url, folder / "work", count_file=count_file) == 0
        return int(count_file.read_text()), final_state(url)


def check_after_kill(
    url: str, workdir: Path, reference: dict[str, Any]
) -> tuple[list[str], bool, dict[str, Any]]:
    """What must hold after a kill, after the next lease holder, and after a re-run.

    Also returns the state the re-run converged on, and whether the kill fell between
    a prepare and its activation: an attempt left ``preparing`` that the uninterrupted
    run activated. Only then must the re-run converge on a fresh incarnation (a new
    install id, another digest); after any other kill it converges on the reference's
    exact digest.
    """
    problems: list[str] = []
    db = open_database(url)
    try:
        ledger = Ledger(db)
        from ledger.store.init import init_store

        init_store(db)  # the kill may have come before the schema existed
        report = verify_log(ledger)
        if not report.ok:
            problems.append(f"after the kill: {report.first()}")
        with db.read() as conn:
            abandoned = {i for _, i in preparing_generations(conn)}
        between = bool(abandoned & set(reference["activated_install_ids"]))
        # The next lease holder, with a clock past the dead holder's lease (no waiting).
        later = CommandService(
            ledger, lease_ttl=2.0, lease_wait=0, clock=lambda: time.time() + 3600
        )
        with later.leased():
            pass
        with db.read() as conn:
            survivors = preparing_generations(conn)
        if survivors:
            problems.append(f"preparing attempts survived the next lease holder: {survivors}")
    finally:
        db.close()
    rerun(url, workdir)  # re-run the same sequence to convergence
    final = final_state(url)
    for key in ("packs", "revision", "views"):
        if final[key] != reference[key]:
            problems.append(f"re-run did not converge on {key}: {final[key]} != {reference[key]}")
    db = open_database(url)
    try:
        report = verify_log(Ledger(db))
        if not report.ok:
            problems.append(f"after the re-run: {report.first()}")
    finally:
        db.close()
    return problems, between, final


def sweep(
    kind: str, folder: Path, server: Server | None, points: list[int] | None = None
) -> SweepResult:
    total, reference = count_points(kind, folder, server)
    chosen = points if points is not None else list(range(1, total + 1))
    result = SweepResult(points=total)
    for n in chosen:
        if n > total:
            continue
        with fresh_store(kind, folder / f"kill-{n}", server) as url:
            workdir = folder / "work"
            code = run_scenario(url, workdir, crash_at=n)
            if code != -signal.SIGKILL:
                result.failures.append(f"point {n}: the scenario was not killed")
                continue
            result.killed += 1
            problems, between, final = check_after_kill(url, workdir, reference)
            result.failures.extend(f"point {n}: {problem}" for problem in problems)
            same = final["content_digest"] == reference["content_digest"]
            if between:
                # Killed between a prepare and its activation: the attempt is failed_dirty
                # and the re-run activates a fresh incarnation (a new install id).
                result.fresh_incarnation += 1
                if same:
                    result.failures.append(f"point {n}: a fresh incarnation, same digest")
            else:
                result.exact_digest += 1
                if not same:
                    result.failures.append(
                        f"point {n}: not between a prepare and its activation, yet the "
                        f"digest differs: {final['content_digest']} != "
                        f"{reference['content_digest']}"
                    )
    return result
