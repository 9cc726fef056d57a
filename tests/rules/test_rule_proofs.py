"""Rules proven directly, where a weaker test only implied them (issue 14, test strength).

Forged logs are re-chained: every event id and chain link is valid, so only the rule
under test can catch the forgery.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from eventsourcing.persistence import StoredEvent
from sqlalchemy.engine import Connection

from domain.catalog import AudienceBindings
from domain.classifier import PackState
from domain.errors import LifecycleRejected
from domain.identity import PackName
from domain.lifecycle import Generation, PackActivation, PackHistory, install_id_for
from domain.log import LoggedEvent
from domain.matrix import Install
from ledger.log.db import open_database
from ledger.log.recorder import LedgerRecorder
from ledger.store.init import init_store
from tests.support.cli_inprocess import cli_json
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World
from tests.support.notes import Note


def rechained(
    url: str, twin_url: str, forge: Callable[[LoggedEvent], tuple[str, bytes] | None]
) -> int:
    """Copy every row into a fresh store, ``forge`` rewriting some; return the first
    forged position. Event ids and chain links are computed afresh, so they verify."""
    source, twin = open_database(url), open_database(twin_url)
    try:
        init_store(twin)
        rows, first = [], 0
        for row in LedgerRecorder(source).iter_rows():
            forged = forge(row)
            if forged is not None and not first:
                first = row.position
            topic, state = forged or (row.topic, row.state)
            rows.append(StoredEvent(row.aggregate_id, row.version, topic, state))
        LedgerRecorder(twin).append(rows)
        assert first, "nothing was forged"
        return first
    finally:
        source.close()
        twin.close()


def audit_problem(url: str) -> dict[str, Any]:
    code, report = cli_json("--db", url, "audit", "verify", "--no-views")
    assert code == 6, report
    return dict(report["details"]["first_problem"])


def released(world: World) -> None:
    """Two revisions of one pack, bound for one audience."""
    bindings = push_closure("integration:a", "sales")
    world.service.apply(
        world.manifest([world.official("sales", world.commit("sales", 1))], bindings)
    )
    world.service.apply(
        world.manifest([world.official("sales", world.commit("sales", 2))], bindings)
    )


def test_r9_audit_rejects_a_generation_whose_frozen_facts_were_changed(
    world: World, sibling_url: str
) -> None:
    released(world)

    def forge(row: LoggedEvent) -> tuple[str, bytes] | None:
        if row.topic != "generation.prepared@1":
            return None
        state = json.loads(row.state)
        state["components"][0]["payload"] = {"forged": True}  # payload_hash left as it was
        return row.topic, json.dumps(state, sort_keys=True).encode()

    position = rechained(world.url, sibling_url, forge)
    problem = audit_problem(sibling_url)
    assert (problem["position"], problem["check"]) == (position, "replay")
    assert "R9" in problem["message"]


def test_r17_audit_rejects_a_revision_whose_parent_digest_is_wrong(
    world: World, sibling_url: str
) -> None:
    released(world)
    seen: list[int] = []

    def forge(row: LoggedEvent) -> tuple[str, bytes] | None:
        if not row.topic.startswith("catalog.published@"):
            return None
        seen.append(row.position)
        if len(seen) < 2:
            return None
        state = json.loads(row.state)
        state["parent_digest"] = "0" * 64
        return row.topic, json.dumps(state, sort_keys=True).encode()

    position = rechained(world.url, sibling_url, forge)
    problem = audit_problem(sibling_url)
    assert (problem["position"], problem["check"]) == (position, "replay")
    assert "parent digest" in problem["message"] and "R17" in problem["message"]


def test_r8_a_release_activating_several_packs_is_one_append(world: World) -> None:
    appends: list[list[str]] = []

    def watch(_conn: Connection, rows: Sequence[LoggedEvent]) -> None:
        appends.append([r.topic.partition("@")[0] for r in rows])

    world.ledger.recorder.inline_hooks.append(watch)
    commits = {p: world.commit(p, 1) for p in ("alpha", "beta", "gamma")}
    world.service.apply(world.manifest([world.official(p, c) for p, c in commits.items()]))
    activating = [a for a in appends if "generation.activated" in a]
    assert len(activating) == 1, appends
    (final,) = activating
    assert final.count("generation.activated") == 3
    assert final.count("activation.started") == 3
    assert "command.recorded" in final  # the idempotency record commits with them (R10)


@pytest.mark.parametrize("engine_url", ["mariadb"], indirect=True)
def test_r22_a_tailing_reader_never_skips_an_event_while_four_writers_append(
    engine_url: str,
) -> None:
    """Positions are commit-ordered: a reader asking for ``position > last`` sees every
    event exactly once, though four writers commit concurrently (DESIGN "The log")."""
    setup = open_database(engine_url)
    init_store(setup)
    per_writer = 60
    seen: list[int] = []
    done = threading.Event()

    def write(n: int) -> None:
        from ledger.log.application import LedgerApplication

        db = open_database(engine_url)
        try:
            app = LedgerApplication(db)
            for i in range(per_writer):
                app.save(Note(name=f"w{n}-{i}"))
        finally:
            db.close()

    def tail() -> None:
        db = open_database(engine_url)
        recorder = LedgerRecorder(db)
        last = 0
        try:
            while True:
                finished = done.is_set()
                with db.read() as conn:
                    rows = recorder.read_rows(conn, after=last, limit=50)
                for row in rows:
                    seen.append(row.position)
                    last = row.position
                if finished and not rows:
                    return
        finally:
            db.close()

    reader = threading.Thread(target=tail)
    reader.start()
    writers = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    done.set()
    reader.join(timeout=120)
    head = LedgerRecorder(setup).head().position
    setup.close()
    assert head == 4 * per_writer
    assert seen == list(range(1, head + 1))


def test_r11_the_terminal_recheck_alone_rejects_a_stale_decision(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fence is bypassed here, so only the in-transaction re-check of the locked
    current state stands between a stale decision and the log."""
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    pack = PackName("sales")
    with world.ledger.snapshot() as reader:
        stale = {pack: reader.pack_state(pack)}  # ABSENT: an install is allowed on this
    world.apply(world.official("sales", c1))  # meanwhile another release installed it
    monkeypatch.setattr(PackState, "fence", lambda self: {})  # no fence on the pack
    target = world.resolved("sales", c2)

    def build(_states: Any) -> list[Any]:
        install_id = install_id_for("sales", c2, target.content.payload_hash_v1, 1)
        return [
            Generation(
                pack="sales",
                install_id=install_id,
                ordinal=1,
                origin="install",
                category=target.content.category,
                source=target.source.to_json(),
                payload_hash=target.content.payload_hash_v1,
                components=target.content.canonical_set(),
                from_install_id=None,
            )
        ]

    before = world.topics()
    handle = world.service.acquire_lease()
    try:
        with pytest.raises(LifecycleRejected) as info:
            world.service.checked_append(
                handle, {pack: Install(target.target)}, build, states=stale
            )
    finally:
        world.service.release_lease(handle)
    assert info.value.reason == "ALREADY_ACTIVE"
    appended = world.topics()[len(before) :]
    assert appended == ["lease.acquired", "lease.released"]  # no generation at all


