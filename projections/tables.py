"""Metadata of every projection table (filled in by the projection modules)."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()
