"""``rollback --to-revision N`` end to end on SQLite and MariaDB, through the CLI (in
process) and the Python API (R7, R17, R28; issue 29 item 3).

Every rollback that publishes is checked three ways: the payload-equivalence digests
it reports are equal; every audience is served, by ``view`` (the reader, not the log
replay rollback used), the same facts and grants as it was at N, compared by pack,
kind, key, credential set and fact; and a digest recomputed here from those views by
the formula schema/LOG-FORMAT.md documents equals the one rollback printed.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from blake3 import blake3

from domain.errors import LedgerError
from ledger.api import open_store
from ledger.cli.app import dump_json, run
from tests.support.cli_inprocess import cli, cli_json
from tests.support.gitrepo import Repo, local, push_closure
from tests.support.lifecycle_support import World, content

DRIVERS = ["cli", "api"]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ERP, CRM = "integration:erp-sync", "app:crm"


# -- helpers ----------------------------------------------------------------------------------


def rollback(world: World, driver: str, n: int | str, *, plan: bool = False) -> tuple[int, Any]:
    """``rollback --to-revision n [--plan] --json`` by ``driver``: exit code and document
    (an API error as the CLI prints it)."""
    if driver == "cli":
        return cli_json(
            "--db", world.url, "rollback", "--to-revision", str(n), *(["--plan"] if plan else [])
        )
    with open_store(world.url) as store:
        try:
            return 0, json.loads(dump_json(store.rollback(n, plan=plan)))
        except LedgerError as exc:
            return exc.exit_code, json.loads(dump_json(exc.to_json()))


def release(
    world: World,
    packs: list[dict[str, Any]],
    bindings: list[dict[str, Any]],
    remove: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Apply a manifest (with ``remove`` when given) and return apply's result."""
    document: dict[str, Any] = {"packs": packs, "bindings": bindings}
    if remove:
        document["remove"] = list(remove)
    path = world.manifest(packs, bindings)
    path.write_text(json.dumps(document), encoding="utf-8")
    result = world.service.apply(path)
    assert result["catalog"]["published"], result
    return dict(result)


def views(world: World, audiences: list[str]) -> dict[str, Any]:
    """What each audience is served now, by the reader (``view --json``); None: MISSING."""
    out = {}
    for audience in audiences:
        code, doc = cli_json("--db", world.url, "view", audience)
        assert code in (0, 5), doc
        out[audience] = doc if code == 0 else None
    return out


def _fact(fact: dict[str, Any]) -> dict[str, Any]:
    return {k: fact[k] for k in ("kind", "key", "payload", "requires", "credential_sets")}


def served(seen: dict[str, Any]) -> dict[str, list[tuple[Any, ...]]]:
    """Every audience's grants with their facts, without install ids or epochs."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for audience, view in seen.items():
        if view is None:
            out[audience] = []
            continue
        facts = {(f["pack"], f["install_id"], f["kind"], f["key"]): f for f in view["facts"]}
        out[audience] = sorted(
            (
                g["pack"],
                g["kind"],
                g["key"],
                g["credential_set"] or "",
                json.dumps(_fact(facts[(g["pack"], g["install_id"], g["kind"], g["key"])])),
            )
            for g in view["grants"]
        )
    return out


def documented_digest(seen: dict[str, Any]) -> str:
    """The payload-equivalence digest as schema/LOG-FORMAT.md defines it, recomputed from
    what the reader serves (canonical JSON by the standard library)."""
    entries = []
    for audience, view in seen.items():
        if view is None:
            continue
        kind, ident = audience.split(":", 1)
        facts = {(f["pack"], f["install_id"], f["kind"], f["key"]): f for f in view["facts"]}
        for g in view["grants"]:
            fact = facts[(g["pack"], g["install_id"], g["kind"], g["key"])]
            entries.append(
                [kind, ident, g["pack"], g["kind"], g["key"], g["credential_set"], _fact(fact)]
            )
    entries.sort(key=lambda e: (*e[:5], e[5] or ""))
    body = json.dumps(entries, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    h = blake3(derive_key_context="catalog-ledger 2026-12 payload equivalence v1")
    h.update(body.encode("utf-8"))
    return str(h.hexdigest())


def check_restored(world: World, doc: dict[str, Any], then: dict[str, Any]) -> dict[str, Any]:
    """The rollback published a new revision serving what N served (R17): equal digests,
    equal served content, the documented digest; and a content digest that is not N's
    when a pack came back as a fresh generation (R7) — N's own when none had to."""
    assert doc["plan"] is False and "published" in doc, doc
    target, published = doc["target"], doc["published"]
    assert doc["equivalent"] is True
    assert published["payload_equivalence_digest"] == target["payload_equivalence_digest"]
    assert published["revision"] == (doc["current"]["revision"] + 1)  # history goes forward
    fresh = any(s["action"] in ("advance", "reinstall") for s in doc["packs"])
    assert (published["content_digest"] != target["content_digest"]) is fresh
    now = views(world, list(then))
    assert served(now) == served(then)
    assert documented_digest(now) == published["payload_equivalence_digest"]
    assert documented_digest(then) == target["payload_equivalence_digest"]
    return now


