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

from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, TextIO, overload

from domain.coordination import DEFAULT_LEASE_TTL
from domain.served import AudienceView
from ledger import operations
from ledger.log.db import Database, open_database
from ledger.log.url import resolve_url
from ledger.operations import Progress, ddl, doctor_exit_code, pack_hash
from ledger.results import (
    CaughtUp,
    DoctorResult,
    ImportResult,
    InitResult,
    LeaseStatus,
    LogHead,
    LogPage,
    LogRow,
    PackHash,
    ProjectionsVerifyResult,
    SchemaDifference,
    StatusResult,
    ViewCheck,
)
from ledger.store import contract
from ledger.store.init import require_schema
from ledger.store.runtime import Ledger

# What only some methods use is imported in them (here: in ``ledger.operations`` and
# ``ledger.audit.operations``), so that ``status`` and ``view`` (and the CLI that calls
# them) start without the audit, export, command and signing code (issue 25.7;
# tests/e2e/test_cli_basics.py checks it).
if TYPE_CHECKING:
    from ledger.audit.cosign import AddCheckpoint, CosignResult
    from ledger.audit.diff import RevisionDiff
    from ledger.audit.operations import check_proof, keygen, read_text, verifier_key
    from ledger.audit.results import (
        AudienceHistoryResult,
        CheckpointNote,
        ConsistencyProof,
        HistoryResult,
        InclusionProof,
        KeygenResult,
        KeyRotation,
        LogOrigin,
        PastView,
        ResumeCheck,
    )
    from ledger.audit.verify import AuditReport
    from ledger.commands.credentials import CredentialList, IssuedCredential, RevokedCredential
    from ledger.commands.results import (
        ApplyResult,
        ImportLegacyResult,
        PlanResult,
        PublishResult,
    )
    from ledger.commands.rollback import RollbackResult
    from ledger.commands.service import CommandService
    from ledger.store.migrations import MigrateResult
    from projections.rebuild import RebuildOutcome
    from projections.runner import ProjectionsStatus

# The audit's names are re-exported on first use, so that importing the façade loads no
# ``ledger.audit`` module (the CLI's read commands never need one).
_AUDIT_OPERATIONS = frozenset({"check_proof", "keygen", "read_text", "verifier_key"})


