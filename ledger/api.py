"""The public Python API: open a store by URL, then call what the CLI calls.

Operators' automation and runtime services import this instead of shelling
out. Every CLI command is one method here with the same name and options
(``catalog-ledger apply M --no-publish`` is ``store.apply(M, publish=False)``),
returns the same typed result the CLI prints with ``--json``, and raises the
same typed errors (``domain.errors``) the CLI turns into exit codes::

    from ledger.api import open_store

    with open_store("sqlite:///catalog.db") as store:
        store.init()
        result = store.apply("release.json")
        print(result["catalog"]["revision"], result["catalog"]["content_digest"])
        view = store.view("integration:erp-sync")
"""

from __future__ import annotations

import base64
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, TextIO, TypedDict, cast, overload

from domain.coordination import DEFAULT_LEASE_TTL
from domain.errors import IntegrityFailure, InvalidInput, LedgerError, UsageError
from domain.event_types import EVENT_TYPES, T_LOCAL_REMOVED, T_REMOVED
from domain.identity import Audience
from domain.served import AudienceView
from ledger.log.db import Database, open_database
from ledger.log.recorder import check_row
from ledger.log.url import resolve_url
from ledger.store import contract, migrations
from ledger.store.init import StoreInfo, init_store, require_schema
from ledger.store.init import ddl as store_ddl
from ledger.store.runtime import Ledger
from projections.queries.status import PackStatus, Removal, pack_status
from projections.reader import CatalogReader, parse_audience, parse_revision

# What only some methods use is imported in them, so that ``status`` and ``view`` (and
# the CLI that calls them) start without the audit, export, command and signing code
# (issue 25.7; tests/test_cli_basics.py checks it).
if TYPE_CHECKING:
    from ledger.audit.results import (
        AudienceHistoryResult,
        CheckpointNote,
        ConsistencyProof,
        HistoryResult,
        InclusionProof,
        PastView,
        ProofCheck,
    )
    from ledger.audit.verify import AuditReport
    from ledger.commands.credentials import CredentialList, IssuedCredential, RevokedCredential
    from ledger.commands.results import ApplyResult, ImportLegacyResult, PublishResult
    from ledger.commands.service import CommandService
    from ledger.log.checkpoint import VerifierKey
    from ledger.store.migrations import MigrateResult
    from projections.runner import ProjectionsStatus, RebuildOutcome

Progress = Callable[[int, int], None]

__all__ = ["Store", "open_store"]


class InitResult(TypedDict):
    engine: str
    server_version: str
    schema_version: int
    head_position: int
    created: bool
    db: str


class SchemaDifference(TypedDict):
    object: str
    expected: str
    found: str
    safe: bool


class DoctorResult(TypedDict):
    ok: bool
    differences: list[SchemaDifference]


def doctor_exit_code(report: DoctorResult) -> int:
    """0 when nothing unsafe differs; 5 when only a migration is pending; 6 otherwise."""
    unsafe = [d for d in report["differences"] if not d["safe"]]
    if not unsafe:
        return 0
    if all(d["found"].endswith(contract.MIGRATE_HINT) for d in unsafe):
        return 5
    return 6


class LogHead(TypedDict):
    position: int
    chain: str


class ImportResult(TypedDict):
    """``import --jsonl``: the imported log (size, chain head, Merkle root) and the views."""

    imported: int
    head_position: int
    chain: str  # hex, as `log` and `audit verify` show it
    root: str  # base64, as `audit verify` and checkpoints show it
    origin: str  # this store's checkpoint origin: it keeps its own store id
    views_rebuilt: list[str]


class LogRow(TypedDict):
    position: int
    topic: str
    aggregate_id: str
    version: int
    event_id: str
    chain: str


class LogPage(TypedDict):
    head: LogHead
    events: list[LogRow]


class StatusResult(TypedDict):
    head: int
    packs: list[PackStatus]


class PackHash(TypedDict):
    pack: str
    category: str
    source: dict[str, Any]
    components: int
    payload_hash_v1: str
    payload_hash_v0: str


class ViewCheck(TypedDict):
    name: str
    position: int
    rows: int
    ok: bool
    difference: dict[str, Any] | None
    digest: str  # hex digest of the live rows: the same log gives it on every engine


class ProjectionsVerifyResult(TypedDict):
    ok: bool
    views: list[ViewCheck]


class CaughtUp(TypedDict):
    position: int
    stopped: bool


class LeaseStatus(TypedDict):
    lease: str
    held: bool
    holder: str | None
    epoch: int
    expires_at: str | None  # RFC 3339 UTC


