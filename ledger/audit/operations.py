"""The audit commands as the public API runs them, and the small files they read.

``verify`` turns a failed report into INTEGRITY naming the first bad position;
``checkpoint`` optionally signs the note; ``prove`` picks the inclusion or the
consistency proof; ``check_proof`` and ``keygen`` need no store. What only one of
them uses is imported in it, so that importing the API (for ``status`` and ``view``)
does not import the audit, signing or proof code (issue 25.7).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from domain.errors import IntegrityFailure, InvalidInput, UsageError
from ledger.audit.results import KeygenResult

if TYPE_CHECKING:
    from collections.abc import Callable

    from domain.notes import VerifierKey
    from ledger.audit.cosign import AddCheckpoint, CosignResult
    from ledger.audit.results import (
        CheckpointNote,
        ConsistencyProof,
        InclusionProof,
        ProofCheck,
    )
    from ledger.audit.verify import AuditReport
    from ledger.store.runtime import Ledger


def read_text(path: Path, field: str) -> str:
    """A small UTF-8 input file (keys, checkpoints, proofs), or INVALID naming ``field``."""
    from ledger.sources.files import read_input_file

    data = read_input_file(path, field=field, limit=1 << 20)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{path} is not UTF-8 text", field=field) from None


def verifier_key(key: str | None) -> VerifierKey | None:
    """A verifier key given as a file or as its text."""
    from domain.notes import VerifierKey

    if key is None:
        return None
    text = read_text(Path(key), "key") if Path(key).is_file() else key
    return VerifierKey.parse(text, field="key")


def keygen(name: str, out: Path) -> KeygenResult:
    """Create an Ed25519 checkpoint signer key at ``out`` (and ``out.pub``).

    The private key file is created with mode 0600 in the same call that
    creates it (``O_CREAT | O_EXCL``): it is never readable by others, not
    even for an instant, and an existing file is never overwritten.
    """
    from domain.notes import SignerKey

    key = SignerKey.generate(name)
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise InvalidInput(
            f"{out} already exists; refusing to overwrite a key", field="out"
        ) from None
    except OSError as exc:
        raise InvalidInput(f"cannot create {out}: {exc.strerror}", field="out") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(key.text() + "\n")
        out.with_name(out.name + ".pub").write_text(key.verifier.text() + "\n", encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot write {out}: {exc.strerror}", field="out") from None
    return {"signer_key_file": str(out), "verifier_key": key.verifier.text()}


def check_proof(file: Path, checkpoint_file: Path, key: str | None = None) -> ProofCheck:
    """Verify a proof file offline against a (signed) checkpoint; no store needed."""
    from domain.canonical import parse_json
    from domain.notes import Checkpoint
    from ledger.audit.proofs import verify_proof

    note = read_text(checkpoint_file, "checkpoint")
    verifier = verifier_key(key)
    cp = verifier.verify(note) if verifier else Checkpoint.parse(note)
    document = parse_json(read_text(file, "file"), source=str(file))
    if not isinstance(document, dict):
        raise InvalidInput(f"{file} is not a proof document", field="file")
    return verify_proof(document, cp)


def checkpoint_note(from_checkpoint: Path | None) -> str | None:
    """The text of the checkpoint ``audit verify`` starts from, if given."""
    return read_text(from_checkpoint, "from_checkpoint") if from_checkpoint else None


def verify(
    ledger: Ledger,
    *,
    from_checkpoint: str | None,
    key: str | None,
    sources: bool,
    replay: bool,
    views: bool,
    progress: Callable[[int, int], None] | None,
) -> AuditReport:
    """Verify the whole log (from the checkpoint note ``from_checkpoint``); INTEGRITY
    naming the first bad position if anything fails."""
    from ledger.audit.verify import verify_log

    report = verify_log(
        ledger,
        from_checkpoint=from_checkpoint,
        verifier=verifier_key(key),
        replay=replay,
        views=views,
        sources=sources,
        progress=progress,
    )
    if not report.ok:
        first = report.first()
        assert first is not None
        where = f"position {first.position}" if first.position else "the log"
        raise IntegrityFailure(
            f"audit failed at {where} ({first.check}): {first.message}", **report.to_json()
        )
    return report


def checkpoint(ledger: Ledger, *, sign: Path | None, log: str = "main") -> CheckpointNote:
    """The C2SP tlog-checkpoint of the main log or of the catalog log (R29), optionally
    as a signed note."""
    from domain.notes import SignerKey
    from ledger.audit.proofs import checkpoint as log_checkpoint
    from ledger.audit.proofs import origin_of
    from ledger.store.catalog_log import CatalogLog, catalog_origin

    if log == "catalog":
        catalog = CatalogLog(ledger.db)
        catalog.refresh()
        cp = catalog.checkpoint(catalog_origin(origin_of(ledger)))
    elif log == "main":
        cp = log_checkpoint(ledger)
    else:
        raise InvalidInput(f"log must be main or catalog, got {log!r}", field="log")
    note = cp.text()
    if sign is not None:
        note = SignerKey.parse(read_text(sign, "sign"), field="sign").sign(note)
    return {"origin": cp.origin, "size": cp.size, "root": note.split("\n")[2], "note": note}


def cosign(
    ledger: Ledger,
    *,
    sign: Path,
    policy: Path,
    add_checkpoint: AddCheckpoint,
    clock: Callable[[], float],
) -> CosignResult:
    """``catalog-ledger cosign`` (``ledger.audit.cosign``): the key and policy files read,
    the witnesses reached through ``add_checkpoint``."""
    from domain.canonical import parse_json
    from domain.notes import SignerKey
    from ledger.audit.cosign import check_policy, parse_policy
    from ledger.audit.cosign import cosign as collect
    from ledger.audit.proofs import origin_of
    from ledger.store.catalog_log import catalog_origin

    signer = SignerKey.parse(read_text(sign, "sign"), field="sign")
    document = parse_json(read_text(policy, "policy"), source=str(policy))
    parsed = parse_policy(document)
    origin = catalog_origin(origin_of(ledger))
    check_policy(parsed, origin, signer)
    return collect(
        ledger,
        origin=origin,
        signer=signer,
        policy=parsed,
        add_checkpoint=add_checkpoint,
        clock=clock,
    )


def check_proof_request(*, position: int | None, from_size: int | None) -> None:
    """USAGE unless exactly one of ``position`` and ``from_size`` is given."""
    if (position is None) == (from_size is None):
        raise UsageError("give either --position N [--size S] or --from-size A [--to-size B]")


def prove(
    ledger: Ledger,
    *,
    position: int | None,
    size: int | None,
    from_size: int | None,
    to_size: int | None,
) -> InclusionProof | ConsistencyProof:
    """An inclusion proof (``position``) or a consistency proof (``from_size``)."""
    check_proof_request(position=position, from_size=from_size)
    from ledger.audit.proofs import MerkleLog

    log = MerkleLog(ledger)
    if position is not None:
        return log.inclusion(position, size or log.size())
    assert from_size is not None
    return log.consistency(from_size, to_size or log.size())
