"""``import-legacy``: record legacy ``_System_InstalledPack`` rows once per pack (R7)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from domain.canonical import parse_json
from domain.coordination import CommandRecord
from domain.identity import PackName
from domain.manifest import parse_legacy_records
from domain.matrix import Command, ImportLegacy
from domain.records import LegacyRecord
from ledger.commands.lease import LeaseHandler
from ledger.commands.results import ImportLegacyResult
from ledger.commands.unit_of_work import UnitOfWork
from ledger.observability import bind, get_logger, logged_command
from ledger.sources.files import read_input_file
from ledger.store.runtime import Ledger

log = get_logger("import_legacy")


class ImportLegacyHandler:
    """The ``import-legacy`` command: one checked append through ``uow`` under ``lease``."""

    def __init__(self, ledger: Ledger, uow: UnitOfWork, lease: LeaseHandler) -> None:
        self.ledger = ledger
        self.uow = uow
        self.lease = lease

    @logged_command(log, "import-legacy", lambda r: {"imported": len(r["imported"])})
    def import_legacy(self, path: Path, *, command_id: str | None = None) -> ImportLegacyResult:
        """Record legacy ``_System_InstalledPack`` rows once per pack (DESIGN "Inputs")."""
        data = read_input_file(path, field="file")
        records = parse_legacy_records(parse_json(data, source=str(path)), file=str(path))
        request = {"kind": "import-legacy", "records": records}
        request_digest = self.uow.request_digest(request)
        with self.ledger.snapshot() as reader:
            cid = self.uow.command_id(command_id, "import-legacy", request_digest, reader)
            bind(command_id=cid)
            prior = self.uow.recorded(reader, cid, "import-legacy", request_digest)
            if prior is not None:
                return cast(ImportLegacyResult, {**prior, "replayed": True})
            states = {
                PackName.trusted(r["pack"]): reader.pack_state(PackName.trusted(r["pack"]))
                for r in records
            }
        commands: dict[PackName, Command] = {
            PackName.trusted(r["pack"]): ImportLegacy(r) for r in records
        }
        self.uow.check(commands, states)
        new = [r for r in records if states[PackName.trusted(r["pack"])].legacy is None]
        result: ImportLegacyResult = {
            "command_id": cid,
            "noop": not new,
            "replayed": False,
            "imported": [r["pack"] for r in new],
            "unchanged": [r["pack"] for r in records if r not in new],
        }
        if not new:
            return result
        record = CommandRecord(
            command_id=cid, kind="import-legacy", request_digest=request_digest, result=dict(result)
        )
        new_commands = {
            PackName.trusted(r["pack"]): commands[PackName.trusted(r["pack"])] for r in new
        }
        with self.lease.leased() as handle:
            self.uow.checked_append(
                handle,
                new_commands,
                lambda _states: [LegacyRecord(**r) for r in new],
                extra=[record],
            )
        return result
