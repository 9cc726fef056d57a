"""Running projections: inline in the append, catch-up, blue/green rebuild, verify, status.

The runner knows nothing of how the log is stored: the ledger hands it a
``LogSource`` (read rows, read and lock the head) and a ``Store`` (read and
write transactions). Dependencies therefore still point inward.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, NotRequired, Protocol, TypedDict

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain.digests import ZERO_CHAIN, Purpose, hasher, lp
from domain.errors import Conflict, InvalidInput
from domain.event_types import EVENT_TYPES, StoredType, decode_state
from domain.log import LoggedEvent
from projections.framework import (
    GenericReplayer,
    Key,
    MemoryRowStore,
    Projection,
    ProjectionState,
    Replayer,
    Row,
    RowTuple,
    SqlRowStore,
    ViewEvent,
    ViewTable,
    apply_rows,
    load_states,
    read_version_rows,
    save_state,
    stored_topics,
    write_tuples,
)

Progress = Callable[[int, int], None]

#: Standard-library logging only (this layer stays free of the CLI's setup).
log = logging.getLogger("catalog_ledger.projections")


class ViewStatus(TypedDict):
    """One view in ``projections status`` (only name and state when it is missing)."""

    name: str
    state: str  # running | stopped | missing
    tables: NotRequired[list[str]]
    mode: NotRequired[str]
    code_version: NotRequired[int]
    built_with_code_version: NotRequired[int]
    live_version: NotRequired[int]
    position: NotRequired[int]
    lag: NotRequired[int]
    error: NotRequired[dict[str, Any] | None]
    rebuild_needed: NotRequired[bool]


class ProjectionsStatus(TypedDict):
    head: int
    views: list[ViewStatus]


class RebuildOutcome(TypedDict):
    """One view's blue/green rebuild: versions swapped, events replayed and applied after."""

    previous_version: int
    live_version: int
    position: int
    replayed: int
    tail: int


#: Runs ``build_versions`` for each group of view names (e.g. one process each)
#: and returns the merged poison-event errors.
GroupBuilder = Callable[
    [list[list[str]], dict[str, tuple[int, int]], int, Progress | None],
    dict[str, dict[str, Any]],
]
_BATCH = 5000
_WRITE_BATCH = 20_000


class HeadLike(Protocol):
    @property
    def position(self) -> int: ...

    @property
    def chain(self) -> bytes: ...


class LogSource(Protocol):
    def scan(
        self,
        conn: Connection,
        *,
        after: int,
        upto: int,
        topics: Sequence[str] | None = None,
        page: int = 10_000,
    ) -> Iterator[tuple[int, str, bytes]]: ...

    def read_rows(
        self, conn: Connection, *, after: int, upto: int | None = None, limit: int = 1000
    ) -> list[LoggedEvent]: ...

    def head_in(self, conn: Connection) -> HeadLike: ...

    def lock_head(self, conn: Connection) -> HeadLike: ...


class Store(Protocol):
    @property
    def is_sqlite(self) -> bool: ...

    def write(self) -> AbstractContextManager[Connection]: ...

    def read(self) -> AbstractContextManager[Connection]: ...


@dataclass(frozen=True)
class Difference:
    """The first row where a live view and a fresh replay disagree."""

    projection: str
    table: str
    key: dict[str, Any]
    problem: str
    live: dict[str, Any] | None
    replay: dict[str, Any] | None


@dataclass(frozen=True)
class VerifyResult:
    projection: str
    position: int
    rows: int
    difference: Difference | None
    #: ``rows_digest`` of the live rows: equal on every engine for the same log.
    digest: bytes = b""

    @property
    def ok(self) -> bool:
        return self.difference is None


