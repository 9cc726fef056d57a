"""Running projections: inline in the append, catch-up and status; rebuild and verify
are delegated to ``projections.rebuild`` and ``projections.verify``.

The runner knows nothing of how the log is stored: the ledger hands it a
``LogSource`` (read rows, read and lock the head) and ``Transactions`` (read and
write transactions). Dependencies therefore still point inward.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, NotRequired, TypedDict

from sqlalchemy.engine import Connection

from domain.digests import ZERO_CHAIN
from domain.errors import InvalidInput
from domain.log import LoggedEvent
from projections import rebuild as blue_green
from projections import replay
from projections import verify as verification
from projections.apply import advance, rows_between
from projections.framework import Projection
from projections.ports import GroupBuilder, LogSource, Progress, Transactions
from projections.rebuild import RebuildOutcome
from projections.state import ProjectionState, load_states, save_state
from projections.verify import VerifyResult

__all__ = [
    "ProjectionRunner",
    "ProjectionsStatus",
    "ViewStatus",
]

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
                    *rows_between(self.log, conn, state.position, first - 1),
                    *rows,
                ]
            advance(conn, projection, state, pending)
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

    # -- catch-up ---------------------------------------------------------------------

    def catch_up(self, store: Transactions, name: str, *, batch: int = 1000) -> ProjectionState:
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
                advance(conn, projection, state, rows)

    # -- rebuild (blue/green) -----------------------------------------------------------

    def rebuild(
        self,
        store: Transactions,
        names: Sequence[str] = (),
        *,
        progress: Progress | None = None,
        builder: GroupBuilder | None = None,
        workers: int = 1,
        check: Callable[[int], None] | None = None,
    ) -> dict[str, RebuildOutcome]:
        """Build the next version of each view from position 0, catch up, swap atomically
        (``projections.rebuild.rebuild``)."""
        return blue_green.rebuild(
            self.log,
            store,
            self.select(names),
            given=bool(names),
            progress=progress,
            builder=builder,
            workers=workers,
            check=check,
        )

    def build_versions(
        self,
        store: Transactions,
        names: Sequence[str],
        versions: dict[str, tuple[int, int]],
        head0: int,
        progress: Progress | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Replay ``names`` up to ``head0`` and write them as their next version
        (``projections.replay.build_versions``; safe to run in a separate process)."""
        return replay.build_versions(self.log, store, self.select(names), versions, head0, progress)

    # -- verify ------------------------------------------------------------------------

    def verify(self, store: Transactions, names: Sequence[str] = ()) -> list[VerifyResult]:
        """Replay into memory and compare with every live view row by row (R21)."""
        return verification.verify(self.log, store, self.select(names), given=bool(names))

    # -- status ------------------------------------------------------------------------

    def status(self, store: Transactions) -> ProjectionsStatus:
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
