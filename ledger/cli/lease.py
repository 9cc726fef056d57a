"""``lease status`` and ``lease break``: see and free the writer lease (R27)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ledger.cli.app import cli, emit, json_option, store

if TYPE_CHECKING:
    from ledger.api import LeaseStatus


@cli.group("lease")
def lease_group() -> None:
    """The writer lease: who holds it, and freeing a dead holder's."""


def _show(status: LeaseStatus) -> None:
    if status["held"]:
        click.echo(
            f"{status['lease']}: held by {status['holder']} at epoch {status['epoch']} "
            f"until {status['expires_at']}"
        )
    else:
        click.echo(f"{status['lease']}: free (epoch {status['epoch']})")


@lease_group.command("status")
@json_option
def lease_status(as_json: bool) -> None:
    """Show the holder, epoch and expiry of the writer lease."""
    status = store().lease_status()
    emit(as_json, status, lambda: _show(status))


@lease_group.command("break")
@click.option("--holder", required=True, help="The holder whose lease to free (exactly).")
@json_option
def lease_break(holder: str, as_json: bool) -> None:
    """Free HOLDER's lease now (exit 4 unless HOLDER holds it); its appends are fenced out."""
    status = store().lease_break(holder)
    emit(as_json, status, lambda: _show(status))
