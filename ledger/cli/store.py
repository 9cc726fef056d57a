"""Store commands: ``init``, ``log``, ``status``, ``schema dump``."""

from __future__ import annotations

from pathlib import Path

import click

from domain.errors import UsageError
from ledger.cli.app import cli, dump_json, emit, json_option, store


@cli.command()
@json_option
def init(as_json: bool) -> None:
    """Create the schema (idempotent) and print the engine and schema version."""
    info = store().init()

    def human() -> None:
        verb = "created" if info["created"] else "already initialized"
        click.echo(f"{info['db']}: {verb}")
        click.echo(f"engine: {info['engine']} ({info['server_version']})")
        click.echo(f"schema version: {info['schema_version']}")
        click.echo(f"log head: {info['head_position']}")

    emit(as_json, info, human)


@cli.command()
@click.option(
    "--repair",
    is_flag=True,
    help="Restore what the log can rebuild: missing indexes and derived tables (their "
    "views rebuilt), and the head row once the chain verifies.",
)
@json_option
def doctor(repair: bool, as_json: bool) -> int:
    """Compare the live schema with the declared one; exit 6 on an unsafe difference,
    5 when only a migration is pending (`catalog-ledger migrate`)."""
    report = store().doctor(repair=repair)

    def human() -> None:
        for d in report["differences"]:
            kind = "safe" if d["safe"] else "UNSAFE"
            click.echo(f"{kind}: {d['object']}: expected {d['expected']}, found {d['found']}")
        click.echo("ok" if report["ok"] else "the store differs unsafely from the declared schema")

    from ledger.api import doctor_exit_code

    emit(as_json, report, human)
    return doctor_exit_code(report)


@cli.command()
@click.option("--dry-run", is_flag=True, help="List the pending steps; change nothing.")
@json_option
def migrate(dry_run: bool, as_json: bool) -> None:
    """Run the numbered schema migrations (under the migration lock); never downgrades."""
    result = store().migrate(dry_run=dry_run)

    def human() -> None:
        verb = "would apply" if dry_run else "applied"
        if not result["applied"]:
            click.echo(f"schema version {result['to']}: up to date")
        for step in result["applied"]:
            click.echo(f"{verb} step {step['version']}: {step['summary']}")
        if result["applied"] and not dry_run:
            click.echo(f"schema version {result['from']} -> {result['to']}")

    emit(as_json, result, human)


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
    page = store().log(from_position=from_position, limit=limit)

    def human() -> None:
        head = page["head"]
        click.echo(f"log head: position {head['position']}, chain {head['chain']}")
        for e in page["events"]:
            click.echo(
                f"{e['position']:>8}  {e['topic']}  {e['aggregate_id']} v{e['version']}"
                f"  event_id={e['event_id']}  chain={e['chain']}"
            )

    emit(as_json, page, human)


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
    from ledger.api import ddl

    if dialect is not None:
        text = ddl(dialect)
        emit(as_json, {"dialect": dialect, "ddl": text}, lambda: click.echo(text, nl=False))
        return
    written = write_schema_artifacts(out)
    emit(as_json, {"written": written}, lambda: click.echo("\n".join(written)))


def write_schema_artifacts(out: Path) -> list[str]:
    """Write schema/: DDL per dialect, OpenAPI, events JSON Schema, log-format vectors."""
    from ledger.api import ddl
    from ledger.audit.event_schema import events_schema
    from ledger.audit.vectors import all_vectors
    from ledger.http.app import openapi_document

    files = {out / f"{name}.sql": ddl(name) for name in ("sqlite", "mysql")}
    files[out / "openapi.json"] = dump_json(openapi_document())
    files[out / "events.schema.json"] = dump_json(events_schema())
    for name, document in all_vectors().items():
        files[out / "vectors" / "log" / name] = dump_json(document)
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write schema files: {exc}", field="out") from None
    return [str(p) for p in files]


@cli.command()
@json_option
def status(as_json: bool) -> None:
    """Per pack: active install id, revision, epoch, newest attempt, dirty flag."""
    document = store().status()
    head, packs = document["head"], document["packs"]

    def human() -> None:
        click.echo(f"log head: {head}; {len(packs)} pack(s)")
        for p in packs:
            removed = p.get("removed")
            if p["active_install_id"]:
                line = f"active {p['active_install_id']} @ {p['revision']} epoch {p['epoch']}"
            elif removed is not None:
                line = f"removed {removed['source_kind']} {removed['install_id']}"
                if removed["active_epoch"] is not None:
                    line += (
                        f" @ {removed['revision']} (active at epoch {removed['active_epoch']}; "
                        f"removed at epoch {p['epoch']})"
                    )
            elif p["status"] is not None:
                line = f"{p['source_kind']} {p['status']} {p['installed_install_id']}"
            else:
                line = "never activated"
            newest = p["newest_attempt"]
            shown = p["active_install_id"] or (removed and removed["install_id"])
            if newest and newest["install_id"] != shown:
                line += f"; newest attempt {newest['install_id']} {newest['status']}"
            if p["dirty"]:
                line += "  DIRTY (blocks publication until a later generation activates)"
            click.echo(f"  {p['pack']}: {line}")

    emit(as_json, document, human)
