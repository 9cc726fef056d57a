"""``apply --plan`` and ``apply --plan-file`` (issue 29.1), on SQLite and MariaDB, through
the command service, the Python API and the CLI (in-process).

* R11: a plan is apply's own preflight: it appends nothing (every table unchanged), takes
  no lease, and its ``command_id``, ``packs``, ``bindings`` and ``catalog`` are what the
  following ``apply`` reports, over random release histories (the R30 history generator,
  incremental and full builds); a refused release is planned with the same typed rejection.
* R28: a plan file is recomputed, never trusted: altered, made for another store or from
  other manifest bytes is INVALID, a store that moved is CONFLICT, appending nothing.
* R10: applying a plan file again is an exact retry (the recorded result).
"""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from domain.catalog import published_view_id
from domain.errors import Conflict, InvalidInput, LifecycleRejected
from domain.served import AudienceView
from ledger.api import open_store
from ledger.cli.plan_render import render_plan
from ledger.commands import apply as apply_module
from ledger.commands.apply import ApplyHandler
from ledger.commands.plan import shared
from ledger.commands.results import ApplyResult, PlanResult
from ledger.commands.service import CommandService
from publisher.catalog import PublicationRejected
from tests.conftest import ENGINES
from tests.rules.test_r30_release_histories import (
    AUDIENCES,
    STEP,
    History,
    Stats,
    Stores,
    pair,
)
from tests.support.cli_inprocess import cli, cli_json
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World

ANSI = re.compile(r"\x1b\[")


def write(world: World, name: str, document: dict[str, Any]) -> Path:
    path = world.tmp / name
    path.write_text(json.dumps(document, indent=1), encoding="utf-8")
    return path


def release(world: World, name: str, packs: dict[str, str], **rest: Any) -> Path:
    """A manifest of ``packs`` (pack -> commit) binding each to its own audience."""
    bindings = [b for p in sorted(packs) for b in push_closure(f"app:{p}", p)]
    document = {
        "packs": [world.official(p, c) for p, c in sorted(packs.items())],
        "bindings": bindings,
        **rest,
    }
    return write(world, name, document)


def test_r11_plan_is_what_apply_then_reports_and_appends_nothing(world: World) -> None:
    service = world.service
    first = release(world, "r1.json", {"a": world.commit("a", 1), "b": world.commit("b", 1)})
    before = world.tables()
    plan = service.plan(first)
    assert world.tables() == before, "a plan appends nothing and takes no lease"
    assert not plan["empty"] and plan["refused"] is None
    assert [(p["pack"], p["decision"], p["from_revision"]) for p in plan["packs"]] == [
        ("a", "install", None),
        ("b", "install", None),
    ]
    assert len(plan["bindings"]["granted"]) == 4
    assert plan["catalog"] is not None and plan["catalog"]["revision"] == 1
    assert [(a["audience"], a["loses_all_grants"]) for a in plan["audiences"]] == [
        ("app:a", False),
        ("app:b", False),
    ]
    assert (
        plan["summary"] == "2 packs installed; 4 grants; 2 audiences change; publishes revision 1"
    )
    applied = service.apply(first)
    assert shared(applied) == shared(plan)
    with open_store(world.url) as store:
        for audience in plan["audiences"]:
            view = store.view(audience["audience"])
            assert isinstance(view, AudienceView)
            assert view.audience_digest == audience["digest"]

    # Advance a, remove b (its audience loses every grant), nothing else.
    old_a = plan["packs"][0]
    second = write(
        world,
        "r2.json",
        {
            "packs": [world.official("a", world.commit("a", 2))],
            "bindings": push_closure("app:a", "a"),
            "remove": ["b"],
        },
    )
    plan = service.plan(second)
    advance, removal = plan["packs"]
    assert (advance["decision"], advance["from_revision"], advance["from_payload_hash"]) == (
        "advance",
        old_a["revision"],
        old_a["payload_hash"],
    )
    assert advance["payload_hash"] != old_a["payload_hash"]
    assert (removal["pack"], removal["decision"]) == ("b", "remove")
    assert len(plan["bindings"]["revoked"]) == 2 and len(plan["bindings"]["rebound"]) == 2
    lost = {a["audience"]: a for a in plan["audiences"]}
    assert lost["app:b"] == {"audience": "app:b", "digest": None, "loses_all_grants": True}
    assert lost["app:a"]["loses_all_grants"] is False
    assert plan["summary"].startswith("1 pack advance, 1 removed; 2 rebinds, 2 revocations; ")
    assert "(1 lose all grants)" in plan["summary"]
    assert shared(service.apply(second)) == shared(plan)
    settled = json.loads(second.read_text())
    del settled["remove"]
    again = service.plan(write(world, "r3.json", settled))
    assert again["empty"] and again["summary"] == "no changes" and not again["audiences"]


