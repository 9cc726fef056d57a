"""Lost connections and ambiguous commits on MariaDB (R10, R11, R12, R22).

A loopback proxy (``tests.support.tcp_proxy``) sits between the store and the real
server and loses the connection before, in the middle of, and after the
``COMMIT`` of the append that records a command. The store must surface a
typed error (``UNAVAILABLE``, exit 1, no traceback). A retry of the same
command id directly against the server must then be classified from the log
alone: recorded -> the prior result, ``replayed``, nothing appended; not
recorded -> applied exactly once. Afterwards positions are gapless, the chain
and every digest verify, no (aggregate id, version) repeats, and every view
equals a replay.
"""

from __future__ import annotations

import binascii
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
import pytest
from sqlalchemy.engine import make_url

from domain.errors import LedgerError, Unavailable
from domain.identity import PackName
from domain.lifecycle import GenerationStatus
from domain.log import first_chain_break
from ledger.audit.verify import verify_log
from ledger.commands.publishing import read_catalog_in_force
from ledger.commands.service import CommandService
from ledger.log.db import open_database
from ledger.store.runtime import Ledger
from tests.support.cli_inprocess import cli
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World, content
from tests.support.stores import INITIALIZED, MariaDBStores
from tests.support.tcp_proxy import DropMode, MySQLProxy

PACKS = ("sales", "crm")
BINDINGS = push_closure("integration:erp-sync", "sales") + push_closure(
    "app:portal", "crm", "erp-test"
)


def hex_marker(text: str) -> bytes:
    """How ``text`` appears inside a statement: binary columns travel as X'<hex>'."""
    return binascii.hexlify(text.encode())


#: In the INSERT of the append that records a command (topic command.recorded@1).
COMMAND_RECORD = hex_marker("command.recorded@")
EVENTS_INSERT = b"INSERT INTO ledger_events"


# -- observing the store -----------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """What one release changes: log head, activation epochs, catalog revision."""

    head: int
    epochs: dict[str, int]
    revision: int


def observe(ledger: Ledger, packs: tuple[str, ...] = PACKS) -> Observed:
    with ledger.snapshot() as reader:
        epochs = {}
        for pack in packs:
            activation = reader.pack_state(PackName(pack)).activation
            epochs[pack] = activation.epoch if activation is not None else 0
        return Observed(
            head=ledger.recorder.head_in(reader.conn).position,
            epochs=epochs,
            revision=read_catalog_in_force(ledger, reader.conn).parent.revision,
        )


def recorded_result(ledger: Ledger, command_id: str) -> Mapping[str, Any] | None:
    with ledger.snapshot() as reader:
        record = reader.command(command_id)
    return None if record is None else dict(record.result)


def newest_statuses(ledger: Ledger, packs: tuple[str, ...] = PACKS) -> dict[str, str]:
    with ledger.snapshot() as reader:
        out = {}
        for pack in packs:
            newest = reader.pack_state(PackName(pack)).newest
            out[pack] = newest.status.value if newest is not None else "none"
        return out


def assert_log_sound(ledger: Ledger) -> None:
    """Gapless positions, valid chain, unique (aggregate, version), views == replay."""
    rows = list(ledger.recorder.iter_rows())
    assert [r.position for r in rows] == list(range(1, len(rows) + 1))
    assert first_chain_break(rows) is None
    keys = [(r.aggregate_id, r.version) for r in rows]
    assert len(set(keys)) == len(keys), "an (aggregate id, version) is duplicated"
    assert ledger.recorder.head().position == len(rows)
    report = verify_log(ledger, views=True)
    assert report.ok, report.first()


