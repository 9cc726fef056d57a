"""``import --jsonl``: load an ``export --jsonl`` into an empty store, byte for byte.

Backup, restore and moving a store between engines are one operation: the
export of one store is the whole log (schema/LOG-FORMAT.md, "Export"), and
importing it into an empty store on any engine writes the same rows: the
same positions, aggregate ids, versions, topics, the exact stored state bytes
(``state_b64``), the same event ids and chain. Nothing is trusted: every line
is checked as it streams by, before anything is committed —

* its shape (JSON object, every field of its type): INVALID naming the line
  and the field;
* its position (1, 2, 3 … with no gap), its ``event_id`` recomputed from its
  bytes, its chain link from the previous line, its topic (a type this
  release reads, R23: unknown types fail closed as in ``audit verify``), its
  state (a JSON object, equal to the line's decoded ``state``) and its
  aggregate version (above the aggregate's previous one): INTEGRITY naming
  the line and the position.

All rows go in through one write transaction (executemany in batches), with
the head row locked from the emptiness check to the commit: the first bad
line rolls everything back and the store is left empty. Views are not
touched here; the caller rebuilds them from the imported log (the existing
blue/green rebuild).

The target keeps its own ``store_id`` (``ledger_meta``): it is a different
store holding the same log. The checkpoint origin is the log's (its
``log.named`` event, imported like any row; R29), so the restored store signs
the same tree under the same origin; a log exported before it was named takes
the target's store origin until ``audit origin --name --origin`` restores the
pinned one. The export's checkpoint lines (the latest cosigned checkpoints) are
checked against the loaded log and written back (``carried_checkpoints``).

A 0.1 export has no ``state_b64``: its state bytes are then the canonical
encoding (orjson, sorted keys) of its ``state``, which is how 0.1 wrote
them. That is a re-serialization, but a checked one: the stated ``event_id``
covers the bytes, so a line imports only if the re-encoded bytes are exactly
the ones that were stored.
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
import stat
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any
from uuid import UUID

import orjson
import sqlalchemy as sa

from domain import merkle
from domain.catalog import catalog_id
from domain.digests import ZERO_CHAIN, Purpose, hasher
from domain.errors import IntegrityFailure, InvalidInput
from domain.event_types import (
    EVENT_TYPES,
    T_LOG_NAMED,
    T_LOG_RENAMED,
    T_PUBLISHED,
    StoredType,
    UnknownEventType,
)
from domain.origin import default_origin, log_identity_id
from ledger.log import tables as schema
from ledger.log.checkpoint_line import CheckpointLine, is_checkpoint_line
from ledger.log.trailer import Trailer, is_trailer
from ledger.store import carried_checkpoints
from ledger.store.runtime import Ledger

#: Rows per executemany: large enough to amortize round trips, small enough that
#: a batch's parameters stay far below MySQL's max_allowed_packet.
BATCH = 1000
#: (bytes or characters read so far, total when known else the same number)
Progress = Callable[[int, int], None]

#: The longest line accepted (an event state of this size is far beyond any pack or
#: catalog this store accepts): a stream without newlines is refused, not buffered.
MAX_LINE = 1 << 30
_MAX_INT = 2**63 - 1
_MISSING = object()


def read_lines(
    handle: IO[bytes] | IO[str], *, name: str, limit: int = MAX_LINE
) -> Iterator[bytes | str]:
    """The lines of an export file or stream, each at most ``limit`` long.

    Read errors (a directory, a stream that cannot be read) and an over-long line
    are INVALID naming ``file``, never a traceback; a device such as ``/dev/zero``
    is refused before anything is read.
    """
    try:
        mode = os.fstat(handle.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        mode = None  # an in-memory stream
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        raise InvalidInput(
            f"{name} is not a file or a pipe; give an `export --jsonl` file", field="file"
        )
    return _lines(handle, name, limit)


def _lines(handle: IO[bytes] | IO[str], name: str, limit: int) -> Iterator[bytes | str]:
    number = 0
    while True:
        try:
            line = handle.readline(limit + 1)
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"cannot read {name}: {exc}", field="file") from None
        if not line:
            return
        number += 1
        if len(line) > limit:
            raise InvalidInput(
                f"line {number} of {name} is longer than {limit} bytes", field="line", line=number
            )
        yield line


@dataclass(frozen=True)
class Restored:
    """What an import wrote: the log's size, its chain head and its Merkle root."""

    imported: int
    head_position: int
    chain: bytes
    root: bytes


