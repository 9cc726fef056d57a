"""``import --jsonl``: restore an ``export --jsonl`` into an empty store (backup, restore,
moving between engines)."""

from __future__ import annotations

import sys

import click

from ledger.cli.app import cli, emit, json_option, progress_bar, store


@cli.command("import")
@click.option(
    "--jsonl",
    "jsonl",
    metavar="FILE",
    required=True,
    help="The `export --jsonl` file to load (`-` reads standard input).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1, max=16),
    default=None,
    help="Processes rebuilding the views afterwards (default: 1; the chain check has its own).",
)
@click.option(
    "--legacy-no-trailer",
    "legacy_no_trailer",
    is_flag=True,
    help="Accept an export without a trailer line (written by 0.1 or 0.2); "
    "a cut at a line boundary then goes undetected.",
)
@json_option
def import_(jsonl: str, workers: int | None, legacy_no_trailer: bool, as_json: bool) -> None:
    """Load an export into this initialized, empty store: every line's position, event id,
    chain link and type, and the trailer (count, head, Merkle root), are checked before
    anything commits (INTEGRITY naming the first bad line, nothing written); a file without
    its trailer or an empty file is refused; the stored bytes are kept exactly; then every
    view is rebuilt."""
    target = store()
    _ = target.ledger  # an uninitialized store fails before standard input is read
    with (
        progress_bar(not as_json, "import", "B") as progress,
        progress_bar(not as_json, "rebuild", "ev") as rebuild_progress,
    ):
        source = sys.stdin.buffer if jsonl == "-" else jsonl
        document = target.import_jsonl(
            source,
            progress=progress,
            rebuild_progress=rebuild_progress,
            workers=workers,
            legacy_no_trailer=legacy_no_trailer,
        )

    def human() -> None:
        click.echo(
            f"imported {document['imported']} events: head {document['head_position']} "
            f"chain {document['chain']} root {document['root']}"
        )
        click.echo(
            f"  rebuilt {len(document['views_rebuilt'])} view(s); origin {document['origin']}"
        )

    emit(as_json, document, human)
