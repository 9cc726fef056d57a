"""Read commands for runtimes: ``view`` and ``serve``."""

from __future__ import annotations

import click
import orjson

from ledger.cli.app import cli, emit, json_option, store


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
    result = store().view(audience, min_revision=min_revision, at_revision=at_revision)
    if isinstance(result, dict):  # a past revision, replayed from the log
        past = result

        def human_past() -> None:
            click.echo(
                f"{past['audience']} at revision {past['revision']} (log position "
                f"{past['position']}, content {past['content_digest']})"
            )
            for fact in past["facts"]:
                click.echo(f"  {fact['pack']} {fact['kind']}/{fact['key']} [{fact['install_id']}]")

        emit(as_json, past, human_past)
        return
    live = result

    def human() -> None:
        click.echo(f"{live.audience} at revision {live.revision} (content {live.content_digest})")
        for fact in live.facts:
            click.echo(
                f"  {fact['pack']} {fact['kind']}/{fact['key']} "
                f"[{fact['install_id']}] {orjson.dumps(fact['payload']).decode()}"
            )

    emit(as_json, live.to_json(), human)


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=8080, show_default=True)
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info"]),
    default="warning",
    show_default=True,
)
@json_option
def serve(host: str, port: int, log_level: str, as_json: bool) -> None:
    """Serve audience views over HTTP (read only): /v1/audiences/{kind}/{id}/view."""
    import uvicorn

    from ledger.http.app import create_app

    _ = store().ledger  # fail now, with a typed error, if the store is unusable
    listening = {"url": f"http://{host}:{port}", "db": store().db.display_url}
    emit(as_json, listening, lambda: click.echo(f"serving {listening['db']} on {listening['url']}"))
    uvicorn.run(create_app(store().opener()), host=host, port=port, log_level=log_level)
