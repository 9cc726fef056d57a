"""Audit: verify everything from the stored log, prove inclusion and consistency (R17, R20-R22).

* ``MerkleLog`` answers roots and RFC 9162 proofs over the stored ``event_id``s,
  caching perfect subtree hashes (levels >= 10) so a proof over a million
  events reads one chunk of leaves plus O(log n) cached nodes.
* ``verify_log`` streams the whole log once and recomputes, from the stored
  bytes: every ``event_id``, the chain, the Merkle root; replays every
  lifecycle transition (``domain.audit``) and every catalog revision's content
  digest and parent link (``CatalogReplay``, with the publisher's own rules);
  optionally proves the log extends an earlier checkpoint, compares every live
  view with a replay and re-reads every official source from git.
* ``history`` and ``view_at`` answer as-of questions from the log alone.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import orjson
import sqlalchemy as sa

from domain.audit import LifecycleAuditor
from domain.canonical import canonical_bytes_trusted
from domain.catalog import audience_digest
from domain.content import fact_hasher
from domain.digests import ZERO_CHAIN, Purpose, hasher
from domain.errors import IntegrityFailure, InvalidInput, LedgerError, Missing
from domain.event_types import (
    EVENT_TYPES,
    LIFECYCLE_TYPES,
    REPLAY_TYPES,
    T_ACTIVATED,
    T_ADVANCED,
    T_FAILED,
    T_GRANTED,
    T_LEGACY,
    T_LOCAL_INSTALLED,
    T_PREPARED,
    T_PUBLISHED,
    T_REBOUND,
    T_RETIRED,
    T_REVOKED,
    T_STARTED,
    UnknownEventType,
)
from ledger import merkle, schema
from ledger.checkpoint import Checkpoint, VerifierKey
from ledger.runtime import Ledger
from publisher.catalog import (
    BindingRow,
    BuiltCatalog,
    CatalogInput,
    Fact,
    PackAuthority,
    PublicationRejected,
    build_catalog,
)

Progress = Callable[[int, int], None]
CHUNK_LEVEL = 10  # perfect subtrees of 2^10 leaves and larger are cached
#: Parallel audit workers verify whole chunks of 2^16 positions.
CHUNK = 1 << 16


# -- Merkle over the stored log ---------------------------------------------------------------


class MerkleLog:
    """Roots and proofs over the stored ``event_id``s, with a subtree cache."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._cache: dict[tuple[int, int], bytes] = {}
        self._new: dict[tuple[int, int], bytes] = {}
        self._leaves: dict[int, list[bytes]] = {}

    def size(self) -> int:
        return self.ledger.recorder.head().position

    def _chunk(self, start: int) -> list[bytes]:
        """Leaf hashes of the 1024-leaf chunk beginning at ``start`` (0-based)."""
        if start not in self._leaves:
            with self.ledger.db.read() as conn:
                ids = self.ledger.recorder.event_ids(
                    conn, after=start, upto=start + (1 << CHUNK_LEVEL)
                )
            self._leaves[start] = [merkle.leaf_hash(i) for i in ids]
        return self._leaves[start]

    def node(self, start: int, end: int) -> bytes:
        """Hash of the perfect, aligned subtree over leaves ``[start, end)``."""
        size = end - start
        level = size.bit_length() - 1
        if level <= CHUNK_LEVEL:
            base = start - start % (1 << CHUNK_LEVEL)
            leaves = self._chunk(base)
            if len(leaves) < end - base:
                raise InvalidInput("the requested tree is larger than the log", field="size")
            return merkle.subtree_root(leaves, start - base, end - base)
        key = (level, start >> level)
        if key not in self._cache:
            self._load([key])
        if key not in self._cache:
            mid = start + size // 2
            value = merkle.node_hash(self.node(start, mid), self.node(mid, end))
            self._cache[key] = self._new[key] = value
        return self._cache[key]

    def _load(self, keys: list[tuple[int, int]]) -> None:
        t = schema.merkle
        with self.ledger.db.read() as conn:
            for level, idx in keys:
                found = conn.execute(
                    sa.select(t.c.hash).where(t.c.level == level, t.c.idx == idx)
                ).scalar()
                if found is not None:
                    self._cache[(level, idx)] = bytes(found)

    def flush(self) -> None:
        """Persist newly computed subtree hashes (idempotent)."""
        if not self._new:
            return
        t = schema.merkle
        with self.ledger.db.write() as conn:
            existing = {
                (int(r.level), int(r.idx))
                for r in conn.execute(
                    sa.select(t.c.level, t.c.idx).where(
                        sa.tuple_(t.c.level, t.c.idx).in_(list(self._new))
                    )
                )
            }
            rows = [
                {"level": lv, "idx": ix, "hash": h}
                for (lv, ix), h in self._new.items()
                if (lv, ix) not in existing
            ]
            if rows:
                conn.execute(t.insert(), rows)
        self._new.clear()

    def root(self, size: int) -> bytes:
        value = merkle.root_from(self.node, size)
        self.flush()
        return value

    def inclusion(self, position: int, size: int) -> dict[str, Any]:
        head = self.size()
        if not 1 <= position <= size <= head:
            raise InvalidInput(
                f"need 1 <= position <= size <= {head} (log size)",
                field="position",
                position=position,
                size=size,
            )
        proof = merkle.inclusion_proof_from(self.node, position - 1, size)
        with self.ledger.db.read() as conn:
            (event_id,) = self.ledger.recorder.event_ids(conn, after=position - 1, upto=position)
        document = {
            "type": "inclusion",
            "position": position,
            "leaf_index": position - 1,
            "tree_size": size,
            "event_id": event_id.hex(),
            "leaf_hash": _b64(merkle.leaf_hash(event_id)),
            "proof": [_b64(p) for p in proof],
            "root": _b64(self.root(size)),
        }
        self.flush()
        return document

    def consistency(self, size1: int, size2: int) -> dict[str, Any]:
        head = self.size()
        if not 1 <= size1 <= size2 <= head:
            raise InvalidInput(
                f"need 1 <= from-size <= to-size <= {head} (log size)",
                field="from_size",
                size1=size1,
                size2=size2,
            )
        proof = merkle.consistency_proof_from(self.node, size1, size2)
        document = {
            "type": "consistency",
            "size1": size1,
            "size2": size2,
            "root1": _b64(self.root(size1)),
            "root2": _b64(self.root(size2)),
            "proof": [_b64(p) for p in proof],
        }
        self.flush()
        return document


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


