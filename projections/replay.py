"""Replaying the log from position 0 into a view's next version, in memory, then writing it.

Each view replays through its rebuild kernel (``Projection.replayer``, beside the view's
``apply`` in ``projections.views``); a view whose kernel raises is replayed again
through ``apply``, which names the poison event. The rows are bulk-written in key order.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from domain.event_types import EVENT_TYPES, StoredType, decode_state
from projections.framework import GenericReplayer, Projection, Replayer, ViewEvent, stored_topics
from projections.log_commitments import Commitments
from projections.ports import LogSource, Progress, Transactions
from projections.rows import MemoryRowStore, write_tuples
from projections.tables import Key, RowTuple, ViewTable

log = logging.getLogger("catalog_ledger.projections")
_WRITE_BATCH = 20_000


def build_versions(
    log_source: LogSource,
    store: Transactions,
    chosen: Sequence[Projection],
    versions: dict[str, tuple[int, int]],
    head0: int,
    progress: Progress | None = None,
) -> dict[str, dict[str, Any]]:
    """Replay ``chosen`` up to ``head0`` in memory and write them as their next version.

    Each view replays through its rebuild kernel (``Projection.replayer``); a view
    whose kernel raises is replayed again through ``apply``, which names the
    poison event. Returns the poison event per view that could not be built
    (nothing is swapped then). Safe to run in a separate process.
    """
    # Millions of short-lived rows: the cyclic collector would rescan them
    # over and over; view rows contain no reference cycles.
    collector_was_enabled = gc.isenabled()
    gc.disable()
    commitments = Commitments([p.name for p in chosen])
    try:
        built, errors = replay_kernels(
            log_source, store, chosen, versions, head0, progress, commitments
        )
    finally:
        if collector_was_enabled:
            gc.enable()
    if progress is not None:
        progress(head0, head0)
    if errors:
        return errors
    commitments.check(built)  # R28: nothing the log contradicts is ever written
    for p in chosen:
        for table, rows in built[p.name].tables():
            write_table(store, table, rows)
    return errors


def replay_kernels(
    log_source: LogSource,
    store: Transactions,
    chosen: Sequence[Projection],
    versions: dict[str, tuple[int, int]],
    head0: int,
    progress: Progress | None,
    commitments: Commitments | None = None,
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
        for topic, projections in by_topic(chosen).items():
            stored = EVENT_TYPES.resolve(topic)
            current = stored.format != 0 and stored.version == stored.type.version
            handlers = tuple(
                (p.name, built[p.name].handlers[stored.type.name])
                for p in projections
                if p.name not in failed
            )
            fold = commitments.handlers.get(stored.type.name) if commitments else None
            if fold is not None:  # what the log commits, folded beside the kernels (R28)
                handlers = (*handlers, ("", fold))
            table[topic] = (None if current else stored, handlers)
        return table

    dispatch = dispatch_table()
    loads = orjson.loads
    done = 0
    name = ""
    with store.read() as conn:
        for position, topic, state in log_source.scan(
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
        replay_apply(log_source, store, head0, by_topic(again), memory, errors, None)
        for p in again:
            if p.name not in errors:  # the kernel disagreed with apply: apply wins
                log.warning("rebuild kernel failed where apply did not", extra={"view": p.name})
                generic = GenericReplayer(p, versions[p.name][1])
                generic.memory = memory[p.name]
                built[p.name] = generic
    return built, errors


def write_table(store: Transactions, table: ViewTable, rows: Mapping[Key, RowTuple]) -> None:
    """Write one table's rows in key order (bulk inserts then append to the
    clustered index, measured twice as fast as log order), in large batches."""
    ordered = _insert_order_tuples(rows)
    for start in range(0, len(ordered), _WRITE_BATCH):
        with store.write() as conn:
            write_tuples(conn, table, ordered[start : start + _WRITE_BATCH])


def replay_apply(
    log_source: LogSource,
    store: Transactions,
    head0: int,
    by_topic: dict[str, list[Projection]],
    memory: dict[str, MemoryRowStore],
    errors: dict[str, dict[str, Any]],
    progress: Progress | None,
) -> None:
    """Replay through ``apply`` (the reference path; also names poison events)."""
    done = 0
    with store.read() as conn:
        for position, topic, state in log_source.scan(
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


def drop_versions(store: Transactions, projection: Projection, *, keep: int) -> None:
    """Delete every version but ``keep``: two ranges of the primary key's leading
    column, so the rows kept are never scanned (nor locked, on InnoDB)."""
    for table in projection.tables:
        t = table.physical
        with store.write() as conn:
            conn.execute(t.delete().where(t.c.view_version < keep))
            conn.execute(t.delete().where(t.c.view_version > keep))


def _insert_order_tuples(rows: Mapping[Key, RowTuple]) -> list[RowTuple]:
    """Row tuples roughly in key order, so bulk inserts append to the clustered index
    (measured twice as fast as log order). Identity keys cannot contain NUL (R1),
    so joining their bytes with NUL sorts like the tuples, at a fraction of the
    cost of comparing tuples; order is only a speed-up, never relied upon."""
    if not rows:
        return []
    if all(type(k) is bytes for k in next(iter(rows))):
        return [rows[k] for k in sorted(rows)]
    return [rows[k] for k in sorted(rows, key=_flat)]


def _flat(key: tuple[Any, ...]) -> bytes:
    return b"\x00".join(k if isinstance(k, bytes) else str(k).encode() for k in key)


def by_topic(projections: Sequence[Projection]) -> dict[str, list[Projection]]:
    """Stored topic (every format and version of each type) -> the projections applying it."""
    out: dict[str, list[Projection]] = {}
    for p in projections:
        for topic in stored_topics(p.types):
            out.setdefault(topic, []).append(p)
    return out