def assert_retry_classified(
    ledger: Ledger,
    command_id: str,
    before: Observed,
    prior: Mapping[str, Any] | None,
    retry: Callable[[], Mapping[str, Any]],
    *,
    packs: tuple[str, ...] = PACKS,
) -> Mapping[str, Any]:
    """Retry ``command_id`` and check R10 against what the log held before the retry.

    ``before`` is the state before the interrupted command ran, ``prior`` the
    record found after it (``None``: it was not recorded).
    """
    head_before_retry = ledger.recorder.head().position
    result = retry()
    after = observe(ledger, packs)
    if prior is not None:
        # Recorded: the prior result, nothing appended.
        assert result == {**prior, "replayed": True}
        assert after.head == head_before_retry
    else:
        assert result["replayed"] is False
        assert recorded_result(ledger, command_id) == result
    # Applied exactly once in total: each pack moved once, one revision published.
    assert after.epochs == {p: before.epochs[p] + 1 for p in packs}
    assert after.revision == before.revision + 1
    assert result.get("catalog", result)["revision"] == after.revision  # apply | publish
    # A further retry is read-only.
    head = after.head
    again = retry()
    assert again == {**result, "replayed": True}
    assert ledger.recorder.head().position == head
    return result


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def world(mariadb_stores: MariaDBStores, tmp_path: Path) -> Iterator[World]:
    """A store in exactly the state ``init`` leaves, from this worker's initialized
    MariaDB databases (``tests/support/stores.py``): no DDL per test; a database a
    test leaves in another shape, or cannot empty, is dropped, never reused."""
    url = mariadb_stores.take()
    INITIALIZED.add(url)
    try:
        w = World(tmp_path, url)
        yield w
        w.close()
    finally:
        INITIALIZED.discard(url)
        mariadb_stores.give_back(url)


@pytest.fixture
def proxy() -> Iterator[MySQLProxy]:
    with MySQLProxy() as p:
        yield p


def release(world: World, version: int) -> Path:
    """A manifest advancing every pack to ``version``, with the bindings above."""
    commit = world.release({f"{pack}/pack.json": content(pack, version) for pack in PACKS})
    return world.manifest([world.official(pack, commit) for pack in PACKS], BINDINGS)


def proxied_service(proxy: MySQLProxy, url: str, **options: Any) -> CommandService:
    return CommandService(Ledger(open_database(proxy.url(url))), **options)


def expected_outcome(mode: DropMode) -> bool:
    """Whether the server committed when the COMMIT packet met ``mode``."""
    return mode is DropMode.AFTER


COMMIT_MODES = [
    pytest.param(DropMode.BEFORE, id="before-commit"),
    pytest.param(DropMode.DURING, id="during-commit"),
    pytest.param(DropMode.AFTER, id="after-commit-ambiguous"),
]


# -- the proxy itself ----------------------------------------------------------------------------


def test_r10_proxy_forwards_and_drops_on_loopback(mysql_url: str, proxy: MySQLProxy) -> None:
    """The proxy is transparent until armed, and a drop is a lost connection."""
    assert make_url(proxy.url(mysql_url)).port == proxy.port
    u = make_url(mysql_url)
    conn = pymysql.connect(host="127.0.0.1", port=proxy.port, user=u.username or "root")
    with conn.cursor() as cur:
        cur.execute("SELECT 1 + 1")
        assert cur.fetchone() == (2,)
    proxy.drop_on_statement(DropMode.BEFORE, b"SELECT 2")
    with conn.cursor() as cur, pytest.raises(pymysql.err.OperationalError) as lost:
        cur.execute("SELECT 2 + 2")
    assert lost.value.args[0] == 2013
    assert proxy.wait_fired()
    assert [d.mode for d in proxy.fired] == [DropMode.BEFORE]
    with pytest.raises(ValueError, match="loopback"):
        MySQLProxy(upstream_host="192.0.2.1")


# -- apply through the CLI: drop before, during and after COMMIT ---------------------------------
#
# The CLI runs in this process (``tests.support.cli_inprocess``): what is checked is the
# command's typed error and exit code and the retry's classification, which a child
# process would only add an interpreter start and every import to.


