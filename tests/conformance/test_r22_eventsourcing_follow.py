"""A downstream ``eventsourcing`` consumer follows the log (DESIGN "The log", R22, R23).

The README's example (``ProjectionRunner`` over ``ledger.store.follow.LedgerLog``) runs
here as written, against a real store on each engine: the view sees every event of
the log, in position order, as this release's domain event class of its stored type;
and it follows events appended while it runs.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.application import ProcessingEvent
from eventsourcing.projection import ProjectionRunner
from eventsourcing.system import ProcessApplication, SingleThreadedRunner, System

from domain.errors import InvalidInput, UsageError
from domain.event_types import EVENT_TYPES
from ledger.log.db import Database, open_database
from ledger.log.recorder import LedgerRecorder
from ledger.store.follow import LedgerLog
from tests.support.lifecycle_support import World
from tests.support.notes import Note

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "conformance" / "fixtures" / "golden_v0"


def readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Following the log with `eventsourcing`") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "README's following section has no example"
    return match.group(1)


def _expected_in(db: Database) -> list[tuple[int, str]]:
    """(position, domain event class) of every stored row, read without the library."""
    return [
        (row.position, EVENT_TYPES.resolve(row.topic).type.cls.__qualname__)
        for row in LedgerRecorder(db).iter_rows()
    ]


def _expected(world: World) -> list[tuple[int, str]]:
    return _expected_in(world.ledger.db)


def _run_example(world: World, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], str]:
    return _run_example_on(world.url, monkeypatch)


def _run_example_on(url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], str]:
    monkeypatch.setenv("CATALOG_LEDGER_DB", url)
    namespace: dict[str, Any] = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(readme_example(), "README.md", "exec"), namespace)
    return namespace, out.getvalue()


def test_r22_readme_follower_example_sees_every_event_in_order(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.apply(world.official("sales", world.commit("sales", 1)))
    world.apply(world.official("sales", world.commit("sales", 2)))
    expected = _expected(world)
    assert len(expected) == world.head() > 10
    namespace, printed = _run_example(world, monkeypatch)
    assert namespace["view"].seen == expected
    assert printed == f"{len(expected)} events, positions 1 to {world.head()}\n"
    assert namespace["view"].max_tracking_id("CatalogLedger") == world.head()


def test_r23_follower_reads_a_golden_v0_store_upcast_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store written by 0.1 (log format v0, schema version 1, not migrated) is followed
    as it is: every event, in order, as this release's class of its stored type."""
    shutil.copy(GOLDEN / "store.db", tmp_path / "store.db")
    url = f"sqlite:///{tmp_path / 'store.db'}"
    db = open_database(url, create=False)
    try:
        expected = _expected_in(db)
        topics = {row.topic for row in LedgerRecorder(db).iter_rows()}
    finally:
        db.close()
    assert any("@" not in topic for topic in topics)  # v0 topics, no schema version
    namespace, _ = _run_example_on(url, monkeypatch)
    assert namespace["view"].seen == expected
    assert len(expected) > 10


def test_r22_follower_sees_events_appended_while_it_runs(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.apply(world.official("sales", world.commit("sales", 1)))
    namespace, _ = _run_example(world, monkeypatch)  # the example's classes
    before = world.head()
    with ProjectionRunner(
        application_class=LedgerLog,
        projection_class=namespace["FollowTheLog"],
        view_class=namespace["SeenEvents"],
        env={"CATALOG_LEDGER_DB": world.url},
    ) as runner:
        runner.wait(before, timeout=10)
        world.apply(world.official("sales", world.commit("sales", 2)))
        assert world.head() > before
        runner.wait(world.head(), timeout=10)
        seen = list(runner.projection.view.seen)
    assert seen == _expected(world)


class Seen(ProcessApplication[Any]):
    """A ``System`` follower: (position, event class) of every event it processed."""

    seen: list[tuple[int, str]]

    def __init__(self, env: Any = None) -> None:
        super().__init__(env)
        self.seen = []

    def policy(self, domain_event: Any, processing_event: ProcessingEvent[Any]) -> None:
        assert processing_event.tracking is not None
        self.seen.append(
            (processing_event.tracking.notification_id, type(domain_event).__qualname__)
        )


def test_r22_system_follower_pulls_every_event_in_order(world: World) -> None:
    """``System`` builds the leader as ``LedgerLog(env)``; the follower pulls its log, and
    reads it with the log's mapper and transcoder (which ``System`` builds the library's
    way, ``factory.mapper(transcoder, mapper_class=...)``, from the follower's own)."""
    world.apply(world.official("sales", world.commit("sales", 1)))
    runner: SingleThreadedRunner[Any] = SingleThreadedRunner(
        System(pipes=[[LedgerLog, Seen]]),
        env={
            "CATALOG_LEDGER_DB": world.url,
            "PERSISTENCE_MODULE": "eventsourcing.popo",
            "MAPPER_TOPIC": "ledger.log.mapper:LogMapper",
            "TRANSCODER_TOPIC": "ledger.log.transcoder:OrjsonTranscoder",
        },
    )
    runner.start()
    try:
        follower = runner.get(Seen)
        follower.pull_and_process("CatalogLedger")
        assert follower.seen == _expected(world)
    finally:
        runner.stop()


def test_r22_follower_refuses_to_append(engine_url: str, db: Any) -> None:
    log = LedgerLog({"CATALOG_LEDGER_DB": engine_url})
    try:
        with pytest.raises(UsageError) as info:
            log.save(Note(name="n"))
        assert info.value.exit_code == 2
        assert "read-only" in info.value.message
    finally:
        log.close()
    assert LedgerRecorder(db).head().position == 0


def test_r24_follower_refuses_a_store_without_the_schema(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as info:
        LedgerLog({"CATALOG_LEDGER_DB": f"sqlite:///{tmp_path / 'none.db'}"})
    assert (info.value.field, info.value.exit_code) == ("db", 3)
    assert "no store at" in info.value.message
