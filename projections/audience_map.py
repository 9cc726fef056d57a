"""The audience map view, in ``projections.views.audience_map`` (this module keeps the
import path the command side uses)."""

from __future__ import annotations

from projections.views.audience_map import AUDIENCE_MAP, AUDIENCE_MAP_PENDING, AudienceMapView

__all__ = ["AUDIENCE_MAP", "AUDIENCE_MAP_PENDING", "AudienceMapView"]