def test_r11_plan_reports_the_typed_rejection_apply_gives(world: World) -> None:
    path = write(
        world,
        "bad.json",
        {
            "packs": [world.official("a", world.commit("a", 1))],
            # The push contract without the callout profile it requires: closure invalid.
            "bindings": push_closure("app:a", "a")[:1],
        },
    )
    before = world.tables()
    plan = world.service.plan(path)
    assert world.tables() == before
    with pytest.raises(PublicationRejected) as info:
        world.service.apply(path)
    assert world.tables() == before
    error = info.value
    assert plan["refused"] == {**error.to_json(), "exit_code": error.exit_code}
    assert plan["catalog"] is None and not plan["empty"]
    assert [(p["pack"], p["decision"]) for p in plan["packs"]] == [("a", "install")]
    assert plan["summary"].endswith(f"REFUSED: {error.code}")
    code, document = cli_json("--db", world.url, "apply", str(path), "--plan")
    assert code == LifecycleRejected.exit_code == 5
    assert document["refused"]["details"] == json.loads(json.dumps(error.details))


def test_r28_plan_file_is_recomputed_never_trusted(world: World, sibling_store: str) -> None:
    service = world.service
    path = release(world, "r1.json", {"a": world.commit("a", 1)})
    with open_store(world.url) as store:
        plan = store.plan(path, out=world.tmp / "plan.json")
    plan_file = world.tmp / "plan.json"
    assert json.loads(plan_file.read_text()) == plan

    # Altered: one binding dropped from the plan (the file is otherwise well formed).
    altered = dict(plan)
    altered["bindings"] = {**plan["bindings"], "granted": plan["bindings"]["granted"][:1]}
    bad = write(world, "altered.json", altered)
    before = world.tables()
    with pytest.raises(InvalidInput) as info:
        service.apply(None, plan_file=bad)
    assert info.value.details["fields"] == ["bindings"]
    # Another store (init'ed the same way, an id of its own).
    with open_store(sibling_store) as other, pytest.raises(InvalidInput) as info:
        other.apply(plan_file=plan_file)
    assert "another store" in info.value.message
    # Other manifest bytes.
    moved_manifest = write(world, "r1-copy.json", json.loads(path.read_text()) | {"remove": []})
    with pytest.raises(InvalidInput):
        service.apply(moved_manifest, plan_file=plan_file)
    # Not a plan at all.
    with pytest.raises(InvalidInput):
        service.apply(None, plan_file=path)
    assert world.tables() == before

    # The store moved (another release): CONFLICT, nothing appended.
    other_release = release(world, "other.json", {"z": world.commit("z", 1)})
    stale_plan = world.tmp / "stale.json"
    with open_store(world.url) as store:
        store.plan(other_release, out=stale_plan)
    service.apply(path, plan_file=plan_file)  # the plan, applied: the store moves
    before = world.tables()
    with pytest.raises(Conflict) as conflict:
        service.apply(None, plan_file=stale_plan)
    assert conflict.value.details["rule"] == "R11"
    assert world.tables() == before


def test_r10_plan_file_applied_again_is_an_exact_retry(world: World) -> None:
    path = release(world, "r1.json", {"a": world.commit("a", 1), "b": world.commit("b", 1)})
    plan_file = world.tmp / "plan.json"
    with open_store(world.url) as store:
        plan = store.plan(path, out=plan_file)
        first = store.apply(plan_file=plan_file)
        assert first["command_id"] == plan["command_id"] and not first["replayed"]
        assert shared(first) == shared(plan)
        before = world.tables()
        second = store.apply(plan_file=plan_file)
    assert second == {**first, "replayed": True}
    assert world.tables() == before
    # Through the CLI too: the same recorded result.
    code, third = cli_json("--db", world.url, "apply", "--plan-file", str(plan_file))
    assert (code, third) == (0, json.loads(json.dumps(second)))


