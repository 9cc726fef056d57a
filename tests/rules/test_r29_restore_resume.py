"""R29 (issue 28 item 7): an export carries the latest cosigned checkpoints, and a restore
resumes under the same origin only when it holds the cosigned tree.

The collector (``cosign``) keeps the last cosigned note per origin in
``ledger_checkpoint``; ``export`` writes each as a checkpoint line before the trailer
(trailer version 2 counts them) and ``import`` checks them against the log it loaded and
writes them back. The disaster recovery path README documents is tested here: restoring
the newest export resumes (``audit resume-check`` against the witnesses' last cosigned
note passes); restoring an older one is a rollback (STALE), publishing on it forks
(INTEGRITY), and ``audit origin --new`` makes it a new log that clients re-pin.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from domain.notes import Checkpoint, SignerKey
from domain.origin import catalog_origin
from ledger.api import open_store
from tests.support import reference_verifier as ref
from tests.support.cli_inprocess import cli, cli_json
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World
from tests.support.witness_fakes import Witnesses


def _export(url: str, path: Path) -> bytes:
    result = cli("--db", url, "export", "--jsonl", "--out", str(path))
    assert result.code == 0, result.stderr
    return path.read_bytes()


def _restore(url: str, path: Path, *, source: str | None = None) -> None:
    if source is not None:
        _export(source, path)
    assert cli_json("--db", url, "init")[0] == 0
    code, doc = cli_json("--db", url, "import", "--jsonl", str(path), "--workers", "1")
    assert code == 0, doc


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A store cosigned (``catalog-ledger cosign``, three in-process witnesses, k = 2) at
    revision 1 (export ``old``), then at revision 2 (export ``new``; ``note`` the
    witnesses' last cosigned note)."""
    tmp = tmp_path_factory.mktemp("source")
    url = f"sqlite:///{tmp / 'source.db'}"
    world = World(tmp, url)
    signer = SignerKey.generate("log")
    (tmp / "log.key").write_text(signer.text(), encoding="utf-8")
    witnesses = Witnesses([1_700_000_000])
    try:
        packs = [world.official("sales", world.commit("sales", 1))]
        world.service.apply(world.manifest(packs, push_closure("app:crm", "sales")))
        with open_store(url) as store:
            assert store.origin()["named"] is False
            origin = catalog_origin(store.origin()["origin"])
            policy = witnesses.policy(tmp / "policy.json", origin, signer)

            def cosign() -> str:
                done = store.cosign(
                    sign=tmp / "log.key",
                    policy=policy,
                    add_checkpoint=witnesses.add_checkpoint,
                    clock=witnesses.clock,
                )
                return str(done["note"])

            cosign()
            assert store.origin()["named"] is True  # the collector named the log first
            _export(url, tmp / "old.jsonl")
            bindings = push_closure("app:crm", "sales") + push_closure("app:erp", "sales")
            world.service.apply(world.manifest(packs, bindings))
            (tmp / "note").write_text(cosign(), encoding="utf-8")
            _export(url, tmp / "new.jsonl")
    finally:
        world.close()
    return {"old": tmp / "old.jsonl", "new": tmp / "new.jsonl", "note": tmp / "note"}


def test_r29_an_export_carries_the_cosigned_checkpoints_and_a_restore_keeps_them(
    tmp_path: Path, engine_url: str, exports: dict[str, Path]
) -> None:
    lines = exports["new"].read_bytes().splitlines()
    main, carried, trailer = (json.loads(x) for x in lines[-3:])
    note = exports["note"].read_text(encoding="utf-8")
    assert carried["checkpoint"] == 1 and carried["note"] == note
    assert carried["origin"].endswith("/catalog") and carried["size"] == 2
    # The main log's cosigned checkpoint (the collector stores it too), in origin order.
    last = json.loads(lines[-4])["position"]
    assert (main["origin"] + "/catalog", main["size"]) == (carried["origin"], last)
    assert (trailer["trailer"], trailer["checkpoints"]) == (2, 2)
    # The reference verifier, written from LOG-FORMAT.md, reads the checkpoint lines too.
    text = [x.decode() for x in lines]
    assert ref.verify_export(text).size == last
    with pytest.raises(ref.Mismatch):
        ref.verify_export([*text[:-2], json.dumps({**carried, "size": 1}), text[-1]])
    _restore(engine_url, exports["new"])
    assert _export(engine_url, tmp_path / "again.jsonl") == exports["new"].read_bytes()
    code, ok = cli_json("--db", engine_url, "audit", "resume-check", str(exports["note"]))
    assert code == 0, ok
    assert ok["checked"] == [{"origin": carried["origin"], "cosigned_size": 2, "size": 2}]
    code, ok = cli_json("--db", engine_url, "audit", "resume-check")  # every stored note
    assert code == 0, ok
    assert [c["origin"] for c in ok["checked"]] == [main["origin"], carried["origin"]]
    world = World(tmp_path, engine_url)  # the restored store publishes on: it extends
    try:
        packs = [world.official("other", world.commit("other", 1))]
        world.service.apply(world.manifest(packs, push_closure("app:new", "other")))
    finally:
        world.close()
    code, ok = cli_json("--db", engine_url, "audit", "resume-check", str(exports["note"]))
    assert code == 0 and ok["checked"][0]["size"] == 3, ok


