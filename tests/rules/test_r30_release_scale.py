"""R30: a release costs what it changes. ``apply`` decides on the revision in force
(``ledger.commands.release``): an official pack whose immutable source equals its active
generation's frozen one is not resolved again, the revision is built incrementally and
keeps its fragments, and the outcome is what a full build gives. Real stores: SQLite
file and MariaDB."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.apply import pack_files
from bench.publish import audience_bindings, official_pack
from domain.errors import InvalidInput
from domain.identity import PackName
from domain.manifest import ManifestPack, OfficialSource
from domain.matrix import Advance
from ledger.commands.catalog_state import log_head
from ledger.commands.publish import PublishHandler
from ledger.commands.publishing import read_catalog_in_force
from ledger.commands.unit_of_work import UnitOfWork
from ledger.sources import files
from ledger.sources.resolve import resolve_packs
from ledger.store import kept_fragments
from publisher.catalog import build_catalog
from publisher.fragments import fragments_of
from tests.support.gitrepo import Repo
from tests.support.lifecycle_support import World, content

PACKS = 6


def write(world: World, repo: Repo, revisions: dict[int, str], name: str) -> Path:
    manifest = {
        "packs": [official_pack(n, repo.path, c) for n, c in revisions.items()],
        "bindings": [b for n in revisions for b in audience_bindings(n, n)],
    }
    path = world.tmp / f"{name}.json"
    path.write_text(json.dumps(manifest))
    return path


def catalog(world: World, packs: int = PACKS) -> tuple[Repo, dict[int, str]]:
    """``packs`` packs in their own repository, applied and published once."""
    repo = Repo(world.tmp / "packs")
    base = repo.commit(pack_files(range(packs)))
    revisions = dict.fromkeys(range(packs), base)
    world.service.apply(write(world, repo, revisions, "first"))
    return repo, revisions


def kept_whole(world: World) -> bool:
    with world.db.read() as conn:
        head = log_head(world.ledger.recorder, conn)
        assert head is not None
        return (
            kept_fragments.read(conn, head.revision, head.content_digest, head.counts) is not None
        )


def full_build_is_a_noop(world: World) -> bool:
    """Does a full rebuild of the store's snapshot equal the revision in force?"""
    staged = PublishHandler(world.ledger, UnitOfWork(world.ledger), incremental=False)
    result = staged.stage_publication()
    return isinstance(result, dict) and result["noop"]


def test_r30_the_first_release_keeps_its_fragments_for_the_next(world: World) -> None:
    catalog(world)
    assert kept_whole(world)


def test_r30_a_one_pack_release_leaves_the_others_unresolved(world: World) -> None:
    """The unchanged packs' repository loses every object after the first release: a
    release changing a pack of another repository still applies, so it never read them."""
    repo, revisions = catalog(world)
    other = Repo(world.tmp / "other")
    changed = other.commit(pack_files(range(2, 3), release=1, changed=2))
    shutil.rmtree(repo.path / ".git" / "objects")
    (repo.path / ".git" / "objects").mkdir()
    manifest = {
        "packs": [
            official_pack(n, other.path if n == 2 else repo.path, changed if n == 2 else c)
            for n, c in revisions.items()
        ],
        "bindings": [b for n in revisions for b in audience_bindings(n, n)],
    }
    path = world.tmp / "one.json"
    path.write_text(json.dumps(manifest))
    result = world.service.apply(path)
    decisions = {p["pack"]: p["decision"] for p in result["packs"]}
    assert decisions == {
        f"pack-{n:05d}": ("advance" if n == 2 else "unchanged") for n in range(PACKS)
    }
    assert result["catalog"]["published"] and kept_whole(world)
    assert full_build_is_a_noop(world)


def test_r30_a_pack_whose_source_path_moved_is_resolved_again(world: World) -> None:
    """Same commit, another path: not the frozen source, so it is read (and here it is
    missing: INVALID naming the field, nothing appended)."""
    repo, revisions = catalog(world)
    path = write(world, repo, revisions, "moved")
    data = json.loads(path.read_text())
    data["packs"][1]["source"]["path"] = "nowhere/pack.json"
    path.write_text(json.dumps(data))
    head = world.head()
    with pytest.raises(InvalidInput) as info:
        world.service.apply(path)
    assert info.value.details["field"] == "packs[1].source.path"
    assert world.head() == head


def test_r30_a_noop_reapply_appends_nothing_and_equals_the_full_build(world: World) -> None:
    repo, revisions = catalog(world)
    head = world.head()
    result = world.service.apply(write(world, repo, revisions, "again"))
    assert result["noop"] and not result["catalog"]["published"]
    assert world.head() == head
    assert full_build_is_a_noop(world)


