"""R11 stays whole for ``apply`` (issue 27 item 4; R11, R12, R30).

A release decides in its preflight, takes the writer lease, prepares its candidates and
ends with one final append (activations, bindings, the revision, the command record)
through ``UnitOfWork.fenced_save``. Each test here lands one concurrent write in the gap
right before that final append — deterministically, by wrapping the release's own unit
of work's ``fenced_save`` (instance attribute replacement: the concurrent write runs
once, before the first append that records an ``apply`` command, then the real
``fenced_save`` runs) — and checks what the release does with it:

* a write that would flip a decision the release made (a pack it advances or keeps
  unchanged moved, a pack it binds was removed, a binding of an audience it binds
  changed, another revision was published) ends the release with CONFLICT (exit 4)
  or the exact typed rejection, and nothing of the release is appended;
* a write to an aggregate the decision did not rely on (a credential, a pack the
  release neither names nor binds) lets the release through: it applies and publishes.

How the concurrent writer gets past the release's exclusive writer lease is said in each
test. Three ways occur: (1) a write that needs no lease (``publish``; credentials,
R26); (2) a rogue process writing lifecycle or binding aggregates through its own unit
of work under a copy of the lease handle as the log has it (holder, epoch, version):
the lease aggregate does not move, so only the fences on what the release read can stop
it; (3) the lease broken by an operator (R27) or taken over once expired (an injected
clock), then a real ``apply`` of the rival: the release's final append is fenced out by
the lease's version (LeaseLost, CONFLICT exit 4).

After every refused release the store audits clean (``verify_log``: chain, Merkle,
lifecycle and catalog replay, views) and the rival's write is what is in force.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from domain.catalog import Catalog, catalog_id
from domain.coordination import CommandRecord
from domain.errors import Conflict, LedgerError
from domain.event_types import EVENT_TYPES
from domain.lifecycle import GenerationStatus
from ledger.audit.verify import verify_log
from ledger.commands.credentials import CredentialHandler
from ledger.commands.results import ApplyResult
from ledger.commands.service import CommandService
from ledger.commands.unit_of_work import UnitOfWork
from ledger.commands.writer_lease import LeaseHandle, LeaseLost
from ledger.log.db import open_database
from ledger.store.runtime import Ledger
from publisher.catalog import PublicationRejected
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World
from tests.support.rogue import Rogue

#: The release's lease holder and command id (the rival's are others).
HOLDER = "r11-release"
CID = "r11-release"
#: Injected clocks: the release's, and a rival's an hour later (the release's lease,
#: 30 s long, has expired for it).
NOW = 1_800_000_000.0
LATER = NOW + 3600.0

#: What the release's final append writes (none of it may appear when it is refused).
FINAL_TYPES = {
    "generation.activated",
    "activation.started",
    "activation.advanced",
    "activation.removed",
    "generation.retired",
    "binding.granted",
    "binding.rebound",
    "binding.revoked",
    "audience_view.opened",
    "audience_view.published",
    "catalog.published",
    "command.recorded",
}


# -- the world: four packs, three audiences, revision 1 -----------------------------------


class Stage:
    """Revision 1 binds ``sales`` to app:crm, ``billing`` to app:erp and ``hr`` to
    app:hr; ``other`` is active and bound by nobody. The release under test advances
    ``sales`` (c1 -> c2, rebinding app:crm), keeps ``billing`` unchanged (named at the
    same commit) and keeps ``hr``'s bindings (bound, not named); it does not name
    ``other``. It publishes revision 2."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.commits = {p: world.commit(p, 1) for p in ("sales", "billing", "hr", "other")}
        self.sales2 = world.commit("sales", 2)
        self.bindings = (
            push_closure("app:crm", "sales")
            + push_closure("app:erp", "billing")
            + push_closure("app:hr", "hr")
        )
        first = world.manifest(
            [world.official(p, c) for p, c in self.commits.items()], self.bindings
        )
        out = world.service.apply(first)
        assert (out["catalog"]["revision"], out["catalog"]["published"]) == (1, True)
        self.release = world.manifest(
            [
                world.official("sales", self.sales2),
                world.official("billing", self.commits["billing"]),
            ],
            self.bindings,
        )

    def racer(self, *, wait: float = 0.0) -> CommandService:
        """The release's writer: its own connection, an injected clock, no background
        renewal in the test's time, and (by default) no ``--wait`` budget, so one lost
        race is CONFLICT."""
        return CommandService(
            Ledger(open_database(self.world.url)),
            holder=HOLDER,
            lease_wait=wait,
            renew_every=3600.0,
            clock=lambda: NOW,
        )


