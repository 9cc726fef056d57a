"""R28 (with R20): a rebuild kernel writes exactly the rows its view's ``apply`` writes, and
``rebuild`` never swaps in a version the log contradicts.

Each view with a kernel (``Projection.replayer``, beside its ``apply`` in
``projections.views``) is fed random event streams — every stored topic of each type,
so older schema versions and format v0 rows are upcast on the way, with removals,
revocations and events out of order (poison) — through the real rebuild path
(``projections.replay.replay_kernels``, rows bulk-written by ``write_table``) and
through ``apply`` on the inline path (``SqlRowStore``). Both versions are read back
from a SQLite file and must be identical, or both must stop at the same poison event.
One example runs on MariaDB, where identity keys (case, normalization) meet a
server collation.

``rebuild`` then checks what it built against what the log commits before the swap
(activations, audience digests, the revision's counts): a kernel that silently writes
other rows (monkeypatched here, never the database) makes the rebuild fail INTEGRITY
and leaves the live views as they were.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Connection

from domain.digests import ZERO_CHAIN
from domain.errors import IntegrityFailure
from domain.event_types import (
    EVENT_TYPES,
    T_ACTIVATED,
    T_ADVANCED,
    T_CREDENTIAL_ISSUED,
    T_CREDENTIAL_REVOKED,
    T_FAILED,
    T_GRANTED,
    T_LEGACY,
    T_LOCAL_INSTALLED,
    T_LOCAL_REINSTALLED,
    T_LOCAL_REMOVED,
    T_LOCAL_UPDATED,
    T_PREPARED,
    T_PUBLISHED,
    T_REBOUND,
    T_RECORDED,
    T_REINSTALLED,
    T_REMOVED,
    T_RETIRED,
    T_REVOKED,
    T_STARTED,
    T_VIEW_PUBLISHED,
)
from domain.log import LoggedEvent
from ledger.log.db import Database, open_database
from ledger.store.init import init_store
from projections.apply import apply_rows
from projections.framework import GenericReplayer, Projection, stored_topics
from projections.registry import ALL_PROJECTIONS
from projections.replay import replay_kernels, write_table
from projections.rows import SqlRowStore, read_version_rows
from projections.state import load_states
from projections.views.catalog import CatalogView
from projections.views.pack_activation import PackActivationView
from tests.support.lifecycle_support import World

#: The views whose rebuild runs a kernel of its own (the others replay ``apply``).
KERNEL_VIEWS = [p for p in ALL_PROJECTIONS if not isinstance(p.replayer(1), GenericReplayer)]
KERNEL, APPLY = 1, 2

# -- random event streams ------------------------------------------------------------------

NFD = unicodedata.normalize("NFD", "pâck")
PACKS = st.sampled_from(["a", "A", "pâck", NFD])
IDS = st.sampled_from(["i1", "i2", "I1"])
SMALL = st.sampled_from(["x", "X", "y"])
HASH = st.sampled_from(["v1:aa", "v1:bb"])
EPOCH = st.integers(0, 3)
OPT = st.none() | SMALL


def _source() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"kind": st.sampled_from(["official_repo", "git"]), "locator": SMALL}
    )


def _binding() -> dict[str, st.SearchStrategy[Any]]:
    return {
        "audience_kind": st.sampled_from(["app", "integration"]),
        "audience_id": SMALL,
        "pack": PACKS,
        "kind": SMALL,
        "key": SMALL,
        "credential_set": OPT,
        "install_id": IDS,
        "payload_hash": HASH,
    }


_POINTER = {
    "pack": PACKS,
    "install_id": IDS,
    "category": SMALL,
    "source": _source(),
    "revision": SMALL,
    "payload_hash": HASH,
    "epoch": EPOCH,
}
_LOCAL = {
    "pack": PACKS,
    "install_id": IDS,
    "category": SMALL,
    "locator": SMALL,
    "payload_hash": HASH,
}
_COMPONENT = st.fixed_dictionaries(
    {
        "kind": SMALL,
        "key": SMALL,
        "payload": st.fixed_dictionaries({"n": st.integers(0, 2)}),
        "requires": st.just([]),
        "credential_sets": st.just([]),
    }
)
#: Type name -> the fields its views read, at the type's current version.
FIELDS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    T_PREPARED: {
        "pack": PACKS,
        "install_id": IDS,
        "ordinal": st.integers(1, 3),
        "origin": st.sampled_from(["apply", "advance"]),
        "category": SMALL,
        "source": st.fixed_dictionaries(
            {"kind": SMALL, "locator": SMALL, "revision": OPT, "path": SMALL}
        ),
        "payload_hash": HASH,
        "from_install_id": st.none() | IDS,
        "components": st.lists(_COMPONENT, max_size=3),
    },
    T_ACTIVATED: {"pack": PACKS, "install_id": IDS, "applied_payload_hash": HASH, "epoch": EPOCH},
    T_RETIRED: {
        "pack": PACKS,
        "install_id": IDS,
        "successor_install_id": st.none() | IDS,
        "removed": st.booleans(),
    },
    T_FAILED: {"pack": PACKS, "install_id": IDS, "dirty": st.booleans(), "reason": SMALL},
    T_STARTED: _POINTER,
    T_ADVANCED: _POINTER,
    T_REINSTALLED: _POINTER,
    T_REMOVED: {"pack": PACKS, "epoch": EPOCH, "from_install_id": IDS},
    T_LOCAL_INSTALLED: _LOCAL,
    T_LOCAL_REINSTALLED: _LOCAL,
    T_LOCAL_UPDATED: {k: v for k, v in _LOCAL.items() if k != "install_id"},
    T_LOCAL_REMOVED: {"pack": PACKS, "install_id": IDS},
    T_LEGACY: {
        "pack": PACKS,
        "install_id": IDS,
        "category": SMALL,
        "source": st.fixed_dictionaries(
            {}, optional={"kind": SMALL, "repo": SMALL, "path": SMALL, "revision": SMALL}
        ),
        "applied_payload_hash": st.none() | HASH,
        "status": st.sampled_from(["active", "installed"]),
    },
    T_GRANTED: _binding(),
    T_REBOUND: _binding(),
    T_REVOKED: _binding(),
    T_CREDENTIAL_ISSUED: {
        "credential_id": IDS,
        "audience_kind": st.sampled_from(["app", "integration"]),
        "audience_id": SMALL,
        "token_digest": st.sampled_from(["00" * 32, "ff" * 32]),
        "issued_at_us": st.integers(0, 10),
        "expires_at_us": st.none() | st.integers(0, 10),
    },
    T_CREDENTIAL_REVOKED: {"credential_id": IDS, "revoked_at_us": st.integers(0, 10)},
    T_RECORDED: {"command_id": IDS, "kind": SMALL, "request_digest": HASH},
}


#: Events that apply refuses unless an earlier event created their row: most streams
#: create it first (same key), so most examples get past the poison check to compare rows.
CREATED_BY = {
    T_ACTIVATED: (T_PREPARED, ("pack", "install_id")),
    T_RETIRED: (T_PREPARED, ("pack", "install_id")),
    T_FAILED: (T_PREPARED, ("pack", "install_id")),
    T_CREDENTIAL_REVOKED: (T_CREDENTIAL_ISSUED, ("credential_id",)),
    T_LOCAL_UPDATED: (T_LOCAL_INSTALLED, ("pack",)),
    T_LOCAL_REMOVED: (T_LOCAL_INSTALLED, ("pack",)),
    T_REMOVED: (T_STARTED, ("pack",)),
}


def _stored(draw: st.DrawFn, name: str, data: dict[str, Any]) -> tuple[str, bytes]:
    """(stored topic, state bytes): any stored topic of the type, the state as that
    version and format held it (fields added later absent, ``originator_topic`` in
    format v0), so reading it upcasts."""
    event_type = EVENT_TYPES.named(name)
    topic = draw(st.sampled_from(sorted(event_type.stored_topics())))
    stored = EVENT_TYPES.resolve(topic)
    data = dict(data)
    for version in range(stored.version + 1, event_type.version + 1):
        for added in event_type.added[version]:
            data.pop(added, None)
    if stored.format == 0:
        data["originator_topic"] = "domain.lifecycle:Generation"
    data["timestamp"] = "2026-01-01T00:00:00+00:00"
    return topic, orjson.dumps(data)


@st.composite
def stored_events(draw: st.DrawFn, types: Sequence[str]) -> list[tuple[str, bytes]]:
    """One event of ``types``, usually preceded by the event creating its row."""
    name = draw(st.sampled_from(sorted(types)))
    data = draw(st.fixed_dictionaries(FIELDS[name]))
    out = []
    creator = CREATED_BY.get(name)
    if creator is not None and creator[0] in types and draw(st.integers(0, 5)):
        first = draw(st.fixed_dictionaries(FIELDS[creator[0]]))
        first.update({k: data[k] for k in creator[1]})
        out.append(_stored(draw, creator[0], first))
    out.append(_stored(draw, name, data))
    return out


def streams(view: Projection) -> st.SearchStrategy[list[tuple[str, bytes]]]:
    return st.lists(stored_events(sorted(view.types)), max_size=20).map(
        lambda groups: [event for group in groups for event in group]
    )


# -- the two paths ---------------------------------------------------------------------------


class _Log:
    """The stream as a ``LogSource`` (only ``scan`` is used by a replay)."""

    def __init__(self, events: list[tuple[str, bytes]]) -> None:
        self.rows = [
            LoggedEvent(n, UUID(int=n), 1, topic, state, b"", ZERO_CHAIN)
            for n, (topic, state) in enumerate(events, start=1)
        ]

    def scan(
        self,
        conn: Connection,
        *,
        after: int,
        upto: int,
        topics: Sequence[str] | None = None,
        page: int = 10_000,
    ) -> Iterator[tuple[int, str, bytes]]:
        for row in self.rows:
            if after < row.position <= upto and (topics is None or row.topic in topics):
                yield row.position, row.topic, row.state


def _clear(db: Database, view: Projection) -> None:
    with db.write() as conn:
        for table in view.tables:
            conn.execute(table.physical.delete())


def _versions(db: Database, view: Projection) -> tuple[dict[str, Any], dict[str, Any]]:
    with db.read() as conn:
        return tuple(  # type: ignore[return-value]
            {t.name: list(read_version_rows(conn, t, v)) for t in view.tables}
            for v in (KERNEL, APPLY)
        )


def _kernel_stops_at(view: Projection, log: _Log) -> int | None:
    """Where the kernel itself raises, if anywhere: each event upcast and dispatched as
    the replay does, straight to the kernel's handler (no fallback to ``apply``)."""
    kernel = view.replayer(KERNEL)
    topics = stored_topics(view.types)
    for position, topic, state in log.scan(None, after=0, upto=len(log.rows), topics=topics):  # type: ignore[arg-type]
        stored = EVENT_TYPES.resolve(topic)
        try:
            kernel.handlers[stored.type.name](position, stored.upcast(orjson.loads(state)))
        except Exception:
            return position
    return None


