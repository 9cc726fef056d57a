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

4. does the same for the main log's checkpoint (origin: the catalog log's without
   ``/catalog``), the one that covers the log's key rotations (``log_key.rotated``): the
   server shows runtimes each rotation with an inclusion proof under this note
   (``GET /v1/log/rotations``), so a rotation is a log fact k witnesses cosigned. The
   witnesses must witness both origins (``witness serve --log`` twice).

Re-running it with an unchanged catalog re-cosigns the same size: the witnesses' fresh
timestamps are what a client's freshness rests on. The witnesses are reached through an
``AddCheckpoint`` callable (``ledger.witness.submit.add_checkpoint`` over one HTTP
client per run, which the API passes: ``submitter``).
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypedDict

from domain.bundle import TrustPolicy
from domain.errors import Conflict, IntegrityFailure, InvalidInput, LedgerError, Unavailable
from domain.merkle import EMPTY_ROOT, consistency_proof_from
from domain.notes import (
    Checkpoint,
    NoteSignature,
    SignerKey,
    VerifierKey,
    WitnessKey,
    add_cosignatures,
)
from domain.origin import main_log_origin
from ledger.audit.proofs import MerkleLog
from ledger.store.catalog_log import (
    CatalogLog,
    StoredCheckpoint,
    store_checkpoint,
    stored_checkpoint,
)
from ledger.store.runtime import Ledger

LOG = logging.getLogger("catalog_ledger.cosign")

#: ``add_checkpoint(url, signed_note, old_size, consistency_proof)`` -> the witness's
#: cosignature lines (C2SP tlog-witness; ``ledger.witness.submit.submitter``).
#: Raises ``Conflict`` with ``details["known_size"]`` on 409, and a ``LedgerError`` (or
#: ``OSError``) on any other failure.
AddCheckpoint = Callable[[str, str, int, Sequence[bytes]], Sequence[str]]


@dataclass(frozen=True)
class Witness:
    key: WitnessKey
    url: str

    @property
    def name(self) -> str:
        return self.key.name

    def valid_lines(
        self, body: str, lines: Sequence[str], *, not_before: float | None = None
    ) -> list[str]:
        """The newest ``cosignature/v1`` line among ``lines`` by this witness's key that
        verifies over the checkpoint ``body`` (tlog-cosignature), or none; any other line
        is dropped. One line at most: a witness answering many valid lines must not
        push the stored note past what clients read (signed-note: 100 signatures).
        A line older than ``not_before`` (the clients' maximum age ago) is no
        cosignature now: a replayed one would make the collector report a note clients
        find STALE."""
        newest: tuple[int, str] | None = None
        for line in lines:
            try:
                signature = NoteSignature.parse_line(line, field="cosignature")
                if self.key.signed(signature):
                    timestamp = self.key.verify(body, signature)
                    if not_before is not None and timestamp < not_before:
                        continue
                    if newest is None or timestamp > newest[0]:
                        newest = (timestamp, signature.line())
            except (InvalidInput, IntegrityFailure):
                continue
        return [] if newest is None else [newest[1]]


@dataclass(frozen=True)
class CosignPolicy:
    origin: str
    log_keys: tuple[VerifierKey, ...]
    witnesses: tuple[Witness, ...]
    threshold: int
    max_age_seconds: int


def parse_policy(document: object) -> CosignPolicy:
    """The client's trust policy (``domain.bundle.TrustPolicy``, one parser of that
    document) with what the collector needs besides: every witness's URL."""
    policy = TrustPolicy.parse(document)
    witnesses = []
    for n, (key, url) in enumerate(zip(policy.witnesses, policy.witness_urls, strict=True)):
        if url is None or not url.startswith(("http://", "https://")):
            at = f"witnesses[{n}].url"
            raise InvalidInput(f"{at}: the collector needs the witness's URL", field=at)
        witnesses.append(Witness(key, url))
    return CosignPolicy(
        policy.origin, policy.log_keys, tuple(witnesses), policy.threshold, policy.max_age_seconds
    )


# -- one collector run -------------------------------------------------------------------


class LogCosigned(TypedDict):
    origin: str
    size: int
    root: str
    cosigned: list[str]
    failed: dict[str, str]
    threshold: int
    note: str


class CosignResult(LogCosigned):
    """The catalog log's cosigned checkpoint, and ``main``: the main log's."""

    main: LogCosigned


