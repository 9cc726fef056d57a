"""Rebuilt versions checked against what the log commits, before they go live (R28).

A rebuild replays each view through its kernel, an optimized transcription of the
view's ``apply``. A kernel that raises is replaced by ``apply``; one that silently
writes other rows would go live unless something independent of it disagrees. This
module is that something: the new versions are compared with the values the log
itself carries, never read through a view:

* **activations** (``Commitments``): while the replay scans the log, the pointer events
  it decodes anyway are also folded here (one dictionary write each, none of the
  kernels' code); before a single row is written, each pack's pointer row must be its
  last pointer event (install id, epoch, revision, payload hash, position; no row after
  a removal). In memory, in the process that built the rows.
* **the revision's counts** and **audience digests** (``check_built``): inside the
  swap transaction (head locked, tail applied), the catalog's head revision row is the
  last ``catalog.published`` event (revision, content digest, the four counts), the
  rows in force are as many activations, grants, facts and audiences as those counts
  say, and every audience digest in force is the one its last ``audience_view.published``
  event (format v2) or the lineage's revision events (format v1) committed: one index
  seek per aggregate and four counts.

A difference raises ``IntegrityFailure`` (rule R28) naming the view, table and key:
nothing is swapped in, the versions built are dropped, and the live views stay.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from operator import itemgetter
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain.catalog import catalog_id, published_view_id
from domain.errors import IntegrityFailure
from domain.event_types import (
    T_PUBLISHED,
    T_REMOVED,
    T_VIEW_PUBLISHED,
    Decoded,
    decode_state,
)
from domain.served import audience_digest
from projections.framework import Handler, Projection, Replayer, stored_topics
from projections.ports import LogSource
from projections.reader_checks import sorted_grants
from projections.tables import Key, RowTuple, ViewTable
from projections.views.catalog import (
    CATALOG_ACTIVATION,
    CATALOG_AUDIENCE,
    CATALOG_GRANT,
    CATALOG_REVISION,
    OPEN,
    CatalogView,
)
from projections.views.pack_activation import PACK_ACTIVATION, PackActivationView
from projections.views.pack_component import PACK_COMPONENT, PackComponentView


def check_built(
    log_source: LogSource,
    conn: Connection,
    chosen: Sequence[Projection],
    versions: Mapping[str, int],
) -> None:
    """Inside the swap transaction: compare the new version (``versions``: view name ->
    version) of the catalog, if chosen, with what the log commits at its head. Raises
    ``IntegrityFailure`` at the first difference."""
    if CatalogView.name in {p.name for p in chosen}:
        _check_catalog(
            log_source, conn, versions[CatalogView.name], versions.get(PackComponentView.name)
        )


def _differs(view: str, table: ViewTable, key: dict[str, Any], problem: str) -> IntegrityFailure:
    return IntegrityFailure(
        f"the rebuilt view {view} does not match the log: {table.name} {key} {problem}; "
        "nothing was swapped in and the live views are untouched (the view's rebuild "
        "code disagrees with what the log commits: a defect of this program's view code)",
        rule="R28",
        view=view,
        table=table.physical.name,
        key=key,
    )


def _rows(conn: Connection, table: ViewTable, version: int, *where: Any) -> list[Any]:
    t = table.physical
    query = sa.select(*(t.c[c] for c in table.columns)).where(t.c.view_version == version, *where)
    return list(conn.execute(query))


def _text(value: Any) -> str | None:
    return None if value is None else bytes(value).decode(errors="replace")


# -- activations: gathered in the replay's own scan ---------------------------------------------


class Commitments:
    """What the log commits about each pack's activation pointer, gathered from the
    events the replay decodes anyway (``handlers``, dispatched beside the kernels; none
    of the kernels' code), then compared with the rows the kernel built, in memory,
    before anything is written (``check``): each pack's pointer row is its last pointer
    event (install id, epoch, revision, payload hash, position), and a pack whose last
    pointer event is a removal has no row."""

    def __init__(self, names: Collection[str]) -> None:
        self.pointers: dict[str, tuple[int, str, dict[str, Any]]] = {}
        self.handlers: dict[str, Handler] = {}
        #: The views whose rows this checks (the pointer view, when it is rebuilt).
        self.views = {PackActivationView.name} & set(names)
        if self.views:
            for name in PackActivationView.types:
                self.handlers[name] = self._pointer(name)

    def _pointer(self, name: str) -> Handler:
        pointers = self.pointers

        def moved(position: int, d: dict[str, Any]) -> None:
            pack = d.get("pack")
            if type(pack) is str:  # else apply names a poison event
                pointers[pack] = (position, name, d)

        return moved

    def check(self, built: Mapping[str, Replayer]) -> None:
        """Raise ``IntegrityFailure`` at the first built row the log contradicts."""
        if PackActivationView.name in self.views and PackActivationView.name in built:
            self._check_pointers(built[PackActivationView.name])

    def _check_pointers(self, kernel: Replayer) -> None:
        rows = _built(kernel, PACK_ACTIVATION)
        want: dict[Key, tuple[Any, ...]] = {}
        for pack, (position, name, d) in self.pointers.items():
            if name != T_REMOVED:
                want[(_enc(pack),)] = (
                    _enc(d.get("install_id")),
                    d.get("epoch"),
                    _enc(d.get("revision")),
                    _enc(d.get("payload_hash")),
                    position,
                )
        cells = _cells(
            PACK_ACTIVATION, "install_id", "epoch", "revision", "payload_hash", "position"
        )
        have = {key: cells(row) for key, row in rows.items()}
        _compare(PackActivationView.name, PACK_ACTIVATION, ("pack",), have, want)


def _enc(value: Any) -> Any:
    return value.encode() if isinstance(value, str) else value


def _built(kernel: Replayer, table: ViewTable) -> Mapping[Key, RowTuple]:
    for found, rows in kernel.tables():
        if found.name == table.name:
            return rows
    return {}


def _cells(table: ViewTable, *columns: str) -> Callable[[RowTuple], tuple[Any, ...]]:
    """The cells ``columns`` of a built row tuple (``view_version`` first, then the
    table's columns), as a tuple."""
    get = itemgetter(*(1 + table.columns.index(c) for c in columns))
    return lambda row: tuple(get(row))


def _compare(
    view: str,
    table: ViewTable,
    key_names: tuple[str, ...],
    have: Mapping[Key, tuple[Any, ...]],
    want: Mapping[Key, tuple[Any, ...]],
) -> None:
    if have == want:
        return
    for key in sorted(set(have) | set(want), key=repr):
        if have.get(key) != want.get(key):
            shown = {k: _text(v) for k, v in zip(key_names, key, strict=True)}
            if key not in have:
                problem = "has no row the log commits"
            elif key not in want:
                problem = "has a row the log does not commit"
            else:
                problem = f"holds {have[key]}; the log commits {want[key]}"
            raise _differs(view, table, shown, problem)


# -- the revision's counts and the audience digests ---------------------------------------------


def _check_catalog(
    log_source: LogSource, conn: Connection, version: int, component_version: int | None
) -> None:
    name = CatalogView.name
    head = log_source.last_events(conn, [catalog_id()]).get(catalog_id())
    rev = CATALOG_REVISION.physical
    top = conn.execute(
        sa.select(*(rev.c[c] for c in CATALOG_REVISION.columns))
        .where(rev.c.view_version == version)
        .order_by(rev.c.revision.desc())
        .limit(1)
    ).first()
    if head is None or head.type != T_PUBLISHED:
        if top is not None:
            raise _differs(
                name, CATALOG_REVISION, {"revision": top.revision}, "exists; the log has none"
            )
        return
    d = head.data
    counts = d.get("counts") or {}
    want: tuple[Any, ...] = (
        d.get("revision"),
        d.get("content_digest"),
        *(counts.get(k) for k in ("audiences", "activations", "facts", "grants")),
    )
    have: tuple[Any, ...] = ()
    if top is not None:
        have = (
            top.revision,
            _text(top.content_digest),
            top.audiences,
            top.activations,
            top.facts,
            top.grants,
        )
    if have != want:
        raise _differs(
            name,
            CATALOG_REVISION,
            {"revision": d.get("revision")},
            f"is {have or 'missing'}; the revision event has {want}",
        )
    _check_counts(conn, version, counts)
    _check_audiences(log_source, conn, version, head, component_version)


def _count(conn: Connection, query: Any) -> int:
    return int(conn.execute(sa.select(sa.func.count()).select_from(query.subquery())).scalar_one())


def _check_counts(conn: Connection, version: int, counts: Mapping[str, Any]) -> None:
    act, grant, aud = CATALOG_ACTIVATION.physical, CATALOG_GRANT.physical, CATALOG_AUDIENCE.physical
    open_grants = (grant.c.view_version == version, grant.c.to_revision == OPEN)
    found = {
        "activations": (
            CATALOG_ACTIVATION,
            _count(
                conn,
                sa.select(act.c.pack).where(
                    act.c.view_version == version, act.c.to_revision == OPEN
                ),
            ),
        ),
        "grants": (CATALOG_GRANT, _count(conn, sa.select(grant.c.pack).where(*open_grants))),
        "facts": (
            CATALOG_GRANT,
            _count(
                conn,
                sa.select(grant.c.pack, grant.c.install_id, grant.c.kind, grant.c.key)
                .where(*open_grants)
                .distinct(),
            ),
        ),
        "audiences": (
            CATALOG_AUDIENCE,
            _count(
                conn,
                sa.select(aud.c.audience_kind).where(
                    aud.c.view_version == version, aud.c.to_revision == OPEN
                ),
            ),
        ),
    }
    for what, (table, number) in found.items():
        if number != counts.get(what):
            raise _differs(
                CatalogView.name,
                table,
                {"to_revision": "open"},
                f"holds {number} {what} in force; the revision event counts {counts.get(what)}",
            )


def _check_audiences(
    log_source: LogSource,
    conn: Connection,
    version: int,
    head: Decoded,
    component_version: int | None,
) -> None:
    aud = CATALOG_AUDIENCE.physical
    rows = _rows(conn, CATALOG_AUDIENCE, version, aud.c.to_revision == OPEN)
    pairs = [(_text(r.audience_kind) or "", _text(r.audience_id) or "") for r in rows]
    if head.data.get("audiences_root") is not None:  # format v2: one event per audience view
        ids = {pair: published_view_id(*pair) for pair in pairs}
        last = log_source.last_events(conn, list(ids.values()))
        committed: dict[tuple[str, str], Any] = {}
        for pair, ident in ids.items():
            event = last.get(ident)
            if event is not None and event.type == T_VIEW_PUBLISHED:
                committed[pair] = event.data.get("digest")
    else:  # format v1: the revision events list the audiences they changed
        committed = _v1_digests(log_source, conn, head.position)
    served = _served_digests(conn, version, component_version)
    for row, pair in zip(rows, pairs, strict=True):
        if _text(row.digest) != committed.get(pair):
            raise _differs(
                CatalogView.name,
                CATALOG_AUDIENCE,
                {"audience": f"{pair[0]}:{pair[1]}"},
                "has another digest than the one the log committed for the audience",
            )
        # What a reader would serve this audience must digest to what the log committed
        # (R19): a grant row the kernel rewrote changes it, though counts and the
        # audience row stay as the log says.
        if served is not None and pair in served and served[pair] != committed.get(pair):
            raise _differs(
                CatalogView.name,
                CATALOG_GRANT,
                {"audience": f"{pair[0]}:{pair[1]}", "to_revision": "open"},
                "serve another content than the digest the log committed for the audience",
            )


def _served_digests(
    conn: Connection, version: int, component_version: int | None
) -> dict[tuple[str, str], str] | None:
    """Each audience's digest over the grants in force and their facts, as the reader
    computes it (``projections.reader_checks``); None without a component view."""
    if component_version is None:
        return None
    g, c = CATALOG_GRANT.physical, PACK_COMPONENT.physical
    query = (
        sa.select(
            g.c.audience_kind,
            g.c.audience_id,
            g.c.pack,
            g.c.kind,
            g.c.key,
            g.c.credential_set,
            g.c.install_id,
            g.c.payload_hash,
            c.c.fact_digest,
        )
        .select_from(
            g.outerjoin(
                c,
                sa.and_(
                    c.c.view_version == component_version,
                    c.c.pack == g.c.pack,
                    c.c.install_id == g.c.install_id,
                    c.c.kind == g.c.kind,
                    c.c.key == g.c.key,
                ),
            )
        )
        .where(g.c.view_version == version, g.c.to_revision == OPEN)
    )
    grouped: dict[tuple[bytes, bytes], list[tuple[Any, ...]]] = {}
    for row in conn.execute(query):
        grouped.setdefault((row[0], row[1]), []).append(tuple(row[2:]))
    served: dict[tuple[str, str], str] = {}
    for (kind_b, ident_b), grants in grouped.items():
        pair = (_text(kind_b) or "", _text(ident_b) or "")
        edges: list[list[Any]] = []
        facts: dict[tuple[str, str, str, str], str] = {}
        for pack, kind, key, cred, install, _hash, fact_digest in sorted_grants(pair, grants):
            # A cell that is not text (an edited row) digests as "": the digest differs.
            p, k, name, i = (_text(v) or "" for v in (pack, kind, key, install))
            edges.append([p, k, name, _text(cred) or None, i])
            if type(fact_digest) is bytes:
                facts[(p, i, k, name)] = fact_digest.hex()
        served[pair] = audience_digest(pair, edges, [[*f, facts[f]] for f in sorted(facts)])
    return served


def _v1_digests(log_source: LogSource, conn: Connection, upto: int) -> dict[tuple[str, str], Any]:
    digests: dict[tuple[str, str], Any] = {}
    topics = sorted(stored_topics(frozenset({T_PUBLISHED})))
    for position, topic, state in log_source.scan(conn, after=0, upto=upto, topics=topics):
        _type, data = decode_state(position, topic, state)
        for kind, ident, value in data.get("audiences") or ():
            digests[(kind, ident)] = value
    return digests