def differential(db: Database, view: Projection, events: list[tuple[str, bytes]]) -> None:
    """Kernel rows == apply rows, or both stop at the same poison event."""
    _clear(db, view)
    log = _Log(events)
    with db.write() as conn:
        store = SqlRowStore(conn, APPLY)
        outcome = apply_rows(view, log.rows, store, start=0, start_chain=ZERO_CHAIN)
        store.flush()
    poison = None if outcome.error is None else outcome.error["position"]
    # The kernel never passes over an event apply refuses, nor refuses one apply takes.
    assert _kernel_stops_at(view, log) == poison
    built, errors = replay_kernels(log, db, [view], {view.name: (0, KERNEL)}, len(events), None)  # type: ignore[arg-type]
    if poison is not None:  # the replay names apply's poison event; nothing is built
        assert errors[view.name]["position"] == poison
        return
    assert not errors
    assert not isinstance(built[view.name], GenericReplayer)
    for table, rows in built[view.name].tables():
        write_table(db, table, rows)
    kernel, applied = _versions(db, view)
    assert kernel == applied


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    path: Path = tmp_path_factory.mktemp("kernels") / "views.db"
    database = open_database(f"sqlite:///{path}")
    init_store(database)
    try:
        yield database
    finally:
        database.close()


def _differential_test(view: Projection) -> Any:
    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(events=streams(view))
    def test(sqlite_store: Database, events: list[tuple[str, bytes]]) -> None:
        differential(sqlite_store, view, events)

    test.__name__ = f"test_r28_kernel_of_{view.name}_writes_the_rows_apply_writes"
    test.__doc__ = f"``{view.name}``: kernel rows == apply rows over random streams (R20, R28)."
    return test


