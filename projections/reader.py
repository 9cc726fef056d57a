"""The runtime reader: one audience's view at the active catalog revision (R18, R19).

One SELECT statement — one consistent snapshot on every engine, so it needs
no surrounding transaction — answers everything:

1. the views it reads are running, and the head revision, its content digest
   and this audience's recorded view digest;
2. the audience's grant edges in force at the head, each joined with the fact
   it names and with the pack's *current* activation.

Then, without another query, the reader fails closed: MISSING when the
audience has no grants (the same bytes whatever the cause), STALE when the
head is older than required or a bound generation is no longer active,
INTEGRITY when a fact's bytes or the audience's rows no longer match their
recorded digests. There is no fallback to the compatibility view, the log or
the sources.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import cached_property, lru_cache
from operator import itemgetter
from typing import Any, Protocol

import orjson

from domain.catalog import audience_digest
from domain.content import fact_hasher
from domain.errors import IntegrityFailure, InvalidInput, LifecycleRejected, Missing, Stale
from domain.identity import Audience
from projections.catalog_views import OPEN, CatalogView
from projections.framework import Projection, code_mismatch
from projections.lifecycle_views import PackActivationView, PackComponentView, PackGenerationView

#: The one MISSING answer, identical for every cause (R19: non-disclosing).
MISSING_MESSAGE = "no catalog view is published for this audience"


@dataclass(frozen=True)
class AudienceView:
    """What one audience may use at one revision."""

    audience: str
    revision: int
    content_digest: str
    audience_digest: str
    grants: list[dict[str, Any]]
    facts: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {
            "audience": self.audience,
            "revision": self.revision,
            "content_digest": self.content_digest,
            "audience_digest": self.audience_digest,
            "grants": self.grants,
            "facts": self.facts,
        }

    @cached_property
    def body(self) -> bytes:
        """The JSON document of ``to_json``, serialized once per verified view."""
        return orjson.dumps(self.to_json())

    @property
    def etag(self) -> str:
        """The HTTP validator: weak, from the audience's own digest, so that it confirms
        this audience's content and never a body of other content (a 304 means "your
        content is unchanged", even when the revision moved)."""
        return f'W/"{self.audience_digest}"'


@dataclass(frozen=True)
class CatalogHead:
    revision: int
    content_digest: str


@lru_cache(maxsize=1 << 16)  # pure; runtimes ask for the same few audiences again and again
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
       g.pack, g.kind, g.{key}, g.credential_set, g.install_id, g.payload_hash,
       c.fact, c.fact_digest, a.install_id,
       a.epoch, a.payload_hash, n.status, n.epoch, n.applied_payload_hash
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
LEFT JOIN view_pack_activation a ON a.view_version = h.av AND a.pack = g.pack
LEFT JOIN view_pack_generation n
  ON n.view_version = h.nv AND n.pack = a.pack AND n.install_id = a.install_id
"""

#: The serving state (R18 with a cache): the served views' stopped flag, code and live
#: versions and positions, in one row. The four views are inline (R20), so their
#: positions move in every append transaction and a blue/green swap moves their live
#: versions: while this row is unchanged, no revision was published, no activation or
#: generation moved and no view was swapped or stopped, so a view verified at this
#: state is still the one a full read would verify. One primary-key read of four rows.
_STATE_SQL = """
SELECT MAX(stopped) AS stopped, {cat_code} AS cc, {comp_code} AS pc, {act_code} AS ac,
       {gen_code} AS nc, {cat} AS cv, {comp} AS pv, {act} AS av, {gen} AS nv,
       {cat_pos} AS cq, {comp_pos} AS pq, {act_pos} AS aq, {gen_pos} AS nq
