"""What each command returns: one typed shape shared by the CLI, HTTP and Python API.

Command results are recorded in the log (``command.recorded``) and an exact
retry returns the recorded result (R10), so a result is a JSON object by
nature: these are ``TypedDict`` declarations of that object. mypy checks
every producer and consumer against them, ``--json`` prints them unchanged,
and a result read back from a 0.1 log needs no conversion.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class PackOutcome(TypedDict):
    """What ``apply`` did with one pack of the manifest.

    A removal (``remove``) names what it retired: the generation (install id,
    revision, payload hash) and the pointer's new epoch, or the local_path record
    (epoch null). Removals follow the manifest's packs, in ``remove`` order.
    """

    pack: str
    decision: str  # install | adopt | advance | local_update | unchanged | remove
    source_kind: str
    revision: str | None
    payload_hash: str
    install_id: str | None
    epoch: int | None


class BindingOutcome(TypedDict):
    """One binding event of a release."""

    audience: str
    pack: str
    kind: str
    key: str
    credential_set: str | None
    install_id: NotRequired[str]  # absent on revocations
    from_install_id: NotRequired[str]  # re-bindings only


class BindingChanges(TypedDict):
    granted: list[BindingOutcome]
    rebound: list[BindingOutcome]
    revoked: list[BindingOutcome]


class CatalogCounts(TypedDict):
    activations: int
    audiences: int
    facts: int
    grants: int


class PublicationBlocked(TypedDict):
    reason: str  # DIRTY_PACK
    packs: list[str]
    message: str


class CatalogOutcome(TypedDict):
    """The catalog revision a release or ``publish`` left in force."""

    revision: int
    #: The digest of ``revision`` (None while nothing was ever published).
    content_digest: str | None
    published: bool
    #: Counts of the validated catalog (absent when publication is blocked).
    counts: NotRequired[CatalogCounts]
    #: A validated catalog left unpublished (``apply --no-publish``): not served.
    candidate_content_digest: NotRequired[str]
    #: Why nothing could be published although the release applied (R12).
    blocked: NotRequired[PublicationBlocked]


class RecoveredAttempt(TypedDict):
    """An abandoned ``preparing`` attempt the lease holder turned ``failed_dirty`` (R12)."""

    pack: str
    install_id: str


class ApplyResult(TypedDict):
    command_id: str
    noop: bool
    replayed: bool
    packs: list[PackOutcome]
    bindings: BindingChanges
    catalog: CatalogOutcome
    recovered: list[RecoveredAttempt]


class PublishResult(CatalogOutcome):
    """``publish``: the revision in force after it, and whether this call appended it."""

    command_id: str
    noop: bool
    replayed: bool


class ImportLegacyResult(TypedDict):
    command_id: str
    noop: bool
    replayed: bool
    imported: list[str]
    unchanged: list[str]


class PlannedPack(PackOutcome):
    """One pack of a plan: what ``apply`` will report for it, and where it comes from
    (the active generation's revision and payload hash before the release)."""

    from_revision: str | None
    from_payload_hash: str | None


class AudienceChange(TypedDict):
    """An audience whose served view the release changes: its new digest, ``None`` (and
    ``loses_all_grants``) when it would lose every grant."""

    audience: str
    digest: str | None
    loses_all_grants: bool


class PlanManifest(TypedDict):
    path: str
    digest: str  # sha256 of the manifest file's bytes


class PlanAt(TypedDict):
    """The log head the plan was computed at."""

    position: int
    chain: str


class PlanResult(TypedDict):
    """``apply --plan``: what the following ``apply`` will report, computed by its own
    preflight (``packs``, ``bindings``, ``catalog`` are its fields), appending nothing.

    ``refused`` is the typed rejection ``apply`` would raise (then ``catalog`` is
    ``None``); ``store`` the identity of the store (its ``store_id``),
    ``at`` the head it was computed at; ``command_id`` is the apply's (R10)."""

    format: str
    summary: str
    empty: bool
    store: str | None
    manifest: PlanManifest
    at: PlanAt
    command_id: str
    publish: bool
    packs: list[PlannedPack]
    bindings: BindingChanges
    catalog: CatalogOutcome | None
    audiences: list[AudienceChange]
    refused: dict[str, Any] | None


CommandResult = ApplyResult | PublishResult | ImportLegacyResult
