"""One serving-state read shared by the requests waiting for it (a networked store).

Every view read checks the serving state once (``CatalogReader.serving_state``) before
it serves a view it verified earlier. On SQLite that check is a local primary-key read
of a few microseconds and each request makes its own. Over the network (the MySQL
family) it is a round trip, and one per request would cap a server at the driver's
round-trip rate. ``StateGate`` lets concurrent requests share a read, the way a group
commit shares a flush: a request joins the next read that *starts after it arrived*
(never one already in flight), so the state it is given is at least as new as any
commit it could have seen before asking. Reads run in a worker thread, so the event
loop keeps accepting requests meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import anyio.to_thread


class StateGate:
    """Single-flight reads of ``read`` for the requests of one event loop."""

    def __init__(self, read: Callable[[], Any]) -> None:
        self._read = read
        #: The read the next arrivals join: it has not started yet.
        self._next: asyncio.Future[Any] | None = None
        self._running = False
        self._task: asyncio.Task[None] | None = None
        #: Reads made (for the benchmark and tests).
        self.reads = 0

    async def current(self) -> Any:
        """A serving state read after this call began."""
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            if not self._running:
                self._running = True
                self._task = asyncio.get_running_loop().create_task(self._run())
        return await asyncio.shield(self._next)

    async def _run(self) -> None:
        try:
            while self._next is not None:
                joined, self._next = self._next, None
                try:
                    state = await anyio.to_thread.run_sync(self._read)
                except BaseException as exc:  # every joined request gets the typed error
                    joined.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                else:
                    joined.set_result(state)
                self.reads += 1
        finally:
            self._running = False