@pytest.fixture
def stage(world: World) -> Iterator[Stage]:
    yield Stage(world)


# -- the seam: one concurrent write right before the release's final append --------------


class Interleaving:
    """Runs ``rival`` once inside ``uow.fenced_save``, just before the first append that
    records an ``apply`` command (the release's final append: R10 records the command in
    it), then appends as usual. ``head`` is the log head right after the rival's write.
    Only the seam ``UnitOfWork.fenced_save(handle, *aggregates, fence=, precommit=)`` is
    relied on, nothing private of ``apply``."""

    def __init__(self, uow: UnitOfWork, rival: Callable[[], Any], ledger: Ledger) -> None:
        self.fired = 0
        self.head = -1
        save = uow.fenced_save

        def fenced_save(handle: LeaseHandle, *aggregates: Any, **kwargs: Any) -> None:
            final = any(isinstance(a, CommandRecord) and a.kind == "apply" for a in aggregates)
            if final and not self.fired:
                self.fired += 1
                rival()
                self.head = ledger.recorder.head().position
            save(handle, *aggregates, **kwargs)

        uow.fenced_save = fenced_save  # type: ignore[method-assign]


def run_raced(
    stage: Stage, rival: Callable[[], Any], *, wait: float = 0.0
) -> tuple[ApplyResult | LedgerError, Interleaving]:
    """Apply the stage's release with ``rival`` landing before its final append: the
    result, or the error the release ended with; and the interleaving."""
    racer = stage.racer(wait=wait)
    seam = Interleaving(racer.uow, rival, stage.world.ledger)
    try:
        outcome: ApplyResult | LedgerError = racer.apply(stage.release, command_id=CID)
    except LedgerError as exc:
        outcome = exc
    finally:
        racer.ledger.close()
    assert seam.fired == 1, "the concurrent write never ran: the test proves nothing"
    return outcome, seam


def topics_after(world: World, position: int) -> list[str]:
    return [
        EVENT_TYPES.resolve(row.topic).type.name
        for row in world.ledger.recorder.iter_rows(after=position)
    ]


def assert_refused_whole(world: World, outcome: Any, seam: Interleaving, revision: int) -> None:
    """The release ended with CONFLICT (exit 4) and appended nothing of its final append:
    at most its own candidate closed failed_clean and its lease given back; no command
    record; the revision in force is ``revision``; the store audits clean."""
    assert isinstance(outcome, Conflict), outcome
    assert (outcome.exit_code, outcome.code) == (4, "CONFLICT")
    after = topics_after(world, seam.head)
    assert not FINAL_TYPES & set(after), after
    assert set(after) <= {"generation.failed", "lease.released"}, after
    with world.ledger.snapshot() as reader:
        assert reader.command(CID) is None
    assert catalog_revision(world) == revision
    report = verify_log(world.ledger)
    assert report.ok, report.first()


def assert_lost_race(outcome: Any) -> None:
    """A lost race for the log without a ``--wait`` budget: CONFLICT after one attempt,
    not a lost lease (the lease's fence did not move)."""
    assert isinstance(outcome, Conflict) and not isinstance(outcome, LeaseLost), outcome
    assert outcome.details["attempts"] == 1


def recovered(world: World) -> str:
    """The install id of ``sales``'s newest attempt, which must be failed_dirty (the
    release's candidate, recovered by the rival that took its lease)."""
    newest = world.state("sales").newest
    assert newest is not None and newest.status is GenerationStatus.FAILED_DIRTY
    return newest.install_id


def catalog_revision(world: World) -> int:
    with world.ledger.snapshot() as reader:
        lineage = reader.get(catalog_id(), Catalog)
    return 0 if lineage is None else int(lineage.revision)


