"""Revisions and the store read back from the log alone, for ``rollback`` (R28).

One replay of the catalog events (``CatalogReplay``: every revision rebuilt and its
content digest checked against the one its ``catalog.published`` event carries) is
stopped at the revisions asked for, to take what they served — every grant with the
exact bytes of its fact, the official packs active then — and the frozen source of
each generation comes from its ``generation.prepared`` event. No view is read: what a
rollback restores is what the log committed.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy.engine import Connection

from domain.errors import Missing
from domain.event_types import EVENT_TYPES, T_PREPARED, T_PUBLISHED, decode_state
from domain.rollback import ActivePack, FrozenSource, Grant, RevisionContent, StoreNow
from ledger.audit.history import catalog_events, feed
from ledger.audit.replay import CatalogReplay
from ledger.store.runtime import Ledger
from publisher.catalog import BindingRow
from publisher.equivalence import EquivalenceEntry, equivalence_digests

__all__ = ["read_revision", "rollback_inputs"]


class _StateReplay:
    """``CatalogReplay`` that also keeps every official generation's frozen source and
    takes a ``RevisionContent`` when one of the ``wanted`` revisions is published."""

    def __init__(self, wanted: Collection[int]) -> None:
        self.replay = CatalogReplay(keep=-1)  # no built catalog kept: taken here instead
        self.wanted = set(wanted)
        self.sources: dict[tuple[str, str], FrozenSource] = {}
        self.taken: dict[int, RevisionContent] = {}

    def feed(self, position: int, topic: str, data: dict[str, Any]) -> None:
        if topic == T_PREPARED and data["source"].get("kind") == "official_repo":
            source = data["source"]
            self.sources[(data["pack"], data["install_id"])] = FrozenSource(
                source["locator"], source["revision"], source["path"]
            )
        feed(self.replay, position, topic, data)
        if topic == T_PUBLISHED and data["revision"] in self.wanted:
            self.taken[data["revision"]] = self._take(data)

    def _packs(self) -> dict[str, ActivePack]:
        out = {}
        for pack, (_, install_id, revision, epoch, payload_hash) in sorted(
            self.replay.activations.items()
        ):
            source = self.sources.get((pack, install_id))
            out[pack] = ActivePack(pack, install_id, revision, epoch, payload_hash, source)
        return out

    def _take(self, data: dict[str, Any]) -> RevisionContent:
        """The revision just published (the replay checked its content digest): every
        grant with its fact's exact bytes, and the official packs active."""
        components = self.replay.components
        entries: list[EquivalenceEntry] = []
        for row in self.replay.bindings.values():
            fact = components[(row.pack, row.install_id)][(row.kind, row.key)].fact
            entries.append((*_grant_fields(row), fact))
        overall, audiences = equivalence_digests(entries)
        return RevisionContent(
            revision=data["revision"],
            content_digest=data["content_digest"],
            equivalence_digest=overall,
            audiences=audiences,
            packs=self._packs(),
            grants=_grants(self.replay.bindings.values()),
        )

    def now(self, revision: RevisionContent | None) -> StoreNow:
        """The store at the end of the replay: bindings recorded after the last
        revision's cut included."""
        bindings = dict(self.replay.bindings)
        for _, op, row in self.replay.pending:
            if op == "revoke":
                bindings.pop(row.ident, None)
            else:
                bindings[row.ident] = row
        local = frozenset(p for p, kind in self.replay.kinds.items() if kind == "local_path")
        return StoreNow(self._packs(), local, _grants(bindings.values()), revision)


def _grant_fields(row: BindingRow) -> tuple[str, str, str, str, str, str | None]:
    return (row.audience_kind, row.audience_id, row.pack, row.kind, row.key, row.credential_set)


def _grants(rows: Collection[BindingRow]) -> tuple[Grant, ...]:
    return tuple(sorted((Grant(*_grant_fields(r)) for r in rows), key=Grant.sort_key))


def _revisions(ledger: Ledger, conn: Connection, head: int) -> list[int]:
    """Every revision number the log published, in order (a scan of the revision events
    alone)."""
    out = []
    for position, topic, state in ledger.recorder.scan(
        conn, after=0, upto=head, topics=EVENT_TYPES.topics_of([T_PUBLISHED])
    ):
        out.append(int(decode_state(position, topic, state)[1]["revision"]))
    return out


def _replay(ledger: Ledger, wanted: Collection[int]) -> tuple[_StateReplay, int | None]:
    """Replay the whole log, taking ``wanted`` (MISSING for one never published) and
    the revision in force; returns the replay and that revision's number."""
    with ledger.db.read() as conn:
        head = ledger.recorder.head_in(conn).position
        published = _revisions(ledger, conn, head)
        for revision in wanted:
            if revision not in published:
                raise Missing(f"revision {revision} was never published", revision=revision)
        last = published[-1] if published else None
        state = _StateReplay({*wanted, *([last] if last is not None else [])})
        for position, name, data in catalog_events(ledger, conn, head):
            state.feed(position, name, data)
    return state, last


def rollback_inputs(ledger: Ledger, revision: int) -> tuple[RevisionContent, StoreNow]:
    """Revision ``revision`` as published, and the store now (with the revision in force),
    from one replay of the log."""
    state, last = _replay(ledger, [revision])
    current = state.taken[last] if last is not None else None
    return state.taken[revision], state.now(current)


def read_revision(ledger: Ledger, revision: int) -> RevisionContent:
    """Revision ``revision`` as published, replayed from the log."""
    state, _ = _replay(ledger, [revision])
    return state.taken[revision]
