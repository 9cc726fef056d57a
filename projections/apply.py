"""Applying log rows to one view version through ``apply``: inline, catch-up, a rebuild's tail."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain.digests import ZERO_CHAIN
from domain.log import LoggedEvent
from ledger.log.sqltypes import mysql_errors
from projections.framework import Projection, ViewEvent, stored_topics
from projections.ports import LogSource
from projections.rows import RowStore, SqlRowStore
from projections.state import ProjectionState, save_state

#: Standard-library logging only (this layer stays free of the CLI's setup).
log = logging.getLogger("catalog_ledger.projections")
_BATCH = 5000


@dataclass
class ApplyOutcome:
    """What applying a batch did: how far it got and the poison event, if any."""

    position: int
    chain: bytes
    error: dict[str, Any] | None = field(default=None)


#: Errors of the database (a lost connection, a lock timeout), not of an event: an
#: inline apply re-raises them, so the append fails typed and nothing is written,
#: instead of stopping the view as if the event were poison.
def database_errors() -> tuple[type[BaseException], ...]:
    return mysql_errors("MySQLError", also=(sa.exc.SQLAlchemyError, sqlite3.Error))


def apply_rows(
    projection: Projection,
    rows: Sequence[LoggedEvent],
    store: RowStore,
    *,
    start: int,
    start_chain: bytes,
) -> ApplyOutcome:
    """Apply ``rows`` in order; stop at the first event the projection cannot apply."""
    position, chain = start, start_chain
    topics = stored_topics(projection.types)
    buffered = store if isinstance(store, SqlRowStore) else None
    for row in rows:
        if row.topic in topics:
            # A row that does not decode is the log's damage (INTEGRITY naming it), not
            # a poison event of this view: it propagates, and the append or read fails.
            event = ViewEvent.decode(row)
            try:
                projection.apply(event, store)
            except database_errors():
                raise  # the store failed, not the event: the transaction aborts
            except Exception as exc:
                if buffered is not None:
                    buffered.discard_event()
                return ApplyOutcome(
                    position,
                    chain,
                    {
                        "position": row.position,
                        "topic": row.topic,
                        "error": f"{type(exc).__name__}: {exc}",
                    },
                )
            if buffered is not None:
                buffered.commit_event()
        position, chain = row.position, row.chain
    return ApplyOutcome(position, chain)


def rows_between(
    log_source: LogSource, conn: Connection, after: int, upto: int
) -> Iterator[LoggedEvent]:
    """The log rows after ``after`` up to ``upto``, read in batches."""
    position = after
    while position < upto:
        batch = log_source.read_rows(conn, after=position, upto=upto, limit=_BATCH)
        if not batch:
            return
        yield from batch
        position = batch[-1].position


def chain_at(log_source: LogSource, conn: Connection, position: int) -> bytes:
    """The log's chain value at ``position``."""
    if position == 0:
        return ZERO_CHAIN
    rows = log_source.read_rows(conn, after=position - 1, upto=position, limit=1)
    return rows[0].chain if rows else ZERO_CHAIN


def advance(
    conn: Connection,
    projection: Projection,
    state: ProjectionState,
    rows: Sequence[LoggedEvent],
) -> None:
    """Apply ``rows`` to the projection's version ``state.live_version`` and save the
    state it reached; a poison event stops the view (R20)."""
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
