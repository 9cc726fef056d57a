"""Every projection the store maintains, in the order they are applied."""

from __future__ import annotations

from projections.audience_map import AudienceMapView
from projections.catalog_views import CATALOG_PROJECTIONS
from projections.command_log import CommandLogView
from projections.credentials import CredentialView
from projections.framework import Projection, ViewTable
from projections.lifecycle_views import LIFECYCLE_PROJECTIONS

ALL_PROJECTIONS: tuple[Projection, ...] = (
    *LIFECYCLE_PROJECTIONS,
    *CATALOG_PROJECTIONS,
    AudienceMapView(),
    CredentialView(),
    CommandLogView(),
)


def view_sql(table: ViewTable, projection: str) -> str:
    """``CREATE VIEW`` text: the live version of ``table`` under its public name.

    The join on ``projection_state`` makes every single statement against the
    public name see exactly one complete version, before or after a swap.
    """
    cols = ", ".join(f"t.{c}" for c in table.columns)
    return (
        f"CREATE VIEW {table.name} AS SELECT {cols} FROM {table.physical.name} t "
        f"JOIN projection_state s ON s.name = X'{projection.encode().hex()}' "
        "AND t.view_version = s.live_version"
    )


def public_views() -> list[tuple[str, str]]:
    """(public view name, CREATE VIEW text) for every table of every projection."""
    return [(t.name, view_sql(t, p.name)) for p in ALL_PROJECTIONS for t in p.tables]
