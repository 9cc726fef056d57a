"""``diff --from-revision A --to-revision B`` (issue 29.2) on SQLite and MariaDB, through the
CLI in-process and the Python API: computed from the log alone (R28), equal to the set
difference of ``view --at-revision`` on both sides (R17), across a pack's removal and its
reinstallation as a fresh incarnation (R7), with typed errors naming the flag (R19)."""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
import sqlalchemy as sa

from domain.errors import InvalidInput, Missing
from ledger.api import Store
from tests.support.cli_inprocess import cli, cli_json
from tests.support.gitrepo import push_closure, push_pack
from tests.support.lifecycle_support import World

AUDIENCES = ("app:b", "app:c", "integration:a")


def _release(
    world: World,
    packs: list[dict[str, Any]],
    bindings: list[dict[str, Any]],
    *,
    remove: tuple[str, ...] = (),
) -> int:
    document: dict[str, Any] = {"packs": packs, "bindings": bindings}
    if remove:
        document["remove"] = list(remove)
    world._manifests += 1
    path = world.tmp / f"diff-{world._manifests}.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    out = world.service.apply(path)
    assert out["catalog"]["published"], out
    return out["catalog"]["revision"]


def history(world: World) -> list[int]:
    """Four revisions: (1) sales v1 to integration:a, billing to app:b; (2) sales v2 (a
    payload change), integration:a's profile on another credential set, app:c added;
    (3) billing removed with app:b; (4) billing installed again (a fresh incarnation,
    the same content) and app:b bound again."""
    s1 = world.release({"sales/pack.json": push_pack("sales", 1)})
    s2 = world.release({"sales/pack.json": push_pack("sales", 2)})
    b1 = world.release(
        {"billing/pack.json": push_pack("billing", 7, profile_payload={"url": "https://b"})}
    )
    sales1, sales2 = world.official("sales", s1), world.official("sales", s2)
    billing = world.official("billing", b1)
    a_prod = push_closure("integration:a", "sales", "erp-prod")
    a_test = push_closure("integration:a", "sales", "erp-test")
    b = push_closure("app:b", "billing", "erp-prod")
    c = push_closure("app:c", "sales", "erp-prod")
    return [
        _release(world, [sales1, billing], [*a_prod, *b]),
        _release(world, [sales2, billing], [*a_test, *b, *c]),
        _release(world, [sales2], [*a_test, *c], remove=("billing",)),
        _release(world, [sales2, billing], [*a_test, *b, *c]),
    ]


def past_view(url: str, audience: str, revision: int) -> dict[str, Any] | None:
    """``view AUDIENCE --at-revision N --json``; None when it is MISSING there."""
    code, out = cli_json("--db", url, "view", audience, "--at-revision", str(revision))
    if code == 5 and out["error"] == "MISSING":
        return None
    assert code == 0, out
    return cast(dict[str, Any], out)


def diff_cli(url: str, a: int, b: int, *extra: str) -> dict[str, Any]:
    code, out = cli_json(
        "--db", url, "diff", "--from-revision", str(a), "--to-revision", str(b), *extra
    )
    assert code == 0, out
    return cast(dict[str, Any], out)


def grant_set(view: dict[str, Any] | None) -> set[tuple[Any, ...]]:
    if view is None:
        return set()
    return {(g["pack"], g["kind"], g["key"], g["credential_set"]) for g in view["grants"]}


def fact_set(view: dict[str, Any] | None) -> dict[tuple[str, str, str], dict[str, Any]]:
    if view is None:
        return {}
    return {(f["pack"], f["kind"], f["key"]): f for f in view["facts"]}


