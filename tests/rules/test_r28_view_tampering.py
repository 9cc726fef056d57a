"""R28: a view is a cache of the log — no edited view row reaches a runtime or the log.

One store per engine holds two revisions and three audiences, a pending (unpublished)
binding, and a next manifest that changes one pack, so ``publish`` and ``apply`` have
real work to do. Then, one at a time, every view table the reader or the command side
reads (``publish_fragment`` and ``projection_state`` included) gets: a single-cell edit
of each column of a live row, a deleted row, an inserted row and, on SQLite, a column
stored as another type. The default run sweeps a sample on each engine (every table,
every kind of edit, every content cell); ``make campaign`` every edit. After each edit:

* ``view`` of every audience gives the untampered bytes or INTEGRITY (MISSING for the
  audience the log never granted; STALE naming the projection for ``projection_state``
  edits, their R25 outcome);
* ``publish``, and separately the next ``apply``, append the very events the untampered
  store appends (clock and lease holder injected; timestamps aside), or fail with
  INTEGRITY and append nothing;
* ``audit verify`` of the log stays clean.

Each R28 check has a test-only switch (``projections.checks``): with any one of them
off, the same sweep finds a violation — the checks are each needed, and the test bites.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa

from domain import audience_map
from domain.errors import IntegrityFailure, LedgerError, Missing, Stale
from ledger.audit.verify import verify_log
from ledger.commands.service import CommandService
from ledger.log.db import open_database
from ledger.store import kept_fragments
from ledger.store.runtime import Ledger
from projections import checks
from projections.reader import CatalogReader, parse_audience
from projections.reader_checks import verified
from projections.registry import ALL_PROJECTIONS
from projections.state import state_table
from tests.conftest import Server
from tests.support.cli_inprocess import cli_json
from tests.support.lifecycle_support import World
from tests.support.stores import Shape, shape_of

#: Four more audiences bound to beta only, so that a change to alpha touches few enough
#: audiences for the incremental publication (which keeps fragments) to run.
FILLERS = [f"app:f{i}" for i in range(4)]
AUDIENCES = ["app:one", "app:two", *FILLERS, "app:never"]
_CLOCK = 1_900_000_000.0


def _bindings(spec: dict[str, list[str]]) -> list[dict[str, Any]]:
    return [
        {"audience": audience, "pack": pack, **binding}
        for audience, packs in spec.items()
        for pack in packs
        for binding in (
            {"kind": "push_contract", "key": "Order.push"},
            {"kind": "callout_profile", "key": "erp", "credential_set": "erp-prod"},
        )
    ]


@dataclass
class Base:
    """The untampered store and what each command does to it."""

    world: World
    next_manifest: Path
    views: dict[str, bytes | type[LedgerError]]
    published: list[tuple[Any, ...]]
    applied: list[tuple[Any, ...]]


def _service(url: str) -> tuple[Ledger, CommandService]:
    ledger = Ledger(open_database(url))
    return ledger, CommandService(ledger, holder="sweep", clock=lambda: _CLOCK, lease_wait=0.0)


def _views(ledger: Ledger) -> dict[str, bytes | type[LedgerError]]:
    verified.cache_clear()
    reader = CatalogReader(ledger.db, cache_size=0)
    out: dict[str, bytes | type[LedgerError]] = {}
    for name in AUDIENCES:
        kind, ident = name.split(":")
        try:
            out[name] = reader.view(parse_audience(kind, ident)).body
        except LedgerError as exc:
            out[name] = type(exc)
        except Exception as exc:  # a crash is a violation too: recorded, not raised
            out[name] = f"crash: {type(exc).__name__}: {exc}".encode()
    return out


def _events_after(ledger: Ledger, position: int) -> list[tuple[Any, ...]]:
    with ledger.db.read() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT aggregate_id, version, topic, state FROM ledger_events "
                "WHERE position > :p ORDER BY position"
            ),
            {"p": position},
        ).all()
    out = []
    for aggregate, version, topic, state in rows:
        data = orjson.loads(bytes(state))
        data.pop("timestamp", None)
        out.append((bytes(aggregate), int(version), bytes(topic), data))
    return out


def _run(url: str, action: Callable[[CommandService], Any]) -> list[tuple[Any, ...]] | str:
    """The events ``action`` appends, or ``"INTEGRITY"`` when it refused and appended nothing."""
    ledger, service = _service(url)
    try:
        before = ledger.recorder.head().position
        try:
            action(service)
        except IntegrityFailure:
            after = ledger.recorder.head().position
            return "INTEGRITY" if after == before else f"INTEGRITY after appending {after - before}"
        except LedgerError as exc:
            return f"{type(exc).__name__}: {exc.message}"
        except Exception as exc:  # a crash is a violation too
            return f"crash: {type(exc).__name__}: {exc}"
        return _events_after(ledger, before)
    finally:
        ledger.db.close()


def _build(tmp: Path, url: str) -> Base:
    world = World(tmp, url, holder="sweep", clock=lambda: _CLOCK, lease_wait=0.0)
    a1, b1 = world.commit("alpha", 1), world.commit("beta", 1)
    spec = {"app:one": ["alpha"], "app:two": ["beta"], **{f: ["beta"] for f in FILLERS}}
    packs = [world.official("alpha", a1), world.official("beta", b1)]
    world.service.apply(world.manifest(packs, _bindings(spec)))
    a2 = world.commit("alpha", 2)
    packs = [world.official("alpha", a2), world.official("beta", b1)]
    world.service.apply(world.manifest(packs, _bindings(spec)), publish=False)
    world.service.publish()  # revision 2, by publish: its fragments are kept
    pending = {**spec, "app:two": ["beta", "alpha"]}
    world.service.apply(world.manifest(packs, _bindings(pending)), publish=False)
    b2 = world.commit("beta", 2)
    next_manifest = world.manifest(
        [world.official("alpha", a2), world.official("beta", b2)], _bindings(pending)
    )
    world.service.credentials_issue("app:one")
    world.ledger.runner.catch_up(world.db, "command_log")
    return Base(world, next_manifest, _views(world.ledger), [], [])


# -- the edits --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Edit:
    table: str
    what: str  # "edit <column>", "delete", "insert", "retype <column>"
    state: bool = False  # a projection_state edit: STALE is its outcome (R25)

    def __str__(self) -> str:
        return f"{self.table}: {self.what}"


def _tables() -> list[sa.Table]:
    out = [t.physical for p in ALL_PROJECTIONS for t in p.tables]
    return [*out, kept_fragments.FRAGMENTS]


def _live_row(conn: sa.Connection, table: sa.Table) -> dict[str, Any] | None:
    """A row in force: for the components, one that an audience is served (a component
    no audience binds changes no answer, whatever its bytes)."""
    query = sa.select(table)
    if table.name == "view_pack_component":
        grant = next(t for t in _tables() if t.name == "view_catalog_grant")
        served = _live_row(conn, grant)
        assert served is not None
        query = query.where(
            *(table.c[k] == served[k] for k in ("pack", "install_id", "kind", "key"))
        )
    if "view_version" in table.c:
        live = sa.select(state_table.c.live_version).where(
            state_table.c.name == _owner(table.name).encode()
        )
        query = query.where(table.c.view_version == live.scalar_subquery())
    if "to_revision" in table.c:
        query = query.order_by(table.c.to_revision.desc())
    return next((r._asdict() for r in conn.execute(query.limit(1))), None)


def _owner(physical: str) -> str:
    return next(p.name for p in ALL_PROJECTIONS for t in p.tables if t.physical.name == physical)


def edits(url: str, *, sqlite: bool) -> list[Edit]:
    db = open_database(url)
    try:
        out: list[Edit] = []
        with db.read() as conn:
            for table in _tables():
                row = _live_row(conn, table)
                if row is None:
                    if table.name != "view_audience_map_pending":
                        raise AssertionError(f"no live row in {table.name}: the store is too small")
                    out.append(Edit(table.name, "insert"))
                    continue
                for column in table.columns:
                    if column.name != "view_version":
                        out.append(Edit(table.name, f"edit {column.name}"))
                        if sqlite:
                            out.append(Edit(table.name, f"retype {column.name}"))
                out += [Edit(table.name, "delete"), Edit(table.name, "insert")]
        # Edits a bit flip cannot make: an attempt shown as preparing, and (the issue's
        # finding) an audience's grant and audience rows lost while the log serves it.
        out += [Edit("view_pack_generation", "set status preparing")]
        out += [Edit("view_pack_component", "rewrite fact")]  # valid JSON, other payload
        out += [Edit("view_catalog_grant", "lose audience app:one")]
        out += [Edit("projection_state", "edit stopped", True)]
        out += [Edit("projection_state", "edit code_version", True)]
        return out
    finally:
        db.close()


def _flip(value: Any, attempt: int = 0) -> Any:
    """Another value of the same type and length (a key column's first tries may collide
    with another row's key: then a further one)."""
    if value is None:
        return b"x"
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1 + 1000 * attempt
    raw = bytes(value)
    if not raw:
        return b"x"
    return raw[:-1] + bytes([raw[-1] ^ (0x01, 0x40, 0x11)[attempt]])


def apply_edit(url: str, edit: Edit) -> None:
    db = open_database(url)
    try:
        with db.write() as conn:
            if edit.table == "projection_state":
                st = state_table
                column = edit.what.split()[1]
                value = sa.true() if column == "stopped" else st.c.code_version + 1
                conn.execute(st.update().where(st.c.name == b"catalog").values({column: value}))
                return
            table = next(t for t in _tables() if t.name == edit.table)
            row = _live_row(conn, table)
            if row is None:  # the audience map's pending table, empty between appends
                version = _live_row(
                    conn, next(t for t in _tables() if t.name == "view_audience_map")
                )
                assert version is not None
                conn.execute(
                    table.insert().values(
                        view_version=version["view_version"],
                        audience_key=b"\x01" * 32,
                        revision=2,
                        leaf_value=None,
                    )
                )
                return
            key = [c.name for c in table.primary_key.columns]
            where = sa.and_(*(table.c[k] == row[k] for k in key))
            verb, _, column = edit.what.partition(" ")
            if verb == "set":
                column, text = column.split()
                conn.execute(table.update().where(where).values({column: text.encode()}))
            elif verb == "rewrite":
                fact = orjson.loads(bytes(row["fact"]))
                fact["payload"] = {"tampered": True}
                conn.execute(
                    table.update()
                    .where(where)
                    .values(fact=orjson.dumps(fact, option=orjson.OPT_SORT_KEYS))
                )
            elif verb == "lose":
                kind, ident = column.split()[-1].split(":")  # "audience <kind>:<id>"
                for name in ("view_catalog_grant", "view_catalog_audience"):
                    t = next(t for t in _tables() if t.name == name)
                    conn.execute(
                        t.delete().where(
                            t.c.audience_kind == kind.encode(), t.c.audience_id == ident.encode()
                        )
                    )
            elif verb == "delete":
                conn.execute(table.delete().where(where))
            elif verb == "edit":
                for attempt in range(3):
                    with conn.begin_nested():
                        try:
                            conn.execute(
                                table.update()
                                .where(where)
                                .values({column: _flip(row[column], attempt)})
                            )
                        except sa.exc.IntegrityError:
                            continue
                    break
            elif verb == "retype":
                kind = "INTEGER" if isinstance(row[column], bytes) else "TEXT"
                conn.execute(
                    sa.text(
                        f'UPDATE "{table.name}" SET "{column}" = CAST("{column}" AS {kind}) '
                        f"WHERE {' AND '.join(f'{chr(34)}{k}{chr(34)} = :{k}' for k in key)}"
                    ),
                    {k: row[k] for k in key},
                )
            else:
                forged = dict(row)
                last = next(k for k in reversed(key) if k != "view_version")
                forged[last] = _flip(row[last]) if not isinstance(row[last], int) else 10**6
                conn.execute(table.insert().values(forged))
    finally:
        db.close()


# -- the sweep --------------------------------------------------------------------------------


class Copies:
    """Fresh copies of the base store, one per command run.

    On MariaDB a copy is made once with DDL (its tables and views); afterwards the same
    database is refilled from the base with DML only (every table emptied and copied
    again), unless a command changed its schema: then it is dropped and made afresh."""

    def __init__(self, base_url: str, tmp: Path, server: Server | None) -> None:
        self.base, self.tmp, self.server, self.n = base_url, tmp, server, 0
        self.spare: str | None = None
        self.shape: Shape | None = None

    @property
    def sqlite(self) -> bool:
        return self.server is None

    def __call__(self) -> Iterator[str]:
        self.n += 1
        if self.server is None:
            path = self.tmp / f"copy-{self.n}.db"
            source = Path(self.base.removeprefix("sqlite:///"))
            shutil.copyfile(source, path)
            for suffix in ("-wal", "-shm"):
                if source.with_name(source.name + suffix).exists():
                    shutil.copyfile(source.with_name(source.name + suffix), f"{path}{suffix}")
            yield f"sqlite:///{path}"
            for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                leftover.unlink(missing_ok=True)
            return
        if self.spare is None:
            name = "cl_" + secrets.token_hex(5)
            with self.server.connect() as conn, conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE {name}")
            self.spare = self.server.database_url(name)
            _copy_database(self.server, self.base, self.spare)
            if self.shape is None:
                with self.server.connect(name) as conn:
                    self.shape = shape_of(conn, name)
        else:
            _refill_database(self.server, self.base, self.spare)
        url = self.spare
        yield url
        name = str(sa.make_url(url).database)
        with self.server.connect(name) as conn:
            changed = shape_of(conn, name) != self.shape
        if changed:
            self.close()

    def close(self) -> None:
        """Drop the MariaDB copy."""
        if self.server is not None and self.spare is not None:
            name = sa.make_url(self.spare).database
            with self.server.connect() as conn, conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS {name}")
        self.spare = None


def _refill_database(server: Server, source: str, target: str) -> None:
    """The copy's tables that differ from the base's emptied and filled from it again (DML
    only). ``CHECKSUM TABLE`` names them: an edit and a command touch a few tables of
    the store, and refilling every table after each was a third of the sweep's time."""
    src, dst = str(sa.make_url(source).database), str(sa.make_url(target).database)
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION foreign_key_checks = 0")
            cur.execute(f"SHOW FULL TABLES FROM `{src}`")
            tables = sorted(name for name, kind in cur.fetchall() if kind == "BASE TABLE")

            def checksums(db: str) -> dict[str, Any]:
                cur.execute("CHECKSUM TABLE " + ", ".join(f"`{db}`.`{t}`" for t in tables))
                return {str(name).split(".", 1)[1]: checksum for name, checksum in cur.fetchall()}

            want = checksums(src)
            have = checksums(dst)
            for name in tables:
                if want[name] is None or want[name] != have.get(name):
                    cur.execute(f"DELETE FROM `{dst}`.`{name}`")
                    cur.execute(f"INSERT INTO `{dst}`.`{name}` SELECT * FROM `{src}`.`{name}`")
            conn.commit()
            # The copy is the base again (else an edit would be tried on a dirty store).
            assert checksums(dst) == want, "the copy was not refilled to the base"
    finally:
        conn.close()


def _copy_database(server: Server, source: str, target: str) -> None:
    src, dst = sa.make_url(source).database, sa.make_url(target).database
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SHOW FULL TABLES FROM `{src}`")
            listed = cur.fetchall()
            for name, kind in listed:
                if kind == "BASE TABLE":
                    cur.execute(f"CREATE TABLE `{dst}`.`{name}` LIKE `{src}`.`{name}`")
                    cur.execute(f"INSERT INTO `{dst}`.`{name}` SELECT * FROM `{src}`.`{name}`")
            for name, kind in listed:  # the compatibility views, over the copied tables
                if kind == "VIEW":
                    cur.execute(f"SHOW CREATE VIEW `{src}`.`{name}`")
                    create = cur.fetchone()[1].replace(f"`{src}`.", f"`{dst}`.")
                    cur.execute(f"USE `{dst}`")
                    cur.execute(create)
        conn.commit()
    finally:
        conn.close()


def _copy(copies: Copies) -> Iterator[str]:
    return copies()


def sweep(base: Base, copies: Copies, chosen: list[Edit], *, first: bool = False) -> list[str]:
    """Every violation of the R28 property over ``chosen`` edits (stop at the first: ``first``)."""
    manifest = base.next_manifest
    found: list[str] = []
    for edit in chosen:
        problems: list[str] = []
        for url in _copy(copies):
            apply_edit(url, edit)
            ledger = Ledger(open_database(url))
            try:
                got = _views(ledger)
            finally:
                ledger.db.close()
            for name, want in base.views.items():
                allowed: tuple[Any, ...] = (want, IntegrityFailure)
                if edit.state:
                    allowed = (want, Stale)
                if got[name] not in allowed:
                    problems.append(f"view {name} gave {got[name]!r}")
            outcome = _run(url, lambda s: s.publish())
            if outcome not in (base.published, "INTEGRITY") and not edit.state:
                problems.append(f"publish: {_short(outcome, base.published)}")
            ledger = Ledger(open_database(url))
            try:
                report = verify_log(ledger, views=False)
                if report.problems:
                    problems.append(f"audit: {report.problems[0]}")
            except Exception as exc:  # a typed error or a crash: the log must stay clean
                problems.append(f"audit: {type(exc).__name__}: {exc}")
            finally:
                ledger.db.close()
        for url in _copy(copies):
            apply_edit(url, edit)
            outcome = _run(url, lambda s: s.apply(manifest))
            if outcome not in (base.applied, "INTEGRITY") and not edit.state:
                problems.append(f"apply: {_short(outcome, base.applied)}")
        found += [f"{edit}: {p}" for p in problems]
        if first and found:
            break
    return found


def _short(outcome: Any, want: list[tuple[Any, ...]]) -> str:
    if isinstance(outcome, str):
        return outcome
    return f"{len(outcome)} events, not the {len(want)} of the untampered store"


def _prepare(base: Base, copies: Copies) -> None:
    for url in _copy(copies):
        outcome = _run(url, lambda s: s.publish())
        assert isinstance(outcome, list) and outcome, outcome
        base.published = outcome
    for url in _copy(copies):
        outcome = _run(url, lambda s: s.apply(base.next_manifest))
        assert isinstance(outcome, list) and outcome, outcome
        base.applied = outcome


@pytest.fixture(scope="module")
def sqlite_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Base, Copies]]:
    tmp = tmp_path_factory.mktemp("r28-sqlite")
    url = f"sqlite:///{tmp / 'base.db'}"
    base = _build(tmp, url)
    base.world.close()
    copies = Copies(url, tmp, None)
    _prepare(base, copies)
    yield base, copies


