"""Defects found by trying the store as a hostile new user (issue 14): one test per defect.

Each test names the rule it protects and failed on 0.1.0.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from domain.errors import Conflict, InvalidInput, LifecycleRejected
from domain.matrix import Advance
from ledger.commands.service import CommandService
from ledger.sources.git import _cat_file_batch
from tests.support.cli_inprocess import cli, cli_json
from tests.support.cli_support import SCRIPT
from tests.support.gitrepo import component, local, pack_json, push_closure
from tests.support.lifecycle_support import World


def snapshot(world: World) -> dict[str, list[str]]:
    return world.tables()


# -- 1. control characters in source paths ----------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "pack.json\n{commit}\n{commit}:evil/pack.json",  # the repro: reframes git's batch protocol
        "pack.json\nHEAD",
        "sales/pack.json\r",
        "sales/\x00pack.json",
        "sales/\x7fpack.json",
        "sales/\u0085pack.json",  # C1 NEL
        "/etc/passwd",
        "../sales/pack.json",
        "sales/./pack.json",
        "",
    ],
)
def test_r5_source_path_with_control_characters_or_escapes_is_invalid_and_writes_nothing(
    world: World, path: str
) -> None:
    commit = world.release(
        {"sales/pack.json": world_content("sales"), "evil/pack.json": world_content("evil")}
    )
    before = snapshot(world)
    pack = world.official("sales", commit)
    pack["source"]["path"] = path.format(commit=commit)
    with pytest.raises(InvalidInput) as info:
        world.service.apply(world.manifest([pack]))
    assert info.value.details["field"] == "packs[0].source.path"
    assert "official_repo" not in info.value.message
    assert snapshot(world) == before


def test_r5_git_batch_query_never_carries_a_line_break(world: World) -> None:
    """Defense in depth: even a query that slipped past the manifest cannot reframe git."""
    commit = world.release({"sales/pack.json": world_content("sales")})
    with pytest.raises(InvalidInput):
        _cat_file_batch(
            world.repo.path, [commit, f"{commit}:sales/pack.json\nHEAD"], first_field="r"
        )
    answers = _cat_file_batch(
        world.repo.path, [commit, f"{commit}:sales/pack.json"], first_field="r"
    )
    assert [kind for kind, _ in answers] == ["commit", "blob"]


def world_content(name: str) -> bytes:
    from tests.support.lifecycle_support import content

    return content(name, 1)


# -- 4. apply --no-publish -----------------------------------------------------------------------


def test_r17_no_publish_shows_the_published_revision_with_its_own_digest(world: World) -> None:
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    bindings = push_closure("integration:a", "sales")
    first = world.service.apply(world.manifest([world.official("sales", c1)], bindings))
    published = first["catalog"]
    held = world.service.apply(
        world.manifest([world.official("sales", c2)], bindings), publish=False
    )["catalog"]
    assert held["published"] is False
    assert (held["revision"], held["content_digest"]) == (
        published["revision"],
        published["content_digest"],
    )
    assert held["candidate_content_digest"] != published["content_digest"]
    later = world.service.publish()
    assert later["content_digest"] == held["candidate_content_digest"]
    assert later["revision"] == published["revision"] + 1


# -- 5. read-only commands on a mistyped path ----------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("view", "app:x"),
        ("audit", "verify"),
        ("log",),
        ("history", "--pack", "sales"),
        ("export", "--jsonl", "--out", "{tmp}/events.jsonl"),
        ("serve", "--port", "0"),
        ("projections", "status"),
    ],
)
def test_r19_read_only_commands_never_create_a_store(tmp_path: Path, args: tuple[str, ...]) -> None:
    missing = tmp_path / "typo.db"
    code, error = cli_json("--db", f"sqlite:///{missing}", *(a.format(tmp=tmp_path) for a in args))
    assert (code, error["error"], error["details"]["field"]) == (3, "INVALID", "db")
    assert "init" in error["message"]
    assert not missing.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("url", "says"),
    [("", "--db is empty"), ("  ", "--db is empty"), ("sqlite:///{db}?mode=ro", "mode=ro")],
)
def test_r19_empty_db_and_sqlite_url_options_are_refused(
    tmp_path: Path, url: str, says: str
) -> None:
    db = tmp_path / "store.db"
    assert cli("--db", f"sqlite:///{db}", "init").code == 0
    code, error = cli_json("--db", url.format(db=db), "status")
    assert (code, error["details"]["field"]) == (3, "db") and says in error["message"]


def test_r19_init_alone_creates_the_store(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    code, info = cli_json("--db", f"sqlite:///{db}", "init")
    assert code == 0 and info["created"] is True and db.is_file()


# -- 6. a closed pipe ---------------------------------------------------------------------------


@pytest.mark.parametrize("args", [("log", "--limit", "1000"), ("export", "--jsonl")])
def test_r19_a_closed_pipe_ends_quietly(world: World, args: tuple[str, ...]) -> None:
    bindings = push_closure("integration:a", "sales")
    world.service.apply(
        world.manifest([world.official("sales", world.commit("sales", 1))], bindings)
    )
    proc = subprocess.Popen(
        [str(SCRIPT), "--db", world.url, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first byte (`| head -c 0`)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert err == ""


# -- 7. --json everywhere -----------------------------------------------------------------------


def test_r19_every_command_takes_json() -> None:
    import click

    from ledger.cli import cli as group

    def commands(g: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
        out = []
        for name, command in g.commands.items():
            if isinstance(command, click.Group):
                out += commands(command, f"{prefix}{name} ")
            else:
                out.append((prefix + name, command))
        return out

    lacking = [
        n for n, c in commands(group) if "--json" not in {o for p in c.params for o in p.opts}
    ]
    assert lacking == []


def test_r22_audit_prove_and_export_errors_are_json(tmp_path: Path, world: World) -> None:
    world.apply(world.official("sales", world.commit("sales", 1)))
    code, error = cli_json("--db", world.url, "audit", "prove", "--position", "99999")
    assert (code, error["error"]) == (3, "INVALID")
    code, error = cli_json("--db", world.url, "export", "--jsonl")
    assert (code, error["error"]) == (2, "USAGE")
    out = tmp_path / "events.jsonl"
    code, summary = cli_json("--db", world.url, "export", "--jsonl", "--out", str(out))
    assert code == 0 and summary == {"events": world.head(), "out": str(out)}


# -- 8. inputs that must be refused -------------------------------------------------------------


@pytest.mark.parametrize("pack", [" sales", "", "sales\n", "\x00"])
def test_r1_history_refuses_a_non_canonical_pack_name(world: World, pack: str) -> None:
    code, error = cli_json("--db", world.url, "history", "--pack", pack)
    assert (code, error["error"], error["details"]["field"]) == (3, "INVALID", "--pack")


def test_r18_min_revision_and_at_revision_together_is_a_usage_error(world: World) -> None:
    code, error = cli_json(
        "--db", world.url, "view", "app:x", "--min-revision", "4", "--at-revision", "2"
    )
    assert (code, error["error"]) == (2, "USAGE")


def test_r15_a_credential_set_on_a_component_that_declares_none_is_invalid(world: World) -> None:
    commit = world.commit("sales", 1)
    bindings = push_closure("integration:a", "sales")
    bindings[0]["credential_set"] = "erp-prod"  # the push contract declares no credential sets
    before = snapshot(world)
    with pytest.raises(InvalidInput) as info:
        world.service.apply(world.manifest([world.official("sales", commit)], bindings))
    assert info.value.details["field"] == "bindings[0].credential_set"
    assert "push_contract/Order.push" in info.value.message
    assert snapshot(world) == before


# Once, on SQLite: the proof file is refused before any store is read.
@pytest.mark.parametrize("engine_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tree_size", "1"),
        ("leaf_index", 0.5),
        ("leaf_index", True),
        ("position", None),
        ("proof", "not a list"),
        ("event_id", 7),
        ("leaf_hash", ["x"]),
    ],
)
def test_r22_a_proof_file_with_a_wrong_typed_field_is_invalid_naming_it(
    world: World, tmp_path: Path, field: str, value: Any
) -> None:
    world.apply(world.official("sales", world.commit("sales", 1)))
    proof = cli_json("--db", world.url, "audit", "prove", "--position", "1")[1]
    note = cli("--db", world.url, "audit", "checkpoint").stdout
    (tmp_path / "cp").write_text(note)
    assert (
        cli_json(
            "audit", "verify-proof", write(tmp_path, proof), "--checkpoint", str(tmp_path / "cp")
        )[0]
        == 0
    )
    bad = {**proof, field: value}
    code, error = cli_json(
        "audit", "verify-proof", write(tmp_path, bad), "--checkpoint", str(tmp_path / "cp")
    )
    assert (code, error["error"], error["details"]["field"]) == (3, "INVALID", field)


def write(folder: Path, document: Any) -> str:
    path = folder / f"doc-{len(list(folder.iterdir()))}.json"
    path.write_text(json.dumps(document))
    return str(path)


def test_r7_legacy_record_without_a_payload_hash_is_recorded_and_adoption_fails_closed(
    world: World,
) -> None:
    commit = world.commit("billing", 1)
    record = {
        "pack": "billing",
        "install_id": "legacy-1",
        "status": "active",
        "category": "app",
        "source": {"kind": "official_repo"},
    }
    imported = world.service.import_legacy(world.legacy_file([record]))
    assert imported["imported"] == ["billing"]
    with pytest.raises(LifecycleRejected) as info:
        world.apply(world.official("billing", commit))
    assert info.value.reason == "PAYLOAD_HASH_UNUSABLE"


# -- 9. error messages name fields by their JSON path -------------------------------------------


def test_r4_a_float_in_a_payload_names_its_json_path(world: World) -> None:
    bad = pack_json("sales", "app", [component("push_contract", "Order.push", {"x": [1, 2.5]})])
    commit = world.release({"sales/pack.json": bad})
    with pytest.raises(InvalidInput) as info:
        world.apply(world.official("sales", commit))
    assert info.value.details["field"] == "components[0].payload.x[1]"
    assert "2.5" in info.value.message


def test_r1_error_messages_show_values_not_python_reprs(world: World) -> None:
    commit = world.commit("sales", 1)
    twice = [world.official("sales", commit), world.official("sales", commit)]
    with pytest.raises(InvalidInput) as info:
        world.service.apply(world.manifest(twice))
    assert "PackName(" not in info.value.message and "'sales'" in info.value.message


# -- 10. the signer key is never readable by others --------------------------------------------


def test_r22_keygen_creates_the_private_key_0600_and_never_overwrites(tmp_path: Path) -> None:
    key = tmp_path / "signer.key"
    old = os.umask(0)
    try:
        assert cli("audit", "keygen", "ops", "--out", str(key)).code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    first = key.read_bytes()
    code, error = cli_json("audit", "keygen", "ops", "--out", str(key))
    assert (code, error["details"]["field"]) == (3, "out") and key.read_bytes() == first


# -- 11. an abandoned attempt of one pack ------------------------------------------------------


def test_r12_an_abandoned_attempt_blocks_publication_but_not_an_unrelated_release(
    world: World,
) -> None:
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    bindings = push_closure("integration:a", "sales")
    world.service.apply(world.manifest([world.official("sales", c1)], bindings))
    now = [1_000.0]
    dead = CommandService(world.ledger, holder="dead", lease_ttl=5, clock=lambda: now[0])
    handle = dead.acquire_lease()
    target = world.resolved("sales", c2)
    dead.prepare(handle, [(target, Advance(target.target, c1))])  # then the writer died
    now[0] += 60  # its lease ran out
    live = CommandService(world.ledger, holder="live", lease_ttl=5, clock=lambda: now[0])
    folder = world.local_dir("devsample", 1)
    for publish in (False, True):
        result = live.apply(world.manifest([local("devsample", folder)]), publish=publish)
        blocked = result["catalog"]["blocked"]
        assert blocked["packs"] == ["sales"] and "advances it" in blocked["message"]
        assert result["catalog"]["published"] is False
        folder = world.local_dir("devsample", 2)
    # A release that binds the dirty pack anew is still refused before any write.
    head = world.head()
    with pytest.raises(LifecycleRejected) as info:
        live.apply(world.manifest([], [*bindings, *push_closure("integration:b", "sales")]))
    assert info.value.reason == "CLOSURE_INVALID" and world.head() == head
    # Advancing the dirty pack clears it and publishes.
    done = live.apply(world.manifest([world.official("sales", c2)], bindings))
    assert done["catalog"]["published"] is True and "blocked" not in done["catalog"]


# -- 2. a stored value whose storage type was changed by hand -----------------------------------


@pytest.mark.parametrize("engine_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    "args",
    [
        ("audit", "verify"),
        ("log", "--limit", "1000"),
        ("history", "--pack", "sales"),
        ("export", "--jsonl", "--out", "{tmp}/events.jsonl"),
        ("projections", "rebuild"),
    ],
)
def test_r22_a_log_value_stored_as_text_is_integrity_naming_the_position(
    world: World, tmp_path: Path, args: tuple[str, ...]
) -> None:
    world.apply(world.official("sales", world.commit("sales", 1)))
    path = world.url.removeprefix("sqlite:///")
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("UPDATE ledger_events SET state = CAST(state AS TEXT) WHERE position = 3")
    assert conn.execute(
        "SELECT typeof(state) FROM ledger_events WHERE position = 3"
    ).fetchone() == ("text",)
    conn.commit()
    conn.close()
    code, error = cli_json("--db", world.url, *(a.format(tmp=tmp_path) for a in args))
    assert (code, error["error"]) == (6, "INTEGRITY"), error
    assert error["details"].get("position") == 3 or "position 3" in error["message"], error
    if args[0] == "export":  # 24.3: every row is written as stored, for forensics
        lines = (tmp_path / "events.jsonl").read_text(encoding="utf-8").splitlines()
        assert json.loads(lines[2])["damage"] == {
            "state": "is stored as TEXT, not bytes (state_b64 holds its bytes)"
        }
        assert len(lines) == world.head() + 1  # and the trailer
    else:
        assert not (tmp_path / "events.jsonl").exists()


@pytest.mark.parametrize("engine_url", ["sqlite"], indirect=True)
def test_r20_a_view_value_stored_as_text_is_integrity_not_a_crash(world: World) -> None:
    world.apply(world.official("sales", world.commit("sales", 1)))
    import sqlite3

    conn = sqlite3.connect(world.url.removeprefix("sqlite:///"))
    conn.execute("UPDATE view_installed_pack SET pack = CAST(pack AS TEXT)")
    conn.commit()
    conn.close()
    code, error = cli_json("--db", world.url, "status")
    assert (code, error["error"]) == (6, "INTEGRITY") and "rebuild" in error["message"]


# -- 3. identical applies racing on a fresh store ----------------------------------------------


def test_r10_identical_applies_racing_on_a_fresh_store_all_succeed_one_applies(
    world: World,
) -> None:
    commit = world.commit("sales", 1)
    manifest = world.manifest(
        [world.official("sales", commit)], push_closure("integration:a", "sales")
    )
    copies = [
        subprocess.Popen(
            [str(SCRIPT), "--db", world.url, "apply", str(manifest), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = []
    for proc in copies:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (out, err)
        results.append(json.loads(out))
    applied = [r for r in results if not r["replayed"] and not r["noop"]]
    assert len(applied) == 1, results
    assert all(r["replayed"] or r["noop"] for r in results if r is not applied[0])
    types = world.topics()
    assert types.count("lease.acquired") == 1, types  # copies with nothing to do took no lease
    assert types.count("catalog.published") == 1


# -- 12. rebuilding from a tampered log --------------------------------------------------------


def test_r22_rebuild_refuses_to_swap_in_views_built_from_a_tampered_log(world: World) -> None:
    import sqlalchemy as sa

    bindings = push_closure("integration:a", "sales")
    world.service.apply(
        world.manifest([world.official("sales", world.commit("sales", 1))], bindings)
    )
    with world.db.write() as conn:
        (state,) = conn.execute(sa.text("SELECT state FROM ledger_events WHERE position = 4")).one()
        forged = bytes(state).replace(b'"timestamp":"2', b'"timestamp":"1', 1)
        assert forged != bytes(state)
        conn.execute(
            sa.text("UPDATE ledger_events SET state = :s WHERE position = 4"), {"s": forged}
        )
    before = snapshot(world)
    code, error = cli_json("--db", world.url, "projections", "rebuild")
    assert (code, error["error"], error["details"]["position"]) == (6, "INTEGRITY", 4), error
    assert snapshot(world) == before  # the live views and their versions are untouched
    code, done = cli_json("--db", world.url, "projections", "rebuild", "--no-chain-check")
    assert code == 0 and done["rebuilt"], done


# -- R27: operators see and break the writer lease ---------------------------------------------


def test_r27_an_operator_sees_and_breaks_a_dead_holders_lease_and_fencing_keeps_it_harmless(
    world: World,
) -> None:
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    world.apply(world.official("sales", c1))
    assert cli_json("--db", world.url, "lease", "status")[1]["held"] is False
    presumed_dead = CommandService(world.ledger, holder="ops-host:4711", lease_ttl=300)
    handle = presumed_dead.acquire_lease()
    code, status = cli_json("--db", world.url, "lease", "status")
    assert (status["held"], status["holder"], status["epoch"]) == (True, "ops-host:4711", 2)
    assert status["expires_at"].endswith("Z")
    code, error = cli_json("--db", world.url, "lease", "break", "--holder", "someone-else")
    assert (code, error["error"], error["details"]["holder"]) == (4, "CONFLICT", "ops-host:4711")
    code, broken = cli_json("--db", world.url, "lease", "break", "--holder", "ops-host:4711")
    assert code == 0 and (broken["held"], broken["epoch"]) == (False, 3)
    # The holder was not dead after all: its next append is fenced out, nothing written.
    target = world.resolved("sales", c2)
    head = world.head()
    with pytest.raises(Conflict):
        presumed_dead.prepare(handle, [(target, Advance(target.target, c1))])
    assert world.head() == head
    # The next writer takes the lease at once (no TTL to wait out) and the log audits.
    assert world.apply(world.official("sales", c2))["packs"][0]["decision"] == "advance"
    code, report = cli_json("--db", world.url, "audit", "verify")
    assert code == 0 and report["ok"] is True, report
