"""Observability (issue 15 item 5): Prometheus ``/metrics`` and structured logs.

``/metrics`` reports the store's gauges as the store has them at scrape time and
counts requests by route *template*, never by raw path; the CLI writes
structured logs to stderr only (``--log-format``, ``--log-level`` or their
environment variables), ``apply`` logs each phase with its duration and command
id, and no secret ever reaches a log.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import secrets
import sys
import time
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from eventsourcing.persistence import StoredEvent
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url

from domain.digests import aggregate_id
from domain.matrix import Advance
from ledger.api import Store
from ledger.cli import run
from ledger.cli.read import DB_ENV
from ledger.commands.writer_lease import WRITER_LEASE
from ledger.http import metrics as http_metrics
from ledger.http.app import create_app
from ledger.log.url import ENV_VAR
from ledger.observability import JsonFormatter, TextFormatter
from tests.conftest import Server
from tests.support.cli_inprocess import cli
from tests.support.cli_support import Result, ServedStore, run_cli
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World, new_service

VIEW_ROUTE = "/v1/audiences/{kind}/{audience_id}/view"
#: The phases ``apply`` logs itself, in the order they end.
APPLY_PHASES = ["resolve", "preflight", "lease", "recover", "prepare", "final_append"]
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text exposition: (name, sorted labels) -> value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Each stderr line as the one JSON object it must be."""
    records = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    for record in records:
        assert isinstance(record, dict), record
        assert RFC3339_UTC.match(record["ts"]), record
        assert {"ts", "level", "logger", "event"} <= set(record), record
    return records


def phases(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["event"] == "phase"]


def released(world: World, audience: str) -> tuple[Path, dict[str, Any]]:
    """A release binding ``audience`` to the sales pack, applied through the CLI with
    JSON logs at info; returns its manifest and the apply's stdout and stderr."""
    manifest = world.manifest(
        [world.official("sales", world.commit("sales", 1))], push_closure(audience, "sales")
    )
    result = cli(
        "--db",
        world.url,
        "--log-format",
        "json",
        "--log-level",
        "info",
        "apply",
        str(manifest),
        "--json",
    )
    assert result.code == 0, result.stderr
    return manifest, {"stdout": result.stdout, "stderr": result.stderr}


# -- /metrics ------------------------------------------------------------------------------


def test_ops_metrics_report_the_store_at_scrape_time_and_count_requests_by_route_template(
    world: World,
) -> None:
    distinctive = "Zq7-Distinctive-Audience-Id-93f1"
    _, applied = released(world, f"integration:{distinctive}")
    revision = json.loads(applied["stdout"])["catalog"]["revision"]
    store = Store(world.url)
    # No background catch-up during the test: the gauges must equal what we read here.
    # Authentication (R26) is not the point here: auth off.
    with TestClient(create_app(store.opener(), catch_up_every=3600, auth=False)) as client:
        served = client.get(f"/v1/audiences/integration/{distinctive}/view")
        assert served.status_code == 200
        etag = served.headers["etag"]
        assert client.get(
            f"/v1/audiences/integration/{distinctive}/view", headers={"if-none-match": etag}
        ).status_code == (304)
        assert client.get(f"/v1/audiences/app/{distinctive}-unbound/view").status_code == 404
        stale = client.get(f"/v1/audiences/integration/{distinctive}/view?min_revision=99")
        assert stale.status_code == 409
        assert client.get(f"/no/such/route/{distinctive}").status_code == 404
        assert client.get("/v1/catalog/head").status_code == 200
        status = store.projections_status()
        lease = store.lease_status()
        text = client.get("/metrics").text
    store.close()
    assert distinctive not in text  # no audience id (or raw path) ever becomes a label
    found = samples(text)
    assert found[("catalog_ledger_store_up", ())] == 1
    assert found[("catalog_ledger_log_head_position", ())] == world.head() == status["head"]
    assert found[("catalog_ledger_catalog_revision", ())] == revision == 1
    assert found[("catalog_ledger_lease_epoch", ())] == lease["epoch"] == 1  # one acquisition
    for view in status["views"]:
        label = (("view", view["name"]),)
        assert found[("catalog_ledger_projection_lag_events", label)] == view["lag"]
        assert found[("catalog_ledger_projection_stopped", label)] == 0
    assert {v["name"] for v in status["views"]} == {
        dict(labels)["view"]
        for name, labels in found
        if name == "catalog_ledger_projection_stopped"
    }
    requests = {
        dict(labels)["route"] + " " + dict(labels)["outcome"]: value
        for (name, labels), value in found.items()
        if name == "catalog_ledger_http_requests_total"
    }
    assert requests == {
        f"{VIEW_ROUTE} ok": 1,
        f"{VIEW_ROUTE} not_modified": 1,
        f"{VIEW_ROUTE} MISSING": 1,
        f"{VIEW_ROUTE} STALE": 1,
        "unmatched MISSING": 1,
        "/v1/catalog/head ok": 1,
    }
    duration = "catalog_ledger_http_request_duration_seconds_count"
    assert found[(duration, (("route", VIEW_ROUTE),))] == 4
    assert found[(duration, (("route", "unmatched"),))] == 1
    # The lease name the gauge reads is the writers' (a constant of the http layer).
    assert http_metrics.WRITER_LEASE == WRITER_LEASE


