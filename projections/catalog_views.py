"""The publication views, one module each in ``projections.views`` (this module keeps
the import path the command side uses; import from ``projections.views.<view>``)."""

from __future__ import annotations

from projections.views.audience_binding import AudienceBindingView
from projections.views.catalog import (
    CATALOG_ACTIVATION,
    CATALOG_GRANT,
    OPEN,
    CatalogView,
)

__all__ = [
    "CATALOG_ACTIVATION",
    "CATALOG_GRANT",
    "OPEN",
    "AudienceBindingView",
    "CatalogView",
]
