"""R12/R27: a held writer lease is renewed outside the log and fenced on its epoch.

Renewals move only the expiry in the lease's coordination row (compare-and-set
on holder and epoch); acquisitions, releases and breaks stay log facts. A
holder that lost its lease stops before its final append and reports CONFLICT
naming the new holder. Clocks are injected: no test sleeps through a TTL.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest

from domain.errors import Conflict
from ledger.commands.service import CommandService
from ledger.commands.steps import LifecycleSteps
from ledger.commands.unit_of_work import UnitOfWork
from ledger.commands.writer_lease import LeaseBusy, LeaseHandle, LeaseKeeper, LeaseLost
from ledger.log import lease_rows
from ledger.log.db import open_database
from ledger.store.runtime import Ledger
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World, new_service

S = 1_000_000  # microseconds per second


class Clock:
    def __init__(self, at: float = 1_000_000.0) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def writer(world: World, clock: Clock, holder: str, **options: Any) -> CommandService:
    return new_service(world, holder=holder, clock=clock, lease_ttl=30.0, lease_wait=0, **options)


def test_r27_renewal_moves_only_the_expiry_and_appends_nothing(world: World) -> None:
    clock = Clock()
    a, b = writer(world, clock, "a"), writer(world, clock, "b")
    handle = a.acquire_lease()
    head = world.head()
    clock.at += 20
    assert a.renew_lease(handle) == int((clock.at + 30) * S)
    assert world.head() == head  # no event for a renewal
    lease, expiry = b.lease_state()
    assert lease is not None
    assert (lease.holder, lease.epoch, expiry) == ("a", 1, (clock.at + 30) * S)
    clock.at += 20  # 40 s after acquiring: past the TTL, inside the renewal
    with pytest.raises(LeaseBusy) as busy:
        b.acquire_lease()
    assert busy.value.details["holder"] == "a"
    clock.at += 11  # past the renewed expiry
    taken = b.acquire_lease()
    assert taken.epoch == 2
    with pytest.raises(LeaseLost) as lost:
        a.renew_lease(handle)
    assert (lost.value.details["holder"], lost.value.details["epoch"]) == ("b", 2)
    for service in (a, b):
        service.ledger.close()


def test_r27_a_takeover_racing_a_renewal_loses_to_it(world: World) -> None:
    """The takeover re-checks the coordination row inside its append: if the holder
    renewed after the taker read the lease as expired, the takeover is refused."""
    clock = Clock()
    a, b = writer(world, clock, "a"), writer(world, clock, "b")
    handle = a.acquire_lease()
    clock.at += 31  # expired as far as b's snapshot can tell
    found, renewed = b.lease.read()
    assert found is not None and found.is_free(b.lease.now_us(), renewed)
    a.renew_lease(handle)  # ... but a renews before b's append
    prior = (found.epoch, found.holder, found.released)
    found.acquire("b", b.lease.now_us(), b.lease.ttl_us, renewed)
    head = world.head()
    with pytest.raises(Conflict, match="was renewed by 'a'"):
        b.ledger.app.save(found, precommit=b.lease.claim(prior, b.lease.now_us(), found))
    assert world.head() == head
    assert a.still_held(handle)
    for service in (a, b):
        service.ledger.close()


class InterruptedSteps(LifecycleSteps):
    """Lifecycle steps that run ``during`` once the candidates are prepared."""

    def __init__(self, uow: UnitOfWork, during: Any) -> None:
        super().__init__(uow)
        self.during = during

    def prepare(self, handle: LeaseHandle, items: Sequence[Any], **options: Any) -> dict[str, str]:
        out = super().prepare(handle, items, **options)
        self.during(handle)
        return out


class Interrupted(CommandService):
    """A writer whose lease is taken over while it prepares its candidates."""

    def __init__(self, ledger: Ledger, during: Any, **options: Any) -> None:
        super().__init__(ledger, **options)
        self.steps = InterruptedSteps(self.uow, during)


@pytest.mark.parametrize("noticed_by", ["renewal", "fence"])
def test_r27_a_lost_lease_cancels_the_release_before_its_final_append(
    world: World, noticed_by: str
) -> None:
    world.apply(world.official("sales", world.commit("sales", 1)))
    clock = Clock(time.time())
    other = writer(world, clock, "other-writer")
    taken: list[Any] = []

    def take_over(handle: LeaseHandle) -> None:
        clock.at += 31  # the release outran its TTL without renewing
        taken.append(other.acquire_lease())
        taken.append(world.head())
        if noticed_by == "renewal":
            assert isinstance(handle.keeper, LeaseKeeper)
            assert handle.keeper.renew_once() is False

    slow = Interrupted(
        Ledger(open_database(world.url)),
        take_over,
        holder="slow-writer",
        clock=clock,
        lease_ttl=30.0,
        lease_wait=0,
        renew_every=3600,
    )
    release = world.manifest(
        [world.official("sales", world.commit("sales", 2))],
        push_closure("integration:a", "sales"),
    )
    with pytest.raises(LeaseLost) as lost:
        slow.apply(release)
    assert lost.value.exit_code == 4 and lost.value.code == "CONFLICT"
    assert (lost.value.details["holder"], lost.value.details["epoch"]) == (
        "other-writer",
        taken[0].epoch,
    )
    assert ("fenced out" in lost.value.message) is (noticed_by == "fence")
    # Nothing after the takeover: no activation, no binding, no revision.
    assert world.head() == taken[1]
    assert "generation.activated" not in world.topics()[-3:]
    state = world.state("sales")
    assert state.newest is not None and state.newest.status.value == "preparing"
    # The new holder recovers the abandoned candidate, as after a crash.
    assert other.recover(taken[0]) == [{"pack": "sales", "install_id": state.newest.install_id}]
    for service in (other, slow):
        service.ledger.close()


def test_r27_the_keeper_renews_in_the_background_and_release_frees_the_row(
    world: World,
) -> None:
    service = new_service(world, holder="kept", lease_ttl=30.0, renew_every=0.02)
    with service.leased() as handle:
        with world.db.read() as conn:
            first = lease_rows.read(conn, "writer")
        assert first is not None and (first.holder, first.epoch) == ("kept", handle.epoch)
        deadline = time.monotonic() + 60
        while True:  # bounded wait for the first background renewal, not a fixed sleep
            with world.db.read() as conn:
                row = lease_rows.read(conn, "writer")
            assert row is not None
            if row.expires_at_us > first.expires_at_us or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert row.expires_at_us > first.expires_at_us
    with world.db.read() as conn:
        freed = lease_rows.read(conn, "writer")
    assert freed is not None and (freed.epoch, freed.expires_at_us) == (handle.epoch, 0)
    lease, _ = service.lease_state()
    assert lease is not None and lease.released
    service.ledger.close()


def test_r27_break_bumps_the_epoch_in_log_and_row_and_fences_the_holder(world: World) -> None:
    clock = Clock()
    holder = writer(world, clock, "presumed-dead")
    handle = holder.acquire_lease()
    operator = writer(world, clock, "operator")
    operator.break_lease("presumed-dead")
    with world.db.read() as conn:
        row = lease_rows.read(conn, "writer")
    assert row is not None and (row.epoch, row.expires_at_us) == (handle.epoch + 1, 0)
    with pytest.raises(LeaseLost) as lost:
        holder.renew_lease(handle)
    assert lost.value.details["holder"] is None  # broken: free at the new epoch
    assert lost.value.details["epoch"] == handle.epoch + 1
    fresh = operator.acquire_lease()
    assert fresh.epoch == handle.epoch + 2
    for service in (holder, operator):
        service.ledger.close()
