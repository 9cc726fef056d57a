"""R26 and R19 over HTTP: every runtime read is authenticated as exactly one audience, and
any other audience answers byte for byte as an unknown one, through the same lookup.

Real ``catalog-ledger serve`` processes and the in-process app (injected clocks), on
SQLite and MariaDB.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ledger.http.auth as auth_module
from domain.credentials import token_digest
from domain.identity import Audience, identity_problem
from ledger.api import Store
from ledger.cli.read import is_loopback
from ledger.commands.service import CommandService
from ledger.http.app import create_app, openapi_document
from ledger.http.auth import NOBODY
from projections.reader import CatalogReader
from tests.support.cli_inprocess import cli_json
from tests.support.cli_support import ServedStore
from tests.support.cluster_support import ReplicaPair
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World

#: The one MISSING body (R19): an unknown audience, and any audience not the token's.
MISSING = b'{"error":"MISSING","message":"no catalog view is published for this audience",'
MISSING += b'"details":{}}'
T0 = 1_800_000_000.0


@dataclass
class Served:
    """A store with two published audiences and credentials, one of them without grants."""

    world: World
    tokens: dict[str, str]  # audience -> token
    ids: dict[str, str]  # audience -> credential id


PUBLISHED = ("integration:erp-sync", "app:crm")
UNBOUND = "app:no-grants"  # has a credential, was never granted anything


def publish_and_issue(world: World, service: CommandService | None = None) -> Served:
    bindings = [b for a in PUBLISHED for b in push_closure(a, "sales")]
    world.service.apply(
        world.manifest([world.official("sales", world.commit("sales", 1))], bindings)
    )
    issuer = service or world.service
    issued = {a: issuer.credentials_issue(a) for a in (*PUBLISHED, UNBOUND)}
    return Served(
        world,
        {a: i["token"] for a, i in issued.items()},
        {a: i["credential_id"] for a, i in issued.items()},
    )


def path(audience: str) -> str:
    """The view's path; dots encoded too, so ``..`` stays an id and is no path segment."""
    kind, _, ident = audience.partition(":")
    encoded = quote(ident, safe="").replace(".", "%2E")
    return f"/v1/audiences/{quote(kind, safe='')}/{encoded}/view"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


class Clocks:
    """The wall clock (expiry) and the monotonic one (credential refresh) of an app."""

    def __init__(self) -> None:
        self.wall = T0
        self.mono = 0.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def app_client(world: World, clocks: Clocks) -> Iterator[tuple[Served, TestClient]]:
    service = CommandService(world.ledger, clock=lambda: clocks.wall)
    served = publish_and_issue(world, service)
    store = Store(world.url)
    app = create_app(
        store.opener(),
        catch_up_every=3600,
        clock=lambda: clocks.wall,
        refresh_clock=lambda: clocks.mono,
    )
    with TestClient(app) as client:
        yield served, client
    store.close()


# -- a token reads its own audience only ----------------------------------------------------


def test_r26_a_token_reads_its_audience_only_and_others_get_the_unknown_answer_over_serve(
    world: World,
) -> None:
    served = publish_and_issue(world)
    server = ServedStore(world.url, auth=True)
    try:
        crm, erp = served.tokens["app:crm"], served.tokens["integration:erp-sync"]
        own = server.view("app:crm", token=crm)
        assert own.status_code == 200, own.text
        assert own.json()["audience"] == "app:crm" and own.json()["grants"]
        assert server.view("integration:erp-sync", token=erp).status_code == 200
        answers = [
            server.view("integration:erp-sync", token=crm),  # exists, not the token's
            server.view("app:never-seen", token=crm),  # unknown
            server.view("app:CRM", token=crm),  # another identity (R1)
            server.view(UNBOUND, token=served.tokens[UNBOUND]),  # own, but no grants
            server.view("app:crm", token=served.tokens[UNBOUND]),
        ]
        assert [(a.status_code, a.content) for a in answers] == [(404, MISSING)] * 5
        # Identical headers too (but the date): nothing tells the cases apart.
        shapes = {
            tuple(sorted((k, v) for k, v in a.headers.items() if k != "date")) for a in answers
        }
        assert len(shapes) == 1
        # Without a token: 401 for the views and the head; /healthz and /metrics are open.
        for route in (path("app:crm"), "/v1/catalog/head"):
            refused = server.client.get(route)
            assert refused.status_code == 401 and refused.json()["error"] == "UNAUTHENTICATED"
            assert refused.headers["www-authenticate"].startswith("Bearer")
        head = server.client.get("/v1/catalog/head", headers=bearer(served.tokens[UNBOUND]))
        assert head.status_code == 200 and head.json()["revision"] == 1
        assert server.client.get("/healthz").status_code == 200
        assert server.client.get("/metrics").status_code == 200
    finally:
        server.close()
    for token in served.tokens.values():
        assert token not in server.stderr


