"""Proof bundles: a runtime proves its view is the current catalog, cosigned (R29) — pure.

The server answers ``?proof=1`` with the view plus a ``proof`` member
(``schema/LOG-FORMAT.md``, "Proof bundle"). ``verify_bundle`` checks it against a
``TrustPolicy`` (the catalog log's origin, the log's verifier keys, the witnesses'
keys, a threshold k, a maximum age) and the largest ``Accepted`` state the client
kept, in the normative order of "Verifying a bundle":

1. the checkpoint's origin, and a valid signature by a pinned log key
   (INTEGRITY ``wrong_origin``, ``bad_signature``, ``no_signature``);
2. at least k distinct pinned witnesses' ``cosignature/v1`` lines verify
   (``bad_cosignature``, ``too_few_cosignatures``);
3. the revision event's id, recomputed from its stored bytes, is the catalog's
   ``catalog.published`` (v2 or later) of the view's revision with an
   ``audiences_root`` (``wrong_revision_event``);
4. the checkpoint's size is the revision (``not_current``) and the event is its
   last leaf (``bad_inclusion``);
5. the view's audience digest is the audience's leaf under ``audiences_root``
   (``bad_audience_proof``: a forged or re-digested view, another audience's);
6. the k-th newest cosignature timestamp is at most ``max_age_seconds`` old
   (STALE, axis ``freshness``: a frozen head);
7. against the kept state: a smaller tree is STALE (axis ``checkpoint``: a lagging
   replica, a rollback); the same size with another root, or a larger one without
   a consistency proof from the kept one that verifies, is INTEGRITY
   (``inconsistent_tree``, ``missing_consistency``).

A bundle that is not even shaped like one is INTEGRITY ``malformed_proof`` naming the
JSON path. Signatures and cosignatures are checked by ``domain.notes`` (C2SP signed-note,
tlog-checkpoint, tlog-cosignature). Pure: no I/O and no clock (``now`` is the caller's); the client
(``ledger.client``) reads the policy and state files and keeps what this returns.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import orjson

from domain import audience_map, merkle
from domain.digests import aggregate_id, event_id
from domain.errors import IntegrityFailure, InvalidInput, Stale
from domain.notes import (
    Checkpoint,
    SignedNote,
    VerifierKey,
    WitnessKey,
    verify_log_signatures,
    witnessed_times,
)
from domain.origin import main_log_origin
from domain.served import AudienceView

#: The proof bundle format this module reads (``proof.format``).
BUNDLE_FORMAT = 1
#: ``domain.catalog.catalog_id()``, derived here without importing the aggregate (and so
#: eventsourcing, which a runtime does not install); a unit test holds them equal.
CATALOG_ID = aggregate_id("catalog", "catalog")
_PUBLISHED = re.compile(r"catalog\.published@([1-9][0-9]{0,8})")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_AUDIENCE_PROOF = 256  # the map's keys are 256 bits: no path is longer


# -------------------------------------------------------------------------- the policy


@dataclass(frozen=True)
class TrustPolicy:
    """What a client pins (LOG-FORMAT "Proof bundle"; the JSON document of the brief)."""

    origin: str
    log_keys: tuple[VerifierKey, ...]
    witnesses: tuple[WitnessKey, ...]
    threshold: int
    max_age_seconds: int
    #: Each witness's ``url`` (None: not given); the collector needs them, the client not.
    witness_urls: tuple[str | None, ...] = ()

    @classmethod
    def parse(cls, document: object) -> TrustPolicy:
        """The policy in a decoded JSON document; INVALID names the JSON path at fault."""
        if not isinstance(document, dict):
            raise InvalidInput("the trust policy is not a JSON object", field="$")
        origin = document.get("origin")
        if not isinstance(origin, str) or not origin or "\n" in origin:
            raise InvalidInput("origin must be a non-empty one-line string", field="origin")
        log_keys = document.get("log_keys")
        if not isinstance(log_keys, list) or not log_keys:
            raise InvalidInput("log_keys must be a non-empty list of keys", field="log_keys")
        keys: list[VerifierKey] = []
        for n, text in enumerate(log_keys):
            at = f"log_keys[{n}]"
            if not isinstance(text, str):
                raise InvalidInput(f"{at} must be a verifier key string", field=at)
            key = VerifierKey.parse(text, field=at)
            if key in keys:
                raise InvalidInput(f"{at} repeats a log key", field=at)
            keys.append(key)
        witnesses = document.get("witnesses")
        if not isinstance(witnesses, list) or not witnesses:
            raise InvalidInput("witnesses must be a non-empty list", field="witnesses")
        found: list[WitnessKey] = []
        urls: list[str | None] = []
        for n, item in enumerate(witnesses):
            at = f"witnesses[{n}]"
            if not isinstance(item, dict):
                raise InvalidInput(f"{at} must be an object with a key", field=at)
            text = item.get("key")
            if not isinstance(text, str):
                raise InvalidInput(f"{at}.key must be a witness key string", field=f"{at}.key")
            witness = WitnessKey.parse(text, field=f"{at}.key")
            # Ed25519 cosignatures do not commit to the name: one public key under two
            # names would count twice towards the threshold. (One name may pin two keys:
            # a witness's old and new key during its rotation.)
            if any(w.public == witness.public for w in found):
                raise InvalidInput(f"{at}.key repeats a witness", field=f"{at}.key")
            url = item.get("url")
            if url is not None and (not isinstance(url, str) or not url):
                raise InvalidInput(f"{at}.url must be a string", field=f"{at}.url")
            found.append(witness)
            urls.append(url)
        threshold = document.get("threshold")
        names = len({w.name for w in found})  # a witness pinned with two keys is one
        if type(threshold) is not int or not 1 <= threshold <= names:
            raise InvalidInput(
                f"threshold must be an integer from 1 to {names} (the witnesses)",
                field="threshold",
            )
        max_age = document.get("max_age_seconds")
        if type(max_age) is not int or max_age <= 0:
            raise InvalidInput(
                "max_age_seconds must be a positive integer", field="max_age_seconds"
            )
        unknown = sorted(set(document) - _POLICY_FIELDS)
        if unknown:
            raise InvalidInput(f"unknown field {unknown[0]!r}", field=unknown[0])
        return cls(origin, tuple(keys), tuple(found), threshold, max_age, tuple(urls))

    def to_json(self) -> dict[str, Any]:
        witnesses: list[dict[str, str]] = []
        for n, w in enumerate(self.witnesses):
            url = self.witness_urls[n] if n < len(self.witness_urls) else None
            witnesses.append({"key": w.text()} | ({"url": url} if url is not None else {}))
        return {
            "origin": self.origin,
            "log_keys": [k.text() for k in self.log_keys],
            "witnesses": witnesses,
            "threshold": self.threshold,
            "max_age_seconds": self.max_age_seconds,
        }


_POLICY_FIELDS = frozenset({"origin", "log_keys", "witnesses", "threshold", "max_age_seconds"})
# ------------------------------------------------------------------------ the kept state


@dataclass(frozen=True)
class Accepted:
    """The largest catalog-log checkpoint a client accepted, and its revision."""

    size: int
    root: bytes
    revision: int

    def to_json(self, origin: str) -> dict[str, Any]:
        """The state file's document: the state, kept for the log of ``origin``."""
        root = base64.b64encode(self.root).decode()
        return {
            "format": STATE_FORMAT,
            "origin": origin,
            "size": self.size,
            "root": root,
            "revision": self.revision,
        }

    @classmethod
    def from_json(cls, document: object, origin: str) -> Accepted:
        """The state a client kept for the log of ``origin``. One that does not parse, or
        was kept for another origin, is INTEGRITY ``bad_state``, never read as "no state":
        starting afresh would accept any head, a rollback included (whoever re-pins on
        purpose removes the state)."""
        if not isinstance(document, dict) or document.get("format") != STATE_FORMAT:
            raise bad_state(f"not a client state of format {STATE_FORMAT}", "$")
        if document.get("origin") != origin:
            raise bad_state(
                f"kept for {document.get('origin')!r}, not the pinned origin {origin!r}",
                "origin",
            )
        size, root, revision = (document.get(k) for k in ("size", "root", "revision"))
        if type(size) is not int or size < 1:
            raise bad_state("size is not a positive integer", "size")
        if type(revision) is not int or revision != size:
            raise bad_state("revision is not the size (the catalog log's last leaf)", "revision")
        try:
            raw = base64.b64decode(root, validate=True) if isinstance(root, str) else b""
        except binascii.Error:
            raw = b""
        if len(raw) != 32:
            raise bad_state("root is not a base64 32-byte hash", "root")
        return cls(size, raw, revision)


