"""The ``catalog-ledger`` command line.

Conventions (DESIGN "CLI conventions"): ``--db`` is global and comes before
the command; every command takes ``--json`` after its name and then prints
exactly one JSON document on stdout, result or error. Exit codes: 0 ok,
1 store unavailable or internal error, 2 usage, 3 invalid input, 4 conflict,
5 fail-closed authority, 6 integrity. ``main`` is the only entry point and it
turns every failure into one of those codes; no traceback reaches a user
unless ``CATALOG_LEDGER_DEBUG=1`` asks for it.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import orjson

from domain.errors import InvalidInput, LedgerError, UsageError
from ledger.db import Database, open_database, resolve_url
from ledger.runtime import Ledger

if TYPE_CHECKING:
    from ledger.checkpoint import VerifierKey
    from ledger.commands import CommandService

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Context:
    """Per-invocation state: the URL and a lazily opened store."""

    url: str
    _db: Database | None = field(default=None, repr=False)

    def db(self) -> Database:
        if self._db is None:
            self._db = open_database(self.url)
        return self._db

    def ledger(self) -> Ledger:
        """The initialized store (a clear error when `init` has not run)."""
        from ledger.store import require_schema

        require_schema(self.db())
        return Ledger(self.db())

    def close(self) -> None:
        if self._db is not None:
            self._db.close()


def json_option(func: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print exactly one JSON document on stdout."
    )(func)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "hex:" + raw.hex()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def _scrub(value: Any) -> Any:
    """``value`` with lone surrogates in strings written as ``\\udcff`` text and
    integers beyond 64 bits as decimal strings (orjson encodes neither)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, int) and not -(2**63) <= value < 2**64:
        return str(value)
    if isinstance(value, dict):
        return {_scrub(k): _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


def dump_json(document: Any) -> str:
    """One JSON document; never fails on bytes, sets, non-string keys or lone surrogates."""
    options = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
    try:
        return orjson.dumps(document, option=options, default=_json_default).decode() + "\n"
    except orjson.JSONEncodeError:
        # Undecodable bytes of an argument or a file name arrive as lone surrogates
        # (surrogateescape), which are not UTF-8, and an input may carry a huge
        # integer: show both as text instead of failing.
        scrubbed = orjson.dumps(
            _scrub(document), option=options, default=lambda v: _scrub(_json_default(v))
        )
        return scrubbed.decode() + "\n"


def emit(as_json: bool, document: Any, human: Callable[[], None]) -> None:
    """Print a result as JSON or through the human renderer."""
    if as_json:
        sys.stdout.write(dump_json(document))
    else:
        human()


def _ctx() -> Context:
    obj = click.get_current_context().find_object(Context)
    assert obj is not None
    return obj


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    "db_url",
    metavar="URL",
    default=None,
    help="Store URL (default: $CATALOG_LEDGER_DB or sqlite:///catalog.db). "
    "Examples: sqlite:///catalog.db, mysql+pymysql://root@127.0.0.1:3306/test",
)
@click.version_option(package_name="catalog-ledger")
@click.pass_context
def cli(ctx: click.Context, db_url: str | None) -> None:
    """Catalog Ledger: an event-sourced catalog publication store."""
    obj = Context(url=resolve_url(db_url))
    ctx.obj = obj
    ctx.call_on_close(obj.close)


@cli.command()
@json_option
def init(as_json: bool) -> None:
    """Create the schema (idempotent) and print the engine and schema version."""
    from ledger.store import init_store

    info = init_store(_ctx().db())
    document = {
        "engine": info.engine,
        "server_version": info.server_version,
        "schema_version": info.schema_version,
        "head_position": info.head_position,
        "created": info.created,
        "db": _ctx().db().display_url,
    }

    def human() -> None:
        verb = "created" if info.created else "already initialized"
        click.echo(f"{_ctx().db().display_url}: {verb}")
        click.echo(f"engine: {info.engine} ({info.server_version})")
        click.echo(f"schema version: {info.schema_version}")
        click.echo(f"log head: {info.head_position}")

    emit(as_json, document, human)


