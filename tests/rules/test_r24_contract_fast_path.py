"""R24: the check on open takes a fast path only when the detailed diff would agree.

``contract.differences`` first asks a few catalog queries whether every declared table is
exactly as declared (``_matches_declared``); only then does it skip the table-by-table
inspector diff (``detailed_differences``). On a matching store and on every kind of drift
the other R24 tests make, both paths give the same differences, and the fast path is
taken exactly when the tables match (drift always reaches the detailed diff).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa

from ledger.store import contract
from tests.rules.test_r24_head_row import add_events_column, delete_head_row, head_at_zero, sql
from tests.rules.test_r24_schema_contract import (
    _store_version,
    binary_to_text,
    bump_schema_version,
    drop_unique_key,
    released,
)
from tests.support.lifecycle_support import World


def nothing(world: World) -> None:
    """A matching store."""


def drop_secondary_index(world: World) -> None:
    sql(
        world,
        "DROP INDEX ix_view_pack_generation_0"
        + ("" if world.url.startswith("sqlite") else " ON view_pack_generation"),
    )


def extra_index(world: World) -> None:
    """An index nobody declared: neither path reports it."""
    sql(world, "CREATE INDEX ix_extra ON ledger_events (topic)")


def extra_table(world: World) -> None:
    """A table nobody declared: neither path reports it."""
    sql(world, "CREATE TABLE not_ours (x INTEGER)")


def drop_view_table(world: World) -> None:
    sql(world, "DROP TABLE view_installed_pack")


def drop_head_table(world: World) -> None:
    sql(world, "DROP TABLE ledger_head")


def view_instead_of_table(world: World) -> None:
    """A declared table replaced by a view of the same name: "missing" to the inspector."""
    sql(world, "DROP TABLE view_installed_pack")
    sql(world, "CREATE VIEW view_installed_pack AS SELECT 1 AS x")


#: Drift -> whether the declared tables still match (the fast path's catalog answer).
DRIFT: dict[str, tuple[Callable[[World], None], bool]] = {
    "matching store": (nothing, True),
    "unique key dropped": (drop_unique_key, False),
    "binary column made text": (binary_to_text, False),
    "secondary index dropped": (drop_secondary_index, False),
    "extra nullable column": (lambda w: add_events_column(w, "extra INTEGER NULL"), False),
    "extra column with a default": (
        lambda w: add_events_column(w, "extra INTEGER NOT NULL DEFAULT 7"),
        False,
    ),
    "extra NOT NULL column": (lambda w: add_events_column(w, "extra INTEGER NOT NULL"), False),
    "view table dropped": (drop_view_table, False),
    "head table dropped": (drop_head_table, False),
    "view in place of a table": (view_instead_of_table, False),
    "extra index": (extra_index, True),
    "extra table": (extra_table, True),
    "newer schema version": (bump_schema_version, True),
    "schema version not a number": (lambda w: _store_version(w, b"two"), True),
    "head row deleted": (delete_head_row, True),
    "head row reset to 0": (head_at_zero, True),
}


@pytest.mark.parametrize("drift", list(DRIFT))
def test_r24_fast_path_and_inspector_diff_agree(world: World, drift: str) -> None:
    released(world)
    change, matches = DRIFT[drift]
    change(world)
    world.db.engine.dispose()  # DDL ran: fresh connections see it
    with world.db.engine.connect() as conn:
        assert contract._matches_declared(conn, world.db.dialect) is matches
        fast = contract.differences(conn, world.db.dialect)
        detailed = contract.detailed_differences(conn, world.db.dialect)
    assert fast == detailed
    if drift == "matching store":
        assert detailed == []
    else:
        assert detailed or drift in ("extra index", "extra table"), drift


def test_r24_fast_path_costs_a_constant_few_queries(world: World) -> None:
    """The matching case: a few catalog queries plus the version and head reads, however
    many tables are declared (the inspector issues several per table)."""
    released(world)
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    with world.db.engine.connect() as conn:
        sa.event.listen(conn, "before_cursor_execute", count)
        assert contract.differences(conn, world.db.dialect) == []
        sa.event.remove(conn, "before_cursor_execute", count)
    assert len(statements) <= 6, statements
    assert len(contract.declared_tables()) > 6
