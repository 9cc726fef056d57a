"""What publication and ``apply`` decide on, anchored in the log (R28).

A view is a cache of the log. The command side decides only on:

* **the revision in force**: the last event of the catalog lineage (one seek on the
  ``(aggregate_id, version)`` index), never the catalog view's head row;
* **its content**: the kept fragments (``ledger.store.kept_fragments``) or, when none are
  kept, the catalog views' rows in force, accepted only when they digest to the
  content digest and counts that revision event committed (anything else fails closed
  with INTEGRITY naming the catalog view tables);
* **what happened since**: the binding and lifecycle events after the revision's cut,
  read from the log itself (O(events since));
* **each pack's authority**: its aggregates' events (``Repository.pack_states``,
  classified by the one classifier, R13) or, for a pack the parent binds and that has
  no lifecycle event since, the parent's activation entry with the components of that
  generation's own ``generation.prepared`` event.

No binding, activation, generation or component view row is read here: the catalog
views' rows in force and the audience map's nodes come from the read model
(``projections.queries.publication``) and are checked against the log before use.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy.engine import Connection

from domain.audience_map import (
    key_of,
    root_of,
    update,
)
from domain.catalog import catalog_id
from domain.classifier import (
    ACTIVATED,
    LEGACY,
    NEVER_ACTIVATED,
    Condition,
    PackState,
    classify,
)
from domain.errors import IntegrityFailure
from domain.event_types import (
    BINDING_TYPES,
    LIFECYCLE_TYPES,
    T_PREPARED,
    T_PUBLISHED,
    T_REVOKED,
    Decoded,
)
from domain.identity import PackName
from domain.lifecycle import generation_id
from domain.served import audience_digest
from ledger.log.recorder import LedgerRecorder
from ledger.observability import get_logger
from ledger.store import kept_fragments
from ledger.store.runtime import Repository
from projections import checks
from projections.queries.publication import BadNode, map_fetch, open_catalog_rows
from projections.views.catalog import CATALOG_ACTIVATION, CATALOG_GRANT
from publisher.catalog import (
    Audience,
    BindingRow,
    PackAuthority,
    component_facts,
)
from publisher.fragments import (
    ACTIVATIONS,
    FACTS,
    GRANTS,
    Fragments,
    audience_unit,
    encoded,
    pack_unit,
)

log = get_logger("publish")


def _integrity(event: Decoded, problem: str) -> IntegrityFailure:
    return IntegrityFailure(
        f"the log row at position {event.position} ({event.type}) is not what its type "
        f"declares: {problem}",
        position=event.position,
        topic=event.type,
    )


def _field(event: Decoded, name: str, kind: type, *, optional: bool = False) -> Any:
    """Field ``name`` of ``event``, of exactly type ``kind`` (``None`` if ``optional``)."""
    value = event.data.get(name)
    if value is None and optional:
        return None
    if type(value) is not kind:
        raise _integrity(event, f"{name} is not {'an integer' if kind is int else 'a string'}")
    return value


def _int(event: Decoded, name: str, *, optional: bool = False) -> Any:
    return _field(event, name, int, optional=optional)


def _text(event: Decoded, name: str, *, optional: bool = False) -> Any:
    return _field(event, name, str, optional=optional)


@dataclass(frozen=True)
class LogHead:
    """The revision in force as the log committed it (its ``catalog.published`` event)."""

    revision: int
    content_digest: str
    counts: dict[str, int]
    #: The revision event's log position.
    position: int
    #: Binding events up to this position are in the revision; later ones are pending.
    cut: int
    #: The audience map's root (``None``: a revision of format v1, before the map).
    audiences_root: str | None

    @classmethod
    def of(cls, event: Decoded) -> LogHead:
        counts = event.data.get("counts")
        if not isinstance(counts, dict) or any(
            type(counts.get(k)) is not int for k in ("audiences", "activations", "facts", "grants")
        ):
            raise _integrity(event, "counts is not four integers")
        cut = _int(event, "bindings_position", optional=True)
        return cls(
            revision=_int(event, "revision"),
            content_digest=_text(event, "content_digest"),
            counts={k: counts[k] for k in ("audiences", "activations", "facts", "grants")},
            position=event.position,
            cut=event.position - 1 if cut is None else cut,
            audiences_root=_text(event, "audiences_root", optional=True),
        )


def log_head(recorder: LedgerRecorder, conn: Connection) -> LogHead | None:
    """The revision in force from the last event of the catalog lineage (``None``: none
    was published yet)."""
    last = recorder.last_events(conn, [catalog_id()]).get(catalog_id())
    if last is None or last.type != T_PUBLISHED:
        return None
    return LogHead.of(last)


@dataclass(frozen=True)
class Change:
    """A binding event after the parent's cut."""

    position: int
    op: str  # "grant" (granted or rebound) or "revoke"
    row: BindingRow


