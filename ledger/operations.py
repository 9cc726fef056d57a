"""The store's own operations: admin (init, doctor, migrate), reads (log, status, view,
history), the writer lease's state, ``import --jsonl`` and the projections (rebuild,
verify, catch-up). ``ledger.api.Store`` delegates here; the commands (``apply``,
``publish``...) are in ``ledger.commands`` and the audit's in ``ledger.audit.operations``.

Each function takes the opened store it works on (``Database`` for the admin ones, which
run before the schema is known to be current; ``Ledger`` for the rest) and returns the
typed result of ``ledger.results`` that the CLI prints with ``--json``. What only some
of them use is imported in them, so that ``status`` and ``view`` (and the CLI that calls
them) start without the audit, export, command and signing code (issue 25.7;
tests/e2e/test_cli_basics.py checks it).
"""

from __future__ import annotations

import base64
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

from domain.errors import IntegrityFailure, InvalidInput, LedgerError, UsageError
from domain.event_types import EVENT_TYPES, T_LOCAL_REMOVED, T_REMOVED
from domain.identity import Audience
from domain.served import AudienceView
from ledger.log.db import Database
from ledger.log.stored import check_row
from ledger.results import (
    CaughtUp,
    DoctorResult,
    ImportResult,
    InitResult,
    LeaseStatus,
    LogPage,
    PackHash,
    ProjectionsVerifyResult,
    SchemaDifference,
    StatusResult,
    ViewCheck,
)
from ledger.store import contract, migrations
from ledger.store.init import StoreInfo, init_store
from ledger.store.init import ddl as store_ddl
from ledger.store.runtime import Ledger
from projections.queries.status import Removal, pack_status
from projections.reader import CatalogReader, parse_audience, parse_revision

if TYPE_CHECKING:
    from ledger.audit.results import AudienceHistoryResult, HistoryResult, PastView
    from ledger.commands.service import CommandService
    from ledger.store.migrations import MigrateResult
    from projections.rebuild import RebuildOutcome

Progress = Callable[[int, int], None]


# -- admin ---------------------------------------------------------------------------------


def init(db: Database) -> InitResult:
    """Create the store's schema (idempotent) and say what it found."""
    info: StoreInfo = init_store(db)
    return {
        "engine": info.engine,
        "server_version": info.server_version,
        "schema_version": info.schema_version,
        "head_position": info.head_position,
        "created": info.created,
        "db": db.display_url,
    }


def doctor(db: Database, *, repair: bool) -> DoctorResult:
    """Compare the live schema with the declared one (R24); ``repair`` restores the
    safe differences under the migration lock and compares again."""
    found = contract.repair(db) if repair else contract.check(db)
    return {
        "ok": all(d.safe for d in found),
        "differences": [cast(SchemaDifference, d.to_json()) for d in found],
    }


def doctor_exit_code(report: DoctorResult) -> int:
    """0 when nothing unsafe differs; 5 when only a migration is pending; 6 otherwise."""
    unsafe = [d for d in report["differences"] if not d["safe"]]
    if not unsafe:
        return 0
    if all(d["found"].endswith(contract.MIGRATE_HINT) for d in unsafe):
        return 5
    return 6


def migrate(db: Database, *, dry_run: bool) -> MigrateResult:
    """The numbered schema migrations (R24); a store that moved gets its new views'
    state and builds them from the log."""
    result = migrations.migrate(db, dry_run=dry_run)
    if result["applied"] and not dry_run:
        init_store(db)
    return result


def ddl(dialect: str) -> str:
    """The DDL of every table for ``dialect`` (``sqlite`` or ``mysql``)."""
    return store_ddl(dialect)


# -- reads ---------------------------------------------------------------------------------


def log_page(ledger: Ledger, *, from_position: int, limit: int) -> LogPage:
    """Log rows from ``from_position``: topic, aggregate, version, event id, chain."""
    recorder = ledger.recorder
    with ledger.db.read() as conn:
        head = recorder.head_in(conn)
        rows = recorder.read_rows(conn, after=from_position - 1, limit=limit)
    for r in rows:  # a row shown is a row checked: a tampered state is INTEGRITY (R22)
        check_row(r)
    return {
        "head": {"position": head.position, "chain": head.chain.hex()},
        "events": [
            {
                "position": r.position,
                "topic": r.topic,
                "aggregate_id": str(r.aggregate_id),
                "version": r.version,
                "event_id": r.event_id.hex(),
                "chain": r.chain.hex(),
            }
            for r in rows
        ],
    }


def status(ledger: Ledger) -> StatusResult:
    """Per pack: active generation, newest attempt, dirty flag."""
    recorder = ledger.recorder
    with ledger.db.read() as conn:
        removal_topics = EVENT_TYPES.topics_of((T_REMOVED, T_LOCAL_REMOVED))
        rows = recorder.rows_of_topics(conn, removal_topics)
        removals = [_removal(p, t, s) for p, t, s in rows]
        packs = pack_status(conn, removals)
        head = recorder.head_in(conn)
    return {"head": head.position, "packs": packs}