def _invalid(line: int, key: str, problem: str) -> InvalidInput:
    return InvalidInput(f"line {line}: {key} {problem}", field=key, line=line)


def _integrity(line: int, position: int, check: str, problem: str) -> IntegrityFailure:
    return IntegrityFailure(
        f"line {line} (position {position}): {problem}; nothing was imported",
        line=line,
        position=position,
        check=check,
    )


def _int(doc: dict[str, Any], key: str, line: int) -> int:
    value = doc.get(key, _MISSING)
    if type(value) is not int:
        raise _invalid(line, key, f"must be an integer, found {_kind(value)}")
    if not 1 <= value <= _MAX_INT:
        raise _invalid(line, key, f"must be between 1 and 2^63-1, found {value}")
    return value


def _text(doc: dict[str, Any], key: str, line: int) -> str:
    value = doc.get(key, _MISSING)
    if not isinstance(value, str):
        raise _invalid(line, key, f"must be a string, found {_kind(value)}")
    return value


def _hex32(doc: dict[str, Any], key: str, line: int) -> bytes:
    text = _text(doc, key, line)
    try:
        value = bytes.fromhex(text)
    except ValueError:
        value = b""
    if len(value) != 32 or value.hex() != text:
        raise _invalid(line, key, "must be 64 lowercase hex digits (32 bytes)")
    return value


def _kind(value: object) -> str:
    """How a JSON value is named in a message (``found null``, ``found a string``)."""
    if value is _MISSING:
        return "nothing (the field is missing)"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    if value is None:
        return "null"
    return names.get(type(value), "an array" if isinstance(value, list) else "an object")


def _state_bytes(doc: dict[str, Any], line: int) -> bytes:
    """The exact stored state bytes of a line (``state_b64``; 0.1 exports: see module doc)."""
    if "state_b64" not in doc:
        state = doc.get("state")
        if not isinstance(state, dict):
            raise _invalid(line, "state_b64", "is missing (and state is not a JSON object)")
        return orjson.dumps(state, option=orjson.OPT_SORT_KEYS)
    text = _text(doc, "state_b64", line)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _invalid(line, "state_b64", "is not padded base64 (RFC 4648)") from None
    if base64.b64encode(data).decode("ascii") != text:
        raise _invalid(line, "state_b64", "is not canonical padded base64 (RFC 4648)")
    return data


@dataclass(frozen=True)
class _Row:
    position: int
    aggregate: bytes
    version: int
    topic: bytes
    state: bytes
    event_id: bytes
    chain: bytes
    doc: dict[str, Any]


def _document(raw: bytes | str, line: int) -> dict[str, Any]:
    """One line as a JSON object; INVALID naming the line otherwise."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(
            f"line {line}: not a JSON document ({exc})", field="line", line=line
        ) from None
    if not isinstance(doc, dict):
        raise InvalidInput(
            f"line {line}: not a JSON object (an export line is one event object)",
            field="line",
            line=line,
        )
    return doc


def _parse(doc: dict[str, Any], line: int) -> _Row:
    """One event line's fields, typed; INVALID naming the line and the field otherwise."""
    position = _int(doc, "position", line)
    agg_text = _text(doc, "aggregate_id", line)
    digits = agg_text.replace("-", "")
    try:
        aggregate = bytes.fromhex(digits)
    except ValueError:
        aggregate = b""
    if (
        len(agg_text) != 36
        or len(aggregate) != 16
        or aggregate.hex() != digits
        or agg_text[8] + agg_text[13] + agg_text[18] + agg_text[23] != "----"
    ):
        raise _invalid(line, "aggregate_id", "is not a canonical lowercase hyphenated UUID")
    version = _int(doc, "version", line)
    topic_text = _text(doc, "topic", line)
    topic = topic_text.encode("utf-8")
    if not 1 <= len(topic) <= 255:
        raise _invalid(line, "topic", "must be 1-255 bytes of UTF-8")
    event = _hex32(doc, "event_id", line)
    chain = _hex32(doc, "chain", line)
    state = _state_bytes(doc, line)
    return _Row(position, aggregate, version, topic, state, event, chain, doc)