def _unb64(text: str, field: str) -> bytes:
    import base64

    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        raise InvalidInput(f"{field} is not base64", field=field) from None


def origin_of(ledger: Ledger) -> str:
    """The checkpoint origin: a stable name for this store (its id in ledger_meta)."""
    t = schema.meta
    with ledger.db.read() as conn:
        found = conn.execute(sa.select(t.c.value).where(t.c.name == b"store_id")).scalar()
    if found is None:
        raise InvalidInput("the store has no id; run `catalog-ledger init`", field="db")
    return f"catalog-ledger/{bytes(found).decode()}"


def checkpoint(ledger: Ledger) -> Checkpoint:
    log = MerkleLog(ledger)
    size = log.size()
    return Checkpoint(origin_of(ledger), size, log.root(size) if size else merkle.EMPTY_ROOT)


def _proof_value(document: dict[str, Any], name: str, convert: Callable[[Any], Any]) -> Any:
    """``document[name]`` through ``convert``; missing or malformed is INVALID, not a crash."""
    if name not in document:
        raise InvalidInput(f"the proof file has no {name!r}", field=f"file.{name}")
    try:
        return convert(document[name])
    except (TypeError, ValueError):
        raise InvalidInput(
            f"the proof file's {name!r} is malformed", field=f"file.{name}"
        ) from None


