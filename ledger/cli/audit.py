"""Audit commands: ``audit …``, ``history`` and ``export``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from domain.errors import InvalidInput, UsageError
from domain.identity import PackName
from ledger.cli.app import cli, dump_json, emit, json_option, progress_bar, store


@cli.group("audit")
def audit_group() -> None:
    """Verify the log, checkpoints and Merkle proofs (RFC 9162)."""


@audit_group.command("keygen")
@click.argument("name", required=False)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Signer key file to create (its .pub sibling gets the verifier key).",
)
@json_option
def audit_keygen(name: str | None, out: Path, as_json: bool) -> None:
    """Create an Ed25519 key for signing checkpoints (C2SP signed note format). NAME
    defaults to the store's origin (`audit origin`, read from --db): tlog-checkpoint says
    the key name SHOULD match the checkpoint's origin line."""
    if name is None:
        document = store().keygen(None, out)
    else:
        from ledger.api import keygen

        document = keygen(name, out)
    emit(as_json, document, lambda: click.echo(document["verifier_key"]))


@audit_group.command("origin")
@click.option(
    "--name",
    "name",
    is_flag=True,
    help="Record the origin in the log (`log.named`) if the log does not state it yet.",
)
@click.option(
    "--origin",
    "origin",
    default=None,
    metavar="ORIGIN",
    help="With --name: the origin to record (default: the one the log has had so far), "
    "e.g. the pinned origin of a log restored from an export made before it was named. "
    "With --new: the new origin.",
)
@click.option(
    "--new",
    "new",
    is_flag=True,
    help="Give the log a new origin (`log.renamed`; --origin, default catalog-ledger/<this "
    "store's id>): a restore that cannot resume becomes a new log, which clients re-pin.",
)
@json_option
def audit_origin(name: bool, origin: str | None, new: bool, as_json: bool) -> None:
    """Print the log's checkpoint origin. It is a fact of the log (`log.named`, carried
    by `export`), so a log moved to another engine keeps it; a log never named has
    `catalog-ledger/<store id>` until its first signing records exactly that."""
    if name and new:
        raise UsageError("give --name or --new, not both")
    if origin is not None and not (name or new):
        raise UsageError("--origin needs --name or --new")
    document = store().origin(name=name, origin=origin, new=new)

    def human() -> None:
        state = (
            "appended log.named"
            if document["appended"]
            else ("named in the log" if document["named"] else "not yet named in the log")
        )
        click.echo(f"{document['origin']}  ({state})")

    emit(as_json, document, human)


@audit_group.command("rotate-key")
@click.option(
    "--old",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    metavar="KEYFILE",
    help="The current signer key file: it signs the rotation statement.",
)
@click.option(
    "--new",
    required=True,
    metavar="PUBKEY",
    help="The successor's verifier key (file or text; a signer key file is read for its "
    "verifier key only).",
)
@click.option(
    "--overlap",
    type=click.IntRange(min=0),
    required=True,
    metavar="SECONDS",
    help="How long the old key stays valid beside the new one.",
)
@json_option
def audit_rotate_key(old: Path, new: str, overlap: int, as_json: bool) -> None:
    """Rotate the log's signing key: append `log_key.rotated`, a statement signed by the
    old key naming the new one and the end of the overlap. Checkpoints signed from then on
    cover it, so witnesses cosign it; clients apply it to their pinned keys."""
    import time

    document = store().rotate_key(old=old, new=new, overlap=overlap, now=int(time.time()))

    def human() -> None:
        click.echo(
            f"rotated at position {document['position']}: {document['new_key']} "
            f"(the old key is valid until {document['until']})"
        )

    emit(as_json, document, human)


@audit_group.command("resume-check")
@click.argument("note", required=False, type=click.Path(dir_okay=False, path_type=Path))
@json_option
def audit_resume_check(note: Path | None, as_json: bool) -> None:
    """Check, as a witness would, that this log extends a cosigned checkpoint: NOTE (the
    last one the witnesses cosigned, or one a newer export carried), by default every
    cosigned checkpoint the store holds. A restored older backup is STALE (exit 5: a
    rollback, refused by witnesses and clients); a log that forked from it is INTEGRITY
    (exit 6). Run it after a restore, before signing anything."""
    document = store().resume_check(note)

    def human() -> None:
        for c in document["checked"]:
            click.echo(
                f"ok: {c['origin']} at size {c['size']} extends the cosigned size "
                f"{c['cosigned_size']}"
            )
        if not document["checked"]:
            click.echo("no cosigned checkpoint to check against")

    emit(as_json, document, human)


