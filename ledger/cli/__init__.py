"""The ``catalog-ledger`` command line: one module per command group, one ``main``.

``app`` holds the group, the conventions (``--json``, exit codes, errors) and
``run``/``main``; importing this package registers every command group.
"""

from __future__ import annotations

from ledger.cli import (
    audit,
    backup,
    credentials,
    diff,
    lease,
    projections,
    read,
    rollback,
    store,
    witness,
    write,
)
from ledger.cli.app import cli, dump_json, main, run

__all__ = [
    "audit",
    "backup",
    "cli",
    "credentials",
    "diff",
    "dump_json",
    "lease",
    "main",
    "projections",
    "read",
    "rollback",
    "run",
    "store",
    "witness",
    "write",
]
