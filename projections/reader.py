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
from typing import Any, Protocol

from domain.catalog import catalog_id, published_view_id
from domain.errors import IntegrityFailure, InvalidInput, Missing, Stale
from domain.event_types import T_PUBLISHED, Decoded, decode_row
from domain.identity import Audience
from domain.lifecycle import activation_id, generation_id
from domain.served import AudienceView, CatalogHead
from projections import checks, reader_sql
from projections.framework import code_mismatch
from projections.reader_checks import (
    bound_generations,
    log_shape,
    revision_of,
    sorted_grants,
    still_active,
    text_cell,
    verified,
    view_digest,
    view_row_mismatch,
)
from projections.reader_sql import GRANT_COLUMN, HEAD_COLUMN, SERVED
from projections.views.catalog import OPEN

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
        self._mark = "?" if store.is_sqlite else "%s"
        self._state_sql = reader_sql.state_sql()
        self._view_sql = reader_sql.view_sql(store.is_sqlite)
        self._lineage_sql = reader_sql.lineage_sql(self._mark)
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
        revision, content, _ = revision_of(lineage)
        return CatalogHead(revision, content)

    def _last_events(self, ids: Sequence[Any]) -> tuple[dict[Any, Decoded], int | None]:
        """The last event of each aggregate of ``ids`` that has any, and the log head."""
        keys = sorted({i.bytes for i in ids})
        sql = reader_sql.log_sql(self._mark, len(keys))
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
                    raise log_shape(event, f"audiences is malformed ({exc})") from None
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
            for view, built_with in zip(SERVED, header[4:8], strict=True):
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
            grants = sorted_grants(
                pair, [row[GRANT_COLUMN:] for row in rows if row[GRANT_COLUMN] is not None]
            )
            bound = bound_generations(grants)
            ids = [catalog_id(), published_view_id(*pair)]
            for pack, install_id in bound:
                ids += [activation_id(pack), generation_id(pack, install_id)]
            log, head = self._last_events(ids)
            if head == header[HEAD_COLUMN] or attempt == _ATTEMPTS - 1:
                break  # else something was appended between the two statements: again
        served = self._served_digest(pair, log, revision, content, recorded, grants)
        # The rows first (an edited pack or install id is INTEGRITY, not another answer),
        # then whether the log still has each bound generation active (STALE if not).
        found = verified(pair, int(revision), bytes(content), served.encode(), grants)
        for pack, install_id in bound:
            still_active(pack, install_id, log, int(revision), self._last_event)
        state = (stopped, *header[4:GRANT_COLUMN])
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
            raise view_row_mismatch(
                "view_catalog_revision",
                {"revision": revision},
                "the catalog view holds a revision the log never published",
            )
        number, digest, v2 = revision_of(lineage)
        if checks.on(checks.HEAD) and (
            type(revision) is not int or revision != number or text_cell(content) != digest
        ):
            raise view_row_mismatch(
                "view_catalog_revision",
                {"revision": number},
                f"revision {number} in force is not the catalog view's head row",
            )
        if v2:
            published = log.get(published_view_id(*pair))
            value = None if published is None else view_digest(published, number)
        else:
            value = self._v1_digest(lineage, pair)
        if not checks.on(checks.AUDIENCE):  # test-only: trust the view's rows (pre-R28)
            if recorded is None and not grants:
                raise _missing()
            return text_cell(recorded)
        if value is None:
            if grants or recorded is not None:
                raise view_row_mismatch(
                    "view_catalog_grant" if grants else "view_catalog_audience",
                    {"audience": f"{pair[0]}:{pair[1]}", "revision": number},
                    "the catalog view serves an audience the log publishes no view for",
                )
            raise _missing()
        if recorded is None or text_cell(recorded) != value:
            raise view_row_mismatch(
                "view_catalog_audience",
                {"audience": f"{pair[0]}:{pair[1]}", "revision": number},
                "the audience's digest is not the one the log committed",
            )
        if not grants:
            raise view_row_mismatch(
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
