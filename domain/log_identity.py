"""The log's own identity as log facts (R29, issue 28 items 6 and 7): its origin and its
signing keys.

A checkpoint names the log it commits to by its *origin* line; witnesses and clients pin
that origin. Before this module the origin was ``catalog-ledger/<store id>``, the id of
the *store instance* (``ledger_meta``), so a log moved to another engine by ``export`` and
``import`` was signed under a new origin and every witness answered "unknown log origin".
The origin is now a fact of the log itself: ``log.named`` (the first event of the
``LogIdentity`` aggregate) states it, ``export`` carries it like any event, and ``import``
writes it back byte for byte. ``log.renamed`` gives the log a new origin, which makes it
another log to witnesses and clients (the disaster-recovery path when a restored log
cannot resume under its old origin: clients re-pin). A log with no ``log.named`` event
(a store written before it existed, or one that was never signed) keeps the origin it
always had, ``catalog-ledger/<store id>``, until its first signing names it with exactly
that.

The log's signing key can rotate: ``log_key.rotated`` holds a *rotation statement*, a C2SP
signed note by the old key whose body says which key replaces which, for which origin, and
until when the old key stays valid (the overlap)::

    catalog-ledger key rotation v1
    origin <origin>
    old <verifier key text>
    new <verifier key text>
    until <unix seconds>

``domain.key_rotation.apply_rotation`` is the whole rule a client (or an auditor) applies
to a pinned key set. Pure: no I/O, no clock. This module imports no cryptography (reads
load the event table, and with it this aggregate, without the signing code).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.digests import aggregate_id
from domain.errors import InvalidInput

#: The origin a log has before it is named: its store's id (``ledger_meta.store_id``).
ORIGIN_PREFIX = "catalog-ledger/"
_MAX_ORIGIN = 255


def log_identity_id() -> UUID:
    """The one ``LogIdentity`` aggregate of a log (a fixed id: one index seek finds it)."""
    return aggregate_id("log", "identity")


def default_origin(store_id: str) -> str:
    """The origin of a log that has no ``log.named`` event: its store's id."""
    return f"{ORIGIN_PREFIX}{store_id}"


def check_origin(origin: object, *, field: str = "origin") -> str:
    """A checkpoint origin: one non-empty line of printable text, no spaces or '+' (so that
    it can also be a note key name, tlog-checkpoint's advice), at most 255 characters."""
    ok = (
        isinstance(origin, str)
        and 0 < len(origin) <= _MAX_ORIGIN
        and origin.isprintable()
        and not any(c.isspace() or c == "+" for c in origin)
    )
    if not ok:
        raise InvalidInput(
            f"{field} must be one line of printable text without spaces or '+' "
            f"(1-{_MAX_ORIGIN} characters)",
            field=field,
        )
    assert isinstance(origin, str)
    return origin


class LogIdentity(Aggregate):
    """The log's origin (named once, renamed only to become another log) and its
    signing-key rotations."""

    class Named(Aggregate.Created):
        origin: str

    class Renamed(Aggregate.Event):
        #: The log's new origin: from here on it is another log to witnesses and clients.
        origin: str

    class KeyRotated(Aggregate.Event):
        #: The rotation statement: a signed note by the old key (see the module doc).
        statement: str

    @staticmethod
    def create_id(**_: Any) -> UUID:
        return log_identity_id()

    @event(Named)
    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.statements: list[str] = []

    @event(Renamed)
    def rename(self, origin: str) -> None:
        self.origin = origin

    @event(KeyRotated)
    def rotate(self, statement: str) -> None:
        self.statements.append(statement)
