"""Every table the store owns, declared explicitly: the log's, the projections' (from the
view registry) and the publisher's derived fragments."""

from __future__ import annotations

import sqlalchemy as sa

from ledger.log import tables as log_tables
from ledger.store.kept_fragments import metadata as fragment_metadata
from projections.registry import view_metadata


def all_metadata() -> list[sa.MetaData]:
    """Every table the store owns: the log first, then the projections, then the
    publisher's derived fragments."""
    return [log_tables.metadata, view_metadata(), fragment_metadata]