@pytest.fixture(scope="module")
def mariadb_base(
    tmp_path_factory: pytest.TempPathFactory, mysql_server: Server
) -> Iterator[tuple[Base, Copies]]:
    tmp = tmp_path_factory.mktemp("r28-mariadb")
    with mysql_server.scratch() as url:
        base = _build(tmp, url)
        base.world.close()
        copies = Copies(url, tmp, mysql_server)
        try:
            _prepare(base, copies)
            yield base, copies
        finally:
            copies.close()


#: Cells whose bytes are what a runtime is served or a digest commits: every edit of
#: one of these is in the sample.
_CONTENT = {"fact", "fact_digest", "digest", "content_digest", "hash", "body"}


def _sample(all_edits: list[Edit]) -> list[Edit]:
    """One edit of each kind (cell edit, retype, delete, insert, the semantic ones) of
    each table, every edit of a content cell, and the state edits."""
    seen: set[tuple[str, str]] = set()
    out = []
    for e in all_edits:
        verb, _, column = e.what.partition(" ")
        if (e.table, verb) not in seen or e.state or column in _CONTENT:
            seen.add((e.table, verb))
            out.append(e)
    return out


def test_r28_no_edited_view_row_reaches_a_runtime_or_the_log_sqlite(
    sqlite_base: tuple[Base, Copies],
) -> None:
    """The sample (every table, every kind of edit, every content cell, the semantic and
    state edits); every edit of every column in ``make campaign`` (below)."""
    base, copies = sqlite_base
    chosen = _sample(edits(copies.base, sqlite=True))
    assert {e.what.split()[0] for e in chosen} >= {"edit", "retype", "delete", "insert"}
    assert {e.table for e in chosen} == {e.table for e in edits(copies.base, sqlite=True)}
    assert sweep(base, copies, chosen) == []


