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
load the event table, and with it this aggregate, without the signing code). The
origin rules and the aggregate's id live in ``domain.origin``, which the client imports.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.origin import log_identity_id


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
