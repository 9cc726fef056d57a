"""What a witness remembers, in its own SQLite file: the last cosigned tree per log,
and the evidence of every fork it refused (R29).

The rule a witness exists for: it never cosigns two inconsistent trees of one log,
nor a smaller tree after a larger one — across restarts, and whatever the order of
concurrent requests. So the check and the update are one compare-and-swap in one
``BEGIN IMMEDIATE`` transaction (tlog-witness "add-checkpoint": checking the old size
and persisting the new checkpoint must be atomic), committed with ``synchronous=FULL``
before the cosignature leaves the process (the witness MUST persist before
responding).

A refused checkpoint that is validly signed by the log but inconsistent with what the
witness cosigned (a consistency proof that fails from the kept tree, or the kept size
with another root) is proof of log misbehaviour: it is kept in ``evidence`` with the
witness's own state and the time, in the same file.
"""

from __future__ import annotations

import base64
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from domain import merkle
from domain.errors import InvalidInput, LedgerError, Unavailable
from domain.notes import Checkpoint, add_cosignatures

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cosigned (
    origin TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    root BLOB NOT NULL,
    note TEXT NOT NULL,
    cosigned_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS evidence (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    recorded_at INTEGER NOT NULL,
    origin TEXT NOT NULL,
    reason TEXT NOT NULL,
    old_size INTEGER NOT NULL,
    proof TEXT NOT NULL,
    note TEXT NOT NULL,
    known_size INTEGER NOT NULL,
    known_root BLOB NOT NULL,
    known_note TEXT NOT NULL,
    known_cosigned_at INTEGER NOT NULL
);
"""


class SizeMismatch(LedgerError):
    """``old`` is not the size this witness last cosigned for the origin (HTTP 409)."""

    code = "CONFLICT"
    exit_code = 4

    def __init__(self, known: int) -> None:
        super().__init__(f"the witness last cosigned size {known}", known_size=known)
        self.known = known


class Unprocessable(LedgerError):
    """The checkpoint does not extend the kept tree (HTTP 422); ``evidence`` is the id
    of the evidence row when the refusal is proof of a fork."""

    code = "INTEGRITY"
    exit_code = 6

    def __init__(self, message: str, *, reason: str, evidence: int | None = None) -> None:
        super().__init__(message, reason=reason, evidence=evidence)
        self.reason = reason
        self.evidence = evidence


@dataclass(frozen=True)
class Known:
    """The last tree a witness cosigned for one log."""

    origin: str
    size: int
    root: bytes
    note: str
    cosigned_at: int


def _known(row: Sequence[Any], path: Path) -> Known:
    """A row of ``cosigned`` as read, type-checked: a hand-edited one (a root stored as
    TEXT, a negative size) is UNAVAILABLE naming the table (503), never a TypeError deep
    in a consistency check."""
    origin, size, root, note, at = row
    if not (
        isinstance(origin, str)
        and type(size) is int
        and size >= 0
        and isinstance(root, bytes)
        and len(root) == 32
        and isinstance(note, str)
        and type(at) is int
    ):
        raise Unavailable(
            f"the witness file {path}: a row of table cosigned (origin {origin!r}) is not "
            "of its declared types (size an integer >= 0, root 32 bytes): it was edited; "
            "refusing to cosign until an operator looks",
            table="cosigned",
        )
    return Known(origin, size, root, note, at)


@dataclass(frozen=True)
class Cosigned:
    line: str
    timestamp: int


Clock = Callable[[], int]
"""POSIX seconds now: the witness's only source of time (tests inject one)."""


class WitnessState:
    """The witness's SQLite file. Each call opens its own connection, so threads (the
    HTTP server's) and processes sharing the file are serialised by SQLite's lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        #: What this process last cosigned per origin: the file must never go back from
        #: it (a file edited, or replaced by an older copy, under a running witness).
        self._cosigned: dict[str, tuple[int, bytes]] = {}
        with self._connect() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise InvalidInput(
                    f"{path} is a witness file of schema {version}, this program reads "
                    f"{SCHEMA_VERSION}",
                    field="db",
                )
            db.executescript(_SCHEMA)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
        except sqlite3.Error as exc:
            raise InvalidInput(f"cannot open {self.path}: {exc}", field="db") from None
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = FULL")
            yield db
        except sqlite3.OperationalError as exc:  # locked past the timeout, disk full, ...
            raise Unavailable(f"the witness file {self.path} is unusable: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise InvalidInput(f"{self.path} is not a witness file: {exc}", field="db") from None
        finally:
            db.close()

    def known(self, origin: str) -> Known | None:
        with self._connect() as db:
            row = db.execute(
                "SELECT origin, size, root, note, cosigned_at FROM cosigned WHERE origin = ?",
                (origin,),
            ).fetchone()
        return None if row is None else _known(row, self.path)

    def advance(
        self,
        checkpoint: Checkpoint,
        note: str,
        old_size: int,
        proof: Sequence[bytes],
        *,
        cosign: Callable[[int], str],
        clock: Clock,
    ) -> Cosigned:
        """Cosign ``checkpoint`` (from its signed ``note``) if it extends what this witness
        last cosigned for its origin, from ``old_size`` with the consistency ``proof``.

        The caller has checked the log's signature and ``old_size <= checkpoint.size``.
        Raises ``SizeMismatch`` (409) or ``Unprocessable`` (422); refusals that prove a
        fork are kept as evidence in the same transaction. The new state, with the
        cosignature added to the kept note, is committed before this returns.
        """
        size, root = checkpoint.size, checkpoint.root
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    "SELECT origin, size, root, note, cosigned_at FROM cosigned WHERE origin = ?",
                    (checkpoint.origin,),
                ).fetchone()
                known = None if row is None else _known(row, self.path)
                self._check_not_rewound(checkpoint.origin, known)
                if old_size != (known.size if known else 0):
                    raise SizeMismatch(known.size if known else 0)
                if size == 0 and root != merkle.EMPTY_ROOT:
                    raise Unprocessable(
                        "a checkpoint of size 0 has the empty tree's root", reason="empty_root"
                    )
                if old_size == 0 and proof:
                    raise Unprocessable(
                        "no consistency proof is sent from size 0", reason="proof_length"
                    )
                if known is not None and old_size > 0:
                    self._check_extends(db, known, checkpoint, note, old_size, proof, clock)
                timestamp = clock()
                line = cosign(timestamp)
                kept = add_cosignatures(note, [line])
                if known is None:
                    db.execute(
                        "INSERT INTO cosigned (origin, size, root, note, cosigned_at) "
                        "VALUES (?, ?, ?, ?, ?)",
                        (checkpoint.origin, size, root, kept, timestamp),
                    )
                else:
                    swapped = db.execute(
                        "UPDATE cosigned SET size = ?, root = ?, note = ?, cosigned_at = ? "
                        "WHERE origin = ? AND size = ? AND root = ?",
                        (size, root, kept, timestamp, known.origin, known.size, known.root),
                    ).rowcount
                    assert swapped == 1, "the immediate transaction holds the write lock"
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        self._cosigned[checkpoint.origin] = (size, root)
        return Cosigned(line, timestamp)

    def _check_not_rewound(self, origin: str, known: Known | None) -> None:
        """UNAVAILABLE when the file holds less than this process cosigned for ``origin``:
        a smaller size, another root at that size, or no row. (Other processes sharing
        the file only ever move it forward.)"""
        mine = self._cosigned.get(origin)
        if mine is None:
            return
        size, root = mine
        if known is None or known.size < size or (known.size == size and known.root != root):
            found = "no tree" if known is None else f"size {known.size}"
            raise Unavailable(
                f"the witness file {self.path} holds {found} for {origin}, less than this "
                f"witness cosigned (size {size}): it was edited or replaced; refusing to "
                "cosign until an operator looks"
            )

    def _check_extends(
        self,
        db: sqlite3.Connection,
        known: Known,
        checkpoint: Checkpoint,
        note: str,
        old_size: int,
        proof: Sequence[bytes],
        clock: Clock,
    ) -> None:
        if old_size == checkpoint.size and checkpoint.root == known.root:
            if proof:
                raise Unprocessable("the same size needs an empty proof", reason="proof_length")
            return
        if old_size == checkpoint.size:  # another root: a fork, whatever the proof says
            reason, message = "root_mismatch", f"size {known.size} was cosigned with another root"
        else:
            try:
                merkle.verify_consistency(
                    old_size, checkpoint.size, proof, known.root, checkpoint.root
                )
                return
            except LedgerError as exc:
                reason = "inconsistent_tree"
                message = f"no consistency from the cosigned size {known.size}: {exc.message}"
        evidence = db.execute(
            "INSERT INTO evidence (recorded_at, origin, reason, old_size, proof, note, "
            "known_size, known_root, known_note, known_cosigned_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                clock(),
                checkpoint.origin,
                reason,
                old_size,
                "".join(base64.b64encode(h).decode() + "\n" for h in proof),
                note,
                known.size,
                known.root,
                known.note,
                known.cosigned_at,
            ),
        ).lastrowid
        db.execute("COMMIT")  # the evidence stays; nothing else was written
        raise Unprocessable(message, reason=reason, evidence=evidence)

    def evidence(self) -> list[dict[str, Any]]:
        """Every kept refusal, oldest first."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT id, recorded_at, origin, reason, old_size, proof, note, known_size, "
                "known_root, known_note, known_cosigned_at FROM evidence ORDER BY id"
            ).fetchall()
        return [
            {
                "id": row[0],
                "recorded_at": row[1],
                "origin": row[2],
                "reason": row[3],
                "old_size": row[4],
                "proof": row[5].split(),
                "note": row[6],
                "known": {
                    "size": row[7],
                    "root": base64.b64encode(row[8]).decode(),
                    "note": row[9],
                    "cosigned_at": row[10],
                },
            }
            for row in rows
        ]

    def logs(self) -> list[Known]:
        """The last cosigned tree of every log, by origin."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT origin, size, root, note, cosigned_at FROM cosigned ORDER BY origin"
            ).fetchall()
        return [_known(row, self.path) for row in rows]