#: Authorization headers that must be refused: (header, reason, part of the challenge).
REFUSED: list[tuple[str | None, str, str]] = [
    (None, "missing", 'Bearer realm="catalog-ledger"'),
    ("", "missing", 'Bearer realm="catalog-ledger"'),
    ("Basic YWxhZGRpbjpvcGVuc2VzYW1l", "malformed", 'error="invalid_request"'),
    ("Bearer", "malformed", 'error="invalid_request"'),
    ("Bearer two tokens", "malformed", 'error="invalid_request"'),
    ("Bearer tok\u00e9n", "malformed", 'error="invalid_request"'),
    ("Bearer " + "A" * 600, "malformed", 'error="invalid_request"'),
    ("Bearer " + "A" * 43, "invalid_token", 'error="invalid_token"'),
    ("{crm}x", "invalid_token", 'error="invalid_token"'),  # one character more
    ("{crm_swapped}", "invalid_token", 'error="invalid_token"'),  # a token's case counts
]


def test_r26_missing_malformed_and_unknown_tokens_are_401_with_a_bearer_challenge(
    app_client: tuple[Served, TestClient],
) -> None:
    served, client = app_client
    crm = served.tokens["app:crm"]
    for raw, reason, challenge in REFUSED:
        headers: dict[str, str | bytes] = {}
        header = raw
        if raw is not None:
            header = raw.replace("{crm}", f"Bearer {crm}")
            header = header.replace("{crm_swapped}", f"Bearer {crm.swapcase()}")
            headers["authorization"] = header if header.isascii() else header.encode("utf-8")
        for route in (path("app:crm"), path("app:never-seen"), "/v1/catalog/head"):
            answer = client.get(route, headers=headers)
            assert answer.status_code == 401, (header, route, answer.text)
            body = answer.json()
            assert set(body) == {"error", "message", "details"}
            assert (body["error"], body["details"]) == ("UNAUTHENTICATED", {"reason": reason})
            assert answer.headers["www-authenticate"].startswith('Bearer realm="catalog-ledger"')
            assert challenge in answer.headers["www-authenticate"], header
    # The scheme is case-insensitive (RFC 7235); the token is not.
    own = client.get(path("app:crm"), headers={"authorization": f"bEaReR {crm}"})
    assert own.status_code == 200


def test_r26_a_repeated_authorization_header_is_400_naming_it(
    app_client: tuple[Served, TestClient],
) -> None:
    # "The first one wins" would let a proxy (judging the last) and this server disagree
    # about who is calling: two headers are refused, whatever they hold, before any lookup.
    served, client = app_client
    crm, erp = served.tokens["app:crm"], served.tokens["integration:erp-sync"]
    pairs = [
        (f"Bearer {crm}", f"Bearer {erp}"),  # two audiences
        (f"Bearer {crm}", f"Bearer {crm}"),  # the same token twice
        (f"Bearer {crm}", ""),  # one empty
    ]
    for first, second in pairs:
        for route in (path("app:crm"), "/v1/catalog/head"):
            answer = client.get(
                route, headers=[("authorization", first), ("authorization", second)]
            )
            assert answer.status_code == 400, (route, answer.text)
            body = answer.json()
            assert body["error"] == "INVALID"
            assert body["details"] == {"field": "Authorization"}
            assert "Authorization header is repeated" in body["message"]
            assert crm not in answer.text and erp not in answer.text
    # One header still reads.
    assert client.get(path("app:crm"), headers=bearer(crm)).status_code == 200


def test_r26_a_trailing_slash_is_404_and_never_a_redirect_built_from_host(
    app_client: tuple[Served, TestClient],
) -> None:
    served, client = app_client
    crm = served.tokens["app:crm"]
    for route in (path("app:crm") + "/", "/v1/catalog/head/", "/healthz/", "/metrics/"):
        for headers in ({"host": "evil.example"}, {"host": "evil.example", **bearer(crm)}):
            answer = client.get(route, headers=headers, follow_redirects=False)
            assert answer.status_code == 404, (route, answer.status_code, answer.headers)
            assert "location" not in answer.headers
            assert answer.json()["error"] == "MISSING"
    # The routes themselves still answer.
    assert client.get("/v1/catalog/head", headers=bearer(crm)).status_code == 200


