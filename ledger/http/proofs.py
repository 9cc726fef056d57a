"""Proof bundles of the view route (``?proof=1[&since_size=N]``, R29; LOG-FORMAT "Proof
bundle").

A bundle ties the served view to the stored cosigned checkpoint of the catalog log:
the revision's ``catalog.published`` event as stored, its inclusion proof as the last
leaf of the checkpoint's tree, the audience map inclusion proof of the audience's leaf
and, on request, a consistency proof from the size a client last accepted. The server
holds no key: the checkpoint note is served as the collector (``catalog-ledger cosign``)
stored it.

Nothing is served on trust (R28: a view is a cache of the log). Before a bundle is
cached: the stored row's note must parse as the row's origin, size and root, and that
(size, root) must be the catalog log's as recomputed from the main log (else INTEGRITY
naming ``ledger_checkpoint``); the audience map proof read from the map view must lead
from the view's audience digest to the revision event's ``audiences_root`` (else
INTEGRITY naming ``view_audience_map``). A view whose revision no stored checkpoint
covers yet is UNAVAILABLE ``checkpoint_pending``; a revision of schema v1 (no audience
map) is UNAVAILABLE ``unprovable_revision``.

Caches: bundles by (stored checkpoint row, audience), an LRU of ``BUNDLES`` entries (a few
kilobytes each: at most about 16 MB); consistency proofs by (size, root, since_size),
an LRU of ``CONSISTENCIES``; the stored note itself, on SQLite, while the file's
``data_version`` is unchanged (no commit by anyone since: one pragma per read).
"""

from __future__ import annotations

import base64
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson

from domain.audience_map import key_of, root_from_proof
from domain.errors import IntegrityFailure, InvalidInput, Unavailable
from domain.notes import Checkpoint
from domain.served import AudienceView
from ledger.store.catalog_log import (
    CHECKPOINT_TABLE,
    CatalogLog,
    StoredCheckpoint,
    audience_proof,
    query_checkpoint,
)
from ledger.store.runtime import Ledger

#: Bundles kept, by (stored note, audience).
BUNDLES = 4096
#: Consistency proofs kept, by (size, root, since_size).
CONSISTENCIES = 1024
BUNDLE_FORMAT = 1
_MAP_TABLE = "view_audience_map"


def parse_proof(value: str | None) -> bool:
    """``proof``: ``1`` asks for the bundle, ``0`` (or absent) not; else INVALID naming it."""
    if value is None or value == "0":
        return False
    if value == "1":
        return True
    raise InvalidInput(f"proof must be 0 or 1, got {value!r}", field="proof", part="proof")


def parse_since_size(value: str | None, proof: bool) -> int | None:
    """``since_size``: a positive tree size, only with ``proof=1``; else INVALID naming it."""
    if value is None:
        return None
    if not proof:
        raise InvalidInput("since_size needs proof=1", field="since_size", part="since_size")
    if not (value.isascii() and value.isdigit()) or len(value) > 18 or int(value) < 1:
        raise InvalidInput(
            f"since_size must be a positive integer, got {value!r}",
            field="since_size",
            part="since_size",
        )
    return int(value)


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _pending(revision: int, stored: StoredCheckpoint | None) -> Unavailable:
    covered = "no stored checkpoint" if stored is None else f"the stored one has {stored.size}"
    return Unavailable(
        f"no cosigned checkpoint covers revision {revision} yet ({covered}): the collector "
        "(`catalog-ledger cosign`) has not run since the last publication",
        reason="checkpoint_pending",
        revision=revision,
        checkpoint_size=None if stored is None else stored.size,
    )