@cli.command()
@click.option(
    "--from",
    "from_position",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="First position to show.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=100_000),
    default=50,
    show_default=True,
    help="Most rows to show.",
)
@json_option
def log(from_position: int, limit: int, as_json: bool) -> None:
    """Show log rows: position, topic, aggregate id, version, event_id, chain."""
    from ledger.recorder import LedgerRecorder
    from ledger.store import require_schema

    db = _ctx().db()
    require_schema(db)
    recorder = LedgerRecorder(db)
    with db.read() as conn:
        head = recorder.head_in(conn)
        rows = recorder.read_rows(conn, after=from_position - 1, limit=limit)
    events = [
        {
            "position": r.position,
            "topic": r.topic,
            "aggregate_id": str(r.aggregate_id),
            "version": r.version,
            "event_id": r.event_id.hex(),
            "chain": r.chain.hex(),
        }
        for r in rows
    ]
    document = {"head": {"position": head.position, "chain": head.chain.hex()}, "events": events}

    def human() -> None:
        click.echo(f"log head: position {head.position}, chain {head.chain.hex()}")
        for e in events:
            click.echo(
                f"{e['position']:>8}  {e['topic']}  {e['aggregate_id']} v{e['version']}"
                f"  event_id={e['event_id']}  chain={e['chain']}"
            )

    emit(as_json, document, human)


@cli.group("schema")
def schema_group() -> None:
    """Generated schema artifacts."""


@schema_group.command("dump")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("schema"),
    show_default=True,
    help="Folder to write sqlite.sql and mysql.sql into.",
)
@click.option(
    "--stdout",
    "dialect",
    type=click.Choice(["sqlite", "mysql"]),
    default=None,
    help="Print one dialect's DDL instead of writing files.",
)
@json_option
def schema_dump(out: Path, dialect: str | None, as_json: bool) -> None:
    """Write the DDL for SQLite and the MySQL family, the HTTP OpenAPI document, the
    JSON Schema of exported events and the log-format conformance vectors."""
    from ledger.store import ddl

    if dialect is not None:
        text = ddl(dialect)
        emit(as_json, {"dialect": dialect, "ddl": text}, lambda: click.echo(text, nl=False))
        return
    from ledger.event_schema import events_schema
    from ledger.log_vectors import all_vectors
    from ledger.server import openapi_document

    written = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in ("sqlite", "mysql"):
            path = out / f"{name}.sql"
            path.write_text(ddl(name), encoding="utf-8")
            written.append(str(path))
        path = out / "openapi.json"
        path.write_text(dump_json(openapi_document()), encoding="utf-8")
        written.append(str(path))
        path = out / "events.schema.json"
        path.write_text(dump_json(events_schema()), encoding="utf-8")
        written.append(str(path))
        vectors = out / "vectors" / "log"
        vectors.mkdir(parents=True, exist_ok=True)
        for name, document in all_vectors().items():
            (vectors / name).write_text(dump_json(document), encoding="utf-8")
            written.append(str(vectors / name))
    except OSError as exc:
        raise UsageError(f"cannot write schema files: {exc}", field="out") from None
    emit(as_json, {"written": written}, lambda: click.echo("\n".join(written)))


def _service(**kwargs: Any) -> CommandService:
    from ledger.commands import CommandService

    return CommandService(_ctx().ledger(), **kwargs)


