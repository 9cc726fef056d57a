"""The runtime reader: one audience's view at the active catalog revision (R18, R19, R28).

A view is a cache of the log (R28): what the reader serves is read from the views and
then checked against what the log committed. Two statements, each one consistent
snapshot on every engine:

1. from the views: the views it reads are running, the head revision, its content
   digest and this audience's recorded view digest, and the audience's grant edges in
   force at the head, each joined with the fact it names; and the log head's position;
2. from the log, one index seek each: the last event of the catalog lineage (the
   revision in force and its content digest), of the audience's published views (its
   digest at that revision), and of each bound pack's activation pointer and of the
   generation it selects (R13).

If anything was appended between the two, the read starts again. Then the reader
fails closed: MISSING when the log holds no view for the audience (the same bytes
whatever the cause, R19); INTEGRITY, naming the table and key, when a view row is
missing, extra or edited — its revision, digest or rows do not match the log, or a
fact's bytes do not match its digest — never MISSING and never other bytes; STALE when
the head is older than required or a bound generation is no longer active. There is no
fallback to the compatibility view, the sources, or a replay.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import suppress
from functools import lru_cache
from operator import itemgetter
from typing import Any, Protocol

import orjson

from domain.catalog import audience_digest, catalog_id, published_view_id
from domain.classifier import pointer_problem
from domain.errors import IntegrityFailure, InvalidInput, LifecycleRejected, Missing, Stale
from domain.event_types import (
    T_ACTIVATED,
    T_PUBLISHED,
    T_REMOVED,
    T_VIEW_PUBLISHED,
    Decoded,
    decode_row,
)
from domain.identity import Audience
from domain.lifecycle import activation_id, generation_id
from domain.served import AudienceView, CatalogHead, fact_hasher
from projections import checks
from projections.catalog_views import OPEN, CatalogView
from projections.framework import Projection, code_mismatch
from projections.lifecycle_views import PackActivationView, PackComponentView, PackGenerationView

#: The one MISSING answer, identical for every cause (R19: non-disclosing).
MISSING_MESSAGE = "no catalog view is published for this audience"


def parse_audience(kind: str, ident: str) -> Audience:
    """Typed audience from its two parts; INVALID names which part is bad."""
    try:
        return Audience.of(kind, ident)
    except InvalidInput as exc:
        part = exc.details.get("part", "id")
        raise InvalidInput(
            f"audience {part} is invalid: {exc.message}", field=f"audience.{part}", part=part
        ) from None


def parse_revision(value: object, *, field: str = "min_revision") -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidInput(f"{field} must be a non-negative integer", field=field, part="revision")
    text = str(value)
    # isascii: str.isdigit() also accepts digits int() refuses ('²') or reads ('١').
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise InvalidInput(
            f"{field} must be a non-negative integer, got {text!r}", field=field, part="revision"
        )
    return int(text)


def _at_least(found: AudienceView, min_revision: int | None) -> AudienceView:
    if min_revision is not None and min_revision > found.revision:
        raise Stale(
            f"revision {min_revision} is required; the catalog is at {found.revision}",
            axis="revision",
            required_revision=min_revision,
            served_revision=found.revision,
        )
    return found


def _missing() -> Missing:
    return Missing(MISSING_MESSAGE)


def _code(name: str) -> str:
    return f"MAX(CASE WHEN name = X'{name.encode().hex()}' THEN code_version END)"


#: The view code versions this program serves (R25), in the order the statement reads them.
_SERVED: tuple[type[Projection], ...] = (
    CatalogView,
    PackComponentView,
    PackActivationView,
    PackGenerationView,
)


def _live(name: str) -> str:
    return f"MAX(CASE WHEN name = X'{name.encode().hex()}' THEN live_version END)"


def _position(name: str) -> str:
    return f"MAX(CASE WHEN name = X'{name.encode().hex()}' THEN position END)"


#: The whole read as one statement (one snapshot, one round trip): a one-row header
#: (stopped flag, code and live versions and positions of the four views, head revision,
#: its digest, this audience's recorded digest) left-joined with the audience's grants in
#: force, their facts and the packs' current activations, all by key on the physical view
#: tables. Rows are put in bytewise order in Python (cheaper than a temp b-tree).
_VIEW_SQL = """
SELECT h.stopped, h.revision, r.content_digest, u.digest, h.cc, h.pc, h.ac, h.nc,
       h.cv, h.pv, h.av, h.nv, h.cq, h.pq, h.aq, h.nq,
       h.hp, g.pack, g.kind, g.{key}, g.credential_set, g.install_id, g.payload_hash,
       c.fact, c.fact_digest
