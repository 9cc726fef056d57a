"""Lost-connection campaign on MariaDB: drop at every client packet of a whole command.

``tests/engines/test_lost_connection.py`` aims at the interesting points (the COMMIT
of the recording append, statements inside it). This sweep aims everywhere:
a counting run measures how many client->server packets one ``apply`` (or one
``publish``) sends through the proxy on fresh connections - handshakes, pings,
snapshot reads, the lease, prepare, the final append with its inline
projections, the lease release - and then, for every packet index N and every
drop mode, a new command loses its connection at packet N. Whatever the store
did (a typed error, or success when the loss came after the outcome was
decided), a retry of the same command id directly against the server must be
classified from the log (R10) and the release must be applied exactly once;
the log must stay gapless, chained, free of duplicate (aggregate, version)
and its views equal to a replay (R20-R22).

Each test prints how many drop points it exercised.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from domain.errors import LedgerError
from ledger.commands.service import CommandService
from ledger.log.db import open_database
from ledger.store.runtime import Ledger
from tests.engines.test_lost_connection import (
    assert_log_sound,
    assert_retry_classified,
    newest_statuses,
    observe,
    proxy,
    recorded_result,
    release,
    world,
)
from tests.support.cli_support import run_cli
from tests.support.lifecycle_support import World
from tests.support.tcp_proxy import DropMode, MySQLProxy, Packet

__all__ = ["proxy", "world"]  # the fast module's fixtures

pytestmark = pytest.mark.campaign

MODES = [pytest.param(mode, id=mode.value) for mode in DropMode]
#: Lease lifetime of the interrupted writer: a lease it could not release (or did
#: not know it held) expires quickly, and the retry waits for it (R12).
SHORT_LEASE = 1.0


def wait_for_free_lease(world: World) -> None:
    """Let a lease left behind by an interrupted writer expire, so every attempt of the
    sweep starts from the same state (and sends the same packets)."""
    while True:
        with world.ledger.snapshot() as reader:
            lease = reader.lease("writer")
        now = int(time.time() * 1_000_000)
        if lease is None or lease.is_free(now):
            return
        time.sleep(max(0.01, (lease.expires_at_us - now) / 1_000_000))


def attempt(
    proxy: MySQLProxy, url: str, run: Callable[[CommandService], Mapping[str, Any]]
) -> tuple[Mapping[str, Any] | None, LedgerError | None]:
    """Run one command on fresh connections through the proxy."""
    service = CommandService(Ledger(open_database(proxy.url(url))), lease_ttl=SHORT_LEASE)
    try:
        return run(service), None
    except LedgerError as exc:
        return None, exc
    finally:
        service.ledger.close()


def report(capsys: pytest.CaptureFixture[str], title: str, outcomes: Counter[str]) -> None:
    with capsys.disabled():
        summary = ", ".join(f"{k}={v}" for k, v in sorted(outcomes.items()))
        print(f"\n[lost-connection campaign] {title}: {summary}")


def sweep(
    world: World,
    proxy: MySQLProxy,
    mode: DropMode,
    prepare: Callable[[int], Callable[[CommandService], Mapping[str, Any]]],
    retry: Callable[[str], Mapping[str, Any]],
    *,
    packs: tuple[str, ...],
) -> Counter[str]:
    """Count the packets of one command, then drop at each of them in ``mode``."""
    wait_for_free_lease(world)
    proxy.reset_count()
    first, error = attempt(proxy, world.url, prepare(0))
    assert error is None and first is not None
    total = proxy.packets
    assert total > 50, total
    outcomes: Counter[str] = Counter(packets=total)
    for n in range(1, total + 1):
        wait_for_free_lease(world)
        before = observe(world.ledger, packs)
        run = prepare(n)
        cid = f"{mode.value}-{n}"
        proxy.reset_count()
        proxy.drop_at_packet(n, mode)
        result, error = attempt(proxy, world.url, run)
        fired = proxy.wait_fired(timeout=0 if proxy.armed else 10)
        proxy.disarm()
        if fired:
            where = f"drop {mode.value} at packet {n}/{total}: {proxy.fired[-1].describe()}"
        else:
            # The counting run's total is not exact: a closing COM_QUIT or a pool
            # ping may or may not be sent. Only the tail may go unreached, and then
            # the command ran undisturbed.
            assert n > total - 3 and error is None, (
                f"packet {n} of {total} was never sent (sent {proxy.packets}): {error}"
            )
            where = f"packet {n}/{total} not reached"
            outcomes["not-reached"] += 1
        prior = recorded_result(world.ledger, cid)
        if error is not None:
            assert error.code == "UNAVAILABLE", f"{where}: {error.code} {error.message}"
            assert error.exit_code == 1
            outcomes["error"] += 1
            cause = error.details.get("driver_error")
            assert cause and str(cause) in error.message, f"{where}: no cause given"
        else:
            assert result is not None
            # The loss came after the outcome was decided (e.g. lease release).
            assert prior is not None, where
            assert result == prior, where
            outcomes["ok"] += 1
        outcomes["recorded-before-retry" if prior is not None else "not-recorded"] += 1
        try:
            retried = assert_retry_classified(
                world.ledger, cid, before, prior, functools.partial(retry, cid), packs=packs
            )
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}") from exc
        if retried["replayed"]:
            outcomes["retry-replayed"] += 1
        if retried.get("recovered"):
            outcomes["retry-recovered"] += 1
        assert set(newest_statuses(world.ledger, packs).values()) <= {"active", "none"}, where
        outcomes["drop-points"] += 1 if fired else 0
    assert_log_sound(world.ledger)
    return outcomes


@pytest.mark.parametrize("mode", MODES)
def test_r10_apply_lost_at_every_packet_is_classified_and_applied_once(
    world: World, proxy: MySQLProxy, mode: DropMode, capsys: pytest.CaptureFixture[str]
) -> None:
    world.service.apply(release(world, 1))
    manifests: dict[str, Path] = {}

    def prepare(n: int) -> Callable[[CommandService], Mapping[str, Any]]:
        manifest = release(world, n + 2)
        cid = f"{mode.value}-{n}" if n else "count"
        manifests[cid] = manifest
        return lambda service: service.apply(manifest, command_id=cid)

    outcomes = sweep(
        world,
        proxy,
        mode,
        prepare,
        lambda cid: world.service.apply(manifests[cid], command_id=cid),
        packs=("sales", "crm"),
    )
    report(capsys, f"apply, drop {mode.value}", outcomes)
    assert outcomes["drop-points"] + outcomes["not-reached"] == outcomes["packets"]
    assert outcomes["not-reached"] <= 2
    assert outcomes["not-recorded"] > 0 and outcomes["recorded-before-retry"] > 0


@pytest.mark.parametrize("mode", MODES)
def test_r10_publish_lost_at_every_packet_is_classified_and_applied_once(
    world: World, proxy: MySQLProxy, mode: DropMode, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each round binds new content without publishing, then publishes through the proxy."""
    world.service.apply(release(world, 1))

    def prepare(n: int) -> Callable[[CommandService], Mapping[str, Any]]:
        world.service.apply(release(world, n + 2), publish=False)
        cid = f"{mode.value}-{n}" if n else "count"
        return lambda service: service.publish(command_id=cid)

    def retry(cid: str) -> Mapping[str, Any]:
        return world.service.publish(command_id=cid)

    # A publish moves no activation: the sweep checks the revision and the record only.
    outcomes = sweep(world, proxy, mode, prepare, retry, packs=())
    report(capsys, f"publish, drop {mode.value}", outcomes)
    assert outcomes["drop-points"] + outcomes["not-reached"] == outcomes["packets"]
    assert outcomes["not-reached"] <= 2


