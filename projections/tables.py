"""View tables: the logical name, the physical versioned table, its key and columns.

A view table is declared with its own ``sa.MetaData``; the store's metadata of every
view table is assembled explicitly from the view registry
(``projections.registry.view_metadata``), never by import side effects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from operator import itemgetter
from typing import Any

import sqlalchemy as sa

Row = dict[str, Any]
Key = tuple[Any, ...]
#: One row of a view version as the rebuild writes it: ``view_version`` then the
#: table's columns in declaration order (a list where a kernel updates it in place).
RowTuple = tuple[Any, ...] | list[Any]


@dataclass(frozen=True)
class ViewTable:
    """A logical view table and its physical, versioned table."""

    name: str
    physical: sa.Table
    key: tuple[str, ...]
    columns: tuple[str, ...]

    def key_of(self, row: Row) -> Key:
        key = self.key
        if len(key) == 1:
            return (row[key[0]],)
        return _getter(key)(row)


@cache
def _getter(key: tuple[str, ...]) -> Callable[[Row], Key]:
    return itemgetter(*key)


def view_table(
    name: str,
    physical_name: str,
    key: Sequence[str],
    *columns: sa.Column[Any],
    indexes: Sequence[Sequence[str]] = (),
) -> ViewTable:
    """Declare a view table; ``view_version`` leads its primary key."""
    cols = [sa.Column("view_version", sa.Integer(), primary_key=True, autoincrement=False)]
    for column in columns:
        if column.name in key:
            column.primary_key = True
            column.nullable = False
        cols.append(column)
    # WITHOUT ROWID on SQLite: the primary key is the clustered index, as on
    # InnoDB, so bulk writes maintain one B-tree instead of two.
    # Its own metadata: the registry assembles the store's (``view_metadata``).
    table = sa.Table(physical_name, sa.MetaData(), *cols, sqlite_with_rowid=False)
    for number, index_cols in enumerate(indexes):
        sa.Index(
            f"ix_{physical_name}_{number}", table.c.view_version, *(table.c[c] for c in index_cols)
        )
    return ViewTable(
        name=name,
        physical=table,
        key=tuple(key),
        columns=tuple(c.name for c in columns),
    )