@audit_group.command("checkpoint")
@click.option(
    "--sign",
    "sign",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="KEYFILE",
    help="Sign the checkpoint with this signer key.",
)
@click.option(
    "--log",
    "log",
    type=click.Choice(["main", "catalog"]),
    default="main",
    show_default=True,
    help="The main log, or the catalog log (leaf i: revision i+1's event id, R29).",
)
@json_option
def audit_checkpoint(sign: Path | None, log: str, as_json: bool) -> None:
    """Print a tlog-checkpoint (origin, size, base64 Merkle root), optionally signed."""
    document = store().checkpoint(sign=sign, log=log)
    emit(as_json, document, lambda: click.echo(document["note"], nl=False))


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
@json_option
def audit_prove(
    position: int | None,
    size: int | None,
    from_size: int | None,
    to_size: int | None,
    as_json: bool,
) -> None:
    """Print an inclusion or consistency proof as JSON (RFC 9162)."""
    proof = store().prove(position=position, size=size, from_size=from_size, to_size=to_size)
    sys.stdout.write(dump_json(proof))  # the proof document is the output, --json or not


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
@click.option(
    "--policy",
    type=click.Path(path_type=Path),
    default=None,
    help="Trust policy (JSON, R29): the checkpoint must be signed by one of its log keys "
    "and cosigned by its threshold of witnesses.",
)
@json_option
def audit_verify_proof(
    file: Path, checkpoint_file: Path, key: str | None, policy: Path | None, as_json: bool
) -> None:
    """Verify a proof offline against a checkpoint (no database needed)."""
    from ledger.api import check_proof

    result = check_proof(file, checkpoint_file, key, policy)
    size = result.get("size", result.get("size2"))
    emit(as_json, result, lambda: click.echo(f"ok: {result['type']} proof verifies at size {size}"))


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
    with progress_bar(not as_json, "audit", "ev") as progress:
        report = store().audit(
            from_checkpoint=from_checkpoint,
            key=key,
            sources=sources,
            replay=not no_replay,
            views=not no_views,
            progress=progress,
        )
    document = report.to_json()

    def human() -> None:
        click.echo(
            f"ok: {report.size} events, root {document['root']}, "
            f"{report.revisions} catalog revision(s); checked {', '.join(report.checks)}"
        )

    emit(as_json, document, human)


@cli.command()
@click.option("--pack", default=None, help="Pack name (exact bytes).")
@click.option(
    "--audience",
    default=None,
    help="An audience (app:<id> or integration:<id>): its bindings and credentials.",
)
@json_option
def history(pack: str | None, audience: str | None, as_json: bool) -> None:
    """Every lifecycle event of a pack (--pack), or every binding and credential event
    of an audience (--audience), read from the log alone."""
    if (pack is None) == (audience is None):
        raise UsageError("give --pack PACK or --audience AUDIENCE (exactly one)")
    if audience is not None:
        found = store().history(audience=audience)

        def human_audience() -> None:
            for e in found["events"]:
                extra = " ".join(
                    f"{k}={e[k]}"
                    for k in ("credential_id", "pack", "kind", "key", "install_id", "expires_at")
                    if e.get(k) is not None
                )
                click.echo(f"{e['position']:>8}  {e['event']:<26} {extra}")

        emit(as_json, found, human_audience)
        return
    assert pack is not None
    document = store().history(str(PackName(pack, field="--pack")))
    events = document["events"]

    def human() -> None:
        for e in events:
            extra = " ".join(
                f"{k}={e[k]}"
                for k in ("install_id", "epoch", "revision", "reason")
                if e.get(k) is not None
            )
            click.echo(f"{e['position']:>8}  {e['event']:<26} {extra}")

    emit(as_json, document, human)


@cli.command("export")
@click.option("--jsonl", is_flag=True, required=True, help="One JSON document per event.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="File to write (default: stdout).",
)
@json_option
def export(jsonl: bool, out: Path | None, as_json: bool) -> None:
    """Export every event with position, ids, chain and exact stored bytes (JSON lines),
    then a trailer line (count, head, Merkle root) that `import` checks. A damaged row is
    written as stored, flagged, and the export exits 6 naming it after the whole file."""
    from ledger.audit.export import DamagedExport

    if out is None:
        if as_json:
            raise UsageError("--json prints a summary document: give --out FILE for the events")
        store().export(sys.stdout)
        return
    _ = store().audit_ledger  # a missing store fails before the output file is created
    partial = out.with_name(f".{out.name}.partial")
    damaged: DamagedExport | None = None
    try:
        with partial.open("w", encoding="utf-8") as handle:
            try:
                count = store().export(handle)
            except DamagedExport as exc:  # the file is complete: keep it, for forensics
                damaged = exc
        partial.replace(out)  # all or nothing: a failed export leaves no file behind
    except OSError as exc:
        raise InvalidInput(f"cannot write {out}: {exc.strerror}", field="out") from None
    finally:
        partial.unlink(missing_ok=True)
    if damaged is not None:
        raise DamagedExport(
            f"{damaged.message}; written to {out}", **{**damaged.details, "out": str(out)}
        )
    if as_json:
        emit(True, {"events": count, "out": str(out)}, lambda: None)
    else:
        click.echo(f"{count} events written to {out}", err=True)


@cli.command("cosign")
@click.option(
    "--sign",
    "sign",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    multiple=True,
    metavar="KEYFILE",
    help="The log's signer key (this job holds it; `serve` never does). Twice during a "
    "key rotation's overlap: the old key and the new one both sign.",
)
@click.option(
    "--policy",
    "policy",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    metavar="POLICY.json",
    help="Trust policy: the catalog log's origin, log keys, witnesses (key, url), threshold.",
)
@json_option
def cosign_command(sign: tuple[Path, ...], policy: Path, as_json: bool) -> None:
    """Sign the catalog log's checkpoint, submit it to the policy's witnesses (C2SP
    tlog-witness) and store it with their cosignatures when at least the threshold
    cosigned; otherwise store nothing and exit UNAVAILABLE naming the witnesses that
    failed. Then the same for the main log's checkpoint (it covers the log's key
    rotations, which runtimes learn from it). Run it more often than the clients'
    max_age_seconds (R29)."""
    document = store().cosign(sign=sign, policy=policy)
    emit(
        as_json,
        document,
        lambda: click.echo(
            f"cosigned size {document['size']} by {len(document['cosigned'])} witnesses "
            f"({', '.join(document['cosigned'])}); the main log's size "
            f"{document['main']['size']} by {len(document['main']['cosigned'])}"
        ),
    )
