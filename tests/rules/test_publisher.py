"""Bindings and publication (R14-R17) through `apply`/`publish` on SQLite and MariaDB."""

from __future__ import annotations

import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from domain.errors import Conflict, LifecycleRejected
from domain.matrix import Advance
from ledger.commands.publish import StagedPublication
from ledger.commands.results import ApplyResult
from tests.support.gitrepo import component, pack_json, sales
from tests.support.gitrepo import sales_closure as full
from tests.support.lifecycle_support import World

CLI = str(Path(sys.executable).with_name("catalog-ledger"))


def bind(
    audience: str, key: str, kind: str, pack: str = "sales", credential_set: str | None = None
) -> dict[str, Any]:
    out = {"audience": audience, "pack": pack, "kind": kind, "key": key}
    if credential_set is not None:
        out["credential_set"] = credential_set
    return out


def release(
    world: World, commit: str, bindings: list[dict[str, Any]] | None, **kwargs: Any
) -> ApplyResult:
    return world.service.apply(
        world.manifest([world.official("sales", commit)], bindings), **kwargs
    )


def catalog_rows(world: World, table: str) -> list[tuple[Any, ...]]:
    with world.db.read() as conn:
        return [
            tuple(bytes(c) if isinstance(c, bytes | memoryview) else c for c in r)
            for r in conn.execute(sa.text(f"SELECT * FROM {table}"))
        ]


def test_r16_one_invalid_audience_among_1000_valid_appends_nothing(world: World) -> None:
    commit = world.release({"sales/pack.json": sales()})
    bindings = [bind(f"app:tenant-{n:04d}", "Order.out", "outbound_mapping") for n in range(1000)]
    bindings.append(bind("app:tenant-bad", "erp", "callout_profile"))  # no credential set
    head = world.head()
    with pytest.raises(LifecycleRejected) as info:
        release(world, commit, bindings)
    assert info.value.details["problem_count"] == 1
    assert info.value.details["problems"][0]["audience"] == "app:tenant-bad"
    assert world.head() == head
    ok = release(world, commit, bindings[:-1])
    assert ok["catalog"]["counts"]["audiences"] == 1000
    assert ok["catalog"]["counts"]["facts"] == 1  # one shared fact, a thousand edges


def test_r17_unchanged_content_publishes_once_and_digest_ignores_history(
    world: World, tmp_path: Path, sibling_store: str
) -> None:
    commit = world.release({"sales/pack.json": sales()})
    first = release(world, commit, full("integration:a") + full("app:x", "erp-test"))
    digest = first["catalog"]["content_digest"]
    head = world.head()
    assert world.service.publish()["noop"] is True
    assert world.head() == head
    assert release(world, commit, full("integration:a") + full("app:x", "erp-test"))["noop"]

    # Another store reaches the same content through grants, revokes and re-grants.
    other = World(tmp_path / "other", sibling_store)
    try:
        c2 = other.release({"sales/pack.json": sales()})
        assert c2 == commit  # same deterministic repository
        release(other, c2, full("integration:a"))
        release(other, c2, full("app:x", "erp-test") + full("integration:z"))
        final = release(other, c2, full("integration:a") + full("app:x", "erp-test"))
        assert final["catalog"]["revision"] == 3
        assert final["catalog"]["content_digest"] == digest
    finally:
        other.close()


def test_r17_any_payload_binding_or_activation_change_changes_the_digest(world: World) -> None:
    c1 = world.release({"sales/pack.json": sales()})
    base = release(world, c1, full("integration:a"))["catalog"]["content_digest"]
    seen = {base}
    # A different binding (credential set) changes it.
    changed = release(world, c1, full("integration:a", "erp-test"))["catalog"]["content_digest"]
    assert changed not in seen
    seen.add(changed)
    # One byte of one payload changes it.
    c2 = world.release({"sales/pack.json": sales(2)})
    payload = release(world, c2, full("integration:a", "erp-test"))["catalog"]["content_digest"]
    assert payload not in seen
    seen.add(payload)
    # The same content re-activated (a new generation: install id and epoch) changes it.
    handle = world.service.acquire_lease()
    target = world.resolved("sales", c2)
    (cand,) = world.service.prepare(handle, [(target, Advance(target.target, c2))]).values()
    world.service.fail(handle, "sales", cand, dirty=True, reason="dirty")
    world.service.release_lease(handle)
    repaired = release(world, c2, full("integration:a", "erp-test"))
    assert repaired["packs"][0]["decision"] == "advance"
    assert repaired["catalog"]["content_digest"] not in seen


def test_r9_component_order_keeps_the_payload_hash_while_the_commit_moves_the_digest(
    world: World, tmp_path: Path, sibling_store: str
) -> None:
    commit = world.release({"sales/pack.json": sales()})
    digest = release(world, commit, full("integration:a"))["catalog"]["content_digest"]
    other = World(tmp_path / "other", sibling_store)
    try:
        reordered = other.release({"sales/pack.json": sales(reverse=True)})
        assert reordered != commit  # different bytes in git ...
        result = release(other, reordered, full("integration:a"))
        assert result["catalog"]["content_digest"] != digest  # ... and another revision id
        # ... but the same payload hash: only the commit id (part of the activation) differs.
        assert (
            result["packs"][0]["payload_hash"]
            == world.resolved("sales", commit).content.payload_hash_v1
        )
    finally:
        other.close()