#: The format of ``Accepted.to_json``'s document.
STATE_FORMAT = 1


def bad_state(message: str, field: str) -> IntegrityFailure:
    """INTEGRITY ``bad_state`` naming ``field`` of a client's state file."""
    return IntegrityFailure(f"the client's kept state: {message}", reason="bad_state", field=field)


# ------------------------------------------------------------------------- verification


@dataclass(frozen=True)
class _Bundle:
    note: str
    event: Mapping[str, Any]
    inclusion: list[bytes]
    audience: list[bytes]
    consistency: tuple[int, list[bytes]] | None


def verify_bundle(
    view: AudienceView,
    bundle: object,
    policy: TrustPolicy,
    accepted: Accepted | None,
    now: float,
) -> Accepted:
    """The state to keep once ``bundle`` proves ``view`` current (module docstring).

    ``view`` has had its facts and audience digest verified already; ``bundle`` is the
    decoded ``proof`` member; ``now`` is POSIX seconds. Raises ``IntegrityFailure``
    (``details["reason"]``) or ``Stale`` (``details["axis"]``); on success returns the
    larger of ``accepted`` and the bundle's checkpoint (equal sizes: ``accepted``)."""
    parsed = _parse_bundle(bundle)
    # 1. The log's signature over a checkpoint of the pinned origin.
    checkpoint = _checkpoint(parsed.note, policy)
    # 2. k distinct pinned witnesses cosigned it.
    times = _cosigned(parsed.note, policy)
    # 3. The revision event, from its stored bytes.
    leaf, audiences_root = _revision_event(parsed.event, view.revision)
    # 4. It is the last leaf of the checkpoint's tree: the current revision.
    if checkpoint.size != view.revision:
        raise IntegrityFailure(
            f"the checkpoint has {checkpoint.size} revisions: revision {view.revision} is "
            "not the current one",
            reason="not_current",
            size=checkpoint.size,
            revision=view.revision,
        )
    try:
        merkle.verify_inclusion(
            view.revision - 1, checkpoint.size, merkle.leaf_hash(leaf), parsed.inclusion,
            checkpoint.root,
        )  # fmt: skip
    except IntegrityFailure as exc:
        raise IntegrityFailure(
            f"the revision event is not leaf {view.revision - 1} of the checkpoint: {exc.message}",
            reason="bad_inclusion",
        ) from None
    # 5. The view's digest is the audience's leaf of the revision's audience map.
    kind, _, ident = view.audience.partition(":")
    key = audience_map.key_of(kind, ident)
    if (
        not _HEX64.fullmatch(view.audience_digest)
        or audience_map.root_from_proof(key, bytes.fromhex(view.audience_digest), parsed.audience)
        != audiences_root
    ):
        raise IntegrityFailure(
            f"the view of {view.audience} is not the one revision {view.revision} commits "
            "to (a forged or re-digested view, or another audience's)",
            reason="bad_audience_proof",
        )
    # 6. Freshness: the k-th newest cosignature.
    served = times[policy.threshold - 1]
    # A clock that gives no time (NaN, an infinity) fails closed.
    if not math.isfinite(now) or not now - served <= policy.max_age_seconds:
        raise Stale(
            f"the catalog checkpoint's cosignatures are too old: the {policy.threshold}"
            f"-th newest is from {_time(served)}, the policy accepts {policy.max_age_seconds}"
            " seconds (a frozen head, or the witnesses were not asked)",
            axis="freshness",
            required=_time(now - policy.max_age_seconds),
            served=_time(served),
        )
    # 7. Never back, never aside.
    current = Accepted(checkpoint.size, checkpoint.root, view.revision)
    if accepted is None:
        return current
    return _forward(accepted, current, parsed.consistency)


