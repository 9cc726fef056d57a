"""The projection framework: one ``apply`` code path for inline, catch-up, rebuild and verify.

A projection declares a name, a code version, its tables and the event types it
consumes, and implements ``apply(event, rows)`` against a ``RowStore``
(``projections.rows``).

A rebuild from position 0 runs each view's ``Replayer`` (``Projection.replayer``,
written beside the view's ``apply`` in ``projections.views``): a kernel that turns
decoded events straight into row tuples, bulk-written as the next view version.
``apply`` stays the definition: a kernel that raises is replaced by ``apply`` for
that view; before the swap the new version is checked against what the log commits
(``projections.log_commitments``, R28); ``projections verify`` compares what a kernel
built with a replay through ``apply`` (R20, R21); and ``tests/rules/test_r28_rebuild_kernels``
proves each kernel's rows equal ``apply``'s over random streams.

Blue/green without DDL: every physical view table has a leading
``view_version`` key column. ``projection_state`` names the live version of
each projection; a rebuild writes version n+1 beside version n and the swap is
one UPDATE of ``projection_state`` in the transaction that also applies the
last events. Readers always select ``view_version = live`` (the SQL views
named ``_System_…`` do that join), so they see one complete version.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

from domain.errors import Stale
from domain.event_types import EVENT_TYPES, decode_state
from domain.log import LoggedEvent
from projections.rows import MemoryRowStore, RowStore
from projections.tables import Key, RowTuple, ViewTable

__all__ = [
    "GenericReplayer",
    "Handler",
    "Projection",
    "Replayer",
    "TableReplayer",
    "ViewEvent",
    "code_mismatch",
    "stored_topics",
]

#: A rebuild handler: (log position, decoded current-version state) -> None.
Handler = Callable[[int, dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class ViewEvent:
    """A log row as projections see it: position, event type name and current-version state.

    Events are self-describing (they carry the pack, install id … they are
    about), so projections need nothing else from the row.
    """

    position: int
    type: str
    data: dict[str, Any]

    @classmethod
    def decode(cls, row: LoggedEvent) -> ViewEvent:
        """Decode through the type table: v0 and v1 rows alike, upcast (R23)."""
        return cls(row.position, *decode_state(row.position, row.topic, row.state))


def code_mismatch(name: str, built_with: int, code: int) -> Stale:
    """A view built by other code than this program's is never served nor written (R25)."""
    return Stale(
        f"view {name} was built by view code version {built_with}, this program has "
        f"version {code}: it is not served until `catalog-ledger projections rebuild {name}` "
        "swaps in a version built by this code",
        axis="projection",
        view=name,
        built_with_code_version=built_with,
        code_version=code,
    )


@cache
def stored_topics(types: frozenset[str]) -> frozenset[str]:
    """Every stored topic (both log formats, every version) of the event types ``types``."""
    return frozenset(EVENT_TYPES.topics_of(types))


class Replayer(ABC):
    """A projection's rebuild kernel: the rows of one view version, built in memory.

    ``handlers`` maps an event type name to a function of (position, decoded state)
    that updates ``rows`` (key -> row tuple, see ``RowTuple``). A kernel is an
    optimized transcription of its projection's ``apply``: on any exception the
    runner discards the kernel and replays that view through ``apply`` instead, so
    poison events are reported by ``apply`` itself, and ``projections verify``
    (which always replays through ``apply``) checks a kernel's rows against it.
    """

    def __init__(self, view_version: int) -> None:
        self.view_version = view_version
        self.handlers: dict[str, Handler] = {}

    @abstractmethod
    def tables(self) -> list[tuple[ViewTable, Mapping[Key, RowTuple]]]:
        """Every table of the view with its rows (any order; written in key order)."""


class TableReplayer(Replayer):
    """A kernel of a one-table view: ``rows`` of ``table``, keyed as the table is."""

    table: ClassVar[ViewTable]

    def __init__(self, view_version: int) -> None:
        super().__init__(view_version)
        self.rows: dict[Key, RowTuple] = {}

    def tables(self) -> list[tuple[ViewTable, Mapping[Key, RowTuple]]]:
        return [(self.table, self.rows)]


class GenericReplayer(Replayer):
    """``apply`` into a ``MemoryRowStore``: the rebuild of a view without a kernel."""

    def __init__(self, projection: Projection, view_version: int) -> None:
        super().__init__(view_version)
        self.projection = projection
        self.memory = MemoryRowStore()
        apply, memory = projection.apply, self.memory
        for name in projection.types:

            def handler(position: int, data: dict[str, Any], name: str = name) -> None:
                apply(ViewEvent(position, name, data), memory)

            self.handlers[name] = handler

    def tables(self) -> list[tuple[ViewTable, Mapping[Key, RowTuple]]]:
        vv = self.view_version
        out: list[tuple[ViewTable, Mapping[Key, RowTuple]]] = []
        for table in self.projection.tables:
            columns = table.columns
            out.append(
                (
                    table,
                    {
                        key: (vv, *[row[c] for c in columns])
                        for key, row in self.memory.rows(table).items()
                    },
                )
            )
        return out


class Projection(ABC):
    """A pure function of the log into view rows (R20)."""

    name: ClassVar[str]
    version: ClassVar[int]
    tables: ClassVar[tuple[ViewTable, ...]]
    #: The event type names (``domain.event_types``) the projection applies.
    types: ClassVar[frozenset[str]]
    #: Inline projections are applied inside the append transaction (core views).
    inline: ClassVar[bool] = True
    #: Relative replay cost, used to balance parallel rebuilds (measured, rough).
    weight: ClassVar[float] = 1.0

    @abstractmethod
    def apply(self, event: ViewEvent, rows: RowStore) -> None:
        """Write the rows this event implies; raise to report a poison event."""

    def replayer(self, view_version: int) -> Replayer:
        """The rebuild kernel of this view (default: ``apply`` into memory)."""
        return GenericReplayer(self, view_version)
