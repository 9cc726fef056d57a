"""A rebuilt version checked against what the log commits, before it is swapped in (R28).

A rebuild replays each view through its kernel, an optimized transcription of the
view's ``apply``. A kernel that raises is replaced by ``apply``; one that silently
writes other rows would go live unless something independent of it disagrees. This
module is that something: inside the swap transaction (the head locked, the tail
applied), the new versions are compared with the values the log itself carries, read
with one index seek per aggregate, never through a view:

* **activations**: each pack's activation pointer row is its pointer aggregate's last
  event (install id, epoch, revision, payload hash, position), and no pack the log has
  no live pointer for has one; the generation a live pointer selects has the status,
  epoch and applied payload hash of that generation's last event (R13);
* **the revision's counts**: the catalog's head revision row is the last
  ``catalog.published`` event (revision, content digest, the four counts), and the rows
  in force are as many activations, grants, facts and audiences as those counts say;
* **audience digests**: every audience's digest in force is the one its last
  ``audience_view.published`` event (format v2) or the lineage's revision events
  (format v1) committed.

A difference raises ``IntegrityFailure`` naming the view, table and key: the swap's
transaction rolls back and the rebuild is abandoned; the live views stay. Cost: one
seek per pack (two for official packs) and per audience, and four counts; the replay
itself is untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain.catalog import catalog_id, published_view_id
from domain.errors import IntegrityFailure
from domain.event_types import (
    T_ACTIVATED,
    T_FAILED,
    T_PREPARED,
    T_PUBLISHED,
    T_REMOVED,
    T_RETIRED,
    T_VIEW_PUBLISHED,
    Decoded,
    decode_state,
)
from domain.lifecycle import activation_id, generation_id
from projections.framework import Projection, stored_topics
from projections.ports import LogSource
from projections.tables import ViewTable
from projections.views.catalog import (
    CATALOG_ACTIVATION,
    CATALOG_AUDIENCE,
    CATALOG_GRANT,
    CATALOG_REVISION,
    OPEN,
    CatalogView,
)
from projections.views.cells import ACTIVE, FAILED_CLEAN, FAILED_DIRTY, PREPARING, RETIRED
from projections.views.pack_activation import PACK_ACTIVATION, PackActivationView
from projections.views.pack_generation import PACK_GENERATION, PackGenerationView


def check_built(
    log_source: LogSource,
    conn: Connection,
    chosen: Sequence[Projection],
    versions: Mapping[str, int],
) -> None:
    """Compare the versions ``versions`` (view name -> version) of the ``chosen`` views
    with what the log commits at its head; ``versions`` also names the live version of
    the views they are read beside. Raises ``IntegrityFailure`` at the first difference."""
    names = {p.name for p in chosen}
    if names & {PackActivationView.name, PackGenerationView.name}:
        _check_pointers(
            log_source,
            conn,
            versions.get(PackActivationView.name) if PackActivationView.name in names else None,
            versions.get(PackGenerationView.name),
            check_generations=PackGenerationView.name in names,
        )
    if CatalogView.name in names:
        _check_catalog(log_source, conn, versions[CatalogView.name])


def _differs(view: str, table: ViewTable, key: dict[str, Any], problem: str) -> IntegrityFailure:
    return IntegrityFailure(
        f"the rebuilt view {view} does not match the log: {table.name} {key} {problem}; "
        "nothing was swapped in and the live views are untouched (a rebuild kernel "
        "disagrees with its view's apply: `catalog-ledger projections verify` after a "
        "rebuild with that view's kernel fixed)",
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


# -- activations ---------------------------------------------------------------------------


def _check_pointers(
    log_source: LogSource,
    conn: Connection,
    activation_version: int | None,
    generation_version: int | None,
    *,
    check_generations: bool,
) -> None:
    """Activation rows against each pointer's last event; the selected generations'
    rows against their own last events (R13)."""
    pointers: dict[str, Any] = {}
    if activation_version is not None:
        pointers = {
            _text(r.pack) or "": r for r in _rows(conn, PACK_ACTIVATION, activation_version)
        }
    packs = set(pointers)
    if generation_version is not None:
        gen = PACK_GENERATION.physical
        packs.update(
            _text(pack) or ""
            for (pack,) in conn.execute(
                sa.select(gen.c.pack).where(gen.c.view_version == generation_version).distinct()
            )
        )
    last = log_source.last_events(conn, [activation_id(p) for p in sorted(packs)])
    selected: dict[str, Decoded] = {}
    for pack in sorted(packs):
        event = last.get(activation_id(pack))
        if event is not None and event.type not in PackActivationView.types:
            continue  # not a pointer move: the view keeps what the last one wrote
        live = event is not None and event.type != T_REMOVED
        if live:
            assert event is not None
            selected[pack] = event
        if activation_version is None:
            continue
        row = pointers.get(pack)
        if row is None and not live:
            continue
        key = {"pack": pack}
        if row is None or not live:
            problem = "has no row for a live pointer" if row is None else "has a row"
            if row is not None:
                problem += " for a pack whose pointer selects nothing"
            raise _differs(PackActivationView.name, PACK_ACTIVATION, key, problem)
        assert event is not None
        d = event.data
        want = (d.get("install_id"), d.get("epoch"), d.get("revision"), d.get("payload_hash"))
        have = (_text(row.install_id), row.epoch, _text(row.revision), _text(row.payload_hash))
        if have != want or row.position != event.position:
            raise _differs(
                PackActivationView.name,
                PACK_ACTIVATION,
                key,
                f"is {have} at position {row.position}; the pointer's last event "
                f"(position {event.position}) has {want}",
            )
    if check_generations and generation_version is not None and selected:
        _check_selected_generations(log_source, conn, generation_version, selected)


#: A generation's status after its last event (``failed`` depends on ``dirty``).
_STATUS = {T_PREPARED: PREPARING, T_ACTIVATED: ACTIVE, T_RETIRED: RETIRED}


def _check_selected_generations(
    log_source: LogSource, conn: Connection, version: int, selected: Mapping[str, Decoded]
) -> None:
    wanted = {
        (pack, str(event.data.get("install_id"))): generation_id(
            pack, str(event.data.get("install_id"))
        )
        for pack, event in selected.items()
    }
    last = log_source.last_events(conn, list(wanted.values()))
    gen = PACK_GENERATION.physical
    rows: dict[tuple[str, str], Any] = {}
    keys = sorted(wanted)
    for start in range(0, len(keys), 500):
        chunk = [(p.encode(), i.encode()) for p, i in keys[start : start + 500]]
        for r in _rows(
            conn, PACK_GENERATION, version, sa.tuple_(gen.c.pack, gen.c.install_id).in_(chunk)
        ):
            rows[(_text(r.pack) or "", _text(r.install_id) or "")] = r
    for ident in keys:
        event = last.get(wanted[ident])
        if event is None or event.type not in PackGenerationView.types:
            continue  # the log's own inconsistency (R13) is the reader's to report
        row = rows.get(ident)
        key = {"pack": ident[0], "install_id": ident[1]}
        if row is None:
            raise _differs(
                PackGenerationView.name, PACK_GENERATION, key, "has no row for the generation"
            )
        d = event.data
        status = (
            (FAILED_DIRTY if d.get("dirty") else FAILED_CLEAN)
            if event.type == T_FAILED
            else _STATUS[event.type]
        )
        problem = None
        if bytes(row.status) != status:
            problem = f"has status {_text(row.status)}; the generation's last event is {event.type}"
        elif event.type == T_ACTIVATED and (
            row.epoch != d.get("epoch")
            or _text(row.applied_payload_hash) != d.get("applied_payload_hash")
        ):
            problem = "has another epoch or applied payload hash than its activation event"
        if problem is not None:
            raise _differs(PackGenerationView.name, PACK_GENERATION, key, problem)


# -- the revision's counts and the audience digests ---------------------------------------------


def _check_catalog(log_source: LogSource, conn: Connection, version: int) -> None:
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
    _check_audiences(log_source, conn, version, head)


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


def _check_audiences(log_source: LogSource, conn: Connection, version: int, head: Decoded) -> None:
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
    for row, pair in zip(rows, pairs, strict=True):
        if _text(row.digest) != committed.get(pair):
            raise _differs(
                CatalogView.name,
                CATALOG_AUDIENCE,
                {"audience": f"{pair[0]}:{pair[1]}"},
                "has another digest than the one the log committed for the audience",
            )


def _v1_digests(log_source: LogSource, conn: Connection, upto: int) -> dict[tuple[str, str], Any]:
    digests: dict[tuple[str, str], Any] = {}
    topics = sorted(stored_topics(frozenset({T_PUBLISHED})))
    for position, topic, state in log_source.scan(conn, after=0, upto=upto, topics=topics):
        _type, data = decode_state(position, topic, state)
        for kind, ident, value in data.get("audiences") or ():
            digests[(kind, ident)] = value
    return digests
