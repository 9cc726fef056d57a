"""R30 under attack: ``apply`` on the revision in force (frozen packs, known local packs,
the incremental revision, the preflight release reused under the lease) against hostile
users and hostile concurrent writers, on real stores (SQLite file and MariaDB).

Each test states the attack and the outcome the old full path (or R11) requires. Tests
found in review: each was a defect, fixed with the test that names it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import ledger.commands.apply as apply_module
from domain.errors import Conflict, InvalidInput, LedgerError
from ledger.audit.verify import verify_log
from ledger.commands.publish import PublishHandler
from ledger.commands.publishing import read_catalog_in_force
from ledger.commands.results import ApplyResult
from ledger.commands.service import CommandService
from ledger.commands.unit_of_work import UnitOfWork
from ledger.log.db import open_database
from ledger.sources.resolve import resolve_packs
from ledger.store.runtime import Ledger
from tests.support.gitrepo import component, local, official, pack_json, push_closure
from tests.support.lifecycle_support import World
from tests.support.rogue import Rogue

HOLDER = "r30-hostile"
#: Audiences bound to a pack no release here changes (keeps releases under the reuse limit).
FILLERS = 8
NOW = 1_800_000_000.0


# -- helpers --------------------------------------------------------------------------------


def full_build_is_a_noop(world: World) -> bool:
    """Does a full rebuild of the store's snapshot equal the revision in force?"""
    staged = PublishHandler(world.ledger, UnitOfWork(world.ledger), incremental=False)
    result = staged.stage_publication()
    return isinstance(result, dict) and bool(result["noop"])


def audits_clean(world: World) -> None:
    report = verify_log(world.ledger)
    assert report.ok, report.first()


def racer(world: World) -> CommandService:
    """The release's writer: its own connection, an injected clock, no ``--wait``."""
    return CommandService(
        Ledger(open_database(world.url)),
        holder=HOLDER,
        lease_wait=0.0,
        renew_every=3600.0,
        clock=lambda: NOW,
    )


@pytest.fixture
def rogue(world: World) -> Iterator[Rogue]:
    writer = Rogue(world, HOLDER)
    yield writer
    writer.close()


def after_prepare(service: CommandService, rival: Callable[[], Any]) -> list[int]:
    """Run ``rival`` once, right after the release's ``prepare`` append (under its
    lease: after the states its plan was made from were read, before its final append
    reads them again). Returns a list that holds 1 once it ran."""
    fired: list[int] = []
    prepare = service.steps.prepare

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = prepare(*args, **kwargs)
        if not fired:
            fired.append(1)
            rival()
        return out

    service.steps.prepare = wrapped  # type: ignore[method-assign]
    return fired


# -- (3) a concurrent writer between the plan and the final append's read ------------------


def test_r30_rogue_advance_of_a_named_unchanged_pack_after_the_plan_is_not_swallowed(
    world: World, rogue: Rogue
) -> None:
    """Revision 1 binds ``sales`` to app:crm (and ``z`` to eight more audiences, so the
    release is built on the revision in force); ``other`` is active at c1 and bound by
    nobody. The release advances ``sales`` (c1 -> c2), names ``other`` at c1 (unchanged)
    and binds it to app:ops. A rogue writer (past the lease with a copy of its handle)
    advances ``other`` to c2 right after the release's prepare append, i.e. after the
    states its plan was made from were read and before its final append reads them again.

    R11 (issue 27.4): the change flips the decision for ``other`` (the manifest wants
    c1, the store has c2: advance, not unchanged), so the release must end in CONFLICT
    or decide again; it must never report ``other`` unchanged and publish app:ops bound
    to c2, a revision the manifest did not ask for."""
    c1 = {p: world.commit(p, 1) for p in ("sales", "other", "z")}
    fillers = [b for i in range(FILLERS) for b in push_closure(f"app:f{i}", "z")]
    world.service.apply(
        world.manifest(
            [world.official(p, c) for p, c in c1.items()],
            push_closure("app:crm", "sales") + fillers,
        )
    )
    release = world.manifest(
        [
            world.official("sales", world.commit("sales", 2)),
            world.official("other", c1["other"]),
            world.official("z", c1["z"]),
        ],
        push_closure("app:crm", "sales") + push_closure("app:ops", "other") + fillers,
    )
    service = racer(world)
    fired = after_prepare(service, lambda: rogue.advance("other", 2))
    try:
        outcome: ApplyResult | LedgerError = service.apply(release)
    except LedgerError as exc:
        outcome = exc
    finally:
        service.ledger.close()
    assert fired == [1]
    audits_clean(world)
    # The final append is fenced on the states the plan read: refused, nothing decided
    # on stale state (the rogue's generation of ``other`` stays, unbound).
    assert isinstance(outcome, Conflict), outcome
    activation = world.state("other").activation
    assert activation is not None and activation.revision != c1["other"]


