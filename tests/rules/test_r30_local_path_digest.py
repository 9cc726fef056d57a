"""R30 (issue 27.3): a ``local_path`` pack is mutable, so apply hashes its raw ``pack.json``
and parses it only when the bytes differ from those its log record was made from.

The prior digest is the ``file_digest`` of the pack's ``local_pack`` event (schema v2),
never a view or cache (R28), and file times are never used. Real stores: SQLite file and
MariaDB."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, NoReturn

import orjson
import pytest
from eventsourcing.persistence import StoredEvent

from domain.classifier import Condition, classify
from domain.errors import InvalidInput
from domain.event_types import EVENT_TYPES
from domain.identity import PackName
from domain.lifecycle import install_id_for
from domain.manifest import LocalSource, ManifestPack
from domain.matrix import Decision, decide
from domain.records import local_id
from ledger.audit.verify import verify_log
from ledger.sources import files
from ledger.sources.files import local_file_digest, read_local
from ledger.sources.local import KnownLocal, known_local
from tests.support.gitrepo import local
from tests.support.lifecycle_support import World


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def local_rows(world: World, pack: str) -> list[tuple[str, dict[str, Any]]]:
    """(stored topic, stored state) of every ``local_pack`` row of ``pack``, in order."""
    return [
        (row.topic, orjson.loads(row.state))
        for row in world.ledger.recorder.iter_rows()
        if row.topic.startswith("local_pack.") and orjson.loads(row.state)["pack"] == pack
    ]


def manifest_pack(pack: str, folder: Path) -> tuple[ManifestPack, LocalSource]:
    source = LocalSource(str(folder))
    return ManifestPack(PackName(pack), source), source


def known(world: World, pack: str, folder: Path, index: int = 0) -> KnownLocal | None:
    """``known_local`` on the pack's state as the log has it now."""
    entry, source = manifest_pack(pack, folder)
    return known_local(index, entry, source, world.tmp, world.state(pack))


def remove(world: World, pack: str) -> None:
    world._manifests += 1
    path = world.tmp / f"remove-{world._manifests}.json"
    path.write_text(json.dumps({"packs": [], "remove": [pack]}), encoding="utf-8")
    (outcome,) = world.service.apply(path)["packs"]
    assert outcome["decision"] == "remove"


# -- what the log records ---------------------------------------------------------------------


def test_r30_every_local_pack_record_carries_the_raw_file_digest(world: World) -> None:
    folder = world.local_dir("dev", 1)
    assert world.apply(local("dev", folder))["packs"][0]["decision"] == "local_update"
    first = sha256(folder / "pack.json")
    world.local_dir("dev", 2)
    assert world.apply(local("dev", folder))["packs"][0]["decision"] == "local_update"
    second = sha256(folder / "pack.json")
    remove(world, "dev")
    world.local_dir("dev", 3)
    assert world.apply(local("dev", folder))["packs"][0]["decision"] == "local_update"
    third = sha256(folder / "pack.json")
    assert len({first, second, third}) == 3

    rows = local_rows(world, "dev")
    assert [(topic, state.get("file_digest")) for topic, state in rows] == [
        ("local_pack.installed@2", first),
        ("local_pack.updated@2", second),
        ("local_pack.removed@1", None),
        ("local_pack.reinstalled@2", third),
    ]
    state = world.state("dev").local
    assert state is not None and state.file_digest == third and state.incarnation == 2
    assert verify_log(world.ledger).ok


def test_r30_read_local_and_the_cheap_digest_agree_on_the_raw_bytes(world: World) -> None:
    folder = world.local_dir("dev", 1)
    entry, source = manifest_pack("dev", folder)
    facts, content, digest = read_local(0, entry, source, world.tmp)
    cheap_facts, cheap = local_file_digest(0, entry, source, world.tmp)
    assert digest == cheap == sha256(folder / "pack.json")
    assert facts == cheap_facts and content.name == "dev"
    assert world.resolved_local("dev", folder).file_digest == digest
    c1 = world.commit("sales", 1)
    assert world.resolved("sales", c1).file_digest is None  # official packs have none


# -- known from the log, or parsed ------------------------------------------------------------


