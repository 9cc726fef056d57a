"""Blue/green rebuild: build each view's next version from the log, then swap it in.

The next version is replayed from position 0 up to the head read at the start
(``projections.replay``), beside the live one; the swap applies the events appended
meanwhile and moves ``projection_state`` to the new version in one transaction. The
log's chain check runs beside the build, and the new versions are checked against what
the log commits before the swap commits (``projections.log_commitments``, R28): if either
fails, nothing is swapped in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

from domain.errors import Conflict, IntegrityFailure, InvalidInput
from projections.apply import advance, chain_at, rows_between
from projections.framework import Projection
from projections.log_commitments import check_built
from projections.ports import GroupBuilder, LogSource, Progress, Transactions
from projections.replay import build_versions, drop_versions
from projections.state import ProjectionState, load_states, save_state

log = logging.getLogger("catalog_ledger.projections")


class RebuildOutcome(TypedDict):
    """One view's blue/green rebuild: versions swapped, events replayed and applied after."""

    previous_version: int
    live_version: int
    position: int
    replayed: int
    tail: int


def rebuild(
    log_source: LogSource,
    store: Transactions,
    chosen: Sequence[Projection],
    *,
    given: bool,
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
    start = time.perf_counter()
    with store.write() as conn:
        states = load_states(conn, lock=True)
        if not given:  # a view added after this store's init waits for init to build it
            chosen = [p for p in chosen if p.name in states]
        head0 = log_source.head_in(conn).position
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
        drop_versions(store, p, keep=versions[p.name][0])
    checked: dict[str, BaseException] = {}

    def run_check() -> None:
        try:
            if check is not None:
                check(head0)
        except BaseException as exc:  # re-raised below, before any swap
            checked["error"] = exc

    checker = threading.Thread(target=run_check, name="rebuild-chain-check")
    checker.start()
    errors: dict[str, dict[str, Any]] = {}
    try:
        groups = _groups(chosen, workers)
        if builder is not None and len(groups) > 1:
            errors = builder([[p.name for p in g] for g in groups], versions, head0, progress)
        else:
            errors = build_versions(log_source, store, chosen, versions, head0, progress)
    except IntegrityFailure as exc:  # a kernel's rows the log contradicts (R28), a bad row
        checked.setdefault("refused", exc)
    finally:
        checker.join()
    # A log row the build found tampered is named as the build found it (the chain
    # check may name the same row); a kernel the log contradicts yields to a log that
    # does not verify, which says more.
    refused = checked.get("refused")
    if refused is not None and ("error" not in checked or not _diverged(refused)):
        _abandon(store, chosen, versions)
        log.info(
            "rebuild refused: a rebuilt view does not match the log; nothing swapped",
            extra={"views": [p.name for p in chosen], "head": head0},
        )
        raise refused
    if "error" in checked:
        _abandon(store, chosen, versions)
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
    try:
        report = _swap(log_source, store, chosen, versions, head0)
    except IntegrityFailure:
        # A rebuilt version the log contradicts (R28) never goes live: the swap's
        # transaction rolled back, and the versions it built are dropped.
        _abandon(store, chosen, versions)
        log.info(
            "rebuild refused: a rebuilt view does not match the log; nothing swapped",
            extra={"views": [p.name for p in chosen], "head": head0},
        )
        raise
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


def _abandon(
    store: Transactions, chosen: Sequence[Projection], versions: dict[str, tuple[int, int]]
) -> None:
    """Drop the versions a refused rebuild built: as if it had never started."""
    for p in chosen:
        drop_versions(store, p, keep=versions[p.name][0])
    with store.write() as conn:
        for name, st in load_states(conn, lock=True).items():
            if name in versions:
                st.building_version = None
                save_state(conn, st)


def _swap(
    log_source: LogSource,
    store: Transactions,
    chosen: Sequence[Projection],
    versions: dict[str, tuple[int, int]],
    head0: int,
) -> dict[str, RebuildOutcome]:
    report: dict[str, RebuildOutcome] = {}
    with store.write() as conn:
        head = log_source.lock_head(conn)
        states = load_states(conn, lock=True)
        tail = list(rows_between(log_source, conn, head0, head.position))
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
                chain=chain_at(log_source, conn, head0),
                mode=st.mode,
                stopped=False,
                error=None,
            )
            advance(conn, p, building, tail)
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
        # Before the commit that swaps: the new versions against what the log commits.
        check_built(
            log_source,
            conn,
            chosen,
            {
                **{name: st.live_version for name, st in states.items()},
                **{name: nxt for name, (_live, nxt) in versions.items()},
            },
        )
    for p in chosen:
        drop_versions(store, p, keep=versions[p.name][1])
    return report


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


def _diverged(error: BaseException) -> bool:
    """Whether ``error`` is the R28 check refusing a rebuilt view (``check_built``)."""
    details = getattr(error, "details", {})
    return details.get("rule") == "R28" and "view" in details
