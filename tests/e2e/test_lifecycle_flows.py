"""Lifecycle flows end to end on SQLite and MariaDB (R5-R12): upgrade, retry, adopt,
local_path, crash recovery, fencing and concurrent apply."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from domain.classifier import Condition, classify
from domain.errors import LifecycleRejected
from domain.lifecycle import GenerationStatus
from domain.log import first_chain_break
from domain.matrix import Advance
from ledger.commands.writer_lease import LeaseLost
from tests.support.cli_inprocess import cli
from tests.support.cli_support import run_cli
from tests.support.lifecycle_support import World, new_service

ROOT = Path(__file__).resolve().parents[2]


def _generation_topics(world: World) -> list[str]:
    return [t for t in world.topics() if t.startswith("generation.")]


def test_r7_upgrade_g1_g2_restart_g3_and_exact_retry_is_read_only(world: World) -> None:
    c1, c2, c3 = (world.commit("sales", v) for v in (1, 2, 3))
    r1 = world.apply(world.official("sales", c1))
    assert [p["decision"] for p in r1["packs"]] == ["install"]
    g1 = r1["packs"][0]["install_id"]
    r2 = world.apply(world.official("sales", c2))
    assert r2["packs"][0]["decision"] == "advance" and r2["packs"][0]["epoch"] == 2
    g2 = r2["packs"][0]["install_id"]
    assert g2 != g1

    # Restart: a new process applies G3 through the real CLI.
    m3 = world.manifest([world.official("sales", c3)])
    out = run_cli("--db", world.url, "apply", str(m3), "--command-id", "release-3", "--json")
    assert out.code == 0, out.stdout + out.stderr
    assert out.json()["packs"][0]["epoch"] == 3
    state = world.state("sales")
    assert classify(state) is Condition.ACTIVE
    assert state.activation is not None and state.activation.revision == c3
    assert state.history is not None and state.history.attempts[:2] == [g1, g2]

    # Exact retry after success: the recorded result, nothing appended. (The retries
    # run the CLI in this process: the restart above is the one the process is for.)
    head = world.head()
    again = cli("--db", world.url, "apply", str(m3), "--command-id", "release-3", "--json")
    assert again.code == 0 and again.json()["replayed"] is True
    assert again.json()["packs"] == out.json()["packs"]
    assert world.head() == head
    # Same command id, different request: a conflict, nothing appended.
    other = world.manifest([world.official("sales", c1)])
    clash = cli("--db", world.url, "apply", str(other), "--command-id", "release-3", "--json")
    assert clash.code == 4 and clash.json()["error"] == "CONFLICT"
    assert world.head() == head
    # Re-running the current manifest with a derived id is a no-op that appends nothing.
    noop = world.apply(world.official("sales", c3))
    assert noop["noop"] is True and world.head() == head
    statuses = {g.install_id: g.status for g in [state.newest] if g}
    assert statuses == {state.activation.install_id: GenerationStatus.ACTIVE}


def test_r12_retained_historical_generations_do_not_block_a_fresh_candidate(world: World) -> None:
    commits = [world.commit("sales", v) for v in (1, 2, 3, 4)]
    world.apply(world.official("sales", commits[0]))
    world.apply(world.official("sales", commits[1]))  # G1 retired, G2 active
    handle = world.service.acquire_lease()
    target = world.resolved("sales", commits[2])
    (cand,) = world.service.prepare(handle, [(target, Advance(target.target, commits[1]))]).values()
    world.service.fail(handle, "sales", cand, dirty=False, reason="x")
    world.service.release_lease(handle)
    result = world.apply(world.official("sales", commits[3]))
    assert result["packs"][0]["decision"] == "advance" and result["packs"][0]["epoch"] == 3
    assert classify(world.state("sales")) is Condition.ACTIVE


def test_r7_advance_with_missing_authority_never_produces_generation_1(world: World) -> None:
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    handle = world.service.acquire_lease()
    target = world.resolved("sales", c2)
    before = world.head()
    with pytest.raises(LifecycleRejected) as info:  # no activation at all
        world.service.prepare(handle, [(target, Advance(target.target, c1))])
    assert info.value.reason == "MISSING_AUTHORITY"
    assert world.head() == before and _generation_topics(world) == []
    world.service.release_lease(handle)

    world.apply(world.official("sales", c1))
    handle = world.service.acquire_lease()
    generations = _generation_topics(world)
    with pytest.raises(LifecycleRejected) as info:  # activation at another revision
        world.service.prepare(handle, [(target, Advance(target.target, c2))])
    assert info.value.reason == "FROM_REVISION_MISMATCH"
    assert _generation_topics(world) == generations


@pytest.mark.parametrize("proof", ["v1", "v0"])
def test_r7_adopt_with_matching_hash_keeps_legacy_install_id(world: World, proof: str) -> None:
    commit = world.commit("billing", 1)
    resolved = world.resolved("billing", commit)
    stored = resolved.content.payload_hash_v1 if proof == "v1" else resolved.content.payload_hash_v0
    world.service.import_legacy(
        world.legacy_file(
            [
                {
                    "pack": "billing",
                    "install_id": "LEGACY-Billing-7",
                    "status": "active",
                    "category": "app",
                    "source": {"kind": "official_repo", "repo": "old/billing"},
                    "applied_payload_hash": stored,
                }
            ]
        )
    )
    result = world.apply(world.official("billing", commit))
    assert result["packs"][0]["decision"] == "adopt" and result["packs"][0]["epoch"] == 1
    state = world.state("billing")
    assert state.activation is not None
    assert state.activation.install_id == "LEGACY-Billing-7"
    assert state.active is not None and state.active.origin.value == "adopt"
    assert classify(state) is Condition.ACTIVE


@pytest.mark.parametrize(
    ("stored", "reason"),
    [
        (None, "PAYLOAD_HASH_UNUSABLE"),
        ("v1:xyz", "PAYLOAD_HASH_UNUSABLE"),
        ("sha256:" + "0" * 64, "PAYLOAD_HASH_UNUSABLE"),
        ("v1:" + "0" * 64, "PAYLOAD_HASH_MISMATCH"),
        ("v0:" + "0" * 64, "PAYLOAD_HASH_MISMATCH"),
    ],
)
def test_r7_adopt_fails_closed_without_payload_proof(
    world: World, stored: str | None, reason: str
) -> None:
    commit = world.commit("billing", 1)
    world.service.import_legacy(
        world.legacy_file(
            [
                {
                    "pack": "billing",
                    "install_id": "legacy-1",
                    "status": "active",
                    "category": "app",
                    "source": {"kind": "official_repo"},
                    "applied_payload_hash": stored,
                }
            ]
        )
    )
    head = world.head()
    with pytest.raises(LifecycleRejected) as info:
        world.apply(world.official("billing", commit))
    assert info.value.reason == reason
    assert world.head() == head
    assert _generation_topics(world) == []


def test_r7_adopt_with_changed_content_fails_then_exact_adopt_and_advance(world: World) -> None:
    old, new = world.commit("billing", 1), world.commit("billing", 2)
    proof = world.resolved("billing", old).content.payload_hash_v1
    world.service.import_legacy(
        world.legacy_file(
            [
                {
                    "pack": "billing",
                    "install_id": "legacy-1",
                    "status": "active",
                    "category": "app",
                    "source": {"kind": "official_repo"},
                    "applied_payload_hash": proof,
                }
            ]
        )
    )
    with pytest.raises(LifecycleRejected) as info:
        world.apply(world.official("billing", new))
    assert info.value.reason == "PAYLOAD_HASH_MISMATCH"
    assert world.apply(world.official("billing", old))["packs"][0]["decision"] == "adopt"
    step = world.apply(world.official("billing", new))["packs"][0]
    assert step["decision"] == "advance" and step["epoch"] == 2


def test_r5_local_path_updates_in_place_and_is_never_authority(world: World) -> None:
    folder = world.local_dir("dev", 1)
    first = world.apply({"name": "dev", "source": {"kind": "local_path", "path": str(folder)}})
    assert first["packs"][0]["decision"] == "local_update"
    install_ids = set()
    for version in (2, 3, 4):
        world.local_dir("dev", version)
        step = world.apply({"name": "dev", "source": {"kind": "local_path", "path": str(folder)}})
        assert step["packs"][0]["decision"] == "local_update"
        local = world.state("dev").local
        assert local is not None
        install_ids.add(local.install_id)
        assert local.payload_hash == world.resolved_local("dev", folder).content.payload_hash_v1
    assert len(install_ids) == 1  # in place: the same incarnation
    assert _generation_topics(world) == []
    commit = world.commit("dev", 5)
    with pytest.raises(LifecycleRejected) as info:
        world.apply(world.official("dev", commit))
    assert info.value.reason == "SOURCE_KIND_CHANGE"
    # An official pack can never be replaced by a local_path.
    world.apply(world.official("sales", world.commit("sales", 1)))
    with pytest.raises(LifecycleRejected) as info:
        world.apply(
            {
                "name": "sales",
                "source": {"kind": "local_path", "path": str(world.local_dir("sales", 1))},
            }
        )
    assert info.value.reason == "LOCAL_PATH_NOT_AUTHORITY"


_CRASH_CHILD = textwrap.dedent(
    """
    import sys, time
    from domain.matrix import Advance
    from ledger.commands.service import CommandService
    from ledger.log.db import open_database
    from ledger.store.runtime import Ledger
    from tests.support.lifecycle_support import World
    url, repo, pack, frm, to = sys.argv[1:6]
    ledger = Ledger(open_database(url))
    service = CommandService(ledger, lease_ttl=1.0, holder="doomed-writer")
    handle = service.acquire_lease()
    from domain.identity import PackName
    from domain.manifest import ManifestPack, OfficialSource
    from ledger.sources.resolve import resolve_packs
    from pathlib import Path
    (target,) = resolve_packs([ManifestPack(PackName(pack),
                              OfficialSource(repo, to, pack + "/pack.json"))], base=Path(repo))
    service.prepare(handle, [(target, Advance(target.target, frm))])
    print("prepared", flush=True)
    time.sleep(600)
    """
)


def test_r12_sigkill_after_prepare_leaves_preparing_next_holder_marks_failed_dirty(
    world: World,
) -> None:
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    g1 = world.apply(world.official("sales", c1))["packs"][0]["install_id"]
    child = subprocess.Popen(
        [sys.executable, "-c", _CRASH_CHILD, world.url, str(world.repo.path), "sales", c1, c2],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "prepared"
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    assert classify(world.state("sales")) is Condition.ACTIVE_PREPARING
    assert world.state("sales").activation.install_id == g1  # type: ignore[union-attr]

    time.sleep(1.1)  # the dead holder's lease expires; the next holder recovers
    with world.service.leased() as handle:
        assert [r["pack"] for r in handle.recovered] == ["sales"]
    state = world.state("sales")
    assert classify(state) is Condition.ACTIVE_FAILED_DIRTY
    assert state.activation is not None and state.activation.install_id == g1
    assert state.newest is not None and "recovered by writer lease" in str(
        state.newest.failure_reason
    )
    # A later activation of that pack clears the dirty state.
    step = world.apply(world.official("sales", c2))["packs"][0]
    assert step["decision"] == "advance" and step["epoch"] == 2
    assert classify(world.state("sales")) is Condition.ACTIVE


def test_r12_stale_lease_holder_append_rejected_by_fencing_epoch(world: World) -> None:
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    world.apply(world.official("sales", c1))
    slow = new_service(world, lease_ttl=0.2, holder="slow-writer")
    stale = slow.acquire_lease()
    time.sleep(0.3)
    fresh = world.service.acquire_lease()  # takes over the expired lease: epoch + 1
    assert fresh.epoch == stale.epoch + 1
    target = world.resolved("sales", c2)
    head = world.head()
    with pytest.raises(LeaseLost) as info:
        slow.prepare(stale, [(target, Advance(target.target, c1))])
    assert "fenced out" in info.value.message
    assert info.value.details["holder"] == world.service.holder
    assert (info.value.details["epoch"], info.value.details["lost_epoch"]) == (3, 2)
    assert world.head() == head
    world.service.release_lease(fresh)
    slow.ledger.close()


@pytest.mark.parametrize("engine_url", ["mariadb"], indirect=True)
def test_r12_concurrent_apply_of_different_manifests_one_at_a_time(world: World) -> None:
    a1, b1 = world.commit("alpha", 1), world.commit("beta", 1)
    shared = world.commit("shared", 1)
    m1 = world.manifest([world.official("alpha", a1), world.official("shared", shared)])
    m2 = world.manifest([world.official("beta", b1), world.official("shared", shared)])
    procs = [
        subprocess.Popen(
            [
                str(Path(sys.executable).with_name("catalog-ledger")),
                "--db",
                world.url,
                "apply",
                str(m),
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for m in (m1, m2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    codes = [p.returncode for p in procs]
    assert all(c in (0, 4) for c in codes), outputs
    assert 0 in codes
    for _out, err in outputs:
        assert "Traceback" not in err
    rows = list(world.ledger.recorder.iter_rows())
    assert [r.position for r in rows] == list(range(1, len(rows) + 1))
    assert first_chain_break(rows) is None
    shared_state = world.state("shared")
    assert shared_state.history is not None and len(shared_state.history.attempts) == 1
    assert all(r.ok for r in world.ledger.runner.verify(world.db))


def test_r12_busy_writer_lease_is_a_conflict_after_the_wait(world: World) -> None:
    """The CLI in this process: the lease lives in the store, whichever process holds it."""
    commit = world.commit("sales", 1)
    holder = new_service(world, lease_ttl=60.0, holder="long-running-writer")
    handle = holder.acquire_lease()
    path = world.manifest([world.official("sales", commit)])
    head = world.head()
    out = cli("--db", world.url, "apply", str(path), "--wait", "0.3", "--json")
    assert out.code == 4, out.stdout
    doc = out.json()
    assert doc["error"] == "CONFLICT" and doc["details"]["rule"] == "R12"
    assert doc["details"]["holder"] == "long-running-writer"
    assert world.head() == head
    holder.release_lease(handle)
    assert cli("--db", world.url, "apply", str(path), "--json").code == 0
    holder.ledger.close()
