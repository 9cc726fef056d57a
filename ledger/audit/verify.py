"""Verifying the whole log from its stored bytes (R17, R20-R22, R23).

``verify_log`` streams the whole log once and recomputes every ``event_id``,
the chain and the Merkle root; replays every lifecycle transition
(``domain.audit``) and every catalog revision (``CatalogReplay``); optionally
proves the log extends an earlier checkpoint, compares every live view with a
replay and re-reads every official source from git. Byte checks can run in
worker processes while the replay runs here.
"""

from __future__ import annotations

import hashlib
import queue
import struct
from collections.abc import Callable, Generator, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain import merkle
from domain.audit import LifecycleAuditor
from domain.digests import ZERO_CHAIN, Purpose, hasher
from domain.errors import IntegrityFailure, InvalidInput, LedgerError
from domain.event_types import (
    EVENT_TYPES,
    REPLAY_TYPES,
    T_PREPARED,
    UnknownEventType,
)
from domain.merkle import MerkleStack
from domain.notes import Checkpoint, VerifierKey
from ledger.audit.catalog_tie import checkpoint_problems
from ledger.audit.export import row_damage
from ledger.audit.proofs import b64
from ledger.audit.replay import CATALOG_TYPES, CatalogReplay
from ledger.log import tables as schema
from ledger.store.runtime import Ledger

Progress = Callable[[int, int], None]
#: Parallel audit workers verify whole chunks of 2^16 positions.
CHUNK = 1 << 16
#: A one-worker chain check of a log up to this many positions runs in the calling
#: thread: checking it takes less than starting a worker process.
IN_PROCESS_UPTO = 4096
# -- verifying the whole log -------------------------------------------------------------------


@dataclass
class Problem:
    position: int | None
    check: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"position": self.position, "check": self.check, "message": self.message}


@dataclass
class AuditReport:
    size: int = 0
    root: bytes = merkle.EMPTY_ROOT
    chain: bytes = ZERO_CHAIN
    revisions: int = 0
    problems: list[Problem] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def first(self) -> Problem | None:
        """The earliest problem; at one position, bytes before meaning (a tampered row
        is named as tampered, not as an illegal transition)."""
        rank = {"position": 0, "event_id": 1, "chain": 2}
        ordered = sorted(
            self.problems, key=lambda p: (p.position is None, p.position or 0, rank.get(p.check, 3))
        )
        return ordered[0] if ordered else None

    def to_json(self) -> dict[str, Any]:
        first = self.first()
        return {
            "ok": self.ok,
            "size": self.size,
            "root": b64(self.root),
            "chain": self.chain.hex(),
            "catalog_revisions": self.revisions,
            "checks": self.checks,
            "first_problem": first.to_json() if first else None,
            "problems": [p.to_json() for p in self.problems[:100]],
        }