def _rfc3339(us: int) -> str:
    return datetime.fromtimestamp(us / 1_000_000, tz=UTC).isoformat().replace("+00:00", "Z")


class KeygenResult(TypedDict):
    signer_key_file: str
    verifier_key: str


def read_text(path: Path, field: str) -> str:
    """A small UTF-8 input file (keys, checkpoints, proofs), or INVALID naming ``field``."""
    from ledger.sources.files import read_input_file

    data = read_input_file(path, field=field, limit=1 << 20)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{path} is not UTF-8 text", field=field) from None


def verifier_key(key: str | None) -> VerifierKey | None:
    """A verifier key given as a file or as its text."""
    from ledger.log.checkpoint import VerifierKey

    if key is None:
        return None
    text = read_text(Path(key), "key") if Path(key).is_file() else key
    return VerifierKey.parse(text, field="key")


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


def keygen(name: str, out: Path) -> KeygenResult:
    """Create an Ed25519 checkpoint signer key at ``out`` (and ``out.pub``).

    The private key file is created with mode 0600 in the same call that
    creates it (``O_CREAT | O_EXCL``): it is never readable by others, not
    even for an instant, and an existing file is never overwritten.
    """
    from ledger.log.checkpoint import SignerKey

    key = SignerKey.generate(name)
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise InvalidInput(
            f"{out} already exists; refusing to overwrite a key", field="out"
        ) from None
    except OSError as exc:
        raise InvalidInput(f"cannot create {out}: {exc.strerror}", field="out") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(key.text() + "\n")
        out.with_name(out.name + ".pub").write_text(key.verifier.text() + "\n", encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot write {out}: {exc.strerror}", field="out") from None
    return {"signer_key_file": str(out), "verifier_key": key.verifier.text()}


def check_proof(file: Path, checkpoint_file: Path, key: str | None = None) -> ProofCheck:
    """Verify a proof file offline against a (signed) checkpoint; no store needed."""
    from domain.canonical import parse_json
    from ledger.audit.proofs import verify_proof
    from ledger.log.checkpoint import Checkpoint

    note = read_text(checkpoint_file, "checkpoint")
    verifier = verifier_key(key)
    cp = verifier.verify(note) if verifier else Checkpoint.parse(note)
    document = parse_json(read_text(file, "file"), source=str(file))
    if not isinstance(document, dict):
        raise InvalidInput(f"{file} is not a proof document", field="file")
    return verify_proof(document, cp)


def ddl(dialect: str) -> str:
    """The DDL of every table for ``dialect`` (``sqlite`` or ``mysql``)."""
    return store_ddl(dialect)


class Store:
    """One catalog store, opened by URL (SQLite file or MySQL-family server)."""

    def __init__(self, url: str | None = None) -> None:
        self.url = resolve_url(url)
        self._db: Database | None = None
        self._ledger: Ledger | None = None
        self._older_ok = False

    # -- lifecycle of the handle ---------------------------------------------------------

    @property
    def db(self) -> Database:
        """The opened store; a SQLite file must exist (only ``init`` creates one)."""
        if self._db is None:
            self._db = open_database(self.url, create=False)
        return self._db

    @property
    def ledger(self) -> Ledger:
        """The initialized store at this program's schema version (checked once per
        handle: an unsafe difference is INTEGRITY, an older version MIGRATION_REQUIRED)."""
        return self._open(allow_older=False)

    @property
    def audit_ledger(self) -> Ledger:
        """The store for the read-only audit commands (``audit verify``, ``audit
        checkpoint``, ``audit prove``, ``export``, ``history``, ``log``): they read every
        schema version this release knows."""
        return self._open(allow_older=True)

    def _open(self, *, allow_older: bool) -> Ledger:
        if self._ledger is None or (self._older_ok and not allow_older):
            require_schema(self.db)
            contract.require(self.db, allow_older=allow_older)  # R24, before anything else
            self._ledger = Ledger(self.db)
            self._older_ok = allow_older
        return self._ledger

    def opener(self) -> Callable[[], Ledger]:
        """A factory of fresh handles on this store (one per server worker)."""
        url = self.url
        return lambda: Ledger(open_database(url, create=False))

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
        self._db = self._ledger = None

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the store -----------------------------------------------------------------------

    def init(self) -> InitResult:
        """Create the store and its schema (idempotent)."""
        if self._db is None:
            self._db = open_database(self.url, create=True)
        info: StoreInfo = init_store(self.db)
        return {
            "engine": info.engine,
            "server_version": info.server_version,
            "schema_version": info.schema_version,
            "head_position": info.head_position,
            "created": info.created,
            "db": self.db.display_url,
        }

    def doctor(self, *, repair: bool = False) -> DoctorResult:
        """Compare the live schema with the declared one (R24); ``repair`` restores the
        safe differences under the migration lock and compares again."""
        require_schema(self.db)
        found = contract.repair(self.db) if repair else contract.check(self.db)
        return {
            "ok": all(d.safe for d in found),
            "differences": [cast(SchemaDifference, d.to_json()) for d in found],
        }

    def migrate(self, *, dry_run: bool = False) -> MigrateResult:
        """Run the numbered schema migrations under the migration lock (R24); never
        downgrades and never changes a stored event byte. ``dry_run`` lists them."""
        require_schema(self.db)
        result = migrations.migrate(self.db, dry_run=dry_run)
        self._ledger = None  # the next command checks the migrated schema afresh
        if result["applied"] and not dry_run:
            init_store(self.db)  # new views get their state and are built from the log
        return result

    def log(self, *, from_position: int = 1, limit: int = 50) -> LogPage:
        """Log rows from ``from_position``: topic, aggregate, version, event id, chain."""
        recorder = self.audit_ledger.recorder
        with self.db.read() as conn:
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

    def status(self) -> StatusResult:
        """Per pack: active generation, newest attempt, dirty flag."""
        recorder = self.ledger.recorder
        with self.ledger.db.read() as conn:
            removal_topics = EVENT_TYPES.topics_of((T_REMOVED, T_LOCAL_REMOVED))
            rows = recorder.rows_of_topics(conn, removal_topics)
            removals = [_removal(p, t, s) for p, t, s in rows]
            packs = pack_status(conn, removals)
            head = recorder.head_in(conn)
        return {"head": head.position, "packs": packs}

    # -- the writer lease (R27) -----------------------------------------------------------

    def lease_status(self) -> LeaseStatus:
        """Who holds the writer lease, at which epoch, until when (renewals included)."""
        from ledger.commands.service import WRITER_LEASE

        lease, expiry = self.service().lease_state()
        now = int(time.time() * 1_000_000)
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
            "expires_at": _rfc3339(expiry) if held else None,
        }

    def lease_break(self, holder: str) -> LeaseStatus:
        """Free ``holder``'s lease at once (refused, CONFLICT, unless it holds it). The epoch
        moves on, so a wrongly presumed-dead holder is fenced out of every append."""
        self.service().break_lease(holder)
        return self.lease_status()

    # -- commands ------------------------------------------------------------------------

    def service(
        self, *, wait: float = 30.0, lease_ttl: float = DEFAULT_LEASE_TTL
    ) -> CommandService:
        from ledger.commands.service import CommandService

        return CommandService(self.ledger, lease_wait=wait, lease_ttl=lease_ttl)

    def apply(
        self,
        manifest: Path | str,
        *,
        command_id: str | None = None,
        publish: bool = True,
        wait: float = 30.0,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        rebuild_stale: bool = False,
    ) -> ApplyResult:
        """Converge the store to a release manifest (packs, bindings, one revision).

        A view built by other view code than this program's refuses the release
        before any append (R25); ``rebuild_stale`` rebuilds such views first."""
        if rebuild_stale:
            self.rebuild_stale()
        service = self.service(wait=wait, lease_ttl=lease_ttl)
        return service.apply(Path(manifest), command_id=command_id, publish=publish)

    def publish(self, *, command_id: str | None = None) -> PublishResult:
        """Validate every audience's closure and publish one revision (if changed)."""
        return self.service().publish(command_id=command_id)

    def import_legacy(
        self, file: Path | str, *, command_id: str | None = None
    ) -> ImportLegacyResult:
        """Record an existing ``_System_InstalledPack`` table once, so packs can be adopted."""
        return self.service().import_legacy(Path(file), command_id=command_id)

    # -- audience credentials (R26) -------------------------------------------------------

    def credentials_issue(self, audience: str, *, expires_in: str = "90d") -> IssuedCredential:
        """A new credential for ``audience`` (expiry ``90d``, ``12h``, ``30m``, ``3600s`` or
        ``never``). The result holds the token: the only time it is ever shown."""
        return self.service().credentials_issue(audience, expires_in=expires_in)

    def credentials_revoke(self, credential_id: str) -> RevokedCredential:
        """Revoke a credential: MISSING if unknown, a no-op if already revoked; servers
        refuse its token within one second."""
        return self.service().credentials_revoke(credential_id)

    def credentials_list(self, *, audience: str | None = None) -> CredentialList:
        """Every credential (of ``audience``) with status, issue, expiry and revocation
        times; never a token or its digest."""
        return self.service().credentials_list(audience=audience)

    # -- reading -------------------------------------------------------------------------

    def view(
        self,
        audience: str,
        *,
        min_revision: int | str | None = None,
        at_revision: int | str | None = None,
    ) -> AudienceView | PastView:
        """What ``audience`` (``app:<id>`` / ``integration:<id>``) is served, verified.

        With ``at_revision``: what it was served then, replayed from the log alone.
        """
        if min_revision is not None and at_revision is not None:
            raise UsageError("give --min-revision or --at-revision, not both")
        kind, sep, ident = audience.partition(":")
        parsed = parse_audience(kind, ident) if sep else parse_audience(audience, "")
        if at_revision is not None:
            revision = parse_revision(str(at_revision), field="at_revision")
            assert revision is not None
            from ledger.audit.history import view_at

            return view_at(self.ledger, (parsed.kind.value, parsed.id), revision)
        minimum = None if min_revision is None else parse_revision(str(min_revision))
        return CatalogReader(self.ledger.db).view(parsed, min_revision=minimum)

    @overload
    def history(self, pack: str) -> HistoryResult: ...

    @overload
    def history(self, pack: None = None, *, audience: str) -> AudienceHistoryResult: ...

    def history(
        self, pack: str | None = None, *, audience: str | None = None
    ) -> HistoryResult | AudienceHistoryResult:
        """Every lifecycle event of ``pack``, or every binding and credential event of
        ``audience`` (R26), from the log alone. Exactly one of the two."""
        if (pack is None) == (audience is None):
            raise UsageError("give --pack PACK or --audience AUDIENCE (exactly one)")
        from ledger.audit.history import audience_history
        from ledger.audit.history import history as pack_history

        if audience is not None:
            parsed = Audience.parse(audience, field="audience")
            pair = (parsed.kind.value, str(parsed.id))
            return {"audience": parsed.text, "events": audience_history(self.audit_ledger, pair)}
        assert pack is not None
        return {"pack": pack, "events": pack_history(self.audit_ledger, pack)}

    def export(self, out: TextIO) -> int:
        """Write every event as JSON lines, then the trailer (schema/LOG-FORMAT.md); returns
        the count. A damaged store is written in full, then ``DamagedExport`` (INTEGRITY)
        names its first damaged position."""
        from ledger.audit.export import export_jsonl

        return export_jsonl(self.audit_ledger, out)

    def import_jsonl(
        self,
        source: Path | str | IO[bytes] | IO[str],
        *,
        progress: Progress | None = None,
        rebuild_progress: Progress | None = None,
        workers: int | None = None,
        legacy_no_trailer: bool = False,
    ) -> ImportResult:
        """Load an ``export --jsonl`` (a path or an open file) into this empty store.

        Every line's position, event id, chain link and type is checked as it
        streams in, inside one transaction: the first bad line is INTEGRITY (or
        INVALID for a malformed one) naming it, and nothing is committed. The
        stored bytes are kept exactly; then every view is rebuilt from the
        imported log (a rebuild that fails leaves the log imported: run
        ``projections rebuild``). The store must be initialized (``init``) and
        empty. ``progress(done, total)`` counts the file's bytes. The file must end with
        the trailer ``export`` writes (an empty file or one without it is refused: it may
        have been cut short); ``legacy_no_trailer`` accepts an export written before the
        trailer existed (0.1, 0.2), whose truncation at a line boundary goes undetected.
        """
        from ledger.audit.proofs import origin_of
        from ledger.store.restore import import_jsonl as restore_jsonl
        from ledger.store.restore import read_lines

        ledger = self.ledger  # an uninitialized or drifted store fails before any read
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
            rebuilt = self.rebuild(progress=rebuild_progress, workers=workers)
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

    # -- audit ---------------------------------------------------------------------------

    def audit(
        self,
        *,
        from_checkpoint: Path | None = None,
        key: str | None = None,
        sources: bool = False,
        replay: bool = True,
        views: bool = True,
        progress: Progress | None = None,
    ) -> AuditReport:
        """Verify the whole log; INTEGRITY naming the first bad position if anything fails."""
        from ledger.audit.verify import verify_log

        note = read_text(from_checkpoint, "from_checkpoint") if from_checkpoint else None
        report = verify_log(
            self.audit_ledger,
            from_checkpoint=note,
            verifier=verifier_key(key),
            replay=replay,
            views=views,
            sources=sources,
            progress=progress,
        )
        if not report.ok:
            first = report.first()
            assert first is not None
            where = f"position {first.position}" if first.position else "the log"
            raise IntegrityFailure(
                f"audit failed at {where} ({first.check}): {first.message}", **report.to_json()
            )
        return report

    def checkpoint(self, *, sign: Path | None = None) -> CheckpointNote:
        """The C2SP tlog-checkpoint of the log, optionally as a signed note."""
        from ledger.audit.proofs import checkpoint
        from ledger.log.checkpoint import SignerKey

        cp = checkpoint(self.audit_ledger)
        note = cp.text()
        if sign is not None:
            note = SignerKey.parse(read_text(sign, "sign"), field="sign").sign(note)
        return {"origin": cp.origin, "size": cp.size, "root": note.split("\n")[2], "note": note}

    def prove(
        self,
        *,
        position: int | None = None,
        size: int | None = None,
        from_size: int | None = None,
        to_size: int | None = None,
    ) -> InclusionProof | ConsistencyProof:
        """An inclusion proof (``position``) or a consistency proof (``from_size``)."""
        if (position is None) == (from_size is None):
            raise UsageError("give either --position N [--size S] or --from-size A [--to-size B]")
        from ledger.audit.proofs import MerkleLog

        log = MerkleLog(self.audit_ledger)
        if position is not None:
            return log.inclusion(position, size or log.size())
        assert from_size is not None
        return log.consistency(from_size, to_size or log.size())

    # -- projections ---------------------------------------------------------------------

    def projections_status(self) -> ProjectionsStatus:
        return self.ledger.runner.status(self.ledger.db)

    def rebuild(
        self,
        names: Sequence[str] = (),
        *,
        workers: int | None = None,
        progress: Progress | None = None,
        chain_check: bool = True,
    ) -> dict[str, RebuildOutcome]:
        """Rebuild views beside the live ones from position 0, then swap atomically.

        The chain is checked in a worker of its own while the views are built
        (R22); a broken log swaps nothing in (INTEGRITY naming the position).
        ``chain_check=False`` skips it, for benchmarks and right after an audit.
        """
        from ledger.store.rebuild import default_workers, process_builder

        return self.ledger.runner.rebuild(
            self.ledger.db,
            names,
            progress=progress,
            builder=process_builder(self.url),
            workers=workers or default_workers(),
            check=self._check_chain if chain_check else None,
        )

    def stale_views(self) -> list[str]:
        """The views built by other view code than this program's (R25): never served
        nor written until rebuilt."""
        status = self.ledger.runner.status(self.ledger.db)
        return [
            v["name"]
            for v in status["views"]
            if v.get("state") != "missing"
            and v.get("built_with_code_version") != v.get("code_version")
        ]

    def rebuild_stale(self, *, progress: Progress | None = None) -> dict[str, RebuildOutcome]:
        """Rebuild (blue/green, chain checked) exactly the views ``stale_views`` names."""
        stale = self.stale_views()
        return self.rebuild(stale, progress=progress) if stale else {}

    def _check_chain(self, size: int) -> None:
        """Every event id and chain link up to ``size``, in one worker process."""
        from ledger.audit.verify import verify_chain_parallel

        problems, _root, _chain = verify_chain_parallel(self.url, size, workers=1)
        if problems:
            first = problems[0]
            raise IntegrityFailure(
                f"the log does not verify at position {first.position} ({first.check}): "
                f"{first.message}; no rebuilt view was swapped in",
                position=first.position,
                check=first.check,
            )

    def verify_projections(self, names: Sequence[str] = ()) -> ProjectionsVerifyResult:
        """Compare every live view with a fresh replay, row by row (R21)."""
        results = self.ledger.runner.verify(self.ledger.db, names)
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

    def catch_up(self, names: Sequence[str] = ()) -> dict[str, CaughtUp]:
        """Advance catch-up views to the log head."""
        done: dict[str, CaughtUp] = {}
        for p in self.ledger.runner.select(names):
            if not p.inline:
                state = self.ledger.runner.catch_up(self.ledger.db, p.name)
                done[p.name] = {"position": state.position, "stopped": state.stopped}
        return done


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


def _size_of(handle: IO[bytes] | IO[str]) -> int | None:
    """The size of a regular file (for progress); None for a pipe or a stream."""
    try:
        info = os.fstat(handle.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def open_store(url: str | None = None) -> Store:
    """A handle on the store at ``url`` (default: ``$CATALOG_LEDGER_DB`` or ./catalog.db)."""
    return Store(url)