# -- R13: inconsistent states fail closed everywhere they are read ----------------------------


def _generation(world: World, commit: str, install_id: str, ordinal: int = 1) -> Generation:
    target = world.resolved("ghost", commit)
    return Generation(
        pack="ghost",
        install_id=install_id,
        ordinal=ordinal,
        origin="install",
        category=target.content.category,
        source=target.source.to_json(),
        payload_hash=target.content.payload_hash_v1,
        components=target.content.canonical_set(),
        from_install_id=None,
    )


def _pointer_without_history(world: World, commit: str) -> list[Any]:
    return [PackActivation.start(_generation(world, commit, "a" * 32))]


def _pointer_to_a_missing_generation(world: World, commit: str) -> list[Any]:
    g = _generation(world, commit, "a" * 32)
    history = PackHistory(pack="ghost", install_id=g.install_id, origin="install")
    return [g, history, PackActivation.start(_generation(world, commit, "b" * 32))]


def _pointer_to_a_retired_generation(world: World, commit: str) -> list[Any]:
    g = _generation(world, commit, "a" * 32)
    history = PackHistory(pack="ghost", install_id=g.install_id, origin="install")
    g.activate(epoch=1)
    pointer = PackActivation.start(g)
    g.retire(successor_install_id="c" * 32, epoch=2)
    return [g, history, pointer]


