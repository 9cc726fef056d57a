"""What the projections need from the ledger: the log to read and transactions to run.

The projections know nothing of how the log is stored: the ledger hands them a
``LogSource`` (read rows, read and lock the head) and ``Transactions`` (read and
write transactions on the store's database). Dependencies therefore point inward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol
from uuid import UUID

from sqlalchemy.engine import Connection

from domain.event_types import Decoded
from domain.log import LoggedEvent

#: Called with (position reached, position to reach) while a replay runs.
Progress = Callable[[int, int], None]

#: Runs ``build_versions`` for each group of view names (e.g. one process each)
#: and returns the merged poison-event errors.
GroupBuilder = Callable[
    [list[list[str]], dict[str, tuple[int, int]], int, Progress | None],
    dict[str, dict[str, Any]],
]


class HeadLike(Protocol):
    @property
    def position(self) -> int: ...

    @property
    def chain(self) -> bytes: ...


class LogSource(Protocol):
    def scan(
        self,
        conn: Connection,
        *,
        after: int,
        upto: int,
        topics: Sequence[str] | None = None,
        page: int = 10_000,
    ) -> Iterator[tuple[int, str, bytes]]: ...

    def read_rows(
        self, conn: Connection, *, after: int, upto: int | None = None, limit: int = 1000
    ) -> list[LoggedEvent]: ...

    def head_in(self, conn: Connection) -> HeadLike: ...

    def lock_head(self, conn: Connection) -> HeadLike: ...

    def last_events(self, conn: Connection, aggregates: Iterable[UUID]) -> Mapping[UUID, Decoded]:
        """The last event of each of ``aggregates`` that has any (one index seek each)."""
        ...


class Transactions(Protocol):
    """Read and write transactions on the store's database (``ledger.log.db.Database``)."""

    @property
    def is_sqlite(self) -> bool: ...

    def write(self) -> AbstractContextManager[Connection]: ...

    def read(self) -> AbstractContextManager[Connection]: ...