FROM (SELECT s.*,
             (SELECT MAX(revision) FROM view_catalog_revision WHERE view_version = s.cv)
               AS revision
      FROM ({state}) s) h
LEFT JOIN view_catalog_revision r ON r.view_version = h.cv AND r.revision = h.revision
LEFT JOIN view_catalog_audience u
  ON u.view_version = h.cv AND u.audience_kind = {p} AND u.audience_id = {p}
  AND u.to_revision = {p}
LEFT JOIN view_catalog_grant g
  ON g.view_version = h.cv AND g.audience_kind = {p} AND g.audience_id = {p}
  AND g.to_revision = {p}
LEFT JOIN view_pack_component c
  ON c.view_version = h.pv AND c.pack = g.pack AND c.install_id = g.install_id
  AND c.kind = g.kind AND c.{key} = g.{key}
"""

#: The serving state (R18 with a cache): the served views' stopped flag, code and live
#: versions and positions, and the log head's position, in one row. Every append moves
#: the log head (and the inline views' positions), and a blue/green swap moves the live
#: versions: while this row is unchanged, nothing was appended and no view was swapped or
#: stopped, so a view verified against the log at this state is still the one a full
#: read would verify (R28: the log head is the log's own row, not a view's). One
#: primary-key read of five rows.
_STATE_SQL = """
SELECT MAX(stopped) AS stopped, {cat_code} AS cc, {comp_code} AS pc, {act_code} AS ac,
       {gen_code} AS nc, {cat} AS cv, {comp} AS pv, {act} AS av, {gen} AS nv,
       {cat_pos} AS cq, {comp_pos} AS pq, {act_pos} AS aq, {gen_pos} AS nq,
       (SELECT position FROM ledger_head WHERE id = 1) AS hp
FROM projection_state WHERE name IN ({views})
"""

_SHORT = {
    "cat": "catalog",
    "comp": "pack_component",
    "act": "pack_activation",
    "gen": "pack_generation",
}
_VIEWS = ", ".join(f"X'{n.encode().hex()}'" for n in _SHORT.values())

#: The last event of each of some aggregates (one seek each on (aggregate_id, version)),
#: with the log head's position (nothing appended between the two statements of a read).
_LOG_SQL = """
SELECT e.aggregate_id, e.position, e.version, e.topic, e.state,
       (SELECT position FROM ledger_head WHERE id = 1)
FROM ledger_events e
JOIN (SELECT aggregate_id, MAX(version) AS version FROM ledger_events
      WHERE aggregate_id IN ({ids}) GROUP BY aggregate_id) m
  ON e.aggregate_id = m.aggregate_id AND e.version = m.version