def _removal(position: int, topic: bytes, state: bytes) -> Removal:
    """A stored removal event decoded; a state that is not its type's JSON is INTEGRITY."""
    try:
        name, data = EVENT_TYPES.decode(topic, state)
    except ValueError:  # orjson.JSONDecodeError
        raise IntegrityFailure(
            "a stored removal event is not JSON", position=position, topic=topic.decode()
        ) from None
    if not isinstance(data.get("pack"), str):
        raise IntegrityFailure(
            "a stored removal event names no pack", position=position, topic=topic.decode()
        )
    return position, name, data


@dataclass(frozen=True)
class ViewRequest:
    """``view``'s arguments, checked before the store is opened."""

    audience: Audience
    min_revision: int | None
    at_revision: int | None


def view_request(
    audience: str, *, min_revision: int | str | None, at_revision: int | str | None
) -> ViewRequest:
    """``audience`` (``app:<id>`` / ``integration:<id>``) and at most one revision, parsed;
    USAGE for both revisions, INVALID naming a bad part."""
    if min_revision is not None and at_revision is not None:
        raise UsageError("give --min-revision or --at-revision, not both")
    kind, sep, ident = audience.partition(":")
    parsed = parse_audience(kind, ident) if sep else parse_audience(audience, "")
    if at_revision is not None:
        revision = parse_revision(str(at_revision), field="at_revision")
        assert revision is not None
        return ViewRequest(parsed, None, revision)
    minimum = None if min_revision is None else parse_revision(str(min_revision))
    return ViewRequest(parsed, minimum, None)


def view(ledger: Ledger, request: ViewRequest) -> AudienceView | PastView:
    """What the audience is served, verified; at a revision, what it was served then,
    replayed from the log alone."""
    parsed = request.audience
    if request.at_revision is not None:
        from ledger.audit.history import view_at

        return view_at(ledger, (parsed.kind.value, parsed.id), request.at_revision)
    return CatalogReader(ledger.db).view(parsed, min_revision=request.min_revision)


def history_subject(pack: str | None, audience: str | None) -> str | Audience:
    """Exactly one of ``pack`` and ``audience`` (parsed), or USAGE."""
    if (pack is None) == (audience is None):
        raise UsageError("give --pack PACK or --audience AUDIENCE (exactly one)")
    if audience is not None:
        return Audience.parse(audience, field="audience")
    assert pack is not None
    return pack


def history(ledger: Ledger, subject: str | Audience) -> HistoryResult | AudienceHistoryResult:
    """Every lifecycle event of a pack, or every binding and credential event of an
    audience (R26), from the log alone."""
    from ledger.audit.history import audience_history
    from ledger.audit.history import history as pack_history

    if isinstance(subject, Audience):
        pair = (subject.kind.value, str(subject.id))
        return {"audience": subject.text, "events": audience_history(ledger, pair)}
    return {"pack": subject, "events": pack_history(ledger, subject)}


def pack_hash(manifest: Path, pack: str) -> PackHash:
    """The v1 and v0 payload hashes of ``pack``'s content as ``manifest`` resolves it."""
    from ledger.sources.resolve import load_manifest, resolve_packs

    loaded = load_manifest(manifest)
    chosen = [p for p in loaded.packs if p.name == pack]
    if not chosen:
        raise InvalidInput(f"pack {pack!r} is not in {manifest}", field="pack")
    (resolved,) = resolve_packs(chosen, base=manifest.resolve().parent)
    return {
        "pack": resolved.name,
        "category": resolved.content.category,
        "source": resolved.source.to_json(),
        "components": len(resolved.content.components),
        "payload_hash_v1": resolved.content.payload_hash_v1,
        "payload_hash_v0": resolved.content.payload_hash_v0,
    }


# -- the writer lease (R27) -----------------------------------------------------------------


def lease_status(service: CommandService, *, now_us: int | None = None) -> LeaseStatus:
    """Who holds the writer lease, at which epoch, until when (renewals included), as
    of ``now_us`` (microseconds since the epoch; default: the clock)."""
    from ledger.commands.writer_lease import WRITER_LEASE

    lease, expiry = service.lease_state()
    now = int(time.time() * 1_000_000) if now_us is None else now_us
    if lease is None:
        return {
            "lease": WRITER_LEASE,
            "held": False,
            "holder": None,
            "epoch": 0,
            "expires_at": None,
        }
    held = not lease.released and now < expiry
    return {
        "lease": WRITER_LEASE,
        "held": held,
        "holder": lease.holder if held else None,
        "epoch": lease.epoch,
        "expires_at": rfc3339(expiry) if held else None,
    }


def rfc3339(us: int) -> str:
    """Microseconds since the epoch as an RFC 3339 UTC time (``...Z``)."""
    return datetime.fromtimestamp(us / 1_000_000, tz=UTC).isoformat().replace("+00:00", "Z")


