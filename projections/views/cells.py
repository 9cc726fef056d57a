"""Cell encodings shared by the lifecycle views and their rebuild kernels."""

from __future__ import annotations

from domain.lifecycle import GenerationStatus
from projections.tables import ViewTable


def opt(value: str | None) -> bytes | None:
    return value.encode() if value is not None else None


# Status bytes as stored; precomputed because rebuilds apply millions of events.
ACTIVE = GenerationStatus.ACTIVE.value.encode()
PREPARING = GenerationStatus.PREPARING.value.encode()
RETIRED = GenerationStatus.RETIRED.value.encode()
FAILED_CLEAN = GenerationStatus.FAILED_CLEAN.value.encode()
FAILED_DIRTY = GenerationStatus.FAILED_DIRTY.value.encode()


def columns_are(table: ViewTable, *names: str) -> None:
    """The kernels write rows positionally: pin the column order they assume."""
    if table.columns != names:
        raise AssertionError(f"{table.name}: columns {table.columns}, a kernel assumes {names}")