@cli.command()
@click.argument("manifest", type=click.Path(path_type=Path))
@click.option(
    "--command-id",
    default=None,
    metavar="ID",
    help="Idempotency key (default: derived from the manifest and the log head).",
)
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds to wait for the writer lease held by another process.",
)
@click.option(
    "--lease-ttl",
    type=click.FloatRange(min=0.1),
    default=300.0,
    show_default=True,
    help="Seconds the writer lease lasts: if this process dies holding it, the next "
    "writer waits this long before recovering its work (R12).",
)
@click.option(
    "--publish/--no-publish",
    default=True,
    show_default=True,
    help="Publish the catalog revision in the same append (validated either way).",
)
@json_option
def apply(
    manifest: Path,
    command_id: str | None,
    wait: float,
    lease_ttl: float,
    publish: bool,
    as_json: bool,
) -> None:
    """Converge the store to a release manifest (packs, then bindings and publication)."""
    service = _service(lease_wait=wait, lease_ttl=lease_ttl)
    result = service.apply(manifest, command_id=command_id, publish=publish)

    def human() -> None:
        state = (
            "replayed (already recorded)"
            if result.get("replayed")
            else ("no changes" if result["noop"] else "applied")
        )
        click.echo(f"apply {result['command_id']}: {state}")
        for item in result.get("recovered", []):
            click.echo(
                f"  recovered abandoned attempt {item['pack']} {item['install_id']} -> failed_dirty"
            )
        for pack in result["packs"]:
            extra = ""
            if pack.get("install_id"):
                extra = f" install_id={pack['install_id']}"
            if pack.get("epoch"):
                extra += f" epoch={pack['epoch']}"
            click.echo(f"  {pack['pack']}: {pack['decision']}{extra}")
        bindings = result.get("bindings", {})
        moved = {k: len(v) for k, v in bindings.items() if v}
        if moved:
            click.echo("  bindings: " + ", ".join(f"{n} {k}" for k, n in moved.items()))
        catalog = result.get("catalog")
        if catalog:
            verb = "published" if catalog["published"] else "unchanged"
            click.echo(
                f"  catalog revision {catalog['revision']} ({verb}) digest "
                f"{catalog['content_digest']}"
            )

    emit(as_json, result, human)


@cli.command()
@click.option("--command-id", default=None, metavar="ID", help="Idempotency key.")
@json_option
def publish(command_id: str | None, as_json: bool) -> None:
    """Validate every audience's closure and publish one catalog revision (if changed)."""
    result = _service().publish(command_id=command_id)

    def human() -> None:
        if result.get("replayed"):
            state = "replayed (already recorded)"
        elif result["noop"]:
            state = "unchanged, nothing published"
        else:
            state = "published"
        click.echo(f"publish {result['command_id']}: {state}")
        click.echo(f"  revision {result['revision']} digest {result['content_digest']}")
        counts = result["counts"]
        click.echo(
            f"  {counts['audiences']} audience(s), {counts['grants']} grant(s), "
            f"{counts['facts']} fact(s), {counts['activations']} pack(s)"
        )

    emit(as_json, result, human)


@cli.command()
@click.argument("audience")
@click.option(
    "--min-revision",
    default=None,
    metavar="N",
    help="Fail with STALE unless the active revision is at least N.",
)
@click.option(
    "--at-revision",
    default=None,
    metavar="N",
    help="What the audience was served at revision N, replayed from the log alone.",
)
@json_option
def view(audience: str, min_revision: str | None, at_revision: str | None, as_json: bool) -> None:
    """Show what AUDIENCE (app:<id> or integration:<id>) is served, verified."""
    from projections.reader import CatalogReader, parse_audience, parse_revision

    kind, sep, ident = audience.partition(":")
    parsed = parse_audience(kind, ident) if sep else parse_audience(audience, "")
    if at_revision is not None:
        from ledger.audit import view_at

        revision = parse_revision(at_revision, field="at_revision")
        assert revision is not None
        past = view_at(_ctx().ledger(), (parsed.kind.value, parsed.id), revision)

        def human_past() -> None:
            click.echo(
                f"{past['audience']} at revision {past['revision']} (log position "
                f"{past['position']}, content {past['content_digest']})"
            )
            for fact in past["facts"]:
                click.echo(f"  {fact['pack']} {fact['kind']}/{fact['key']} [{fact['install_id']}]")

        emit(as_json, past, human_past)
        return
    result = CatalogReader(_ctx().ledger().db).view(
        parsed, min_revision=parse_revision(min_revision)
    )
    document = result.to_json()

    def human() -> None:
        click.echo(
            f"{result.audience} at revision {result.revision} (content {result.content_digest})"
        )
        for fact in result.facts:
            click.echo(
                f"  {fact['pack']} {fact['kind']}/{fact['key']} "
                f"[{fact['install_id']}] {orjson.dumps(fact['payload']).decode()}"
            )

    emit(as_json, document, human)


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=8080, show_default=True)
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info"]),
    default="warning",
    show_default=True,
)
def serve(host: str, port: int, log_level: str) -> None:
    """Serve audience views over HTTP (read only): /v1/audiences/{kind}/{id}/view."""
    import uvicorn

    from ledger.server import create_app

    url = _ctx().url
    _ctx().ledger()  # fail now, with a typed error, if the store is unusable

    def open_ledger() -> Ledger:
        return Ledger(open_database(url))

    uvicorn.run(create_app(open_ledger), host=host, port=port, log_level=log_level)