def test_r26_revocation_bites_within_one_second_and_expiry_at_once(
    app_client: tuple[Served, TestClient], clocks: Clocks
) -> None:
    served, client = app_client
    crm = bearer(served.tokens["app:crm"])
    assert client.get(path("app:crm"), headers=crm).status_code == 200
    with Store(served.world.url) as store:
        store.credentials_revoke(served.ids["app:crm"])
    clocks.advance(0.5)  # within the refresh window the set read before is still used
    assert client.get(path("app:crm"), headers=crm).status_code == 200
    clocks.advance(0.5)  # one second after: re-read, refused, no restart
    refused = client.get(path("app:crm"), headers=crm)
    assert (refused.status_code, refused.json()["details"]) == (401, {"reason": "invalid_token"})
    # Expiry needs no refresh: checked against the clock on every request.
    service = CommandService(served.world.ledger, clock=lambda: clocks.wall)
    short = service.credentials_issue("integration:erp-sync", expires_in="30m")
    clocks.advance(1.0)
    headers = bearer(short["token"])
    assert client.get(path("integration:erp-sync"), headers=headers).status_code == 200
    clocks.wall = T0 + 1.0 + 1_800 - 0.000_001
    assert client.get(path("integration:erp-sync"), headers=headers).status_code == 200
    clocks.wall = T0 + 1.0 + 1_800
    expired = client.get(path("integration:erp-sync"), headers=headers)
    assert (expired.status_code, expired.json()["error"]) == (401, "UNAUTHENTICATED")
    # Revoked and expired get one answer (unknown too): nothing tells them apart.
    unknown = client.get(path("app:crm"), headers=bearer("A" * 43))
    assert refused.content == expired.content == unknown.content


def test_r26_revocation_takes_effect_on_a_running_server_without_restart(world: World) -> None:
    served = publish_and_issue(world)
    server = ServedStore(world.url, auth=True)
    try:
        token = served.tokens["integration:erp-sync"]
        assert server.view("integration:erp-sync", token=token).status_code == 200
        code, revoked = cli_json(
            "--db", world.url, "credentials", "revoke", served.ids["integration:erp-sync"]
        )
        assert code == 0 and revoked["status"] == "revoked"
        start = time.monotonic()
        # The bound is 1 s, proved with an injected clock above; here, on a real server
        # process, the deadline only has to tell "without restart" from "never".
        while server.view("integration:erp-sync", token=token).status_code == 200:
            assert time.monotonic() - start < 60, "revocation did not take effect"
            time.sleep(0.05)
        assert server.view("integration:erp-sync", token=token).status_code == 401
    finally:
        server.close()


def test_r26_on_a_replica_a_revocation_bites_once_replicated_and_healthz_shows_the_lag(
    replica_pair: ReplicaPair, tmp_path: Path
) -> None:
    pair = replica_pair
    pair.create_reader("credreader", "credreader-pw", "cred")
    pair.create_database(pair.primary.port, "cred")
    world = World(tmp_path, pair.primary.url("cred"))
    try:
        served = publish_and_issue(world)
        pair.wait_caught_up()
        server = ServedStore(
            pair.replica.url("cred", user="credreader", password="credreader-pw"), auth=True
        )
        try:
            token = served.tokens["app:crm"]
            assert server.view("app:crm", token=token).status_code == 200
            pair.pause()  # the replica stops applying what the primary writes
            code, _ = cli_json("--db", world.url, "credentials", "revoke", served.ids["app:crm"])
            assert code == 0
            # Not replicated: past the refresh window the replica still knows the token
            # (it serves what it holds; a revocation is a log fact like any other).
            until = time.monotonic() + 1.3
            while time.monotonic() < until:
                assert server.view("app:crm", token=token).status_code == 200
                time.sleep(0.1)
            health = server.client.get("/healthz").json()
            assert health["writes"] is False and health["replication"]["sql_running"] is False
            pair.resume()
            pair.wait_caught_up()
            replicated = time.monotonic()
            while server.view("app:crm", token=token).status_code == 200:
                assert time.monotonic() - replicated < 60, "revocation did not bite"
                time.sleep(0.05)
            assert server.view("app:crm", token=token).status_code == 401
            assert server.client.get("/healthz").json()["replication"]["sql_running"] is True
        finally:
            server.close()
    finally:
        world.close()