@functools.lru_cache(maxsize=1024)
def _resolve(topic: bytes) -> StoredType:
    """The type of a topic, once per distinct topic (a log has a few dozen)."""
    return EVENT_TYPES.resolve(topic)


def _check_meaning(row: _Row, line: int) -> None:
    """After the bytes verify: the topic is a type this release reads (unknown types fail
    closed, as in ``audit verify``), its state is a JSON object, and the line's derived
    fields say what its stored bytes say (an edited ``state`` or ``type`` would mislead
    whoever reads the export)."""
    try:
        stored = _resolve(row.topic)
    except UnknownEventType as exc:
        raise _integrity(
            line, row.position, "type", f"{exc.message} (a type this release cannot read)"
        ) from None
    try:
        decoded = orjson.loads(row.state)
    except orjson.JSONDecodeError:
        decoded = None
    if not isinstance(decoded, dict):
        raise _integrity(
            line, row.position, "state", "the state of a known event type is not a JSON object"
        )
    doc = row.doc
    if "state" in doc and doc["state"] != decoded:
        raise _integrity(line, row.position, "state", "state differs from the bytes in state_b64")
    if doc.get("state_hex") is not None:
        raise _integrity(line, row.position, "state", "state_hex is set for a JSON state")
    labels = (
        ("format", stored.format),
        ("type", stored.type.name),
        ("type_version", stored.version),
    )
    for key, want in labels:
        if key in doc and (doc[key] != want or type(doc[key]) is not type(want)):
            raise _integrity(
                line,
                row.position,
                "type",
                f"{key} says {doc[key]!r} but the topic {row.topic.decode()!r} is {want!r}",
            )