@pytest.mark.parametrize("mode", COMMIT_MODES)
def test_r10_cli_apply_retry_after_lost_commit_is_classified(
    world: World, proxy: MySQLProxy, mode: DropMode
) -> None:
    world.service.apply(release(world, 1))
    before = observe(world.ledger)
    manifest = release(world, 2)
    cid = f"release-2-{mode.value}"

    proxy.drop_on_commit(mode, containing=COMMAND_RECORD)
    first = cli("--db", proxy.url(world.url), "apply", str(manifest), "--command-id", cid, "--json")
    assert proxy.wait_fired(), "the COMMIT of the recording append was never seen"
    (drop,) = proxy.fired
    assert drop.packet is not None and drop.packet.is_commit
    assert first.code == 1, first.stdout
    error = first.json()
    assert error["error"] == "UNAVAILABLE"
    assert "Lost connection" in error["message"]
    assert first.stderr == ""

    prior = recorded_result(world.ledger, cid)
    assert (prior is not None) is expected_outcome(mode)
    if mode is DropMode.AFTER:
        assert drop.reply_ok, "the server's reply to COMMIT was not an OK packet"
        assert observe(world.ledger).revision == before.revision + 1
    else:
        # Nothing of the final append is there; the store closed its own candidates.
        assert observe(world.ledger).epochs == before.epochs
        assert set(newest_statuses(world.ledger).values()) == {"failed_clean"}

    def retry() -> Mapping[str, Any]:
        again = cli("--db", world.url, "apply", str(manifest), "--command-id", cid, "--json")
        assert again.code == 0, again.stdout
        out: Mapping[str, Any] = again.json()
        return out

    result = assert_retry_classified(world.ledger, cid, before, prior, retry)
    assert result["replayed"] is (mode is DropMode.AFTER)
    assert set(newest_statuses(world.ledger).values()) == {GenerationStatus.ACTIVE.value}
    assert_log_sound(world.ledger)


# -- publish in process ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", COMMIT_MODES)
def test_r10_publish_retry_after_lost_commit_is_classified(
    world: World, proxy: MySQLProxy, mode: DropMode
) -> None:
    world.service.apply(release(world, 1), publish=False)
    before = observe(world.ledger)
    assert before.revision == 0
    cid = f"publish-1-{mode.value}"
    service = proxied_service(proxy, world.url)
    proxy.drop_on_commit(mode, containing=COMMAND_RECORD)
    try:
        with pytest.raises(Unavailable) as lost:
            service.publish(command_id=cid)
    finally:
        service.ledger.close()
    assert lost.value.code == "UNAVAILABLE" and lost.value.exit_code == 1
    # The cause is named: the driver's own error, in the details and the message.
    cause = lost.value.details.get("driver_error")
    assert cause and str(cause) in lost.value.message, lost.value.to_json()
    assert proxy.wait_fired()
    prior = recorded_result(world.ledger, cid)
    assert (prior is not None) is expected_outcome(mode)

    head = world.head()
    result = world.service.publish(command_id=cid)
    if prior is not None:
        assert result == {**prior, "replayed": True}
        assert world.head() == head
    else:
        assert result["replayed"] is False and result["noop"] is False
        appended = world.topics()[head:]
        assert appended.count("catalog.published") == 1
        assert appended.count("command.recorded") == 1
    assert observe(world.ledger).revision == 1
    assert world.service.publish(command_id=cid) == {**result, "replayed": True}
    assert_log_sound(world.ledger)


# -- drops inside the append transaction --------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "statement"),
    [
        pytest.param(DropMode.BEFORE, b"UPDATE ledger_head", id="before-head-update"),
        pytest.param(DropMode.AFTER, EVENTS_INSERT, id="after-events-insert"),
        pytest.param(DropMode.DURING, b"UPDATE projection_state", id="during-projection-state"),
        pytest.param(
            DropMode.AFTER, b"INSERT INTO view_catalog_revision", id="after-inline-catalog-view"
        ),
        pytest.param(
            DropMode.BEFORE, b"INSERT INTO view_pack_activation", id="before-inline-activation"
        ),
        # A read inside a view's apply: a database error, not a poison event (the view
        # must not stop, and the append fails typed, naming the driver's error).
        pytest.param(
            DropMode.BEFORE, b"SELECT view_catalog_pending", id="before-inline-catalog-read"
        ),
    ],
)
def test_r11_drop_inside_the_recording_append_commits_nothing(
    world: World, proxy: MySQLProxy, mode: DropMode, statement: bytes
) -> None:
    """Lost mid-transaction (events written, head moved, views half-updated): the
    server rolls everything back, the retry applies the release exactly once."""
    world.service.apply(release(world, 1))
    before = observe(world.ledger)
    manifest = release(world, 2)
    cid = "release-2-mid"
    service = proxied_service(proxy, world.url)
    proxy.drop_on_statement(mode, statement, after=COMMAND_RECORD)
    try:
        with pytest.raises(LedgerError) as lost:
            service.apply(manifest, command_id=cid)
    finally:
        service.ledger.close()
    assert lost.value.code == "UNAVAILABLE"
    # The cause is named: the driver's own error, in the details and the message.
    cause = lost.value.details.get("driver_error")
    assert cause and str(cause) in lost.value.message, lost.value.to_json()
    assert proxy.wait_fired()
    (drop,) = proxy.fired
    assert drop.packet is not None and drop.packet.sql is not None
    assert EVENTS_INSERT in drop.packet.sql or drop.packet.transaction_contains(EVENTS_INSERT)
    assert recorded_result(world.ledger, cid) is None
    assert observe(world.ledger).epochs == before.epochs
    assert_log_sound(world.ledger)

    assert_retry_classified(
        world.ledger,
        cid,
        before,
        None,
        lambda: world.service.apply(manifest, command_id=cid),
    )
    assert_log_sound(world.ledger)