# -- (1) a decision the full build would not make -------------------------------------------


def profile_pack(name: str, version: int, credential_sets: list[str] | None) -> bytes:
    """A one-component pack: a callout profile, declaring ``credential_sets`` or none."""
    profile = component("callout_profile", "erp", {"v": version}, credential_sets=credential_sets)
    return pack_json(name, "app", [profile])


def test_r30_r15_a_rebind_onto_a_component_without_credential_sets_is_rejected(
    world: World,
) -> None:
    """app:x is bound to p's profile with credential set erp-prod; p@c2's
    profile declares none. A release naming p@c2 without ``bindings`` would re-bind app:x
    to it, credential set and all: R15 says such a binding cannot exist, so the release
    is rejected before any append (INVALID or CLOSURE_INVALID, rule R15)."""
    c1 = world.release({"p/pack.json": profile_pack("p", 1, ["erp-prod"])})
    binding = {
        "audience": "app:x",
        "pack": "p",
        "kind": "callout_profile",
        "key": "erp",
        "credential_set": "erp-prod",
    }
    world.service.apply(world.manifest([world.official("p", c1)], [binding]))
    c2 = world.release({"p/pack.json": profile_pack("p", 2, None)})
    head = world.head()
    with pytest.raises(LedgerError) as info:
        world.service.apply(world.manifest([world.official("p", c2)]))
    assert info.value.details.get("rule") == "R15"
    assert world.head() == head


def test_r30_the_first_bad_source_in_manifest_order_is_the_one_named(world: World) -> None:
    """packs[0] names a repository that does not exist, packs[1] a local folder that
    does not exist. ``resolve_packs`` checks sources in manifest order, so the full path
    names packs[0].source.repo; the release must name the same field."""
    commit = world.commit("a", 1)
    document = {
        "packs": [
            official("a", world.tmp / "no-such-repo", commit, "a/pack.json"),
            local("b", world.tmp / "no-such-folder"),
        ]
    }
    path = world.tmp / "two-bad.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(InvalidInput) as info:
        world.service.apply(path)
    assert info.value.details["field"] == "packs[0].source.repo"


# -- frozen packs: what makes one, what keeps one -------------------------------------------


def test_r30_every_spelling_of_the_frozen_repository_keeps_the_pack_frozen(
    world: World,
) -> None:
    """The same repository named as a file:// URL, relative to the manifest, with a
    trailing slash or through ``..`` resolves to the locator the generation froze: the
    packs stay frozen, never read (the repository has lost every object), and the
    re-apply is a no-op equal to the full build."""
    commits = {p: world.commit(p, 1) for p in ("a", "b")}
    bindings = push_closure("app:a", "a") + push_closure("app:b", "b")
    world.service.apply(
        world.manifest([world.official(p, c) for p, c in commits.items()], bindings)
    )
    objects = world.repo.path / ".git" / "objects"
    shutil.rmtree(objects)
    objects.mkdir()
    head = world.head()
    repo = world.repo.path
    for spelling in (f"file://{repo}", repo.name, f"{repo}/", f"{repo}/../{repo.name}"):
        packs = [official(p, spelling, c, f"{p}/pack.json") for p, c in commits.items()]
        path = world.tmp / "spelled.json"
        path.write_text(json.dumps({"packs": packs, "bindings": bindings}), encoding="utf-8")
        out = world.service.apply(path)
        assert out["noop"], spelling
        assert [p["decision"] for p in out["packs"]] == ["unchanged", "unchanged"]
    assert world.head() == head
    assert full_build_is_a_noop(world)