# -- the rivals -----------------------------------------------------------------------------


@pytest.fixture
def rogue(world: World) -> Iterator[Rogue]:
    writer = Rogue(world, HOLDER)
    yield writer
    writer.close()


def rival_release(world: World, packs: list[dict[str, Any]], **document: Any) -> Path:
    world._manifests += 1
    path = world.tmp / f"rival-{world._manifests}.json"
    path.write_text(json.dumps({"packs": packs, **document}), encoding="utf-8")
    return path


# -- (a) a write that would flip a decision: CONFLICT, nothing of the release appended ---


def test_r11_rogue_activation_of_the_release_own_candidate_is_conflict(
    world: World, stage: Stage, rogue: Rogue
) -> None:
    """Another writer activates the very candidate the release prepared for ``sales``
    (the pack it advances). Past the lease: a rogue writer (module docstring, way 2).
    The release's fence on ``sales``'s aggregates moved: CONFLICT, and its final append
    (activation, rebinding, revision 2) never happens."""
    outcome, seam = run_raced(stage, lambda: rogue.activate_newest("sales"))
    assert_lost_race(outcome)
    assert_refused_whole(world, outcome, seam, revision=1)
    activation = world.state("sales").activation
    assert activation is not None and activation.epoch == 2  # the rogue's activation


def test_r11_rogue_advance_of_a_pack_the_release_keeps_unchanged_is_conflict(
    world: World, stage: Stage, rogue: Rogue
) -> None:
    """Another writer advances ``billing``, which the release names at the commit already
    active (decision ``unchanged``) and keeps bound to app:erp. Past the lease: a rogue
    writer (way 2). Publishing would bind app:erp to a retired generation; the fence on
    ``billing``'s aggregates refuses the append: CONFLICT."""
    outcome, seam = run_raced(stage, lambda: rogue.advance("billing", 2))
    assert_lost_race(outcome)
    assert_refused_whole(world, outcome, seam, revision=1)
    activation = world.state("billing").activation
    assert activation is not None and activation.epoch == 2  # the rogue's advance


@pytest.mark.parametrize("pack", ["hr", "billing"])
def test_r11_rogue_removal_of_a_pack_the_release_binds_is_conflict(
    world: World, stage: Stage, rogue: Rogue, pack: str
) -> None:
    """Another writer removes a pack the release binds: ``hr`` (bound, not named in the
    manifest) or ``billing`` (named unchanged and bound). Past the lease: a rogue writer
    (way 2), which also ignores the bindings naming the pack. The release would publish
    a binding to a removed pack; its fence on the pack refuses the append: CONFLICT."""
    outcome, seam = run_raced(stage, lambda: rogue.remove(pack))
    assert_lost_race(outcome)
    assert_refused_whole(world, outcome, seam, revision=1)
    activation = world.state(pack).activation
    assert activation is not None and activation.removed


def test_r11_re_decision_within_wait_sees_the_removal_and_rejects_it_typed(
    world: World, stage: Stage, rogue: Rogue
) -> None:
    """As above (``hr`` removed by a rogue writer, way 2), with a ``--wait`` budget: the
    lost race is re-decided on the state as it now is, and the release's bindings of a
    removed pack are rejected with the typed rejection (PublicationRejected, R15
    CLOSURE_INVALID naming app:hr and ``hr``) before any append: no command record,
    revision 1 in force, the store audits clean."""
    outcome, seam = run_raced(stage, lambda: rogue.remove("hr"), wait=30.0)
    assert isinstance(outcome, PublicationRejected), outcome
    assert (outcome.exit_code, outcome.code) == (5, "LIFECYCLE")
    assert (outcome.details["rule"], outcome.details["reason"]) == ("R15", "CLOSURE_INVALID")
    problems = {(p["audience"], p["pack"], p["reason"]) for p in outcome.details["problems"]}
    assert problems == {("app:hr", "hr", "NO_ACTIVE_GENERATION")}
    after = topics_after(world, seam.head)
    assert set(after) <= {"generation.failed", "lease.released"}, after
    with world.ledger.snapshot() as reader:
        assert reader.command(CID) is None
    assert catalog_revision(world) == 1
    report = verify_log(world.ledger)
    assert report.ok, report.first()


