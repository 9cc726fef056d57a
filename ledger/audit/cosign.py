"""The collector (R29): sign the catalog log's checkpoint, have witnesses cosign it, store it.

``catalog-ledger cosign --sign KEYFILE --policy POLICY.json`` is a job the operator runs
(from cron, more often than the clients' ``max_age_seconds``: LOG-FORMAT "Catalog log");
``serve`` never holds the signing key. One run:

1. computes the catalog log's checkpoint from the main log (``ledger.store.catalog_log``)
   and signs it with the log key (C2SP signed note);
2. submits it to each witness of the policy with C2SP tlog-witness ``add-checkpoint``,
   stating the size the witness last cosigned as far as the store knows (that of the
   stored checkpoint) with a consistency proof from it; a witness that answers 409 with
   another size it knows is asked once more, with a proof from that size;
3. keeps each answer's ``cosignature/v1`` lines whose signature verifies under that
   witness's pinned key, and stores the note with the log signature and every
   cosignature in ``ledger_checkpoint`` when at least ``threshold`` distinct witnesses
   cosigned; otherwise it stores nothing and raises UNAVAILABLE naming the witnesses that
   failed (and logs it: clients go STALE once the stored cosignatures pass their maximum
   age, so operators see it coming: this line and ``catalog_ledger_checkpoint_age_seconds``).

Re-running it with an unchanged catalog re-cosigns the same size: the witnesses' fresh
timestamps are what a client's freshness rests on. The witnesses are reached through an
``AddCheckpoint`` callable (``ledger.witness.submit.add_checkpoint`` in production).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from domain.errors import InvalidInput, LedgerError, Unavailable
from domain.notes import SignerKey, VerifierKey
from ledger.store.catalog_log import (
    CatalogLog,
    StoredCheckpoint,
    store_checkpoint,
    stored_checkpoint,
)
from ledger.store.runtime import Ledger

LOG = logging.getLogger("catalog_ledger.cosign")
_DASH = "\u2014"
_COSIGNATURE = b"\x04"


class WitnessConflict(Exception):
    """A witness answered 409: it knows another size of this log than the one stated."""

    def __init__(self, known_size: int) -> None:
        super().__init__(f"the witness knows size {known_size}")
        self.known_size = known_size


#: ``add_checkpoint(url, old_size, consistency_proof, signed_note)`` -> the witness's
#: cosignature lines (C2SP tlog-witness). Raises ``WitnessConflict`` on 409 and a
#: ``LedgerError`` (or ``OSError``) on any other failure.
AddCheckpoint = Callable[[str, int, Sequence[bytes], str], Sequence[str]]


# -- the policy's fields the collector needs (TO BE FOLDED into domain.bundle.TrustPolicy) --


@dataclass(frozen=True)
class Witness:
    name: str
    public: bytes
    url: str

    def key_id(self) -> bytes:
        return hashlib.sha256(self.name.encode() + b"\n" + _COSIGNATURE + self.public).digest()[:4]

    def valid_lines(self, body: str, lines: Sequence[str]) -> list[str]:
        """The ``cosignature/v1`` lines among ``lines`` by this witness that verify over
        the checkpoint ``body`` (tlog-cosignature); others are dropped."""
        public = Ed25519PublicKey.from_public_bytes(self.public)
        found: list[str] = []
        for line in lines:
            parts = line.split(" ")
            if len(parts) != 3 or parts[0] != _DASH or parts[1] != self.name:
                continue
            try:
                raw = base64.b64decode(parts[2], validate=True)
            except (binascii.Error, ValueError):
                continue
            if len(raw) != 76 or raw[:4] != self.key_id():
                continue
            timestamp = int.from_bytes(raw[4:12], "big")
            try:
                public.verify(raw[12:], f"cosignature/v1\ntime {timestamp}\n{body}".encode())
            except InvalidSignature:
                continue
            found.append(line)
        return found


@dataclass(frozen=True)
class CosignPolicy:
    origin: str
    log_keys: tuple[VerifierKey, ...]
    witnesses: tuple[Witness, ...]
    threshold: int


def parse_policy(document: object) -> CosignPolicy:
    """The fields of a trust policy the collector needs; INVALID naming the JSON path."""
    if not isinstance(document, dict):
        raise InvalidInput("the trust policy is not a JSON object", field="$")
    origin = document.get("origin")
    if not isinstance(origin, str) or not origin:
        raise InvalidInput("origin must be a non-empty string", field="origin")
    keys = document.get("log_keys")
    if not isinstance(keys, list) or not keys:
        raise InvalidInput("log_keys must be a non-empty list of keys", field="log_keys")
    log_keys = []
    for n, text in enumerate(keys):
        if not isinstance(text, str):
            raise InvalidInput(f"log_keys[{n}] must be a key", field=f"log_keys[{n}]")
        log_keys.append(VerifierKey.parse(text, field=f"log_keys[{n}]"))
    items = document.get("witnesses")
    if not isinstance(items, list) or not items:
        raise InvalidInput("witnesses must be a non-empty list", field="witnesses")
    witnesses = [_witness(item, f"witnesses[{n}]") for n, item in enumerate(items)]
    if len({w.public for w in witnesses}) != len(witnesses):
        raise InvalidInput("a witness key is listed twice", field="witnesses")
    threshold = document.get("threshold")
    if type(threshold) is not int or not 1 <= threshold <= len(witnesses):
        raise InvalidInput(
            f"threshold must be an integer from 1 to {len(witnesses)}", field="threshold"
        )
    return CosignPolicy(origin, tuple(log_keys), tuple(witnesses), threshold)


def _witness(item: object, at: str) -> Witness:
    if not isinstance(item, dict):
        raise InvalidInput(f"{at} must be an object", field=at)
    text, url = item.get("key"), item.get("url")
    if not isinstance(text, str):
        raise InvalidInput(f"{at}.key must be a witness key", field=f"{at}.key")
    parts = text.strip().split("+", 2)
    try:
        raw = base64.b64decode(parts[2], validate=True) if len(parts) == 3 else b""
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 33 or raw[:1] != _COSIGNATURE or not parts[0] or " " in parts[0]:
        raise InvalidInput(f"{at}.key is not a cosignature/v1 key", field=f"{at}.key")
    witness = Witness(parts[0], raw[1:], url if isinstance(url, str) else "")
    if witness.key_id().hex() != parts[1].lower():
        raise InvalidInput(f"{at}.key: the key id does not match the key", field=f"{at}.key")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise InvalidInput(f"{at}.url: the collector needs the witness's URL", field=f"{at}.url")
    return witness


# -- one collector run -------------------------------------------------------------------


class CosignResult(TypedDict):
    origin: str
    size: int
    root: str
    cosigned: list[str]
    failed: dict[str, str]
    threshold: int
    note: str


def check_policy(policy: CosignPolicy, origin: str, signer: SignerKey) -> None:
    """The policy is this log's and pins the signing key: INVALID naming the field."""
    if policy.origin != origin:
        raise InvalidInput(
            f"the policy's origin is {policy.origin!r}, this store's catalog log is {origin!r}",
            field="origin",
        )
    if signer.verifier not in policy.log_keys:
        raise InvalidInput(
            "the signing key is not one of the policy's log_keys: clients would refuse its "
            "signature",
            field="log_keys",
        )


