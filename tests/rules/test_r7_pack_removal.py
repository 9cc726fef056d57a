"""R7 pack removal (issue 15): the fourth way the pointer moves, to no generation with
epoch + 1, in the release's one final append; a removed pack may be installed again as
a fresh incarnation. Real stores: SQLite file and MariaDB."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from domain.classifier import Condition, classify
from domain.errors import InvalidInput, LifecycleRejected
from domain.identity import Audience
from domain.lifecycle import Generation, GenerationStatus, generation_id
from domain.log import LoggedEvent
from ledger.audit.verify import verify_log
from projections.reader import CatalogReader
from tests.rules.test_rule_proofs import audit_problem, rechained
from tests.support.cli_inprocess import cli, cli_json
from tests.support.gitrepo import local, push_closure
from tests.support.lifecycle_support import World


def release(
    world: World,
    packs: Sequence[dict[str, Any]] = (),
    *,
    remove: Sequence[str] = (),
    bindings: list[dict[str, Any]] | None = None,
) -> Path:
    """A manifest file with ``remove`` (and optionally ``bindings``)."""
    document: dict[str, Any] = {"packs": list(packs), "remove": list(remove)}
    if bindings is not None:
        document["bindings"] = bindings
    world._manifests += 1
    path = world.tmp / f"removal-{world._manifests}.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def installed(world: World) -> dict[str, tuple[str, str, int | None]]:
    """The compatibility view: pack -> (install id, source kind, epoch)."""
    with world.db.read() as conn:
        rows = conn.execute(
            sa.text("SELECT pack, install_id, source_kind, epoch FROM _System_InstalledPack")
        ).fetchall()
    return {
        bytes(r.pack).decode(): (
            bytes(r.install_id).decode(),
            bytes(r.source_kind).decode(),
            r.epoch,
        )
        for r in rows
    }


def activation_rows(world: World) -> dict[str, tuple[str, int]]:
    with world.db.read() as conn:
        rows = conn.execute(
            sa.text("SELECT pack, install_id, epoch FROM _System_PackActivation")
        ).fetchall()
    return {bytes(r.pack).decode(): (bytes(r.install_id).decode(), int(r.epoch)) for r in rows}


def watch_appends(world: World) -> list[list[str]]:
    appends: list[list[str]] = []

    def watch(_conn: Connection, rows: Sequence[LoggedEvent]) -> None:
        if not rows[0].topic.startswith("lease."):  # taking and giving back the lease
            appends.append([r.topic for r in rows])

    world.ledger.recorder.inline_hooks.append(watch)
    return appends


def generation(world: World, pack: str, install_id: str) -> Generation:
    with world.ledger.snapshot() as reader:
        found = reader.get(generation_id(pack, install_id), Generation)
    assert found is not None
    return found


def test_r7_removing_an_official_pack_moves_the_pointer_to_none_in_one_append(
    world: World,
) -> None:
    first = world.apply(world.official("sales", world.commit("sales", 1)))
    g1 = first["packs"][0]["install_id"]
    assert installed(world)["sales"][0] == g1
    appends = watch_appends(world)

    out = world.service.apply(release(world, remove=["sales"]))

    assert out["packs"] == [
        {
            "pack": "sales",
            "decision": "remove",
            "source_kind": "official_repo",
            "revision": world.state("sales").newest.source.revision,  # type: ignore[union-attr]
            "payload_hash": first["packs"][0]["payload_hash"],
            "install_id": g1,
            "epoch": 2,
        }
    ]
    # One append: pointer to none (epoch + 1), the generation retired with no successor.
    assert appends == [["activation.removed@1", "generation.retired@2", "command.recorded@1"]]
    state = world.state("sales")
    assert classify(state) is Condition.REMOVED
    assert state.activation is not None and state.activation.removed
    assert (state.activation.epoch, state.activation.removed_install_id) == (2, g1)
    assert generation(world, "sales", g1).status is GenerationStatus.RETIRED
    assert "sales" not in installed(world) and "sales" not in activation_rows(world)
    # The history keeps everything.
    code, history = cli_json("--db", world.url, "history", "--pack", "sales")
    assert code == 0
    events = [(e["event"], e.get("install_id"), e.get("epoch")) for e in history["events"]]
    assert events[-2:] == [("activation.removed", None, 2), ("generation.retired", g1, 2)]
    retired = history["events"][-1]
    assert retired["successor_install_id"] is None and retired["removed"] is True
    assert verify_log(world.ledger).ok


def test_r7_removing_a_local_path_pack_drops_its_row(world: World) -> None:
    folder = world.local_dir("devsample", 1)
    world.service.apply(world.manifest([local("devsample", folder)]))
    install_id = installed(world)["devsample"][0]
    appends = watch_appends(world)

    out = world.service.apply(release(world, remove=["devsample"]))

    (outcome,) = out["packs"]
    assert (outcome["decision"], outcome["source_kind"], outcome["epoch"]) == (
        "remove",
        "local_path",
        None,
    )
    assert outcome["install_id"] == install_id
    assert appends == [["local_pack.removed@1", "command.recorded@1"]]
    assert classify(world.state("devsample")) is Condition.REMOVED
    assert installed(world) == {}
    assert verify_log(world.ledger).ok


def removal_position(world: World, topic: str) -> int:
    """The log position of the one row stored under ``topic`` (as `log` shows it)."""
    code, page = cli_json("--db", world.url, "log", "--limit", "1000")
    assert code == 0
    (position,) = [e["position"] for e in page["events"] if e["topic"] == topic]
    return int(position)


def test_r7_status_shows_a_removed_official_pack_as_removed_with_its_epochs(
    world: World,
) -> None:
    """Issue 25.8: after install (epoch 1), advance (epoch 2) and remove (epoch 3) the
    pack is shown removed, with the generation that was active at epoch 2, not as
    "never activated; newest attempt retired"."""
    world.apply(world.official("sales", world.commit("sales", 1)))
    second = world.apply(world.official("sales", world.commit("sales", 2)))
    g2, revision = second["packs"][0]["install_id"], second["packs"][0]["revision"]
    assert second["packs"][0]["epoch"] == 2
    out = world.service.apply(release(world, remove=["sales"]))
    assert out["packs"][0]["epoch"] == 3
    position = removal_position(world, "activation.removed@1")

    code, document = cli_json("--db", world.url, "status")

    assert code == 0
    (row,) = document["packs"]
    assert row == {
        "pack": "sales",
        "source_kind": "official_repo",
        "status": "removed",
        "active_install_id": None,
        "revision": None,
        "epoch": 3,
        "installed_install_id": None,
        "newest_attempt": {
            "install_id": g2,
            "ordinal": 2,
            "status": "retired",
            "revision": revision,
        },
        "dirty": False,
        "removed": {
            "install_id": g2,
            "source_kind": "official_repo",
            "revision": revision,
            "active_epoch": 2,
            "position": position,
        },
    }
    text = cli("--db", world.url, "status")
    assert text.code == 0
    assert text.stdout.splitlines()[1] == (
        f"  sales: removed official_repo {g2} @ {revision} (active at epoch 2; removed at epoch 3)"
    )
    assert "never activated" not in text.stdout

    # Installed again: active, no longer removed.
    again = world.apply(world.official("sales", world.commit("sales", 2)))
    code, document = cli_json("--db", world.url, "status")
    (row,) = document["packs"]
    assert (row["status"], row["active_install_id"], row["epoch"], "removed" in row) == (
        "active",
        again["packs"][0]["install_id"],
        4,
        False,
    )


def test_r7_status_shows_a_removed_local_path_pack_as_removed(world: World) -> None:
    """Issue 25.8: a removed local_path pack no longer vanishes from status; it has no
    pointer, so no epoch."""
    folder = world.local_dir("devsample", 1)
    world.service.apply(world.manifest([local("devsample", folder)]))
    install_id = installed(world)["devsample"][0]
    world.apply(world.official("sales", world.commit("sales", 1)))
    world.service.apply(release(world, remove=["devsample"]))

    code, document = cli_json("--db", world.url, "status")

    assert code == 0
    rows = {r["pack"]: r for r in document["packs"]}
    assert sorted(rows) == ["devsample", "sales"]
    assert rows["sales"]["status"] == "active" and "removed" not in rows["sales"]
    removed = rows["devsample"]
    assert (removed["status"], removed["source_kind"], removed["epoch"]) == (
        "removed",
        "local_path",
        None,
    )
    assert removed["removed"] == {
        "install_id": install_id,
        "source_kind": "local_path",
        "revision": None,
        "active_epoch": None,
        "position": removal_position(world, "local_pack.removed@1"),
    }
    text = cli("--db", world.url, "status")
    assert f"  devsample: removed local_path {install_id}\n" in text.stdout


def test_r7_removal_still_used_by_a_binding_is_rejected_naming_each_binding(
    world: World,
) -> None:
    commit = world.release(
        {
            "sales/pack.json": _content("sales", 1),
            "core/pack.json": _content("core", 1),
        }
    )
    bindings = [
        *push_closure("integration:erp-sync", "sales"),
        *push_closure("app:CRM", "sales"),
        *push_closure("app:CRM", "core"),
    ]
    packs = [world.official("sales", commit), world.official("core", commit)]
    world.service.apply(world.manifest(packs, bindings))
    before = world.tables()

    # Without `bindings` the current ones stay: four of them use the pack.
    with pytest.raises(LifecycleRejected) as kept:
        world.service.apply(release(world, packs[1:], remove=["sales"]))
    error = kept.value
    assert (error.reason, error.exit_code, error.details["field"]) == (
        "PACK_IN_USE",
        5,
        "remove[0]",
    )
    assert error.details["binding_count"] == 4
    assert sorted((b["audience"], b["kind"], b["key"]) for b in error.details["bindings"]) == [
        ("app:CRM", "callout_profile", "erp"),
        ("app:CRM", "push_contract", "Order.push"),
        ("integration:erp-sync", "callout_profile", "erp"),
        ("integration:erp-sync", "push_contract", "Order.push"),
    ]
    assert {b["pack"] for b in error.details["bindings"]} == {"sales"}
    assert "integration:erp-sync sales/push_contract/Order.push" in error.message

    # The manifest's own bindings still naming the pack: named by their JSON path.
    code, refused = cli_json(
        "--db", world.url, "apply", str(release(world, remove=["sales"], bindings=bindings[:2]))
    )
    assert (code, refused["error"], refused["details"]["reason"]) == (5, "LIFECYCLE", "PACK_IN_USE")
    assert sorted(b["field"] for b in refused["details"]["bindings"]) == [
        "bindings[0]",
        "bindings[1]",
    ]
    assert world.tables() == before  # nothing appended, no view touched

    # Revoking them in the same release removes the pack; publication no longer has it.
    out = world.service.apply(release(world, remove=["sales"], bindings=bindings[4:]))
    assert out["catalog"]["published"] is True and out["catalog"]["revision"] == 2
    assert len(out["bindings"]["revoked"]) == 4
    reader = CatalogReader(world.db)
    view = reader.view(Audience.parse("app:CRM"))
    assert {g["pack"] for g in view.grants} == {"core"}
    with pytest.raises(Exception) as missing:
        reader.view(Audience.parse("integration:erp-sync"))
    assert type(missing.value).__name__ == "Missing"
    code, head = cli_json("--db", world.url, "audit", "verify")
    assert code == 0 and head["ok"] is True


def test_r7_remove_and_packs_naming_the_same_pack_is_invalid_at_remove_0(
    world: World,
) -> None:
    commit = world.commit("sales", 1)
    world.apply(world.official("sales", commit))
    before = world.tables()
    path = release(world, [world.official("sales", commit)], remove=["sales"])
    code, error = cli_json("--db", world.url, "apply", str(path))
    assert (code, error["error"], error["details"]["field"]) == (3, "INVALID", "remove[0]")
    assert "also listed under packs[0]" in error["message"]
    twice = release(world, remove=["sales", "sales"])
    code, error = cli_json("--db", world.url, "apply", str(twice))
    assert (code, error["details"]["field"]) == (3, "remove[1]")
    assert world.tables() == before


def test_r7_remove_naming_no_installed_pack_is_invalid_at_its_index(world: World) -> None:
    commit = world.commit("sales", 1)
    world.apply(world.official("sales", commit))
    world.service.apply(release(world, remove=["sales"]))  # now removed
    world.apply(world.official("core", world.commit("core", 1)))
    before = world.tables()
    for names, index in ((["core", "nosuch"], 1), (["sales"], 0), (["core", "sales"], 1)):
        with pytest.raises(InvalidInput) as info:
            world.service.apply(release(world, remove=names))
        assert info.value.details["field"] == f"remove[{index}]", names
        assert info.value.exit_code == 3 and "names no installed pack" in info.value.message
    # A legacy record that was never adopted is not ledger authority: a lifecycle rule.
    legacy = world.legacy_file(
        [
            {
                "pack": "old",
                "install_id": "legacy-old",
                "status": "active",
                "category": "app",
                "source": {"kind": "official_repo", "repo": "r", "revision": commit},
                "applied_payload_hash": None,
            }
        ]
    )
    world.service.import_legacy(legacy)
    before = world.tables()
    with pytest.raises(LifecycleRejected) as rejected:
        world.service.apply(release(world, remove=["old"]))
    assert rejected.value.reason == "LEGACY_NOT_ADOPTED"
    assert world.tables() == before


def test_r7_reinstalling_a_removed_pack_is_a_fresh_incarnation(world: World) -> None:
    c1 = world.commit("sales", 1)
    first = world.apply(world.official("sales", c1))
    g1 = first["packs"][0]["install_id"]
    assert g1 is not None
    world.service.apply(release(world, remove=["sales"]))

    again = world.apply(world.official("sales", c1))  # the very same content

    (outcome,) = again["packs"]
    assert outcome["decision"] == "install" and outcome["epoch"] == 3
    g2 = outcome["install_id"]
    assert g2 not in (None, g1)
    assert installed(world)["sales"] == (g2, "official_repo", 3)
    assert activation_rows(world)["sales"] == (g2, 3)
    state = world.state("sales")
    assert classify(state) is Condition.ACTIVE
    assert state.history is not None and state.history.attempts == [g1, g2]
    fresh = generation(world, "sales", g2)
    assert (fresh.ordinal, fresh.origin.value, fresh.from_install_id) == (2, "install", None)
    assert generation(world, "sales", g1).status is GenerationStatus.RETIRED
    # Removed and installed once more: epochs never restart.
    world.service.apply(release(world, remove=["sales"]))
    third = world.apply(world.official("sales", world.commit("sales", 2)))
    assert third["packs"][0]["epoch"] == 5
    code, history = cli_json("--db", world.url, "history", "--pack", "sales")
    assert code == 0
    assert [e["event"] for e in history["events"] if e["event"].startswith("activation.")] == [
        "activation.started",
        "activation.removed",
        "activation.reinstalled",
        "activation.removed",
        "activation.reinstalled",
    ]
    prepared = [e for e in history["events"] if e["event"] == "generation.prepared"]
    assert [(e["install_id"], e["origin"], e["ordinal"]) for e in prepared][:2] == [
        (g1, "install", 1),
        (g2, "install", 2),
    ]
    report = verify_log(world.ledger)
    assert report.ok, report.first()


def test_r7_a_removed_pack_may_come_back_as_either_source_kind(world: World) -> None:
    """A fresh incarnation may change source kind: official -> local_path -> official;
    local_path content itself removed and installed again gets a new install id."""
    folder = world.local_dir("dev", 1)
    world.service.apply(world.manifest([local("dev", folder)]))
    local1 = installed(world)["dev"][0]
    world.service.apply(release(world, remove=["dev"]))
    world.service.apply(world.manifest([local("dev", folder)]))  # same folder, same content
    local2 = installed(world)["dev"][0]
    assert local2 != local1 and installed(world)["dev"][1] == "local_path"
    assert world.state("dev").local.incarnation == 2  # type: ignore[union-attr]

    world.service.apply(release(world, remove=["dev"]))
    official = world.apply(world.official("dev", world.commit("dev", 1)))
    assert official["packs"][0]["decision"] == "install" and official["packs"][0]["epoch"] == 1
    assert installed(world)["dev"][1] == "official_repo"
    world.service.apply(release(world, remove=["dev"]))
    back = world.service.apply(world.manifest([local("dev", folder)]))
    assert back["packs"][0]["decision"] == "local_update"
    assert classify(world.state("dev")) is Condition.LOCAL
    assert installed(world)["dev"][1] == "local_path"
    assert len({local1, local2, installed(world)["dev"][0]}) == 3
    report = verify_log(world.ledger)
    assert report.ok, report.first()


def test_r7_an_adopted_pack_removed_and_installed_again_never_reuses_the_legacy_id(
    world: World,
) -> None:
    commit = world.commit("sales", 1)
    resolved = world.resolved("sales", commit)
    world.service.import_legacy(
        world.legacy_file(
            [
                {
                    "pack": "sales",
                    "install_id": "legacy-sales",
                    "status": "active",
                    "category": "app",
                    "source": {"kind": "official_repo", "repo": "old", "revision": commit},
                    "applied_payload_hash": resolved.content.payload_hash_v1,
                }
            ]
        )
    )
    adopted = world.apply(world.official("sales", commit))
    assert adopted["packs"][0]["decision"] == "adopt"
    world.service.apply(release(world, remove=["sales"]))
    assert classify(world.state("sales")) is Condition.REMOVED
    again = world.apply(world.official("sales", commit))
    assert again["packs"][0]["decision"] == "install"
    assert again["packs"][0]["install_id"] not in (None, "legacy-sales")
    report = verify_log(world.ledger)
    assert report.ok, report.first()


def test_r12_r7_a_pack_left_dirty_may_be_removed_and_publication_proceeds(
    world: World,
) -> None:
    """An abandoned attempt becomes failed_dirty (R12) and would hold publication of the
    pack back; removing the pack serves nothing of it, so the next revision publishes."""
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    bindings = push_closure("integration:a", "sales")
    world.service.apply(world.manifest([world.official("sales", c1)], bindings))
    handle = world.service.acquire_lease()
    target = world.resolved("sales", c2)
    from domain.matrix import Advance

    world.service.prepare(handle, [(target, Advance(target.target, c1))])
    world.service.release_lease(handle)  # the attempt is left preparing

    out = world.service.apply(release(world, remove=["sales"], bindings=[]))

    assert [r["pack"] for r in out["recovered"]] == ["sales"]
    assert out["catalog"]["published"] is True and "blocked" not in out["catalog"]
    assert classify(world.state("sales")) is Condition.REMOVED
    report = verify_log(world.ledger)
    assert report.ok, report.first()


def test_r10_an_exact_retry_of_a_removal_is_read_only(world: World) -> None:
    world.apply(world.official("sales", world.commit("sales", 1)))
    path = release(world, remove=["sales"])
    out = world.service.apply(path, command_id="remove-sales")
    head = world.head()
    again = world.service.apply(path, command_id="remove-sales")
    assert again == {**out, "replayed": True} and world.head() == head


def test_r20_rebuilt_views_equal_inline_views_after_removals(world: World) -> None:
    folder = world.local_dir("dev", 1)
    commit = world.commit("sales", 1)
    world.service.apply(world.manifest([world.official("sales", commit), local("dev", folder)]))
    world.service.apply(release(world, remove=["sales", "dev"]))
    world.apply(world.official("sales", commit))
    world.service.apply(world.manifest([local("dev", folder)]))
    world.service.apply(release(world, remove=["dev"]))
    assert [r for r in world.ledger.runner.verify(world.db) if not r.ok] == []
    inline = (installed(world), activation_rows(world), generation_rows(world))
    assert set(inline[0]) == {"sales"} and inline[1]["sales"][1] == 3
    for view in ("installed_pack", "pack_activation", "pack_generation"):
        code, out = cli_json("--db", world.url, "projections", "rebuild", view)
        assert code == 0, out
    assert (installed(world), activation_rows(world), generation_rows(world)) == inline
    assert [r for r in world.ledger.runner.verify(world.db) if not r.ok] == []


def generation_rows(world: World) -> set[tuple[str, str, str, int | None]]:
    with world.db.read() as conn:
        rows = conn.execute(
            sa.text("SELECT pack, install_id, status, epoch FROM _System_PackGeneration")
        ).fetchall()
    return {
        (bytes(r.pack).decode(), bytes(r.install_id).decode(), bytes(r.status).decode(), r.epoch)
        for r in rows
    }


def test_r22_audit_catches_a_forged_removal(world: World, sibling_url: str) -> None:
    """A removal event for a pack with no active generation, forged into a re-chained
    copy of the log (every event id and chain link verifies)."""
    world.apply(world.official("sales", world.commit("sales", 1)))
    world.apply(world.official("core", world.commit("core", 1)))
    world.service.apply(release(world, remove=["sales"]))
    assert verify_log(world.ledger).ok

    def forge(row: LoggedEvent) -> tuple[str, bytes] | None:
        if row.topic != "activation.removed@1":
            return None
        state = json.loads(row.state)
        state["pack"] = "ghost"  # a pack that never had an active generation
        return row.topic, json.dumps(state, sort_keys=True).encode()

    position = rechained(world.url, sibling_url, forge)
    problem = audit_problem(sibling_url)
    assert (problem["position"], problem["check"]) == (position, "replay")
    assert "no active generation" in problem["message"] and "R7" in problem["message"]


def test_r22_audit_catches_a_retirement_claiming_removal_with_a_successor(
    world: World, sibling_url: str
) -> None:
    world.apply(world.official("sales", world.commit("sales", 1)))
    world.apply(world.official("sales", world.commit("sales", 2)))  # an advance

    def forge(row: LoggedEvent) -> tuple[str, bytes] | None:
        if row.topic != "generation.retired@2":
            return None
        state = json.loads(row.state)
        state["removed"] = True  # successor_install_id stays set
        return row.topic, json.dumps(state, sort_keys=True).encode()

    position = rechained(world.url, sibling_url, forge)
    problem = audit_problem(sibling_url)
    assert (problem["position"], problem["check"]) == (position, "replay")
    assert "disagree" in problem["message"] and "R7" in problem["message"]


def test_r13_a_removed_pointer_whose_generation_is_still_active_fails_closed(
    world: World,
) -> None:
    """Crafted straight into the log: the pointer removed, its generation not retired."""
    world.apply(world.official("sales", world.commit("sales", 1)))
    state = world.state("sales")
    assert state.activation is not None
    state.activation.remove()
    world.ledger.app.save(state.activation)
    head = world.head()
    with pytest.raises(LifecycleRejected) as info:
        world.apply(world.official("sales", world.commit("sales", 2)))
    assert info.value.reason == "INCONSISTENT_STATE"
    details = info.value.details
    assert details["pack"] == "sales" and "not retired" in details["found"], details
    assert world.head() == head
    assert not verify_log(world.ledger).ok  # the auditor sees it too


def _content(name: str, version: int) -> bytes:
    from tests.support.lifecycle_support import content

    return content(name, version)


@pytest.mark.parametrize(
    ("remove", "field"),
    [
        ([1], "remove[0]"),
        ("sales", "remove"),
        (["core", " sales"], "remove[1]"),
        (["core", ""], "remove[1]"),
        (["core", "sales", "core"], "remove[2]"),
    ],
)
def test_r1_r7_remove_names_are_validated_at_their_json_path(remove: Any, field: str) -> None:
    from domain.manifest import parse_manifest

    with pytest.raises(InvalidInput) as info:
        parse_manifest({"packs": [], "remove": remove}, file="release.json")
    assert info.value.details["field"] == field and info.value.exit_code == 3
    assert info.value.message.startswith(f"release.json: {field}: ")