def _proof_hashes(value: Any) -> list[bytes]:
    if not isinstance(value, list):
        raise TypeError("not a list")
    return [_unb64(p, "proof") for p in value]


def verify_proof(document: dict[str, Any], cp: Checkpoint) -> dict[str, Any]:
    """Check a proof document against a checkpoint, offline (no database)."""
    kind = document.get("type")
    if kind == "inclusion":
        if document.get("tree_size") != cp.size:
            raise IntegrityFailure(
                "the proof is for another tree size than the checkpoint",
                proof_size=document.get("tree_size"),
                checkpoint_size=cp.size,
            )
        event_id = _proof_value(document, "event_id", lambda v: bytes.fromhex(str(v)))
        leaf = merkle.leaf_hash(event_id)
        if leaf != _proof_value(document, "leaf_hash", lambda v: _unb64(str(v), "leaf_hash")):
            raise IntegrityFailure("the leaf hash does not match the event id")
        merkle.verify_inclusion(
            _proof_value(document, "leaf_index", int),
            cp.size,
            leaf,
            _proof_value(document, "proof", _proof_hashes),
            cp.root,
        )
        position = _proof_value(document, "position", lambda v: v)
        return {"ok": True, "type": kind, "position": position, "size": cp.size}
    if kind == "consistency":
        if document.get("size2") != cp.size:
            raise IntegrityFailure(
                "the proof does not end at the checkpoint's size",
                proof_size=document.get("size2"),
                checkpoint_size=cp.size,
            )
        size1 = _proof_value(document, "size1", int)
        merkle.verify_consistency(
            size1,
            cp.size,
            _proof_value(document, "proof", _proof_hashes),
            _proof_value(document, "root1", lambda v: _unb64(str(v), "root1")),
            cp.root,
        )
        return {"ok": True, "type": kind, "size1": size1, "size2": cp.size}
    raise InvalidInput("the proof file has no known type", field="file")


# -- replaying the catalog ----------------------------------------------------------------------

CATALOG_TYPES = frozenset(
    {
        T_PREPARED,
        T_ACTIVATED,
        T_RETIRED,
        T_FAILED,
        T_STARTED,
        T_ADVANCED,
        T_LOCAL_INSTALLED,
        T_LEGACY,
        T_GRANTED,
        T_REBOUND,
        T_REVOKED,
        T_PUBLISHED,
    }
)