def witnessed(note: str, policy: TrustPolicy) -> tuple[Checkpoint, list[int]]:
    """Steps 1 and 2 alone, for an auditor's note of either log the policy names (the
    catalog log, or the main log: ``main_log_origin``): its checkpoint, signed by a pinned
    log key, and the newest cosignature time of each of at least ``threshold`` pinned
    witnesses, newest first (``catalog-ledger audit verify-proof --policy``)."""
    origins = (policy.origin, main_log_origin(policy.origin))
    return _checkpoint(note, policy, origins), _cosigned(note, policy)


def _checkpoint(note: str, policy: TrustPolicy, origins: tuple[str, ...] = ()) -> Checkpoint:
    """Step 1, after the note's shape (``malformed_proof`` first, LOG-FORMAT "Verifying a
    bundle"). A note with no blank line has no signatures: ``no_signature`` once its
    origin is checked."""
    unsigned = "\n\n" not in note
    try:
        if unsigned:
            if any(ord(c) < 0x20 and c != "\n" for c in note) or not note.endswith("\n"):
                raise InvalidInput("not a signed note", field="$.proof.checkpoint")
            text = note
        else:
            text = SignedNote.parse(note, field="$.proof.checkpoint").text
        checkpoint = Checkpoint.parse(text, field="$.proof.checkpoint")
    except InvalidInput as exc:
        raise _malformed(exc.message, "$.proof.checkpoint") from None
    if checkpoint.origin not in (origins or (policy.origin,)):
        raise IntegrityFailure(
            f"the checkpoint's origin is {checkpoint.origin!r}, not the pinned {policy.origin!r}",
            reason="wrong_origin",
        )
    if unsigned:
        raise IntegrityFailure("the checkpoint is not signed", reason="no_signature")
    verify_log_signatures(note, policy.log_keys, field="$.proof.checkpoint")
    return checkpoint


