"""Every projection the store maintains, in the order they are applied, and the tables
they declare: both built here, explicitly, from the view modules (never by import side
effects)."""

from __future__ import annotations

from functools import cache

import sqlalchemy as sa

from projections.framework import Projection
from projections.state import state_table
from projections.tables import ViewTable
from projections.views.audience_binding import AudienceBindingView
from projections.views.audience_map import AudienceMapView
from projections.views.catalog import CatalogView
from projections.views.command_log import CommandLogView
from projections.views.credential import CredentialView
from projections.views.installed_pack import InstalledPackView
from projections.views.pack_activation import PackActivationView
from projections.views.pack_component import PackComponentView
from projections.views.pack_generation import PackGenerationView

ALL_PROJECTIONS: tuple[Projection, ...] = (
    InstalledPackView(),
    PackGenerationView(),
    PackActivationView(),
    PackComponentView(),
    AudienceBindingView(),
    CatalogView(),
    AudienceMapView(),
    CredentialView(),
    CommandLogView(),
)


@cache
def view_metadata() -> sa.MetaData:
    """The metadata of every table the projections own: ``projection_state`` and each
    view's versioned tables, assembled from ``ALL_PROJECTIONS`` (the DDL and the schema
    contract read it)."""
    metadata = sa.MetaData()
    for table in (state_table, *(t.physical for p in ALL_PROJECTIONS for t in p.tables)):
        table.to_metadata(metadata)
    return metadata


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