for _view in KERNEL_VIEWS:
    _test = _differential_test(_view)
    globals()[_test.__name__] = _test
del _view, _test


def test_r28_every_kernel_view_has_a_differential_test() -> None:
    names = {p.name for p in KERNEL_VIEWS}
    assert names == {
        "installed_pack",
        "pack_generation",
        "pack_activation",
        "pack_component",
        "audience_binding",
        "credential",
        "command_log",
    }
    assert all(f"test_r28_kernel_of_{n}_writes_the_rows_apply_writes" in globals() for n in names)


def test_r28_binding_kernel_keeps_identity_variants_apart_on_mariadb(mysql_url: str) -> None:
    """Where the engine matters: case and normalization variants of every identity are
    distinct keys under the server's collation, in the kernel's rows as in apply's."""
    database = open_database(mysql_url)
    try:
        init_store(database)
        (view,) = [p for p in KERNEL_VIEWS if p.name == "audience_binding"]
        events: list[tuple[str, bytes]] = []
        for n, (pack, audience) in enumerate(
            [("pâck", "x"), (NFD, "x"), ("a", "X"), ("A", "x"), ("a", "x")]
        ):
            data = {
                "audience_kind": "app",
                "audience_id": audience,
                "pack": pack,
                "kind": "k",
                "key": "K" if n % 2 else "k",
                "credential_set": None,
                "install_id": f"i{n}",
                "payload_hash": "v1:aa",
            }
            events.append((f"{T_GRANTED}@1", orjson.dumps(data)))
        # A revocation stored before install_id existed (v1: upcast to null).
        revoked = {**data}
        revoked.pop("install_id")
        events.append((f"{T_REVOKED}@1", orjson.dumps(revoked)))
        differential(database, view, events)
        with database.read() as conn:
            (table,) = view.tables
            assert len(list(read_version_rows(conn, table, KERNEL))) == 4
    finally:
        database.close()