def grants_of(entries: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    return {(g["pack"], g["kind"], g["key"], g["credential_set"]) for g in entries}


def facts_of(entries: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(f["pack"], f["kind"], f["key"]) for f in entries}


def test_r17_r28_diff_equals_the_set_difference_of_view_at_revision_on_both_sides(
    world: World,
) -> None:
    revisions = history(world)
    assert revisions == [1, 2, 3, 4]
    views = {(a, r): past_view(world.url, a, r) for a in AUDIENCES for r in revisions}
    with Store(world.url) as store:
        for a in revisions:
            for b in revisions:
                api: object = store.diff(a, b)
                found = diff_cli(world.url, a, b)
                assert api == found  # the API returns what the CLI prints
                assert (found["from"]["revision"], found["to"]["revision"]) == (a, b)
                by_audience = {d["audience"]: d for d in found["audiences"]}
                for audience in AUDIENCES:
                    va, vb = views[(audience, a)], views[(audience, b)]
                    for side, view in (("from", va), ("to", vb)):
                        if view is not None:
                            assert found[side]["content_digest"] == view["content_digest"]
                    digests = (
                        None if va is None else va["audience_digest"],
                        None if vb is None else vb["audience_digest"],
                    )
                    if digests[0] == digests[1]:
                        assert audience not in by_audience, (a, b, audience)
                        continue
                    d = by_audience[audience]
                    assert (d["from_digest"], d["to_digest"]) == digests
                    ga, gb = grant_set(va), grant_set(vb)
                    assert grants_of(d["grants_added"]) == gb - ga
                    assert grants_of(d["grants_removed"]) == ga - gb
                    fa, fb = fact_set(va), fact_set(vb)
                    assert facts_of(d["facts_added"]) == fb.keys() - fa.keys()
                    assert facts_of(d["facts_removed"]) == fa.keys() - fb.keys()
                    for fact in d["facts_added"]:
                        key = (fact["pack"], fact["kind"], fact["key"])
                        assert fact["fact_digest"] == fb[key]["fact_digest"]
                    # A changed fact is one served on both sides whose digest differs
                    # (its document, not only its generation: those are rebound grants).
                    for change in d["facts_changed"]:
                        key = (change["pack"], change["kind"], change["key"])
                        assert change["from"]["fact_digest"] == fa[key]["fact_digest"]
                        assert change["to"]["fact_digest"] == fb[key]["fact_digest"]
                        assert change["changes"]
                    for key in fa.keys() & fb.keys():
                        if fa[key]["fact_digest"] == fb[key]["fact_digest"]:
                            assert key not in facts_of(d["facts_changed"])
                # Every pack that moved shows the install ids the views were served from.
                for move in found["activations"]:
                    for side, revision in (("from", a), ("to", b)):
                        served = {
                            g["install_id"]
                            for audience in AUDIENCES
                            if (v := views[(audience, revision)]) is not None
                            for g in v["grants"]
                            if g["pack"] == move["pack"]
                        }
                        expected = set() if move[side] is None else {move[side]["install_id"]}
                        assert served == expected, (a, b, move)
                summary = found["summary"]
                assert summary["audiences_changed"] == len(found["audiences"])
                assert summary["activations_moved"] == len(found["activations"])
                if a == b:
                    assert found["audiences"] == [] and found["activations"] == []


def test_r17_a_payload_change_is_shown_as_a_json_diff_and_the_reverse_diff_mirrors_it(
    world: World,
) -> None:
    history(world)
    forward = diff_cli(world.url, 1, 2)
    assert forward["summary"] == {
        "audiences_changed": 2,
        "facts_added": 2,
        "facts_changed": 1,
        "facts_removed": 0,
        "grants_added": 3,
        "grants_removed": 1,
        "grants_rebound": 1,
        "activations_moved": 1,
    }
    a = next(d for d in forward["audiences"] if d["audience"] == "integration:a")
    (change,) = a["facts_changed"]
    assert (change["pack"], change["kind"], change["key"]) == (
        "sales",
        "push_contract",
        "Order.push",
    )
    assert change["changes"] == [{"path": "/payload/v", "op": "replace", "from": 1, "to": 2}]
    assert grants_of(a["grants_added"]) == {("sales", "callout_profile", "erp", "erp-test")}
    assert grants_of(a["grants_removed"]) == {("sales", "callout_profile", "erp", "erp-prod")}
    # The profile's document is the same in both generations: not a changed fact.
    assert [(g["kind"], g["key"]) for g in a["grants_rebound"]] == [("push_contract", "Order.push")]
    c = next(d for d in forward["audiences"] if d["audience"] == "app:c")
    assert c["change"] == "added" and c["from_digest"] is None
    assert {f["kind"]: f["payload"] for f in c["facts_added"]} == {
        "push_contract": {"v": 2},
        "callout_profile": {"url": "https://erp.example"},
    }
    (moved,) = forward["activations"]
    assert moved["pack"] == "sales" and moved["change"] == "moved"
    assert (moved["from"]["epoch"], moved["to"]["epoch"]) == (1, 2)

    backward = diff_cli(world.url, 2, 1)
    assert (backward["from"], backward["to"]) == (forward["to"], forward["from"])
    by_name = {d["audience"]: d for d in backward["audiences"]}
    for d in forward["audiences"]:
        r = by_name[d["audience"]]
        assert (r["from_digest"], r["to_digest"]) == (d["to_digest"], d["from_digest"])
        assert r["facts_added"] == d["facts_removed"] and r["facts_removed"] == d["facts_added"]
        assert r["grants_added"] == d["grants_removed"] and r["grants_removed"] == d["grants_added"]
        for fwd, rev in zip(d["facts_changed"], r["facts_changed"], strict=True):
            assert (rev["from"], rev["to"]) == (fwd["to"], fwd["from"])
            assert rev["changes"] == [
                {"path": s["path"], "op": "replace", "from": s["to"], "to": s["from"]}
                for s in fwd["changes"]
            ]
    assert [(m["from"], m["to"]) for m in backward["activations"]] == [
        (m["to"], m["from"]) for m in forward["activations"]
    ]
    assert by_name["app:c"]["change"] == "removed"


def test_r7_diff_across_a_removal_and_a_reinstall_shows_the_fresh_incarnation(
    world: World,
) -> None:
    history(world)
    removal = diff_cli(world.url, 2, 3)
    (gone,) = removal["audiences"]
    assert gone["audience"] == "app:b" and gone["change"] == "removed"
    assert facts_of(gone["facts_removed"]) == {
        ("billing", "push_contract", "Order.push"),
        ("billing", "callout_profile", "erp"),
    }
    (released,) = removal["activations"]
    assert released["pack"] == "billing" and released["change"] == "removed"
    assert released["to"] is None

    # Over the removal and back: the same content from a fresh incarnation; the facts
    # are unchanged, the grants rebound to it, its activation moved (new id, later epoch).
    across = diff_cli(world.url, 2, 4)
    (back,) = across["audiences"]
    assert back["audience"] == "app:b" and back["change"] == "changed"
    assert back["facts_added"] == back["facts_removed"] == back["facts_changed"] == []
    assert back["grants_added"] == back["grants_removed"] == []
    assert len(back["grants_rebound"]) == 2
    (moved,) = across["activations"]
    assert moved["pack"] == "billing" and moved["change"] == "moved"
    assert moved["from"]["install_id"] != moved["to"]["install_id"]
    assert moved["from"]["payload_hash"] == moved["to"]["payload_hash"]
    assert moved["to"]["epoch"] > moved["from"]["epoch"] + 1  # removal, then reinstall
    assert {g["to_install_id"] for g in back["grants_rebound"]} == {moved["to"]["install_id"]}

    only = diff_cli(world.url, 3, 4, "--audience", "app:b")
    assert only["audience"] == "app:b"
    assert [d["audience"] for d in only["audiences"]] == ["app:b"]
    assert [(m["pack"], m["change"]) for m in only["activations"]] == [("billing", "added")]
    with Store(world.url) as store:
        assert store.diff(3, 4, audience="app:b") == only
        # An audience whose content did not change: nothing listed, not even its packs.
        quiet = store.diff("3", "4", audience="integration:a")
        assert quiet["audiences"] == [] and quiet["activations"] == []


def tamper(world: World) -> None:
    """Edit the views every reader is served from: a fact's bytes, a grant's credential
    set, an audience's recorded digest."""
    with world.db.write() as conn:
        conn.execute(
            sa.text("UPDATE view_pack_component SET fact = :f WHERE kind = :k"),
            {
                "f": b'{"credential_sets":null,"key":"Order.push","kind":"push_contract",'
                b'"payload":{"v":"TAMPERED"},"requires":[]}',
                "k": b"push_contract",
            },
        )
        conn.execute(
            sa.text("UPDATE view_catalog_grant SET credential_set = :n WHERE audience_id = :a"),
            {"n": b"TAMPERED", "a": b"c"},
        )
        conn.execute(
            sa.text("UPDATE view_catalog_audience SET digest = :d WHERE audience_id = :a"),
            {"d": b"0" * 64, "a": b"b"},
        )


def test_r28_diff_is_computed_from_the_log_and_never_shows_a_tampered_view_row(
    world: World,
) -> None:
    history(world)
    before = {(a, b): diff_cli(world.url, a, b) for a, b in ((1, 2), (2, 4), (1, 4))}
    human_before = cli("--db", world.url, "diff", "--from-revision", "1", "--to-revision", "2")
    tamper(world)
    # The tampering is real: the live reader fails closed on each edited audience.
    for audience in ("integration:a", "app:c", "app:b"):
        assert cli("--db", world.url, "view", audience, "--json").code == 6, audience
    for (a, b), expected in before.items():
        found = diff_cli(world.url, a, b)
        assert found == expected
        assert "TAMPERED" not in json.dumps(found)
    with Store(world.url) as store:
        assert store.diff(1, 2) == before[(1, 2)]
    human = cli("--db", world.url, "diff", "--from-revision", "1", "--to-revision", "2")
    assert human.code == 0 and human.stdout == human_before.stdout
    assert "TAMPERED" not in human.stdout


def test_r19_diff_errors_are_typed_and_name_the_flag_without_a_traceback(world: World) -> None:
    history(world)
    url = world.url
    code, out = cli_json("--db", url, "diff", "--from-revision", "9", "--to-revision", "1")
    assert (code, out["error"]) == (5, "MISSING")
    assert out["message"].startswith("--from-revision 9:")
    assert out["details"] == {
        "field": "from_revision",
        "flag": "--from-revision",
        "revision": 9,
        "last_revision": 4,
    }
    code, out = cli_json("--db", url, "diff", "--from-revision", "1", "--to-revision", "0")
    assert (code, out["error"], out["details"]["flag"]) == (5, "MISSING", "--to-revision")
    for bad in ("-1", "x", "1.5", "²", ""):
        code, out = cli_json("--db", url, "diff", "--from-revision", "1", "--to-revision", bad)
        assert (code, out["error"], out["details"]["flag"]) == (3, "INVALID", "--to-revision"), bad
    code, out = cli_json(
        "--db", url, "diff", "--from-revision", "1", "--to-revision", "2", "--audience", "app:"
    )
    assert (code, out["error"], out["details"]["field"]) == (3, "INVALID", "audience.id")
    code, out = cli_json(
        "--db", url, "diff", "--from-revision", "1", "--to-revision", "2", "--audience", "app:zz"
    )
    assert (code, out["error"], out["details"]["flag"]) == (5, "MISSING", "--audience")
    missing_flag = cli("--db", url, "diff", "--from-revision", "1")
    assert missing_flag.code == 2 and "--to-revision" in missing_flag.stderr
    human = cli("--db", url, "diff", "--from-revision", "7", "--to-revision", "1")
    assert human.code == 5 and human.stdout == ""
    assert human.stderr.startswith("error [MISSING]: --from-revision 7: revision 7 was never")
    with Store(url) as store:
        with pytest.raises(Missing) as missing:
            store.diff(1, 5)
        assert missing.value.details["flag"] == "--to-revision"
        with pytest.raises(InvalidInput) as invalid:
            store.diff(True, 1)
        assert invalid.value.details["flag"] == "--from-revision"


def test_r17_diff_human_output_puts_the_summary_first_and_has_help(world: World) -> None:
    history(world)
    out = cli("--db", world.url, "diff", "--from-revision", "1", "--to-revision", "2")
    assert out.code == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == (
        "2 audiences change: 2 facts added, 1 changed, 3 grants added, 1 removed, "
        "1 rebound; 1 pack activation moved"
    )
    assert lines[1].startswith("revision 1 -> 2 (content ")
    assert "      /payload/v: 1 -> 2" in lines
    assert "\x1b[" not in out.stdout  # not a terminal: no colour
    same = cli("--db", world.url, "diff", "--from-revision", "3", "--to-revision", "3")
    assert same.stdout.splitlines()[0] == "no audience changes; no pack activation moved"
    helped = cli("diff", "--help")
    assert helped.code == 0
    for flag in ("--from-revision", "--to-revision", "--audience", "--json"):
        assert flag in helped.stdout


@pytest.mark.parametrize("engine_url", ["sqlite"], indirect=True)
def test_r17_diff_is_coloured_on_a_terminal_unless_no_color(world: World) -> None:
    """The console script on a real pseudo-terminal: coloured; with NO_COLOR: not."""
    history(world)
    script = Path(sys.executable).with_name("catalog-ledger")
    outputs = []
    for extra in ({}, {"NO_COLOR": "1"}):
        leader, follower = pty.openpty()
        env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | extra
        args = [
            str(script),
            "--db",
            world.url,
            "diff",
            "--from-revision",
            "1",
            "--to-revision",
            "2",
        ]
        done = subprocess.run(args, stdout=follower, stderr=subprocess.PIPE, env=env, check=False)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other side closed: all read
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        assert done.returncode == 0, done.stderr
        outputs.append(b"".join(chunks).decode())
    coloured, plain = outputs
    assert "\x1b[" in coloured and "\x1b[" not in plain
    assert plain.replace("\r\n", "\n").splitlines()[0].startswith("2 audiences change:")


ROOT = Path(__file__).resolve().parents[2]


def readme_diff_example() -> tuple[list[str], str]:
    """The command and the output README's "Revision diff" example shows."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.split(r"\n#+ Revision diff\n", text, maxsplit=1)[1]
    block = re.search(r"```text\n\$ catalog-ledger (.*?)\n(.*?)```", section, re.S)
    assert block is not None, "README's Revision diff section has no example"
    return block.group(1).split(), block.group(2)


def test_r17_readme_diff_example_is_what_the_demo_store_prints(tmp_path: Path) -> None:
    """examples/demo.sh's store (release 1, then release 2) diffs as README shows."""
    examples = ROOT / "examples"
    subprocess.run(
        ["sh", str(examples / "make-repo.sh"), str(tmp_path / "repos" / "catalog")],
        capture_output=True,
        check=True,
    )
    for name in ("release-1.json", "release-2.json"):
        shutil.copy(examples / name, tmp_path / name)
    shutil.copytree(examples / "packs", tmp_path / "packs")
    db = f"sqlite:///{tmp_path / 'catalog.db'}"
    before = Path.cwd()
    os.chdir(tmp_path)  # the manifests name their repository and local pack relatively
    try:
        assert cli("--db", db, "init").code == 0
        for name in ("release-1.json", "release-2.json"):
            applied = cli("--db", db, "apply", name)
            assert applied.code == 0, applied.stderr
    finally:
        os.chdir(before)
    args, shown = readme_diff_example()
    assert args == ["diff", "--from-revision", "1", "--to-revision", "2"]
    printed = cli("--db", db, *args)
    assert printed.code == 0 and printed.stdout == shown


def test_r17_a_payloads_control_characters_never_reach_the_terminal_raw(world: World) -> None:
    """A payload key holding ESC and a value holding a C1 control (compact JSON leaves C1
    raw): the human diff writes both escaped; ``--json`` keeps the exact values."""
    key, value = "k\x1b[2J", "\x9b31m"
    commits = [
        world.release({"sales/pack.json": push_pack("sales", 1, push_payload={key: v})})
        for v in ("plain", value)
    ]
    for commit in commits:
        _release(world, [world.official("sales", commit)], push_closure("app:x", "sales"))
    human = cli("--db", world.url, "diff", "--from-revision", "1", "--to-revision", "2")
    assert human.code == 0, human.stderr
    assert "\x1b" not in human.stdout and "\x9b" not in human.stdout
    assert '      /payload/k\\u001b[2J: "plain" -> "\\u009b31m"' in human.stdout.splitlines()
    (change,) = diff_cli(world.url, 1, 2)["audiences"][0]["facts_changed"]
    assert change["changes"] == [
        {"path": f"/payload/{key}", "op": "replace", "from": "plain", "to": value}
    ]