def test_r30_untouched_and_mtime_only_changes_stay_known(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = world.local_dir("dev", 1)
    world.apply(local("dev", folder))
    resolved = world.resolved_local("dev", folder)
    file = folder / "pack.json"

    def refuse(*_: object, **__: object) -> NoReturn:
        raise AssertionError("a local pack.json was parsed")

    monkeypatch.setattr(files, "parse_pack_content", refuse)
    found = known(world, "dev", folder, index=3)
    assert found == KnownLocal(
        index=3,
        name="dev",
        source=resolved.source,
        payload_hash=resolved.payload_hash,
        category=resolved.category,
        file_digest=sha256(file),
    )
    state = world.state("dev")
    assert classify(state) is Condition.LOCAL
    assert decide(state, found.target) == (Decision.UNCHANGED, None)

    # Only the times change (set explicitly: no clock, no sleep): still known.
    before = file.stat()
    os.utime(file, ns=(before.st_atime_ns + 10**12, before.st_mtime_ns + 10**12))
    assert file.stat().st_mtime_ns != before.st_mtime_ns
    assert known(world, "dev", folder, index=3) == found
    os.utime(file, ns=(0, 0))  # even back to the epoch
    assert known(world, "dev", folder, index=3) == found


def test_r30_a_whitespace_only_edit_is_parsed_and_decided_as_today(world: World) -> None:
    folder = world.local_dir("dev", 1)
    world.apply(local("dev", folder))
    file = folder / "pack.json"
    recorded = sha256(file)
    file.write_bytes(file.read_bytes() + b"\n \n")  # same JSON, other bytes

    assert known(world, "dev", folder) is None
    resolved = world.resolved_local("dev", folder)
    state = world.state("dev")
    assert state.local is not None and resolved.payload_hash == state.local.payload_hash
    assert resolved.file_digest != recorded
    assert decide(state, resolved.target) == (Decision.UNCHANGED, None)
    head = world.head()
    assert world.apply(local("dev", folder))["packs"][0]["decision"] == "unchanged"
    assert world.head() - head <= 3  # the lease and the command record: no local event
    assert [t for t, _ in local_rows(world, "dev")] == ["local_pack.installed@2"]


def test_r30_a_content_change_is_parsed_and_updated(world: World) -> None:
    folder = world.local_dir("dev", 1)
    world.apply(local("dev", folder))
    world.local_dir("dev", 2)
    assert known(world, "dev", folder) is None
    resolved = world.resolved_local("dev", folder)
    decision, _ = decide(world.state("dev"), resolved.target)
    assert decision is Decision.LOCAL_UPDATE
    world.apply(local("dev", folder))
    found = known(world, "dev", folder)  # the update recorded the new digest
    assert found is not None and found.payload_hash == resolved.payload_hash


def test_r30_the_same_bytes_in_another_folder_are_parsed(world: World) -> None:
    folder = world.local_dir("dev", 1)
    world.apply(local("dev", folder))
    moved = world.tmp / "elsewhere" / "dev"
    moved.mkdir(parents=True)
    (moved / "pack.json").write_bytes((folder / "pack.json").read_bytes())
    assert known(world, "dev", moved) is None
    assert known(world, "dev", folder) is not None


def test_r30_a_removed_record_is_never_known(world: World) -> None:
    folder = world.local_dir("dev", 1)
    world.apply(local("dev", folder))
    remove(world, "dev")
    state = world.state("dev")
    assert state.local is not None and state.local.file_digest == sha256(folder / "pack.json")
    assert known(world, "dev", folder) is None


def test_r30_a_missing_folder_or_file_is_the_same_typed_error(world: World) -> None:
    folder = world.local_dir("dev", 1)
    world.apply(local("dev", folder))
    (folder / "pack.json").unlink()
    for path in (folder, world.tmp / "nowhere"):
        entry, source = manifest_pack("dev", path)
        with pytest.raises(InvalidInput) as cheap:
            known_local(2, entry, source, world.tmp, world.state("dev"))
        with pytest.raises(InvalidInput) as parsed:
            read_local(2, entry, source, world.tmp)
        assert cheap.value.details["field"] == parsed.value.details["field"]
        assert cheap.value.details["field"] == "packs[2].source.path"
        assert cheap.value.message == parsed.value.message


# -- rows written before schema v2 ------------------------------------------------------------


@pytest.mark.parametrize(
    "topic",
    [
        "local_pack.installed@1",
        "domain.lifecycle:LocalPack.Installed",
        "local_pack.updated@1",
        "domain.lifecycle:LocalPack.Updated",
        "local_pack.reinstalled@1",
    ],
)
def test_r30_v1_and_v0_local_pack_rows_read_with_a_null_file_digest(topic: str) -> None:
    state = {
        "pack": "dev",
        "category": "app",
        "locator": "/x",
        "path": "pack.json",
        "payload_hash": "v1:00",
        "timestamp": "2026-12-01T00:00:00+00:00",
    }
    stored = EVENT_TYPES.resolve(topic)
    assert stored.version == 1 and stored.type.version == 2
    name, read = EVENT_TYPES.decode(topic, orjson.dumps(state))
    assert name == stored.type.name and read["file_digest"] is None
    _, current = EVENT_TYPES.decode(f"{name}@2", orjson.dumps({**state, "file_digest": "ab" * 32}))
    assert current["file_digest"] == "ab" * 32


def test_r30_an_old_record_without_a_digest_is_parsed(world: World) -> None:
    """A store written before schema v2: its ``local_pack.installed@1`` row, as stored
    then (never rewritten), reads with no digest, so the file is parsed as before."""
    folder = world.local_dir("dev", 1)
    resolved = world.resolved_local("dev", folder)
    state = {
        "pack": "dev",
        "install_id": install_id_for("dev", "local_path", resolved.payload_hash, 1),
        "category": resolved.category,
        "locator": resolved.source.locator,
        "path": resolved.source.path,
        "payload_hash": resolved.payload_hash,
        "timestamp": "2026-12-01T00:00:00+00:00",
    }
    old = StoredEvent(
        originator_id=local_id("dev"),
        originator_version=1,
        topic="local_pack.installed@1",
        state=orjson.dumps(state, option=orjson.OPT_SORT_KEYS),
    )
    world.ledger.recorder.append([old])

    record = world.state("dev").local
    assert record is not None and record.file_digest is None
    assert record.payload_hash == resolved.payload_hash
    assert known(world, "dev", folder) is None
    assert decide(world.state("dev"), resolved.target) == (Decision.UNCHANGED, None)
    assert world.apply(local("dev", folder))["packs"][0]["decision"] == "unchanged"
    assert [t for t, _ in local_rows(world, "dev")] == ["local_pack.installed@1"]
    # A content change records v2 from then on; the v1 row stays as it was stored.
    world.local_dir("dev", 2)
    assert world.apply(local("dev", folder))["packs"][0]["decision"] == "local_update"
    rows = local_rows(world, "dev")
    assert [t for t, _ in rows] == ["local_pack.installed@1", "local_pack.updated@2"]
    assert "file_digest" not in rows[0][1]
    assert known(world, "dev", folder) is not None