def verify_log(
    ledger: Ledger,
    *,
    from_checkpoint: str | None = None,
    verifier: VerifierKey | None = None,
    replay: bool = True,
    views: bool = True,
    sources: bool = False,
    progress: Progress | None = None,
    workers: int = 1,
    chunk: int = CHUNK,
) -> AuditReport:
    """Recompute and check everything the log commits to; name the first bad position.

    With ``workers > 1`` (and no checkpoint, which needs every leaf here) the byte
    checks run in that many processes while this one replays the lifecycle and
    the catalog from the same rows.
    """
    report = AuditReport()
    cp: Checkpoint | None = None
    if from_checkpoint is not None:
        cp = verifier.verify(from_checkpoint) if verifier else Checkpoint.parse(from_checkpoint)
    stack = MerkleStack(keep_leaves=cp is not None)
    auditor, catalog = LifecycleAuditor(), CatalogReplay(keep=-1)
    generations: list[dict[str, Any]] = []
    total = ledger.recorder.head().position
    report.checks = ["event_id", "chain", "merkle"]
    if replay:
        report.checks += ["lifecycle", "catalog"]
    if cp is None and workers > 1 and ledger.db.url:
        expected, chain, head = _verify_parallel(
            ledger,
            report,
            auditor,
            catalog,
            replay,
            generations if sources else None,
            workers,
            stack,
            chunk,
        )
    else:
        with ledger.db.read() as conn, closing(_stored_rows(ledger, conn, report)) as stored:
            head = ledger.recorder.head_in(conn)
            rows: Iterator[Row] = stored
            if replay:
                rows = _replaying(rows, auditor, catalog, report, generations if sources else None)
            expected, chain = _verify_rows(rows, stack, report, progress, total)
    position_count = _count(report, expected)
    report.size, report.chain, report.root = position_count, chain, stack.root()
    report.revisions = auditor.catalog_revision
    if not report.problems and (head.position != position_count or head.chain != chain):
        report.problems.append(
            Problem(
                min(head.position, position_count) + 1,
                "head",
                f"the head row says position {head.position}, the log holds {position_count} "
                "verified rows",
            )
        )
    if replay and not report.problems:
        for message in auditor.finish():
            report.problems.append(Problem(None, "lifecycle", message))
        for position, message in catalog.finish():
            report.problems.append(Problem(position, "replay", message))
    if cp is not None and not any(
        p.check in ("position", "event_id", "chain") for p in report.problems
    ):
        _check_extension(report, cp, stack)
    if views:
        report.checks.append("views")
        try:
            results = ledger.runner.verify(ledger.db)
        except IntegrityFailure as exc:  # a row the views' replay cannot decode
            report.problems.append(Problem(exc.details.get("position"), "views", exc.message))
            results = []
        for result in results:
            if result.difference is not None:
                d = result.difference
                report.problems.append(
                    Problem(
                        None,
                        "views",
                        f"view {d.table} differs from a replay at {d.key}: {d.problem}",
                    )
                )
    report.checks.append("checkpoints")  # the stored cosigned checkpoints (R29)
    report.problems.extend(Problem(None, "checkpoints", m) for m in checkpoint_problems(ledger))
    if sources:
        report.checks.append("sources")
        report.problems.extend(_check_sources(generations))
    if progress is not None:
        progress(total, total)
    return report


Row = tuple[int, bytes, int, bytes, bytes, bytes, bytes]


def _stored_rows(
    ledger: Ledger,
    conn: Connection,
    report: AuditReport,
    *,
    after: int = 0,
    upto: int | None = None,
) -> Generator[Row, None, None]:
    """Every stored row, as ``scan_full`` gives it, without stopping at a damaged one.

    A value not of its column's type (TEXT, an INTEGER or NULL where bytes are
    declared: the export's definition of damaged, ``row_damage``) is a ``stored``
    problem at its position; the row's stored bytes (a TEXT value's own bytes, nothing
    for NULL) still go through the byte checks, so event id and chain are checked too.
    """
    for row in ledger.recorder.scan_stored(conn, after=after, upto=upto):
        position, agg, version, topic, state, event_id, chain = row
        if (
            type(agg) is bytes
            and type(version) is int
            and type(topic) is bytes
            and type(state) is bytes
            and type(event_id) is bytes
            and type(chain) is bytes
        ):
            yield row  # type: ignore[misc]  # checked just above
            continue
        at = int(position)  # type: ignore[call-overload]  # the integer primary key
        for column, problem in row_damage(row).items():
            report.problems.append(Problem(at, "stored", f"{column} {problem}"))
        yield (
            at,
            _as_bytes(agg),
            version if type(version) is int else 0,
            _as_bytes(topic),
            _as_bytes(state),
            _as_bytes(event_id),
            _as_bytes(chain),
        )


