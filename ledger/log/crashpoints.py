"""Crash-test instrumentation: SIGKILL this process at the Nth crash point.

Reliability campaigns run a release in a child process with
``CATALOG_LEDGER_CRASH_AT=N`` and kill it at the Nth point the store passes —
at every append boundary and inside every append transaction. With
``CATALOG_LEDGER_CRASH_COUNT=PATH`` the process writes how many points it
passed when it exits, so a sweep knows how many kill points exist. Unset (the
normal case), a crash point is one global boolean test.
"""

from __future__ import annotations

import atexit
import os
import signal
from pathlib import Path

_TARGET = int(os.environ.get("CATALOG_LEDGER_CRASH_AT", "0") or 0)
_COUNT_FILE = os.environ.get("CATALOG_LEDGER_CRASH_COUNT")
ENABLED = bool(_TARGET or _COUNT_FILE)
_passed = [0]


def crashpoint(name: str) -> None:
    """Count this point; kill the process with SIGKILL if it is the chosen one."""
    if not ENABLED:
        return
    _passed[0] += 1
    if _passed[0] == _TARGET:
        os.kill(os.getpid(), signal.SIGKILL)


def _write_count() -> None:
    if _COUNT_FILE:
        Path(_COUNT_FILE).write_text(str(_passed[0]), encoding="utf-8")


atexit.register(_write_count)