def test_ops_metrics_report_a_stopped_view_and_its_lag(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.apply(world.official("sales", world.commit("sales", 1)))
    poison = StoredEvent(
        originator_id=aggregate_id("local", "ghost"),
        originator_version=1,
        topic="domain.lifecycle:LocalPack.Updated",
        state=b'{"category":"app","locator":"/x","pack":"ghost","path":"pack.json",'
        b'"payload_hash":"v1:00","timestamp":"2026-11-29T00:00:00+00:00"}',
    )
    with caplog.at_level(logging.ERROR, logger="catalog_ledger.projections"):
        (position,) = world.ledger.recorder.append([poison]).positions
    (stopped_log,) = [r for r in caplog.records if r.getMessage().startswith("view stopped")]
    assert (stopped_log.levelname, vars(stopped_log)["view"], vars(stopped_log)["position"]) == (
        "ERROR",
        "installed_pack",
        position,
    )
    world.service.release_lease(world.service.acquire_lease())  # the stopped view lags
    store = Store(world.url)
    with TestClient(create_app(store.opener(), catch_up_every=3600, auth=False)) as client:
        status = {v["name"]: v for v in store.projections_status()["views"]}
        found = samples(client.get("/metrics").text)
    store.close()
    lag = status["installed_pack"]["lag"]
    assert lag == world.head() - (position - 1) > 0
    assert found[("catalog_ledger_projection_stopped", (("view", "installed_pack"),))] == 1
    assert found[("catalog_ledger_projection_lag_events", (("view", "installed_pack"),))] == lag
    assert found[("catalog_ledger_projection_stopped", (("view", "pack_generation"),))] == 0
    assert found[("catalog_ledger_projection_lag_events", (("view", "pack_generation"),))] == 0


def test_ops_metrics_say_the_store_is_down_instead_of_failing_the_scrape() -> None:
    collector = http_metrics.StoreCollector(lambda: None)
    metrics = http_metrics.HttpMetrics(collector)
    found = samples(metrics.exposition().decode())
    assert found[("catalog_ledger_store_up", ())] == 0
    assert not [name for name, _ in found if name == "catalog_ledger_log_head_position"]
    assert http_metrics.route_of({"type": "http", "path": "/v1/x/secret-id"}) == "unmatched"


def test_ops_serve_workers_count_requests_across_worker_processes(
    sqlite_url: str, tmp_path: Path
) -> None:
    assert Store(sqlite_url).init()["created"] is True
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    server = ServedStore(
        sqlite_url,
        options=("--log-format", "json", "--log-level", "info"),
        serve_options=("--workers", "2"),
        env={"TMPDIR": str(scratch)},
    )
    try:
        for _ in range(12):  # a connection each: any worker may take any of them
            assert httpx.get(f"{server.base}/healthz", timeout=30).status_code == 200
        (folder,) = scratch.iterdir()  # the multiprocess folder serve made for its workers
        assert folder.name.startswith("catalog-ledger-metrics-")
        writers = {int(p.stem.split("_")[1]) for p in folder.glob("counter_*.db")}
        assert writers and server.proc.pid not in writers  # workers count, not the parent
        found = samples(httpx.get(f"{server.base}/metrics", timeout=30).text)
    finally:
        server.close()
    healthz = found[
        ("catalog_ledger_http_requests_total", (("outcome", "ok"), ("route", "/healthz")))
    ]
    assert healthz == 12 + 1  # every request of every worker (the start-up probe too)
    assert found[("catalog_ledger_log_head_position", ())] == 0
    assert list(scratch.iterdir()) == []  # removed when the server stopped
    records = json_lines(server.stderr)
    assert any(r["logger"] == "uvicorn.access" and r["path"] == "/healthz" for r in records)
    assert DB_ENV == ENV_VAR


# -- logs ----------------------------------------------------------------------------------


def test_ops_apply_logs_each_phase_with_duration_and_command_id_as_json_on_stderr(
    world: World,
) -> None:
    _, applied = released(world, "integration:erp")
    result = json.loads(applied["stdout"])  # stdout is still exactly one JSON document
    cid = result["command_id"]
    records = json_lines(applied["stderr"])
    logged = phases(records)
    own = [r["phase"] for r in logged if r["logger"] == "catalog_ledger.apply"]
    assert own == APPLY_PHASES
    views = [r for r in logged if r["phase"] == "views"]
    # Every append's inline views: lease acquisition, prepare, final append, release.
    assert len(views) == 4 and all(r["views"] > 0 and r["events"] > 0 for r in views)
    for record in logged:
        assert record["command_id"] == cid, record
        assert record["command"] == "apply", record
        assert isinstance(record["duration_ms"], float) and record["duration_ms"] >= 0, record
        assert record["level"] == "info"
    assert next(r for r in logged if r["phase"] == "resolve")["packs"] == 1
    assert next(r for r in logged if r["phase"] == "prepare")["packs"] == 1
    (published,) = [r for r in records if r["event"] == "catalog published"]
    assert (published["revision"], published["content_digest"], published["command_id"]) == (
        1,
        result["catalog"]["content_digest"],
        cid,
    )
    (done,) = [r for r in records if r["event"] == "apply"]
    assert (done["outcome"], done["published"], done["noop"], done["command_id"]) == (
        "ok",
        True,
        False,
        cid,
    )
    times = [datetime.fromisoformat(r["ts"].replace("Z", "+00:00")) for r in records]
    assert times == sorted(times)


def test_ops_apply_logs_a_failed_phase_and_the_command_outcome(world: World) -> None:
    manifest = world.manifest([world.official("sales", "f" * 40)])  # no such commit
    result = cli(
        "--db",
        world.url,
        "--log-format",
        "json",
        "--log-level",
        "info",
        "apply",
        str(manifest),
        "--json",
    )
    assert result.code == 3 and json.loads(result.stdout)["error"] == "INVALID"
    records = json_lines(result.stderr)
    (resolve,) = phases(records)
    assert (resolve["phase"], resolve["outcome"], resolve["error"]) == (
        "resolve",
        "error",
        "INVALID",
    )
    (done,) = [r for r in records if r["event"] == "apply"]
    assert (done["outcome"], done["error"]) == ("error", "INVALID")


def test_ops_publish_and_rebuild_are_logged_with_counts_and_durations(world: World) -> None:
    world.apply(world.official("sales", world.commit("sales", 1)))
    result = cli(
        "--db", world.url, "--log-format", "json", "--log-level", "info", "publish", "--json"
    )
    assert result.code == 0, result.stderr
    published = json.loads(result.stdout)
    (done,) = [r for r in json_lines(result.stderr) if r["event"] == "publish"]
    assert (done["command_id"], done["noop"], done["revision"], done["outcome"]) == (
        published["command_id"],
        published["noop"],
        published["revision"],
        "ok",
    )
    result = cli(
        "--db",
        world.url,
        "--log-format",
        "json",
        "--log-level",
        "info",
        "projections",
        "rebuild",
        "catalog",
        "--json",
    )
    assert result.code == 0, result.stderr
    (rebuilt,) = [r for r in json_lines(result.stderr) if r["event"] == "rebuild swapped"]
    assert rebuilt["views"] == ["catalog"] and rebuilt["head"] == world.head()
    assert rebuilt["replayed"] == json.loads(result.stdout)["rebuilt"]["catalog"]["replayed"]
    assert isinstance(rebuilt["duration_ms"], float)


def test_ops_default_logs_are_warnings_only_so_a_successful_command_is_silent(
    world: World,
) -> None:
    manifest = world.manifest([world.official("sales", world.commit("sales", 1))])
    result = cli("--db", world.url, "apply", str(manifest), "--json")
    assert (result.code, result.stderr) == (0, "")
    result = cli("--db", world.url, "--log-level", "info", "publish")
    lines = result.stderr.splitlines()
    assert result.code == 0 and lines
    # text: "ts LEVEL logger: event key=value ..."
    assert all(re.match(r"^\S+Z INFO catalog_ledger\.\w+: ", line) for line in lines), lines


def cli_env(env: dict[str, str], *args: str) -> Result:
    """``catalog-ledger ARGS`` in this process with ``env`` set (``cli`` clears the log
    variables so that a developer's environment never leaks into other tests)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = run(list(args))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return Result(code, out.getvalue(), err.getvalue())


def test_ops_log_format_and_level_come_from_the_environment(sqlite_url: str) -> None:
    assert cli("--db", sqlite_url, "init").code == 0
    env = {"CATALOG_LEDGER_LOG_FORMAT": "json", "CATALOG_LEDGER_LOG_LEVEL": "info"}
    result = run_cli("--db", sqlite_url, "publish", "--json", env=env)  # the console script
    assert result.code == 0
    (done,) = [r for r in json_lines(result.stderr) if r["event"] == "publish"]
    assert done["command_id"] == result.json()["command_id"]
    result = cli_env({"CATALOG_LEDGER_LOG_FORMAT": "JSON"}, "--db", sqlite_url, "--log-level",
                     "INFO", "publish")  # fmt: skip
    assert result.code == 0 and json_lines(result.stderr)  # case does not matter
    # Options given on the command line win over the environment.
    result = cli_env(env, "--db", sqlite_url, "--log-format", "text", "publish")
    assert result.code == 0 and result.stderr.startswith("20") and "{" not in result.stderr
    result = cli_env(env, "--db", sqlite_url, "--log-level", "warning", "publish")
    assert (result.code, result.stderr) == (0, "")


@pytest.mark.parametrize(
    ("args", "env", "option"),
    [
        (("--log-level", "verbose"), {}, "--log-level"),
        (("--log-format", "xml"), {}, "--log-format"),
        ((), {"CATALOG_LEDGER_LOG_LEVEL": "loud"}, "CATALOG_LEDGER_LOG_LEVEL"),
        ((), {"CATALOG_LEDGER_LOG_FORMAT": "yaml"}, "CATALOG_LEDGER_LOG_FORMAT"),
    ],
)
def test_ops_a_bad_log_option_is_a_usage_error_before_anything_runs(
    sqlite_url: str, args: tuple[str, ...], env: dict[str, str], option: str
) -> None:
    result = cli_env(env, "--db", sqlite_url, *args, "init", "--json")
    assert result.code == 2
    error = json.loads(result.stdout)
    assert error["error"] == "USAGE" and option in error["message"], error
    assert not Path(make_url(sqlite_url).database or "").exists()  # init never ran
    human = cli_env(env, "--db", sqlite_url, *args, "init")
    assert human.code == 2 and "error [USAGE]" in human.stderr and human.stdout == ""


def test_ops_in_process_runs_reset_the_handler_each_time(world: World) -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    for _ in range(3):
        result = cli("--db", world.url, "--log-format", "json", "--log-level", "info", "publish")
        assert result.code == 0
        (done,) = [r for r in json_lines(result.stderr) if r["event"] == "publish"]
        assert done["outcome"] == "ok"  # logged once, not once per earlier run
        assert root.handlers == before
    assert logging.getLogger("catalog_ledger").level == logging.NOTSET


def test_ops_formatters_redact_secret_named_fields_and_hide_tracebacks() -> None:
    record = logging.LogRecord("catalog_ledger.x", logging.INFO, __file__, 1, "m %s", ("a",), None)
    vars(record).update(token="tok-123", client_secret="s3", password="pw", epoch=4)
    document = json.loads(JsonFormatter().format(record))
    assert document["event"] == "m a" and document["epoch"] == 4
    assert (document["token"], document["client_secret"], document["password"]) == (
        "[redacted]",
        "[redacted]",
        "[redacted]",
    )
    assert "tok-123" not in TextFormatter().format(record)
    try:
        raise ValueError("boom")
    except ValueError:
        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "f", (), sys.exc_info())
    assert json.loads(JsonFormatter().format(failed))["exc"] == "ValueError: boom"
    assert "Traceback" not in TextFormatter().format(failed)


@pytest.fixture
def password_url(mysql_url: str, mysql_server: Server) -> Iterator[tuple[str, str]]:
    """``mysql_url`` through an account with a password: (URL with it, the password)."""
    user, password = f"obs_{secrets.token_hex(4)}", f"Pw{secrets.token_hex(12)}"
    database = make_url(mysql_url).database
    conn = mysql_server.connect()
    try:
        with conn.cursor() as cur:
            for host in ("%", "localhost", "127.0.0.1"):
                cur.execute(f"CREATE USER '{user}'@'{host}' IDENTIFIED BY '{password}'")
                cur.execute(f"GRANT ALL ON `{database}`.* TO '{user}'@'{host}'")
        url = make_url(mysql_url).set(username=user, password=password)
        yield url.render_as_string(hide_password=False), password
    finally:
        with conn.cursor() as cur:
            for host in ("%", "localhost", "127.0.0.1"):
                cur.execute(f"DROP USER IF EXISTS '{user}'@'{host}'")
        conn.close()


def test_ops_no_secret_reaches_a_log(password_url: tuple[str, str], tmp_path: Path) -> None:
    url, password = password_url
    debug = ("--db", url, "--log-format", "json", "--log-level", "debug")
    out: list[str] = []
    for args in (("init",), ("status",), ("publish",), ("lease", "status")):
        result = cli(*debug, *args, "--json")
        assert result.code == 0, result.stdout
        out.append(result.stdout + result.stderr)
    key = tmp_path / "signer.key"
    assert cli(*debug, "audit", "keygen", "ops-test", "--out", str(key)).code == 0
    signed = cli(*debug, "audit", "checkpoint", "--sign", str(key), "--json")
    assert signed.code == 0 and json.loads(signed.stdout)["note"].count("\u2014") == 1
    out.append(signed.stdout + signed.stderr)
    wrong = url.replace(password, password + "x")
    refused = cli("--db", wrong, "--log-format", "json", "--log-level", "debug", "status", "--json")
    # A login refused is PERMISSION (exit 7), not "server down" (issue 25.2).
    assert refused.code == 7 and json.loads(refused.stdout)["error"] == "PERMISSION"
    out.append(refused.stdout + refused.stderr)
    # PRIVATE+KEY+<name>+<id>+<base64 seed>: the base64 may itself hold a '+'.
    seed = key.read_text(encoding="utf-8").strip().split("+", 4)[4]
    for text in out:
        assert password not in text and seed not in text
    # The access log of the real server goes through the same handler; a bearer token a
    # client sends is never in it.
    token = f"tok-{secrets.token_hex(16)}"
    server = ServedStore(url, options=("--log-format", "json", "--log-level", "info"), auth=True)
    try:
        response = server.client.get(
            "/v1/audiences/app/someone/view", headers={"authorization": f"Bearer {token}"}
        )
        assert response.status_code == 401  # no such credential (R26)
        scraped = server.client.get("/metrics").text
    finally:
        server.close()
    records = json_lines(server.stderr)  # uvicorn logs the access before it responds
    assert any(r["logger"] == "uvicorn.access" and r["status"] == 401 for r in records)
    assert token not in server.stderr and password not in server.stderr
    rejected = (
        "catalog_ledger_http_requests_total",
        (("outcome", "UNAUTHENTICATED"), ("route", VIEW_ROUTE)),
    )
    assert samples(scraped)[rejected] == 1 and token not in scraped


def test_ops_recovery_of_an_abandoned_attempt_is_a_logged_phase_of_the_apply(
    world: World,
) -> None:
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    world.apply(world.official("sales", c1))
    # A writer whose lease ran out an hour ago (its clock says so) left a candidate behind.
    gone = new_service(world, clock=lambda: time.time() - 3600, holder="gone-writer")
    handle = gone.acquire_lease()
    target = world.resolved("sales", c2)
    gone.prepare(handle, [(target, Advance(target.target, c1))])
    manifest = world.manifest([world.official("sales", c2)])
    result = cli("--db", world.url, "--log-format", "json", "--log-level", "info", "apply",
                 str(manifest), "--json")  # fmt: skip
    assert result.code == 0, result.stderr
    applied = json.loads(result.stdout)
    assert [r["pack"] for r in applied["recovered"]] == ["sales"]
    records = json_lines(result.stderr)
    (recover,) = [r for r in phases(records) if r["phase"] == "recover"]
    assert (recover["command_id"], recover["outcome"]) == (applied["command_id"], "ok")
    (recovered,) = [r for r in records if r["event"] == "recovered abandoned attempts"]
    assert (recovered["count"], recovered["command_id"]) == (1, applied["command_id"])
    gone.ledger.close()
