"""The runtime client's trust policy, its kept state and the log keys it learned (R29).

``load_trust`` reads the policy file (``domain.bundle.TrustPolicy``). The state file
(``CatalogClient(state_file=...)``) keeps what a client accepted: the largest catalog-log
checkpoint (``domain.bundle.Accepted``: size, root, revision) and, once it learned a key
rotation from the log, the log keys it pins (``"log_keys"``: each key with the end of its
overlap, ``until``, or null). A restarted client reads both back: it never forgets a
rotation it learned (nor the bound it put on the old key).

``KeyRing`` is the client's set of log keys: the policy's, as the learned ones amend them
(a policy key the client saw rotated away keeps its ``until``; a learned key is added).
``learn`` applies the body of ``GET /v1/log/rotations``
(``domain.key_rotation.learn_rotations``: the main-log note signed by a key valid now,
cosigned by the policy's threshold of witnesses, each rotation in it, each signed by a
pinned old key within its overlap). ``policy(now)`` is the trust policy with only the keys
valid at ``now``: after the overlap, a checkpoint signed by the old key alone has no
signature by a pinned key (INTEGRITY ``no_signature``, LOG-FORMAT step 1).

Imports only the pure domain and orjson (``tests/unit/test_layering.py``), like the client.
"""

from __future__ import annotations

import dataclasses
import fcntl
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import orjson

from domain.bundle import STATE_FORMAT, Accepted, TrustPolicy, bad_state
from domain.errors import IntegrityFailure, InvalidInput, Stale, Unavailable
from domain.key_rotation import PinnedKey, learn_rotations
from domain.notes import SignedNote, VerifierKey, key_id
from domain.origin import main_log_origin


def load_trust(path: str | Path) -> TrustPolicy:
    """The trust policy in a JSON file (``domain.bundle.TrustPolicy``); INVALID names the
    field at fault, UNAVAILABLE a file that cannot be read."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise Unavailable(f"cannot read the trust policy {path}: {exc.strerror}") from None
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"the trust policy {path} is not JSON: {exc}", field="$") from None
    return TrustPolicy.parse(document)


class KeyRing:
    """The log keys one client pins (module docstring)."""

    def __init__(self, trust: TrustPolicy, learned: tuple[PinnedKey, ...] | None = None) -> None:
        self.trust = trust
        self.learned = learned
        keys = list(learned or ())
        for key in trust.log_keys:
            if not any(k.key.public == key.public for k in keys):
                keys.append(PinnedKey(key))
        self.keys: tuple[PinnedKey, ...] = tuple(keys)

    def policy(self, now: float) -> TrustPolicy:
        """The trust policy with the log keys valid at ``now`` (learned ones included)."""
        valid = tuple(k.key for k in self.keys if k.valid_at(_seconds(now)))
        if valid == self.trust.log_keys:
            return self.trust
        return dataclasses.replace(self.trust, log_keys=valid)

    def unknown_signers(self, proof: object) -> frozenset[tuple[str, bytes]]:
        """``(name, key id)`` of the signature lines of a bundle's checkpoint by neither a
        pinned log key nor a pinned witness (a new log key, during its overlap)."""
        note = proof.get("checkpoint") if isinstance(proof, dict) else None
        try:
            lines = SignedNote.parse(note).signatures if isinstance(note, str) else ()
        except InvalidInput:
            return frozenset()
        known = {(k.key.name, key_id(k.key.name, k.key.public)) for k in self.keys}
        known |= {(w.name, w.key_id) for w in self.trust.witnesses}
        return frozenset((s.name, s.key_id) for s in lines) - known

    def learn(self, document: object, now: float) -> bool:
        """Apply the rotations of ``document`` (``GET /v1/log/rotations``); whether the
        keys changed. INTEGRITY (and nothing changes) as ``learn_rotations`` says."""
        found = learn_rotations(
            self.keys,
            document,
            origin=main_log_origin(self.trust.origin),
            witnesses=self.trust.witnesses,
            threshold=self.trust.threshold,
            now=_seconds(now),
        )
        if found == self.keys:
            return False
        self.keys = self.learned = found
        return True


def _seconds(now: float) -> int:
    """``now`` in whole seconds. A clock that gives no time (NaN, an infinity) fails
    closed as ``verify_bundle`` step 6 does: STALE, axis ``freshness``."""
    if not math.isfinite(now):
        raise Stale(
            f"the client's clock gives no time ({now!r}): no view is proven fresh",
            axis="freshness",
            required="a finite time",
            served=repr(now),
        )
    return int(now)


# -- the state file ----------------------------------------------------------------------


def read_state(path: Path | None, trust: TrustPolicy) -> tuple[Accepted | None, KeyRing]:
    """What a previous client kept in ``path`` (nothing: no file yet). A file that does
    not parse is INTEGRITY ``bad_state`` naming the field (``Accepted.from_json``), never
    read as "no state": starting afresh would accept any head, and forget a rotation."""
    if path is None:
        return None, KeyRing(trust)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, KeyRing(trust)
    except OSError as exc:
        raise Unavailable(f"cannot read the client state {path}: {exc.strerror}") from None
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError:
        document = None
    try:
        learned = _learned_keys(document, trust)
        keys_only = isinstance(document, dict) and "size" not in document and "log_keys" in document
        accepted = None if keys_only else Accepted.from_json(document, trust.origin)
    except IntegrityFailure as exc:
        raise IntegrityFailure(f"{path}: {exc.message}", **exc.details) from None
    return accepted, KeyRing(trust, learned)


def _learned_keys(document: object, trust: TrustPolicy) -> tuple[PinnedKey, ...] | None:
    origin = trust.origin
    if not isinstance(document, dict) or "log_keys" not in document:
        return None
    if document.get("format") != STATE_FORMAT or document.get("origin") != origin:
        return None  # Accepted.from_json names what is wrong
    if document.get("pinned") != sorted(k.text() for k in trust.log_keys):
        # Learned under another policy's keys: a re-pin (a compromised key) replaces
        # them, and the new policy's keys alone are trusted (LOG-FORMAT "Key rotation").
        return None
    items = document["log_keys"]
    if not isinstance(items, list) or not items:
        raise bad_state("log_keys is not a non-empty list", "log_keys")
    keys = []
    for n, item in enumerate(items):
        at = f"log_keys[{n}]"
        text = item.get("key") if isinstance(item, dict) else None
        until = item.get("until") if isinstance(item, dict) else None
        if not isinstance(text, str) or not (until is None or type(until) is int):
            raise bad_state("is not a key with its until (unix seconds, or null)", at)
        try:
            key = VerifierKey.parse(text, field=at)
        except InvalidInput as exc:
            raise bad_state(exc.message, at) from None
        keys.append(PinnedKey(key, until))
    return tuple(keys)


def state_document(trust: TrustPolicy, accepted: Accepted | None, ring: KeyRing) -> dict[str, Any]:
    """The state file's document: ``accepted`` (if any) and the learned keys (if any)."""
    document = (
        accepted.to_json(trust.origin)
        if accepted is not None
        else {"format": STATE_FORMAT, "origin": trust.origin}
    )
    if ring.learned is not None:
        document["log_keys"] = [{"key": k.key.text(), "until": k.until} for k in ring.learned]
        document["pinned"] = sorted(k.text() for k in trust.log_keys)
    return document