# -- the other-audience path is the unknown path (R19) --------------------------------------


@dataclass
class Trace:
    digests: int = 0
    reads: list[Audience] | None = None
    rows: list[int] | None = None


def _traced(monkeypatch: pytest.MonkeyPatch) -> Trace:
    """Count token digests, reader calls (with the audience read) and the rows each read's
    statement returned."""
    trace = Trace(0, [], [])
    real_digest = token_digest
    real_view = CatalogReader.view_at

    def digest(token: str) -> bytes:
        trace.digests += 1
        return real_digest(token)

    def view(self: CatalogReader, audience: Audience, **kwargs: Any) -> Any:
        assert trace.reads is not None and trace.rows is not None
        trace.reads.append(audience)
        real_query: Callable[..., list[Any]] = self.store.query

        def query(sql: str, params: Any = ()) -> list[Any]:
            found = real_query(sql, params)
            assert trace.rows is not None
            trace.rows.append(len(found))
            return found

        self.store.query = query  # type: ignore[method-assign]
        try:
            return real_view(self, audience, **kwargs)
        finally:
            del self.store.query

    monkeypatch.setattr(auth_module, "token_digest", digest)
    monkeypatch.setattr(CatalogReader, "view_at", view)
    return trace


def test_r19_another_audience_runs_the_same_lookup_as_an_unknown_one_byte_for_byte(
    app_client: tuple[Served, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    served, client = app_client
    crm = bearer(served.tokens["app:crm"])
    cases = {
        "exists, not the token's": ("integration:erp-sync", crm),
        "unknown": ("integration:never-seen", crm),
        "own audience, no grants": (UNBOUND, bearer(served.tokens[UNBOUND])),
    }
    seen: dict[str, tuple[int, bytes, Trace]] = {}
    for name, (audience, headers) in cases.items():
        trace = _traced(monkeypatch)
        answer = client.get(path(audience), headers=headers)
        seen[name] = (answer.status_code, answer.content, trace)
        monkeypatch.undo()
    for name, (status, body, trace) in seen.items():
        assert (status, body) == (404, MISSING), name
        # One digest, one reader call, two statements: the views' header row only, then
        # the log's last catalog event and no audience view event (R28). Nothing of the
        # other audience was read, and nothing short-cut the read.
        assert (trace.digests, trace.rows) == (1, [1, 1]), name
    assert seen["exists, not the token's"][2].reads == [NOBODY]
    assert seen["unknown"][2].reads == [NOBODY]
    assert seen["own audience, no grants"][2].reads == [Audience.parse(UNBOUND)]
    # The token's own audience reads its grants: the same code, more rows.
    trace = _traced(monkeypatch)
    assert client.get(path("app:crm"), headers=crm).status_code == 200
    assert trace.reads == [Audience.parse("app:crm")]
    assert trace.rows is not None and trace.rows[0] > 1


# -- the property: random audiences and tokens -------------------------------------------------

_IDS = st.one_of(
    st.sampled_from(["erp-sync", "crm", "CRM", "no-grants", "never-seen", "erp-sync "]),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=12),
)
_AUDIENCES = st.tuples(st.sampled_from(["app", "integration"]), _IDS).map(":".join)
_RANDOM_TOKENS = st.text(
    st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"),
    min_size=1,
    max_size=60,
)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    owner=st.sampled_from([*PUBLISHED, UNBOUND, None]),
    asked=st.one_of(st.sampled_from([*PUBLISHED, UNBOUND]), _AUDIENCES),
    random_token=_RANDOM_TOKENS,
)
def test_r19_r26_a_token_never_reads_another_audience_and_its_missing_is_the_unknown_one(
    app_client: tuple[Served, TestClient], owner: str | None, asked: str, random_token: str
) -> None:
    served, client = app_client
    token = served.tokens[owner] if owner is not None else random_token
    answer = client.get(path(asked), headers=bearer(token))
    if owner is None:  # a token nobody issued
        assert answer.status_code == 401 and answer.json()["error"] == "UNAUTHENTICATED"
        return
    ident = asked.partition(":")[2]
    if identity_problem(ident) is not None:
        assert answer.status_code == 400 and answer.json()["error"] == "INVALID"
        return
    if asked == owner and owner in PUBLISHED:
        assert answer.status_code == 200 and answer.json()["audience"] == owner
        return
    assert (answer.status_code, answer.content) == (404, MISSING), (owner, asked)