def test_r11_cli_plan_json_human_out_and_detailed_exitcode(world: World) -> None:
    path = release(world, "r1.json", {"a": world.commit("a", 1)})
    plan_file = world.tmp / "plan.json"
    before = world.tables()
    code, document = cli_json("--db", world.url, "apply", str(path), "--plan")
    assert code == 0 and not document["empty"]
    result = cli("--db", world.url, "apply", str(path), "--plan", "--detailed-exitcode")
    assert result.code == 10
    lines = result.stdout.splitlines()
    assert lines[0] == f"plan {document['command_id']}: {document['summary']}"
    assert "  + a: install" in result.stdout and "+ grant app:a a push_contract/Order.push" in (
        result.stdout
    )
    assert not ANSI.search(result.stdout), "no colour off a terminal"
    result = cli("--db", world.url, "apply", str(path), "--plan", "--out", str(plan_file))
    assert result.code == 0
    assert world.tables() == before
    assert json.loads(plan_file.read_text()) == document
    code, applied = cli_json("--db", world.url, "apply", "--plan-file", str(plan_file))
    assert code == 0 and shared(applied) == shared(document)
    result = cli("--db", world.url, "apply", str(path), "--plan", "--detailed-exitcode")
    assert result.code == 0 and result.stdout.splitlines()[0].endswith(": no changes")
    # The store moved since this plan: CONFLICT (4); usage mistakes are 2.
    assert cli("--db", world.url, "apply", "--plan-file", str(plan_file)).code == 0  # replay
    stale = world.tmp / "stale.json"
    other = release(world, "r2.json", {"a": world.commit("a", 2)})
    assert cli("--db", world.url, "apply", str(other), "--plan", "--out", str(stale)).code == 0
    assert cli("--db", world.url, "publish").code == 0  # nothing to publish: no append
    world.service.apply(release(world, "r3.json", {"b": world.commit("b", 1)}))
    assert cli("--db", world.url, "apply", "--plan-file", str(stale)).code == 4
    assert cli("--db", world.url, "apply", str(path), "--detailed-exitcode").code == 2
    assert cli("--db", world.url, "apply").code == 2


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("no_color", [False, True])
def test_r11_plan_is_coloured_only_on_a_terminal_without_no_color(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_color: bool
) -> None:
    """Rendering is engine independent: one SQLite store."""
    world = World(tmp_path, f"sqlite:///{tmp_path / 'plan.db'}")
    plan = world.service.plan(release(world, "r1.json", {"a": world.commit("a", 1)}))
    tty = _Tty()
    monkeypatch.setattr(sys, "stdout", tty)
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)
    render_plan(plan)
    monkeypatch.undo()
    assert bool(ANSI.search(tty.getvalue())) is not no_color


# -- random release histories: a plan is what the following apply reports -----------------


class Planning:
    """The command service, planning every ``apply`` just before running it: the plan
    appends nothing, and what it says is what the apply reports."""

    def __init__(self, service: CommandService, counts: dict[str, int]) -> None:
        self.service = service
        self.counts = counts

    def __getattr__(self, name: str) -> Any:
        return getattr(self.service, name)

    def apply(self, path: Path, *, publish: bool = True) -> ApplyResult:
        recorder = self.service.ledger.recorder
        head = recorder.head()
        fast, full = self.counts["fast"], self.counts["full"]
        plan = self.service.plan(path, publish=publish)
        assert recorder.head() == head, "the plan appended"
        # Which build the plan's preflight made: counted by ``counting`` below.
        self.counts["planned fast"] += self.counts["fast"] > fast and self.counts["full"] == full
        self.counts["planned full"] += self.counts["full"] > full
        result = self.service.apply(path, publish=publish)
        assert shared(result) == shared(plan), (plan, result)
        assert plan["empty"] == result["noop"]
        self.check_audiences(plan, result)
        self.counts["plans"] += 1
        self.counts["empty"] += plan["empty"]
        return result

    def check_audiences(self, plan: PlanResult, result: ApplyResult) -> None:
        """The audiences the plan says change are those whose view the apply published."""
        catalog = result["catalog"]
        if not catalog["published"]:
            assert plan["audiences"] == []
            return
        ids = {published_view_id(*pair(a)): a for a in AUDIENCES}
        with self.service.ledger.snapshot() as reader:
            views = self.service.ledger.recorder.last_events(reader.conn, list(ids))
        published = {
            ids[v]: e.data["digest"]
            for v, e in views.items()
            if e.data["revision"] == catalog["revision"]
        }
        assert {a["audience"]: a["digest"] for a in plan["audiences"]} == published
        assert all(a["loses_all_grants"] is (a["digest"] is None) for a in plan["audiences"])
        self.counts["audiences"] += len(published)
        self.counts["lost"] += sum(d is None for d in published.values())


