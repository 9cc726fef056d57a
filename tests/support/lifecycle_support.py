"""A small world for lifecycle tests: a real store, a real git repo, real manifests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from domain.classifier import PackState
from domain.event_types import EVENT_TYPES
from domain.identity import PackName
from domain.manifest import LocalSource, ManifestPack, OfficialSource
from ledger.commands.results import ApplyResult
from ledger.commands.service import CommandService
from ledger.log.db import Database, open_database
from ledger.sources.resolve import ResolvedPack, resolve_packs
from ledger.store.init import init_store
from ledger.store.runtime import Ledger
from tests.support.gitrepo import Repo, manifest, official, push_pack
from tests.support.stores import INITIALIZED


def content(name: str, version: int, category: str = "app", **extra: Any) -> bytes:
    """Pack content whose payload changes with ``version``."""
    return push_pack(name, version, category, **extra)


class World:
    """One store + one git repository + helpers to drive the command service."""

    def __init__(self, tmp: Path, url: str, **service_options: Any) -> None:
        self.tmp = tmp
        self.url = url
        self.db: Database = open_database(url)
        if url not in INITIALIZED:  # else a copy of a template store (tests/support/stores.py)
            init_store(self.db)
        self.ledger = Ledger(self.db)
        options = {"lease_wait": 10.0, **service_options}
        self.service = CommandService(self.ledger, **options)
        self.repo = Repo(tmp / "repo")
        self._manifests = 0

    def close(self) -> None:
        self.db.close()

    # -- content ------------------------------------------------------------------------

    def release(self, files: dict[str, bytes]) -> str:
        """Commit whole pack files (``{"<pack>/pack.json": bytes}``); return the commit."""
        return self.repo.commit(files)

    def commit(self, pack: str, version: int, category: str = "app") -> str:
        return self.release({f"{pack}/pack.json": content(pack, version, category)})

    def local_dir(self, pack: str, version: int, category: str = "app") -> Path:
        folder = self.tmp / "local" / pack
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "pack.json").write_bytes(content(pack, version, category))
        return folder

    def resolved(self, pack: str, commit: str) -> ResolvedPack:
        source = OfficialSource(str(self.repo.path), commit, f"{pack}/pack.json")  # type: ignore[arg-type]
        (out,) = resolve_packs([ManifestPack(PackName(pack), source)], base=self.tmp)
        return out

    def resolved_local(self, pack: str, folder: Path) -> ResolvedPack:
        (out,) = resolve_packs(
            [ManifestPack(PackName(pack), LocalSource(str(folder)))], base=self.tmp
        )
        return out

    # -- manifests ----------------------------------------------------------------------

    def manifest(
        self, packs: list[dict[str, Any]], bindings: list[dict[str, Any]] | None = None
    ) -> Path:
        self._manifests += 1
        return manifest(self.tmp / f"release-{self._manifests}.json", packs, bindings)

    def official(self, pack: str, commit: str) -> dict[str, Any]:
        return official(pack, self.repo.path, commit, f"{pack}/pack.json")

    def apply(self, *packs: dict[str, Any], **kwargs: Any) -> ApplyResult:
        return self.service.apply(self.manifest(list(packs)), **kwargs)

    def legacy_file(self, records: list[dict[str, Any]]) -> Path:
        self._manifests += 1
        path = self.tmp / f"legacy-{self._manifests}.json"
        path.write_text(json.dumps(records), encoding="utf-8")
        return path

    # -- observation --------------------------------------------------------------------

    def head(self) -> int:
        return self.ledger.recorder.head().position

    def tables(self) -> dict[str, list[str]]:
        """Every row of every table but the Merkle cache (derived; filled by reads):
        "nothing was written" means all of this is unchanged."""
        import sqlalchemy as sa

        out: dict[str, list[str]] = {}
        with self.db.read() as conn:
            for name in sorted(sa.inspect(conn).get_table_names()):
                if name != "ledger_merkle":
                    rows = conn.execute(sa.text(f"SELECT * FROM {name}")).fetchall()
                    out[name] = sorted(repr(tuple(r)) for r in rows)
        return out

    def state(self, pack: str) -> PackState:
        with self.ledger.snapshot() as reader:
            return reader.pack_state(PackName(pack))

    def topics(self) -> list[str]:
        """The type name of every event in the log, in order."""
        return [
            EVENT_TYPES.resolve(row.topic).type.name for row in self.ledger.recorder.iter_rows()
        ]


def new_service(world: World, **options: Any) -> CommandService:
    """Another writer on the same store (as a second process would be)."""
    return CommandService(Ledger(open_database(world.url)), **options)