# -- the check before the swap ------------------------------------------------------------------


def _diverging(view: type[Projection], types: Sequence[str], change: Any) -> Any:
    """``view``'s kernel with its handlers of ``types`` seeing ``change(state)`` instead."""
    original = view.replayer

    def replayer(self: Projection, view_version: int) -> Any:
        kernel = original(self, view_version)
        for name in types:
            handler = kernel.handlers[name]

            def wrong(position: int, d: dict[str, Any], handler: Any = handler) -> None:
                handler(position, change(d))

            kernel.handlers[name] = wrong
        return kernel

    return replayer


def _bindings(pack: str, audience: str) -> list[dict[str, Any]]:
    """A pack's push contract and the callout profile it requires, bound to ``audience``."""
    return [
        {"audience": audience, "pack": pack, "kind": "push_contract", "key": "Order.push"},
        {
            "audience": audience,
            "pack": pack,
            "kind": "callout_profile",
            "key": "erp",
            "credential_set": "erp-prod",
        },
    ]


def _epoch_plus_one(d: dict[str, Any]) -> dict[str, Any]:
    return {**d, "epoch": d["epoch"] + 1}


def _other_digest(d: dict[str, Any]) -> dict[str, Any]:
    return {**d, "digest": "0" * 64}


def _other_key(d: dict[str, Any]) -> dict[str, Any]:
    """A grant of another key: counts and the audience rows stay as the log says."""
    return {**d, "key": "Evil.key"} if d.get("kind") == "push_contract" else d