def pending_changes(recorder: LedgerRecorder, conn: Connection, cut: int) -> list[Change]:
    """Every binding event after ``cut``, in log order (the log's own pending changes)."""
    out: list[Change] = []
    for event in recorder.decoded_after(conn, after=cut, topics=BINDING_TYPES):
        d = event.data
        try:
            row = BindingRow(
                d["audience_kind"],
                d["audience_id"],
                d["pack"],
                d["kind"],
                d["key"],
                d["credential_set"],
                d["install_id"] or "",
                d.get("payload_hash") or "",
            )
            if not all(isinstance(v, str) for v in (*row.ident[:5], row.install_id)):
                raise TypeError("an identity is not a string")
        except (KeyError, TypeError) as exc:
            raise _integrity(event, str(exc)) from None
        out.append(Change(event.position, "revoke" if event.type == T_REVOKED else "grant", row))
    return out


def moved_packs(recorder: LedgerRecorder, conn: Connection, after: int) -> set[str]:
    """The packs with any lifecycle event after ``after``: their authority is re-read."""
    out: set[str] = set()
    for event in recorder.decoded_after(conn, after=after, topics=LIFECYCLE_TYPES):
        out.add(_text(event, "pack"))
    return out


def apply_changes(
    bindings: dict[tuple[str, ...], BindingRow], changes: Iterable[Change]
) -> dict[tuple[str, ...], BindingRow]:
    """``bindings`` (by ident) after ``changes`` in log order (in place; returned)."""
    for change in changes:
        if change.op == "revoke":
            bindings.pop(change.row.ident, None)
        else:
            bindings[change.row.ident] = change.row
    return bindings


# -- the parent revision's content, verified against the log ---------------------------------


def parent_fragments(conn: Connection, head: LogHead | None) -> tuple[Fragments, bool]:
    """The content of the revision in force as fragments, verified against ``head``, and
    whether they are the kept ones (else a publication keeps all of its own anew).

    The kept fragments when they digest to what the log committed; otherwise the
    catalog views' rows in force, checked the same way: rows that do not digest to the
    revision's content digest and counts are INTEGRITY naming the tables (R28). An
    empty content when nothing was published yet."""
    if head is None:
        return Fragments(0, ""), False
    kept = kept_fragments.read(conn, head.revision, head.content_digest, head.counts)
    if kept is not None:
        return kept, True
    built = fragments_from_views(conn, head.revision)
    if checks.on(checks.PARENT) and (
        built.counts() != head.counts or built.digest() != head.content_digest
    ):
        raise IntegrityFailure(
            f"the catalog views' rows in force do not match revision {head.revision} as the "
            "log committed it (its content digest and counts): a view row was edited, lost "
            "or added; `catalog-ledger projections verify catalog` names the first differing "
            "row, and `projections rebuild catalog` restores the view from the log",
            rule="R28",
            revision=head.revision,
            tables=[CATALOG_ACTIVATION.physical.name, CATALOG_GRANT.physical.name],
        )
    built.content_digest = head.content_digest
    return built, False


def fragments_from_views(conn: Connection, revision: int) -> Fragments:
    """The revision in force cut into fragments, from the catalog views' open rows (and
    the bound components' fact digests). Not trusted: the caller checks the digest."""
    rows = open_catalog_rows(conn)
    out = Fragments(revision, "")
    activations, facts, grants = out.sections
    for pack, entry in rows.activations.items():
        activations[(pack, b"")] = encoded([entry])
    for pack, entries in rows.facts.items():
        facts[(pack, b"")] = encoded(entries)
    for unit, entries in rows.grants.items():
        grants[unit] = encoded(entries)
    return out