def installs(world: World, pack: str) -> set[str]:
    """Every install id ``pack`` ever had, from ``history --pack``."""
    code, doc = cli_json("--db", world.url, "history", "--pack", pack)
    assert code == 0
    return {e["install_id"] for e in doc["events"] if e.get("install_id")}


# -- restoring N's content --------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_r7_rollback_across_an_advance_restores_n_by_a_fresh_generation(
    world: World, driver: str
) -> None:
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    r1 = release(world, [world.official("sales", c1)], push_closure(ERP, "sales"))
    then = views(world, [ERP])
    release(world, [world.official("sales", c2)], push_closure(ERP, "sales"))
    assert served(views(world, [ERP])) != served(then)

    code, doc = rollback(world, driver, 1)
    assert code == 0, doc
    assert doc["summary"] == "1 pack advances; bindings unchanged; 1 audience changes"
    (step,) = doc["packs"]
    assert step["action"] == "advance" and step["to"]["revision"] == c1
    assert step["from"]["revision"] == c2
    check_restored(world, doc, then)
    (applied,) = doc["apply"]["packs"]
    assert applied["decision"] == "advance" and applied["revision"] == c1
    # A fresh generation: neither of the two install ids the pack had, epoch + 1 (R7).
    assert applied["install_id"] not in {r1["packs"][0]["install_id"], step["from"]["install_id"]}
    assert applied["epoch"] == 3
    # History is kept: revision 2 is still what it was, and rolling back again is a no-op.
    code, past = cli_json("--db", world.url, "view", ERP, "--at-revision", "2")
    assert code == 0 and past["revision"] == 2
    head = world.head()
    code, again = rollback(world, driver, 1)
    assert code == 0 and again["equivalent"] is True and "published" not in again
    assert again["summary"].startswith("nothing to change")
    assert world.head() == head


@pytest.mark.parametrize("driver", DRIVERS)
def test_r7_rollback_across_a_removal_reinstalls_a_fresh_incarnation(
    world: World, driver: str
) -> None:
    c1 = world.release(
        {"sales/pack.json": content("sales", 1), "billing/pack.json": content("billing", 1)}
    )
    both = [world.official("sales", c1), world.official("billing", c1)]
    release(world, both, push_closure(ERP, "sales") + push_closure(CRM, "billing"))
    then = views(world, [ERP, CRM])
    before = installs(world, "billing")
    release(world, [world.official("sales", c1)], push_closure(ERP, "sales"), remove=("billing",))
    assert views(world, [CRM])[CRM] is None

    code, doc = rollback(world, driver, 1)
    assert code == 0, doc
    steps = {s["pack"]: s["action"] for s in doc["packs"]}
    assert steps == {"billing": "reinstall", "sales": "unchanged"}
    assert doc["summary"].startswith("1 pack reinstalled")
    assert [g["audience"] for g in doc["bindings"]["restore"]] == [CRM, CRM]
    check_restored(world, doc, then)
    applied = {p["pack"]: p for p in doc["apply"]["packs"]}
    assert applied["billing"]["decision"] == "install"
    assert applied["billing"]["install_id"] not in before  # a fresh incarnation (R7)
    code, history = cli_json("--db", world.url, "history", "--pack", "billing")
    assert [e["event"] for e in history["events"]].count("activation.reinstalled") == 1