def test_r29_restoring_an_older_backup_is_a_rollback_and_publishing_on_it_a_fork(
    tmp_path: Path, mysql_url: str, exports: dict[str, Path]
) -> None:
    _restore(mysql_url, exports["old"])
    code, own = cli_json("--db", mysql_url, "audit", "resume-check")
    assert code == 0 and own["checked"][-1]["cosigned_size"] == 1, own  # its own: size 1
    assert own["checked"][-1]["origin"].endswith("/catalog")
    code, stale = cli_json("--db", mysql_url, "audit", "resume-check", str(exports["note"]))
    assert code == 5 and stale["error"] == "STALE", stale
    assert (stale["details"]["required"], stale["details"]["served"]) == (2, 1)
    world = World(tmp_path, mysql_url)  # "catching up" by publishing anew
    try:
        packs = [world.official("other", world.commit("other", 1))]
        world.service.apply(world.manifest(packs, push_closure("app:new", "other")))
    finally:
        world.close()
    code, fork = cli_json("--db", mysql_url, "audit", "resume-check", str(exports["note"]))
    assert code == 6 and fork["details"]["reason"] == "inconsistent_tree", fork
    # The documented way out: a new origin (log.renamed), which clients re-pin.
    old_origin = _checkpoint_origin(mysql_url)
    code, renamed = cli_json("--db", mysql_url, "audit", "origin", "--new")
    assert code == 0 and renamed["origin"] != old_origin, renamed
    assert _checkpoint_origin(mysql_url) == renamed["origin"]
    code, other = cli_json("--db", mysql_url, "audit", "resume-check", str(exports["note"]))
    assert code == 6 and other["details"]["reason"] == "wrong_origin", other
    code, again = cli_json("--db", mysql_url, "audit", "origin", "--new")
    assert code == 4, again  # it has that origin already
    code, audit = cli_json("--db", mysql_url, "audit", "verify")  # the old notes are gone
    assert code == 0, audit
    # It moves with its new origin; the old origin's cosigned notes stay behind.
    moved = f"sqlite:///{tmp_path / 'moved.db'}"
    _restore(moved, tmp_path / "renamed.jsonl", source=mysql_url)
    assert _checkpoint_origin(moved) == renamed["origin"]
    code, audit = cli_json("--db", moved, "audit", "verify")
    assert code == 0, audit


def _checkpoint_origin(url: str) -> str:
    code, doc = cli_json("--db", url, "audit", "checkpoint")
    assert code == 0, doc
    return str(doc["origin"])


def _refused(url: str, path: Path, lines: list[bytes]) -> dict[str, object]:
    path.write_bytes(b"\n".join(lines) + b"\n")
    code, doc = cli_json("--db", url, "import", "--jsonl", str(path), "--workers", "1")
    assert code in (3, 6), doc
    code, log = cli_json("--db", url, "log", "--from", "1", "--limit", "1")
    assert log["head"]["position"] == 0  # nothing was imported
    return dict(doc["details"])


def test_r29_an_import_refuses_checkpoint_lines_that_are_not_of_the_log_it_loads(
    tmp_path: Path, sqlite_url: str, exports: dict[str, Path]
) -> None:
    assert cli_json("--db", sqlite_url, "init")[0] == 0
    lines = exports["new"].read_bytes().splitlines()
    carried = json.loads(lines[-2])
    other = SignerKey.generate("log")

    def with_line(doc: dict[str, object]) -> list[bytes]:
        return [*lines[:-2], json.dumps(doc).encode(), lines[-1]]

    old_root = json.loads(exports["old"].read_bytes().splitlines()[-2])["root"]
    stale_body = Checkpoint(carried["origin"], 2, base64.b64decode(old_root)).text()
    wrong_root = {**carried, "root": old_root, "note": other.sign(stale_body)}
    assert _refused(sqlite_url, tmp_path / "a", with_line(wrong_root))["field"] == "checkpoint.root"
    foreign_cp = Checkpoint("example.com/log", 2, base64.b64decode(carried["root"]))
    foreign = {**carried, "origin": foreign_cp.origin, "note": other.sign(foreign_cp.text())}
    assert _refused(sqlite_url, tmp_path / "b", with_line(foreign))["field"] == "checkpoint.origin"
    said = {**carried, "size": 1}
    assert _refused(sqlite_url, tmp_path / "c", with_line(said))["field"] == "checkpoint.note"
    dropped = [*lines[:-2], lines[-1]]
    assert _refused(sqlite_url, tmp_path / "d", dropped)["field"] == "trailer.checkpoints"
    late = [*lines[:-4], lines[-3], lines[-4], *lines[-2:]]  # a checkpoint line, then an event
    assert _refused(sqlite_url, tmp_path / "e", late)["check"] == "checkpoint"
    extra = {**carried, "signed_by": "me"}
    assert _refused(sqlite_url, tmp_path / "f", with_line(extra))["field"] == "checkpoint.signed_by"