# -- import --------------------------------------------------------------------------------


def import_jsonl(
    ledger: Ledger,
    source: Path | str | IO[bytes] | IO[str],
    *,
    progress: Progress | None,
    legacy_no_trailer: bool,
    rebuild: Callable[[], dict[str, RebuildOutcome]],
) -> ImportResult:
    """Load an ``export --jsonl`` into this empty store, then ``rebuild`` every view
    (``Store.import_jsonl`` says the rules). A failed rebuild keeps the imported log
    and says so, with the count."""
    from ledger.audit.proofs import origin_of
    from ledger.store.restore import import_jsonl as restore_jsonl
    from ledger.store.restore import read_lines

    if isinstance(source, Path | str):
        path = Path(source)
        try:
            handle: IO[bytes] | IO[str] = path.open("rb")
        except OSError as exc:
            raise InvalidInput(f"cannot read {path}: {exc.strerror}", field="file") from None
        with handle:
            lines = read_lines(handle, name=str(path))
            restored = restore_jsonl(
                ledger,
                lines,
                total=_size_of(handle),
                progress=progress,
                legacy_no_trailer=legacy_no_trailer,
            )
    else:
        lines = read_lines(source, name=str(getattr(source, "name", "the input")))
        restored = restore_jsonl(
            ledger,
            lines,
            total=_size_of(source),
            progress=progress,
            legacy_no_trailer=legacy_no_trailer,
        )
    try:
        rebuilt = rebuild()
    except LedgerError as exc:
        raise type(exc)(
            f"the log was imported ({restored.imported} events) but the views were not "
            f"rebuilt: {exc.message}; run `catalog-ledger projections rebuild`",
            **{**exc.details, "imported": restored.imported},
        ) from None
    return {
        "imported": restored.imported,
        "head_position": restored.head_position,
        "chain": restored.chain.hex(),
        "root": base64.b64encode(restored.root).decode("ascii"),
        "origin": origin_of(ledger),
        "views_rebuilt": list(rebuilt),
    }


def _size_of(handle: IO[bytes] | IO[str]) -> int | None:
    """The size of a regular file (for progress); None for a pipe or a stream."""
    try:
        info = os.fstat(handle.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


# -- projections ---------------------------------------------------------------------------


def rebuild(
    ledger: Ledger,
    url: str,
    names: Sequence[str],
    *,
    workers: int | None,
    progress: Progress | None,
    chain_check: bool,
) -> dict[str, RebuildOutcome]:
    """Rebuild views beside the live ones from position 0, then swap atomically; the
    chain is checked (``check_chain``) in a worker of its own meanwhile."""
    from ledger.store.rebuild import default_workers, process_builder

    def check(size: int) -> None:
        check_chain(url, size)

    return ledger.runner.rebuild(
        ledger.db,
        names,
        progress=progress,
        builder=process_builder(url),
        workers=workers or default_workers(),
        check=check if chain_check else None,
    )


def check_chain(url: str, size: int) -> None:
    """Every event id and chain link up to ``size``, in one worker process."""
    from ledger.audit.verify import verify_chain_parallel

    problems, _root, _chain = verify_chain_parallel(url, size, workers=1)
    if problems:
        first = problems[0]
        raise IntegrityFailure(
            f"the log does not verify at position {first.position} ({first.check}): "
            f"{first.message}; no rebuilt view was swapped in",
            position=first.position,
            check=first.check,
        )


def stale_views(ledger: Ledger) -> list[str]:
    """The views built by other view code than this program's (R25)."""
    status = ledger.runner.status(ledger.db)
    return [
        v["name"]
        for v in status["views"]
        if v.get("state") != "missing" and v.get("built_with_code_version") != v.get("code_version")
    ]


def verify_projections(ledger: Ledger, names: Sequence[str]) -> ProjectionsVerifyResult:
    """Compare every live view with a fresh replay, row by row (R21); a difference is
    INTEGRITY naming the first one."""
    results = ledger.runner.verify(ledger.db, names)
    views: list[ViewCheck] = [
        {
            "name": r.projection,
            "position": r.position,
            "rows": r.rows,
            "ok": r.ok,
            "difference": asdict(r.difference) if r.difference else None,
            "digest": r.digest.hex(),
        }
        for r in results
    ]
    bad = [v for v in views if not v["ok"]]
    if bad:
        diff = bad[0]["difference"] or {}
        raise IntegrityFailure(
            f"view {diff.get('table')} differs from a fresh replay at key "
            f"{diff.get('key')}: {diff.get('problem')}",
            views=views,
        )
    return {"ok": True, "views": views}


def catch_up(ledger: Ledger, names: Sequence[str]) -> dict[str, CaughtUp]:
    """Advance catch-up views to the log head."""
    done: dict[str, CaughtUp] = {}
    for p in ledger.runner.select(names):
        if not p.inline:
            state = ledger.runner.catch_up(ledger.db, p.name)
            done[p.name] = {"position": state.position, "stopped": state.stopped}
    return done