"""
#: Every event of one aggregate, in order (a format-v1 catalog lineage's audience digests).
_LINEAGE_SQL = """
SELECT aggregate_id, position, version, topic, state FROM ledger_events
WHERE aggregate_id = {p} ORDER BY version
"""
#: Reads that saw an append between their two statements start again this many times.
_ATTEMPTS = 3


class StatementStore(Protocol):
    @property
    def is_sqlite(self) -> bool: ...

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...


class CatalogReader:
    """Reads audience views; every failure is typed (R19)."""

    def __init__(self, store: StatementStore, *, cache_size: int = 4096) -> None:
        self.store = store
        p = "?" if store.is_sqlite else "%s"
        key = '"key"' if store.is_sqlite else "`key`"
        self._state_sql = _STATE_SQL.format(
            views=_VIEWS,
            **{
                f"{short}{suffix}": column(name)
                for short, name in _SHORT.items()
                for suffix, column in (("", _live), ("_code", _code), ("_pos", _position))
            },
        )
        self._view_sql = _VIEW_SQL.format(p=p, key=key, state=self._state_sql)
        self._mark = p
        self._lineage_sql = _LINEAGE_SQL.format(p=p)
        #: A format-v1 lineage's audience digests, by the lineage's last version.
        self._v1: tuple[int, dict[tuple[str, str], str | None]] | None = None
        #: Verified views by audience, each with the serving state it was verified at.
        self._cache: dict[tuple[str, str], tuple[tuple[Any, ...], AudienceView]] = {}
        self.cache_size = cache_size
        #: This thread's last serving state and the data version it was read at (SQLite).
        self._thread = threading.local()
        #: Reads answered from the cache, and reads that ran the full statement.
        self.hits = 0
        self.misses = 0

    def head(self) -> CatalogHead:
        """The revision in force, from the last event of the catalog lineage (R28)."""
        lineage = self._last_events([catalog_id()])[0].get(catalog_id())
        if lineage is None or lineage.type != T_PUBLISHED:
            raise _missing()
        revision, content, _ = _revision_of(lineage)
        return CatalogHead(revision, content)

    def _last_events(self, ids: Sequence[Any]) -> tuple[dict[Any, Decoded], int | None]:
        """The last event of each aggregate of ``ids`` that has any, and the log head."""
        keys = sorted({i.bytes for i in ids})
        sql = _LOG_SQL.format(ids=", ".join([self._mark] * len(keys)))
        by_bytes = {i.bytes: i for i in ids}
        out: dict[Any, Decoded] = {}
        head = None
        for row in self.store.query(sql, keys):
            found = decode_row(*row[:5])
            out[by_bytes[found.aggregate_id.bytes]] = found
            head = row[5]
        return out, head

    def _last_event(self, aggregate: Any) -> Decoded | None:
        """The last event of one aggregate (a pointer that moved on: its generation)."""
        return self._last_events([aggregate])[0].get(aggregate)

    def _v1_digest(self, lineage: Decoded, audience: tuple[str, str]) -> str | None:
        """The audience's digest in a lineage whose last revision is of format v1 (no
        audience map yet): the last one a revision event listed for it."""
        cached = self._v1
        if cached is None or cached[0] != lineage.version:
            digests: dict[tuple[str, str], str | None] = {}
            for row in self.store.query(self._lineage_sql, (catalog_id().bytes,)):
                event = decode_row(*row)
                if event.type != T_PUBLISHED:
                    continue
                try:
                    for kind, ident, value in event.data["audiences"]:
                        digests[(kind, ident)] = value
                except (TypeError, ValueError) as exc:
                    raise _log_shape(event, f"audiences is malformed ({exc})") from None
            cached = self._v1 = (lineage.version, digests)
        return cached[1].get(audience)

    def serving_state(self) -> tuple[Any, ...]:
        """The served views' state (``_STATE_SQL``): equal states serve equal views.

        On SQLite, the state read last on this thread is reused while the connection's
        ``data_version`` is unchanged (no other connection committed since): one pragma
        instead of the statement."""
        version_of = getattr(self.store, "data_version", None)
        version = version_of() if version_of is not None else None
        memo = self._thread
        if version is not None and getattr(memo, "version", None) == version:
            found: tuple[Any, ...] = memo.state
            return found
        state = tuple(self.store.query(self._state_sql)[0])
        if version is not None:
            memo.version, memo.state = version, state
        return state

    def view(self, audience: Audience, *, min_revision: int | None = None) -> AudienceView:
        """The audience's facts at the head revision, verified (R18, R19).

        A view verified before is served again only after one cheap check that the
        serving state (``_STATE_SQL``) has not moved since; otherwise, and the first
        time, one statement reads and verifies it afresh."""
        return self.view_at(audience, min_revision=min_revision)[0]

    def view_at(
        self, audience: Audience, *, min_revision: int | None = None
    ) -> tuple[AudienceView, tuple[Any, ...]]:
        """``view`` and the serving state it was verified at."""
        pair = (audience.kind.value, str(audience.id))
        cached = self._cache.get(pair)
        if cached is not None and self.serving_state() == cached[0]:
            self.hits += 1
            state, found = cached
        else:
            self.misses += 1
            state, found = self._read(audience, pair)
        return _at_least(found, min_revision), state

    def cached(
        self, audience: Audience, state: tuple[Any, ...], *, min_revision: int | None = None
    ) -> AudienceView | None:
        """The view verified at ``state`` (a serving state read after the request began),
        if this reader holds it; no I/O. ``None``: read it with ``view_at``."""
        found = self._cache.get((audience.kind.value, str(audience.id)))
        if found is None or found[0] != state:
            return None
        self.hits += 1
        return _at_least(found[1], min_revision)

    def _read(
        self, audience: Audience, pair: tuple[str, str]
    ) -> tuple[tuple[Any, ...], AudienceView]:
        kind, ident = audience.kind.value.encode(), audience.id.encode()
        params = (kind, ident, OPEN, kind, ident, OPEN)
        for attempt in range(_ATTEMPTS):
            rows = self.store.query(self._view_sql, params)
            header = rows[0]
            stopped, revision, content, recorded = header[:4]
            for view, built_with in zip(_SERVED, header[4:8], strict=True):
                if built_with is not None and type(built_with) is not int:
                    raise IntegrityFailure(
                        f"the code version of view {view.name} in projection_state is not "
                        "an integer: the row was edited",
                        table="projection_state",
                        view=view.name,
                    )
                if built_with is not None and built_with != view.version:
                    raise code_mismatch(view.name, built_with, view.version)
            if stopped:
                raise Stale(
                    "a catalog view is stopped and behind the log; it is not served "
                    "until it is rebuilt",
                    axis="projection",
                )
            # Bytewise (pack, kind, key, credential set): the publisher's digest order (R3).
            # Both drivers return BLOBs as bytes, so the row slices are the cache key as is.
            grants = _sorted_grants(
                pair, [row[_GRANTS:] for row in rows if row[_GRANTS] is not None]
            )
            bound = _bound_generations(grants)
            ids = [catalog_id(), published_view_id(*pair)]
            for pack, install_id in bound:
                ids += [activation_id(pack), generation_id(pack, install_id)]
            log, head = self._last_events(ids)
            if head == header[_HEAD] or attempt == _ATTEMPTS - 1:
                break  # else something was appended between the two statements: again
        served = self._served_digest(pair, log, revision, content, recorded, grants)
        # The rows first (an edited pack or install id is INTEGRITY, not another answer),
        # then whether the log still has each bound generation active (STALE if not).
        found = _verified(pair, int(revision), bytes(content), served.encode(), grants)
        for pack, install_id in bound:
            _still_active(pack, install_id, log, int(revision), self._last_event)
        state = (stopped, *header[4:_GRANTS])
        if self.cache_size > 0:
            if len(self._cache) >= self.cache_size and pair not in self._cache:
                with suppress(StopIteration, KeyError, RuntimeError):  # a concurrent eviction
                    del self._cache[next(iter(self._cache))]
            self._cache[pair] = (state, found)
        return state, found

    def _served_digest(
        self,
        pair: tuple[str, str],
        log: Mapping[Any, Decoded],
        revision: Any,
        content: Any,
        recorded: Any,
        grants: tuple[tuple[Any, ...], ...],
    ) -> str:
        """The audience's view digest the log committed at the revision in force, checked
        against the catalog view's rows; MISSING when the log holds no view for it."""
        lineage = log.get(catalog_id())
        if lineage is None or lineage.type != T_PUBLISHED:
            if revision is None and not grants and recorded is None:
                raise _missing()
            raise _view_row(
                "view_catalog_revision",
                {"revision": revision},
                "the catalog view holds a revision the log never published",
            )
        number, digest, v2 = _revision_of(lineage)
        if checks.on(checks.HEAD) and (
            type(revision) is not int or revision != number or _text(content) != digest
        ):
            raise _view_row(
                "view_catalog_revision",
                {"revision": number},
                f"revision {number} in force is not the catalog view's head row",
            )
        if v2:
            published = log.get(published_view_id(*pair))
            value = None if published is None else _view_digest(published, number)
        else:
            value = self._v1_digest(lineage, pair)
        if not checks.on(checks.AUDIENCE):  # test-only: trust the view's rows (pre-R28)
            if recorded is None and not grants:
                raise _missing()
            return _text(recorded)
        if value is None:
            if grants or recorded is not None:
                raise _view_row(
                    "view_catalog_grant" if grants else "view_catalog_audience",
                    {"audience": f"{pair[0]}:{pair[1]}", "revision": number},
                    "the catalog view serves an audience the log publishes no view for",
                )
            raise _missing()
        if recorded is None or _text(recorded) != value:
            raise _view_row(
                "view_catalog_audience",
                {"audience": f"{pair[0]}:{pair[1]}", "revision": number},
                "the audience's digest is not the one the log committed",
            )
        if not grants:
            raise _view_row(
                "view_catalog_grant",
                {"audience": f"{pair[0]}:{pair[1]}", "revision": number},
                "the audience's grant rows are missing",
            )
        return value

    def watch(
        self,
        audience: Audience,
        *,
        since: str | None = None,
        interval: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Iterator[AudienceView]:
        """The audience's view now and then each time its own content changes.

        ``since`` is an audience digest already seen (that view is not yielded again).
        Costs one serving-state read per ``interval`` and a view read only when that
        state moved; a publication that changes other audiences only yields nothing.
        A read that fails raises its typed error and ends the iteration (fail closed)."""
        seen, state = since, None
        while True:
            current = self.serving_state()
            if current != state:
                found, state = self.view_at(audience)
                if found.audience_digest != seen:
                    seen = found.audience_digest
                    yield found
            sleep(interval)

    def cache_hit_rate(self) -> float:
        reads = self.hits + self.misses
        return self.hits / reads if reads else 0.0


#: Where a row's grant columns start (after the header), and the log head's column.
_GRANTS = 17
_HEAD = 16
_GRANT_ORDER = itemgetter(0, 1, 2, 3)


def _sorted_grants(
    pair: tuple[str, str], rows: list[tuple[Any, ...]]
) -> tuple[tuple[Any, ...], ...]:
    """The grant rows in the publisher's digest order; a key cell that is not the bytes
    the schema declares (a column stored as another type) is an edited row (INTEGRITY)."""
    for row in rows:
        if any(type(cell) is not bytes for cell in row[:6]):
            raise _view_row(
                "view_catalog_grant",
                {"audience": f"{pair[0]}:{pair[1]}"},
                "a grant cell is not the bytes the schema declares",
            )
    return tuple(sorted(rows, key=_GRANT_ORDER))


def _text(value: object) -> str:
    """A stored digest cell as text; another type is an edited row (INTEGRITY)."""
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            pass
    raise IntegrityFailure(
        f"a catalog view cell is {type(value).__name__}, not the text the schema declares",
        rule="R28",
    )


def _view_row(table: str, key: dict[str, Any], problem: str) -> IntegrityFailure:
    """A view row that is missing, extra or edited: INTEGRITY naming table and key (R28)."""
    return IntegrityFailure(
        f"{table} does not match the log ({problem}); `catalog-ledger projections verify` "
        "names the first differing row and `projections rebuild` restores the view",
        rule="R28",
        table=table,
        key=key,
    )


def _log_shape(event: Decoded, problem: str) -> IntegrityFailure:
    return IntegrityFailure(
        f"the log row at position {event.position} ({event.type}) is not what its type "
        f"declares: {problem}",
        position=event.position,
    )


def _revision_of(lineage: Decoded) -> tuple[int, str, bool]:
    """(revision, content digest, carries an audience map) of a revision event."""
    d = lineage.data
    revision, digest, root = d.get("revision"), d.get("content_digest"), d.get("audiences_root")
    if type(revision) is not int or type(digest) is not str or not isinstance(root, str | None):
        raise _log_shape(lineage, "revision, content_digest or audiences_root")
    return revision, digest, root is not None


def _view_digest(published: Decoded, revision: int) -> str | None:
    """The digest an ``audience_view.published`` event records (at most ``revision``)."""
    d = published.data
    value, at = d.get("digest"), d.get("revision")
    if published.type != T_VIEW_PUBLISHED or type(at) is not int or at > revision:
        raise _log_shape(published, "not an audience view of a published revision")
    if value is not None and type(value) is not str:
        raise _log_shape(published, "digest is not a string")
    return value


def _bound_generations(grants: tuple[tuple[Any, ...], ...]) -> list[tuple[str, str]]:
    """The distinct (pack, install id) the grant rows name."""
    try:
        return sorted({(bytes(g[0]).decode(), bytes(g[4]).decode()) for g in grants})
    except (TypeError, UnicodeDecodeError):
        raise _view_row(
            "view_catalog_grant", {}, "a grant cell is not the text the schema declares"
        ) from None


@lru_cache(maxsize=1 << 16)
def _fact_matches(
    pack: str, install_id: str, payload_hash: str, fact: bytes, stored: bytes
) -> bool:
    """Does ``fact`` hash to ``stored``? Cached by the exact bytes (facts are shared by
    many audiences); a changed byte is another key and is hashed afresh."""
    return fact_hasher(pack, install_id, payload_hash)(fact) == stored


def _still_active(
    pack: str,
    install_id: str,
    log: Mapping[Any, Decoded],
    revision: int,
    last_event: Callable[[Any], Decoded | None],
) -> None:
    """The pack's pointer, as its last log event has it, selects the bound generation, and
    that generation's last event agrees (R13, R18): else STALE (the pointer moved on to a
    consistent generation: ``last_event`` reads it) or INCONSISTENT_STATE (what the log
    says does not add up), naming what was found."""
    pointer = log.get(activation_id(pack))
    active = None
    if pointer is not None and pointer.type != T_REMOVED:
        active = pointer.data.get("install_id")
    if active != install_id:
        if pointer is not None and isinstance(active, str):
            _consistent(pack, active, pointer, last_event(generation_id(pack, active)))
        raise Stale(
            f"pack {pack!r} is no longer served by the bound generation {install_id}",
            axis="activation",
            served_revision=revision,
            pack=pack,
            bound_install_id=install_id,
            active_install_id=active if isinstance(active, str) else None,
        )
    assert pointer is not None
    _consistent(pack, install_id, pointer, log.get(generation_id(pack, install_id)))


def _consistent(pack: str, install_id: str, pointer: Decoded, generation: Decoded | None) -> None:
    """INCONSISTENT_STATE unless the pointer and its generation's last event agree (R13)."""
    problem = pointer_problem(
        install_id,
        pointer.data.get("epoch"),
        pointer.data.get("payload_hash"),
        None if generation is None else _GENERATION_STATUS.get(generation.type, generation.type),
        None if generation is None else generation.data.get("epoch"),
        None if generation is None else generation.data.get("applied_payload_hash"),
    )
    if problem is not None:
        raise LifecycleRejected(
            f"pack {pack!r} is in an inconsistent state: {problem}",
            reason="INCONSISTENT_STATE",
            rule="R13",
            pack=pack,
            found=problem,
        )


#: A generation's status after its last event.
_GENERATION_STATUS = {
    T_ACTIVATED: "active",
    "generation.prepared": "preparing",
    "generation.retired": "retired",
    "generation.failed": "failed",
}


# A verified view is cached by its *complete* stored input (the exact rows, fact
# bytes and digests included, the revision and the recorded digests): unchanged
# rows skip re-verification, while a single changed byte is another key and is
# verified, and caught, afresh. Cached views are shared: treat them as read-only.
@lru_cache(maxsize=4096)
def _verified(
    pair: tuple[str, str],
    revision: int,
    content: bytes,
    recorded: bytes,
    rows: tuple[tuple[Any, ...], ...],
) -> AudienceView:
    grants: list[list[Any]] = []
    facts: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for row in rows:
        try:
            pack_b, kind_b, key_b, cred_b, install_b, hash_b, fact, fact_digest = row[:8]
            pack, kind, key = pack_b.decode(), kind_b.decode(), key_b.decode()
            install_id, payload_hash = install_b.decode(), hash_b.decode()
            cred = cred_b.decode() or None
        except (AttributeError, UnicodeDecodeError):
            raise _view_row(
                "view_catalog_grant",
                {"audience": f"{pair[0]}:{pair[1]}", "revision": revision},
                "a grant cell is not the text the schema declares",
            ) from None
        if fact is None:
            raise IntegrityFailure(
                f"the fact {pack}/{kind}/{key} of a grant is missing", pack=pack, kind=kind, key=key
            )
        if (
            type(fact) is not bytes
            or type(fact_digest) is not bytes
            or (
                checks.on(checks.FACT)
                and not _fact_matches(pack, install_id, payload_hash, fact, fact_digest)
            )
        ):
            raise IntegrityFailure(
                f"the stored fact {pack}/{kind}/{key} does not match its digest",
                pack=pack,
                kind=kind,
                key=key,
                revision=revision,
            )
        grants.append([pack, kind, key, cred, install_id])
        fact_id = (pack, install_id, kind, key)
        if fact_id not in facts:
            data = orjson.loads(fact)
            facts[fact_id] = {
                "pack": pack,
                "install_id": install_id,
                "kind": kind,
                "key": key,
                "payload": data["payload"],
                "requires": data["requires"],
                "credential_sets": data["credential_sets"],
                "payload_hash": payload_hash,
                "fact_digest": fact_digest.hex(),
            }
    fact_entries = [[*k, facts[k]["fact_digest"]] for k in sorted(facts)]
    if (
        checks.on(checks.DIGEST)
        and audience_digest(pair, grants, fact_entries) != recorded.decode()
    ):
        raise IntegrityFailure(
            "the stored view of this audience does not match its recorded digest",
            revision=revision,
        )
    return AudienceView(
        audience=f"{pair[0]}:{pair[1]}",
        revision=revision,
        content_digest=content.decode(),
        audience_digest=recorded.decode(),
        grants=[
            {"pack": g[0], "kind": g[1], "key": g[2], "credential_set": g[3], "install_id": g[4]}
            for g in grants
        ],
        facts=[facts[k] for k in sorted(facts)],
    )