@pytest.fixture(params=ENGINES)
def histories(request: pytest.FixtureRequest, tmp_path: Path) -> Stores:
    sqlite = request.param == "sqlite"
    return Stores(
        request.param,
        tmp_path,
        request.getfixturevalue("sqlite_template") if sqlite else None,
        None if sqlite else request.getfixturevalue("mariadb_stores"),
    )


def counting(monkeypatch: pytest.MonkeyPatch, counts: dict[str, int]) -> None:
    """Count the preflight's incremental (R30) and full builds of a release."""
    for name, key in (("simulate_fast", "fast"), ("simulate_release", "full")):
        real = getattr(apply_module, name)

        def counted(*args: Any, _real: Any = real, _key: str = key, **kwargs: Any) -> Any:
            counts[_key] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(apply_module, name, counted)


def test_r11_plan_equals_the_following_apply_over_random_release_histories(
    histories: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    stats = Stats()
    counts = dict.fromkeys(
        ("plans", "empty", "audiences", "lost", "fast", "full", "planned fast", "planned full"),
        0,
    )
    counting(monkeypatch, counts)

    @settings(
        max_examples=4,
        deadline=None,
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(history=st.lists(STEP, min_size=6, max_size=12))
    def check(history: list[tuple[str, int, int, bool, str]]) -> None:
        stats.examples += 1
        with histories.world() as world:
            world.service = Planning(world.service, counts)  # type: ignore[assignment]
            run = History(world, stats)
            run.first_release()
            for step in history:
                run.step(*step)
            run.release(publish=True)

    check()
    print(f"\n[plan histories {histories.engine}] {stats.summary()}; {counts}")
    assert counts["plans"] > stats.examples * 2 and counts["audiences"] > 0
    # Plans built on the parent revision (R30) and full builds (first releases) alike.
    assert counts["planned fast"] > stats.examples and counts["planned full"] >= stats.examples
    assert stats.publications["apply"] > stats.examples


def test_r11_plan_file_racing_a_release_is_conflict(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another release lands between the plan file's preflight and its final append: the
    append is refused and the re-decision finds the store moved (CONFLICT); what the
    plan would have activated is not, and the other release's revision stays in force."""
    path = release(world, "r1.json", {"a": world.commit("a", 1)})
    plan_file = world.tmp / "plan.json"
    with open_store(world.url) as store:
        store.plan(path, out=plan_file)
    other = release(world, "other.json", {"b": world.commit("b", 1)})
    real = ApplyHandler.decide
    raced: list[ApplyResult] = []
    racer = CommandService(world.ledger, lease_wait=10.0)

    def racing(self: ApplyHandler, *args: Any, **kwargs: Any) -> Any:
        decided = real(self, *args, **kwargs)
        if self.observe is not None and not raced:  # the plan file's preflight
            raced.append(racer.apply(other))
        return decided

    monkeypatch.setattr(ApplyHandler, "decide", racing)
    with pytest.raises(Conflict) as info:
        world.service.apply(None, plan_file=plan_file)
    assert info.value.details["rule"] == "R11"
    monkeypatch.undo()
    with open_store(world.url) as store:
        status = {p["pack"]: p for p in store.status()["packs"]}
        assert status["a"]["active_install_id"] is None, status["a"]
        view = store.view("app:b")
        assert isinstance(view, AudienceView)
        assert view.revision == raced[0]["catalog"]["revision"]