def _advance(world: World, commit_from: str, commit_to: str) -> str:
    handle = world.service.acquire_lease()
    target = world.resolved("sales", commit_to)
    (cand,) = world.service.prepare(
        handle, [(target, Advance(target.target, commit_from))]
    ).values()
    world.service.release_lease(handle)
    return cand


def test_r12_dirty_pack_blocks_publication_until_a_later_generation_activates(
    world: World,
) -> None:
    c1, c2 = (world.release({"sales/pack.json": sales(v)}) for v in (1, 2))
    release(world, c1, full("integration:a"), publish=False)
    cand = _advance(world, c1, c2)
    handle = world.service.acquire_lease()
    world.service.fail(handle, "sales", cand, dirty=True, reason="crashed mid-apply")
    world.service.release_lease(handle)
    head = world.head()
    with pytest.raises(LifecycleRejected) as info:
        world.service.publish()
    assert {p["reason"] for p in info.value.details["problems"]} == {"DIRTY_PACK"}
    assert world.head() == head
    repaired = release(world, c2, full("integration:a"))
    assert repaired["packs"][0]["decision"] == "advance" and repaired["catalog"]["published"]


def test_r11_r12_release_publishing_over_an_abandoned_attempt_is_rejected_before_recovery(
    world: World,
) -> None:
    """An attempt left preparing makes its pack dirty once the next lease holder recovers
    it (R12); a release that would then publish that pack is rejected up front (R11):
    not even the recovery is appended. Found by the lifecycle model check."""
    c1, c2 = (world.release({"sales/pack.json": sales(v)}) for v in (1, 2))
    release(world, c1, full("integration:a"))
    _advance(world, c1, c2)  # prepared, never activated: abandoned
    head = world.head()
    # A release of no packs that grants more of the (about to be dirty) sales pack.
    grant_more = world.manifest([], [*full("integration:a"), *full("integration:b")])
    with pytest.raises(LifecycleRejected) as info:
        world.service.apply(grant_more)
    assert {p["reason"] for p in info.value.details["problems"]} == {"DIRTY_PACK"}
    assert world.head() == head
    advanced = release(world, c2, [*full("integration:a"), *full("integration:b")])
    assert advanced["packs"][0]["decision"] == "advance" and advanced["catalog"]["published"]


def test_r5_binding_to_a_local_path_pack_fails_closed(world: World) -> None:
    c1 = world.release({"sales/pack.json": sales()})
    folder = world.local_dir("dev", 1)
    manifest = world.manifest(
        [
            world.official("sales", c1),
            {"name": "dev", "source": {"kind": "local_path", "path": str(folder)}},
        ],
        [*full("integration:a"), bind("integration:a", "Order.push", "push_contract", "dev")],
    )
    with pytest.raises(LifecycleRejected) as info:
        world.service.apply(manifest)
    assert {p["reason"] for p in info.value.details["problems"]} == {"LOCAL_PATH_NOT_AUTHORITY"}
    assert world.head() == 0


def test_r16_apply_json_reports_bindings_and_revision(world: World) -> None:
    c1 = world.release({"sales/pack.json": sales()})
    path = world.manifest([world.official("sales", c1)], full("integration:a"))
    from tests.support.cli_inprocess import cli

    out = cli("--db", world.url, "apply", str(path), "--json")
    assert out.code == 0, out.stdout + out.stderr
    doc = out.json()
    assert len(doc["bindings"]["granted"]) == 3
    assert doc["catalog"]["revision"] == 1 and len(doc["catalog"]["content_digest"]) == 64
    path2 = world.manifest([world.official("sales", c1)], [*full("integration:a")[:2]])
    rejected = cli("--db", world.url, "apply", str(path2), "--json")
    assert rejected.code == 5 and rejected.json()["error"] == "LIFECYCLE"
    path3 = world.manifest([world.official("sales", c1)], [])
    revoked = cli("--db", world.url, "apply", str(path3), "--json").json()
    assert len(revoked["bindings"]["revoked"]) == 3
    assert revoked["catalog"]["revision"] == 2 and revoked["catalog"]["counts"]["grants"] == 0


