"""``rollback --to-revision N``: the release that restores revision N's content, applied
through the normal ``apply``.

1. read revision N and the store now from the log (R28; ``ledger.audit.revision_state``,
   handed in by the caller: commands do not import the audit);
2. plan the release (``domain.rollback``): advance, reinstall, remove, unchanged per
   pack, N's bindings restored, ``local_path`` packs and credentials left alone;
3. resolve every source the release reads again — a repository or commit that is gone,
   or content that is not what N froze, is INVALID naming the pack and source, before
   anything is appended;
4. write the manifest to a scratch file and ``apply`` it (the lease, the checks, R8,
   R11); then replay the published revision and compare its payload-equivalence digest
   with N's (``publisher.equivalence``).

``plan=True`` stops after step 3: it prints the manifest and the pack-level comparison
(N's packs against the active ones) and appends nothing.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import orjson

from domain.errors import InvalidInput
from domain.rollback import ADVANCE, REINSTALL, RevisionContent, RollbackPlan, StoreNow
from domain.rollback import plan_rollback as plan_release
from ledger.commands.results import ApplyResult, PlanResult
from ledger.commands.service import CommandService
from ledger.sources.resolve import load_manifest, resolve_packs

__all__ = ["CREDENTIALS_NOTE", "LOCAL_NOTE", "RollbackHandler", "RollbackResult"]

LOCAL_NOTE = "local_path packs are left alone (not rolled back)"
CREDENTIALS_NOTE = "credentials are not rolled back (issued and revoked ones stay as they are)"


class RevisionDigests(TypedDict):
    revision: int
    content_digest: str
    payload_equivalence_digest: str


class RollbackResult(TypedDict):
    """``rollback``'s result (``--json``). ``published`` is the revision the rollback
    published (absent with ``plan`` or when nothing changed); ``equivalent`` compares
    the payload-equivalence digest of the revision in force after it (with ``plan``:
    now) with N's."""

    to_revision: int
    plan: bool
    summary: str
    packs: list[dict[str, Any]]
    bindings: dict[str, list[dict[str, Any]]]
    changed_audiences: list[str]
    left_alone: dict[str, Any]
    manifest: dict[str, Any]
    target: RevisionDigests
    current: RevisionDigests | None
    published: NotRequired[RevisionDigests]
    equivalent: bool
    apply: NotRequired[ApplyResult]
    #: With ``plan``: ``apply --plan`` of the rollback's manifest (appends nothing).
    apply_plan: NotRequired[PlanResult]


#: Reads revision N and the store now from the log; reads one revision.
ReadInputs = Callable[[int], tuple[RevisionContent, StoreNow]]
ReadRevision = Callable[[int], RevisionContent]

_INDEX = re.compile(r"^packs\[(\d+)\]")


class RollbackHandler:
    """The ``rollback`` command over a command service (its ``apply``) and the two
    log readers it is given."""

    def __init__(self, service: CommandService, inputs: ReadInputs, read: ReadRevision) -> None:
        self.service = service
        self.inputs = inputs
        self.read = read

    def rollback(self, to_revision: int, *, plan: bool = False) -> RollbackResult:
        target, now = self.inputs(to_revision)
        release = plan_release(target, now)
        with tempfile.TemporaryDirectory(prefix="catalog-ledger-rollback-") as scratch:
            path = Path(scratch) / f"rollback-to-{to_revision}.json"
            path.write_bytes(orjson.dumps(release.manifest(), option=orjson.OPT_INDENT_2))
            _check_sources(release, path)
            result = _result(release, plan)
            if plan:  # what `apply` of that manifest would do: its own preflight
                result["apply_plan"] = self.service.plan(path)
                return result
            applied = self.service.apply(path)
        result["apply"] = applied
        catalog = applied["catalog"]
        # What is in force after it: the revision it published, or (nothing new, or
        # publication blocked, R12) the one in force before.
        after = self.read(catalog["revision"]) if catalog["published"] else now.revision
        if catalog["published"] and after is not None:
            result["published"] = _digests(after)
        result["equivalent"] = (
            after is not None and after.equivalence_digest == target.equivalence_digest
        )
        return result


def _check_sources(release: RollbackPlan, path: Path) -> None:
    """Resolve every pack the release advances or reinstalls, as ``apply`` will: a source
    that is gone, or whose content is not the payload N froze, is INVALID naming the pack
    and its source (nothing is appended)."""
    manifest = load_manifest(path)  # the manifest's own checks (R1, R5)
    steps = {s.pack: s for s in release.steps}
    skip = [
        i for i, p in enumerate(manifest.packs) if steps[p.name].action not in (ADVANCE, REINSTALL)
    ]
    try:
        resolved = resolve_packs(manifest.packs, base=path.parent, skip=skip)
    except InvalidInput as exc:
        found = _INDEX.match(exc.field)
        if found is None:
            raise
        pack = manifest.packs[int(found.group(1))]
        raise _unresolvable(release, pack.name, exc.message.split(": ", 1)[-1]) from None
    for r in resolved:
        then = steps[r.name].then
        assert then is not None
        if r.payload_hash != then.payload_hash:
            raise _unresolvable(
                release,
                r.name,
                f"its content is {r.payload_hash}, not the {then.payload_hash} it had",
            )


def _unresolvable(release: RollbackPlan, pack: str, why: str) -> InvalidInput:
    then = next(s.then for s in release.steps if s.pack == pack)
    assert then is not None and then.source is not None
    source = then.source
    return InvalidInput(
        f"pack {pack!r}: the source revision {release.target.revision} bound can't be "
        f"resolved any more ({source.repo}@{source.revision}:{source.path}): {why}",
        field="to_revision",
        pack=pack,
        repo=source.repo,
        revision=source.revision,
        path=source.path,
        rule="R28",
    )


def _digests(revision: RevisionContent) -> RevisionDigests:
    return {
        "revision": revision.revision,
        "content_digest": revision.content_digest,
        "payload_equivalence_digest": revision.equivalence_digest,
    }


def _result(release: RollbackPlan, plan: bool) -> RollbackResult:
    current = release.current
    return {
        "to_revision": release.target.revision,
        "plan": plan,
        "summary": release.summary(),
        "packs": [s.to_json() for s in release.steps],
        "bindings": {
            "restore": [g.to_json() for g in release.restore],
            "revoke": [g.to_json() for g in release.revoke],
        },
        "changed_audiences": list(release.changed_audiences),
        "left_alone": {
            "local_path": list(release.local),
            "notes": [LOCAL_NOTE, CREDENTIALS_NOTE],
        },
        "manifest": release.manifest(),
        "target": _digests(release.target),
        "current": None if current is None else _digests(current),
        "equivalent": current is not None
        and current.equivalence_digest == release.target.equivalence_digest,
    }
