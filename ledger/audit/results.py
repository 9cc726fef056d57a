"""What the audit side returns: typed shapes shared by the CLI, HTTP and Python API."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict


class InclusionProof(TypedDict):
    """RFC 9162 inclusion proof of one event (hashes base64)."""

    type: Literal["inclusion"]
    position: int
    leaf_index: int
    tree_size: int
    event_id: str
    leaf_hash: str
    proof: list[str]
    root: str


class ConsistencyProof(TypedDict):
    """RFC 9162 consistency proof between two tree sizes (hashes base64)."""

    type: Literal["consistency"]
    size1: int
    size2: int
    root1: str
    root2: str
    proof: list[str]


class ProofCheck(TypedDict):
    """A proof file that verified against a checkpoint."""

    ok: bool
    type: str
    position: NotRequired[int]
    size: NotRequired[int]
    size1: NotRequired[int]
    size2: NotRequired[int]


class CheckpointNote(TypedDict):
    origin: str
    size: int
    root: str
    note: str


class HistoryEvent(TypedDict):
    """One lifecycle event of a pack, summarized (``history``)."""

    position: int
    event: str  # the type name, e.g. generation.prepared
    event_id: str
    timestamp: str | None
    install_id: NotRequired[str]
    ordinal: NotRequired[int]
    origin: NotRequired[str]
    epoch: NotRequired[int]
    revision: NotRequired[str | None]
    dirty: NotRequired[bool]
    reason: NotRequired[str]
    from_install_id: NotRequired[str | None]
    #: Null on a retirement by removal (R7), which says ``removed: true``.
    successor_install_id: NotRequired[str | None]
    removed: NotRequired[bool]
    incarnation: NotRequired[int]  # a re-installed local_path pack
    payload_hash: NotRequired[str]


class HistoryResult(TypedDict):
    pack: str
    events: list[HistoryEvent]


class AudienceHistoryEvent(TypedDict):
    """One event about an audience (``history --audience``): its bindings, its
    credentials (R26) and its published view digests (R28), summarized; a credential's
    token digest is never shown."""

    position: int
    event: str  # the type name, e.g. credential.issued
    event_id: str
    timestamp: str | None
    pack: NotRequired[str]
    kind: NotRequired[str]
    key: NotRequired[str]
    credential_set: NotRequired[str | None]
    install_id: NotRequired[str | None]
    from_install_id: NotRequired[str]
    credential_id: NotRequired[str]
    issued_at: NotRequired[str]
    expires_at: NotRequired[str | None]
    revoked_at: NotRequired[str]
    revision: NotRequired[int]
    digest: NotRequired[str | None]


class AudienceHistoryResult(TypedDict):
    audience: str
    events: list[AudienceHistoryEvent]


class PastGrant(TypedDict):
    pack: str
    kind: str
    key: str
    credential_set: str | None
    install_id: str


class PastFact(TypedDict):
    pack: str
    install_id: str
    kind: str
    key: str
    fact_digest: str


class PastView(TypedDict):
    """What an audience was served at a past revision, replayed from the log alone."""

    audience: str
    revision: int
    position: int
    content_digest: str
    audience_digest: str
    grants: list[PastGrant]
    facts: list[PastFact]


JsonObject = dict[str, Any]


class KeygenResult(TypedDict):
    """``audit keygen``: the signer key file written and its verifier key's text."""

    signer_key_file: str
    verifier_key: str


class LogOrigin(TypedDict):
    """``audit origin``: the log's origin, whether a ``log.named`` event states it, and
    whether this call appended it (R29)."""

    origin: str
    named: bool
    appended: bool


class KeyRotation(TypedDict):
    """``audit rotate-key``: the rotation statement recorded and where (R29)."""

    origin: str
    old_key: str
    new_key: str
    until: int
    position: int
    statement: str


class CheckedCheckpoint(TypedDict):
    origin: str
    cosigned_size: int
    size: int


class ResumeCheck(TypedDict):
    """``audit resume-check``: every cosigned checkpoint this log extends (R29)."""

    ok: bool
    origin: str
    checked: list[CheckedCheckpoint]
