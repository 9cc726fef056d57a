"""Verify: replay every view through ``apply`` in memory and compare it with the live
rows, row by row (R21); the first difference names its table, key and columns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from domain.digests import Purpose, hasher, lp
from domain.errors import InvalidInput
from domain.event_types import decode_state
from projections.apply import chain_at
from projections.framework import Projection, ViewEvent
from projections.ports import LogSource, Transactions
from projections.replay import by_topic
from projections.rows import MemoryRowStore, read_version_rows
from projections.state import load_states
from projections.tables import Row


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


def verify(
    log_source: LogSource,
    store: Transactions,
    chosen: Sequence[Projection],
    *,
    given: bool,
) -> list[VerifyResult]:
    """Replay into memory and compare with every live view row by row (R21)."""
    with store.read() as conn:
        states = load_states(conn)
        missing = [p.name for p in chosen if p.name not in states]
        if missing and given:
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
        topics = by_topic(chosen)
        for position, topic, state in log_source.scan(
            conn, after=0, upto=upto, topics=list(topics)
        ):
            event = ViewEvent(position, *decode_state(position, topic, state))
            for p in topics[topic]:
                if p.name in replay_errors or position > states[p.name].position:
                    continue
                try:
                    p.apply(event, memory[p.name])
                except Exception as exc:
                    replay_errors[p.name] = {"position": position, "error": str(exc)}
        chains = {p.name: chain_at(log_source, conn, states[p.name].position) for p in chosen}
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
            difference = _first_difference(p, live[p.name], memory[p.name])
        count = sum(len(v) for v in live[p.name].values())
        digest = rows_digest(p, live[p.name])
        results.append(VerifyResult(p.name, st.position, count, difference, digest))
    return results


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
