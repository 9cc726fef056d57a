"""Each command step built and run alone, over its explicit collaborators (issue 26).

The handlers take what they use — a unit of work, the writer lease, the clock — so a
step runs without the command service around it. Real SQLite files, real git.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from eventsourcing.domain import Aggregate

from domain.classifier import PackState
from domain.errors import Conflict, LifecycleRejected
from domain.identity import PackName
from domain.matrix import Command, Decision, Fail, decide
from ledger.commands.apply import simulate_release
from ledger.commands.lease import LeaseHandler
from ledger.commands.publishing import read_catalog_in_force
from ledger.commands.steps import LifecycleSteps
from ledger.commands.unit_of_work import UnitOfWork, terminal_check
from ledger.commands.writer_lease import LeaseLost
from ledger.sources.resolve import ResolvedPack
from tests.support.lifecycle_support import World


class Clock:
    def __init__(self, at: float = 1_800_000_000.0) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


@pytest.fixture
def store(tmp_path: Path) -> Iterator[World]:
    """A store on a real SQLite file with a git repository (its service stays unused)."""
    w = World(tmp_path, f"sqlite:///{tmp_path / 'steps.db'}")
    yield w
    w.close()


def lease_handler(world: World, uow: UnitOfWork, holder: str, clock: Clock) -> LeaseHandler:
    return LeaseHandler(
        world.ledger,
        uow,
        holder=holder,
        lease_ttl=30.0,
        lease_wait=0.0,
        renew_every=3600.0,
        clock=clock,
    )


def install(world: World, pack: str, version: int) -> tuple[ResolvedPack, Command]:
    resolved = world.resolved(pack, world.commit(pack, version))
    decision, command = decide(world.state(pack), resolved.target)
    assert decision is Decision.INSTALL and command is not None
    return resolved, command


def test_r8_lifecycle_steps_prepare_then_activate_alone(store: World) -> None:
    uow = UnitOfWork(store.ledger)
    steps = LifecycleSteps(uow)
    lease = lease_handler(store, uow, "steps", Clock())
    handle = lease.acquire_lease()
    item = install(store, "sales", 1)
    candidates = steps.prepare(handle, [item])
    assert store.state("sales").newest is not None
    assert store.state("sales").activation is None  # prepared, nothing selected yet
    assert steps.activate(handle, candidates) == {"sales": 1}
    activation = store.state("sales").activation
    assert activation is not None and activation.install_id == candidates["sales"]
    lease.release_lease(handle)


def test_r11_unit_of_work_rejects_before_any_append_naming_every_pack(store: World) -> None:
    uow = UnitOfWork(store.ledger)
    handle = lease_handler(store, uow, "steps", Clock()).acquire_lease()
    head = store.head()
    built: list[int] = []

    def build(states: Mapping[PackName, PackState]) -> list[Aggregate]:
        built.append(1)
        return []

    commands: dict[PackName, Command] = {PackName("a"): Fail("x"), PackName("b"): Fail("y")}
    with pytest.raises(LifecycleRejected) as info:
        uow.checked_append(handle, commands, build)
    assert info.value.details["reason"] == "MULTIPLE"
    assert [r["pack"] for r in info.value.details["rejections"]] == ["a", "b"]
    assert built == [] and store.head() == head


def test_r11_terminal_check_rereads_the_locked_state_without_the_service(store: World) -> None:
    uow = UnitOfWork(store.ledger)
    steps = LifecycleSteps(uow)
    handle = lease_handler(store, uow, "steps", Clock()).acquire_lease()
    candidates = steps.prepare(handle, [install(store, "sales", 1)])
    fail: dict[PackName, Command] = {PackName("sales"): Fail(candidates["sales"])}
    terminal = terminal_check(store.ledger.repository, fail, max_epoch=uow.max_epoch)
    with store.db.read() as conn:
        terminal(conn)  # preparing: failing it is admitted
    steps.activate(handle, candidates)
    with store.db.read() as conn, pytest.raises(LifecycleRejected):
        terminal(conn)  # active now: the same check refuses, from the state it reads


def test_r12_unit_of_work_reports_a_fenced_out_append_as_the_lost_lease(store: World) -> None:
    clock = Clock()
    uow = UnitOfWork(store.ledger)
    steps = LifecycleSteps(uow)
    first = lease_handler(store, uow, "first", clock).acquire_lease()
    item = install(store, "sales", 1)
    clock.at += 31  # the first holder outran its TTL without renewing
    taken = lease_handler(store, uow, "second", clock).acquire_lease()
    head = store.head()
    with pytest.raises(LeaseLost) as lost:
        steps.prepare(first, [item])
    assert (lost.value.details["holder"], lost.value.details["epoch"]) == ("second", taken.epoch)
    assert "fenced out" in lost.value.message
    assert store.head() == head


def test_r12_lease_handler_recovers_an_abandoned_attempt_alone(store: World) -> None:
    clock = Clock()
    uow = UnitOfWork(store.ledger)
    abandoned = lease_handler(store, uow, "crashed", clock)
    candidates = LifecycleSteps(uow).prepare(
        abandoned.acquire_lease(), [install(store, "sales", 1)]
    )
    clock.at += 31  # the holder died with its candidate preparing
    with lease_handler(store, uow, "next", clock).leased() as handle:
        assert handle.recovered == ({"pack": "sales", "install_id": candidates["sales"]},)
    newest = store.state("sales").newest
    assert newest is not None and newest.status.value == "failed_dirty"


def test_r10_unit_of_work_tells_exact_retries_from_reused_command_ids(store: World) -> None:
    store.apply(store.official("sales", store.commit("sales", 1)), command_id="rel-1")
    uow = UnitOfWork(store.ledger)
    with store.ledger.snapshot() as reader:
        record = reader.command("rel-1")
        assert record is not None
        replay = uow.recorded(reader, "rel-1", "apply", record.request_digest)
        assert replay is not None and replay["command_id"] == "rel-1"
        assert uow.recorded(reader, "rel-2", "apply", record.request_digest) is None
        with pytest.raises(Conflict) as reused:
            uow.recorded(reader, "rel-1", "apply", "0" * 64)
    assert reused.value.details["rule"] == "R10"


def test_r16_release_simulation_runs_alone_and_appends_nothing(store: World) -> None:
    resolved, command = install(store, "sales", 1)
    plan = {"sales": (Decision.INSTALL, command)}
    head = store.head()
    with store.ledger.snapshot() as reader:
        states = reader.pack_states([PackName("sales")])
        catalog = read_catalog_in_force(store.ledger, reader.conn, states=states)
    release = simulate_release(
        [resolved], plan, states, catalog, None, candidates=None, publish=True
    )
    assert not release.noop and release.publication.changed
    assert release.authorities["sales"].epoch == 1
    assert store.head() == head


def test_r11_read_fence_refuses_what_moved_after_it_was_read(store: World) -> None:
    uow = UnitOfWork(store.ledger)
    read_at = store.head()
    store.apply(store.official("sales", store.commit("sales", 1)), publish=False)
    audience = ("app", "crm")
    with store.db.read() as conn:
        uow.read_fence(read_at, {"other"}, {audience})(conn)  # nothing it read moved
        with pytest.raises(Conflict, match="the read fence moved"):
            uow.read_fence(read_at, {"sales"}, {audience})(conn)
