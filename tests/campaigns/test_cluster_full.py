"""Galera campaign (make campaign): writer processes on every node of the test's own cluster.

1 writer per node, then 2 per node, race ``apply`` and ``publish`` for a bounded
time; then a run with 2 writers per node in which one node is SIGKILLed in the
middle and restarted. Afterwards, on every node: positions are gapless; head,
chain and Merkle root are the same; ``audit verify`` and ``projections verify``
are clean; every activation epoch has exactly one winner; every command that
answered is recorded exactly as it answered (no event lost or duplicated). A
lost race is never UNAVAILABLE or an internal error. Only writers talking to the
dead node see UNAVAILABLE (exit 1), and their retry of the same command id on a
live node is classified correctly (R10). Figures are printed (run with ``-s``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli_inprocess import cli_json
from tests.support.cluster_checks import node_report, one_winner_per_epoch, settle
from tests.support.cluster_support import GaleraCluster, status_value
from tests.support.concurrency_worker import build

ROOT = Path(__file__).resolve().parents[2]
SECONDS = float(os.environ.get("CATALOG_LEDGER_CAMPAIGN_SECONDS", "60"))
#: Exit codes any writer may see: success, or a lost race after its retries (CONFLICT).
#: UNAVAILABLE only from the dead node, and a failed_dirty refusal only after a kill.
_ANSWERS = {0, 4}


@dataclass
class Campaign:
    writers: int
    attempts: list[dict[str, Any]]
    seconds: float
    killed_url: str | None = None
    killed_at: float = 0.0
    synced_at: float = 0.0
    reports: list[Any] = field(default_factory=list)
    wsrep: dict[str, int] = field(default_factory=dict)

    def finals(self) -> list[dict[str, Any]]:
        """The last attempt of every command (after its retries)."""
        last: dict[str, dict[str, Any]] = {}
        for a in sorted(self.attempts, key=lambda a: (a["cid"], a.get("retry", 0))):
            last[a["cid"]] = a
        return list(last.values())

    def figures(self) -> str:
        finals = self.finals()
        outcome = Counter(
            f"{a['action']}:"
            + (
                ("noop" if a["result"]["noop"] else "ok")
                + (" replayed" if a["result"]["replayed"] else "")
                if a["code"] == 0
                else str(a["error"])
            )
            for a in finals
        )
        retried = {a["cid"] for a in self.attempts if a.get("retry")}
        lost = sum(
            1 for r in self.reports[0].failed if r.startswith("activation refused: CONFLICT")
        )
        return (
            f"writers {self.writers}, {self.seconds:.0f} s: commands {len(finals)} "
            f"({dict(sorted(outcome.items()))}); attempts {len(self.attempts)}, "
            f"UNAVAILABLE {sum(1 for a in self.attempts if a['code'] == 1)}, "
            f"retried on another node {len(retried)}; final appends that lost a race and were "
            f"re-decided {lost}; events {self.reports[0].size}, "
            f"revisions {self.reports[0].revisions}; node kills {1 if self.killed_url else 0}; "
            f"galera {self.wsrep}"
        )


def _database(cluster: GaleraCluster, name: str) -> list[str]:
    first = cluster.nodes[0]
    cluster.create_database(first.port, name)
    code, init = cli_json("--db", first.url(name), "init")
    assert code == 0, init
    return [node.url(name) for node in cluster.nodes]


def run_campaign(
    cluster: GaleraCluster,
    work: Path,
    name: str,
    per_node: int,
    *,
    kill: int | None = None,
    lease_ttl: float = 30.0,
) -> Campaign:
    urls = _database(cluster, name)
    work.mkdir(parents=True, exist_ok=True)
    build(work)
    procs = []
    for i in range(len(urls)):
        for k in range(per_node):
            config = {
                "urls": [urls[i], *urls[i + 1 :], *urls[:i]],
                "workdir": str(work),
                "seconds": SECONDS,
                "seed": f"{name}-n{i + 1}w{k + 1}",
                "wait": 15,
                "lease_ttl": lease_ttl,
                "out": str(work / f"writer-{i}-{k}.jsonl"),
            }
            path = work / f"writer-{i}-{k}.json"
            path.write_text(json.dumps(config), encoding="utf-8")
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.support.cluster_worker", str(path)],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
    campaign = Campaign(writers=len(procs), attempts=[], seconds=SECONDS)
    before = _wsrep(cluster)
    started = time.monotonic()
    try:
        if kill is not None:
            time.sleep(SECONDS / 3)
            campaign.killed_url = urls[kill]
            campaign.killed_at = time.time()
            cluster.crash(kill)  # SIGKILL mid-campaign
            time.sleep(max(0.0, started + 2 * SECONDS / 3 - time.monotonic()))
            cluster.restart(kill)  # rejoins by IST (or SST) and is Synced again
            campaign.synced_at = time.time()
        problems = []
        for proc in procs:
            _, err = proc.communicate(timeout=SECONDS + 600)
            if proc.returncode != 0 or "Traceback" in err:
                problems.append(f"writer exited {proc.returncode}: {err[-2000:]}")
        assert problems == []
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for i in range(len(urls)):
        for k in range(per_node):
            lines = (work / f"writer-{i}-{k}.jsonl").read_text(encoding="utf-8").splitlines()
            campaign.attempts.extend(json.loads(line) for line in lines)
    settle(urls)
    campaign.reports = [node_report(url) for url in urls]
    after = _wsrep(cluster)
    campaign.wsrep = {
        key: sum(
            # A restarted node counts from zero again.
            now - (then if starts == started else 0)
            for (then, started), (now, starts) in zip(before[key], after[key], strict=True)
        )
        for key in after
    }
    return campaign


_WSREP = ("local_cert_failures", "local_bf_aborts")


def _wsrep(cluster: GaleraCluster) -> dict[str, list[tuple[int, int]]]:
    """Per node: (Galera's counter of lost certifications / brute-force aborts, starts)."""
    return {
        key: [(int(status_value(n.port, f"wsrep_{key}") or 0), n.starts) for n in cluster.nodes]
        for key in _WSREP
    }


def check_log(campaign: Campaign) -> None:
    """What every node must agree on, and every answer must match (R10, R12, R20-R22)."""
    reports = campaign.reports
    assert len({r.agreed() for r in reports}) == 1, [r.agreed() for r in reports]
    for report in reports:
        assert report.gapless, report.url
        assert one_winner_per_epoch(report.epochs), report.epochs
        assert report.commands == reports[0].commands
        assert len(report.views) == len(reports[0].views) > 0
    commands = reports[0].commands
    for a in campaign.finals():
        if a["code"] == 0 and not a["result"]["noop"]:
            # Answered as recorded: exactly one record, holding exactly this answer.
            assert commands.get(a["cid"]) == {**a["result"], "replayed": False}, a
        elif a["code"] == 0 or a["code"] in (4, 5):
            assert a["cid"] not in commands, a  # nothing recorded for a noop or a refusal
    reused = [a for a in campaign.attempts if (a.get("details") or {}).get("rule") == "R10"]
    assert reused == []  # a retry with the same command id is never a reuse conflict


def _dirty_only(attempt: dict[str, Any]) -> bool:
    """A refusal only because a pack's newest attempt is failed_dirty (R12): a dead writer's
    abandoned attempt, recovered by the next lease holder, blocks publication until a
    later generation of that pack activates."""
    details = attempt.get("details") or {}
    problems = details.get("problems") or []
    return (
        attempt["code"] == 5
        and details.get("reason") == "CLOSURE_INVALID"
        and bool(problems)
        and all(p.get("reason") == "DIRTY_PACK" for p in problems)
    )


@pytest.mark.campaign
@pytest.mark.parametrize("per_node", [1, 2])
def test_r12_writers_racing_on_every_galera_node_keep_one_log(
    galera_cluster: GaleraCluster, tmp_path: Path, per_node: int
) -> None:
    campaign = run_campaign(galera_cluster, tmp_path / "work", f"cl_race{per_node}", per_node)
    print(f"\n[galera race] {campaign.figures()}")
    unexpected = [a for a in campaign.attempts if a["code"] not in _ANSWERS]
    assert unexpected == []  # no UNAVAILABLE, no internal error, no refusal
    finals = campaign.finals()
    assert sum(1 for a in finals if a["code"] == 0 and not a["result"]["noop"]) >= 3
    check_log(campaign)


@pytest.mark.campaign
def test_r12_galera_node_killed_mid_campaign_rejoins_and_audits_identical(
    galera_cluster: GaleraCluster, tmp_path: Path
) -> None:
    campaign = run_campaign(galera_cluster, tmp_path / "work", "cl_kill", 2, kill=1, lease_ttl=5.0)
    print(f"\n[galera node kill] {campaign.figures()}")
    slack = 2.0
    unavailable = [a for a in campaign.attempts if a["code"] == 1]
    others = [a for a in campaign.attempts if a["code"] not in (*_ANSWERS, 1)]
    # Only the dead node's clients see UNAVAILABLE, only while it is down or rejoining.
    for a in unavailable:
        assert a["url"] == campaign.killed_url, a
        assert a["error"] == "UNAVAILABLE", a
        assert a["end"] >= campaign.killed_at - slack and a["start"] <= campaign.synced_at + slack
    assert unavailable, "the killed node's writers never noticed"
    # A dead writer's abandoned attempt may block publication until its pack advances.
    assert [a for a in others if not _dirty_only(a)] == []
    # Every command that met the dead node was answered by a live one, same command id.
    for cid in {a["cid"] for a in unavailable}:
        final = next(a for a in campaign.finals() if a["cid"] == cid)
        assert final["code"] != 1 and final["url"] != campaign.killed_url, final
    # Writers on the live nodes kept committing while the node was down.
    during = [
        a
        for a in campaign.attempts
        if a["code"] == 0
        and a["url"] != campaign.killed_url
        and campaign.killed_at < a["end"] < campaign.synced_at
        and not a["result"]["noop"]
    ]
    assert during, "no write committed on a live node while the node was down"
    check_log(campaign)  # the rejoined node included: same log, audits identical