@dataclass
class CatalogReplay:
    """Rebuilds the publisher's input at every revision and recomputes its digest (R17)."""

    bindings: dict[tuple[str, ...], BindingRow] = field(default_factory=dict)
    pending: list[tuple[int, str, BindingRow]] = field(default_factory=list)
    activations: dict[str, list[Any]] = field(default_factory=dict)
    components: dict[tuple[str, str], dict[tuple[str, str], Fact]] = field(default_factory=dict)
    newest: dict[str, tuple[str, str]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    revisions: dict[int, tuple[int, BuiltCatalog]] = field(default_factory=dict)
    keep: int | None = None  # keep the built catalog of this revision (as-of views)
    recorded: dict[tuple[str, str], tuple[int, str | None]] = field(default_factory=dict)

    def feed(self, position: int, topic: str, d: dict[str, Any]) -> str | None:
        if topic == T_PREPARED:
            digest_of = fact_hasher(d["pack"], d["install_id"], d["payload_hash"])
            facts = {}
            for component in d["components"]:
                fact = canonical_bytes_trusted(component)
                facts[(component["kind"], component["key"])] = Fact.parse(fact, digest_of(fact))
            self.components[(d["pack"], d["install_id"])] = facts
            self.newest[d["pack"]] = (d["install_id"], "preparing")
        elif topic in (T_ACTIVATED, T_RETIRED, T_FAILED):
            status = {T_ACTIVATED: "active", T_RETIRED: "retired"}.get(
                topic, "failed_dirty" if d.get("dirty") else "failed_clean"
            )
            if self.newest.get(d["pack"], ("",))[0] == d["install_id"]:
                self.newest[d["pack"]] = (d["install_id"], status)
            if status != "active":
                self.components.pop((d["pack"], d["install_id"]), None)
        elif topic in (T_STARTED, T_ADVANCED):
            self.activations[d["pack"]] = [
                d["pack"],
                d["install_id"],
                d["revision"],
                d["epoch"],
                d["payload_hash"],
            ]
        elif topic == T_LOCAL_INSTALLED:
            self.kinds[d["pack"]] = "local_path"
        elif topic == T_LEGACY:
            self.kinds.setdefault(d["pack"], "legacy")
        elif topic in (T_GRANTED, T_REBOUND, T_REVOKED):
            row = BindingRow(
                d["audience_kind"],
                d["audience_id"],
                d["pack"],
                d["kind"],
                d["key"],
                d.get("credential_set"),
                d.get("install_id") or "",
                d.get("payload_hash", ""),
            )
            self.pending.append((position, "revoke" if topic == T_REVOKED else "grant", row))
        elif topic == T_PUBLISHED:
            return self._published(position, d)
        return None

    def _published(self, position: int, d: dict[str, Any]) -> str | None:
        cut = d.get("bindings_position")
        cut = position - 1 if cut is None else cut
        later = []
        for change_position, op, row in self.pending:
            if change_position > cut:
                later.append((change_position, op, row))
            elif op == "revoke":
                self.bindings.pop(row.ident, None)
            else:
                self.bindings[row.ident] = row
        self.pending = later
        try:
            built = build_catalog(CatalogInput(list(self.bindings.values()), self._packs()))
        except PublicationRejected as exc:
            return f"revision {d['revision']} was published with an invalid closure: {exc}"
        if built.content_digest != d["content_digest"]:
            return (
                f"revision {d['revision']}'s content digest does not match its content "
                f"(recomputed {built.content_digest})"
            )
        for kind, ident, value in d["audiences"]:
            if built.audience_digests.get((kind, ident)) != value:
                return f"revision {d['revision']}'s digest of audience {kind}:{ident} is wrong"
            self.recorded[(kind, ident)] = (d["revision"], value)
        if self.keep is None or self.keep == d["revision"]:
            self.revisions[d["revision"]] = (position, built)
        return None

    def _packs(self) -> dict[str, PackAuthority]:
        packs: dict[str, PackAuthority] = {}
        for pack, entry in self.activations.items():
            packs[pack] = PackAuthority(
                pack=pack,
                source_kind="official_repo",
                install_id=entry[1],
                revision=entry[2],
                epoch=entry[3],
                payload_hash=entry[4],
                dirty=self.newest.get(pack, ("", ""))[1] == "failed_dirty",
                components=self.components.get((pack, entry[1]), {}),
            )
        for pack, kind in self.kinds.items():
            packs.setdefault(pack, PackAuthority(pack=pack, source_kind=kind))
        for pack, (_, status) in self.newest.items():
            packs.setdefault(
                pack, PackAuthority(pack=pack, source_kind="absent", dirty=status == "failed_dirty")
            )
        return packs


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
            "root": _b64(self.root),
            "chain": self.chain.hex(),
            "catalog_revisions": self.revisions,
            "checks": self.checks,
            "first_problem": first.to_json() if first else None,
            "problems": [p.to_json() for p in self.problems[:100]],
        }