@pytest.mark.campaign
def test_r28_every_edit_on_sqlite(sqlite_base: tuple[Base, Copies]) -> None:
    base, copies = sqlite_base
    chosen = edits(copies.base, sqlite=True)
    assert len(chosen) > 100
    assert sweep(base, copies, chosen) == []


def test_r28_no_edited_view_row_reaches_a_runtime_or_the_log_mariadb(
    mariadb_base: tuple[Base, Copies],
) -> None:
    base, copies = mariadb_base
    assert sweep(base, copies, _sample(edits(copies.base, sqlite=False))) == []


@pytest.mark.campaign
def test_r28_every_edit_on_mariadb(mariadb_base: tuple[Base, Copies]) -> None:
    base, copies = mariadb_base
    assert sweep(base, copies, edits(copies.base, sqlite=False)) == []


#: check -> the sampled edit that (today) is the first the sweep catches with that check
#: off. The sweep with a check off stops at its first violation, so trying this edit
#: first spares it the dozens of edits before it in table order; the rest of the
#: sample still follows, so a stale entry costs time, never the proof.
_FIRST_BITE = {
    checks.HEAD: "view_catalog_revision: edit revision",
    checks.AUDIENCE: "view_catalog_grant: lose audience app:one",
    checks.FACT: "view_pack_component: edit fact",
    checks.DIGEST: "view_catalog_grant: edit audience_kind",
    checks.PARENT: "publish_fragment: edit body",
    checks.MAP: "view_audience_map: edit depth",
    checks.PREPARING: "view_pack_generation: set status preparing",
}