def check_policy(
    policy: CosignPolicy, origin: str, signer: SignerKey, also: Sequence[SignerKey] = ()
) -> None:
    """The policy is this log's and pins each signing key: INVALID naming the field."""
    if policy.origin != origin:
        raise InvalidInput(
            f"the policy's origin is {policy.origin!r}, this store's catalog log is {origin!r}",
            field="origin",
        )
    if any(s.verifier not in policy.log_keys for s in (signer, *also)):
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
    also: Sequence[SignerKey] = (),
) -> CosignResult:
    """One collector run (module docstring): the catalog log's checkpoint, then the main
    log's (``main``: the note that covers the log's key rotations, LOG-FORMAT "Key
    rotation"). Each is stored once ``threshold`` witnesses cosigned it; the catalog's
    is stored even when the main log's then falls short (UNAVAILABLE naming it). The
    keys ``also`` sign each note too: during a key rotation's overlap the old and the new
    key both sign, so that clients that pin either accept it (README, "Keys and disaster
    recovery")."""
    check_policy(policy, origin, signer, also)
    signers = (signer, *also)
    log = CatalogLog(ledger.db)
    with ledger.db.read() as conn:
        log.refresh(conn)
        previous = stored_checkpoint(conn, origin)
    result = _cosign_one(
        ledger, log.checkpoint(origin), previous, log.consistency, signers, policy,
        add_checkpoint, clock, what="catalog",
    )  # fmt: skip
    main = main_log_origin(origin)
    tree = MerkleLog(ledger)
    main_size = tree.size()
    with ledger.db.read() as conn:
        kept = stored_checkpoint(conn, main)
    checkpoint = Checkpoint(main, main_size, tree.root(main_size) if main_size else EMPTY_ROOT)

    def consistency(old: int, new: int) -> list[bytes]:
        return consistency_proof_from(tree.node, old, new)

    second = _cosign_one(
        ledger, checkpoint, kept, consistency, signers, policy, add_checkpoint, clock,
        what="main",
    )  # fmt: skip
    tree.flush()
    return {**result, "main": second}


def _cosign_one(
    ledger: Ledger,
    checkpoint: Checkpoint,
    previous: StoredCheckpoint | None,
    consistency: Callable[[int, int], list[bytes]],
    signers: Sequence[SignerKey],
    policy: CosignPolicy,
    add_checkpoint: AddCheckpoint,
    clock: Callable[[], float],
    *,
    what: str,
) -> LogCosigned:
    """Sign ``checkpoint``, have the witnesses cosign it, store it (or UNAVAILABLE)."""
    origin, size = checkpoint.origin, checkpoint.size
    body = checkpoint.text()
    signed = signers[0].sign(body)
    for other in signers[1:]:  # one signature line each (signed-note: several signers)
        signed = add_cosignatures(signed, [other.sign(body).rpartition("\n\n")[2]])
    known = previous.size if previous is not None and 0 < previous.size <= size else 0
    lines: list[str] = []
    cosigned: list[str] = []
    failed: dict[str, str] = {}
    not_before = clock() - policy.max_age_seconds
    for witness in policy.witnesses:
        try:
            answer = _submit(add_checkpoint, witness, consistency, known, size, signed)
        except (LedgerError, OSError) as exc:
            failed[witness.name] = str(getattr(exc, "message", exc))
            continue
        valid = witness.valid_lines(body, answer, not_before=not_before)
        if not valid:
            failed[witness.name] = (
                "its answer carries no valid cosignature by its key younger than the "
                "clients' maximum age"
            )
            continue
        cosigned.append(witness.name)
        lines.extend(valid)
    root = base64.b64encode(checkpoint.root).decode()
    # A witness is its name: one pinned with its old and new key counts once.
    if len(set(cosigned)) < policy.threshold:
        LOG.error(
            f"{what} checkpoint not cosigned: fewer witnesses than the threshold answered; "
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
            f"{len(cosigned)} of {len(policy.witnesses)} witnesses cosigned the {what} "
            f"checkpoint of size {size}, the policy needs {policy.threshold}; failed: "
            + "; ".join(f"{name}: {why}" for name, why in sorted(failed.items())),
            failed=failed,
            cosigned=cosigned,
            threshold=policy.threshold,
            origin=origin,
        )
    note = add_cosignatures(signed, lines)
    try:
        store_checkpoint(
            ledger.db,
            StoredCheckpoint(origin, size, checkpoint.root, note, int(clock() * 1_000_000)),
        )
    except Conflict as lost:  # an overlapping run stored a larger tree: keep it
        LOG.error(f"{what} checkpoint not stored: {lost.message}", extra=lost.details)
        raise
    LOG.info(
        f"{what} checkpoint cosigned and stored",
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
    consistency: Callable[[int, int], list[bytes]],
    known: int,
    size: int,
    signed: str,
) -> Sequence[str]:
    """``add-checkpoint`` from the size the store believes the witness has; on 409, once
    more from the size the witness says it has (if the log has it: a larger one means the
    witness saw a tree this log does not extend, which no retry fixes)."""
    try:
        return add_checkpoint(witness.url, signed, known, _proof(consistency, known, size))
    except Conflict as conflict:
        other = conflict.details.get("known_size")
        if type(other) is not int or not 0 <= other <= size:
            raise Unavailable(
                f"the witness knows size {other}, not one of the catalog log's {size}: it "
                "cosigned a tree this log does not extend (a restore, a rollback)"
            ) from None
        return add_checkpoint(witness.url, signed, other, _proof(consistency, other, size))


def _proof(consistency: Callable[[int, int], list[bytes]], old: int, size: int) -> list[bytes]:
    return consistency(old, size) if 0 < old < size else []
