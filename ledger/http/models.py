"""What the read service's OpenAPI document declares: the response models, the view's
parameters and the error answers of each route (``schema/openapi.json`` is generated
from them). Validation is not here: ``parse_audience`` / ``parse_revision`` reject
every bad input as INVALID naming the part; these only tell clients (and schemathesis)
what is accepted.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ledger.http.watch import MAX_WAIT, MIN_WAIT


class ErrorBody(BaseModel):
    error: str
    message: str
    details: dict[str, Any]


class Grant(BaseModel):
    pack: str
    kind: str
    key: str
    credential_set: str | None
    install_id: str


class Fact(BaseModel):
    pack: str
    install_id: str
    kind: str
    key: str
    payload: Any
    requires: list[dict[str, str | None]]
    credential_sets: list[str] | None
    #: The generation's payload hash: with the fields above it lets a client recompute
    #: ``fact_digest`` (``domain.served.fact_digest``), and so the audience digest.
    payload_hash: str
    fact_digest: str


class StoredEvent(BaseModel):
    """An event as stored in the main log (its bytes give its id, LOG-FORMAT "Event id"):
    a revision's ``catalog.published``, a ``log_key.rotated``."""

    aggregate_id: str
    version: int
    topic: str
    state_b64: str


class Consistency(BaseModel):
    from_size: int
    proof: list[str]


class Proof(BaseModel):
    """The proof bundle (R29, LOG-FORMAT "Proof bundle"): present with ``proof=1``."""

    format: int
    #: The catalog log's checkpoint note: body, blank line, the log's signature line,
    #: the witnesses' cosignature lines (C2SP signed-note, tlog-cosignature).
    checkpoint: str
    revision_event: StoredEvent
    #: RFC 9162 inclusion proof of leaf ``revision - 1`` (base64 hashes).
    inclusion: list[str]
    #: The audience map proof of the audience's leaf: sibling hashes from the root down.
    audience: list[str]
    #: Only with ``since_size``: the RFC 9162 consistency proof from that size.
    consistency: Consistency | None = None


class Rotation(BaseModel):
    """A ``log_key.rotated`` event as stored, and its place in the main log."""

    event: StoredEvent
    #: Its leaf index in the main log (its position minus 1).
    leaf_index: int
    #: RFC 9162 inclusion proof of that leaf under ``checkpoint``'s tree (base64 hashes).
    inclusion: list[str]


class Rotations(BaseModel):
    """The log's key rotations (R29, LOG-FORMAT "Key rotation"): each proven in the main
    log under its stored cosigned checkpoint (null while the log has no rotation)."""

    format: int
    #: The main log's checkpoint note: body, the log's signature, witness cosignatures.
    checkpoint: str | None
    rotations: list[Rotation]


class View(BaseModel):
    audience: str
    revision: int
    content_digest: str
    audience_digest: str
    grants: list[Grant]
    facts: list[Fact]
    proof: Proof | None = None


class Head(BaseModel):
    revision: int
    content_digest: str


class Replication(BaseModel):
    io_running: bool
    sql_running: bool
    seconds_behind_primary: int | None
    last_error: str | None


class Health(BaseModel):
    healthy: bool
    log_head: int
    catalog_revision: int | None
    projections: dict[str, dict[str, Any]]
    #: False when this service writes nothing (read-only server or SELECT-only account).
    writes: bool = True
    #: The replica's replication from its primary (None: not a replica, or not visible).
    replication: Replication | None = None
    #: The schema contract (R24), checked once when the service started.
    schema_ok: bool = True
    schema_differences: list[dict[str, Any]] = []


