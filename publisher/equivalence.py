"""The payload-equivalence digest: what a revision serves, by content only (pure).

A revision's content digest (R17) binds exact install ids and epochs, so two revisions
serving the same facts and grants from different generations — a rollback's revision
and the one it restores (R7: a restored pack is a fresh generation) — never share it.
This digest leaves those out: one entry per grant,

    [audience_kind, audience_id, pack, kind, key, credential_set, fact]

with ``fact`` the granted component exactly as the revision serves it (its canonical
JSON object: ``kind``, ``key``, ``payload``, ``requires``, ``credential_sets``), the
entries in bytewise order of their first six fields (a missing credential set sorts as
""), digested as the canonical JSON array of the entries:

    BLAKE3-derive-key("catalog-ledger 2026-12 payload equivalence v1", canonical JSON)

(schema/LOG-FORMAT.md, "Payload-equivalence digest"). Two revisions whose every
audience is served the same facts under the same grants have the same digest, whatever
their install ids, epochs, payload hashes and revision numbers.
"""

from __future__ import annotations

from collections.abc import Iterable

from domain.canonical import canonical_bytes_trusted
from domain.digests import Purpose, hasher

__all__ = ["EquivalenceEntry", "equivalence_digest", "equivalence_digests"]

#: ``(audience_kind, audience_id, pack, kind, key, credential_set, fact canonical bytes)``.
EquivalenceEntry = tuple[str, str, str, str, str, str | None, bytes]


def _sort_key(entry: EquivalenceEntry) -> tuple[str, str, str, str, str, str]:
    return (*entry[:5], entry[5] or "")


def equivalence_digest(entries: Iterable[EquivalenceEntry]) -> str:
    """The payload-equivalence digest (hex) of a revision's (or one audience's) grants.

    The canonical array is streamed: each entry's first six fields are encoded by the
    canonical encoder and the fact's canonical bytes (already canonical: they are what
    the revision serves) are spliced in as the seventh element."""
    h = hasher(Purpose.PAYLOAD_EQUIVALENCE)
    h.update(b"[")
    for n, entry in enumerate(sorted(entries, key=_sort_key)):
        head = canonical_bytes_trusted(list(entry[:6]))  # b'["app","x",…,null]'
        h.update(b"," if n else b"")
        h.update(head[:-1])
        h.update(b",")
        h.update(entry[6])
        h.update(b"]")
    h.update(b"]")
    return str(h.hexdigest())


def equivalence_digests(
    entries: Iterable[EquivalenceEntry],
) -> tuple[str, dict[tuple[str, str], str]]:
    """The revision's digest and each audience's (the same rule over its own entries)."""
    listed = list(entries)
    by_audience: dict[tuple[str, str], list[EquivalenceEntry]] = {}
    for entry in listed:
        by_audience.setdefault((entry[0], entry[1]), []).append(entry)
    return equivalence_digest(listed), {
        audience: equivalence_digest(rows) for audience, rows in by_audience.items()
    }
