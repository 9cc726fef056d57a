"""R26: audience credentials are log facts holding the token's digest, never the token.

Issue, revoke and list through the CLI and the service on SQLite and MariaDB, with
injected clocks; the audit replay's legality checks; ``history --audience``.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from eventsourcing.persistence import StoredEvent

from domain.credentials import credential_aggregate_id, parse_duration, token_digest
from domain.digests import aggregate_id
from domain.errors import InvalidInput
from ledger.commands.service import CommandService
from tests.support.cli_inprocess import cli, cli_json
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World

ROOT = Path(__file__).resolve().parents[2]
#: 2027-01-15T08:00:00Z, a fixed clock for exact timestamps.
T0 = 1_800_000_000.0
DAY_US = 86_400 * 1_000_000


def clocked(world: World, start: float = T0) -> tuple[CommandService, list[float]]:
    """A command service on ``world`` whose clock the test moves."""
    now = [start]
    return CommandService(world.ledger, clock=lambda: now[0]), now


def export_text(world: World, tmp_path: Path) -> str:
    out = tmp_path / "export.jsonl"
    assert cli("--db", world.url, "export", "--jsonl", "--out", str(out)).code == 0
    return out.read_text(encoding="utf-8")


# -- issue ----------------------------------------------------------------------------------


def test_r26_issue_shows_the_token_once_and_the_log_holds_only_its_digest(
    world: World, tmp_path: Path
) -> None:
    result = cli(
        "--db",
        world.url,
        "--log-format",
        "json",
        "--log-level",
        "debug",
        "credentials",
        "issue",
        "integration:erp-sync",
        "--json",
    )
    assert result.code == 0, result.stdout
    issued = json.loads(result.stdout)
    assert set(issued) == {"credential_id", "audience", "token", "issued_at", "expires_at"}
    assert issued["audience"] == "integration:erp-sync"
    assert re.fullmatch(r"cred_[0-9a-f]{24}", issued["credential_id"])
    token = issued["token"]
    # 256 bits of randomness, URL-safe base64 without padding.
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", token)
    assert len(base64.urlsafe_b64decode(token + "=")) == 32
    # Default expiry 90 days, RFC 3339 UTC.
    assert issued["issued_at"].endswith("Z") and issued["expires_at"].endswith("Z")
    issued_at = _parse(issued["issued_at"])
    assert _parse(issued["expires_at"]) - issued_at == 90 * DAY_US
    # The log holds the digest under its own context, and never the token.
    exported = export_text(world, tmp_path)
    assert token not in exported
    (line,) = [json.loads(x) for x in exported.splitlines() if '"credential.issued"' in x]
    assert line["topic"] == "credential.issued@1"
    assert line["state"]["token_digest"] == token_digest(token).hex()
    assert set(line["state"]) == {
        "audience_id",
        "audience_kind",
        "credential_id",
        "expires_at_us",
        "issued_at_us",
        "timestamp",
        "token_digest",
    }
    # Nor is it in the command's logs, nor in any other command's output.
    assert token not in result.stderr and issued["credential_id"] in result.stderr
    listed = cli("--db", world.url, "credentials", "list", "--json")
    history = cli("--db", world.url, "history", "--audience", "integration:erp-sync", "--json")
    for out in (listed, history):
        assert out.code == 0
        assert token not in out.stdout and token_digest(token).hex() not in out.stdout
    # Another issue is another credential with another token (no idempotent replay).
    code, again = cli_json("--db", world.url, "credentials", "issue", "integration:erp-sync")
    assert code == 0
    assert again["credential_id"] != issued["credential_id"] and again["token"] != token


def _parse(stamp: str) -> int:
    from datetime import datetime

    moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return int(moment.timestamp()) * 1_000_000 + moment.microsecond


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90d", 90 * 86_400),
        ("12h", 12 * 3_600),
        ("30m", 1_800),
        ("3600s", 3_600),
        ("1s", 1),
        ("36500d", 36_500 * 86_400),
        ("never", None),
    ],
)
def test_r26_durations_are_days_hours_minutes_seconds_or_never(
    text: str, seconds: int | None
) -> None:
    assert parse_duration(text) == seconds


# Once, on SQLite: the duration is refused before any store is read.
@pytest.mark.parametrize("engine_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    "text",
    [
        *("", "0s", "0", "00d", "090d", "1.5h", "10y", "90 d", " 90d", "1d2h", "NEVER", "٣s"),
        *("-1d", "-0s", "-90d", "36501d", "3153600001s", "999999999999d", "9" * 13 + "d"),
        *("9" * 5000 + "d", "abc", "1e9s", "90", "+90d", "0x10s", "inf", "nan"),
    ],
)
def test_r26_a_bad_duration_is_invalid_naming_expires_in_and_writes_nothing(
    world: World, text: str
) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_duration(text)
    assert info.value.field == "expires_in"
    before = world.tables()
    code, error = cli_json(
        "--db", world.url, "credentials", "issue", "app:crm", "--expires-in", text
    )
    assert (code, error["error"], error["details"]["field"]) == (3, "INVALID", "expires_in")
    # One message for every out-of-range or malformed value (issue 25.2), the value cut short.
    shown = text if len(text) <= 40 else text[:40] + "..."
    assert error["message"] == (
        "expires_in must be a whole number of days, hours, minutes or seconds from 1s to "
        f"36500d, like 90d, 12h, 30m or 3600s, or never; got {shown!r}"
    )
    assert world.tables() == before


@pytest.mark.parametrize(
    ("audience", "field"),
    [
        ("workload:x", "audience"),
        ("crm", "audience"),
        ("app:", "audience.id"),
        ("app: crm", "audience.id"),
        ("integration:a\x00b", "audience.id"),
    ],
)
def test_r26_issue_refuses_a_non_canonical_audience_and_writes_nothing(
    world: World, audience: str, field: str
) -> None:
    before = world.tables()
    code, error = cli_json("--db", world.url, "credentials", "issue", audience)
    assert (code, error["error"], error["details"]["field"]) == (3, "INVALID", field)
    assert world.tables() == before


# -- revoke and list ------------------------------------------------------------------------


def test_r26_revoke_unknown_is_missing_and_revoking_twice_is_a_no_op(world: World) -> None:
    service, now = clocked(world)
    issued = service.credentials_issue("app:crm", expires_in="1h")
    before = world.tables()
    unknown = "cred_" + "0" * 24
    code, error = cli_json("--db", world.url, "credentials", "revoke", unknown)
    assert (code, error["error"], error["details"]) == (
        5,
        "MISSING",
        {"credential_id": unknown},
    )
    code, error = cli_json("--db", world.url, "credentials", "revoke", "cred_XYZ")
    assert (code, error["error"], error["details"]["field"]) == (3, "INVALID", "credential_id")
    assert world.tables() == before
    now[0] += 60
    first = service.credentials_revoke(issued["credential_id"])
    assert first == {
        "credential_id": issued["credential_id"],
        "audience": "app:crm",
        "status": "revoked",
        "issued_at": "2027-01-15T08:00:00Z",
        "expires_at": "2027-01-15T09:00:00Z",
        "revoked_at": "2027-01-15T08:01:00Z",
        "noop": False,
    }
    head = world.head()
    now[0] += 60
    code, second = cli_json("--db", world.url, "credentials", "revoke", issued["credential_id"])
    assert code == 0 and second == {**first, "noop": True}
    assert world.head() == head  # nothing appended
    assert world.topics()[-2:] == ["credential.issued", "credential.revoked"]


def test_r26_list_shows_active_revoked_and_expired_with_rfc3339_times_and_no_secret(
    world: World,
) -> None:
    service, now = clocked(world)
    short = service.credentials_issue("integration:erp-sync", expires_in="30m")
    now[0] += 0.5
    forever = service.credentials_issue("integration:erp-sync", expires_in="never")
    now[0] += 1.0
    other = service.credentials_issue("app:CRM", expires_in="12h")
    now[0] += 10
    service.credentials_revoke(other["credential_id"])
    listed = service.credentials_list()["credentials"]
    assert [c["status"] for c in listed] == ["active", "active", "revoked"]
    assert listed[2] == {
        "credential_id": other["credential_id"],
        "audience": "app:CRM",
        "status": "revoked",
        "issued_at": "2027-01-15T08:00:01.500000Z",
        "expires_at": "2027-01-15T20:00:01.500000Z",
        "revoked_at": "2027-01-15T08:00:11.500000Z",
    }
    now[0] = T0 + 1_800  # exactly the expiry of the 30-minute credential
    scoped = service.credentials_list(audience="integration:erp-sync")["credentials"]
    assert [(c["credential_id"], c["status"], c["expires_at"]) for c in scoped] == [
        (short["credential_id"], "expired", "2027-01-15T08:30:00Z"),
        (forever["credential_id"], "active", None),
    ]
    # Case is significant (R1): app:crm is not app:CRM.
    assert service.credentials_list(audience="app:crm") == {"credentials": []}
    # The CLI lists the same (its clock is the real one: the 2027 credentials are not
    # expired yet), and no token or digest is in it.
    code, document = cli_json("--db", world.url, "credentials", "list", "--audience", "app:CRM")
    assert code == 0 and document == {"credentials": [listed[2]]}
    for c in (short, forever, other):
        assert c["token"] not in json.dumps(document)


def test_r26_a_store_initialized_before_the_credential_view_fails_closed_until_init(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The credential view is a view table: ``init`` creates and builds it on a store that
    predates it (no migration step); until then credentials and ``serve`` refuse, typed,
    while the audit and the other views carry on."""
    import uvicorn

    service, _ = clocked(world)
    issued = service.credentials_issue("app:crm")
    with world.db.write() as conn:  # as a store initialized by a release without the view
        conn.exec_driver_sql("DELETE FROM projection_state WHERE name = X'63726564656e7469616c'")
        conn.exec_driver_sql("DELETE FROM view_credential")
    before = world.tables()
    for args in (("credentials", "issue", "app:crm"), ("credentials", "list")):
        code, error = cli_json("--db", world.url, *args)
        assert (code, error["error"]) == (6, "INTEGRITY"), args
        assert "view credential is not initialized; run `catalog-ledger init`" in error["message"]
    monkeypatch.setattr(uvicorn, "run", lambda *_, **__: pytest.fail("served"))
    code, error = cli_json("--db", world.url, "serve", "--port", "0")
    assert (code, error["error"]) == (6, "INTEGRITY")
    assert world.tables() == before
    assert cli_json("--db", world.url, "audit", "verify")[0] == 0
    assert cli_json("--db", world.url, "projections", "verify")[0] == 0
    code, error = cli_json("--db", world.url, "projections", "verify", "credential")
    assert (code, error["details"]["field"]) == (3, "name")
    # init builds the view from the log: the credential issued before is back.
    assert cli_json("--db", world.url, "init")[0] == 0
    code, listed = cli_json("--db", world.url, "credentials", "list")
    assert code == 0
    assert [c["credential_id"] for c in listed["credentials"]] == [issued["credential_id"]]