@pytest.mark.parametrize("check", checks.ALL)
def test_r28_the_sweep_fails_with_any_one_check_off(
    sqlite_base: tuple[Base, Copies], check: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite only: what each check compares (view rows against the digests the log
    committed) is the same code on both engines; the main sweep runs on both."""
    base, copies = sqlite_base
    chosen = _sample(edits(copies.base, sqlite=True))
    assert _FIRST_BITE[check] in {str(e) for e in chosen}
    chosen.sort(key=lambda e: str(e) != _FIRST_BITE[check])  # stable: the rest keep order
    monkeypatch.setattr(checks, "DISABLED", {check})
    try:
        assert sweep(base, copies, chosen, first=True) != []
    finally:
        verified.cache_clear()


def test_r28_an_untampered_copy_passes_the_sweep_checks(sqlite_base: tuple[Base, Copies]) -> None:
    """The baseline itself: what each command appends is real work, and views are served."""
    base, _ = sqlite_base
    assert all(isinstance(base.views[a], bytes) for a in ("app:one", "app:two"))
    assert base.views["app:never"] is Missing
    assert len(base.published) >= 3 and len(base.applied) > len(base.published)


def test_r28_a_forged_leaf_key_on_a_new_audiences_path_never_reaches_the_log(
    world: World,
) -> None:
    """Found by a hostile pass: a leaf whose key is rewritten (its hash kept, on the same
    path) passes the parent-root check when a *new* audience's path ends at it (its old
    value is absent, so the leaf is reused as stored), and the new root would be built
    from the forged key. A leaf must hash its own key and value: else the map is made
    afresh, and the root in the log is the true one (``audit verify`` recomputes it)."""
    a1 = world.commit("alpha", 1)
    spec = {f"app:t{i}": ["alpha"] for i in range(6)}
    world.service.apply(world.manifest([world.official("alpha", a1)], _bindings(spec)))
    with world.db.read() as conn:
        leaves = conn.execute(
            sa.text(
                "SELECT depth, prefix, leaf_key FROM view_audience_map "
                "WHERE leaf_key IS NOT NULL ORDER BY depth, prefix"
            )
        ).all()
    depth, prefix, _key = leaves[0]
    newcomer = next(
        f"app:n{i}"
        for i in range(10_000)
        if audience_map.position_of(audience_map.key_of("app", f"n{i}"), depth)
        == (depth, bytes(prefix))
    )
    # On the same path, but splitting from the newcomer's key at the last bit (the real
    # key splits far higher): the tree built from it has another shape and root.
    mine = audience_map.key_of(*newcomer.split(":"))
    forged = mine[:-1] + bytes([mine[-1] ^ 0x01])
    with world.db.write() as conn:
        conn.execute(
            sa.text("UPDATE view_audience_map SET leaf_key = :f WHERE depth = :d AND prefix = :p"),
            {"f": forged, "d": depth, "p": bytes(prefix)},
        )
    spec[newcomer] = ["alpha"]
    world.service.apply(world.manifest([world.official("alpha", a1)], _bindings(spec)))
    report = verify_log(world.ledger, views=False)
    assert report.problems == [] and report.revisions == 2


@pytest.mark.parametrize("column", ["position", "live_version", "code_version"])
def test_r28_a_projection_state_cell_of_another_type_is_integrity_naming_the_table(
    sqlite_url: str, tmp_path: Path, column: str
) -> None:
    """Found by a hostile pass: a text cell in ``projection_state`` was an internal error
    (exit 1) for every command; it is an edited row (INTEGRITY naming the table)."""
    world = World(tmp_path, sqlite_url)
    world.service.apply(
        world.manifest(
            [world.official("alpha", world.commit("alpha", 1))], _bindings({"app:one": ["alpha"]})
        )
    )
    world.close()
    served = cli_json("--db", sqlite_url, "view", "app:one")
    with open_database(sqlite_url).write() as conn:
        conn.execute(sa.text(f"UPDATE projection_state SET {column} = 'abc'"))
    for args in (("publish",), ("status",)):
        code, error = cli_json("--db", sqlite_url, *args)
        assert (code, error["error"], error["details"]["table"]) == (
            6,
            "INTEGRITY",
            "projection_state",
        ), (args, error)
    # The reader reads the state in its own statement: INTEGRITY, or the untampered view
    # where the edited cell takes no part in what it serves (a position).
    code, out = cli_json("--db", sqlite_url, "view", "app:one")
    assert (code, out) == served or (code, out["error"]) == (6, "INTEGRITY"), out