@pytest.mark.parametrize(
    ("audience", "change"),
    [("app:crm", "grant"), ("app:crm", "revoke"), ("app:erp", "revoke")],
)
def test_r11_rogue_binding_change_to_an_audience_the_release_binds_is_conflict(
    world: World, stage: Stage, rogue: Rogue, audience: str, change: str
) -> None:
    """Another writer changes the bindings of an audience the release binds: app:crm
    (rebound by the release to ``sales``'s new generation) gains ``other``'s closure or
    loses ``sales``'s; app:erp (kept as is) loses ``billing``'s. Past the lease: a rogue
    writer appending the audience's binding aggregate (way 2). The release validated and
    planned those bindings; its fence on the audience refuses the append: CONFLICT."""
    bound = {"app:crm": "sales", "app:erp": "billing"}[audience]

    def rival() -> None:
        if change == "grant":
            rogue.grant_closure(audience, "other")
        else:
            rogue.revoke_closure(audience, bound)

    outcome, seam = run_raced(stage, rival)
    assert_lost_race(outcome)
    assert_refused_whole(world, outcome, seam, revision=1)


def test_r11_concurrent_publication_of_a_revision_is_conflict(world: World, stage: Stage) -> None:
    """Another writer publishes revision 2 (app:ops bound to ``other`` by an earlier
    release that did not publish). Past the lease: ``publish`` needs none (way 1); its
    own append is fenced by what it read. The catalog lineage moved under the release,
    which planned revision 2 on revision 1: CONFLICT, and revision 2 is the rival's."""
    pending = world.manifest([], stage.bindings + push_closure("app:ops", "other"))
    assert world.service.apply(pending, publish=False)["catalog"]["revision"] == 1
    publisher = CommandService(Ledger(open_database(world.url)), clock=lambda: NOW)
    published: list[Any] = []
    try:
        outcome, seam = run_raced(stage, lambda: published.append(publisher.publish()))
    finally:
        publisher.ledger.close()
    assert (published[0]["revision"], published[0]["published"]) == (2, True)
    assert_lost_race(outcome)
    assert_refused_whole(world, outcome, seam, revision=2)


def test_r11_lease_broken_and_a_rival_release_applied_is_conflict(
    world: World, stage: Stage
) -> None:
    """An operator breaks the release's lease (R27, the lease tooling's ``break_lease``)
    and a rival ``apply`` advances ``billing``, which the release keeps unchanged (way 3).
    The rival recovers the release's candidate as failed_dirty. The release's final
    append is fenced out by the lease's version: LeaseLost, CONFLICT exit 4 (R12)."""
    rival = CommandService(
        Ledger(open_database(world.url)), holder="rival", lease_wait=0.0, clock=lambda: NOW
    )
    manifest = world.manifest([world.official("billing", world.commit("billing", 2))])
    done: list[ApplyResult] = []

    def race() -> None:
        rival.break_lease(HOLDER)
        done.append(rival.apply(manifest))

    try:
        outcome, seam = run_raced(stage, race)
    finally:
        rival.ledger.close()
    assert done[0]["packs"][0]["decision"] == "advance"
    assert done[0]["recovered"] == [{"pack": "sales", "install_id": recovered(world)}]
    assert isinstance(outcome, LeaseLost), outcome
    assert outcome.details["rule"] == "R12"
    assert_refused_whole(world, outcome, seam, revision=1)
    activation = world.state("billing").activation
    assert activation is not None and activation.epoch == 2  # the rival's release