def __getattr__(name: str) -> object:
    if name in _AUDIT_OPERATIONS:
        from ledger.audit import operations as audit_operations

        return getattr(audit_operations, name)
    if name == "KeygenResult":
        from ledger.audit.results import KeygenResult

        return KeygenResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CaughtUp",
    "DoctorResult",
    "ImportResult",
    "InitResult",
    "KeygenResult",
    "LeaseStatus",
    "LogHead",
    "LogPage",
    "LogRow",
    "PackHash",
    "Progress",
    "ProjectionsVerifyResult",
    "SchemaDifference",
    "StatusResult",
    "Store",
    "ViewCheck",
    "check_proof",
    "ddl",
    "doctor_exit_code",
    "keygen",
    "open_store",
    "pack_hash",
    "read_text",
    "verifier_key",
]


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
        return operations.init(self.db)

    def doctor(self, *, repair: bool = False) -> DoctorResult:
        """Compare the live schema with the declared one (R24); ``repair`` restores the
        safe differences under the migration lock and compares again."""
        require_schema(self.db)
        return operations.doctor(self.db, repair=repair)

    def migrate(self, *, dry_run: bool = False) -> MigrateResult:
        """Run the numbered schema migrations under the migration lock (R24); never
        downgrades and never changes a stored event byte. ``dry_run`` lists them."""
        require_schema(self.db)
        result = operations.migrate(self.db, dry_run=dry_run)
        self._ledger = None  # the next command checks the migrated schema afresh
        return result

    def log(self, *, from_position: int = 1, limit: int = 50) -> LogPage:
        """Log rows from ``from_position``: topic, aggregate, version, event id, chain."""
        return operations.log_page(self.audit_ledger, from_position=from_position, limit=limit)

    def status(self) -> StatusResult:
        """Per pack: active generation, newest attempt, dirty flag."""
        return operations.status(self.ledger)

    # -- the writer lease (R27) -----------------------------------------------------------

    def lease_status(self) -> LeaseStatus:
        """Who holds the writer lease, at which epoch, until when (renewals included)."""
        return operations.lease_status(self.service())

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
        manifest: Path | str | None = None,
        *,
        command_id: str | None = None,
        publish: bool = True,
        wait: float = 30.0,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        rebuild_stale: bool = False,
        plan_file: Path | str | None = None,
    ) -> ApplyResult:
        """Converge the store to a release manifest (packs, bindings, one revision).

        A view built by other view code than this program's refuses the release
        before any append (R25); ``rebuild_stale`` rebuilds such views first. With
        ``plan_file`` (``plan(..., out=...)``), exactly that plan: the manifest it
        names (or ``manifest``, the same bytes), the command id it planned, and only
        if recomputing it on this store gives the same plan (R28)."""
        if rebuild_stale:
            self.rebuild_stale()
        service = self.service(wait=wait, lease_ttl=lease_ttl)
        return service.apply(
            None if manifest is None else Path(manifest),
            command_id=command_id,
            publish=publish,
            plan_file=None if plan_file is None else Path(plan_file),
        )

    def plan(
        self, manifest: Path | str, *, publish: bool = True, out: Path | str | None = None
    ) -> PlanResult:
        """What ``apply(manifest, publish=publish)`` would do now (``apply --plan``):
        appends nothing and takes no lease. ``out`` writes the plan file that
        ``apply(plan_file=...)`` applies."""
        result = self.service().plan(Path(manifest), publish=publish)
        if out is not None:
            from ledger.commands.plan import write_plan

            write_plan(Path(out), result)
        return result

    def rollback(
        self,
        to_revision: int | str,
        *,
        plan: bool = False,
        wait: float = 30.0,
        lease_ttl: float = DEFAULT_LEASE_TTL,
    ) -> RollbackResult:
        """Restore revision ``to_revision``'s content by a new release (``apply``): packs
        back at the sources it bound (fresh generations, R7), packs added since removed,
        its bindings restored; ``local_path`` packs and credentials left alone. With
        ``plan``: the release and what it would change, nothing appended."""
        from ledger.audit.revision_state import read_revision, rollback_inputs
        from ledger.commands.rollback import RollbackHandler
        from projections.reader import parse_revision

        revision = parse_revision(str(to_revision), field="to_revision")
        assert revision is not None
        ledger = self.ledger
        handler = RollbackHandler(
            self.service(wait=wait, lease_ttl=lease_ttl),
            lambda n: rollback_inputs(ledger, n),
            lambda n: read_revision(ledger, n),
        )
        return handler.rollback(revision, plan=plan)

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
        request = operations.view_request(
            audience, min_revision=min_revision, at_revision=at_revision
        )
        return operations.view(self.ledger, request)

    def diff(
        self,
        from_revision: int | str,
        to_revision: int | str,
        *,
        audience: str | None = None,
    ) -> RevisionDiff:
        """What changed from one revision to another, per audience (facts added, removed
        or changed, with their payload diff; grants added, removed or rebound) and per
        pack (activations moved), for ``audience`` only if given. From the log alone: it
        matches ``view(audience, at_revision=…)`` on both sides (R17, R28)."""
        from ledger.audit.diff import parse_request, revision_diff

        first, second, pair = parse_request(from_revision, to_revision, audience)
        return revision_diff(self.ledger, first, second, pair)

    @overload
    def history(self, pack: str) -> HistoryResult: ...

    @overload
    def history(self, pack: None = None, *, audience: str) -> AudienceHistoryResult: ...

    def history(
        self, pack: str | None = None, *, audience: str | None = None
    ) -> HistoryResult | AudienceHistoryResult:
        """Every lifecycle event of ``pack``, or every binding and credential event of
        ``audience`` (R26), from the log alone. Exactly one of the two."""
        subject = operations.history_subject(pack, audience)
        return operations.history(self.audit_ledger, subject)

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
        ledger = self.ledger  # an uninitialized or drifted store fails before any read
        return operations.import_jsonl(
            ledger,
            source,
            progress=progress,
            legacy_no_trailer=legacy_no_trailer,
            rebuild=lambda: self.rebuild(progress=rebuild_progress, workers=workers),
        )

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
        from ledger.audit import operations as audit_operations

        note = audit_operations.checkpoint_note(from_checkpoint)
        return audit_operations.verify(
            self.audit_ledger,
            from_checkpoint=note,
            key=key,
            sources=sources,
            replay=replay,
            views=views,
            progress=progress,
        )

    def checkpoint(self, *, sign: Path | None = None, log: str = "main") -> CheckpointNote:
        """The C2SP tlog-checkpoint of the main log (or, ``log="catalog"``, of the catalog
        log, R29), optionally as a signed note. Signing names the log first (``log.named``,
        once): a signed origin is always a log fact (R29)."""
        from ledger.audit import operations as audit_operations

        if sign is not None:
            return audit_operations.checkpoint(self.ledger, sign=sign, log=log, name=True)
        return audit_operations.checkpoint(self.audit_ledger, sign=None, log=log)

    def cosign(
        self,
        *,
        sign: Path | Sequence[Path],
        policy: Path,
        add_checkpoint: AddCheckpoint | None = None,
        clock: Callable[[], float] | None = None,
    ) -> CosignResult:
        """Have the catalog log's, then the main log's checkpoint signed, cosigned by the
        policy's witnesses (C2SP tlog-witness, or ``add_checkpoint``) and stored
        (``ledger.audit.cosign``); UNAVAILABLE for one ``threshold`` did not cosign."""
        import time
        from contextlib import nullcontext

        from ledger.audit import operations as audit_operations
        from ledger.witness.submit import submitter

        with submitter() if add_checkpoint is None else nullcontext(add_checkpoint) as submit:
            return audit_operations.cosign(
                self.ledger, sign=sign, policy=policy, add_checkpoint=submit,
                clock=clock or time.time,
            )  # fmt: skip

    def origin(
        self, *, name: bool = False, origin: str | None = None, new: bool = False
    ) -> LogOrigin:
        """The log's origin (R29); ``name`` appends ``log.named`` if the log has none, with
        ``origin`` or else the origin the log has had so far; ``new`` gives the log a new
        origin (``log.renamed``: ``origin``, else this store's), which clients re-pin."""
        from ledger.audit import operations as audit_operations

        if new:
            return audit_operations.new_origin(self.ledger, origin)
        if name or origin is not None:
            return audit_operations.name_origin(self.ledger, origin)
        return audit_operations.origin(self.audit_ledger)

    def rotate_key(self, *, old: Path, new: str, overlap: int, now: int) -> KeyRotation:
        """Record a rotation of the log's signing key (``log_key.rotated``): a statement
        signed by ``old`` announcing ``new``, ``old`` valid for ``overlap`` more seconds."""
        from ledger.audit import operations as audit_operations

        return audit_operations.rotate_key(self.ledger, old=old, new=new, overlap=overlap, now=now)

    def resume_check(self, note: Path | None = None) -> ResumeCheck:
        """Whether this log extends the cosigned checkpoint ``note`` (or every cosigned
        checkpoint the store holds): STALE for a rollback, INTEGRITY for a fork (R29)."""
        from ledger.audit import operations as audit_operations

        return audit_operations.resume_check(self.audit_ledger, note)

    def keygen(self, name: str | None, out: Path) -> KeygenResult:
        """``audit keygen``: a checkpoint signer key named ``name``, by default after this
        store's origin (tlog-checkpoint: the key name SHOULD match the origin line)."""
        from ledger.audit import operations as audit_operations

        chosen = name if name is not None else audit_operations.origin(self.audit_ledger)["origin"]
        return audit_operations.keygen(chosen, out)

    def prove(
        self,
        *,
        position: int | None = None,
        size: int | None = None,
        from_size: int | None = None,
        to_size: int | None = None,
    ) -> InclusionProof | ConsistencyProof:
        """An inclusion proof (``position``) or a consistency proof (``from_size``)."""
        from ledger.audit import operations as audit_operations

        audit_operations.check_proof_request(position=position, from_size=from_size)
        return audit_operations.prove(
            self.audit_ledger, position=position, size=size, from_size=from_size, to_size=to_size
        )

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
        return operations.rebuild(
            self.ledger,
            self.url,
            names,
            workers=workers,
            progress=progress,
            chain_check=chain_check,
        )

    def stale_views(self) -> list[str]:
        """The views built by other view code than this program's (R25): never served
        nor written until rebuilt."""
        return operations.stale_views(self.ledger)

    def rebuild_stale(self, *, progress: Progress | None = None) -> dict[str, RebuildOutcome]:
        """Rebuild (blue/green, chain checked) exactly the views ``stale_views`` names."""
        stale = self.stale_views()
        return self.rebuild(stale, progress=progress) if stale else {}

    def verify_projections(self, names: Sequence[str] = ()) -> ProjectionsVerifyResult:
        """Compare every live view with a fresh replay, row by row (R21)."""
        return operations.verify_projections(self.ledger, names)

    def catch_up(self, names: Sequence[str] = ()) -> dict[str, CaughtUp]:
        """Advance catch-up views to the log head."""
        return operations.catch_up(self.ledger, names)


def catalog_origin(ledger: Ledger) -> str:
    """The catalog log's checkpoint origin: the main log's followed by ``/catalog`` (R29)."""
    from domain.origin import catalog_origin as of_main
    from ledger.audit.proofs import origin_of

    return of_main(origin_of(ledger))


def log_rotations(ledger: Ledger) -> dict[str, Any]:
    """``GET /v1/log/rotations`` (R29): ``ledger.audit.rotation_proofs``."""
    from ledger.audit.rotation_proofs import rotations_document

    return rotations_document(ledger)


def open_store(url: str | None = None) -> Store:
    """A handle on the store at ``url`` (default: ``$CATALOG_LEDGER_DB`` or ./catalog.db)."""
    return Store(url)
