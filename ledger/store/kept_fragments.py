"""``publish_fragment``: the fragments of the revision in force, kept for the next publish.

One row per fragment (``publisher.fragments``): section (1 activations, 2 facts,
3 grants), unit key, entry count and canonical body; and one marker row (section 0)
naming the revision they are the content of and its content digest.

Derived data, like ``ledger_merkle``: nothing trusts it. ``read`` returns the fragments
only when the marker names the parent revision *and* the fragments digest to the
parent's content digest, read from the catalog view; anything else (no table, an
older revision, a row edited or lost) is a miss, and the publication digests the
revision from the views instead, as a full build would, writing the fragments anew.
They are written in the revision's own append transaction, so they never name a
revision that did not commit. A store without the table (one initialized before it
existed) publishes without it until ``init`` or ``doctor --repair`` creates it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ledger.log.append import Precommit
from ledger.log.db import stream_rows
from ledger.log.sqltypes import KEYS_PER_STATEMENT, Binary, Blob, keys_in
from ledger.observability import get_logger
from projections import checks

if TYPE_CHECKING:  # the publisher is imported by the commands that publish (issue 25.7)
    from publisher.fragments import Fragment, Fragments, Unit

metadata = sa.MetaData()

FRAGMENTS = sa.Table(
    "publish_fragment",
    metadata,
    sa.Column("section", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("unit_a", Binary(255), primary_key=True),
    sa.Column("unit_b", Binary(255), primary_key=True),
    sa.Column("entries", sa.BigInteger(), nullable=False),
    sa.Column("body", Blob(), nullable=False),
)

#: The marker row's section; a fragment of section ``s`` (``publisher.fragments``) is
#: stored as section ``s + 1``.
_MARKER = 0
_MARKER_UNIT: Unit = (b"", b"")
#: Rows per INSERT batch.
_BATCH = 500
#: The largest body kept: a row far below any engine's packet limit (MariaDB's default
#: max_allowed_packet is 16 MiB). A revision with a larger fragment keeps none.
MAX_BODY = 4 << 20

log = get_logger("publish")


def present(conn: Connection) -> bool:
    """Does this store have the table (one created before it existed may not)?"""
    return sa.inspect(conn).has_table(FRAGMENTS.name)


def read(
    conn: Connection, revision: int, content_digest: str | None, counts: Mapping[str, int]
) -> Fragments | None:
    """The fragments of ``revision`` if they are whole: they digest to its
    ``content_digest`` and hold its ``counts`` (audiences, activations, facts, grants),
    each fragment its own unit's entries only."""
    if content_digest is None or not present(conn):
        return None
    from publisher.fragments import Fragments

    f = FRAGMENTS.c
    marker = conn.execute(
        sa.select(f.entries, f.body).where(
            f.section == _MARKER, f.unit_a == _MARKER_UNIT[0], f.unit_b == _MARKER_UNIT[1]
        )
    ).one_or_none()
    if marker is None or marker[0] != revision or marker[1] != content_digest.encode():
        return None
    fragments = Fragments(revision, content_digest)
    try:
        sections = fragments.sections
        for rows in stream_rows(
            conn,
            sa.select(f.section, f.unit_a, f.unit_b, f.entries, f.body).where(f.section > _MARKER),
        ):
            for section, unit_a, unit_b, entries, body in rows:
                sections[section - 1][(bytes(unit_a), bytes(unit_b))] = (int(entries), bytes(body))
        whole = not checks.on(checks.PARENT) or (
            fragments.counts() == dict(counts)
            and fragments.digest() == content_digest
            and _labelled(fragments)
        )
    except (IndexError, TypeError, ValueError):  # a row that is not what this table holds
        # (UnicodeDecodeError is a ValueError)
        whole = False
    if not whole:
        log.warning(
            "the kept catalog fragments do not digest to the parent revision; "
            "this publication reads the views instead and keeps them anew",
            extra={"revision": revision},
        )
        return None
    return fragments


def _labelled(fragments: Fragments) -> bool:
    """Does every fragment hold exactly its own unit's entries, as many as it says?

    The digest covers the bodies in key order, not the keys or the counts: a key
    edited, or entries moved from one fragment to another, is caught here. Each entry
    of a unit begins with its key's JSON (a flat array: ``["pack",`` or
    ``["kind","id",``; a quote inside a string is escaped, so that prefix only ever
    begins an entry). As many such entries as the fragment says, in every fragment,
    and as many in all as the revision holds (checked by the caller), leave no entry
    of another unit anywhere.
    """
    activations, facts, grants = fragments.sections
    if activations.keys() != facts.keys():
        return False
    for section in (activations, facts, grants):
        for (a, b), (count, body) in section.items():
            if section is grants:
                prefix = b"[" + orjson.dumps(a.decode()) + b"," + orjson.dumps(b.decode()) + b","
            elif b:
                return False
            else:
                prefix = b"[" + orjson.dumps(a.decode()) + b","
            if count < 1 or body.count(prefix) != count:
                return False
            if section is activations and count != 1:
                return False
    return True


def writer(
    fragments: Fragments, changes: tuple[Mapping[Unit, Fragment | None], ...] | None
) -> Precommit:
    """A precommit that keeps ``fragments`` (the revision being appended): only
    ``changes`` over the parent's, or (``None``) all of them in place of any kept."""

    def write(conn: Connection) -> None:
        if not present(conn):
            return
        f = FRAGMENTS.c
        written = fragments.sections if changes is None else changes
        if any(len(x[1]) > MAX_BODY for units in written for x in units.values() if x):
            conn.execute(FRAGMENTS.delete().where(f.section == _MARKER))  # none trusted
            return
        if changes is None:
            conn.execute(FRAGMENTS.delete())
            updates: list[tuple[int, Unit, Fragment | None]] = [
                (section, unit, fragment)
                for section, units in enumerate(fragments.sections)
                for unit, fragment in units.items()
            ]
        else:
            updates = [
                (section, unit, fragment)
                for section, units in enumerate(changes)
                for unit, fragment in units.items()
            ]
            for section in range(3):
                keys = [unit for s, unit, _ in updates if s == section]
                for start in range(0, len(keys), KEYS_PER_STATEMENT):
                    where = keys_in(
                        [f.section == section + 1],
                        [f.unit_a, f.unit_b],
                        keys[start : start + KEYS_PER_STATEMENT],
                    )
                    conn.execute(FRAGMENTS.delete().where(where))
            conn.execute(FRAGMENTS.delete().where(f.section == _MARKER))
        rows = [
            {
                "section": section + 1,
                "unit_a": unit[0],
                "unit_b": unit[1],
                "entries": fragment[0],
                "body": fragment[1],
            }
            for section, unit, fragment in updates
            if fragment is not None
        ]
        rows.append(
            {
                "section": _MARKER,
                "unit_a": _MARKER_UNIT[0],
                "unit_b": _MARKER_UNIT[1],
                "entries": fragments.revision,
                "body": fragments.content_digest.encode(),
            }
        )
        for start in range(0, len(rows), _BATCH):
            conn.execute(FRAGMENTS.insert(), rows[start : start + _BATCH])

    return write