def test_r11_lease_expired_and_taken_over_by_a_rival_release_is_conflict(
    world: World, stage: Stage
) -> None:
    """A rival whose injected clock is an hour past the release's finds its 30 s lease
    expired, takes it over and applies a release removing ``hr``, which the release
    binds (way 3). The release's final append is fenced out by the lease's version:
    LeaseLost, CONFLICT exit 4, and nothing of it is appended."""
    rival = CommandService(
        Ledger(open_database(world.url)), holder="rival", lease_wait=0.0, clock=lambda: LATER
    )
    bindings = push_closure("app:crm", "sales") + push_closure("app:erp", "billing")
    manifest = rival_release(world, [], bindings=bindings, remove=["hr"])
    done: list[ApplyResult] = []
    try:
        outcome, seam = run_raced(stage, lambda: done.append(rival.apply(manifest)))
    finally:
        rival.ledger.close()
    assert done[0]["packs"][0]["decision"] == "remove"
    assert isinstance(outcome, LeaseLost), outcome
    # The rival recovered the release's candidate as failed_dirty: its own publication
    # is blocked (R12), so revision 1 stays in force.
    assert done[0]["recovered"] == [{"pack": "sales", "install_id": recovered(world)}]
    assert done[0]["catalog"]["published"] is False
    assert outcome.details["rule"] == "R12"
    assert_refused_whole(world, outcome, seam, revision=1)
    activation = world.state("hr").activation
    assert activation is not None and activation.removed


# -- (b) a write the decision did not rely on: the release goes through --------------------


def assert_published(world: World, outcome: Any, seam: Interleaving) -> None:
    """The release applied (``sales`` advanced to epoch 2) and published revision 2 in
    its final append, after the rival's write; the store audits clean."""
    assert not isinstance(outcome, Exception), outcome
    assert outcome["packs"][0]["decision"] == "advance"
    assert outcome["packs"][0]["epoch"] == 2
    assert (outcome["catalog"]["revision"], outcome["catalog"]["published"]) == (2, True)
    after = topics_after(world, seam.head)
    assert {"catalog.published", "command.recorded", "activation.advanced"} <= set(after)
    assert catalog_revision(world) == 2
    report = verify_log(world.ledger)
    assert report.ok, report.first()


def test_r11_credential_events_for_an_audience_the_release_binds_let_it_through(
    world: World, stage: Stage
) -> None:
    """Another writer issues a credential for app:crm (an audience the release rebinds)
    and revokes an older one. Past the lease: credentials need none (way 1, R26). The
    release relied on no credential: it applies and publishes revision 2."""
    issuer = CredentialHandler(Ledger(open_database(world.url)), clock=lambda: NOW)
    older = issuer.credentials_issue("app:crm")

    def rival() -> None:
        issuer.credentials_issue("app:crm")
        issuer.credentials_revoke(older["credential_id"])

    try:
        outcome, seam = run_raced(stage, rival)
    finally:
        issuer.ledger.close()
    assert_published(world, outcome, seam)
    events = topics_after(world, seam.head - 2)
    assert events[:2] == ["credential.issued", "credential.revoked"]


def test_r11_lifecycle_of_a_pack_the_release_neither_names_nor_binds_lets_it_through(
    world: World, stage: Stage, rogue: Rogue
) -> None:
    """Another writer advances ``other``, which no binding and not the release's manifest
    names. Past the lease: a rogue writer (way 2). The release relied on nothing of
    ``other``: it applies and publishes revision 2."""
    outcome, seam = run_raced(stage, lambda: rogue.advance("other", 2))
    assert_published(world, outcome, seam)
    activation = world.state("other").activation
    assert activation is not None and activation.epoch == 2


def test_r11_binding_granted_to_a_new_audience_before_the_final_append_is_not_swallowed(
    world: World, stage: Stage, rogue: Rogue
) -> None:
    """Another writer grants ``other``'s closure to app:new, an audience that did not
    exist when the release read the bindings. Past the lease: a rogue writer appending a
    new binding aggregate (way 2). The release may refuse (CONFLICT) or publish without
    the grant, but then its revision must leave the grant pending (its cut before it):
    either way the store audits clean and the next publication serves app:new. The
    release's revision claims every binding event before it, so its read fence covers
    binding events of every audience: it is refused (CONFLICT), nothing of it appended."""
    outcome, seam = run_raced(stage, lambda: rogue.grant_closure("app:new", "other"))
    report = verify_log(world.ledger)
    assert report.ok, report.first()
    assert_refused_whole(world, outcome, seam, revision=1)
    follow = CommandService(world.ledger, clock=lambda: NOW).publish()
    assert (follow["published"], follow["counts"]["audiences"]) == (True, 4)
    report = verify_log(world.ledger)
    assert report.ok, report.first()
