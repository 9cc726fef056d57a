"""Projections (R8, R20, R21) on SQLite and MariaDB: inline views, rebuild, verify, poison."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from eventsourcing.persistence import StoredEvent

from domain.digests import aggregate_id
from domain.errors import IntegrityFailure, InvalidInput
from domain.matrix import Advance
from ledger.log.db import Database
from projections.queries.status import pack_status
from projections.registry import ALL_PROJECTIONS
from projections.rows import read_version_rows
from projections.state import load_states
from tests.support.cli_inprocess import cli
from tests.support.history import bulk_history
from tests.support.lifecycle_support import World
from tests.support.stores import BuiltStores

CLI = str(Path(sys.executable).with_name("catalog-ledger"))


def live_rows(db: Database) -> dict[str, list[dict[str, Any]]]:
    with db.read() as conn:
        states = load_states(conn)
        return {
            t.name: list(read_version_rows(conn, t, states[p.name].live_version))
            for p in ALL_PROJECTIONS
            for t in p.tables
        }


def _assert_compat_view_follows_activation(db: Database) -> None:
    with db.read() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT i.pack, i.install_id, i.status, a.install_id, g.status "
                "FROM _System_InstalledPack i "
                "LEFT JOIN _System_PackActivation a ON a.pack = i.pack "
                "LEFT JOIN _System_PackGeneration g "
                "ON g.pack = i.pack AND g.install_id = i.install_id"
            )
        ).all()
    for pack, installed, status, active, generation_status in rows:
        assert bytes(status) == b"active", pack
        if active is not None:  # an official pack: the selected generation, never an attempt
            assert bytes(installed) == bytes(active)
            assert bytes(generation_status) == b"active"


def _bindings(packs: list[str], audience: str) -> list[dict[str, Any]]:
    return [
        b
        for p in packs
        for b in (
            {
                "audience": audience,
                "pack": p,
                "kind": "push_contract",
                "key": "Order.push",
            },
            {
                "audience": audience,
                "pack": p,
                "kind": "callout_profile",
                "key": "erp",
                "credential_set": "erp-prod",
            },
        )
    ]


def _built(
    world: World, built_stores: BuiltStores, key: str, build: Callable[[World], Any]
) -> tuple[World, Any]:
    """``world`` with the history ``build`` makes: built in this worker's first such test
    (and kept), copied into the store of each later one (``tests/support/stores.py``)."""
    world.close()
    value = built_stores.restore(key, world.url)
    if value is not None:
        return World(world.tmp / "copy", world.url), value
    built = World(world.tmp / "built", world.url)
    value = build(built)
    built.close()
    built_stores.keep(key, world.url, value)
    return World(world.tmp / "copy", world.url), value


def _mixed_history(world: World) -> None:
    """Upgrades, failed attempts (clean and dirty), retries, bindings, publications,
    a local pack, and binding changes left unpublished at the end."""
    packs = ["sales", "core", "billing", "Sales", unicodedata.normalize("NFD", "pâck")]
    commits = {p: [world.commit(p, v) for v in range(1, 6)] for p in packs}
    world.apply(
        {"name": "dev", "source": {"kind": "local_path", "path": str(world.local_dir("dev", 1))}}
    )
    for version in range(5):
        audiences = ["integration:a", f"app:tenant-{version}"]
        bindings = [b for a in audiences for b in _bindings(packs[: version + 1], a)]
        world.service.apply(
            world.manifest([world.official(p, commits[p][version]) for p in packs], bindings)
        )
        _assert_compat_view_follows_activation(world.db)
        if version in (1, 3):
            handle = world.service.acquire_lease()
            for n, pack in enumerate(packs[:3]):
                target = world.resolved(pack, commits[pack][(version + 1) % 5])
                state = world.state(pack)
                assert state.activation is not None and state.activation.revision is not None
                (cand,) = world.service.prepare(
                    handle, [(target, Advance(target.target, state.activation.revision))]
                ).values()
                _assert_compat_view_follows_activation(world.db)
                world.service.fail(handle, pack, cand, dirty=n == 0, reason="step failed")
            world.service.release_lease(handle)
            _assert_compat_view_follows_activation(world.db)
    world.local_dir("dev", 2)
    world.apply(
        {"name": "dev", "source": {"kind": "local_path", "path": str(world.local_dir("dev", 2))}}
    )
    world.service.apply(
        world.manifest(
            [world.official(p, commits[p][4]) for p in packs], _bindings(packs[:2], "app:late")
        ),
        publish=False,
    )
    # Credentials (R26): live, revoked and never-expiring ones.
    world.service.credentials_issue("integration:a")
    world.service.credentials_issue("app:Tenant-0", expires_in="never")
    revoked = world.service.credentials_issue("app:tenant-0")["credential_id"]
    world.service.credentials_revoke(revoked)


def test_r20_rebuild_of_a_mixed_history_yields_byte_identical_rows(world: World) -> None:
    _mixed_history(world)
    world.ledger.runner.catch_up(world.db, "command_log")
    assert world.head() > 150
    before = live_rows(world.db)
    # The audience map's pending table holds a revision's audience events only until the
    # revision's own catalog event, in the same append: it is empty between appends.
    assert all(before[t] for t in before if t != "_System_AudienceMapPending"), (
        "every view has rows"
    )
    report = world.ledger.runner.rebuild(world.db)
    assert {r["live_version"] for r in report.values()} == {2}
    assert live_rows(world.db) == before
    assert all(r.ok for r in world.ledger.runner.verify(world.db))
    _assert_compat_view_follows_activation(world.db)


def test_r3_identity_variants_are_distinct_rows_in_views_in_bytewise_order(world: World) -> None:
    names = [
        "Pack",
        "pack",
        "PACK",
        unicodedata.normalize("NFC", "é"),
        unicodedata.normalize("NFD", "é"),
        "パック",
        "🙂",
    ]
    world.apply(*[world.official(n, world.commit(n, 1)) for n in names])
    with world.db.read() as conn:
        stored = [
            bytes(r[0]).decode()
            for r in conn.execute(sa.text("SELECT pack FROM _System_InstalledPack ORDER BY pack"))
        ]
        one = conn.execute(
            sa.text("SELECT count(*) FROM _System_PackActivation WHERE pack = :p"), {"p": b"pack"}
        ).scalar()
    assert stored == sorted(names)
    assert one == 1


def test_r8_activation_pointer_view_and_generations_change_together(world: World) -> None:
    commits = [world.commit("sales", v) for v in range(1, 25)]
    world.apply(world.official("sales", commits[0]))
    seen: list[tuple[bytes, bytes, list[tuple[bytes, bytes]]]] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                with world.db.read() as conn:
                    installed = conn.execute(
                        sa.text("SELECT install_id FROM _System_InstalledPack WHERE pack = :p"),
                        {"p": b"sales"},
                    ).scalar_one()
                    pointer = conn.execute(
                        sa.text("SELECT install_id FROM _System_PackActivation WHERE pack = :p"),
                        {"p": b"sales"},
                    ).scalar_one()
                    gens = [
                        (bytes(i), bytes(s))
                        for i, s in conn.execute(
                            sa.text(
                                "SELECT install_id, status FROM _System_PackGeneration "
                                "WHERE pack = :p"
                            ),
                            {"p": b"sales"},
                        )
                    ]
                seen.append((bytes(installed), bytes(pointer), gens))
        except BaseException as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for commit in commits[1:]:
            world.apply(world.official("sales", commit))
    finally:
        stop.set()
        thread.join(timeout=60)
    assert errors == []
    assert len(seen) > 10
    for installed, pointer, gens in seen:
        assert installed == pointer
        active = [i for i, s in gens if s == b"active"]
        assert active == [pointer]


def _bulk_50k(world: World) -> int:
    """2,500 packs advanced 4 times: over 50,000 events (shared by the R20 rebuild tests)."""
    return bulk_history(world.ledger, packs=2500, rounds=5, components=1)


def _view_digest(db: Database) -> tuple[int, int]:
    with db.read() as conn:
        rows = conn.execute(
            sa.text("SELECT pack, install_id, epoch FROM _System_InstalledPack")
        ).all()
    return len(rows), hash(tuple(sorted((bytes(a), bytes(b), c) for a, b, c in rows)))


# MariaDB in `make campaign` (time budget of the default run).
@pytest.mark.parametrize(
    "engine_url", ["sqlite", pytest.param("mariadb", marks=pytest.mark.campaign)], indirect=True
)
def test_r20_blue_green_rebuild_of_50k_events_never_shows_a_partial_view(
    world: World, built_stores: BuiltStores
) -> None:
    world, events = _built(world, built_stores, "bulk-2500x5", _bulk_50k)
    assert events >= 50_000
    expected = _view_digest(world.db)
    assert expected[0] == 2500
    observed: list[tuple[int, int]] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            observed.append(_view_digest(world.db))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        report = world.ledger.runner.rebuild(world.db, ["installed_pack", "pack_generation"])
    finally:
        stop.set()
        thread.join(timeout=120)
    assert report["installed_pack"]["replayed"] == events
    assert len(observed) > 3
    assert set(observed) == {expected}
    assert all(r.ok for r in world.ledger.runner.verify(world.db))


# MariaDB in `make campaign` (time budget of the default run).
@pytest.mark.parametrize(
    "engine_url", ["sqlite", pytest.param("mariadb", marks=pytest.mark.campaign)], indirect=True
)
def test_r20_sigkill_during_rebuild_leaves_live_view_intact_and_rerun_works(
    world: World, built_stores: BuiltStores
) -> None:
    world, _ = _built(world, built_stores, "bulk-2500x5", _bulk_50k)
    before = live_rows(world.db)
    child = subprocess.Popen(
        [CLI, "--db", world.url, "projections", "rebuild", "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # kill once the next version is being written
        with world.db.read() as conn:
            states = load_states(conn)
            building = states["pack_generation"].building_version
            written = 0
            if building is not None:
                written = (
                    conn.execute(
                        sa.text(
                            "SELECT count(*) FROM view_pack_generation WHERE view_version = :v"
                        ),
                        {"v": building},
                    ).scalar()
                    or 0
                )
        if written > 0 or child.poll() is not None:
            break
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL, "the rebuild finished before it was killed"
    assert live_rows(world.db) == before
    assert all(r.ok for r in world.ledger.runner.verify(world.db))
    # The rerun in-process: the killed rebuild's leftovers are in the store, not a process.
    again = cli("--db", world.url, "projections", "rebuild", "--json")
    assert again.code == 0, again.stdout + again.stderr
    assert live_rows(world.db) == before


TAMPER = ["edit", "delete", "insert"]


def _caught_up_mixed_history(world: World) -> int:
    _mixed_history(world)
    world.ledger.runner.catch_up(world.db, "command_log")
    return world.head()


def _tamper(db: Database, table: sa.Table, kind: str) -> None:
    with db.write() as conn:
        version = conn.execute(
            sa.text("SELECT live_version FROM projection_state WHERE name = :n"),
            {"n": _projection_of(table.name).encode()},
        ).scalar_one()
        if table.name == "view_audience_map_pending":
            conn.execute(
                table.insert().values(
                    view_version=version, audience_key=b"\x01" * 32, revision=1, leaf_value=None
                )
            )
            return
        row = (
            conn.execute(sa.select(table).where(table.c.view_version == version).limit(1))
            .one()
            ._asdict()
        )
        key = [c.name for c in table.primary_key.columns]
        where = sa.and_(*(table.c[k] == row[k] for k in key))
        if kind == "delete":
            conn.execute(table.delete().where(where))
            return
        changed = next(c for c in table.columns if c.name not in key)
        if kind == "edit":
            value = row[changed.name]
            new: Any = value + 1 if isinstance(value, int) else _flip(bytes(value or b"x"))
            conn.execute(table.update().where(where).values({changed.name: new}))
            return
        forged = dict(row)
        last_key = key[-1]
        value = row[last_key]
        forged[last_key] = value + 1000 if isinstance(value, int) else bytes(value) + b"-forged"
        conn.execute(table.insert().values(forged))


def _flip(value: bytes) -> bytes:
    """Change one byte without changing the length (columns have size limits)."""
    return value[:-1] + bytes([value[-1] ^ 0x01])


def _projection_of(physical: str) -> str:
    for p in ALL_PROJECTIONS:
        for t in p.tables:
            if t.physical.name == physical:
                return p.name
    raise AssertionError(physical)


@pytest.mark.parametrize("kind", TAMPER)
def test_r21_verify_names_a_hand_edited_deleted_or_inserted_row_in_every_view(
    world: World, built_stores: BuiltStores, kind: str
) -> None:
    # The same history for each kind of damage: built once, copied for the others.
    world, _ = _built(world, built_stores, "mixed", _caught_up_mixed_history)
    for projection in ALL_PROJECTIONS:
        for table in projection.tables:
            if table.physical.name == "view_audience_map_pending" and kind != "insert":
                continue  # empty between appends: there is no row to edit or delete
            _tamper(world.db, table.physical, kind)
            # In-process: the CLI's own code path, without a process per step.
            out = cli("--db", world.url, "projections", "verify", "--json")
            assert out.code == 6, out.stdout
            doc = out.json()
            assert doc["error"] == "INTEGRITY"
            bad = [v for v in doc["details"]["views"] if not v["ok"]]
            assert [v["name"] for v in bad] == [projection.name]
            difference = bad[0]["difference"]
            assert difference["table"] == table.name
            expected = {"edit": "differ", "delete": "missing", "insert": "does not produce"}
            assert expected[kind] in difference["problem"]
            # The repair path: the view is a projection, so a rebuild restores it.
            repaired = cli(
                "--db",
                world.url,
                "projections",
                "rebuild",
                projection.name,
                "--workers",
                "1",
                "--no-chain-check",  # the chain check has tests of its own
                "--json",
            )
            assert repaired.code == 0
    assert cli("--db", world.url, "projections", "verify", "--json").code == 0


def test_r21_damaged_compatibility_row_is_detected_and_repaired_from_activation(
    world: World,
) -> None:
    """Lessons: a historical deploy overwrote _System_InstalledPack with a failed attempt."""
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    g1 = world.apply(world.official("sales", c1))["packs"][0]["install_id"]
    handle = world.service.acquire_lease()
    target = world.resolved("sales", c2)
    (failed,) = world.service.prepare(handle, [(target, Advance(target.target, c1))]).values()
    world.service.fail(handle, "sales", failed, dirty=False, reason="deploy failed")
    world.service.release_lease(handle)
    with world.db.write() as conn:
        conn.execute(
            sa.text("UPDATE view_installed_pack SET install_id = :i, status = :s WHERE pack = :p"),
            {"i": failed.encode(), "s": b"failed", "p": b"sales"},
        )
    out = cli("--db", world.url, "projections", "verify", "installed_pack", "--json")
    assert out.code == 6
    assert out.json()["details"]["views"][0]["difference"]["key"] == {"pack": "sales"}
    assert cli("--db", world.url, "projections", "rebuild", "installed_pack").code == 0
    with world.db.read() as conn:
        installed = conn.execute(
            sa.text("SELECT install_id, status FROM _System_InstalledPack WHERE pack = :p"),
            {"p": b"sales"},
        ).one()
    assert (bytes(installed[0]).decode(), bytes(installed[1])) == (g1, b"active")


def test_r20_poison_event_stops_the_view_reports_it_and_never_stalls_silently(
    world: World,
) -> None:
    world.apply(world.official("sales", world.commit("sales", 1)))
    poison = StoredEvent(
        originator_id=aggregate_id("local", "ghost"),
        originator_version=1,
        topic="domain.lifecycle:LocalPack.Updated",
        state=b'{"category":"app","locator":"/x","pack":"ghost","path":"pack.json",'
        b'"payload_hash":"v1:00","timestamp":"2026-11-29T00:00:00+00:00"}',
    )
    (position,) = world.ledger.recorder.append([poison]).positions
    status = cli("--db", world.url, "projections", "status", "--json").json()
    views = {v["name"]: v for v in status["views"]}
    assert views["installed_pack"]["state"] == "stopped"
    assert views["installed_pack"]["error"]["position"] == position
    assert views["installed_pack"]["error"]["topic"].endswith("LocalPack.Updated")
    assert "ghost" in views["installed_pack"]["error"]["error"]
    assert views["pack_generation"]["state"] == "running"
    # Appends still commit; the stopped view lags and says so; readers and releases
    # that depend on it fail closed, naming it.
    world.service.release_lease(world.service.acquire_lease())
    views = {
        v["name"]: v
        for v in cli("--db", world.url, "projections", "status", "--json").json()["views"]
    }
    assert views["installed_pack"]["lag"] > 0 and views["pack_generation"]["lag"] == 0
    with world.db.read() as conn, pytest.raises(IntegrityFailure):
        pack_status(conn)
    with pytest.raises(IntegrityFailure) as stopped:
        world.apply(world.official("sales", world.commit("sales", 2)))
    assert stopped.value.details["view"] == "installed_pack"
    # A rebuild cannot skip the poison event either: it names it and leaves the view alone.
    with pytest.raises(InvalidInput) as info:
        world.ledger.runner.rebuild(world.db, ["installed_pack"])
    assert info.value.details["errors"]["installed_pack"]["position"] == position