@cli.command("import-legacy")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--command-id", default=None, metavar="ID", help="Idempotency key.")
@json_option
def import_legacy(file: Path, command_id: str | None, as_json: bool) -> None:
    """Record an existing _System_InstalledPack table once, so packs can be adopted."""
    result = _service().import_legacy(file, command_id=command_id)

    def human() -> None:
        click.echo(
            f"import-legacy {result['command_id']}: imported "
            f"{len(result['imported'])}, unchanged {len(result['unchanged'])}"
        )

    emit(as_json, result, human)


@cli.command()
@json_option
def status(as_json: bool) -> None:
    """Per pack: active install id, revision, epoch, newest attempt, dirty flag."""
    from projections.queries import pack_status

    ledger = _ctx().ledger()
    with ledger.db.read() as conn:
        packs = pack_status(conn)
        head = ledger.recorder.head_in(conn)
    document = {"head": head.position, "packs": packs}

    def human() -> None:
        click.echo(f"log head: {head.position}; {len(packs)} pack(s)")
        for p in packs:
            if p["active_install_id"]:
                line = f"active {p['active_install_id']} @ {p['revision']} epoch {p['epoch']}"
            elif p["status"] is not None:
                line = f"{p['source_kind']} {p['status']} {p['installed_install_id']}"
            else:
                line = "never activated"
            newest = p["newest_attempt"]
            if newest and newest["install_id"] != p["active_install_id"]:
                line += f"; newest attempt {newest['install_id']} {newest['status']}"
            if p["dirty"]:
                line += "  DIRTY (blocks publication until a later generation activates)"
            click.echo(f"  {p['pack']}: {line}")

    emit(as_json, document, human)


@cli.group("pack")
def pack_group() -> None:
    """Pack content tools."""


@pack_group.command("hash")
@click.argument("manifest", type=click.Path(path_type=Path))
@click.argument("pack")
@json_option
def pack_hash(manifest: Path, pack: str, as_json: bool) -> None:
    """Print the v1 and v0 payload hashes of PACK's content as MANIFEST resolves it."""
    from domain.errors import InvalidInput
    from ledger.sources import load_manifest, resolve_packs

    loaded = load_manifest(manifest)
    chosen = [p for p in loaded.packs if p.name == pack]
    if not chosen:
        raise InvalidInput(f"pack {pack!r} is not in {manifest}", field="pack")
    (resolved,) = resolve_packs(chosen, base=manifest.resolve().parent)
    document = {
        "pack": resolved.name,
        "category": resolved.content.category,
        "source": resolved.source.to_json(),
        "components": len(resolved.content.components),
        "payload_hash_v1": resolved.content.payload_hash_v1,
        "payload_hash_v0": resolved.content.payload_hash_v0,
    }

    def human() -> None:
        click.echo(f"{resolved.name}: {document['components']} component(s)")
        click.echo(f"  v1 {document['payload_hash_v1']}")
        click.echo(f"  v0 {document['payload_hash_v0']}")

    emit(as_json, document, human)


@cli.group("audit")
def audit_group() -> None:
    """Verify the log, checkpoints and Merkle proofs (RFC 9162)."""


def _read_text(path: Path, field: str) -> str:
    from ledger.sources import read_input_file

    data = read_input_file(path, field=field, limit=1 << 20)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{path} is not UTF-8 text", field=field) from None


def _verifier(key: str | None) -> VerifierKey | None:
    from ledger.checkpoint import VerifierKey

    if key is None:
        return None
    text = _read_text(Path(key), "key") if Path(key).is_file() else key
    return VerifierKey.parse(text, field="key")


