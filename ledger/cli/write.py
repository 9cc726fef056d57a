"""Write commands: ``apply``, ``publish``, ``import-legacy`` and ``pack hash``."""

from __future__ import annotations

from pathlib import Path

import click

from ledger.cli.app import cli, emit, json_option, lease_options, store


@cli.command()
@click.argument("manifest", type=click.Path(path_type=Path), required=False)
@click.option(
    "--plan",
    "plan",
    is_flag=True,
    help="Show what apply would do (packs, bindings, audiences, revision) and append "
    "nothing: no lease is taken.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    metavar="PLAN",
    help="With --plan: write the plan file for `apply --plan-file PLAN`.",
)
@click.option(
    "--plan-file",
    type=click.Path(path_type=Path),
    default=None,
    metavar="PLAN",
    help="Apply exactly this plan: CONFLICT if the store moved since, INVALID if the "
    "file or manifest changed (R28); using it again is an exact retry (R10).",
)
@click.option(
    "--detailed-exitcode",
    is_flag=True,
    help="With --plan: exit 10 when the plan is not empty (0: nothing to do).",
)
@click.option(
    "--command-id",
    default=None,
    metavar="ID",
    help="Idempotency key (default: derived from the manifest and the log head).",
)
@lease_options
@click.option(
    "--publish/--no-publish",
    default=True,
    show_default=True,
    help="Publish the catalog revision in the same append (validated either way).",
)
@click.option(
    "--rebuild-stale",
    is_flag=True,
    help="Rebuild every view built by other view code than this program's first "
    "(otherwise the release is refused before any append, R25).",
)
@json_option
def apply(
    manifest: Path | None,
    plan: bool,
    out: Path | None,
    plan_file: Path | None,
    detailed_exitcode: bool,
    command_id: str | None,
    wait: float,
    lease_ttl: float,
    publish: bool,
    rebuild_stale: bool,
    as_json: bool,
) -> int:
    """Converge the store to a release manifest (packs, then bindings and publication)."""
    if plan:
        if manifest is None or plan_file is not None or command_id is not None or rebuild_stale:
            raise click.UsageError(
                "--plan takes a MANIFEST (no --plan-file, --command-id or --rebuild-stale)"
            )
        return show_plan(
            manifest, publish=publish, out=out, detailed=detailed_exitcode, as_json=as_json
        )
    if out is not None or detailed_exitcode:
        raise click.UsageError("--out and --detailed-exitcode go with --plan")
    if manifest is None and plan_file is None:
        raise click.UsageError("missing MANIFEST (or --plan-file PLAN)")
    if plan_file is not None and command_id is not None:
        raise click.UsageError("--plan-file applies the plan's own command id")
    result = store().apply(
        manifest,
        command_id=command_id,
        publish=publish,
        wait=wait,
        lease_ttl=lease_ttl,
        rebuild_stale=rebuild_stale,
        plan_file=plan_file,
    )

    def human() -> None:
        state = (
            "replayed (already recorded)"
            if result["replayed"]
            else ("no changes" if result["noop"] else "applied")
        )
        click.echo(f"apply {result['command_id']}: {state}")
        for item in result["recovered"]:
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
        bindings = result["bindings"]
        moved = [(k, len(bindings[k])) for k in ("granted", "rebound", "revoked")]
        if any(n for _, n in moved):
            click.echo("  bindings: " + ", ".join(f"{n} {k}" for k, n in moved if n))
        catalog = result["catalog"]
        verb = "published" if catalog["published"] else "unchanged"
        click.echo(
            f"  catalog revision {catalog['revision']} ({verb}) digest {catalog['content_digest']}"
        )
        if "blocked" in catalog:
            click.echo(f"  NOT published: {catalog['blocked']['message']}")
        if "candidate_content_digest" in catalog:
            click.echo(
                f"  candidate catalog {catalog['candidate_content_digest']} validated, "
                "NOT published (run `catalog-ledger publish`)"
            )

    emit(as_json, result, human)
    return 0


def show_plan(
    manifest: Path, *, publish: bool, out: Path | None, detailed: bool, as_json: bool
) -> int:
    """``apply --plan``: print the plan; exit 10 with ``--detailed-exitcode`` when it is not
    empty, or the rejection's exit code when apply would refuse the release."""
    from ledger.cli.plan_render import render_plan

    result = store().plan(manifest, publish=publish, out=out)
    emit(as_json, result, lambda: render_plan(result))
    if result["refused"] is not None:
        return int(result["refused"]["exit_code"])
    return 10 if detailed and not result["empty"] else 0


@cli.command()
@click.option("--command-id", default=None, metavar="ID", help="Idempotency key.")
@json_option
def publish(command_id: str | None, as_json: bool) -> None:
    """Validate every audience's closure and publish one catalog revision (if changed)."""
    result = store().publish(command_id=command_id)

    def human() -> None:
        if result["replayed"]:
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


@cli.command("import-legacy")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--command-id", default=None, metavar="ID", help="Idempotency key.")
@json_option
def import_legacy(file: Path, command_id: str | None, as_json: bool) -> None:
    """Record an existing _System_InstalledPack table once, so packs can be adopted."""
    result = store().import_legacy(file, command_id=command_id)

    def human() -> None:
        click.echo(
            f"import-legacy {result['command_id']}: imported "
            f"{len(result['imported'])}, unchanged {len(result['unchanged'])}"
        )

    emit(as_json, result, human)


@cli.group("pack")
def pack_group() -> None:
    """Pack content tools."""


@pack_group.command("hash")
@click.argument("manifest", type=click.Path(path_type=Path))
@click.argument("pack")
@json_option
def pack_hash(manifest: Path, pack: str, as_json: bool) -> None:
    """Print the v1 and v0 payload hashes of PACK's content as MANIFEST resolves it."""
    from ledger.api import pack_hash

    document = pack_hash(manifest, pack)

    def human() -> None:
        click.echo(f"{document['pack']}: {document['components']} component(s)")
        click.echo(f"  v1 {document['payload_hash_v1']}")
        click.echo(f"  v0 {document['payload_hash_v0']}")

    emit(as_json, document, human)