def test_r11_drop_now_while_an_append_waits_for_the_head_lock(
    world: World, proxy: MySQLProxy
) -> None:
    """``drop_now`` mid-transaction: the append is blocked on the head row lock held by
    another session when every proxied connection is cut."""
    world.service.apply(release(world, 1))
    before = observe(world.ledger)
    manifest = release(world, 2)
    cid = "release-2-drop-now"
    u = make_url(world.url)
    blocker = pymysql.connect(
        host="127.0.0.1", port=u.port or 3306, user=u.username or "root", database=u.database
    )
    proxy.record_statements = True
    service = proxied_service(proxy, world.url, lease_wait=0.0)
    outcome: list[BaseException | Mapping[str, Any]] = []

    def run() -> None:
        try:
            outcome.append(service.apply(manifest, command_id=cid))
        except BaseException as exc:
            outcome.append(exc)

    try:
        with blocker.cursor() as cur:
            cur.execute("SELECT position FROM ledger_head WHERE id = 1 FOR UPDATE")
        worker = threading.Thread(target=run)
        worker.start()
        assert proxy.wait_for_statement(b"FROM ledger_head WHERE id = 1 FOR UPDATE", timeout=60)
        assert proxy.drop_now() >= 1
        worker.join(30)
        assert not worker.is_alive()
    finally:
        blocker.rollback()
        blocker.close()
        service.ledger.close()
    (error,) = outcome
    assert isinstance(error, LedgerError), error
    assert error.code == "UNAVAILABLE"
    assert recorded_result(world.ledger, cid) is None
    assert observe(world.ledger) == before
    assert_retry_classified(
        world.ledger, cid, before, None, lambda: world.service.apply(manifest, command_id=cid)
    )
    assert_log_sound(world.ledger)


# -- the server stays unreachable: no cleanup possible -------------------------------------------


@pytest.mark.parametrize("mode", COMMIT_MODES)
def test_r12_blackout_after_lost_commit_retry_recovers_or_replays(
    world: World, proxy: MySQLProxy, mode: DropMode
) -> None:
    """After the drop the proxy refuses every connection: the interrupted writer can
    neither close its candidates nor release the lease. The retry (another writer)
    replays a recorded command at once, or waits out the lease, recovers the
    abandoned candidates as failed_dirty (R12) and applies once."""
    world.service.apply(release(world, 1))
    before = observe(world.ledger)
    manifest = release(world, 2)
    cid = f"release-2-blackout-{mode.value}"
    proxy.blackout_after_drop = True
    service = proxied_service(proxy, world.url, lease_ttl=1.0)
    proxy.drop_on_commit(mode, containing=COMMAND_RECORD)
    try:
        with pytest.raises(Unavailable):
            service.apply(manifest, command_id=cid)
    finally:
        service.ledger.close()
    assert proxy.blackout
    prior = recorded_result(world.ledger, cid)
    assert (prior is not None) is expected_outcome(mode)
    if prior is None:
        assert set(newest_statuses(world.ledger).values()) == {"preparing"}

    result = assert_retry_classified(
        world.ledger, cid, before, prior, lambda: world.service.apply(manifest, command_id=cid)
    )
    if prior is None:
        assert sorted(item["pack"] for item in result["recovered"]) == sorted(PACKS)
        history = [t for t in world.topics() if t == "generation.failed"]
        assert len(history) == len(PACKS)
    assert_log_sound(world.ledger)