@pytest.mark.parametrize("driver", DRIVERS)
def test_r7_rollback_removes_a_pack_added_since_n(world: World, driver: str) -> None:
    c1 = world.commit("sales", 1)
    release(world, [world.official("sales", c1)], push_closure(ERP, "sales"))
    then = views(world, [ERP, CRM])
    c2 = world.commit("extra", 1)
    release(
        world,
        [world.official("sales", c1), world.official("extra", c2)],
        push_closure(ERP, "sales") + push_closure(CRM, "extra"),
    )
    assert views(world, [CRM])[CRM] is not None

    code, doc = rollback(world, driver, 1)
    assert code == 0, doc
    steps = {s["pack"]: s["action"] for s in doc["packs"]}
    assert steps == {"extra": "remove", "sales": "unchanged"}
    assert doc["manifest"]["remove"] == ["extra"]
    assert [g["pack"] for g in doc["bindings"]["revoke"]] == ["extra", "extra"]
    assert doc["changed_audiences"] == [CRM]
    check_restored(world, doc, then)
    code, status = cli_json("--db", world.url, "status")
    extra = next(p for p in status["packs"] if p["pack"] == "extra")
    assert extra["status"] == "removed"


@pytest.mark.parametrize("driver", DRIVERS)
def test_r17_rollback_restores_bindings_changed_since_n(world: World, driver: str) -> None:
    c1 = world.commit("sales", 1)
    packs = [world.official("sales", c1)]
    release(world, packs, push_closure(ERP, "sales", "erp-prod"))
    then = views(world, [ERP, CRM])
    # Since N: ERP's credential set changed, CRM was granted the same component.
    release(world, packs, push_closure(ERP, "sales", "erp-test") + push_closure(CRM, "sales"))
    assert served(views(world, [ERP, CRM])) != served(then)

    code, doc = rollback(world, driver, 1, plan=True)
    assert code == 0 and doc["plan"] is True, doc
    assert [s["action"] for s in doc["packs"]] == ["unchanged"]
    assert doc["summary"] == "no pack moves; bindings 1 restored, 3 revoked; 2 audiences change"
    restored = doc["bindings"]["restore"]
    assert [(g["audience"], g.get("credential_set")) for g in restored] == [(ERP, "erp-prod")]
    revoked = {(g["audience"], g.get("credential_set")) for g in doc["bindings"]["revoke"]}
    assert revoked == {(ERP, "erp-test"), (CRM, "erp-prod"), (CRM, None)}

    code, doc = rollback(world, driver, 1)
    assert code == 0, doc
    now = check_restored(world, doc, then)
    assert now[CRM] is None  # CRM had nothing at N and has nothing now
    # The pack did not move: the same generation serves N's content again.
    assert doc["apply"]["packs"][0]["decision"] == "unchanged"


