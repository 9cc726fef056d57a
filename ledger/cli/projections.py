"""``projections status|rebuild|verify|catch-up``."""

from __future__ import annotations

import click

from ledger.cli.app import cli, emit, json_option, progress_bar, store


@cli.group("projections")
def projections_group() -> None:
    """Views of the log: status, blue/green rebuild, verify, catch-up."""


@projections_group.command("status")
@json_option
def projections_status(as_json: bool) -> None:
    """Each view's version, position, lag behind the log head, mode and any stopped error."""
    document = store().projections_status()

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
            e = v.get("error")
            if e:
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
    help="Processes replaying views in parallel (default: 1; the chain check has its own).",
)
@click.option(
    "--no-chain-check",
    is_flag=True,
    help="Skip checking the log's chain while rebuilding (benchmarks; just after an audit).",
)
@json_option
def projections_rebuild(
    names: tuple[str, ...], workers: int | None, no_chain_check: bool, as_json: bool
) -> None:
    """Rebuild views beside the live ones from position 0, then swap atomically; a log
    whose chain does not verify swaps nothing in (INTEGRITY naming the position)."""
    with progress_bar(not as_json, "rebuild", "ev") as progress:
        report = store().rebuild(
            names, workers=workers, progress=progress, chain_check=not no_chain_check
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
    document = store().verify_projections(names)
    views = document["views"]

    def human() -> None:
        for v in views:
            click.echo(f"{v['name']}: ok ({v['rows']} rows at position {v['position']})")

    emit(as_json, document, human)


@projections_group.command("catch-up")
@click.argument("names", nargs=-1)
@json_option
def projections_catch_up(names: tuple[str, ...], as_json: bool) -> None:
    """Advance catch-up views to the log head."""
    done = store().catch_up(names)

    def human() -> None:
        for name, d in done.items():
            click.echo(f"{name}: position {d['position']}")

    emit(as_json, {"caught_up": done}, human)
