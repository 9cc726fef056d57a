"""One writer of the R30 Galera release campaign, run as a child process.

    python -m tests.support.release_worker CONFIG.json

CONFIG names the writer's node (``url``), its one-pack release manifests in order
(``manifests``), a command id prefix, the ``wait`` and ``lease_ttl`` of its applies
and the JSON-lines file to write. The writer applies each manifest once, through
the Python API, with a command id of its own. A lost race is re-read and decided
again inside ``apply`` itself (``ledger.commands.apply.lost_race``, within the
``wait`` budget); the worker counts those rounds from the apply logger's phase
records, which every round writes:

- ``attempts``: ``preflight`` phases (one per decision; 1 when nothing was lost);
- ``lost``: ``recover``, ``prepare`` or ``final_append`` phases that failed (a lost
  race for the log, e.g. a Galera certification failure, then decided again);
- ``busy``: ``lease`` phases that failed (the writer lease was held, or its
  taking lost to another writer's, then waited for);
- ``phases``: seconds per phase name, summed over the rounds (where a release's
  time goes).

A CONFLICT that escapes ``apply`` (its budget spent) is retried once more with the
same command id (R10: an exact retry returns the recorded result, or runs the
release if it never committed), counted as ``outer``. One JSON line per release.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from domain.errors import LedgerError
from ledger.api import Store, open_store

#: How many times a release whose CONFLICT escaped apply's own budget is tried again.
OUTER_RETRIES = 3
_LOST_PHASES = {"recover", "prepare", "final_append"}


class PhaseCounter(logging.Handler):
    """Counts the apply logger's phase records of the command in progress."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.reset()

    def reset(self) -> None:
        self.attempts = self.lost = self.busy = 0
        #: Seconds per phase name, summed over the command's rounds.
        self.seconds: dict[str, float] = {}
        #: ``phase:ERROR`` of every phase that failed (a lost race, a busy lease).
        self.failures: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        name = getattr(record, "phase", None)
        if record.getMessage() != "phase" or name is None:
            return
        failed = getattr(record, "outcome", None) == "error"
        took = float(getattr(record, "duration_ms", 0.0)) / 1000
        self.seconds[name] = round(self.seconds.get(name, 0.0) + took, 3)
        if failed:
            self.failures.append(f"{name}:{getattr(record, 'error', '?')}")
        if name == "preflight":
            self.attempts += 1
        elif failed and name in _LOST_PHASES:
            self.lost += 1
        elif failed and name == "lease":
            self.busy += 1


def release(store: Store, manifest: str, cid: str, config: dict[str, Any]) -> dict[str, Any]:
    """Apply one manifest (retrying an escaped CONFLICT with the same command id)."""
    outer = 0
    while True:
        try:
            result = store.apply(
                manifest, command_id=cid, wait=config["wait"], lease_ttl=config["lease_ttl"]
            )
            return {"code": 0, "result": result, "outer": outer}
        except LedgerError as exc:
            if exc.code != "CONFLICT" or outer >= OUTER_RETRIES:
                return {
                    "code": exc.code,
                    "message": exc.message[:400],
                    "details": exc.details,
                    "outer": outer,
                }
            outer += 1


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    counter = PhaseCounter()
    logger = logging.getLogger("catalog_ledger.apply")
    logger.setLevel(logging.INFO)
    logger.addHandler(counter)
    logger.propagate = False
    with open_store(config["url"]) as store, Path(config["out"]).open("w") as out:
        for k, manifest in enumerate(config["manifests"]):
            counter.reset()
            start = time.time()
            outcome = release(store, manifest, f"{config['prefix']}-{k + 1}", config)
            outcome.update(
                manifest=manifest,
                url=config["url"],
                start=start,
                end=time.time(),
                attempts=counter.attempts,
                lost=counter.lost,
                busy=counter.busy,
                phases=counter.seconds,
                failures=counter.failures,
            )
            out.write(json.dumps(outcome, default=str) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