# The view's parameters as the OpenAPI document describes them (R1, R19).
_KIND_DOC = "Audience kind."
_KIND_SCHEMA: dict[str, Any] = {"enum": ["app", "integration"]}
_ID_DOC = (
    "Audience id (R1): exact UTF-8, at most 255 bytes, no control characters, "
    "no leading or trailing whitespace; case and normalization are significant."
)
_ID_SCHEMA: dict[str, Any] = {
    "minLength": 1,
    "maxLength": 255,
    "pattern": r"^[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$",
}
_REVISION_DOC = "Serve only a catalog revision at least this high (else 409 STALE)."
_REVISION_SCHEMA: dict[str, Any] = {"pattern": "^[0-9]{1,18}$"}
_WAIT_DOC = (
    "Watch: with `If-None-Match` matching the audience's current ETag, wait up to this "
    "many seconds for its own content to change (200 with the new view), else 304."
)
_PROOF_DOC = (
    "1: add the proof bundle (`proof`, R29) tying the view to the cosigned checkpoint of "
    "the catalog log; never a 304. 503 UNAVAILABLE `checkpoint_pending` while no stored "
    "cosigned checkpoint covers the current revision."
)
_SINCE_DOC = (
    "With proof=1: the catalog log size the client last accepted; adds the consistency "
    "proof (`consistency`) from it to the checkpoint's size. Beyond that size (a lagging "
    "server) `consistency` is omitted: the bundle proves the smaller head, which the "
    "client answers STALE (axis `checkpoint`)."
)
_INM_DOC = (
    'ETags seen (`W/"<audience digest>"`) or `*`: 304 when the audience\'s content is '
    "unchanged, even when the revision moved."
)

VIEW_PATH = "/v1/audiences/{kind}/{audience_id:anytext}/view"
VIEW_PARAMETERS: list[dict[str, Any]] = [
    {"name": "kind", "in": "path", "required": True, "description": _KIND_DOC,
     "schema": {"type": "string", **_KIND_SCHEMA}},
    {"name": "audience_id", "in": "path", "required": True, "description": _ID_DOC,
     "schema": {"type": "string", **_ID_SCHEMA}},
    {"name": "min_revision", "in": "query", "required": False, "description": _REVISION_DOC,
     "schema": {"type": "string", **_REVISION_SCHEMA}},
    {"name": "wait", "in": "query", "required": False, "description": _WAIT_DOC,
     "schema": {"type": "integer", "minimum": MIN_WAIT, "maximum": MAX_WAIT}},
    {"name": "proof", "in": "query", "required": False, "description": _PROOF_DOC,
     "schema": {"type": "string", "enum": ["0", "1"]}},
    {"name": "since_size", "in": "query", "required": False, "description": _SINCE_DOC,
     "schema": {"type": "string", "pattern": "^[1-9][0-9]{0,17}$"}},
    {"name": "If-None-Match", "in": "header", "required": False, "description": _INM_DOC,
     "schema": {"type": "string"}},
]  # fmt: skip

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in ((400, "INVALID"), (404, "MISSING"), (409, "STALE"), (500, "INTEGRITY"))
}
#: The answers of a route that needs a credential (R26).
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {
        "model": ErrorBody,
        "description": "UNAUTHENTICATED: the bearer token is missing, malformed, unknown, "
        "revoked or expired (with `WWW-Authenticate: Bearer`)",
    },
    **ERRORS,
}
#: The view's answers: the credential route's, 304 and 503, and the proof bundle's
#: refusals (LOG-FORMAT "Proof bundle", ``ledger.http.proofs``).
VIEW_RESPONSES: dict[int | str, dict[str, Any]] = {
    304: {"description": "Not modified: the audience's content is unchanged"},
    **AUTH_ERRORS,
    500: {
        "model": ErrorBody,
        "description": "INTEGRITY (with proof=1 also: "
        "`checkpoint_mismatch` naming the table `ledger_checkpoint`, `bad_audience_map` "
        "naming the table `view_audience_map`)",
    },
    503: {
        "model": ErrorBody,
        "description": "UNAVAILABLE (too many waiters: `Retry-After`; the store is "
        "unreachable; with proof=1: `checkpoint_pending`, `unprovable_revision`, "
        "`audience_map_unavailable`)",
    },
}
#: ``GET /v1/log/rotations``'s answers (``ledger.audit.rotation_proofs``).
ROTATIONS_RESPONSES: dict[int | str, dict[str, Any]] = {
    **AUTH_ERRORS,
    500: {
        "model": ErrorBody,
        "description": "INTEGRITY (`checkpoint_mismatch` naming the table `ledger_checkpoint`: "
        "the stored main-log note is not the main log's; a stored event that does not give "
        "its event id)",
    },
    503: {
        "model": ErrorBody,
        "description": "UNAVAILABLE (the store is unreachable; `checkpoint_pending`: no "
        "stored cosigned main-log checkpoint covers the last rotation yet)",
    },
}
