"""``credentials issue | revoke | list``: who may read as which audience (R26)."""

from __future__ import annotations

import click

from ledger.cli.app import cli, emit, json_option, store


@cli.group("credentials")
def credentials_group() -> None:
    """Audience credentials: bearer tokens `serve` accepts, recorded in the log."""


@credentials_group.command("issue")
@click.argument("audience")
@click.option(
    "--expires-in",
    default="90d",
    show_default=True,
    metavar="DURATION",
    help="From 1s to 36500d: 90d, 12h, 30m, 3600s; or never.",
)
@json_option
def credentials_issue(audience: str, expires_in: str, as_json: bool) -> None:
    """Issue a credential for AUDIENCE (app:<id> or integration:<id>). Its token is
    printed now and never again: the log keeps only its digest."""
    issued = store().credentials_issue(audience, expires_in=expires_in)

    def human() -> None:
        click.echo(f"credential_id: {issued['credential_id']}")
        click.echo(f"audience:      {issued['audience']}")
        click.echo(f"token:         {issued['token']}")
        click.echo(f"expires_at:    {issued['expires_at'] or 'never'}")
        click.echo("the token is shown only this once; send it as `Authorization: Bearer TOKEN`")

    emit(as_json, issued, human)


@credentials_group.command("revoke")
@click.argument("credential_id")
@json_option
def credentials_revoke(credential_id: str, as_json: bool) -> None:
    """Revoke CREDENTIAL_ID (exit 5 MISSING if unknown; revoking twice is a no-op).
    Servers refuse its token within one second."""
    revoked = store().credentials_revoke(credential_id)

    def human() -> None:
        what = "was already revoked" if revoked["noop"] else "revoked"
        click.echo(
            f"{revoked['credential_id']} ({revoked['audience']}) {what} at {revoked['revoked_at']}"
        )

    emit(as_json, revoked, human)


@credentials_group.command("list")
@click.option("--audience", default=None, help="Only this audience's credentials.")
@json_option
def credentials_list(audience: str | None, as_json: bool) -> None:
    """Every credential with its status (active, revoked or expired); no secrets."""
    listed = store().credentials_list(audience=audience)

    def human() -> None:
        for c in listed["credentials"]:
            click.echo(
                f"{c['credential_id']}  {c['status']:<8} {c['audience']}  issued {c['issued_at']}"
                f"  expires {c['expires_at'] or 'never'}"
                + (f"  revoked {c['revoked_at']}" if c["revoked_at"] else "")
            )

    emit(as_json, listed, human)