@audit_group.command("keygen")
@click.argument("name")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Signer key file to create (its .pub sibling gets the verifier key).",
)
@json_option
def audit_keygen(name: str, out: Path, as_json: bool) -> None:
    """Create an Ed25519 key for signing checkpoints (C2SP signed note format)."""
    from ledger.checkpoint import SignerKey

    if out.exists():
        raise InvalidInput(f"{out} already exists; refusing to overwrite a key", field="out")
    key = SignerKey.generate(name)
    try:
        out.write_text(key.text() + "\n", encoding="utf-8")
        out.chmod(0o600)
        out.with_name(out.name + ".pub").write_text(key.verifier.text() + "\n", encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot write {out}: {exc.strerror}", field="out") from None
    document = {"signer_key_file": str(out), "verifier_key": key.verifier.text()}
    emit(as_json, document, lambda: click.echo(key.verifier.text()))


@audit_group.command("checkpoint")
@click.option(
    "--sign",
    "sign",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="KEYFILE",
    help="Sign the checkpoint with this signer key.",
)
@json_option
def audit_checkpoint(sign: Path | None, as_json: bool) -> None:
    """Print a tlog-checkpoint (origin, size, base64 Merkle root), optionally signed."""
    from ledger.audit import checkpoint
    from ledger.checkpoint import SignerKey

    cp = checkpoint(_ctx().ledger())
    note = cp.text()
    if sign is not None:
        note = SignerKey.parse(_read_text(sign, "sign"), field="sign").sign(note)
    document = {"origin": cp.origin, "size": cp.size, "root": note.split("\n")[2], "note": note}
    emit(as_json, document, lambda: click.echo(note, nl=False))


@audit_group.command("prove")
@click.option(
    "--position",
    type=click.IntRange(min=1),
    default=None,
    help="Inclusion proof for the event at this position.",
)
@click.option(
    "--size",
    type=click.IntRange(min=1),
    default=None,
    help="Tree size for the inclusion proof (default: the log size).",
)
@click.option(
    "--from-size",
    type=click.IntRange(min=1),
    default=None,
    help="Consistency proof from this tree size ...",
)
@click.option(
    "--to-size",
    type=click.IntRange(min=1),
    default=None,
    help="... to this one (default: the log size).",
)
def audit_prove(
    position: int | None, size: int | None, from_size: int | None, to_size: int | None
) -> None:
    """Print an inclusion or consistency proof as JSON (RFC 9162)."""
    from ledger.audit import MerkleLog

    log = MerkleLog(_ctx().ledger())
    if (position is None) == (from_size is None):
        raise UsageError("give either --position N [--size S] or --from-size A [--to-size B]")
    if position is not None:
        document = log.inclusion(position, size or log.size())
    else:
        assert from_size is not None
        document = log.consistency(from_size, to_size or log.size())
    sys.stdout.write(dump_json(document))


@audit_group.command("verify-proof")
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--checkpoint",
    "checkpoint_file",
    type=click.Path(path_type=Path),
    required=True,
    help="Checkpoint (tlog-checkpoint or signed note) to verify against.",
)
@click.option(
    "--key",
    default=None,
    metavar="PUBKEY",
    help="Verifier key (file or text): the checkpoint must be signed by it.",
)
@json_option
def audit_verify_proof(file: Path, checkpoint_file: Path, key: str | None, as_json: bool) -> None:
    """Verify a proof offline against a checkpoint (no database needed)."""
    from domain.canonical import parse_json
    from ledger.audit import verify_proof
    from ledger.checkpoint import Checkpoint

    note = _read_text(checkpoint_file, "checkpoint")
    verifier = _verifier(key)
    cp = verifier.verify(note) if verifier else Checkpoint.parse(note)
    document = parse_json(_read_text(file, "file"), source=str(file))
    if not isinstance(document, dict):
        raise InvalidInput(f"{file} is not a proof document", field="file")
    result = verify_proof(document, cp)
    emit(
        as_json,
        result,
        lambda: click.echo(
            f"ok: {result['type']} proof verifies against {cp.origin} at size {cp.size}"
        ),
    )


