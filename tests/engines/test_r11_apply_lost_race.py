"""A lost race re-decides inside ``apply``'s ``--wait`` budget (R10, R11; issue 17).

A concurrent writer's append (here: another process's ``publish``, committed
between the release's decision and its final append; on Galera also a
certification failure, reported as a deadlock) makes the final append fail with
CONFLICT. ``apply`` then re-reads and decides again within ``--wait`` instead of
failing; only when the budget is spent does it exit 4 CONFLICT, and a rerun of
the same release converges. A command id reused for another request (R10) is
never retried: no retry can change what was recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from domain.errors import Conflict, Unavailable
from ledger.audit.verify import verify_log
from ledger.commands.apply import lost_race
from ledger.commands.service import CommandService
from ledger.commands.steps import LifecycleSteps
from ledger.commands.unit_of_work import UnitOfWork
from ledger.commands.writer_lease import LeaseLost
from ledger.log.db import open_database
from ledger.store.runtime import Ledger
from tests.support.cli_inprocess import cli_json
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World, new_service


class RacedSteps(LifecycleSteps):
    """Lifecycle steps whose first ``losses`` activations (a release's final append) are
    preceded by ``rival`` — another writer's append committed after this one decided."""

    def __init__(self, uow: UnitOfWork, rival: Callable[[], Any], losses: int) -> None:
        super().__init__(uow)
        self.rival = rival
        self.losses = losses
        self.raced = 0

    def activate(self, *args: Any, **kwargs: Any) -> dict[str, int]:
        if self.raced < self.losses:
            self.raced += 1
            self.rival()
        return super().activate(*args, **kwargs)


class RacedService(CommandService):
    """A writer whose first ``losses`` final appends are preceded by ``rival`` — another
    writer's append committed after this one decided (what a racing process does)."""

    def __init__(
        self, ledger: Ledger, rival: Callable[[], Any], losses: int = 1, **options: Any
    ) -> None:
        super().__init__(ledger, **options)
        self.raced_steps = RacedSteps(self.uow, rival, losses)
        self.steps = self.raced_steps

    @property
    def raced(self) -> int:
        return self.raced_steps.raced


def _pending_publication(world: World) -> tuple[str, str]:
    """sales@c1 applied with bindings left unpublished (so a rival can publish them);
    returns (c1, c2)."""
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    bindings = push_closure("app:crm", "sales")
    world.service.apply(world.manifest([world.official("sales", c1)], bindings), publish=False)
    return c1, c2


def test_r11_apply_that_loses_the_race_re_decides_and_converges(world: World) -> None:
    _, c2 = _pending_publication(world)
    release = world.manifest([world.official("sales", c2)], push_closure("app:crm", "sales"))
    rival = new_service(world)
    raced = RacedService(Ledger(open_database(world.url)), rival.publish, lease_wait=30.0)
    try:
        result = raced.apply(release)
    finally:
        raced.ledger.close()
        rival.ledger.close()
    assert raced.raced == 1
    # The rival published revision 1 between our decision and our append; we re-read,
    # prepared a fresh candidate (the first one closed failed_clean) and published 2.
    assert result["packs"][0]["decision"] == "advance"
    assert result["packs"][0]["epoch"] == 2
    assert (result["catalog"]["revision"], result["catalog"]["published"]) == (2, True)
    # Our first candidate, abandoned when its activation lost the race:
    assert [t for t in world.topics() if t == "generation.failed"] == ["generation.failed"]
    assert verify_log(world.ledger).ok
    again = world.service.apply(release)
    assert (again["noop"], again["catalog"]["revision"]) == (True, 2)
    replayed = world.service.apply(release, command_id=result["command_id"])
    assert replayed == {**result, "replayed": True}


def test_r11_apply_without_wait_budget_exits_conflict_after_one_lost_race(
    world: World,
) -> None:
    _, c2 = _pending_publication(world)
    release = world.manifest([world.official("sales", c2)], push_closure("app:crm", "sales"))
    rival = new_service(world)
    raced = RacedService(Ledger(open_database(world.url)), rival.publish, lease_wait=0.0)
    try:
        with pytest.raises(Conflict) as info:
            raced.apply(release)
    finally:
        raced.ledger.close()
        rival.ledger.close()
    assert (info.value.exit_code, info.value.code) == (4, "CONFLICT")
    assert info.value.details["attempts"] == 1
    assert "lost the race for the log 1 time(s)" in info.value.message
    activation = world.state("sales").activation
    assert activation is not None and activation.epoch == 1  # still sales@c1
    # The same release, run again, converges (R10: nothing of the lost attempt counts).
    rerun = world.service.apply(release)
    assert (rerun["packs"][0]["decision"], rerun["catalog"]["revision"]) == ("advance", 2)
    assert verify_log(world.ledger).ok


def test_r10_command_id_reused_for_another_release_is_conflict_without_retry(
    world: World,
) -> None:
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    first = world.manifest([world.official("sales", c1)])
    other = world.manifest([world.official("sales", c2)])
    assert cli_json("--db", world.url, "apply", str(first), "--command-id", "rel-1")[0] == 0
    head = world.head()
    code, error = cli_json(
        "--db", world.url, "apply", str(other), "--command-id", "rel-1", "--wait", "30"
    )
    assert (code, error["error"], error["details"]["rule"]) == (4, "CONFLICT", "R10")
    assert "attempts" not in error["details"]
    assert world.head() == head


def test_r11_lost_race_tells_races_from_reused_command_ids() -> None:
    assert lost_race(Conflict("a concurrent write won: Deadlock found", errno=1213))
    assert lost_race(Conflict("state changed since it was read: the read fence moved"))
    assert lost_race(Unavailable("the server asked for a retry", errno=1205, retryable=True))
    assert not lost_race(Conflict("command id reused", rule="R10", command_id="x"))
    assert not lost_race(Unavailable("the MySQL server could not be used", errno=2003))
    assert not lost_race(LeaseLost("the writer lease was taken over", rule="R12"))