@pytest.mark.parametrize("engine_url", ["mariadb"], indirect=True)
def test_r16_concurrent_activation_between_build_and_append_is_a_conflict(
    world: World,
) -> None:
    c1, c2 = (world.release({"sales/pack.json": sales(v)}) for v in (1, 2))
    release(world, c1, full("integration:a"), publish=False)
    staged = world.service.stage_publication()  # built and validated in memory
    assert isinstance(staged, StagedPublication)
    # Another process activates a new generation (and re-binds) before the append.
    moved = world.manifest([world.official("sales", c2)], full("integration:a"))
    out = subprocess.run(
        [CLI, "--db", world.url, "apply", str(moved), "--no-publish", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    head = world.head()
    with pytest.raises(Conflict):
        world.service.commit_publication(staged)
    assert world.head() == head
    # Rebuilt on the new state, it publishes the new generation.
    published = world.service.publish()
    assert published["revision"] == 1 and not published["noop"]


def test_r1_case_and_normalization_variants_are_distinct_audiences_keys_and_sets(
    world: World,
) -> None:
    nfc, nfd = unicodedata.normalize("NFC", "é"), unicodedata.normalize("NFD", "é")
    pack = pack_json(
        "sales",
        "app",
        [
            component("push_contract", "Order.push", {"v": 1}),
            component("push_contract", "order.push", {"v": 2}),
            component("callout_profile", "erp", {"v": 3}, credential_sets=["Prod", "prod", nfc]),
        ],
    )
    commit = world.release({"sales/pack.json": pack})
    bindings = [
        bind("integration:Sync", "Order.push", "push_contract"),
        bind("integration:sync", "order.push", "push_contract"),
        bind(f"app:{nfc}", "erp", "callout_profile", credential_set="Prod"),
        bind(f"app:{nfd}", "erp", "callout_profile", credential_set="prod"),
        bind(f"app:{nfd}", "erp", "callout_profile", credential_set=nfc),
    ]
    result = release(world, commit, bindings)
    assert result["catalog"]["counts"] == {
        "audiences": 4,
        "activations": 1,
        "facts": 3,
        "grants": 5,
    }
    grants = catalog_rows(world, "_System_CatalogGrant")
    assert len({g[:6] for g in grants}) == 5
    # The NFD audience may not use a set that only differs by normalization from an allowed one.
    bad = [*bindings, bind(f"app:{nfd}", "erp", "callout_profile", credential_set=nfd)]
    with pytest.raises(LifecycleRejected) as info:
        release(world, commit, bad)
    assert info.value.details["problems"][0]["reason"] == "CREDENTIAL_SET_NOT_ADMITTED"


def test_r20_catalog_views_rebuild_to_identical_rows(world: World) -> None:
    c1, c2 = (
        world.release({"sales/pack.json": sales()}),
        world.release({"sales/pack.json": sales(2)}),
    )
    release(world, c1, full("integration:a"))
    release(world, c1, full("integration:a") + full("app:b", "erp-test"))
    release(world, c2, full("app:b", "erp-test"))
    names = ["audience_binding", "catalog"]
    before = {
        t: catalog_rows(world, t)
        for t in (
            "_System_CatalogGrant",
            "_System_CatalogAudience",
            "_System_CatalogActivation",
            "_System_CatalogRevision",
        )
    }
    world.ledger.runner.rebuild(world.db, names)
    after = {t: catalog_rows(world, t) for t in before}
    assert {t: sorted(v) for t, v in after.items()} == {t: sorted(v) for t, v in before.items()}
    assert all(r.ok for r in world.ledger.runner.verify(world.db, names))


def _staged(world: World) -> StagedPublication:
    staged = world.service.stage_publication()
    assert isinstance(staged, StagedPublication)
    return staged


def test_r11_publish_refuses_when_an_audience_it_reused_moved_after_its_snapshot(
    world: World,
) -> None:
    """The position fence covers the audiences an incremental revision reused from its
    parent as well as the ones it rebuilt: a change to either after the snapshot is a
    Conflict, and nothing is written."""
    c1 = world.release({"sales/pack.json": sales(1)})
    release(world, c1, full("integration:a") + full("integration:b"))
    # a's credential set changes (a is rebuilt); b is reused from revision 1.
    release(world, c1, full("integration:a", "erp-test") + full("integration:b"), publish=False)
    staged = _staged(world)
    assert staged.result["revision"] == 2
    # Before the append, another writer revokes b's bindings.
    release(world, c1, full("integration:a", "erp-test"), publish=False)
    head = world.head()
    with pytest.raises(Conflict) as info:
        world.service.commit_publication(staged)
    assert info.value.details["read_at_position"] < head
    assert world.head() == head
    published = world.service.publish()
    assert published["revision"] == 2 and published["counts"]["grants"] == 3


def test_r11_publish_goes_ahead_when_only_what_it_did_not_read_moved(world: World) -> None:
    """Events after the snapshot of aggregates the revision does not depend on (a
    credential) do not refuse it: the same answer as the fence of versions it replaced."""
    c1 = world.release({"sales/pack.json": sales(1)})
    release(world, c1, full("integration:a"), publish=False)
    staged = _staged(world)
    world.service.credentials_issue("integration:a", expires_in="1h")
    moved = world.head()
    assert world.service.commit_publication(staged)["revision"] == 1
    assert world.head() > moved
    assert world.service.publish()["noop"] is True  # the revision it appended is current