class _MerkleStack:
    """Streaming RFC 9162 root: O(log n) perfect subtrees, optionally every leaf."""

    def __init__(self, keep_leaves: bool) -> None:
        self.stack: list[tuple[int, bytes]] = []
        self.leaves: list[bytes] | None = [] if keep_leaves else None

    def add(self, leaf: bytes) -> None:
        if self.leaves is not None:
            self.leaves.append(leaf)
        self.add_node(1, leaf)

    def add_node(self, size: int, value: bytes) -> None:
        """Append a perfect subtree of ``size`` leaves (aligned at the current end)."""
        while self.stack and self.stack[-1][0] == size:
            _, left = self.stack.pop()
            value = merkle.node_hash(left, value)
            size *= 2
        self.stack.append((size, value))

    def root(self) -> bytes:
        if not self.stack:
            return merkle.EMPTY_ROOT
        value = self.stack[-1][1]
        for _, left in reversed(self.stack[:-1]):
            value = merkle.node_hash(left, value)
        return value


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
    stack = _MerkleStack(keep_leaves=cp is not None)
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
        with ledger.db.read() as conn:
            head = ledger.recorder.head_in(conn)
            rows = ledger.recorder.scan_full(conn)
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
    if cp is not None and not any(
        p.check in ("position", "event_id", "chain") for p in report.problems
    ):
        _check_extension(report, cp, stack)
    if views:
        report.checks.append("views")
        for result in ledger.runner.verify(ledger.db):
            if result.difference is not None:
                d = result.difference
                report.problems.append(
                    Problem(
                        None,
                        "views",
                        f"view {d.table} differs from a replay at {d.key}: {d.problem}",
                    )
                )
    if sources:
        report.checks.append("sources")
        report.problems.extend(_check_sources(generations))
    if progress is not None:
        progress(total, total)
    return report


_U64 = struct.Struct(">Q").pack
_LEN16 = _U64(16)
_LEN8 = _U64(8)


def _verify_rows(
    rows: Iterator[tuple[int, bytes, int, bytes, bytes, bytes, bytes]],
    stack: _MerkleStack,
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
    from ledger.db import open_database

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
            scan = ledger.recorder.scan_full(conn, after=after, upto=upto)
            start = after
            while start < upto and not report.problems:
                end = min(start + chunk, upto)
                stack = _MerkleStack(keep_leaves=False)
                expected, chain = _verify_rows(
                    _take(scan, end - start), stack, report, None, 0, after=start, chain=chain
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
            for _ in scan:  # finish the scan's cursor before the store closes
                pass
        db.close()
        results.put(("ok", after, roots, tail, chain, [p.to_json() for p in report.problems]))
    except BaseException as exc:  # reported to the parent, never a traceback
        results.put(("failed", after, f"{type(exc).__name__}: {exc}"))


def _take(rows: Iterator[Any], count: int) -> Iterator[Any]:
    for _ in range(count):
        try:
            yield next(rows)
        except StopIteration:
            return


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
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_chain_worker, args=(url, a, b, chunk, results)) for a, b in bounds]
    for proc in procs:
        proc.start()
    outcomes = {}
    for _ in procs:
        outcome = results.get()
        outcomes[outcome[1]] = outcome
    for proc in procs:
        proc.join()
    problems: list[Problem] = []
    stack = _MerkleStack(keep_leaves=False)
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
                report.problems.append(Problem(row[0], "replay", "the state is not JSON"))
                yield row
                return
            if not isinstance(data, dict):
                report.problems.append(Problem(row[0], "replay", "the state is not an object"))
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
    stack: _MerkleStack,
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


def _check_extension(report: AuditReport, cp: Checkpoint, stack: _MerkleStack) -> None:
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
    from ledger.sources import resolve_packs

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


# -- as-of questions from the log alone -----------------------------------------------------------


def history(ledger: Ledger, pack: str) -> list[dict[str, Any]]:
    """Every lifecycle event of ``pack``, in log order, decoded from the log."""
    out = []
    with ledger.db.read() as conn:
        for position, _agg, _ver, topic, state, event_id, _chain in ledger.recorder.scan_full(conn):
            stored = EVENT_TYPES.resolve(topic)
            name = stored.type.name
            if name not in LIFECYCLE_TYPES:
                continue
            data = stored.upcast(orjson.loads(state))
            if data.get("pack") != pack:
                continue
            summary: dict[str, Any] = {
                k: data[k]
                for k in (
                    "install_id",
                    "ordinal",
                    "origin",
                    "epoch",
                    "revision",
                    "dirty",
                    "reason",
                    "from_install_id",
                    "successor_install_id",
                )
                if k in data
            }
            if name == T_PREPARED:
                summary["revision"] = data["source"].get("revision")
                summary["payload_hash"] = data["payload_hash"]
            out.append(
                {
                    "position": position,
                    "event": name,
                    "event_id": event_id.hex(),
                    "timestamp": data.get("timestamp"),
                    **summary,
                }
            )
    return out