# -- the audit replay and history ------------------------------------------------------------


def _forge(world: World, aggregate: Any, version: int, topic: str, **state: Any) -> int:
    """Append one event the command service would never write; its position."""
    body = orjson.dumps(
        {**state, "timestamp": "2027-01-15T08:00:00+00:00"}, option=orjson.OPT_SORT_KEYS
    )
    event = StoredEvent(
        originator_id=aggregate, originator_version=version, topic=topic, state=body
    )
    (position,) = world.ledger.recorder.append([event]).positions
    return position


def _audit_problem(world: World) -> dict[str, Any]:
    code, report = cli_json("--db", world.url, "audit", "verify", "--no-views")
    assert code == 6 and report["error"] == "INTEGRITY", report
    first: dict[str, Any] = report["details"]["first_problem"]
    return first


def test_r26_audit_replays_issue_and_revoke_and_passes_a_legal_history(world: World) -> None:
    service, now = clocked(world)
    for audience in ("app:crm", "integration:a", "app:crm"):
        issued = service.credentials_issue(audience)
        now[0] += 1
    service.credentials_revoke(issued["credential_id"])
    service.credentials_revoke(issued["credential_id"])  # a no-op: nothing to replay
    code, report = cli_json("--db", world.url, "audit", "verify")
    assert code == 0 and report["ok"] is True, report