def _shown(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.hex()
    return value


def _shown_row(row: Row | None) -> dict[str, Any] | None:
    return {k: _shown(v) for k, v in row.items()} if row is not None else None


class ProjectionRunner:
    """All registered projections and the operations over them."""

    def __init__(self, projections: Sequence[Projection], log: LogSource) -> None:
        names = [p.name for p in projections]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate projection names: {names}")
        self.projections = list(projections)
        self.by_name = {p.name: p for p in projections}
        self.log = log

    def select(self, names: Sequence[str] = ()) -> list[Projection]:
        if not names:
            return list(self.projections)
        unknown = [n for n in names if n not in self.by_name]
        if unknown:
            raise InvalidInput(
                f"unknown projection(s) {', '.join(unknown)}; known: {', '.join(self.by_name)}",
                field="name",
            )
        return [self.by_name[n] for n in names]

    # -- state rows -------------------------------------------------------------------

    def ensure_states(self, conn: Connection) -> list[str]:
        """Create state rows for projections that have none; return their names."""
        states = load_states(conn)
        created = []
        for p in self.projections:
            if p.name not in states:
                save_state(
                    conn,
                    ProjectionState(
                        name=p.name,
                        code_version=p.version,
                        live_version=1,
                        position=0,
                        chain=ZERO_CHAIN,
                        mode="inline" if p.inline else "catch-up",
                        stopped=False,
                        error=None,
                    ),
                )
                created.append(p.name)
        return created

    # -- inline -----------------------------------------------------------------------

    def inline_hook(self, conn: Connection, rows: Sequence[LoggedEvent]) -> None:
        """Apply freshly appended rows to every running inline projection (same txn)."""
        if not rows:
            return
        start = time.perf_counter()
        states = load_states(conn)
        first = rows[0].position
        updated = 0
        for projection in self.projections:
            if not projection.inline:
                continue
            state = states.get(projection.name)
            if state is None or state.stopped or state.code_version != projection.version:
                # Never write rows with this code onto a view built by other code (R25):
                # it falls behind and is not served until a rebuild swaps it.
                continue
            pending: Sequence[LoggedEvent] = rows
            if state.position < first - 1:
                # Behind (e.g. created after events existed): catch up in this txn.
                pending = [
                    *self._rows_between(conn, state.position, first - 1),
                    *rows,
                ]
            self._advance(conn, projection, state, pending)
            updated += 1
        # The inline views are the "views" phase of every append (apply, publish, …).
        log.info(
            "phase",
            extra={
                "phase": "views",
                "duration_ms": round((time.perf_counter() - start) * 1000, 3),
                "views": updated,
                "events": len(rows),
                "position": rows[-1].position,
            },
        )

    def _rows_between(self, conn: Connection, after: int, upto: int) -> Iterator[LoggedEvent]:
        position = after
        while position < upto:
            batch = self.log.read_rows(conn, after=position, upto=upto, limit=_BATCH)
            if not batch:
                return
            yield from batch
            position = batch[-1].position

    def _advance(
        self,
        conn: Connection,
        projection: Projection,
        state: ProjectionState,
        rows: Sequence[LoggedEvent],
    ) -> None:
        store = SqlRowStore(conn, state.live_version)
        outcome = apply_rows(projection, rows, store, start=state.position, start_chain=state.chain)
        store.flush()
        state.position, state.chain = outcome.position, outcome.chain
        if outcome.error is not None:
            state.stopped = True
            state.error = outcome.error
            log.error(
                "view stopped at a poison event",
                extra={"view": projection.name, **outcome.error},
            )
        save_state(conn, state)

    # -- catch-up ---------------------------------------------------------------------

    def catch_up(self, store: Store, name: str, *, batch: int = 1000) -> ProjectionState:
        """Follow the log from the projection's position to the head, batch by batch."""
        projection = self.select([name])[0]
        while True:
            with store.write() as conn:
                state = load_states(conn, lock=True).get(name)
                if state is None:
                    raise InvalidInput(f"projection {name} has no state; run init", field="name")
                if state.stopped:
                    return state
                rows = self.log.read_rows(conn, after=state.position, limit=batch)
                if not rows:
                    return state
                self._advance(conn, projection, state, rows)

    # -- rebuild (blue/green) -----------------------------------------------------------

    def rebuild(
        self,
        store: Store,
        names: Sequence[str] = (),
        *,
        progress: Progress | None = None,
        builder: GroupBuilder | None = None,
        workers: int = 1,
        check: Callable[[int], None] | None = None,
    ) -> dict[str, RebuildOutcome]:
        """Build the next version of each view from position 0, catch up, swap atomically.

        With a ``builder`` and ``workers > 1`` the views are split into groups of
        similar weight, each replayed and written by its own process; the swap
        stays one transaction here. ``check(head)`` runs beside the build (the
        log's chain check): if it raises, nothing is swapped in and the error
        stands, so views are never served from a log that does not verify.
        """
        chosen = self.select(names)
        start = time.perf_counter()
        with store.write() as conn:
            states = load_states(conn, lock=True)
            if not names:  # a view added after this store's init waits for init to build it
                chosen = [p for p in chosen if p.name in states]
            head0 = self.log.head_in(conn).position
            versions: dict[str, tuple[int, int]] = {}
            for p in chosen:
                st = states.get(p.name)
                if st is None:
                    raise InvalidInput(f"projection {p.name} has no state; run init", field="name")
                nxt = max(st.live_version, st.building_version or 0) + 1
                st.building_version = nxt
                save_state(conn, st)
                versions[p.name] = (st.live_version, nxt)
        for p in chosen:
            self._drop_versions(store, p, keep=versions[p.name][0])
        checked: dict[str, BaseException] = {}

        def run_check() -> None:
            try:
                if check is not None:
                    check(head0)
            except BaseException as exc:  # re-raised below, before any swap
                checked["error"] = exc

        checker = threading.Thread(target=run_check, name="rebuild-chain-check")
        checker.start()
        try:
            groups = _groups(chosen, workers)
            if builder is not None and len(groups) > 1:
                errors = builder([[p.name for p in g] for g in groups], versions, head0, progress)
            else:
                errors = self.build_versions(
                    store, [p.name for p in chosen], versions, head0, progress
                )
        finally:
            checker.join()
        if "error" in checked:
            for p in chosen:
                self._drop_versions(store, p, keep=versions[p.name][0])
            with store.write() as conn:  # as if the rebuild had never started
                for name, st in load_states(conn, lock=True).items():
                    if name in versions:
                        st.building_version = None
                        save_state(conn, st)
            # The error itself is the command's outcome (one message, INTEGRITY): logged
            # at info only, so stderr holds that message and nothing else.
            log.info(
                "rebuild refused: the log does not verify; nothing swapped",
                extra={"views": [p.name for p in chosen], "head": head0},
            )
            raise checked["error"]
        if errors:
            log.error(
                "rebuild stopped at a poison event; nothing swapped",
                extra={"views": [p.name for p in chosen], "head": head0, "errors": errors},
            )
            raise InvalidInput(
                "rebuild stopped at a poison event; the live views are untouched",
                field="name",
                errors=errors,
            )
        report = self._swap(store, chosen, versions, head0)
        log.info(
            "rebuild swapped",
            extra={
                "views": sorted(report),
                "head": head0,
                "workers": workers,
                "replayed": sum(r["replayed"] for r in report.values()),
                "tail": sum(r["tail"] for r in report.values()),
                "duration_ms": round((time.perf_counter() - start) * 1000, 3),
            },
        )
        return report

    def build_versions(
        self,
        store: Store,
        names: Sequence[str],
        versions: dict[str, tuple[int, int]],
        head0: int,
        progress: Progress | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Replay ``names`` up to ``head0`` in memory and write them as their next version.

        Each view replays through its rebuild kernel (``Projection.replayer``); a view
        whose kernel raises is replayed again through ``apply``, which names the
        poison event. Returns the poison event per view that could not be built
        (nothing is swapped then). Safe to run in a separate process.
        """
        chosen = self.select(names)
        # Millions of short-lived rows: the cyclic collector would rescan them
        # over and over; view rows contain no reference cycles.
        collector_was_enabled = gc.isenabled()
        gc.disable()
        try:
            built, errors = self._replay_kernels(store, chosen, versions, head0, progress)
        finally:
            if collector_was_enabled:
                gc.enable()
        if progress is not None:
            progress(head0, head0)
        if errors:
            return errors
        for p in chosen:
            for table, rows in built[p.name].tables():
                self._write_table(store, table, rows)
        return errors

    def _replay_kernels(
        self,
        store: Store,
        chosen: Sequence[Projection],
        versions: dict[str, tuple[int, int]],
        head0: int,
        progress: Progress | None,
    ) -> tuple[dict[str, Replayer], dict[str, dict[str, Any]]]:
        """One scan of the log for every view in ``chosen``, each through its kernel.

        Per stored topic, a dispatch entry holds the upcast (only where the row is an
        older format or version: ``StoredType.upcast`` is then the same code
        ``EVENT_TYPES.decode`` runs) and the handlers of the views consuming it, so
        an event is decoded once (orjson, straight from the stored bytes) and costs
        one dictionary lookup plus one call per consuming view. Topics no view
        consumes are filtered out in SQL and never decoded.
        """
        built = {p.name: p.replayer(versions[p.name][1]) for p in chosen}
        failed: set[str] = set()

        def dispatch_table() -> dict[str, tuple[StoredType | None, tuple[tuple[str, Any], ...]]]:
            table: dict[str, tuple[StoredType | None, tuple[tuple[str, Any], ...]]] = {}
            for topic, projections in _by_topic(chosen).items():
                stored = EVENT_TYPES.resolve(topic)
                current = stored.format != 0 and stored.version == stored.type.version
                handlers = tuple(
                    (p.name, built[p.name].handlers[stored.type.name])
                    for p in projections
                    if p.name not in failed
                )
                table[topic] = (None if current else stored, handlers)
            return table

        dispatch = dispatch_table()
        loads = orjson.loads
        done = 0
        name = ""
        with store.read() as conn:
            for position, topic, state in self.log.scan(
                conn, after=0, upto=head0, topics=list(dispatch)
            ):
                stored, handlers = dispatch[topic]
                try:
                    data = loads(state)
                except ValueError:  # orjson's error: the checked decode names the row
                    decode_state(position, topic, state)
                    raise
                if type(data) is not dict:
                    decode_state(position, topic, state)
                if stored is not None:
                    stored.upcast(data)
                try:
                    for name, handler in handlers:  # noqa: B007 (``name`` is read below)
                        handler(position, data)
                except Exception:
                    # Not necessarily poison: ``apply`` decides, in the replay below.
                    # The views after this one still get this event.
                    failed.add(name)
                    index = [n for n, _ in handlers].index(name)
                    for other, handler in handlers[index + 1 :]:
                        try:
                            handler(position, data)
                        except Exception:
                            failed.add(other)
                    dispatch = dispatch_table()
                done += 1
                if progress is not None and done % 10_000 == 0:
                    progress(position, head0)
        errors: dict[str, dict[str, Any]] = {}
        if failed:
            again = [p for p in chosen if p.name in failed]
            memory = {p.name: MemoryRowStore() for p in again}
            self._replay(store, head0, _by_topic(again), memory, errors, None)
            for p in again:
                if p.name not in errors:  # the kernel disagreed with apply: apply wins
                    log.warning("rebuild kernel failed where apply did not", extra={"view": p.name})
                    generic = GenericReplayer(p, versions[p.name][1])
                    generic.memory = memory[p.name]
                    built[p.name] = generic
        return built, errors

    @staticmethod
    def _write_table(store: Store, table: ViewTable, rows: Mapping[Key, RowTuple]) -> None:
        """Write one table's rows in key order (bulk inserts then append to the
        clustered index, measured twice as fast as log order), in large batches."""
        ordered = _insert_order_tuples(rows)
        for start in range(0, len(ordered), _WRITE_BATCH):
            with store.write() as conn:
                write_tuples(conn, table, ordered[start : start + _WRITE_BATCH])

    def _replay(
        self,
        store: Store,
        head0: int,
        by_topic: dict[str, list[Projection]],
        memory: dict[str, MemoryRowStore],
        errors: dict[str, dict[str, Any]],
        progress: Progress | None,
    ) -> None:
        """Replay through ``apply`` (the reference path; also names poison events)."""
        done = 0
        with store.read() as conn:
            for position, topic, state in self.log.scan(
                conn, after=0, upto=head0, topics=list(by_topic)
            ):
                done += 1
                if progress is not None and done % 10_000 == 0:
                    progress(position, head0)
                event = ViewEvent(position, *decode_state(position, topic, state))  # decoded once
                for p in by_topic[topic]:
                    if p.name in errors:
                        continue
                    try:
                        p.apply(event, memory[p.name])
                    except Exception as exc:
                        errors[p.name] = {
                            "position": position,
                            "topic": topic,
                            "error": f"{type(exc).__name__}: {exc}",
                        }

    def _swap(
        self,
        store: Store,
        chosen: Sequence[Projection],
        versions: dict[str, tuple[int, int]],
        head0: int,
    ) -> dict[str, RebuildOutcome]:
        report: dict[str, RebuildOutcome] = {}
        with store.write() as conn:
            head = self.log.lock_head(conn)
            states = load_states(conn, lock=True)
            tail = list(self._rows_between(conn, head0, head.position))
            for p in chosen:
                live, nxt = versions[p.name]
                st = states[p.name]
                if st.building_version != nxt:
                    raise Conflict(
                        f"another rebuild of {p.name} started meanwhile; re-run the rebuild",
                        projection=p.name,
                    )
                building = ProjectionState(
                    name=p.name,
                    code_version=p.version,
                    live_version=nxt,
                    position=head0,
                    chain=self._chain_at(conn, head0),
                    mode=st.mode,
                    stopped=False,
                    error=None,
                )
                self._advance(conn, p, building, tail)
                if building.stopped:
                    raise InvalidInput(
                        "rebuild stopped at a poison event in the tail; live views untouched",
                        field="name",
                        errors={p.name: building.error},
                    )
                report[p.name] = {
                    "previous_version": live,
                    "live_version": nxt,
                    "position": building.position,
                    "replayed": head0,
                    "tail": len(tail),
                }
        for p in chosen:
            self._drop_versions(store, p, keep=versions[p.name][1])
        return report

    def _chain_at(self, conn: Connection, position: int) -> bytes:
        if position == 0:
            return ZERO_CHAIN
        rows = self.log.read_rows(conn, after=position - 1, upto=position, limit=1)
        return rows[0].chain if rows else ZERO_CHAIN

    def _drop_versions(self, store: Store, projection: Projection, *, keep: int) -> None:
        """Delete every version but ``keep``: two ranges of the primary key's leading
        column, so the rows kept are never scanned (nor locked, on InnoDB)."""
        for table in projection.tables:
            t = table.physical
            with store.write() as conn:
                conn.execute(t.delete().where(t.c.view_version < keep))
                conn.execute(t.delete().where(t.c.view_version > keep))

    # -- verify ------------------------------------------------------------------------

    def verify(self, store: Store, names: Sequence[str] = ()) -> list[VerifyResult]:
        """Replay into memory and compare with every live view row by row (R21)."""
        chosen = self.select(names)
        with store.read() as conn:
            states = load_states(conn)
            missing = [p.name for p in chosen if p.name not in states]
            if missing and names:
                raise InvalidInput(
                    f"projection {missing[0]} has no state; run init", field="name", view=missing[0]
                )
            # A view added after this store's init has no rows to differ yet (``projections
            # status`` shows it missing, and readers of it fail closed until init builds it).
            chosen = [p for p in chosen if p.name in states]
            live: dict[str, dict[str, dict[tuple[Any, ...], Row]]] = {}
            for p in chosen:
                st = states[p.name]
                live[p.name] = {
                    t.name: {t.key_of(r): r for r in read_version_rows(conn, t, st.live_version)}
                    for t in p.tables
                }
            upto = max((states[p.name].position for p in chosen), default=0)
            memory = {p.name: MemoryRowStore() for p in chosen}
            replay_errors: dict[str, dict[str, Any]] = {}
            by_topic = _by_topic(chosen)
            for position, topic, state in self.log.scan(
                conn, after=0, upto=upto, topics=list(by_topic)
            ):
                event = ViewEvent(position, *decode_state(position, topic, state))
                for p in by_topic[topic]:
                    if p.name in replay_errors or position > states[p.name].position:
                        continue
                    try:
                        p.apply(event, memory[p.name])
                    except Exception as exc:
                        replay_errors[p.name] = {"position": position, "error": str(exc)}
            chains = {p.name: self._chain_at(conn, states[p.name].position) for p in chosen}
        results = []
        for p in chosen:
            st = states[p.name]
            difference = None
            if chains[p.name] != st.chain:
                difference = Difference(
                    p.name,
                    "projection_state",
                    {"name": p.name},
                    "the recorded chain does not match the log at the recorded position",
                    None,
                    None,
                )
            elif p.name in replay_errors:
                difference = Difference(
                    p.name, "replay", {}, replay_errors[p.name]["error"], None, None
                )
            else:
                difference = self._first_difference(p, live[p.name], memory[p.name])
            count = sum(len(v) for v in live[p.name].values())
            digest = rows_digest(p, live[p.name])
            results.append(VerifyResult(p.name, st.position, count, difference, digest))
        return results

    @staticmethod
    def _first_difference(
        projection: Projection,
        live: dict[str, dict[tuple[Any, ...], Row]],
        memory: MemoryRowStore,
    ) -> Difference | None:
        for table in projection.tables:
            have = live[table.name]
            want = memory.rows(table)
            for key in sorted(set(have) | set(want), key=_safe_key):
                a, b = have.get(key), want.get(key)
                if a == b:
                    continue
                shown_key = {k: _shown(v) for k, v in zip(table.key, key, strict=True)}
                if a is None:
                    problem = "row missing from the live view"
                elif b is None:
                    problem = "row in the live view that a replay does not produce"
                else:
                    cols = [c for c in table.columns if a.get(c) != b.get(c)]
                    problem = f"column(s) {', '.join(cols)} differ"
                return Difference(
                    projection.name, table.name, shown_key, problem, _shown_row(a), _shown_row(b)
                )
        return None

    # -- status ------------------------------------------------------------------------

    def status(self, store: Store) -> ProjectionsStatus:
        with store.read() as conn:
            head = self.log.head_in(conn)
            states = load_states(conn)
        views: list[ViewStatus] = []
        for p in self.projections:
            st = states.get(p.name)
            if st is None:
                views.append({"name": p.name, "state": "missing"})
                continue
            views.append(
                {
                    "name": p.name,
                    "tables": [t.name for t in p.tables],
                    "mode": st.mode,
                    "code_version": p.version,
                    "built_with_code_version": st.code_version,
                    "live_version": st.live_version,
                    "position": st.position,
                    "lag": head.position - st.position,
                    "state": "stopped" if st.stopped else "running",
                    "error": st.error,
                    "rebuild_needed": st.code_version != p.version or st.stopped,
                }
            )
        return {"head": head.position, "views": views}


def rows_digest(projection: Projection, tables: dict[str, dict[tuple[Any, ...], Row]]) -> bytes:
    """One digest of a view's rows (``Purpose.PROJECTION``): every table in declaration
    order, every row in key order (bytewise, R3), every column typed and length-prefixed.

    It depends on nothing but the rows' values, so the same log gives the same digest on
    SQLite and on the MySQL family: restoring a store on another engine is checked by
    comparing these (``projections verify`` shows them).
    """
    h = hasher(Purpose.PROJECTION)
    for table in projection.tables:
        h.update(b"T" + lp(table.name.encode(), *(c.encode() for c in table.columns)))
        for row in tables.get(table.name, {}).values():
            h.update(b"R" + lp(lp(*(_cell(row[c]) for c in table.columns))))
    return h.digest()


def _cell(value: Any) -> bytes:
    """A column value as typed bytes (booleans are the integers the engines store)."""
    if value is None:
        return b"\x00"
    if isinstance(value, bool | int):
        return b"\x01" + int(value).to_bytes(8, "big", signed=True)
    if isinstance(value, bytes):
        return b"\x02" + value
    if isinstance(value, str):
        return b"\x03" + value.encode("utf-8", "surrogatepass")
    raise TypeError(f"a view column holds {type(value).__name__}, which has no digest encoding")


def _safe_key(key: tuple[Any, ...]) -> tuple[tuple[int, Any], ...]:
    """Sort key that never fails, even on hand-edited rows of the wrong type."""
    out: list[tuple[int, Any]] = []
    for part in key:
        if isinstance(part, bool | int):
            out.append((0, int(part)))
        elif isinstance(part, bytes | bytearray | memoryview):
            out.append((1, bytes(part)))
        else:
            out.append((2, str(part)))
    return tuple(out)


def _insert_order_tuples(rows: Mapping[Key, RowTuple]) -> list[RowTuple]:
    """Row tuples roughly in key order (see ``_insert_order``)."""
    if not rows:
        return []
    if all(type(k) is bytes for k in next(iter(rows))):
        return [rows[k] for k in sorted(rows)]
    return [rows[k] for k in sorted(rows, key=_flat)]


def _flat(key: tuple[Any, ...]) -> bytes:
    return b"\x00".join(k if isinstance(k, bytes) else str(k).encode() for k in key)


def _insert_order(rows: dict[tuple[Any, ...], Row]) -> list[Row]:
    """Rows roughly in key order, so bulk inserts append to the clustered index
    (measured twice as fast as log order). Identity keys cannot contain NUL (R1),
    so joining their bytes with NUL sorts like the tuples, at a fraction of the
    cost of comparing tuples; order is only a speed-up, never relied upon."""

    def flat(key: tuple[Any, ...]) -> bytes:
        return b"\x00".join(k if isinstance(k, bytes) else str(k).encode() for k in key)

    return [rows[k] for k in sorted(rows, key=flat)]


def _groups(projections: Sequence[Projection], workers: int) -> list[list[Projection]]:
    """Split views into at most ``workers`` groups of similar replay weight (greedy)."""
    count = max(1, min(workers, len(projections)))
    groups: list[list[Projection]] = [[] for _ in range(count)]
    loads = [0.0] * count
    for p in sorted(projections, key=lambda p: -p.weight):
        lightest = loads.index(min(loads))
        groups[lightest].append(p)
        loads[lightest] += p.weight
    return [g for g in groups if g]


def _by_topic(projections: Sequence[Projection]) -> dict[str, list[Projection]]:
    """Stored topic (every format and version of each type) -> the projections applying it."""
    out: dict[str, list[Projection]] = {}
    for p in projections:
        for topic in stored_topics(p.types):
            out.setdefault(topic, []).append(p)
    return out


def live_version(conn: Connection, name: str) -> int:
    """The live version of projection ``name`` (for readers outside the SQL views)."""
    from projections.framework import state_table

    found = conn.execute(
        sa.select(state_table.c.live_version).where(state_table.c.name == name.encode())
    ).scalar()
    if found is None:
        raise InvalidInput(f"projection {name} is not initialized; run init", field="db")
    return int(found)