def test_r30_a_pack_frozen_again_at_a_newer_revision_decides_on_its_new_entry(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Revision 1 binds x@c1 to app:x, y@c1 to app:y and z@c1 to eight more audiences
    (so a release changing one or two audiences stays under the reuse limit). While the
    release (y -> c2, x named at c1) is resolving, a rival advances x to c2 and back to
    c1 (a new generation of the same commit), publishing revisions 2 and 3. At the
    release's preflight x is frozen again, at revision 3's generation: the release must
    decide on that one, on the revision in force (no full build), and publish revision 4
    with x unchanged."""
    commits = {p: world.commit(p, 1) for p in ("x", "y", "z")}
    bindings = [
        *push_closure("app:x", "x"),
        *push_closure("app:y", "y"),
        *(b for i in range(FILLERS) for b in push_closure(f"app:f{i}", "z")),
    ]
    world.service.apply(
        world.manifest([world.official(p, c) for p, c in commits.items()], bindings)
    )
    x2, y2 = world.commit("x", 2), world.commit("y", 2)
    rival = CommandService(Ledger(open_database(world.url)), holder="rival", clock=lambda: NOW)
    there = world.manifest(
        [world.official(p, c) for p, c in {**commits, "x": x2}.items()], bindings
    )
    back = world.manifest([world.official(p, c) for p, c in commits.items()], bindings)
    release = world.manifest(
        [world.official(p, c) for p, c in {**commits, "y": y2}.items()], bindings
    )
    resolve = resolve_packs  # what apply imported
    full_builds: list[int] = []

    def rival_while_resolving(*args: Any, **kwargs: Any) -> Any:
        if not full_builds:
            full_builds.append(0)
            assert rival.apply(there)["catalog"]["revision"] == 2
            assert rival.apply(back)["catalog"]["revision"] == 3
            full_builds[0] = 0  # the rival's own don't count
        return resolve(*args, **kwargs)

    full_build = read_catalog_in_force

    def counted(*args: Any, **kwargs: Any) -> Any:
        full_builds[0] += 1
        return full_build(*args, **kwargs)

    try:
        with monkeypatch.context() as patch:
            patch.setattr(apply_module, "resolve_packs", rival_while_resolving)
            patch.setattr(apply_module, "read_catalog_in_force", counted)
            out = world.service.apply(release)
    finally:
        rival.ledger.close()
    assert [(p["pack"], p["decision"]) for p in out["packs"]] == [
        ("x", "unchanged"),
        ("y", "advance"),
        ("z", "unchanged"),
    ]
    assert out["catalog"]["revision"] == 4 and full_build_is_a_noop(world)
    assert full_builds == [0], "the release fell back to the full build"


def test_r30_a_publish_landing_while_the_release_prepares_does_not_fail_it(
    world: World,
) -> None:
    """Revision 1 binds ``sales`` to app:crm and ``z`` to eight audiences; a release
    applied with ``--no-publish`` left app:ops's grant of ``other`` pending. The release
    under test (no ``--wait`` budget) advances ``sales`` and keeps everything else. While
    it prepares, a ``publish`` (no lease needed, R26) publishes revision 2 with the
    pending grant. No pack the release keeps moved: it applies on revision 2 and publishes
    revision 3, as the full path does."""
    c1 = {p: world.commit(p, 1) for p in ("sales", "other", "z")}
    fillers = [b for i in range(FILLERS) for b in push_closure(f"app:f{i}", "z")]
    bindings = push_closure("app:crm", "sales") + fillers
    packs = [world.official(p, c) for p, c in c1.items()]
    world.service.apply(world.manifest(packs, bindings))
    bindings += push_closure("app:ops", "other")
    pending = world.service.apply(world.manifest(packs, bindings), publish=False)
    assert not pending["catalog"]["published"]
    release = world.manifest(
        [world.official("sales", world.commit("sales", 2)), *packs[1:]], bindings
    )
    publisher = CommandService(Ledger(open_database(world.url)), holder="pub", clock=lambda: NOW)
    service = racer(world)
    fired = after_prepare(service, publisher.publish)
    try:
        outcome = service.apply(release)
    finally:
        service.ledger.close()
        publisher.ledger.close()
    assert fired == [1]
    assert outcome["catalog"]["revision"] == 3 and outcome["catalog"]["published"]
    assert full_build_is_a_noop(world)
    audits_clean(world)
