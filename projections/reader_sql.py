"""The runtime reader's SQL: the serving state, the whole view read, and the log seeks.

Each text is one statement, so each read is one consistent snapshot on every engine
(``projections.reader`` runs them and checks what they return against the log).
"""

from __future__ import annotations

from projections.framework import Projection
from projections.views.catalog import CatalogView
from projections.views.pack_activation import PackActivationView
from projections.views.pack_component import PackComponentView
from projections.views.pack_generation import PackGenerationView


def _code(name: str) -> str:
    return f"MAX(CASE WHEN name = X'{name.encode().hex()}' THEN code_version END)"


#: The view code versions this program serves (R25), in the order the statement reads them.
SERVED: tuple[type[Projection], ...] = (
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

#: Where a row's grant columns start (after the header), and the log head's column.
GRANT_COLUMN = 17
HEAD_COLUMN = 16


def state_sql() -> str:
    """``_STATE_SQL`` for the four served views."""
    return _STATE_SQL.format(
        views=_VIEWS,
        **{
            f"{short}{suffix}": column(name)
            for short, name in _SHORT.items()
            for suffix, column in (("", _live), ("_code", _code), ("_pos", _position))
        },
    )


def view_sql(sqlite: bool) -> str:
    """``_VIEW_SQL`` with the engine's parameter mark and quoting of ``key``."""
    return _VIEW_SQL.format(
        p="?" if sqlite else "%s", key='"key"' if sqlite else "`key`", state=state_sql()
    )


def lineage_sql(mark: str) -> str:
    return _LINEAGE_SQL.format(p=mark)


def log_sql(mark: str, count: int) -> str:
    """``_LOG_SQL`` for ``count`` aggregates."""
    return _LOG_SQL.format(ids=", ".join([mark] * count))