def test_r26_audit_names_a_revocation_of_a_credential_never_issued(world: World) -> None:
    ghost = "cred_" + "a" * 24
    position = _forge(
        world,
        credential_aggregate_id(ghost),
        1,
        "credential.revoked@1",
        credential_id=ghost,
        audience_kind="app",
        audience_id="crm",
        revoked_at_us=1,
    )
    assert _audit_problem(world) == {
        "position": position,
        "check": "replay",
        "message": f"revocation of credential {ghost}, which was never issued (R26)",
    }


def test_r26_audit_names_a_second_issue_of_one_credential_id(world: World) -> None:
    service, _ = clocked(world)
    issued = service.credentials_issue("app:crm")
    cid = issued["credential_id"]
    position = _forge(
        world,
        aggregate_id("forged", cid),
        1,
        "credential.issued@1",
        credential_id=cid,
        audience_kind="app",
        audience_id="other",
        token_digest="00" * 32,
        issued_at_us=1,
        expires_at_us=None,
    )
    assert _audit_problem(world) == {
        "position": position,
        "check": "replay",
        "message": f"credential {cid} issued twice (R26)",
    }


def test_r26_audit_names_a_second_revocation_of_one_credential(world: World) -> None:
    service, _ = clocked(world)
    cid = service.credentials_issue("app:crm")["credential_id"]
    service.credentials_revoke(cid)
    position = _forge(
        world,
        credential_aggregate_id(cid),
        3,
        "credential.revoked@1",
        credential_id=cid,
        audience_kind="app",
        audience_id="crm",
        revoked_at_us=int(T0 * 1_000_000) + 5,
    )
    assert _audit_problem(world)["message"] == f"credential {cid} revoked twice (R26)"
    assert _audit_problem(world)["position"] == position