def _one_more_grant(d: dict[str, Any]) -> dict[str, Any]:
    return {**d, "counts": {**d["counts"], "grants": d["counts"]["grants"] + 1}}


def _physical_versions(db: Database) -> dict[str, set[int]]:
    with db.read() as conn:
        return {
            t.physical.name: {
                int(v) for (v,) in conn.execute(sa.select(t.physical.c.view_version).distinct())
            }
            for p in ALL_PROJECTIONS
            for t in p.tables
        }


@pytest.mark.parametrize(
    ("view", "types", "change"),
    [
        (PackActivationView, [T_STARTED, T_ADVANCED], _epoch_plus_one),
        (CatalogView, [T_VIEW_PUBLISHED], _other_digest),
        (CatalogView, [T_PUBLISHED], _one_more_grant),
        (CatalogView, [T_GRANTED, T_REBOUND, T_REVOKED], _other_key),
    ],
    ids=["activations", "audience-digests", "revision-counts", "grant-content"],
)
def test_r28_rebuild_refuses_a_diverging_kernel_and_swaps_nothing(
    world: World,
    monkeypatch: pytest.MonkeyPatch,
    view: type[Projection],
    types: list[str],
    change: Any,
) -> None:
    """A kernel (the catalog's is ``apply`` itself: a diverging one is injected) whose
    rows the log contradicts fails the rebuild INTEGRITY; nothing is swapped in."""
    sales, core = world.commit("sales", 1), world.commit("core", 1)
    world.service.apply(
        world.manifest(
            [world.official("sales", sales), world.official("core", core)],
            _bindings("sales", "integration:a") + _bindings("core", "app:t"),
        )
    )
    world.service.apply(
        world.manifest(
            [world.official("sales", world.commit("sales", 2)), world.official("core", core)],
            _bindings("sales", "integration:a"),
        )
    )
    runner = world.ledger.runner
    runner.catch_up(world.db, "command_log")  # as a rebuild leaves it
    assert all(r.ok for r in runner.verify(world.db))
    with world.db.read() as conn:
        before_states = load_states(conn)
    before_versions = _physical_versions(world.db)
    before_rows = _live(world)

    monkeypatch.setattr(view, "replayer", _diverging(view, types, change))
    with pytest.raises(IntegrityFailure) as refused:
        runner.rebuild(world.db)
    assert refused.value.details["rule"] == "R28"
    assert refused.value.details["view"] == view.name

    with world.db.read() as conn:
        after = load_states(conn)
    assert {n: (s.live_version, s.position, s.building_version) for n, s in after.items()} == {
        n: (s.live_version, s.position, None) for n, s in before_states.items()
    }
    assert _physical_versions(world.db) == before_versions  # the built versions are gone
    assert _live(world) == before_rows
    assert all(r.ok for r in runner.verify(world.db))

    monkeypatch.undo()  # the kernel as written: the same rebuild swaps
    report = runner.rebuild(world.db)
    assert {r["live_version"] for r in report.values()} == {2}
    assert _live(world) == before_rows


def _live(world: World) -> dict[str, list[dict[str, Any]]]:
    with world.db.read() as conn:
        states = load_states(conn)
        return {
            t.name: list(read_version_rows(conn, t, states[p.name].live_version))
            for p in ALL_PROJECTIONS
            for t in p.tables
        }
