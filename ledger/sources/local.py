"""A ``local_path`` pack whose file did not change since the log recorded it (R30).

A local pack is mutable, so every apply must look at its file; but it need not
parse it. The log's ``local_pack`` record (schema v2) holds ``file_digest``, the
SHA-256 of the raw ``pack.json`` it was made from. When the file's bytes hash to
that digest and the folder is the recorded one, parsing would give back exactly
the recorded content, so the pack is known from the log (``KnownLocal``) and its
decision is UNCHANGED. Anything else — another byte, another folder, a removed
record, a v1 row without a digest — answers None and the caller parses as before.

The prior digest comes from the log only (R28: no view or cache changes an
answer), and file times are never looked at: an mtime says nothing about bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from domain.classifier import PackState
from domain.lifecycle import SourceFacts
from domain.manifest import LocalSource, ManifestPack
from domain.matrix import Target
from ledger.sources.files import local_file_digest


@dataclass(frozen=True)
class KnownLocal:
    """A manifest ``local_path`` pack whose ``pack.json`` is byte for byte the one its
    live ``local_pack`` record was made from: known from the log without parsing.

    Usable where a ``ResolvedPack`` of an unchanged local pack is (``index``, ``name``,
    ``source``, ``payload_hash``, ``category``, ``target``); it has no ``content``."""

    index: int
    name: str
    source: SourceFacts
    payload_hash: str
    category: str
    file_digest: str

    @property
    def target(self) -> Target:
        return Target(category=self.category, source=self.source, payload_hash=self.payload_hash)


def known_local(
    index: int, pack: ManifestPack, source: LocalSource, base: Path, state: PackState
) -> KnownLocal | None:
    """The pack at manifest ``index`` as its log record knows it, when its raw file is
    unchanged (see the module docstring); None when the caller must parse it.

    ``state`` is the pack's state as read from the log. Reads the file (a missing
    folder or file is ``InvalidInput`` naming ``packs[index].source.path``, as when
    parsing) but never parses it."""
    facts, digest = local_file_digest(index, pack, source, base)
    local = state.local
    if (
        local is None
        or local.removed
        or state.pack != pack.name
        or local.file_digest is None
        or local.file_digest != digest
        or local.locator != facts.locator
        or local.path != facts.path
    ):
        return None
    return KnownLocal(
        index=index,
        name=local.pack,
        source=facts,
        payload_hash=local.payload_hash,
        category=local.category,
        file_digest=digest,
    )