@audit_group.command("verify")
@click.option(
    "--from-checkpoint",
    "from_checkpoint",
    type=click.Path(path_type=Path),
    default=None,
    help="Also prove the log extends this earlier checkpoint.",
)
@click.option(
    "--key", default=None, metavar="PUBKEY", help="Verifier key the checkpoint must be signed by."
)
@click.option("--sources", is_flag=True, help="Re-read every official source from git.")
@click.option("--no-replay", is_flag=True, help="Only chain and Merkle root (fast).")
@click.option("--no-views", is_flag=True, help="Do not compare live views with a replay.")
@json_option
def audit_verify(
    from_checkpoint: Path | None,
    key: str | None,
    sources: bool,
    no_replay: bool,
    no_views: bool,
    as_json: bool,
) -> None:
    """Recompute every event id, the chain, the Merkle root, every lifecycle transition
    and catalog digest; report ok or the first bad position and what is wrong there."""
    from domain.errors import IntegrityFailure
    from ledger.audit import verify_log

    ledger = _ctx().ledger()
    note = _read_text(from_checkpoint, "from_checkpoint") if from_checkpoint else None
    with progress_bar(not as_json, "audit", "ev") as progress:
        report = verify_log(
            ledger,
            from_checkpoint=note,
            verifier=_verifier(key),
            replay=not no_replay,
            views=not no_views,
            sources=sources,
            progress=progress,
        )
    document = report.to_json()
    if not report.ok:
        first = report.first()
        assert first is not None
        where = f"position {first.position}" if first.position else "the log"
        raise IntegrityFailure(
            f"audit failed at {where} ({first.check}): {first.message}", **document
        )

    def human() -> None:
        click.echo(
            f"ok: {report.size} events, root {document['root']}, "
            f"{report.revisions} catalog revision(s); checked {', '.join(report.checks)}"
        )

    emit(as_json, document, human)


@cli.command()
@click.option("--pack", required=True, help="Pack name (exact bytes).")
@json_option
def history(pack: str, as_json: bool) -> None:
    """Every lifecycle event of a pack, read from the log alone."""
    from ledger.audit import history as read_history

    events = read_history(_ctx().ledger(), pack)

    def human() -> None:
        for e in events:
            extra = " ".join(
                f"{k}={e[k]}"
                for k in ("install_id", "epoch", "revision", "reason")
                if e.get(k) is not None
            )
            click.echo(f"{e['position']:>8}  {e['event']:<26} {extra}")

    emit(as_json, {"pack": pack, "events": events}, human)


@cli.command("export")
@click.option("--jsonl", is_flag=True, required=True, help="One JSON document per event.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="File to write (default: stdout).",
)
def export(jsonl: bool, out: Path | None) -> None:
    """Export every event with position, ids, chain and decoded state."""
    from ledger.audit import export_jsonl

    ledger = _ctx().ledger()
    if out is None:
        count = export_jsonl(ledger, sys.stdout)
    else:
        try:
            with out.open("w", encoding="utf-8") as handle:
                count = export_jsonl(ledger, handle)
        except OSError as exc:
            raise InvalidInput(f"cannot write {out}: {exc.strerror}", field="out") from None
        click.echo(f"{count} events written to {out}", err=True)


@cli.group("projections")
def projections_group() -> None:
    """Views of the log: status, blue/green rebuild, verify, catch-up."""


@projections_group.command("status")
@json_option
def projections_status(as_json: bool) -> None:
    """Each view's version, position, lag behind the log head, mode and any stopped error."""
    ledger = _ctx().ledger()
    document = ledger.runner.status(ledger.db)

    def human() -> None:
        click.echo(f"log head: {document['head']}")
        for v in document["views"]:
            line = (
                f"  {v['name']:<16} {v['mode']:<8} v{v.get('live_version')} "
                f"position {v.get('position')} lag {v.get('lag')} {v['state']}"
            )
            if v.get("rebuild_needed"):
                line += "  (rebuild needed)"
            click.echo(line)
            if v.get("error"):
                e = v["error"]
                click.echo(
                    f"      stopped at position {e['position']} ({e['topic']}): {e['error']}"
                )

    emit(as_json, document, human)


@projections_group.command("rebuild")
@click.argument("names", nargs=-1)
@click.option(
    "--workers",
    type=click.IntRange(min=1, max=16),
    default=None,
    help="Processes replaying views in parallel (default: up to 2 cores).",
)
@json_option
def projections_rebuild(names: tuple[str, ...], workers: int | None, as_json: bool) -> None:
    """Rebuild views beside the live ones from position 0, then swap atomically."""
    from ledger.rebuild import default_workers, process_builder

    ledger = _ctx().ledger()
    with progress_bar(not as_json, "rebuild", "ev") as progress:
        report = ledger.runner.rebuild(
            ledger.db,
            names,
            progress=progress,
            builder=process_builder(_ctx().url),
            workers=workers or default_workers(),
        )

    def human() -> None:
        for name, r in report.items():
            click.echo(
                f"{name}: v{r['previous_version']} -> v{r['live_version']} at position "
                f"{r['position']} (replayed {r['replayed']}, tail {r['tail']})"
            )

    emit(as_json, {"rebuilt": report}, human)