def _epoch_disagreement(world: World, commit: str) -> list[Any]:
    g = _generation(world, commit, "a" * 32)
    history = PackHistory(pack="ghost", install_id=g.install_id, origin="install")
    g.activate(epoch=3)
    return [g, history, PackActivation.start(g)]  # the pointer says epoch 1


def _non_canonical_install_id(world: World, commit: str) -> list[Any]:
    g = _generation(world, commit, " a ")
    history = PackHistory(pack="ghost", install_id=g.install_id, origin="install")
    g.activate(epoch=1)
    return [g, history, PackActivation.start(g)]


CRAFTED = {
    "an activation pointer without generation history": _pointer_without_history,
    "the activation names a generation that is not in the log": _pointer_to_a_missing_generation,
    "which is retired": _pointer_to_a_retired_generation,
    "the active generation and the activation disagree": _epoch_disagreement,
    "is not canonical": _non_canonical_install_id,
}


@pytest.mark.parametrize("found", sorted(CRAFTED))
def test_r13_a_crafted_inconsistent_state_fails_apply_and_publish_closed(
    world: World, found: str
) -> None:
    commit = world.commit("ghost", 1)
    crafted = CRAFTED[found](world, commit)
    # A pending binding of the pack, so that publication relies on it too (a pack no
    # audience binds is not in any revision, so publication never reads it: R30).
    bindings = AudienceBindings(audience_kind="integration", audience_id="a")
    pointer = crafted[-1]
    bindings.grant(
        "ghost", "push_contract", "Order.push", None, pointer.install_id, pointer.payload_hash
    )
    world.ledger.app.save(*crafted, bindings)  # straight into the log
    head = world.head()
    # Publication and apply classify from the log (R28): each names the exact finding.
    seen = found
    for command in (
        lambda: world.apply(world.official("ghost", world.commit("ghost", 2))),
        world.service.publish,
    ):
        with pytest.raises(LifecycleRejected) as info:
            command()
        assert info.value.reason == "INCONSISTENT_STATE", info.value.to_json()
        assert seen in info.value.details["found"] and info.value.details["pack"] == "ghost"
    assert world.head() == head


@pytest.mark.parametrize("found", ["which is retired", "not in the log"])
def test_r13_the_reader_fails_closed_on_an_inconsistent_activation(
    world: World, found: str
) -> None:
    c1 = world.commit("ghost", 1)
    bindings = push_closure("integration:a", "ghost")
    world.service.apply(world.manifest([world.official("ghost", c1)], bindings))
    state = world.state("ghost")
    assert state.active is not None and state.activation is not None
    if found == "which is retired":  # the generation retires, the pointer stays
        state.active.retire(successor_install_id="c" * 32, epoch=2)
        world.ledger.app.save(state.active)
    else:  # the pointer moves to a generation that was never prepared
        state.activation.advance(_generation(world, c1, "b" * 32, ordinal=2))
        world.ledger.app.save(state.activation)
    code, error = cli_json("--db", world.url, "view", "integration:a")
    assert (code, error["details"]["reason"]) == (5, "INCONSISTENT_STATE"), error
    assert found in error["details"]["found"] and error["details"]["pack"] == "ghost", error
    with pytest.raises(LifecycleRejected) as info:
        world.service.publish()
    assert info.value.reason == "INCONSISTENT_STATE"