@dataclass
class ParentContent:
    """The verified parent content, parsed on demand: activation entries, fact digests,
    each audience's grants (as bindings) and digest, and who binds a pack."""

    fragments: Fragments
    #: Whether these are the kept fragments (else the next revision keeps all its own).
    kept: bool = False
    _blob: bytes | None = field(default=None, repr=False)
    _offsets: list[int] = field(default_factory=list, repr=False)
    _units: list[tuple[bytes, bytes]] = field(default_factory=list, repr=False)
    _bindings: dict[tuple[str, ...], BindingRow] | None = field(default=None, repr=False)

    def packs(self) -> set[str]:
        return self.fragments.packs()

    def audiences(self) -> set[Audience]:
        return self.fragments.audiences()

    def entry(self, pack: str) -> list[Any] | None:
        entries = self.fragments.entries(ACTIVATIONS, pack_unit(pack))
        return entries[0] if entries else None

    def facts_of(self, pack: str) -> dict[tuple[str, str, str], str]:
        """``(install_id, kind, key) -> fact digest hex`` of the pack's bound facts."""
        return {(e[1], e[2], e[3]): e[4] for e in self.fragments.entries(FACTS, pack_unit(pack))}

    def grants_of(self, audience: Audience) -> list[list[Any]]:
        return self.fragments.entries(GRANTS, audience_unit(audience))

    def bindings_of(self, audience: Audience) -> list[BindingRow]:
        """The audience's bindings at the parent's cut (its grants, with the payload hash
        of the generation each names: the pack's bound one, which the parent validated)."""
        out = []
        hashes: dict[str, str] = {}
        for g in self.grants_of(audience):
            pack = g[2]
            if pack not in hashes:
                entry = self.entry(pack)
                hashes[pack] = entry[4] if entry else ""
            out.append(BindingRow(g[0], g[1], pack, g[3], g[4], g[5], g[6], hashes[pack]))
        return out

    def all_bindings(self) -> dict[tuple[str, ...], BindingRow]:
        """Every audience's bindings at the parent's cut, by ident (a fresh dict each
        call; parsed once)."""
        if self._bindings is None:
            self._bindings = {
                (r.audience_kind, r.audience_id, r.pack, r.kind, r.key, r.credential_set or ""): r
                for a in sorted(self.audiences())
                for r in self.bindings_of(a)
            }  # the key is ``BindingRow.ident``, built inline
        return dict(self._bindings)

    def digest_of(self, audience: Audience, facts: Mapping[str, Mapping[Any, str]]) -> str:
        """The audience's view digest at the parent, from its grants and the packs' facts
        (``facts``: a cache of ``facts_of`` filled as needed)."""
        grants = self.grants_of(audience)
        edges = [[g[2], g[3], g[4], g[5], g[6]] for g in grants]
        ids = sorted({(g[2], g[6], g[3], g[4]) for g in grants})
        entries = []
        for pack, install_id, kind, key in ids:
            cache = facts.get(pack)
            if cache is None:
                cache = facts[pack] = self.facts_of(pack)  # type: ignore[index]
            entries.append([pack, install_id, kind, key, cache[(install_id, kind, key)]])
        return audience_digest(audience, edges, entries)

    def binding_audiences(self, packs: Collection[str]) -> dict[str, set[Audience]]:
        """The audiences whose parent grants name each of ``packs``: a bytes search over
        the verified grant fragments (C speed), each hit confirmed by parsing."""
        out: dict[str, set[Audience]] = {p: set() for p in packs}
        if not packs:
            return out
        if self._blob is None:
            units = sorted(self.fragments.sections[GRANTS])
            bodies = [self.fragments.sections[GRANTS][u][1] for u in units]
            offsets, at = [], 0
            for body in bodies:
                offsets.append(at)
                at += len(body) + 1
            self._blob, self._offsets, self._units = b"\n".join(bodies), offsets, units
        blob, offsets, units = self._blob, self._offsets, self._units
        for pack in packs:
            needle = b"," + orjson.dumps(pack) + b","
            hits: set[int] = set()
            start = blob.find(needle)
            while start >= 0:
                hits.add(bisect.bisect_right(offsets, start) - 1)
                start = blob.find(needle, start + 1)
            for index in hits:
                unit = units[index]
                audience = (unit[0].decode(), unit[1].decode())
                if any(g[2] == pack for g in self.grants_of(audience)):
                    out[pack].add(audience)
        return out


# -- pack authority from the log ---------------------------------------------------------------


def authority_of(state: PackState) -> PackAuthority | None:
    """A pack's authority from its log state, classified by the one classifier (R13):
    an inconsistent state fails closed (INCONSISTENT_STATE) naming what it found."""
    condition = classify(state)
    if condition in ACTIVATED:
        activation, active = state.activation, state.active
        assert activation is not None and active is not None
        assert activation.install_id is not None and activation.payload_hash is not None
        return PackAuthority(
            pack=state.pack,
            source_kind="official_repo",
            install_id=activation.install_id,
            revision=activation.revision,
            epoch=activation.epoch,
            payload_hash=activation.payload_hash,
            dirty=condition is Condition.ACTIVE_FAILED_DIRTY,
            components=component_facts(
                state.pack, activation.install_id, activation.payload_hash, active.components
            ),
        )
    if condition in (Condition.LOCAL, Condition.LEGACY_LOCAL):
        return PackAuthority(pack=state.pack, source_kind="local_path")
    if condition in LEGACY:
        return PackAuthority(pack=state.pack, source_kind="legacy")
    if condition in NEVER_ACTIVATED or condition is Condition.REMOVED:
        return PackAuthority(
            pack=state.pack,
            source_kind="absent",
            dirty=condition is Condition.FIRST_FAILED_DIRTY,
        )
    return None