# -- planning, local_path, credentials ---------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_r7_rollback_plan_shows_the_release_and_appends_nothing(world: World, driver: str) -> None:
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    release(world, [world.official("sales", c1)], push_closure(ERP, "sales"))
    release(world, [world.official("sales", c2)], push_closure(ERP, "sales"))
    tables = world.tables()
    code, doc = rollback(world, driver, 1, plan=True)
    assert code == 0, doc
    assert world.tables() == tables
    assert doc["plan"] is True and "apply" not in doc and "published" not in doc
    assert doc["equivalent"] is False and doc["current"]["revision"] == 2
    assert doc["manifest"] == {
        "packs": [
            {
                "name": "sales",
                "source": {
                    "kind": "official_repo",
                    "repo": str(world.repo.path.resolve()),
                    "revision": c1,
                    "path": "sales/pack.json",
                },
            }
        ],
        "bindings": push_closure(ERP, "sales")[::-1],  # bytewise: callout_profile first
    }
    # The human output: the summary line first, every pack, the notes, the manifest.
    out = cli("--db", world.url, "rollback", "--to-revision", "1", "--plan")
    assert out.code == 0 and world.tables() == tables
    lines = out.stdout.splitlines()
    assert lines[0] == (
        "rollback plan to revision 1: 1 pack advances; bindings unchanged; 1 audience changes"
    )
    assert lines[1].startswith(f"  sales: advance {c2[:12]} -> ")
    assert "\x1b[" not in out.stdout  # not a terminal: no colour
    assert "local_path packs are left alone" in out.stdout
    assert "credentials are not rolled back" in out.stdout
    assert f'"revision": "{c1}"' in out.stdout
    # The plan is apply's own (apply --plan of that manifest): what the rollback does.
    planned = doc["apply_plan"]
    assert [(p["pack"], p["decision"]) for p in planned["packs"]] == [("sales", "advance")]
    assert "what applying it does:" in out.stdout
    code, done = rollback(world, driver, 1)
    assert code == 0, done
    # (a plan's pack also says where it moves from: from_revision, from_payload_hash)
    applied = done["apply"]["packs"]
    assert [{k: p[k] for k in a} for p, a in zip(planned["packs"], applied, strict=True)] == applied
    for part in ("bindings", "catalog"):
        assert done["apply"][part] == planned[part]


