"""Resolving a manifest's packs from their sources (R5): git at an exact commit
(``ledger.sources.git``), or a directory (``ledger.sources.files``).

Every failure is an ``InvalidInput`` naming the manifest field (``packs[i]…``)
or the file and field inside ``pack.json``; nothing is written.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from domain.canonical import parse_json
from domain.content import PackContent
from domain.lifecycle import SourceFacts
from domain.manifest import Manifest, ManifestPack, OfficialSource, parse_manifest
from domain.matrix import Target
from ledger.sources.files import read_input_file, read_local
from ledger.sources.git import read_official, repo_path


@dataclass(frozen=True)
class ResolvedPack:
    """A manifest pack with its source facts and validated content."""

    index: int
    source: SourceFacts
    content: PackContent
    #: A ``local_path`` pack's raw ``pack.json`` SHA-256 hex, as read (R30); None for
    #: official packs.
    file_digest: str | None = None

    @property
    def name(self) -> str:
        return self.content.name

    @property
    def payload_hash(self) -> str:
        return self.content.payload_hash_v1

    @property
    def category(self) -> str:
        return self.content.category

    @property
    def target(self) -> Target:
        return Target(
            category=self.content.category,
            source=self.source,
            payload_hash=self.content.payload_hash_v1,
            payload_hash_v0=self.content.payload_hash_v0,
        )


def load_manifest(path: Path) -> Manifest:
    data = read_input_file(path, field="manifest")
    return parse_manifest(parse_json(data, source=str(path)), file=str(path))


def resolve_manifest(path: Path) -> tuple[Manifest, list[ResolvedPack]]:
    """Parse the manifest and resolve every pack; all failures before any write."""
    manifest = load_manifest(path)
    return manifest, resolve_packs(manifest.packs, base=path.resolve().parent)


def resolve_packs(
    packs: Sequence[ManifestPack], *, base: Path, skip: Collection[int] = ()
) -> list[ResolvedPack]:
    """Resolve the packs of a manifest, in its order, but those at indices in ``skip``
    (``ResolvedPack.index`` and error paths keep the manifest's indices)."""
    by_repo: dict[Path, list[tuple[int, ManifestPack, OfficialSource]]] = {}
    resolved: dict[int, ResolvedPack] = {}
    for index, pack in enumerate(packs):
        if index in skip:
            continue
        if isinstance(pack.source, OfficialSource):
            repo = repo_path(pack.source.repo, base, index)
            by_repo.setdefault(repo, []).append((index, pack, pack.source))
        else:
            resolved[index] = ResolvedPack(index, *read_local(index, pack, pack.source, base))
    for repo, items in by_repo.items():
        for index, (source, content) in read_official(repo, items).items():
            resolved[index] = ResolvedPack(index, source, content)
    return [resolved[i] for i in range(len(packs)) if i not in skip]
