"""Watching an audience's view over HTTP: ``GET .../view?wait=SECONDS`` (long poll).

A request with ``wait`` and ``If-None-Match`` whose validator still matches the
audience's view waits here until that audience's *own* content changes (its
audience digest, the weak ETag) or ``wait`` seconds pass. Waiters cost no query
each: one poller per process reads the serving state (``CatalogReader.serving_state``,
one primary-key read) every ``poll`` seconds while anyone waits, and only when it
moved re-reads the view of each audience that has waiters, once per audience, in a
worker thread. A waiter whose validator no longer matches is answered with the new
view (or the typed error that a read now gives: MISSING once its grants are gone);
a publication that changes only other audiences wakes nobody.

Waiters are bounded (``serve --max-waiters``): over the bound a request is refused
at once with 503 UNAVAILABLE and ``Retry-After``. ``close`` (on shutdown) answers every
waiter at once, as if its wait had ended, so that waiting never delays a shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread

from domain.errors import LedgerError, Unavailable
from domain.identity import Audience
from domain.served import AudienceView
from ledger.http.settings import MAX_WAITERS
from projections.reader import CatalogReader

#: The bounds of ``wait`` (seconds) and the default bound of waiters per process.
MIN_WAIT, MAX_WAIT = 1, 300
#: How often the poller reads the serving state while anyone waits.
POLL_SECONDS = 0.25
#: ``Retry-After`` (seconds) of a refusal over the bound.
RETRY_AFTER = 1


def confirms(view: AudienceView, etags: frozenset[str]) -> bool:
    """Do the validators of ``If-None-Match`` (``W/`` stripped) confirm ``view``?"""
    return "*" in etags or view.etag.removeprefix("W/") in etags


@dataclass(eq=False)
class _Waiter:
    audience: Audience
    etags: frozenset[str]
    done: asyncio.Future[AudienceView | LedgerError | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class WatchHub:
    """The waiters of one server process and the one poller that serves them all."""

    def __init__(
        self,
        reader: CatalogReader,
        *,
        max_waiters: int = MAX_WAITERS,
        poll: float = POLL_SECONDS,
        counted: Callable[[int], None] = lambda _: None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``counted`` hears every change of the number waiting (+1, -1: a gauge);
        the poller waits ``poll`` seconds between reads with ``sleep`` (a test's clock)."""
        self.reader = reader
        self._sleep = sleep
        self._counted = counted
        self.max_waiters = max_waiters
        self.poll = poll
        self._waiters: dict[Audience, set[_Waiter]] = {}
        self._count = 0
        self._poller: asyncio.Task[None] | None = None
        #: The serving state the poller last saw.
        self._state: Any = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        #: Serving-state reads and view re-reads the poller made (for tests and metrics).
        self.state_reads = 0
        self.view_reads = 0

    @property
    def waiting(self) -> int:
        return self._count

    async def wait(
        self, audience: Audience, etags: frozenset[str], seconds: float, seen: Any
    ) -> AudienceView | None:
        """The audience's view once its ETag is none of ``etags``, or ``None`` after
        ``seconds`` (or on shutdown). ``seen`` is the serving state the caller's view
        was verified at: a change after it is never missed. Typed errors propagate."""
        if self._closed:
            return None
        if self._count >= self.max_waiters:
            raise Unavailable(
                f"too many watchers are waiting (at most {self.max_waiters}); retry later",
                retry_after=RETRY_AFTER,
                max_waiters=self.max_waiters,
            )
        waiter = _Waiter(audience, etags)
        self._waiters.setdefault(audience, set()).add(waiter)
        self._count += 1
        self._counted(1)
        loop = asyncio.get_running_loop()
        if self._poller is None or self._poller.done():
            self._state = seen
            self._poller = loop.create_task(self._poll())
        elif self._state != seen:  # the poller saw another state than this view's
            task = loop.create_task(self._recheck(audience))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            with contextlib.suppress(TimeoutError):
                outcome = await asyncio.wait_for(asyncio.shield(waiter.done), seconds)
                if isinstance(outcome, LedgerError):
                    raise outcome
                return outcome
            return None
        finally:
            self._count -= 1
            self._counted(-1)
            group = self._waiters.get(audience)
            if group is not None:
                group.discard(waiter)
                if not group:
                    del self._waiters[audience]

    async def _poll(self) -> None:
        while self._waiters and not self._closed:
            await self._sleep(self.poll)
            if self._closed:
                break
            try:
                current = await anyio.to_thread.run_sync(self.reader.serving_state)
            except LedgerError:
                continue  # the store is away: keep waiting, the waits end on time
            self.state_reads += 1
            if current == self._state:
                continue
            self._state = current
            for audience in list(self._waiters):
                await self._recheck(audience)

    async def _recheck(self, audience: Audience) -> None:
        outcome: AudienceView | LedgerError
        try:
            outcome = await anyio.to_thread.run_sync(self.reader.view, audience)
        except LedgerError as exc:
            outcome = exc
        self.view_reads += 1
        for waiter in list(self._waiters.get(audience, ())):
            changed = isinstance(outcome, LedgerError) or not confirms(outcome, waiter.etags)
            if changed and not waiter.done.done():
                waiter.done.set_result(outcome)

    def close(self) -> None:
        """Answer every waiter now (as if its wait had ended) and stop polling."""
        self._closed = True
        for group in list(self._waiters.values()):
            for waiter in group:
                if not waiter.done.done():
                    waiter.done.set_result(None)
        if self._poller is not None:
            self._poller.cancel()
