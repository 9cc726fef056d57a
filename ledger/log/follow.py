"""Following the log: the ``eventsourcing`` subscription of ``LedgerRecorder.subscribe``.

Positions are gapless and commit-ordered on every engine, so following is polling for
the rows after the last one seen: no gap detection, no skipped commit.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from eventsourcing.persistence import ApplicationRecorder, Notification, Subscription

from ledger.log.db import translate_errors


class PollingSubscription(Subscription[ApplicationRecorder]):
    """Follows the log from a position by polling; gapless positions need no gap logic.

    ``stop()`` (also on leaving the ``with`` block) ends the iteration at once: the
    next ``next()`` raises ``StopIteration`` even if read-ahead items are buffered.
    """

    def __init__(
        self,
        recorder: ApplicationRecorder,
        gt: int | None = None,
        topics: Sequence[str] = (),
        *,
        poll_interval: float = 0.2,
        batch: int = 500,
    ) -> None:
        super().__init__(recorder=recorder, gt=gt, topics=topics)
        self._ledger = recorder
        self._poll_interval = poll_interval
        self._batch = batch
        self._buffer: list[Notification] = []
        self._index = 0
        self._stopped = threading.Event()

    def stop(self) -> None:
        super().stop()
        self._stopped.set()

    def __next__(self) -> Notification:
        # Stopped means stopped: nothing more is yielded, not even what was already
        # read into the buffer (the library's contract: one item after stop() during
        # iteration is the last one, and none after stop() before it).
        if self._stopped.is_set():
            self._buffer, self._index = [], 0
            raise StopIteration
        while self._index >= len(self._buffer):
            if self._stopped.is_set():
                raise StopIteration
            with translate_errors():
                batch = self._ledger.select_notifications(
                    start=self._last_notification_id or 0,
                    limit=self._batch,
                    topics=self._topics,
                    inclusive_of_start=False,
                )
            if batch:
                self._buffer = list(batch)
                self._index = 0
                self._last_notification_id = batch[-1].id
            else:
                self._stopped.wait(self._poll_interval)
        item = self._buffer[self._index]
        self._index += 1
        return item