def _as_bytes(value: object) -> bytes:
    """The bytes a damaged cell holds: a TEXT value's own bytes, an INTEGER's digits."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    return b"" if value is None else str(value).encode()


_U64 = struct.Struct(">Q").pack
_LEN16 = _U64(16)
_LEN8 = _U64(8)


def _verify_rows(
    rows: Iterator[tuple[int, bytes, int, bytes, bytes, bytes, bytes]],
    stack: MerkleStack,
    report: AuditReport,
    progress: Progress | None,
    total: int,
    *,
    after: int = 0,
    chain: bytes = ZERO_CHAIN,
) -> tuple[int, bytes]:
    """The hot loop: position order, event_id, chain link, Merkle leaf, for every row.

    Written flat (bound methods in locals, the Merkle stack inlined) because it
    runs once per event of the whole log.
    """
    copy_event = hasher(Purpose.EVENT_ID).copy
    copy_chain = hasher(Purpose.CHAIN).copy
    sha256 = hashlib.sha256
    u64 = _U64
    leaves, pending = stack.leaves, stack.stack
    expected = after
    for position, agg, version, topic, state, stored_id, stored_chain in rows:
        expected += 1
        if position != expected:
            report.problems.append(
                Problem(
                    expected,
                    "position",
                    f"expected position {expected}, found {position} (a row is missing, "
                    "duplicated or out of order)",
                )
            )
            break
        h = copy_event()
        h.update(_LEN16 + agg + _LEN8 + u64(version) + u64(len(topic)) + topic + u64(len(state)))
        h.update(state)
        if h.digest() != stored_id:
            report.problems.append(
                Problem(position, "event_id", "the stored event_id does not match the stored bytes")
            )
            break
        c = copy_chain()
        c.update(chain + stored_id)
        chain = c.digest()
        if chain != stored_chain:
            report.problems.append(
                Problem(position, "chain", "the stored chain does not follow from the previous row")
            )
            break
        value = sha256(b"\x00" + stored_id).digest()
        if leaves is not None:
            leaves.append(value)
        size = 1
        while pending and pending[-1][0] == size:
            value = sha256(b"\x01" + pending.pop()[1] + value).digest()
            size <<= 1
        pending.append((size, value))
        if progress is not None and not position % 50_000:
            progress(position, total)
    return expected, chain


def _chain_worker(url: str, after: int, upto: int, chunk: int, results: Any) -> None:
    """Verify positions ``after+1 .. upto`` (a run of whole chunks, the last maybe
    partial): position order, event ids, chain links from the stored predecessor;
    report chunk roots and, for a partial tail, its Merkle stack."""
    from ledger.log.db import open_database

    try:
        db = open_database(url)
        ledger = Ledger(db)
        report = AuditReport()
        roots: list[bytes] = []
        tail: list[tuple[int, bytes]] = []
        with db.read() as conn:
            chain = ZERO_CHAIN
            if after:
                rows = ledger.recorder.read_rows(conn, after=after - 1, upto=after, limit=1)
                chain = rows[0].chain if rows else ZERO_CHAIN
            scan = _stored_rows(ledger, conn, report, after=after, upto=upto)
            start = after
            while start < upto and not report.problems:
                end = min(start + chunk, upto)
                stack = MerkleStack(keep_leaves=False)
                expected, chain = _verify_rows(
                    islice(scan, end - start), stack, report, None, 0, after=start, chain=chain
                )
                if report.problems:
                    break
                if expected != end:
                    report.problems.append(
                        Problem(
                            expected + 1,
                            "position",
                            f"expected position {expected + 1}, the log ends at {expected}",
                        )
                    )
                    break
                if end - start == chunk:
                    roots.append(stack.stack[0][1])
                else:
                    tail = stack.stack
                start = end
            scan.close()  # the scan's cursor, before the store closes
        db.close()
        results.put(("ok", after, roots, tail, chain, [p.to_json() for p in report.problems]))
    except BaseException as exc:  # reported to the parent, never a traceback
        results.put(("failed", after, f"{type(exc).__name__}: {exc}"))


def verify_chain_parallel(
    url: str, size: int, workers: int, chunk: int = CHUNK
) -> tuple[list[Problem], bytes, bytes]:
    """Chain + Merkle over ``size`` positions with ``workers`` processes.

    Returns (problems, root, chain at ``size``). Each worker takes a contiguous run
    of whole chunks (powers of two, so every full chunk is a perfect aligned
    subtree) and checks its first link against the stored predecessor: together
    they check every link exactly as a single pass would.
    """
    import multiprocessing

    if chunk & (chunk - 1):
        raise InvalidInput("the chunk size must be a power of two", field="chunk")
    chunks = max(1, -(-size // chunk))
    per = -(-chunks // workers)
    bounds = [
        (i * per * chunk, min(size, (i + 1) * per * chunk))
        for i in range(workers)
        if i * per * chunk < size
    ]
    outcomes = {}
    if workers == 1 and size <= IN_PROCESS_UPTO:
        # One worker over a short log (the rebuild's chain check): the same worker in
        # this thread, which the caller already runs beside its own work; a process
        # start costs more than the whole check.
        local: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for a, b in bounds:
            _chain_worker(url, a, b, chunk, local)
            outcome = local.get()
            outcomes[outcome[1]] = outcome
    else:
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        procs = [
            ctx.Process(target=_chain_worker, args=(url, a, b, chunk, results)) for a, b in bounds
        ]
        for proc in procs:
            proc.start()
        for _ in procs:
            outcome = results.get()
            outcomes[outcome[1]] = outcome
        for proc in procs:
            proc.join()
    problems: list[Problem] = []
    stack = MerkleStack(keep_leaves=False)
    chain = ZERO_CHAIN
    for after, _ in bounds:
        outcome = outcomes[after]
        if outcome[0] != "ok":
            raise IntegrityFailure(f"an audit worker failed: {outcome[2]}")
        _, _, roots, tail, chain, found = outcome
        problems.extend(Problem(p["position"], p["check"], p["message"]) for p in found)
        for root in roots:
            stack.add_node(chunk, root)
        for tail_size, tail_hash in tail:
            stack.add_node(tail_size, tail_hash)
    return problems, stack.root(), chain


def _replaying(
    rows: Iterator[tuple[int, bytes, int, bytes, bytes, bytes, bytes]],
    auditor: LifecycleAuditor,
    catalog: CatalogReplay,
    report: AuditReport,
    generations: list[dict[str, Any]] | None,
) -> Iterator[tuple[int, bytes, int, bytes, bytes, bytes, bytes]]:
    """Feed decoded lifecycle and catalog events to the replays as rows stream by.

    Every row's topic goes through the type table: a type or version this
    release does not know is a problem at its position (fail closed, R23), and
    old formats and versions are upcast before the replays see them.
    """
    for row in rows:
        try:
            stored = EVENT_TYPES.resolve(row[3])
        except UnknownEventType as exc:
            report.problems.append(Problem(row[0], "type", exc.message))
            yield row
            return
        name = stored.type.name
        if name in REPLAY_TYPES:
            try:
                data = orjson.loads(row[4])
            except orjson.JSONDecodeError:
                data = None
            if not isinstance(data, dict):  # the export's definition of a damaged state
                found = row_damage(row).get("state", "is not a JSON object")
                report.problems.append(Problem(row[0], "stored", f"state {found}"))
                yield row
                return
            data = stored.upcast(data)
            problem = auditor.feed(name, data)
            if problem is None and name in CATALOG_TYPES:
                problem = catalog.feed(row[0], name, data)
            if problem is not None:
                # Reported only if the row itself verifies: the loop consuming us
                # checks the bytes first, so a tampered row is named as such.
                report.problems.append(Problem(row[0], "replay", problem))
                yield row
                return
            if generations is not None and name == T_PREPARED:
                generations.append({"position": row[0], **data})
        yield row


def _verify_parallel(
    ledger: Ledger,
    report: AuditReport,
    auditor: LifecycleAuditor,
    catalog: CatalogReplay,
    replay: bool,
    generations: list[dict[str, Any]] | None,
    workers: int,
    stack: MerkleStack,
    chunk: int,
) -> tuple[int, bytes, Any]:
    """Byte checks in worker processes, replay here, over the same rows."""
    import threading

    with ledger.db.read() as conn:
        head = ledger.recorder.head_in(conn)
        last = conn.execute(sa.select(sa.func.max(schema.events.c.position))).scalar() or 0
    outcome: dict[str, Any] = {}

    def byte_checks() -> None:
        try:
            outcome["result"] = verify_chain_parallel(ledger.db.url, int(last), workers, chunk)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=byte_checks)
    thread.start()
    try:
        if replay:
            with ledger.db.read() as conn:
                rows = (
                    (p, b"", 0, t.encode(), s, b"", b"")
                    # Every row: the replay also proves each topic is a known type.
                    for p, t, s in ledger.recorder.scan(conn, after=0, upto=int(last))
                )
                for _ in _replaying(rows, auditor, catalog, report, generations):
                    pass
    finally:
        thread.join()
    if "error" in outcome:
        raise outcome["error"]
    problems, root, chain = outcome["result"]
    report.problems.extend(problems)
    stack.stack[:] = [(int(last), root)] if last else []
    verified = _count(report, int(last))
    return verified, chain, head


def _count(report: AuditReport, expected: int) -> int:
    """How many rows verified byte for byte."""
    broken = [
        p.position or 1 for p in report.problems if p.check in ("position", "event_id", "chain")
    ]
    return min(broken) - 1 if broken else expected


def _check_extension(report: AuditReport, cp: Checkpoint, stack: MerkleStack) -> None:
    """The current log must be a consistent extension of the checkpoint (R22)."""
    report.checks.append("checkpoint")
    assert stack.leaves is not None
    size = len(stack.leaves)
    if cp.size > size:
        report.problems.append(
            Problem(
                size + 1,
                "checkpoint",
                f"the log holds {size} events but the checkpoint commits to {cp.size}: "
                "the tail was removed",
            )
        )
        return
    try:
        if cp.size == 0:
            return
        proof = merkle.consistency_proof(stack.leaves, cp.size, size) if cp.size < size else []
        merkle.verify_consistency(cp.size, size, proof, cp.root, report.root)
    except LedgerError as exc:
        report.problems.append(
            Problem(
                None,
                "checkpoint",
                f"the log is not a consistent extension of the checkpoint of size {cp.size}: "
                f"history up to that size was rewritten ({exc.message})",
            )
        )


def _check_sources(generations: list[dict[str, Any]]) -> list[Problem]:
    """Re-read every official generation's content from git at its commit (R5, R9)."""
    from domain.identity import PackName
    from domain.manifest import ManifestPack, OfficialSource
    from ledger.sources.resolve import resolve_packs

    problems = []
    for gen in generations:
        source = gen["source"]
        try:
            (resolved,) = resolve_packs(
                [
                    ManifestPack(
                        PackName.trusted(gen["pack"]),
                        OfficialSource(source["locator"], source["revision"], source["path"]),
                    )
                ],
                base=Path(source["locator"]),
            )
        except LedgerError as exc:
            problems.append(
                Problem(
                    gen["position"],
                    "sources",
                    f"generation {gen['install_id']} of {gen['pack']!r}: its source cannot be "
                    f"re-read: {exc.message}",
                )
            )
            continue
        if resolved.content.payload_hash_v1 != gen["payload_hash"]:
            problems.append(
                Problem(
                    gen["position"],
                    "sources",
                    f"generation {gen['install_id']} of {gen['pack']!r}: git content at "
                    f"{source['revision']} no longer matches its payload hash",
                )
            )
    return problems