def test_r30_an_exact_retry_of_a_frozen_release_is_recognized(world: World) -> None:
    """R10: the request digest of frozen packs (hashes from the log) equals the resolved
    one's: the same command id replays, it is not a different request."""
    repo, revisions = catalog(world)
    changed = repo.commit(pack_files(range(1, 2), release=1, changed=1))
    path = write(world, repo, {**revisions, 1: changed}, "one")
    first = world.service.apply(path, command_id="release-7")
    again = world.service.apply(path, command_id="release-7")
    assert again["replayed"] and {**again, "replayed": False} == first


def test_r30_one_pack_releases_equal_the_full_build_and_keep_fragments(world: World) -> None:
    repo, revisions = catalog(world)
    for step in range(1, 4):
        n = step % PACKS
        revisions[n] = repo.commit(pack_files(range(n, n + 1), release=step, changed=n))
        result = world.service.apply(write(world, repo, revisions, f"step-{step}"))
        assert result["catalog"]["published"]
        assert kept_whole(world) and full_build_is_a_noop(world)


def test_r30_fragments_of_a_full_build_digest_to_its_content(world: World) -> None:
    """The fragments a full build keeps are its content, unit by unit."""
    catalog(world)
    with world.db.read() as conn:
        built = build_catalog(read_catalog_in_force(world.ledger, conn).input())
    fragments = fragments_of(built, 1)
    assert fragments.digest() == built.content_digest
    assert fragments.counts() == built.counts
    assert kept_fragments._labelled(fragments)


def test_r30_an_untouched_local_pack_is_not_parsed_by_apply(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 3: a local_path pack's raw bytes are hashed; it is parsed only when they
    differ from what the log recorded (never by mtime)."""
    folder = world.local_dir("dev", 1)
    entry = {"name": "dev", "source": {"kind": "local_path", "path": str(folder)}}
    assert world.apply(entry)["packs"][0]["decision"] == "local_update"

    def parsed(*_: object, **__: object) -> None:
        raise AssertionError("an untouched local pack was parsed")

    with monkeypatch.context() as patch:
        patch.setattr(files, "parse_pack_content", parsed)
        again = world.apply(entry)
    assert again["noop"] and again["packs"][0]["decision"] == "unchanged"
    (folder / "pack.json").write_bytes(content("dev", 2))
    assert world.apply(entry)["packs"][0]["decision"] == "local_update"


def test_r30_a_pack_with_an_attempt_left_preparing_before_the_revision_is_not_frozen(
    world: World,
) -> None:
    """An attempt prepared (and abandoned) before the revision in force was published is
    no lifecycle event after its cut; the pack's history says it is the newest attempt,
    so the pack is read and decided as before: recovered failed_dirty, then repaired by
    a fresh generation of the content already active (R12), not left unchanged."""
    repo, revisions = catalog(world)
    fewer = write(world, repo, revisions, "fewer")  # audience 0 loses its bindings
    data = json.loads(fewer.read_text())
    data["bindings"] = [b for b in data["bindings"] if b["pack"] != "pack-00000"]
    fewer.write_text(json.dumps(data))
    world.service.apply(fewer, publish=False)
    later = repo.commit(pack_files(range(3, 4), release=9, changed=3))
    source = OfficialSource(str(repo.path), later, "pack-00003/pack.json")  # type: ignore[arg-type]
    (target,) = resolve_packs([ManifestPack(PackName("pack-00003"), source)], base=world.tmp)
    handle = world.service.acquire_lease()
    world.service.prepare(handle, [(target, Advance(target.target, revisions[3]))])
    world.service.release_lease(handle)  # the attempt is left preparing
    assert world.service.publish()["published"]  # revision 2: its cut is after the attempt
    result = world.service.apply(write(world, repo, revisions, "again"))
    decisions = {p["pack"]: p["decision"] for p in result["packs"]}
    assert decisions["pack-00003"] == "advance"
    assert [r["pack"] for r in result["recovered"]] == ["pack-00003"]
    assert full_build_is_a_noop(world)


def test_r30_a_one_pack_manifest_without_bindings_rebinds_only_that_pack(world: World) -> None:
    """A manifest naming one pack and no ``bindings`` keeps every binding and re-binds
    those of the pack that moved (R14): the others' bindings are not re-planned, and the
    revision equals the full build's."""
    repo, _ = catalog(world)
    changed = repo.commit(pack_files(range(4, 5), release=3, changed=4))
    path = world.tmp / "one-pack.json"
    path.write_text(json.dumps({"packs": [official_pack(4, repo.path, changed)]}))
    result = world.service.apply(path)
    assert [(p["pack"], p["decision"]) for p in result["packs"]] == [("pack-00004", "advance")]
    rebound = {(b["audience"], b["pack"]) for b in result["bindings"]["rebound"]}
    assert rebound == {("integration:workload-000004", "pack-00004")}
    assert len(result["bindings"]["rebound"]) == 10
    assert not result["bindings"]["granted"] and not result["bindings"]["revoked"]
    assert result["catalog"]["published"] and kept_whole(world) and full_build_is_a_noop(world)