def import_jsonl(
    ledger: Ledger,
    lines: Iterable[bytes | str],
    *,
    total: int | None = None,
    progress: Progress | None = None,
    batch: int = BATCH,
    legacy_no_trailer: bool = False,
) -> Restored:
    """Import every line of an export into this empty store, in one transaction.

    ``lines`` is the export's lines (a file opened in binary mode streams them);
    ``total`` its size for ``progress(done, total)``, in the units of ``len(line)``.
    Raises INVALID (``db``) when the store is not empty, INVALID (a line's field)
    or INTEGRITY (a line's position/bytes/type) at the first bad line: then
    nothing is written. The file must end with its trailer (``ledger.log.trailer``),
    matching what was loaded: a file without one (cut short, or written before the
    trailer existed) is INTEGRITY naming ``trailer`` unless ``legacy_no_trailer``
    accepts its absence; an empty file is always refused.
    """
    db = ledger.db
    trailer: Trailer | None = None
    trailer_line = 0
    p = "?" if db.is_sqlite else "%s"
    ev, hd = schema.events.name, schema.head.name
    insert = (
        f"INSERT INTO {ev} (position, aggregate_id, version, topic, state, event_id, chain)"
        f" VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p})"
    )
    copy_event, copy_chain = hasher(Purpose.EVENT_ID).copy, hasher(Purpose.CHAIN).copy
    u64 = _u64
    tree = merkle.MerkleStack()
    last_version: dict[bytes, int] = {}
    chain, position, done = ZERO_CHAIN, 0, 0
    pending: list[tuple[Any, ...]] = []
    carried: list[tuple[CheckpointLine, int]] = []
    identity: dict[bytes, str | None] = {_LOG_ID: None, _CATALOG_ID: None}
    catalog_ids: list[bytes] = []
    with db.write() as conn:
        head = ledger.recorder.lock_head(conn)  # held until commit: appends wait
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(f"SELECT position FROM {ev} ORDER BY position LIMIT 1")
            first = cursor.fetchone()
            if head.position != 0 or head.chain != ZERO_CHAIN or first is not None:
                raise InvalidInput(
                    f"the target store is not empty (head at position {head.position}"
                    f"{', events stored' if first is not None else ''}); import loads an "
                    "export into a freshly initialized store only",
                    field="db",
                    head_position=head.position,
                )
            # Derived Merkle subtrees of whatever log was here before: never of this one.
            cursor.execute(f"DELETE FROM {schema.merkle.name}")
            number = 0
            for number, raw in enumerate(lines, start=1):
                done += len(raw)
                doc = _document(raw, number)
                if trailer is not None:
                    raise _after_trailer(number, trailer_line, is_trailer(doc))
                if is_trailer(doc):
                    trailer, trailer_line = Trailer.parse(doc, line=number), number
                    continue
                if is_checkpoint_line(doc):
                    carried.append((CheckpointLine.parse(doc, line=number), number))
                    continue
                if carried:
                    raise _integrity(
                        number,
                        position + 1,
                        "checkpoint",
                        f"an event line after the checkpoint line at line {carried[0][1]} "
                        "(checkpoint lines follow every event line)",
                    )
                row = _parse(doc, number)
                position += 1
                if row.position != position:
                    raise _integrity(
                        number,
                        position,
                        "position",
                        f"expected position {position}, found {row.position} (a line is "
                        "missing, duplicated or out of order)",
                    )
                h = copy_event()
                h.update(
                    u64(16)
                    + row.aggregate
                    + u64(8)
                    + u64(row.version)
                    + u64(len(row.topic))
                    + row.topic
                    + u64(len(row.state))
                )
                h.update(row.state)
                if h.digest() != row.event_id:
                    raise _integrity(
                        number,
                        position,
                        "event_id",
                        "the stated event_id does not match the line's aggregate id, version, "
                        "topic and state bytes",
                    )
                c = copy_chain()
                c.update(chain + row.event_id)
                chain = c.digest()
                if chain != row.chain:
                    raise _integrity(
                        number,
                        position,
                        "chain",
                        "the stated chain does not follow from the previous line's chain and "
                        "this event_id",
                    )
                _check_meaning(row, number)
                previous = last_version.get(row.aggregate, 0)
                if row.version <= previous:
                    raise _integrity(
                        number,
                        position,
                        "version",
                        f"aggregate {UUID(bytes=row.aggregate)} is at version {previous} "
                        f"already; version {row.version} repeats or goes back",
                    )
                last_version[row.aggregate] = row.version
                if row.aggregate in identity:  # the log's name and the catalog log's leaves
                    _note_identity(row, identity, catalog_ids)
                tree.add(merkle.leaf_hash(row.event_id))
                pending.append(
                    (
                        position,
                        row.aggregate,
                        row.version,
                        row.topic,
                        row.state,
                        row.event_id,
                        row.chain,
                    )
                )
                if len(pending) >= batch:
                    cursor.executemany(insert, pending)
                    pending.clear()
                    if progress is not None:
                        progress(done, max(total or 0, done))
            if pending:
                cursor.executemany(insert, pending)
            root = tree.root()
            if number == 0:
                raise IntegrityFailure(
                    "the file is empty: no events and no trailer (every export ends with a "
                    "trailer line, an empty store's too); nothing was imported",
                    line=1,
                    field="file",
                    check="trailer",
                )
            if trailer is None:
                if not legacy_no_trailer:
                    raise _missing_trailer(number, position)
            else:
                _check_trailer(trailer, trailer_line, position, chain, root)
                if trailer.checkpoints != len(carried):
                    raise IntegrityFailure(
                        f"line {trailer_line}: the trailer counts {trailer.checkpoints} "
                        f"checkpoint line(s) but {len(carried)} precede it (lines are missing "
                        "or added); nothing was imported",
                        line=trailer_line,
                        field="trailer.checkpoints",
                        check="trailer",
                    )
            carried_checkpoints.check_and_write(
                conn,
                carried,
                origin=identity.get(_LOG_ID) or store_origin_in(conn),
                size=position,
                main_root_at=lambda size: _root_at(cursor, size),
                catalog_ids=catalog_ids,
            )
            if position:
                cursor.execute(
                    f"UPDATE {hd} SET position = {p}, chain = {p} WHERE id = 1", (position, chain)
                )
        finally:
            cursor.close()
    if progress is not None:
        progress(done, max(total or 0, done))
    return Restored(imported=position, head_position=position, chain=chain, root=root)