FROM projection_state WHERE name IN ({views})
"""

_SHORT = {
    "cat": "catalog",
    "comp": "pack_component",
    "act": "pack_activation",
    "gen": "pack_generation",
}
_VIEWS = ", ".join(f"X'{n.encode().hex()}'" for n in _SHORT.values())

_HEAD_SQL = """
SELECT revision, content_digest FROM _System_CatalogRevision ORDER BY revision DESC LIMIT 1
"""


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
        #: Verified views by audience, each with the serving state it was verified at.
        self._cache: dict[tuple[str, str], tuple[tuple[Any, ...], AudienceView]] = {}
        self.cache_size = cache_size
        #: This thread's last serving state and the data version it was read at (SQLite).
        self._thread = threading.local()
        #: Reads answered from the cache, and reads that ran the full statement.
        self.hits = 0
        self.misses = 0

    def head(self) -> CatalogHead:
        rows = self.store.query(_HEAD_SQL)
        if not rows:
            raise _missing()
        return CatalogHead(int(rows[0][0]), bytes(rows[0][1]).decode())

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
        rows = self.store.query(self._view_sql, (kind, ident, OPEN, kind, ident, OPEN))
        header = rows[0]
        stopped, revision, content, recorded = header[:4]
        for view, built_with in zip(_SERVED, header[4:8], strict=True):
            if built_with is not None and built_with != view.version:
                raise code_mismatch(view.name, int(built_with), view.version)
        if stopped:
            raise Stale(
                "a catalog view is stopped and behind the log; it is not served "
                "until it is rebuilt",
                axis="projection",
            )
        if revision is None:
            raise _missing()
        # Bytewise (pack, kind, key, credential set): the publisher's digest order (R3).
        # Both drivers return BLOBs as bytes, so the row slices are the cache key as is.
        grants = tuple(
            sorted([row[_GRANTS:] for row in rows if row[_GRANTS] is not None], key=_GRANT_ORDER)
        )
        if not grants or recorded is None:
            raise _missing()
        found = _verified(pair, int(revision), bytes(content), bytes(recorded), grants)
        state = (stopped, *header[4:_GRANTS])
        if self.cache_size > 0:
            if len(self._cache) >= self.cache_size and pair not in self._cache:
                with suppress(StopIteration, KeyError, RuntimeError):  # a concurrent eviction
                    del self._cache[next(iter(self._cache))]
            self._cache[pair] = (state, found)
        return state, found

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


#: Where a row's grant columns start (after the header).
_GRANTS = 16
_GRANT_ORDER = itemgetter(0, 1, 2, 3)


@lru_cache(maxsize=1 << 16)
def _fact_matches(
    pack: str, install_id: str, payload_hash: str, fact: bytes, stored: bytes
) -> bool:
    """Does ``fact`` hash to ``stored``? Cached by the exact bytes (facts are shared by
    many audiences); a changed byte is another key and is hashed afresh."""
    return fact_hasher(pack, install_id, payload_hash)(fact) == stored


def _consistent(
    pack: str,
    active: bytes,
    epoch: int,
    payload_hash: bytes,
    status: bytes | None,
    generation_epoch: int | None,
    applied: bytes | None,
) -> None:
    """The pointer selects an active generation that agrees with it (R13), or the read
    fails closed naming what was found (the classifier's rules, on the views)."""
    if status is None:
        found = "the activation names a generation that is not in the log"
    elif status != b"active":
        found = f"the activation names generation {active.decode()} which is {status.decode()}"
    elif generation_epoch != epoch or applied != payload_hash:
        found = "the active generation and the activation disagree"
    else:
        return
    raise LifecycleRejected(
        f"pack {pack!r} is in an inconsistent state: {found}",
        reason="INCONSISTENT_STATE",
        rule="R13",
        pack=pack,
        found=found,
    )


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
        pack_b, kind_b, key_b, cred_b, install_b, hash_b, fact, fact_digest, active_b = row[:9]
        pack, kind, key = pack_b.decode(), kind_b.decode(), key_b.decode()
        install_id, payload_hash = install_b.decode(), hash_b.decode()
        if active_b is not None:
            _consistent(pack, active_b, *row[9:])
        if active_b != install_b:
            raise Stale(
                f"pack {pack!r} is no longer served by the bound generation {install_id}",
                axis="activation",
                served_revision=revision,
                pack=pack,
                bound_install_id=install_id,
                active_install_id=active_b.decode() if active_b else None,
            )
        if fact is None:
            raise IntegrityFailure(
                f"the fact {pack}/{kind}/{key} of a grant is missing", pack=pack, kind=kind, key=key
            )
        if not _fact_matches(pack, install_id, payload_hash, fact, fact_digest):
            raise IntegrityFailure(
                f"the stored fact {pack}/{kind}/{key} does not match its digest",
                pack=pack,
                kind=kind,
                key=key,
                revision=revision,
            )
        grants.append([pack, kind, key, cred_b.decode() or None, install_id])
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
    if audience_digest(pair, grants, fact_entries) != recorded.decode():
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