def _nth_writing_commit(k: int, seen: list[int]) -> Callable[[Packet], bool]:
    def match(packet: Packet) -> bool:
        if packet.is_commit and packet.transaction_wrote():
            seen[0] += 1
            return seen[0] == k
        return False

    return match


@pytest.mark.parametrize("mode", MODES)
def test_r10_cli_apply_lost_at_every_writing_commit_exits_typed(
    world: World, proxy: MySQLProxy, mode: DropMode, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI, every COMMIT of a transaction that wrote (lease, prepare, final append,
    lease release): exit 1 with a JSON ``UNAVAILABLE`` or success, never a traceback,
    and the retry through the CLI classifies the command id."""
    world.service.apply(release(world, 1))
    seen = [0]
    proxy.arm(mode, _nth_writing_commit(0, seen))
    manifest = release(world, 2)
    counted = run_cli("--db", proxy.url(world.url), "apply", str(manifest), "--json")
    assert counted.code == 0, counted.stdout
    proxy.disarm()
    total = seen[0]
    assert total >= 4, total
    outcomes: Counter[str] = Counter(commits=total)
    for k in range(1, total + 1):
        wait_for_free_lease(world)
        before = observe(world.ledger)
        manifest = release(world, k + 2)
        cid = f"cli-{mode.value}-{k}"
        seen[0] = 0
        proxy.arm(mode, _nth_writing_commit(k, seen))
        # A short lease: when the loss strands it, the retry waits for its expiry (R12).
        first = run_cli(
            "--db",
            proxy.url(world.url),
            "apply",
            str(manifest),
            "--command-id",
            cid,
            "--lease-ttl",
            str(SHORT_LEASE),
            "--json",
        )
        assert proxy.wait_fired(), f"writing COMMIT {k} of {total} was never sent"
        if first.code == 1:
            assert first.json()["error"] == "UNAVAILABLE", first.stdout
            outcomes["exit-1"] += 1
        else:
            assert first.code == 0, first.stdout
            outcomes["exit-0"] += 1
        prior = recorded_result(world.ledger, cid)

        def retry(cid: str = cid, manifest: Path = manifest) -> Mapping[str, Any]:
            again = run_cli("--db", world.url, "apply", str(manifest), "--command-id", cid)
            assert again.code == 0, again.stderr
            replay = run_cli(
                "--db", world.url, "apply", str(manifest), "--command-id", cid, "--json"
            )
            assert replay.code == 0, replay.stdout
            out: Mapping[str, Any] = replay.json()
            return out

        # The human-readable retry runs first, so the JSON retry is always a replay.
        head = world.head()
        result = retry()
        assert result["replayed"] is True
        if prior is not None:
            assert world.head() == head
            assert result == {**prior, "replayed": True}
            outcomes["recorded-before-retry"] += 1
        else:
            outcomes["applied-by-retry"] += 1
        after = observe(world.ledger)
        assert after.epochs == {p: n + 1 for p, n in before.epochs.items()}
        assert after.revision == before.revision + 1
        outcomes["drop-points"] += 1
    assert_log_sound(world.ledger)
    report(capsys, f"CLI apply, drop {mode.value} at every writing COMMIT", outcomes)
    assert outcomes["drop-points"] == total