def test_r7_rollback_colours_only_a_terminal_and_honours_no_color(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    release(world, [world.official("sales", c1)], push_closure(ERP, "sales"))
    release(world, [world.official("sales", c2)], push_closure(ERP, "sales"))

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    def on_terminal() -> str:
        out = Terminal()
        with redirect_stdout(out), redirect_stderr(io.StringIO()):
            assert run(["--db", world.url, "rollback", "--to-revision", "1", "--plan"]) == 0
        return out.getvalue()

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert "\x1b[" in on_terminal()
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in on_terminal()


@pytest.mark.parametrize("driver", DRIVERS)
def test_r7_rollback_leaves_local_path_packs_and_credentials_alone(
    world: World, driver: str
) -> None:
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    dev = world.local_dir("devpack", 1)
    release(world, [world.official("sales", c1), local("devpack", dev)], push_closure(ERP, "sales"))
    then = views(world, [ERP])
    world.local_dir("devpack", 2)  # the directory moves on, and a new local pack appears
    scratch = world.local_dir("scratch", 1)
    release(
        world,
        [world.official("sales", c2), local("devpack", dev), local("scratch", scratch)],
        push_closure(ERP, "sales"),
    )
    with open_store(world.url) as store:
        issued = store.credentials_issue(ERP)
    code, before = cli_json("--db", world.url, "status")
    local_rows = {p["pack"]: p for p in before["packs"] if p["source_kind"] == "local_path"}

    code, doc = rollback(world, driver, 1)
    assert code == 0, doc
    assert doc["left_alone"]["local_path"] == ["devpack", "scratch"]
    assert any("local_path packs are left alone" in n for n in doc["left_alone"]["notes"])
    assert any("credentials are not rolled back" in n for n in doc["left_alone"]["notes"])
    assert {p["name"] for p in doc["manifest"]["packs"]} == {"sales"}
    assert "remove" not in doc["manifest"]
    check_restored(world, doc, then)
    code, after = cli_json("--db", world.url, "status")
    assert {p["pack"]: p for p in after["packs"] if p["source_kind"] == "local_path"} == local_rows
    with open_store(world.url) as store:
        listed = store.credentials_list(audience=ERP)
    assert [c["credential_id"] for c in listed["credentials"]] == [issued["credential_id"]]
    assert listed["credentials"][0]["status"] == "active"


# -- what can't be rolled back ----------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("gone", ["repo", "commit"])
def test_r28_a_source_that_cannot_be_resolved_is_invalid_naming_it_and_appends_nothing(
    world: World, driver: str, gone: str
) -> None:
    old = Repo(world.tmp / "old-repo")
    c1 = old.commit({"sales/pack.json": content("sales", 1)})
    sales_at_1 = {
        "name": "sales",
        "source": {
            "kind": "official_repo",
            "repo": str(old.path),
            "revision": c1,
            "path": "sales/pack.json",
        },
    }
    release(world, [sales_at_1], push_closure(ERP, "sales"))
    c2 = world.commit("sales", 2)
    release(world, [world.official("sales", c2)], push_closure(ERP, "sales"))
    shutil.rmtree(old.path)
    if gone == "commit":  # the repository is there again, without that commit
        Repo(old.path).commit({"sales/pack.json": content("sales", 3)})
    tables = world.tables()
    for plan in (True, False):
        code, doc = rollback(world, driver, 1, plan=plan)
        assert code == 3 and doc["error"] == "INVALID", doc
        assert doc["details"]["pack"] == "sales"
        assert doc["details"]["revision"] == c1
        assert doc["details"]["repo"] == str(old.path.resolve())
        assert "'sales'" in doc["message"] and c1 in doc["message"]
        assert world.tables() == tables


@pytest.mark.parametrize("driver", DRIVERS)
def test_r5_a_pack_official_at_n_and_local_path_now_is_invalid_and_appends_nothing(
    world: World, driver: str
) -> None:
    c1 = world.commit("sales", 1)
    release(world, [world.official("sales", c1)], push_closure(ERP, "sales"))
    release(world, [], [], remove=("sales",))
    path = world.manifest([local("sales", world.local_dir("sales", 2))], [])
    world.service.apply(path)
    tables = world.tables()
    code, doc = rollback(world, driver, 1)
    assert code == 3 and doc["error"] == "INVALID", doc
    assert doc["details"]["pack"] == "sales" and "local_path" in doc["message"]
    assert world.tables() == tables


@pytest.mark.parametrize("driver", DRIVERS)
def test_r17_rollback_to_a_revision_never_published_is_missing(world: World, driver: str) -> None:
    c1 = world.commit("sales", 1)
    release(world, [world.official("sales", c1)], push_closure(ERP, "sales"))
    head = world.head()
    code, doc = rollback(world, driver, 7)
    assert code == 5 and doc["error"] == "MISSING" and "revision 7" in doc["message"]
    code, doc = rollback(world, driver, "x")
    assert code == 3 and doc["details"]["field"] == "to_revision"
    assert world.head() == head


def test_r7_rollback_help_says_what_it_leaves_alone() -> None:
    out = cli("rollback", "--help")
    assert out.code == 0
    for words in ("--to-revision", "--plan", "--json", "local_path", "credentials"):
        assert words in out.stdout


def test_r7_rollback_needs_a_revision() -> None:
    out = cli("rollback")
    assert out.code == 2 and "--to-revision" in out.stderr


# -- the README's example ---------------------------------------------------------------------


def test_r17_readme_rollback_example_is_what_the_demo_store_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README "Roll back to a revision" shows real output: the demo's two releases, then
    ``rollback --to-revision 1`` (install ids are reproducible, so the digests are too;
    the apply's command id is not)."""
    subprocess.run(
        ["sh", str(EXAMPLES / "make-repo.sh"), str(tmp_path / "repos" / "catalog")],
        capture_output=True,
        check=True,
    )
    for name in ("release-1.json", "release-2.json"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    shutil.copytree(EXAMPLES / "packs", tmp_path / "packs")
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    assert cli("--db", url, "init").code == 0
    for name in ("release-1.json", "release-2.json"):
        assert cli("--db", url, "apply", name).code == 0
    out = cli("--db", url, "rollback", "--to-revision", "1")
    assert out.code == 0, out.stderr
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Roll back to a revision") :]
    shown = re.search(r"\$ catalog-ledger rollback --to-revision 1\n(.*?)```", section, re.S)
    assert shown is not None, "README's rollback section has no example"

    # The command id is derived from the log head, whose chain covers event timestamps.
    def masked(text: str) -> str:
        return re.sub(r"apply apply-[0-9a-f]+", "apply apply-ID", text)

    assert masked(out.stdout) == masked(shown.group(1))