def parent_authorities(
    recorder: LedgerRecorder, conn: Connection, parent: ParentContent, packs: Collection[str]
) -> dict[str, PackAuthority]:
    """The authority of packs the parent binds and that did not move since: the parent's
    activation entry (verified with the content) and that generation's components, from
    its own ``generation.prepared`` event. Not dirty: the parent was published with them
    bound, and any later attempt would be a lifecycle event (the caller re-reads those)."""
    entries = {p: parent.entry(p) for p in packs}
    ids = {generation_id(p, e[1]): p for p, e in entries.items() if e is not None}
    prepared = recorder.first_events(conn, ids)
    out: dict[str, PackAuthority] = {}
    for gid, pack in ids.items():
        entry = entries[pack]
        assert entry is not None
        event = prepared.get(gid)
        if event is None or event.type != T_PREPARED:
            raise IntegrityFailure(
                f"pack {pack!r}: generation {entry[1]} that revision's content binds is not "
                "prepared in the log",
                pack=pack,
                install_id=entry[1],
            )
        if event.data.get("payload_hash") != entry[4] or event.data.get("pack") != pack:
            raise _integrity(event, f"it is not the generation of {pack!r} the revision binds")
        components = event.data.get("components")
        if not isinstance(components, list):
            raise _integrity(event, "components is not a list")
        try:
            facts = component_facts(pack, entry[1], entry[4], components)
        except (KeyError, TypeError, AttributeError) as exc:
            raise _integrity(event, f"a component is malformed ({exc})") from None
        out[pack] = PackAuthority.official(entry, facts, dirty=False)
    return out


def log_authorities(
    reader: Repository,
    packs: Iterable[str],
    states: Mapping[PackName, PackState] | None = None,
) -> tuple[dict[str, PackAuthority], dict[str, str]]:
    """The authority of each of ``packs`` from its log state, and each one's newest
    attempt (install id), for the fence. ``states`` already read are reused."""
    known = dict(states or {})
    wanted = [PackName.trusted(p) for p in sorted(set(packs)) if PackName.trusted(p) not in known]
    known.update(reader.pack_states(wanted))
    out: dict[str, PackAuthority] = {}
    newest: dict[str, str] = {}
    for name in {*packs, *(states or {})}:
        state = known.get(PackName.trusted(name))
        if state is None:
            continue
        authority = authority_of(state)
        if authority is not None:
            out[name] = authority
        if state.history is not None:
            newest[name] = state.history.newest
    return out, newest


# -- the audience map -------------------------------------------------------------------------


def audiences_root(
    conn: Connection,
    head: LogHead | None,
    changed: Mapping[Audience, str | None],
    before: Mapping[Audience, str | None],
    everything: Callable[[], Mapping[Audience, str]],
) -> str:
    """The audience map's root after ``changed`` (audience -> new digest, ``None``: gone).

    From the view's stored nodes in O(changed x log N) when they reproduce the parent's
    root with ``before`` (the changed audiences' parent digests); otherwise (no map in
    the parent, the view missing or wrong) afresh from ``everything()``, every
    audience's digest after the change (O(audiences), once)."""
    if head is not None and head.audiences_root is not None:
        fetch = map_fetch(conn)
        size = head.counts["audiences"]
        if fetch is not None:
            old = {key_of(*a): _raw(before.get(a)) for a in changed}
            new = {key_of(*a): _raw(d) for a, d in changed.items()}
            try:
                if (
                    not checks.on(checks.MAP)
                    or update(fetch, old, size=size).root.hex() == head.audiences_root
                ):
                    return update(fetch, new, size=size).root.hex()
            except BadNode:
                pass
            log.warning(
                "the audience map view does not reproduce the parent revision's root; "
                "this publication computes the map afresh",
                extra={"revision": head.revision},
            )
    return root_of({key_of(*a): bytes.fromhex(d) for a, d in everything().items()}).hex()


def _raw(digest: str | None) -> bytes | None:
    return None if digest is None else bytes.fromhex(digest)
