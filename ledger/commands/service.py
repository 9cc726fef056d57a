"""The command service: every mutation of the store goes through here (R7-R12).

Each command follows one pattern:

1. read the state of every pack it touches in one consistent snapshot;
2. run the preflight half of the matrix (``domain.lifecycle.rejection``) on all
   of them and reject, naming every pack and reason, before any append;
3. build the events on the aggregates just read;
4. append them in one transaction, fenced by the versions read and by the
   writer lease, with the terminal half of the same matrix re-run on the
   locked current state inside that transaction (R11).

Multi-step work (``apply``) holds the exclusive writer lease; the next lease
holder first turns every abandoned ``preparing`` attempt into
``failed_dirty`` (R12). Exact retries are read-only (R10).
"""

from __future__ import annotations

from ledger.commands.apply import ApplyCommand
from ledger.commands.core import WRITER_LEASE, LeaseHandle
from ledger.commands.credentials import CredentialCommands
from ledger.commands.import_legacy import ImportLegacyCommand

__all__ = ["WRITER_LEASE", "CommandService", "LeaseHandle"]


class CommandService(ApplyCommand, ImportLegacyCommand, CredentialCommands):
    """Every command over one ``Ledger``: apply, publish, import-legacy, the lease steps,
    audience credentials."""