def view_at(ledger: Ledger, audience: tuple[str, str], revision: int) -> dict[str, Any]:
    """What ``audience`` was served at ``revision``, replayed from the log alone."""
    replay = CatalogReplay(keep=revision)
    with ledger.db.read() as conn:
        for position, topic, state in ledger.recorder.scan(
            conn,
            after=0,
            upto=ledger.recorder.head_in(conn).position,
            topics=EVENT_TYPES.topics_of(CATALOG_TYPES),
        ):
            problem = replay.feed(position, *EVENT_TYPES.decode(topic, state))
            if problem is not None:
                raise IntegrityFailure(f"the log does not replay: {problem}", position=position)
            if revision in replay.revisions:
                break
    if revision not in replay.revisions:
        raise Missing(f"revision {revision} was never published")
    position, built = replay.revisions[revision]
    kind, ident = audience
    grants = [g for g in built.grants if (g[0], g[1]) == (kind, ident)]
    if not grants:
        raise Missing("no catalog view is published for this audience")
    facts_by_id = {tuple(f[:4]): f[4] for f in built.facts}
    fact_rows = sorted({(g[2], g[6], g[3], g[4]) for g in grants})
    edges = [[g[2], g[3], g[4], g[5], g[6]] for g in grants]
    entries = [[*f, facts_by_id[f]] for f in fact_rows]
    return {
        "audience": f"{kind}:{ident}",
        "revision": revision,
        "position": position,
        "content_digest": built.content_digest,
        "audience_digest": audience_digest(audience, edges, entries),
        "grants": [
            {"pack": e[0], "kind": e[1], "key": e[2], "credential_set": e[3], "install_id": e[4]}
            for e in edges
        ],
        "facts": [
            {
                "pack": f[0],
                "install_id": f[1],
                "kind": f[2],
                "key": f[3],
                "fact_digest": facts_by_id[f],
            }
            for f in fact_rows
        ],
    }


def export_jsonl(ledger: Ledger, out: TextIO) -> int:
    """Every event as one JSON line (schema/LOG-FORMAT.md, "Export").

    Each record carries the exact stored state bytes (``state_b64``), so an
    auditor recomputes ``event_id`` and ``chain`` from the line alone, and says
    per record which log format and schema version the row was written in: a
    store written by 0.1 and appended to later holds both formats. A topic
    this release does not know is still exported (type, version and format
    null): the export never hides a row; ``audit verify`` fails it closed.
    """
    from uuid import UUID

    count = 0
    with ledger.db.read() as conn:
        for position, agg, version, topic, state, event_id, chain in ledger.recorder.scan_full(
            conn
        ):
            try:
                stored = EVENT_TYPES.resolve(topic)
                kind: tuple[Any, Any, Any] = (stored.format, stored.type.name, stored.version)
            except UnknownEventType:
                kind = (None, None, None)
            line = {
                "position": position,
                "aggregate_id": str(UUID(bytes=agg)),
                "version": version,
                "topic": topic.decode("utf-8", "replace"),
                "format": kind[0],
                "type": kind[1],
                "type_version": kind[2],
                "event_id": event_id.hex(),
                "chain": chain.hex(),
                "state_b64": base64.b64encode(state).decode("ascii"),
                "state_hex": None,
                "state": None,
            }
            try:
                line["state"] = orjson.loads(state)
            except orjson.JSONDecodeError:
                line["state_hex"] = state.hex()
            out.write(orjson.dumps(line).decode() + "\n")
            count += 1
    return count