def _cosigned(note: str, policy: TrustPolicy) -> list[int]:
    """Step 2. The newest valid cosignature time of each pinned witness (by name) that
    cosigned, newest first; at least ``threshold`` of them (``domain.notes.witnessed_times``)."""
    try:
        return witnessed_times(note, policy.witnesses, policy.threshold, field="$.proof.checkpoint")
    except InvalidInput as exc:
        raise _malformed(exc.message, "$.proof.checkpoint") from None


def _revision_event(event: Mapping[str, Any], revision: int) -> tuple[bytes, bytes]:
    """The revision event's id and its ``audiences_root`` (step 3)."""

    def wrong(message: str) -> IntegrityFailure:
        return IntegrityFailure(f"$.proof.revision_event {message}", reason="wrong_revision_event")

    aggregate, version = event.get("aggregate_id"), event.get("version")
    topic, state_b64 = event.get("topic"), event.get("state_b64")
    try:
        uuid = UUID(aggregate) if isinstance(aggregate, str) else None
    except ValueError:
        uuid = None
    if uuid != CATALOG_ID:
        raise wrong("is not an event of the catalog aggregate")
    if type(version) is not int or not 1 <= version < 1 << 63:
        raise wrong("has no version")
    if not isinstance(topic, str):
        raise wrong("has no topic")
    match = _PUBLISHED.fullmatch(topic)
    if match is None or int(match.group(1)) < 2:
        raise wrong(f"is not a catalog.published event of schema 2 or later: {topic!r}")
    state: bytes | None = None
    decoded: object = None
    try:
        if isinstance(state_b64, str):
            state = base64.b64decode(state_b64, validate=True)
            decoded = orjson.loads(state)
    except (binascii.Error, orjson.JSONDecodeError):
        decoded = None
    if state is None or not isinstance(decoded, dict):
        raise wrong("has no JSON state")
    if type(decoded.get("revision")) is not int or decoded["revision"] != revision:
        raise wrong(f"is not revision {revision}'s (the view's)")
    root = decoded.get("audiences_root")
    if not isinstance(root, str) or not _HEX64.fullmatch(root):
        raise wrong("has no audiences_root")
    return event_id(uuid.bytes, version, topic.encode(), state), bytes.fromhex(root)