def adopt(
    path: Path | None, trust: TrustPolicy, kept: Accepted | None, ring: KeyRing | None
) -> tuple[Accepted | None, KeyRing]:
    """Under ``sharing(path)``, before a proven read or a refresh of the keys: the state
    and keys ``path`` holds if a sharer moved it on to ``kept`` or past it (or nothing was
    kept: its learned keys), else ``kept`` and ``ring``; so that what is written next
    never puts an older head, or fewer learned keys, back over a sharer's."""
    if path is None:
        return kept, ring or KeyRing(trust)
    on_file, on_file_ring = read_state(path, trust)
    if kept is None or ring is None or (on_file is not None and on_file.size >= kept.size):
        return on_file, on_file_ring
    return kept, ring


def sharing(path: Path | None) -> AbstractContextManager[None]:
    """``locked(path)``, or nothing when the client keeps no state file."""
    return locked(path) if path is not None else nullcontext()


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """One proven read at a time among the processes sharing the state file ``path``
    (a lock on its directory, released when closed)."""
    try:
        directory = os.open(path.parent, os.O_RDONLY)
    except OSError as exc:
        raise Unavailable(f"cannot lock the client state {path}: {exc.strerror}") from None
    try:
        fcntl.flock(directory, fcntl.LOCK_EX)
        yield
    finally:
        os.close(directory)


def write_state(path: Path, document: dict[str, Any]) -> None:
    """Replace ``path`` with ``document`` atomically: a temporary file in the same
    directory, fsync'ed, renamed over it, then the directory fsync'ed (a crash leaves the
    old state or the new one, never a torn file)."""
    body = orjson.dumps(document)
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(body)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError as exc:
        raise Unavailable(f"cannot write the client state {path}: {exc.strerror}") from None