def test_r26_audit_names_a_revocation_for_another_audience(world: World) -> None:
    service, _ = clocked(world)
    cid = service.credentials_issue("app:crm")["credential_id"]
    _forge(
        world,
        credential_aggregate_id(cid),
        2,
        "credential.revoked@1",
        credential_id=cid,
        audience_kind="app",
        audience_id="CRM",  # R1: another audience than app:crm
        revoked_at_us=int(T0 * 1_000_000),
    )
    assert _audit_problem(world)["message"] == (
        f"revocation of credential {cid} names another audience than its issue (R26)"
    )


def test_r26_history_audience_shows_bindings_and_credentials_from_the_log(
    world: World,
) -> None:
    service, now = clocked(world)
    world.service.apply(
        world.manifest(
            [world.official("sales", world.commit("sales", 1))],
            push_closure("integration:a", "sales") + push_closure("integration:A", "sales"),
        )
    )
    cid = service.credentials_issue("integration:a", expires_in="never")["credential_id"]
    service.credentials_issue("integration:A")
    now[0] += 60
    service.credentials_revoke(cid)
    code, document = cli_json("--db", world.url, "history", "--audience", "integration:a")
    assert code == 0 and document["audience"] == "integration:a"
    events = document["events"]
    assert [e["event"] for e in events] == [
        "audience.opened",
        "binding.granted",
        "binding.granted",
        # The digest the log committed for this audience at the revision (R28).
        "audience_view.opened",
        "audience_view.published",
        "credential.issued",
        "credential.revoked",
    ]
    assert events[4]["revision"] == 1 and len(events[4]["digest"]) == 64, events[4]
    issued, revoked = events[5], events[6]
    assert {k: v for k, v in issued.items() if k not in ("position", "event_id", "timestamp")} == {
        "event": "credential.issued",
        "credential_id": cid,
        "issued_at": "2027-01-15T08:00:00Z",
        "expires_at": None,
    }
    assert revoked["revoked_at"] == "2027-01-15T08:01:00Z"
    assert "token_digest" not in json.dumps(document)
    assert {(e["pack"], e["kind"], e["key"]) for e in events[1:3]} == {
        ("sales", "push_contract", "Order.push"),
        ("sales", "callout_profile", "erp"),
    }
    assert [e["position"] for e in events] == sorted(e["position"] for e in events)
    # --pack still works; exactly one of the two; a bad audience is INVALID.
    assert cli_json("--db", world.url, "history", "--pack", "sales")[0] == 0
    for args in ((), ("--pack", "sales", "--audience", "integration:a")):
        code, error = cli_json("--db", world.url, "history", *args)
        assert (code, error["error"]) == (2, "USAGE"), args
    code, error = cli_json("--db", world.url, "history", "--audience", "integration: a")
    assert (code, error["error"], error["details"]["field"]) == (3, "INVALID", "audience.id")


def test_r26_the_credential_view_rebuilds_to_the_rows_it_has_inline(world: World) -> None:
    from tests.rules.test_projections import live_rows

    service, now = clocked(world)
    for n in range(5):
        issued = service.credentials_issue(f"app:tenant-{n}", expires_in=f"{n + 1}h")
        now[0] += 1
        if n % 2:
            service.credentials_revoke(issued["credential_id"])
    before = live_rows(world.db)["_System_Credential"]
    assert len(before) == 5 and sum(r["revoked_at_us"] is not None for r in before) == 2
    world.ledger.runner.rebuild(world.db, ["credential"])
    assert live_rows(world.db)["_System_Credential"] == before
    assert all(r.ok for r in world.ledger.runner.verify(world.db, ["credential"]))


def test_r26_log_format_documents_the_token_context_with_a_working_example() -> None:
    spec = (ROOT / "schema" / "LOG-FORMAT.md").read_text(encoding="utf-8")
    assert "`catalog-ledger 2026-11 credential token v1`" in spec
    token = base64.urlsafe_b64encode(bytes(range(32))).rstrip(b"=").decode()
    assert f"`{token}`" in spec and f"`{token_digest(token).hex()}`" in spec
    for name in ("credential.issued", "credential.revoked"):
        assert f"| `{name}` | 1 |" in spec
