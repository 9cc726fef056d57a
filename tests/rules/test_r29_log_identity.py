"""R29 (issue 28, items 6 and 7): the origin is a fact of the log, and so are key rotations.

A log's checkpoints name it by its origin; witnesses and clients pin that origin. The
origin is stated by the log's ``log.named`` event, which ``export`` carries and ``import``
writes back byte for byte, so a log moved SQLite -> MariaDB -> SQLite signs the same tree
under the same origin. A log never named keeps ``catalog-ledger/<store id>`` until its
first signing records exactly that. ``audit keygen`` names a key after the origin;
``audit rotate-key`` records a rotation statement signed by the current key.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from domain.errors import IntegrityFailure
from domain.key_rotation import (
    PinnedKey,
    Rotation,
    StoredRotation,
    apply_rotation,
    rotation_in_log,
    rotation_statement,
)
from domain.notes import Checkpoint, SignerKey, VerifierKey
from ledger.api import open_store
from ledger.store.log_identity import record_rotation, rotations
from tests.support.cli_inprocess import cli, cli_json


def _init(url: str) -> None:
    code, out = cli_json("--db", url, "init")
    assert code == 0, out


def _keygen(url: str, out: Path) -> SignerKey:
    code, doc = cli_json("--db", url, "audit", "keygen", "--out", str(out))
    assert code == 0, doc
    return SignerKey.parse(out.read_text(encoding="utf-8"))


def _checkpoint(url: str, *flags: str) -> dict[str, object]:
    code, doc = cli_json("--db", url, "audit", "checkpoint", *flags)
    assert code == 0, doc
    return dict(doc)


def _origin(url: str) -> dict[str, object]:
    code, doc = cli_json("--db", url, "audit", "origin")
    assert code == 0, doc
    return dict(doc)


def _move(source: str, target: str, path: Path) -> dict[str, object]:
    assert cli("--db", source, "export", "--jsonl", "--out", str(path)).code == 0
    _init(target)
    code, doc = cli_json("--db", target, "import", "--jsonl", str(path), "--workers", "1")
    assert code == 0, doc
    return dict(doc)


def test_r29_a_signed_log_keeps_its_origin_and_root_from_sqlite_to_mariadb_and_back(
    tmp_path: Path, sqlite_url: str, mysql_url: str
) -> None:
    _init(sqlite_url)
    key = _keygen(sqlite_url, tmp_path / "log.key")
    signed = _checkpoint(sqlite_url, "--sign", str(tmp_path / "log.key"))
    assert key.verifier.verify(str(signed["note"])).origin == signed["origin"]
    assert key.name == signed["origin"]  # keygen named the key after the origin
    # A rotation is a log fact too: it moves with the log.
    new = SignerKey.generate(str(signed["origin"]))
    code, rotated = cli_json(
        "--db",
        sqlite_url,
        "audit",
        "rotate-key",
        "--old",
        str(tmp_path / "log.key"),
        "--new",
        new.verifier.text(),
        "--overlap",
        "3600",
    )
    assert code == 0, rotated
    source = _checkpoint(sqlite_url)
    assert source["origin"] == signed["origin"] and source["size"] == 2

    imported = _move(sqlite_url, mysql_url, tmp_path / "a.jsonl")
    assert imported["origin"] == source["origin"]
    assert _checkpoint(mysql_url) == source
    back = f"sqlite:///{tmp_path / 'back.db'}"
    _move(mysql_url, back, tmp_path / "b.jsonl")
    assert _checkpoint(back) == source
    # The source's signed note verifies as this log's: same origin line, same tree.
    restored = Checkpoint.parse(str(_checkpoint(back)["note"]))
    assert key.verifier.verify(str(signed["note"])).origin == restored.origin
    with open_store(back) as store:
        assert rotations(store.audit_ledger) == [rotated["statement"]]
    code, audit = cli_json("--db", back, "audit", "verify")
    assert code == 0 and audit["ok"] is True, audit


def test_r29_an_unnamed_log_keeps_its_store_origin_until_the_first_signing_records_it(
    tmp_path: Path, engine_url: str
) -> None:
    _init(engine_url)
    before = _origin(engine_url)
    assert before["named"] is False
    assert str(before["origin"]).startswith("catalog-ledger/") and len(str(before["origin"])) == 47
    assert _checkpoint(engine_url)["size"] == 0  # reading never writes
    _keygen(engine_url, tmp_path / "k")
    first = _checkpoint(engine_url, "--sign", str(tmp_path / "k"))
    assert (first["origin"], first["size"]) == (before["origin"], 1)  # log.named at 1
    again = _checkpoint(engine_url, "--sign", str(tmp_path / "k"))
    assert again["size"] == 1  # named once
    assert _origin(engine_url) == {"origin": before["origin"], "named": True, "appended": False}
    code, log = cli_json("--db", engine_url, "log", "--from", "1")
    assert code == 0 and [e["topic"] for e in log["events"]] == ["log.named@1"], log
    # A log's origin never changes.
    code, refused = cli_json(
        "--db", engine_url, "audit", "origin", "--name", "--origin", "example.com/other"
    )
    assert code == 4 and refused["error"] == "CONFLICT", refused
    assert refused["details"]["origin"] == before["origin"]


def test_r29_an_export_made_before_naming_is_restored_under_its_pinned_origin(
    tmp_path: Path, sqlite_url: str, mysql_url: str
) -> None:
    """Without a ``log.named`` event the target would take its own store id; the operator
    names the restored log with the origin witnesses and clients pinned."""
    _init(sqlite_url)
    pinned = str(_origin(sqlite_url)["origin"])
    _move(sqlite_url, mysql_url, tmp_path / "old.jsonl")
    assert _origin(mysql_url)["origin"] != pinned
    code, named = cli_json("--db", mysql_url, "audit", "origin", "--name", "--origin", pinned)
    assert code == 0 and named == {"origin": pinned, "named": True, "appended": True}, named
    assert _checkpoint(mysql_url)["origin"] == pinned
    code, bad = cli_json("--db", sqlite_url, "audit", "origin", "--name", "--origin", "a b")
    assert code == 3 and bad["details"]["field"] == "origin", bad


def test_r29_keygen_without_a_name_needs_a_store_and_an_explicit_name_still_wins(
    tmp_path: Path,
) -> None:
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    result = cli("--db", missing, "audit", "keygen", "--out", str(tmp_path / "k"))
    assert result.code == 3 and not (tmp_path / "k").exists(), result.stderr
    code, doc = cli_json(
        "--db", missing, "audit", "keygen", "witness-1", "--out", str(tmp_path / "w")
    )
    assert code == 0 and VerifierKey.parse(doc["verifier_key"]).name == "witness-1"


def test_r29_a_key_rotation_is_recorded_signed_by_the_current_key_and_applied_by_clients(
    tmp_path: Path, sqlite_url: str
) -> None:
    _init(sqlite_url)
    old = _keygen(sqlite_url, tmp_path / "old.key")
    _keygen(sqlite_url, tmp_path / "new.key")
    new = VerifierKey.parse((tmp_path / "new.key.pub").read_text(encoding="utf-8"))
    rotate = ("--db", sqlite_url, "audit", "rotate-key", "--overlap", "600")
    code, doc = cli_json(
        *rotate, "--old", str(tmp_path / "old.key"), "--new", str(tmp_path / "new.key.pub")
    )
    assert code == 0, doc
    rotation = Rotation.parse(doc["statement"])
    assert (rotation.origin, rotation.old, rotation.new) == (doc["origin"], old.verifier, new)
    assert doc["position"] == 2  # after log.named
    keys = apply_rotation([old.verifier], doc["statement"], origin=doc["origin"], now=doc["until"])
    assert keys == (PinnedKey(old.verifier, doc["until"]), PinnedKey(new))
    with pytest.raises(IntegrityFailure) as late:
        apply_rotation([old.verifier], doc["statement"], origin=doc["origin"], now=doc["until"] + 1)
    assert late.value.details["reason"] == "expired"
    # Only the log's current key announces the next one.
    code, refused = cli_json(
        *rotate, "--old", str(tmp_path / "old.key"), "--new", old.verifier.text()
    )
    assert code == 4 and refused["details"]["field"] == "old", refused
    code, same = cli_json(*rotate, "--old", str(tmp_path / "new.key"), "--new", new.text())
    assert code == 3 and same["details"]["field"] == "new", same
    # The rotation is a log fact: a signed checkpoint that covers it, once cosigned,
    # vouches that every client sees it (rotation_in_log: the client's inclusion check).
    signed = _checkpoint(sqlite_url, "--sign", str(tmp_path / "old.key"))
    cp = old.verifier.verify(str(signed["note"]))
    proved = cli("--db", sqlite_url, "audit", "prove", "--position", str(doc["position"]))
    inclusion = json.loads(proved.stdout)
    proof = [base64.b64decode(p) for p in inclusion["proof"]]
    exported = tmp_path / "log.jsonl"
    assert cli("--db", sqlite_url, "export", "--jsonl", "--out", str(exported)).code == 0
    lines = [json.loads(x) for x in exported.read_text(encoding="utf-8").splitlines()[:-1]]

    def stored(line: dict[str, Any]) -> StoredRotation:
        return StoredRotation(
            UUID(line["aggregate_id"]).bytes,
            line["version"],
            line["topic"].encode(),
            base64.b64decode(line["state_b64"]),
        )

    event = stored(lines[doc["position"] - 1])
    assert rotation_in_log(event, doc["position"] - 1, proof, cp) == doc["statement"]
    with pytest.raises(IntegrityFailure) as elsewhere:
        rotation_in_log(event, 0, proof, cp)
    assert elsewhere.value.details["reason"] == "bad_inclusion"
    with pytest.raises(IntegrityFailure) as named:
        rotation_in_log(stored(lines[0]), 0, proof, cp)  # log.named, not a rotation
    assert named.value.details["reason"] == "not_a_rotation"


def test_r29_audit_verify_checks_the_chain_of_key_rotations(
    tmp_path: Path, engine_url: str
) -> None:
    _init(engine_url)
    first = _keygen(engine_url, tmp_path / "first.key")
    second, third = SignerKey.generate("second"), SignerKey.generate("third")
    code, doc = cli_json(
        "--db",
        engine_url,
        "audit",
        "rotate-key",
        "--old",
        str(tmp_path / "first.key"),
        "--new",
        second.verifier.text(),
        "--overlap",
        "60",
    )
    assert code == 0, doc
    code, audit = cli_json("--db", engine_url, "audit", "verify")
    assert code == 0 and "keys" in audit["checks"], audit
    # A statement by a key that is not the log's current one, written past the command's
    # own check (as a tampering writer would), is named by the audit at its position.
    forged = rotation_statement(str(doc["origin"]), third, first.verifier, 2_000_000_000)
    with open_store(engine_url) as store:
        position = record_rotation(store.ledger, forged)
    code, failed = cli_json("--db", engine_url, "audit", "verify")
    assert code == 6, failed
    first_problem = failed["details"]["problems"][0]
    assert (first_problem["position"], first_problem["check"]) == (position, "keys")
    assert "not the log's current key" in first_problem["message"]