class ProofService:
    """Bundles for the views one service serves (module docstring: checks and caches)."""

    def __init__(self, ledger: Ledger, origin: Callable[[], str]) -> None:
        self.db = db = ledger.db
        self.log = CatalogLog(db)
        self._origin = origin
        self._origin_text: str | None = None
        self._lock = threading.Lock()
        self._bundles: OrderedDict[tuple[StoredCheckpoint, str], tuple[str, bytes]] = OrderedDict()
        self._consistency: OrderedDict[tuple[int, bytes, int], bytes] = OrderedDict()
        self._memo = threading.local()
        #: Bundles served from the cache, and bundles built (tests, the benchmark).
        self.hits = 0
        self.misses = 0

    @property
    def origin(self) -> str:
        if self._origin_text is None:
            self._origin_text = self._origin()
        return self._origin_text

    def stored(self) -> StoredCheckpoint | None:
        """The stored cosigned checkpoint of the catalog log (one primary-key read; on
        SQLite none while no connection has committed since this thread's last read)."""
        version = self.db.data_version()
        memo = self._memo
        if version is not None and getattr(memo, "version", None) == version:
            found: StoredCheckpoint | None = memo.stored
            return found
        found = query_checkpoint(self.db, self.origin)
        if version is not None:
            memo.version, memo.stored = version, found
        return found

    def cached(
        self, view: AudienceView, stored: StoredCheckpoint | None, since: int | None
    ) -> bytes | None:
        """The body of ``view`` with its bundle if it is cached (no I/O), else ``None``.
        UNAVAILABLE when no stored checkpoint covers the view's revision."""
        if stored is None or stored.size != view.revision:
            raise _pending(view.revision, stored)
        with self._lock:
            found = self._bundles.get((stored, view.audience))
            if found is None or found[0] != view.audience_digest:
                return None
            self._bundles.move_to_end((stored, view.audience))
        tail = self._consistency_member(stored, since)
        if tail is None:
            return None
        self.hits += 1
        return _body(view, found[1], tail)

    def body(self, view: AudienceView, stored: StoredCheckpoint | None, since: int | None) -> bytes:
        """The body of ``view`` with its bundle, built and checked if not cached."""
        found = self.cached(view, stored, since)
        if found is not None:
            return found
        if stored is None:  # ``cached`` raised already: no stored checkpoint
            raise _pending(view.revision, stored)
        self.misses += 1
        proof = self._build(view, stored)
        with self._lock:
            self._bundles[(stored, view.audience)] = (view.audience_digest, proof)
            self._bundles.move_to_end((stored, view.audience))
            while len(self._bundles) > BUNDLES:
                self._bundles.popitem(last=False)
        tail = self._consistency_member(stored, since)
        if tail is None:  # the log was refreshed to the checkpoint's size, and went back
            raise _pending(view.revision, stored)
        return _body(view, proof, tail)

    def _consistency_member(self, stored: StoredCheckpoint, since: int | None) -> bytes | None:
        """``,"consistency":{...}`` (or nothing without ``since``); ``None``: the log is not
        read that far yet (a refresh is due)."""
        if since is None or since > stored.size:
            # Beyond the size: this server (a lagging replica) has no proof to give; the
            # bundle proves its smaller head, which the client answers STALE (LOG-FORMAT).
            return b""
        key = (stored.size, stored.root, since)
        with self._lock:
            found = self._consistency.get(key)
            if found is not None:
                self._consistency.move_to_end(key)
                return found
        if self.log.size < stored.size:
            return None
        proof = self.log.consistency(since, stored.size)
        found = b',"consistency":' + orjson.dumps(
            {"from_size": since, "proof": [_b64(p) for p in proof]}
        )
        with self._lock:
            self._consistency[key] = found
            while len(self._consistency) > CONSISTENCIES:
                self._consistency.popitem(last=False)
        return found

    def _build(self, view: AudienceView, stored: StoredCheckpoint) -> bytes:
        """The bundle's JSON members, checked against the log (module docstring)."""
        revision = view.revision
        kind, _, ident = view.audience.partition(":")
        key = key_of(kind, ident)
        with self.db.read() as conn:  # one snapshot: the log, the revision event, the map
            size = self.log.refresh(conn)
            _check_stored(stored, self.origin, self.log, size)
            if size != revision:  # published since the view was read: not covered
                raise _pending(size, stored)
            event = self.log.revision_event(revision, conn)
            root = event.data().get("audiences_root")
            if root is None:
                raise Unavailable(
                    f"revision {revision} is of schema v1 (no audience map) and cannot be "
                    "proven: publish once more to get a v2 revision",
                    reason="unprovable_revision",
                    revision=revision,
                )
            siblings = audience_proof(conn, key)
            if siblings is None:
                raise Unavailable(
                    "the audience map view is not running: no audience proof can be served "
                    "until it is rebuilt",
                    reason="audience_map_unavailable",
                )
        value = bytes.fromhex(view.audience_digest)
        if root_from_proof(key, value, siblings) != bytes.fromhex(root):
            raise _bad_map(view, "the map proof does not lead to the revision's audiences_root")
        members: dict[str, Any] = {
            "format": BUNDLE_FORMAT,
            "checkpoint": stored.note,
            "revision_event": event.to_json(),
            "inclusion": [_b64(p) for p in self.log.inclusion(revision, stored.size)],
            "audience": [_b64(p) for p in siblings],
        }
        return orjson.dumps(members)[:-1]  # without its closing brace: consistency follows


def _body(view: AudienceView, proof: bytes, consistency: bytes) -> bytes:
    return view.body[:-1] + b',"proof":' + proof + consistency + b"}}"


def _bad_map(view: AudienceView, problem: str) -> IntegrityFailure:
    return IntegrityFailure(
        f"the audience map view does not prove {view.audience}'s digest at revision "
        f"{view.revision}: {problem} (a view row was edited; rebuild the view)",
        table=_MAP_TABLE,
        rule="R28",
        reason="bad_audience_map",
    )


def _check_stored(stored: StoredCheckpoint, origin: str, log: CatalogLog, size: int) -> None:
    """The stored row's note is its own (origin, size, root) and that is the catalog log
    recomputed from the main log: INTEGRITY naming the table and origin otherwise."""
    try:
        parsed = Checkpoint.parse(stored.note)
    except InvalidInput:
        parsed = None
    if parsed != Checkpoint(stored.origin, stored.size, stored.root) or stored.origin != origin:
        problem = "its note is not its own origin, size and root"
    elif stored.size > size:
        problem = f"it has {stored.size} revisions, the log {size}"
    elif log.root(stored.size) != stored.root:
        problem = f"its root is not the catalog log's at size {stored.size}"
    else:
        return
    raise IntegrityFailure(
        f"the stored checkpoint of {stored.origin} in {CHECKPOINT_TABLE} does not "
        f"match the log: {problem}",
        table=CHECKPOINT_TABLE,
        origin=stored.origin,
        reason="checkpoint_mismatch",
    )
