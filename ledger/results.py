"""What the store's own operations return: the typed results of ``init``, ``doctor``,
``log``, ``status``, the lease, ``import``, ``pack-hash`` and the projections.

The read and admin side of the public API (``ledger.api``); the command side's results
(``apply``, ``publish``, ``import-legacy``) are in ``ledger.commands.results``, the
audit's (history, proofs, checkpoints, keys) in ``ledger.audit.results``. Each is exactly
the JSON the CLI prints with ``--json``.
"""

from __future__ import annotations

from typing import Any, TypedDict

from projections.queries.status import PackStatus


class InitResult(TypedDict):
    engine: str
    server_version: str
    schema_version: int
    head_position: int
    created: bool
    db: str


class SchemaDifference(TypedDict):
    object: str
    expected: str
    found: str
    safe: bool


class DoctorResult(TypedDict):
    ok: bool
    differences: list[SchemaDifference]


class LogHead(TypedDict):
    position: int
    chain: str


class ImportResult(TypedDict):
    """``import --jsonl``: the imported log (size, chain head, Merkle root) and the views."""

    imported: int
    head_position: int
    chain: str  # hex, as `log` and `audit verify` show it
    root: str  # base64, as `audit verify` and checkpoints show it
    origin: str  # the log's checkpoint origin (log.named; else this store's id)
    views_rebuilt: list[str]


class LogRow(TypedDict):
    position: int
    topic: str
    aggregate_id: str
    version: int
    event_id: str
    chain: str


class LogPage(TypedDict):
    head: LogHead
    events: list[LogRow]


class StatusResult(TypedDict):
    head: int
    packs: list[PackStatus]


class PackHash(TypedDict):
    pack: str
    category: str
    source: dict[str, Any]
    components: int
    payload_hash_v1: str
    payload_hash_v0: str


class ViewCheck(TypedDict):
    name: str
    position: int
    rows: int
    ok: bool
    difference: dict[str, Any] | None
    digest: str  # hex digest of the live rows: the same log gives it on every engine


class ProjectionsVerifyResult(TypedDict):
    ok: bool
    views: list[ViewCheck]


class CaughtUp(TypedDict):
    position: int
    stopped: bool


class LeaseStatus(TypedDict):
    lease: str
    held: bool
    holder: str | None
    epoch: int
    expires_at: str | None  # RFC 3339 UTC