@projections_group.command("verify")
@click.argument("names", nargs=-1)
@json_option
def projections_verify(names: tuple[str, ...], as_json: bool) -> None:
    """Replay the log in memory and compare with every live view, row by row (R21)."""
    from dataclasses import asdict

    from domain.errors import IntegrityFailure

    ledger = _ctx().ledger()
    results = ledger.runner.verify(ledger.db, names)
    views: list[dict[str, Any]] = [
        {
            "name": r.projection,
            "position": r.position,
            "rows": r.rows,
            "ok": r.ok,
            "difference": asdict(r.difference) if r.difference else None,
        }
        for r in results
    ]
    document = {"ok": all(r.ok for r in results), "views": views}
    if not document["ok"]:
        first = next(v for v in views if not v["ok"])
        diff = first["difference"]
        raise IntegrityFailure(
            f"view {diff['table']} differs from a fresh replay at key {diff['key']}: "
            f"{diff['problem']}",
            views=document["views"],
        )

    def human() -> None:
        for v in views:
            click.echo(f"{v['name']}: ok ({v['rows']} rows at position {v['position']})")

    emit(as_json, document, human)


@projections_group.command("catch-up")
@click.argument("names", nargs=-1)
@json_option
def projections_catch_up(names: tuple[str, ...], as_json: bool) -> None:
    """Advance catch-up views to the log head."""
    ledger = _ctx().ledger()
    chosen = [p.name for p in ledger.runner.select(names) if not p.inline]
    done = {}
    for name in chosen:
        state = ledger.runner.catch_up(ledger.db, name)
        done[name] = {"position": state.position, "stopped": state.stopped}

    def human() -> None:
        for name, d in done.items():
            click.echo(f"{name}: position {d['position']}")

    emit(as_json, {"caught_up": done}, human)


@contextmanager
def progress_bar(enabled: bool, label: str, unit: str) -> Iterator[Callable[[int, int], None]]:
    """A tqdm bar (rate and ETA) when stdout is a terminal; silent otherwise."""
    if not (enabled and sys.stdout.isatty()):
        yield lambda done, total: None
        return
    from tqdm import tqdm

    bar = tqdm(desc=label, unit=unit, unit_scale=True, dynamic_ncols=True)
    try:

        def update(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        yield update
    finally:
        bar.close()


def _report(error: LedgerError, as_json: bool) -> int:
    if as_json:
        sys.stdout.write(dump_json(error.to_json()))
    else:
        click.echo(f"error [{error.code}]: {error.message}", err=True)
        for key, value in error.details.items():
            click.echo(f"  {key}: {value}", err=True)
    return error.exit_code


def run(argv: Sequence[str]) -> int:
    """Run the CLI with ``argv`` and return the exit code (never raises)."""
    args = list(argv)
    as_json = "--json" in args
    try:
        result = cli.main(args=args, prog_name="catalog-ledger", standalone_mode=False)
    except click.UsageError as exc:
        message = exc.format_message()
        if as_json:
            return _report(UsageError(message), True)
        if exc.ctx is not None:
            click.echo(exc.ctx.get_usage(), err=True)
        click.echo(f"error [USAGE]: {message}", err=True)
        return 2
    except click.ClickException as exc:
        return _report(UsageError(exc.format_message()), as_json)
    except click.Abort:
        click.echo("aborted", err=True)
        return 130
    except LedgerError as exc:
        return _report(exc, as_json)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # the last line of defense: never show a traceback
        if os.environ.get("CATALOG_LEDGER_DEBUG"):
            traceback.print_exc()
        internal = LedgerError(
            f"internal error: {type(exc).__name__}: {exc}",
            hint="set CATALOG_LEDGER_DEBUG=1 for a traceback and report it",
        )
        internal_code = _report(internal, as_json)
        return internal_code
    return result if isinstance(result, int) else 0


def main() -> None:
    """Console-script entry point."""
    sys.exit(run(sys.argv[1:]))