def cosign(
    ledger: Ledger,
    *,
    origin: str,
    signer: SignerKey,
    policy: CosignPolicy,
    add_checkpoint: AddCheckpoint,
    clock: Callable[[], float] = time.time,
) -> CosignResult:
    """One collector run (module docstring)."""
    check_policy(policy, origin, signer)
    log = CatalogLog(ledger.db)
    with ledger.db.read() as conn:
        size = log.refresh(conn)
        previous = stored_checkpoint(conn, origin)
    checkpoint = log.checkpoint(origin)
    body = checkpoint.text()
    signed = signer.sign(body)
    known = previous.size if previous is not None and 0 < previous.size <= size else 0
    lines: list[str] = []
    cosigned: list[str] = []
    failed: dict[str, str] = {}
    for witness in policy.witnesses:
        try:
            answer = _submit(add_checkpoint, witness, log, known, size, signed)
        except (LedgerError, OSError, WitnessConflict) as exc:
            failed[witness.name] = str(getattr(exc, "message", exc))
            continue
        valid = witness.valid_lines(body, answer)
        if not valid:
            failed[witness.name] = "its answer carries no valid cosignature by its key"
            continue
        cosigned.append(witness.name)
        lines.extend(valid)
    root = base64.b64encode(checkpoint.root).decode()
    if len(cosigned) < policy.threshold:
        LOG.error(
            "catalog checkpoint not cosigned: fewer witnesses than the threshold answered; "
            "clients go STALE once the stored cosignatures pass their maximum age",
            extra={
                "origin": origin,
                "size": size,
                "cosigned": len(cosigned),
                "threshold": policy.threshold,
                "failed": sorted(failed),
            },
        )
        raise Unavailable(
            f"{len(cosigned)} of {len(policy.witnesses)} witnesses cosigned the catalog "
            f"checkpoint of size {size}, the policy needs {policy.threshold}; failed: "
            + "; ".join(f"{name}: {why}" for name, why in sorted(failed.items())),
            failed=failed,
            cosigned=cosigned,
            threshold=policy.threshold,
        )
    note = signed + "".join(line + "\n" for line in lines)
    store_checkpoint(
        ledger.db,
        StoredCheckpoint(origin, size, checkpoint.root, note, int(clock() * 1_000_000)),
    )
    LOG.info(
        "catalog checkpoint cosigned and stored",
        extra={"origin": origin, "size": size, "cosigned": len(cosigned), "failed": sorted(failed)},
    )
    return {
        "origin": origin,
        "size": size,
        "root": root,
        "cosigned": cosigned,
        "failed": failed,
        "threshold": policy.threshold,
        "note": note,
    }


def _submit(
    add_checkpoint: AddCheckpoint,
    witness: Witness,
    log: CatalogLog,
    known: int,
    size: int,
    signed: str,
) -> Sequence[str]:
    """``add-checkpoint`` from the size the store believes the witness has; on 409, once
    more from the size the witness says it has (if the log has it: a larger one means the
    witness saw a tree this log does not extend, which no retry fixes)."""
    try:
        return add_checkpoint(witness.url, known, _proof(log, known, size), signed)
    except WitnessConflict as conflict:
        if not 0 <= conflict.known_size <= size:
            raise Unavailable(
                f"the witness knows size {conflict.known_size}, larger than the catalog "
                f"log's {size}: it cosigned a tree this log does not extend"
            ) from None
        return add_checkpoint(
            witness.url, conflict.known_size, _proof(log, conflict.known_size, size), signed
        )


def _proof(log: CatalogLog, old: int, size: int) -> list[bytes]:
    return log.consistency(old, size) if 0 < old < size else []


def policy_document(text: str, source: str) -> Any:
    from domain.canonical import parse_json

    return parse_json(text, source=source)
