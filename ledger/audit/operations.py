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

from domain.errors import Conflict, IntegrityFailure, InvalidInput, UsageError
from ledger.audit.results import KeygenResult

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from domain.notes import VerifierKey
    from ledger.audit.cosign import AddCheckpoint, CosignResult
    from ledger.audit.results import (
        CheckedCheckpoint,
        CheckpointNote,
        ConsistencyProof,
        InclusionProof,
        KeyRotation,
        LogOrigin,
        ProofCheck,
        ResumeCheck,
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


def write_key_pair(out: Path, private: str, public: str) -> None:
    """Write a private key file at ``out`` and its verifier key at ``out.pub``.

    The private key file is created with mode 0600 in the same call that creates it
    (``O_CREAT | O_EXCL``): it is never readable by others, not even for an instant,
    and an existing file is never overwritten (INVALID naming ``out``)."""
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
            handle.write(private + "\n")
        out.with_name(out.name + ".pub").write_text(public + "\n", encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot write {out}: {exc.strerror}", field="out") from None


def keygen(name: str, out: Path) -> KeygenResult:
    """Create an Ed25519 checkpoint signer key at ``out`` (and ``out.pub``).

    The private key file is created with mode 0600 in the same call that
    creates it (``O_CREAT | O_EXCL``): it is never readable by others, not
    even for an instant, and an existing file is never overwritten.
    """
    from domain.notes import SignerKey

    key = SignerKey.generate(name)
    write_key_pair(out, key.text(), key.verifier.text())
    return {"signer_key_file": str(out), "verifier_key": key.verifier.text()}


def check_proof(
    file: Path, checkpoint_file: Path, key: str | None = None, policy: Path | None = None
) -> ProofCheck:
    """Verify a proof file offline against a (signed) checkpoint; no store needed. With
    ``policy`` (a runtime's trust policy, R29) the checkpoint must be signed by one of its
    log keys and cosigned by its threshold of witnesses, as a runtime requires."""
    from domain.canonical import parse_json
    from domain.notes import Checkpoint
    from ledger.audit.proofs import verify_proof

    if key is not None and policy is not None:
        raise UsageError("give --key or --policy, not both")
    note = read_text(checkpoint_file, "checkpoint")
    verifier = verifier_key(key)
    if policy is not None:
        from domain.bundle import TrustPolicy, witnessed

        trust = TrustPolicy.parse(parse_json(read_text(policy, "policy"), source=str(policy)))
        cp = witnessed(note, trust)[0]
    else:
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
    if replay and report.ok:  # the log's key rotations chain (R29)
        from ledger.audit.log_keys import check_log_keys
        from ledger.audit.verify import Problem

        report.checks.append("keys")
        report.problems += [Problem(p, "keys", m) for p, m in check_log_keys(ledger)]
    if not report.ok:
        first = report.first()
        assert first is not None
        where = f"position {first.position}" if first.position else "the log"
        raise IntegrityFailure(
            f"audit failed at {where} ({first.check}): {first.message}", **report.to_json()
        )
    return report


def checkpoint(
    ledger: Ledger, *, sign: Path | None, log: str = "main", name: bool = False
) -> CheckpointNote:
    """The C2SP tlog-checkpoint of the main log or of the catalog log (R29), optionally
    as a signed note; ``name`` first names the log (``log.named``) if it is not named yet,
    so the signed origin is a log fact that ``export`` carries (R29)."""
    from domain.notes import SignerKey
    from domain.origin import catalog_origin
    from ledger.audit.proofs import checkpoint as log_checkpoint
    from ledger.audit.proofs import origin_of
    from ledger.store.catalog_log import CatalogLog

    if log not in ("main", "catalog"):
        raise InvalidInput(f"log must be main or catalog, got {log!r}", field="log")
    signer = None if sign is None else SignerKey.parse(read_text(sign, "sign"), field="sign")
    if name:
        from ledger.store.log_identity import name_log

        name_log(ledger)
    if log == "catalog":
        catalog = CatalogLog(ledger.db)
        catalog.refresh()
        cp = catalog.checkpoint(catalog_origin(origin_of(ledger)))
    else:
        cp = log_checkpoint(ledger)
    note = cp.text()
    if signer is not None:
        note = signer.sign(note)
    return {"origin": cp.origin, "size": cp.size, "root": note.split("\n")[2], "note": note}


def cosign(
    ledger: Ledger,
    *,
    sign: Path | Sequence[Path],
    policy: Path,
    add_checkpoint: AddCheckpoint,
    clock: Callable[[], float],
) -> CosignResult:
    """``catalog-ledger cosign`` (``ledger.audit.cosign``): the key and policy files read,
    the witnesses reached through ``add_checkpoint``."""
    from domain.canonical import parse_json
    from domain.notes import SignerKey
    from domain.origin import catalog_origin
    from ledger.audit.cosign import check_policy, parse_policy
    from ledger.audit.cosign import cosign as collect
    from ledger.audit.proofs import origin_of
    from ledger.store.log_identity import name_log

    files = [sign] if isinstance(sign, Path) else list(sign)
    if not files:
        raise InvalidInput("give the log's signer key", field="sign")
    signer, *also = (SignerKey.parse(read_text(f, "sign"), field="sign") for f in files)
    document = parse_json(read_text(policy, "policy"), source=str(policy))
    parsed = parse_policy(document)
    origin = catalog_origin(origin_of(ledger))
    check_policy(parsed, origin, signer, also)  # before anything is appended
    name_log(ledger)  # the signed origin is a log fact, carried by export (R29)
    return collect(
        ledger,
        origin=origin,
        signer=signer,
        policy=parsed,
        add_checkpoint=add_checkpoint,
        clock=clock,
        also=also,
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


def origin(ledger: Ledger) -> LogOrigin:
    """The log's origin and whether the log states it (``log.named``)."""
    from ledger.store.log_identity import named_origin, origin_of

    named = named_origin(ledger)
    return {"origin": named or origin_of(ledger), "named": named is not None, "appended": False}


def name_origin(ledger: Ledger, wanted: str | None) -> LogOrigin:
    """Name the log (``log.named``) if it is not named: with ``wanted``, else the origin
    it has had so far. CONFLICT when it is named already with another origin."""
    from ledger.store.log_identity import name_log

    named, appended = name_log(ledger, wanted)
    return {"origin": named, "named": True, "appended": appended}


def new_origin(ledger: Ledger, wanted: str | None) -> LogOrigin:
    """Give the log a new origin (``log.renamed``): ``wanted``, by default this store's
    ``catalog-ledger/<store id>``. It is then another log to witnesses and clients."""
    from ledger.store.log_identity import rename_log

    return {"origin": rename_log(ledger, wanted), "named": True, "appended": True}


def rotate_key(ledger: Ledger, *, old: Path, new: str, overlap: int, now: int) -> KeyRotation:
    """Record ``log_key.rotated``: the statement signed by the old signer key ``old``
    announcing ``new`` (a verifier key, as a file or text, or a signer key file whose
    verifier is taken), the old key valid until ``now + overlap``."""
    from domain.key_rotation import Rotation, rotation_statement
    from domain.notes import SignerKey, VerifierKey
    from ledger.store.log_identity import name_log, record_rotation, rotations

    signer = SignerKey.parse(read_text(old, "old"), field="old")
    text = read_text(Path(new), "new") if Path(new).is_file() else new
    if text.strip().startswith("PRIVATE+KEY+"):
        successor = SignerKey.parse(text, field="new").verifier
    else:
        successor = VerifierKey.parse(text, field="new")
    if overlap < 0:
        raise InvalidInput("the overlap must not be negative", field="overlap")
    origin_text, _ = name_log(ledger)
    earlier = rotations(ledger)
    if earlier:  # only the log's current key (the last rotation's new key) may rotate
        current = Rotation.parse(earlier[-1]).new
        if current.public != signer.verifier.public:
            raise Conflict(
                f"the log's current key is {current.text()} (its last rotation); only it "
                "can announce a successor",
                field="old",
                current_key=current.text(),
            )
    until = now + overlap
    statement = rotation_statement(origin_text, signer, successor, until)
    position = record_rotation(ledger, statement)
    return {
        "origin": origin_text,
        "old_key": signer.verifier.text(),
        "new_key": successor.text(),
        "until": until,
        "position": position,
        "statement": statement,
    }


def resume_check(ledger: Ledger, note_file: Path | None) -> ResumeCheck:
    """Whether this log resumes where its witnesses left it: the witnesses' rule
    (``domain.resume.check_resume``) applied to this store's tree against the cosigned
    checkpoint in ``note_file`` (one the witnesses or a newer export hold), or else
    against every cosigned checkpoint the store holds. STALE for a rollback, INTEGRITY
    for a fork or another log."""
    import base64

    from domain import merkle
    from domain.notes import Checkpoint
    from domain.origin import catalog_origin
    from domain.resume import check_resume
    from ledger.audit.proofs import MerkleLog
    from ledger.store import carried_checkpoints
    from ledger.store.catalog_log import CatalogLog
    from ledger.store.log_identity import origin_of

    origin = origin_of(ledger)
    with ledger.db.read() as conn:
        if note_file is not None:
            cosigned = [Checkpoint.parse(read_text(note_file, "checkpoint"))]
        else:
            stored = carried_checkpoints.read_all(conn)
            ours = (origin, catalog_origin(origin))
            cosigned = [Checkpoint(c.origin, c.size, c.root) for c in stored if c.origin in ours]
        catalog = CatalogLog(ledger.db)
        catalog.refresh(conn)
    checked: list[CheckedCheckpoint] = []
    log = MerkleLog(ledger)
    for cp in cosigned:
        if cp.origin == catalog_origin(origin):
            size = catalog.size
            current = catalog.checkpoint(cp.origin)
            extends = 0 < cp.size < size
            proof = catalog.consistency(cp.size, size) if extends else []
        else:
            size = log.size()
            current = Checkpoint(origin, size, log.root(size) if size else merkle.EMPTY_ROOT)
            extends = 0 < cp.size < size
            consistency = log.consistency(cp.size, size) if extends else None
            proof = [base64.b64decode(p) for p in consistency["proof"]] if consistency else []
        check_resume(cp, current, proof)
        checked.append({"origin": cp.origin, "cosigned_size": cp.size, "size": size})
    return {"ok": True, "origin": origin, "checked": checked}