def _after_trailer(line: int, trailer_line: int, second: bool) -> IntegrityFailure:
    what = "a second trailer" if second else "an event line"
    return IntegrityFailure(
        f"line {line}: {what} after the trailer at line {trailer_line} (the trailer is the "
        "last line of an export: this file was edited or joined); nothing was imported",
        line=line,
        field="trailer",
        check="trailer",
        trailer_line=trailer_line,
    )


def _missing_trailer(lines: int, position: int) -> IntegrityFailure:
    return IntegrityFailure(
        f"line {lines + 1}: no trailer: the file ends after line {lines} (position "
        f"{position}) without the trailer line every export ends with, so it may have been "
        "cut short; nothing was imported. An export written before the trailer existed "
        "(catalog-ledger 0.1 and 0.2) has none: import it with --legacy-no-trailer, which "
        "accepts a file without a trailer and cannot detect a cut at a line boundary",
        line=lines + 1,
        field="trailer",
        check="trailer",
    )


def _check_trailer(trailer: Trailer, line: int, position: int, chain: bytes, root: bytes) -> None:
    """The trailer says what was loaded: INTEGRITY naming the first field that differs."""
    if trailer.damaged:
        raise IntegrityFailure(
            f"line {line}: the trailer says {trailer.damaged} row(s) of the exported store "
            "were damaged (the export exited 6); nothing was imported",
            line=line,
            field="trailer.damaged",
            check="trailer",
        )
    loaded: tuple[tuple[str, object, object, str], ...] = (
        ("count", trailer.count, position, f"{position} event lines precede it"),
        ("head_position", trailer.head_position, position, f"the last line is at {position}"),
        ("head_chain", trailer.head_chain, chain, f"the lines chain to {chain.hex()}"),
        (
            "root",
            trailer.root,
            root,
            f"their Merkle root is {base64.b64encode(root).decode('ascii')}",
        ),
    )
    for key, stated, actual, says in loaded:
        if stated != actual:
            shown = stated.hex() if isinstance(stated, bytes) else stated
            if key == "root" and isinstance(stated, bytes):
                shown = base64.b64encode(stated).decode("ascii")
            raise IntegrityFailure(
                f"line {line}: the trailer's {key} is {'null' if shown is None else shown} but "
                f"{says} (lines are missing, added or changed); nothing was imported",
                line=line,
                field=f"trailer.{key}",
                check="trailer",
            )


_u64 = struct.Struct(">Q").pack
_LOG_ID = log_identity_id().bytes
_CATALOG_ID = catalog_id().bytes


def _note_identity(row: _Row, identity: dict[bytes, str | None], catalog_ids: list[bytes]) -> None:
    """The log's origin (its last ``log.named`` / ``log.renamed``) and the catalog log's
    leaves (the event ids of ``catalog.published``), as the rows stream by (the row is
    checked already)."""
    name = _resolve(row.topic).type.name
    if row.aggregate == _LOG_ID and name in (T_LOG_NAMED, T_LOG_RENAMED):
        identity[_LOG_ID] = str(orjson.loads(row.state)["origin"])
    elif row.aggregate == _CATALOG_ID and name == T_PUBLISHED:
        catalog_ids.append(row.event_id)


def _root_at(cursor: Any, size: int) -> bytes:
    """The Merkle root of the first ``size`` imported rows (read back in the import's
    own transaction): for a carried checkpoint of the main log."""
    tree = merkle.MerkleStack()
    cursor.execute(
        f"SELECT event_id FROM {schema.events.name} WHERE position <= {int(size)} ORDER BY position"
    )
    for (event,) in cursor.fetchall():
        tree.add(merkle.leaf_hash(bytes(event)))
    return tree.root()


def store_origin_in(conn: Any) -> str:
    """The target's own origin (``catalog-ledger/<store id>``): a log without ``log.named``."""
    found = conn.execute(
        sa.select(schema.meta.c.value).where(schema.meta.c.name == b"store_id")
    ).scalar()
    return default_origin(bytes(found).decode() if found is not None else "")
