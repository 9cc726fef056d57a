"""A revision's content cut into fragments, and the next revision built from them (pure).

The content digest (R17) covers the whole revision: every activation, fact and grant
in canonical order. Those sections are ordered by pack (activations, facts) and by
audience (grants), so the content is the concatenation, in key order, of one small
piece per pack and per audience: a *fragment*, ``(entries, body)`` with ``body`` the
canonical JSON of its entries, comma-separated (what the digest hashes between the
section's brackets).

The store keeps the fragments of the revision in force (``ledger.store.kept_fragments``).
A publication that changes a few audiences then digests the whole revision from them,
re-encoding only the fragments of the audiences it validated and of the packs those
audiences bind or bound, instead of re-reading every binding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from publisher.catalog import (
    Audience,
    BindingRow,
    BuiltCatalog,
    ContentDigest,
    PackAuthority,
    digest_of,
)

#: A fragment's key: a pack (``(pack, b"")``) or an audience (``(kind, id)``), as stored
#: bytes, so that key order is the canonical (bytewise) order.
Unit = tuple[bytes, bytes]
#: A fragment: how many entries, and their canonical JSON, comma-separated.
Fragment = tuple[int, bytes]

ACTIVATIONS, FACTS, GRANTS = 0, 1, 2


@dataclass
class Fragments:
    """The content of one revision, by section (activations, facts, grants) and unit."""

    revision: int
    content_digest: str
    sections: tuple[dict[Unit, Fragment], dict[Unit, Fragment], dict[Unit, Fragment]] = field(
        default_factory=lambda: ({}, {}, {})
    )

    def digest(self) -> str:
        """The content digest of these fragments (the revision's, when they are whole)."""
        content = ContentDigest()
        for index, section in enumerate(self.sections):
            if index:
                content.next_section()
            pieces = [section[unit] for unit in sorted(section)]
            content.add_encoded(
                b",".join(body for count, body in pieces if count),
                sum(count for count, _ in pieces),
            )
        return content.hexdigest()

    def counts(self) -> dict[str, int]:
        activations, facts, grants = self.sections
        return {
            "audiences": len(grants),
            "activations": len(activations),
            "facts": sum(count for count, _ in facts.values()),
            "grants": sum(count for count, _ in grants.values()),
        }

    def packs(self) -> set[str]:
        return {unit[0].decode() for unit in self.sections[ACTIVATIONS]}

    def audiences(self) -> set[Audience]:
        return {(kind.decode(), ident.decode()) for kind, ident in self.sections[GRANTS]}

    def entries(self, section: int, unit: Unit) -> list[list[Any]]:
        """The entries of one fragment (``[]`` when there is none)."""
        found = self.sections[section].get(unit)
        if found is None:
            return []
        entries: list[list[Any]] = orjson.loads(b"[" + found[1] + b"]")
        return entries


def pack_unit(pack: str) -> Unit:
    return (pack.encode(), b"")


def audience_unit(audience: Audience) -> Unit:
    return (audience[0].encode(), audience[1].encode())


def encoded(entries: Sequence[list[Any]]) -> Fragment:
    return len(entries), orjson.dumps(list(entries))[1:-1]


def fragments_of(built: BuiltCatalog, revision: int) -> Fragments:
    """A whole revision built with its rows (``build_catalog(keep_rows=True)``) cut
    into fragments, to be kept for the next publication."""
    out = Fragments(revision, built.content_digest)
    activations, facts, grants = out.sections
    for entry in built.activations:
        activations[pack_unit(entry[0])] = encoded([entry])
    for unit, entries in _runs(built.facts, lambda e: pack_unit(e[0])).items():
        facts[unit] = encoded(entries)
    for unit, entries in _runs(built.grants, lambda g: audience_unit((g[0], g[1]))).items():
        grants[unit] = encoded(entries)
    return out


def _runs(
    entries: Sequence[list[Any]], unit_of: Callable[[list[Any]], Unit]
) -> dict[Unit, list[list[Any]]]:
    """``entries`` (in content order) grouped by unit, each group in that order."""
    out: dict[Unit, list[list[Any]]] = {}
    for entry in entries:
        out.setdefault(unit_of(entry), []).append(entry)
    return out


@dataclass(frozen=True)
class NextRevision:
    """The next revision's fragments and what changed against the parent's."""

    fragments: Fragments
    #: Digests of the audiences re-validated (absent: the audience has no binding now).
    audience_digests: dict[Audience, str]
    #: The activation entries of the packs re-encoded that are still bound.
    activations: list[list[Any]]
    #: The units written anew (body) or dropped (``None``), per section.
    changes: tuple[dict[Unit, Fragment | None], ...]


def next_revision(
    parent: Fragments,
    bindings: Iterable[BindingRow],
    affected: Iterable[Audience],
    bound: Mapping[str, Sequence[tuple[str, str, str]]],
    packs: Mapping[str, PackAuthority],
) -> NextRevision:
    """The fragments of the revision after ``parent`` once the ``affected`` audiences have
    ``bindings`` (all theirs, already validated) and each pack of ``bound`` has those
    distinct ``(install_id, kind, key)`` bound by any audience (empty: no longer bound).

    Every other fragment is the parent's: an audience outside ``affected`` has the
    bindings and pack authorities the parent validated and digested, and a pack outside
    ``bound`` is bound, by the same audiences, to the same components of the same
    generation. ``packs`` holds the authority, with components, of every pack in
    ``bound``.
    """
    sections = tuple(dict(s) for s in parent.sections)
    changes: tuple[dict[Unit, Fragment | None], ...] = ({}, {}, {})
    by_audience: dict[Audience, list[BindingRow]] = {a: [] for a in affected}
    for b in bindings:
        by_audience[b.audience].append(b)
    digests: dict[Audience, str] = {}
    for audience, rows in by_audience.items():
        unit = audience_unit(audience)
        if not rows:
            sections[GRANTS].pop(unit, None)
            changes[GRANTS][unit] = None
            continue
        rows.sort(key=lambda x: x.ident)
        digests[audience] = digest_of(audience, rows, packs)
        sections[GRANTS][unit] = changes[GRANTS][unit] = encoded([b.grant() for b in rows])
    activations: list[list[Any]] = []
    for pack, components in sorted(bound.items()):
        unit = pack_unit(pack)
        if not components:
            for section in (ACTIVATIONS, FACTS):
                sections[section].pop(unit, None)
                changes[section][unit] = None
            continue
        authority = packs[pack]
        entry = authority.entry()
        activations.append(entry)
        facts = [
            [pack, install_id, kind, key, authority.components[(kind, key)].fact_digest.hex()]
            for install_id, kind, key in sorted(set(components))
        ]
        sections[ACTIVATIONS][unit] = changes[ACTIVATIONS][unit] = encoded([entry])
        sections[FACTS][unit] = changes[FACTS][unit] = encoded(facts)
    fragments = Fragments(parent.revision + 1, "", (sections[0], sections[1], sections[2]))
    fragments.content_digest = fragments.digest()
    return NextRevision(fragments, digests, activations, changes)