# -- serve --no-auth and the API document ---------------------------------------------------


LOOPBACK = ["127.0.0.1", "127.255.0.9", "::1", "localhost", "LOCALHOST"]
NOT_LOOPBACK = [
    "0.0.0.0",
    "::",
    "10.0.0.1",
    "128.0.0.1",
    "::ffff:127.0.0.1",
    "127.0.0.1.nip.io",
    "example.com",
    "",
]


def test_r26_loopback_is_127_0_0_0_8_ipv6_1_and_localhost() -> None:
    assert [h for h in LOOPBACK + NOT_LOOPBACK if is_loopback(h)] == LOOPBACK


def test_r26_serve_no_auth_is_a_usage_error_off_loopback_and_auth_is_on_by_default(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    apps: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: apps.append(app))
    for host in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "10.0.0.1", "example.com"):
        apps.clear()
        args = ("--db", world.url, "serve", "--port", "0", "--host", host)
        code, answer = cli_json(*args, "--no-auth")
        if is_loopback(host):
            assert code == 0 and answer["auth"] == "none", answer
            assert [a.state.auth_required for a in apps] == [False]
        else:
            assert (code, answer["error"]) == (2, "USAGE"), answer
            assert "--no-auth" in answer["message"] and apps == []
        # Without --no-auth every host is served, authenticated.
        apps.clear()
        code, answer = cli_json(*args)
        assert code == 0 and answer["auth"] == "bearer"
        assert [a.state.auth_required for a in apps] == [True]


def test_r26_serve_prints_an_ipv6_listen_address_in_brackets(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    hosts: list[str] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: hosts.append(kw["host"]))
    for host, url in (
        ("::1", "http://[::1]:0"),
        ("::", "http://[::]:0"),
        ("fe80::1%lo", "http://[fe80::1%25lo]:0"),
        ("127.0.0.1", "http://127.0.0.1:0"),
        ("localhost", "http://localhost:0"),
    ):
        code, answer = cli_json("--db", world.url, "serve", "--port", "0", "--host", host)
        assert (code, answer.get("url")) == (0, url), answer
    # uvicorn is given the bare address to bind.
    assert hosts == ["::1", "::", "fe80::1%lo", "127.0.0.1", "localhost"]
    # A busy IPv6 port is named the same way (UNAVAILABLE, exit 1).
    with socket.socket(socket.AF_INET6) as busy:
        busy.bind(("::1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, error = cli_json("--db", world.url, "serve", "--port", str(port), "--host", "::1")
    assert (code, error["error"]) == (1, "UNAVAILABLE"), error
    assert error["message"].startswith(f"cannot listen on [::1]:{port}: "), error


def test_r26_serve_no_auth_serves_every_audience_without_a_token(world: World) -> None:
    publish_and_issue(world)
    server = ServedStore(world.url)  # --no-auth on 127.0.0.1
    try:
        assert server.view("app:crm").status_code == 200
        assert server.view("integration:erp-sync").status_code == 200
        assert server.view("app:never-seen").content == MISSING
    finally:
        server.close()


def test_r26_openapi_documents_the_bearer_scheme_and_the_401s() -> None:
    document = openapi_document()
    assert document["components"]["securitySchemes"]["credential"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["credential"]["description"],
    }
    for route in ("/v1/audiences/{kind}/{audience_id}/view", "/v1/catalog/head"):
        operation = document["paths"][route]["get"]
        assert operation["security"] == [{"credential": []}], route
        assert "UNAUTHENTICATED" in operation["responses"]["401"]["description"], route
    assert "security" not in document["paths"]["/healthz"]["get"]


def test_r26_the_sentinel_audience_can_never_be_granted_or_issued(world: World) -> None:
    assert identity_problem(str(NOBODY.id)) is not None
    code, error = cli_json("--db", world.url, "credentials", "issue", "app:\x00")
    assert (code, error["error"], error["details"]["field"]) == (3, "INVALID", "audience.id")
    manifest = world.manifest(
        [world.official("sales", world.commit("sales", 1))], push_closure("app:\x00", "sales")
    )
    code, error = cli_json("--db", world.url, "apply", str(manifest))
    assert (code, error["error"]) == (3, "INVALID")