def _forward(
    kept: Accepted, current: Accepted, consistency: tuple[int, list[bytes]] | None
) -> Accepted:
    if current.size < kept.size:
        raise Stale(
            f"the catalog checkpoint has {current.size} revisions, this client already "
            f"accepted {kept.size} (a lagging replica, or a rollback)",
            axis="checkpoint",
            required=kept.size,
            served=current.size,
        )
    if current.size == kept.size:
        if current.root != kept.root:
            raise IntegrityFailure(
                f"the catalog log of size {current.size} has another root than the one "
                "this client accepted (a split view)",
                reason="inconsistent_tree",
                size=current.size,
            )
        return kept
    if consistency is None or consistency[0] != kept.size:
        raise IntegrityFailure(
            f"no consistency proof from the accepted size {kept.size} to {current.size}",
            reason="missing_consistency",
            required_from_size=kept.size,
        )
    try:
        merkle.verify_consistency(kept.size, current.size, consistency[1], kept.root, current.root)
    except IntegrityFailure as exc:
        raise IntegrityFailure(
            f"the catalog log of size {current.size} does not extend the accepted one of "
            f"size {kept.size}: {exc.message}",
            reason="inconsistent_tree",
            size=current.size,
            accepted_size=kept.size,
        ) from None
    return current


# ------------------------------------------------------------------------------ parsing


def _parse_bundle(bundle: object) -> _Bundle:
    if not isinstance(bundle, dict):
        raise _malformed("the view has no proof bundle", "$.proof")
    if bundle.get("format") != BUNDLE_FORMAT or type(bundle.get("format")) is not int:
        raise _malformed(f"the bundle format is not {BUNDLE_FORMAT}", "$.proof.format")
    note = bundle.get("checkpoint")
    if not isinstance(note, str):
        raise _malformed("the checkpoint is not a string", "$.proof.checkpoint")
    event = bundle.get("revision_event")
    if not isinstance(event, dict):
        raise _malformed("the revision event is not an object", "$.proof.revision_event")
    inclusion = _hashes(bundle.get("inclusion"), "$.proof.inclusion", 64)
    audience = _hashes(bundle.get("audience"), "$.proof.audience", _MAX_AUDIENCE_PROOF)
    consistency = None
    if "consistency" in bundle:
        c = bundle["consistency"]
        if not isinstance(c, dict) or type(c.get("from_size")) is not int or c["from_size"] < 1:
            raise _malformed("consistency needs a positive from_size", "$.proof.consistency")
        consistency = (c["from_size"], _hashes(c.get("proof"), "$.proof.consistency.proof", 128))
    return _Bundle(note, event, inclusion, audience, consistency)


def _hashes(value: object, field: str, most: int) -> list[bytes]:
    if not isinstance(value, list) or len(value) > most:
        raise _malformed(f"not a list of at most {most} hashes", field)
    out: list[bytes] = []
    for n, item in enumerate(value):
        try:
            raw = base64.b64decode(item, validate=True) if isinstance(item, str) else b""
        except binascii.Error:
            raw = b""
        if len(raw) != 32:
            raise _malformed("not a base64 32-byte hash", f"{field}[{n}]")
        out.append(raw)
    return out


def _malformed(message: str, field: str) -> IntegrityFailure:
    return IntegrityFailure(
        f"the proof bundle is malformed: {field}: {message}", reason="malformed_proof", field=field
    )


def _time(posix: float) -> str:
    try:
        return datetime.fromtimestamp(posix, UTC).isoformat().replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):  # not a time a clock gives
        return repr(posix)
