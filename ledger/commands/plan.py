"""``apply --plan``: what ``apply`` would do, and ``apply --plan-file``: that plan applied.

A plan is ``apply``'s own preflight (``ApplyHandler.decide``: one snapshot, the same
decisions, the same simulated release, incremental or full, R30) stopped before the
writer lease: it appends nothing and takes no lease. Its ``packs``, ``bindings`` and
``catalog`` are the fields the following ``apply`` reports (``apply_result`` builds
both), with each pack's previous revision and payload hash, the audiences whose view
changes (digest, or ``None`` and ``loses_all_grants``), and the typed rejection ``apply``
would raise when it would refuse the release.

A plan file is not trusted (R28). It records the store it was made for (its
``store_id``), the manifest's path and digest, the log head it was computed
at and the command id of the apply (R10). ``apply --plan-file`` re-checks all of it:

* another store, another manifest (its bytes), or a document that is not what this
  manifest plans on this store at that head (altered): INVALID, nothing appended;
* a store that moved since the plan (its head): CONFLICT, nothing appended;
* a plan already applied: the recorded result (an exact retry, R10);
* otherwise the release runs with the plan's command id, and its final append happens
  only if what it appends still reports exactly the plan (else CONFLICT).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any, cast

import orjson
import sqlalchemy as sa

from domain.errors import Conflict, InvalidInput, LedgerError
from domain.identity import PackName
from domain.matrix import Decision
from ledger.commands.apply import ApplyHandler
from ledger.commands.results import (
    ApplyResult,
    AudienceChange,
    BindingChanges,
    PackOutcome,
    PlannedPack,
    PlanResult,
)
from ledger.commands.simulate import Preflight, apply_result, removal_outcome
from ledger.log import tables
from ledger.store.runtime import Ledger
from publisher.catalog import PublicationRejected

__all__ = ["PLAN_FORMAT", "PlanHandler", "plan_summary", "store_identity"]

PLAN_FORMAT = "catalog-ledger.plan/1"
#: The fields a plan shares with the result of the apply that follows it.
SHARED = ("command_id", "packs", "bindings", "catalog")
_MOVED = (Decision.INSTALL, Decision.ADVANCE)


def store_identity(ledger: Ledger) -> str | None:
    """The store's identity: the ``store_id`` ``init`` gave it (``ledger_meta``; also
    the checkpoint origin). Every store has its own, a restored copy too (R28)."""
    meta = tables.meta
    with ledger.db.read() as conn:
        found = conn.execute(sa.select(meta.c.value).where(meta.c.name == b"store_id")).scalar()
    return None if found is None else bytes(found).decode()


def manifest_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise InvalidInput(
            f"cannot read the manifest {str(path)!r}: {exc}", field="manifest"
        ) from exc


class PlanHandler:
    """``plan`` and ``apply --plan-file`` over an ``ApplyHandler`` (built per call)."""

    def __init__(self, handler: ApplyHandler) -> None:
        self.handler = handler

    def plan(self, manifest_path: Path, *, publish: bool = True) -> PlanResult:
        """What ``apply manifest_path`` would do now, from its own preflight."""
        handler = self.handler
        manifest, base, anchor, packs, digest = handler.resolve(manifest_path, publish)
        seen: list[Preflight] = []
        handler.observe = seen.append
        try:
            handler.decide(manifest, packs, base, anchor, None, digest, publish)
        except PublicationRejected:
            if not seen:
                raise
        finally:
            handler.observe = None
        if not seen:  # a derived command id is never recorded before its own head
            raise Conflict("the release was recorded while it was planned", rule="R10")
        where = {"path": str(manifest_path.resolve()), "digest": manifest_digest(manifest_path)}
        return plan_of(seen[0], store_identity(handler.ledger), where, publish)

    def apply_plan(self, plan_file: Path, *, manifest_path: Path | None = None) -> ApplyResult:
        """Apply exactly the plan in ``plan_file``, trusting nothing in it (R28)."""
        handler = self.handler
        recorded = read_plan(plan_file)
        path = manifest_path or Path(recorded["manifest"]["path"])
        found = manifest_digest(path)
        if found != recorded["manifest"]["digest"]:
            raise InvalidInput(
                "the manifest is not the one the plan was made from (its bytes changed)",
                field="manifest",
                rule="R28",
                manifest=str(path),
                planned_digest=recorded["manifest"]["digest"],
                digest=found,
            )
        if store_identity(handler.ledger) != recorded["store"]:
            raise InvalidInput(
                "the plan was made for another store",
                field="plan",
                rule="R28",
                planned_store=recorded["store"],
            )

        def observe(preflight: Preflight) -> None:
            at = recorded["at"]
            head = preflight.head
            if (head.position, head.chain.hex()) != (at["position"], at["chain"]):
                raise Conflict(
                    "the store moved since the plan was made: make a new plan",
                    rule="R11",
                    planned_at=at["position"],
                    position=head.position,
                )
            again = plan_of(preflight, recorded["store"], recorded["manifest"], recorded["publish"])
            again = orjson.loads(orjson.dumps(again))  # as the file holds it
            if again != recorded:
                differs = sorted(k for k in again if again[k] != recorded[k])  # type: ignore[literal-required]
                raise InvalidInput(
                    "the plan file is not what this manifest plans on this store (altered)",
                    field="plan",
                    rule="R28",
                    fields=differs,
                )

        def confirm(result: ApplyResult) -> None:
            if orjson.loads(orjson.dumps(shared(result))) != shared(recorded):
                raise Conflict(
                    "the release no longer does what the plan says: make a new plan", rule="R11"
                )

        handler.observe, handler.confirm = observe, confirm
        try:
            return handler.apply(
                path, command_id=recorded["command_id"], publish=recorded["publish"]
            )
        finally:
            handler.observe = handler.confirm = None


def shared(document: ApplyResult | PlanResult) -> dict[str, Any]:
    """The fields a plan shares with its apply's result, with ``apply``'s pack keys."""
    keys = tuple(PackOutcome.__annotations__)
    out: dict[str, Any] = {k: document[k] for k in SHARED}  # type: ignore[literal-required]
    out["packs"] = [{k: p[k] for k in keys} for p in out["packs"]]
    return out


def read_plan(path: Path) -> PlanResult:
    """The plan document in ``path``, checked for shape (its content is checked by
    recomputing it)."""
    try:
        document = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise InvalidInput(f"cannot read the plan file {str(path)!r}: {exc}", field="plan") from exc
    required = set(PlanResult.__annotations__)
    if (
        not isinstance(document, dict)
        or document.get("format") != PLAN_FORMAT
        or not required <= set(document)
        or not isinstance(document.get("manifest"), dict)
        or not {"path", "digest"} <= set(document["manifest"])
        or not isinstance(document.get("at"), dict)
        or not {"position", "chain"} <= set(document["at"])
        or not isinstance(document.get("command_id"), str)
        or not isinstance(document.get("publish"), bool)
    ):
        raise InvalidInput(f"{str(path)!r} is not a {PLAN_FORMAT} plan file", field="plan")
    return cast(PlanResult, document)


def write_plan(path: Path, plan: PlanResult) -> None:
    path.write_bytes(orjson.dumps(plan, option=orjson.OPT_INDENT_2) + b"\n")


def plan_of(preflight: Preflight, store: str | None, manifest: Any, publish: bool) -> PlanResult:
    """The plan document of ``preflight``."""
    release, plan = preflight.preview, preflight.plan
    refused: dict[str, Any] | None = None
    audiences: list[AudienceChange] = []
    if release is not None:
        candidates = {
            r.name: release.authorities[r.name].install_id or ""
            for r in preflight.packs
            if plan[r.name][0] in _MOVED
        }
        result = apply_result(
            preflight.derived_id,
            preflight.packs,
            plan,
            candidates,
            release,
            recovered=[],
            noop=release.noop,
        )
        packs, bindings, catalog = result["packs"], result["bindings"], result["catalog"]
        event = release.publication.event
        for kind, ident, digest in event["audiences"] if event is not None else ():
            audiences.append(
                {
                    "audience": f"{kind}:{ident}",
                    "digest": digest,
                    "loses_all_grants": digest is None,
                }
            )
        empty = release.noop
    else:
        assert preflight.refused is not None
        error: LedgerError = preflight.refused
        refused = {**error.to_json(), "exit_code": error.exit_code}
        packs = [
            {
                "pack": r.name,
                "decision": plan[r.name][0].value,
                "source_kind": r.source.kind.value,
                "revision": r.source.revision,
                "payload_hash": r.payload_hash,
                "install_id": None,
                "epoch": None,
            }
            for r in preflight.packs
        ]
        packs += [
            removal_outcome(preflight.states[PackName.trusted(p)])
            for p, (d, _) in plan.items()
            if d is Decision.REMOVE
        ]
        bindings = BindingChanges(granted=[], rebound=[], revoked=[])
        catalog = None
        empty = False
    planned = [_planned(p, preflight) for p in packs]
    document: PlanResult = {
        "format": PLAN_FORMAT,
        "summary": "",
        "empty": empty,
        "store": store,
        "manifest": {"path": manifest["path"], "digest": manifest["digest"]},
        "at": {"position": preflight.head.position, "chain": preflight.head.chain.hex()},
        "command_id": preflight.derived_id,
        "publish": publish,
        "packs": planned,
        "bindings": bindings,
        "catalog": catalog,
        "audiences": audiences,
        "refused": refused,
    }
    document["summary"] = plan_summary(document)
    return document


def _planned(outcome: Any, preflight: Preflight) -> PlannedPack:
    """``outcome`` with the revision and payload hash the pack had before the release."""
    before: tuple[str | None, str | None] = (outcome["revision"], outcome["payload_hash"])
    state = preflight.states.get(PackName.trusted(outcome["pack"]))
    if outcome["decision"] != Decision.REMOVE.value and state is not None:
        activation, local, legacy = state.activation, state.local, state.legacy
        if activation is not None and activation.payload_hash is not None:
            before = (activation.revision, activation.payload_hash)
        elif local is not None and not local.removed:
            before = (None, local.payload_hash)
        elif legacy is not None:
            before = (legacy.source.get("revision"), legacy.applied_payload_hash)
        else:
            before = (None, None)
    return cast(
        PlannedPack, {**outcome, "from_revision": before[0], "from_payload_hash": before[1]}
    )


_VERBS = (
    ("install", "installed"),
    ("adopt", "adopted"),
    ("advance", "advance"),
    ("local_update", "updated"),
    ("remove", "removed"),
)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def plan_summary(plan: PlanResult) -> str:
    """One line: "3 packs advance, 1 removed; 2 grants; 2 audiences change; ..."."""
    decisions = Counter(p["decision"] for p in plan["packs"])
    moved = [(decisions[d], verb) for d, verb in _VERBS if decisions[d]]
    parts = []
    if moved:
        (n, verb), rest = moved[0], moved[1:]
        parts.append(", ".join([f"{_count(n, 'pack')} {verb}", *(f"{m} {v}" for m, v in rest)]))
    bindings = plan["bindings"]
    granted, rebound, revoked = (len(bindings[k]) for k in ("granted", "rebound", "revoked"))
    words = [(granted, "grant"), (rebound, "rebind"), (revoked, "revocation")]
    if any(n for n, _ in words):
        parts.append(", ".join(_count(n, w) for n, w in words if n))
    if plan["audiences"]:
        lost = sum(a["loses_all_grants"] for a in plan["audiences"])
        change = f"{_count(len(plan['audiences']), 'audience')} change"
        parts.append(change + (f" ({lost} lose all grants)" if lost else ""))
    catalog = plan["catalog"]
    if plan["refused"] is not None:
        parts.append(f"REFUSED: {plan['refused']['error']}")
    elif catalog is not None and catalog["published"]:
        parts.append(f"publishes revision {catalog['revision']}")
    elif catalog is not None and "blocked" in catalog:
        parts.append("publication blocked")
    elif catalog is not None and "candidate_content_digest" in catalog:
        parts.append("validated, not published")
    return "; ".join(parts) if parts else "no changes"
