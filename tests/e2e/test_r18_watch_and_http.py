"""Watching views and HTTP correctness (R18, R19), through a started server on loopback.

Watch: ``GET .../view?wait=SECONDS`` with ``If-None-Match`` answers 200 as soon as the
audience's *own* content changes and 304 when the wait ends; waiters are bounded, share
one serving-state poll and never delay a shutdown. The Python reader's ``watch`` is the
same as an iterator. HTTP: a weak ETag from the audience digest, HEAD, ``*``, 405 with
``Allow``, invalid UTF-8 ids, a vanished store, a busy port and no outside docs assets.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from domain.identity import Audience
from ledger.api import Store
from ledger.http.app import create_app
from ledger.http.watch import WatchHub
from projections.reader import CatalogReader
from tests.support.cli_inprocess import cli_json
from tests.support.cli_support import ServedStore
from tests.support.gitrepo import sales as sales_pack
from tests.support.gitrepo import sales_closure
from tests.support.lifecycle_support import World

A, B = "integration:erp-sync", "app:crm"


def _release(world: World, commit: str, a_cred: str = "erp-prod", b_cred: str = "erp-test") -> None:
    """Publish the sales pack with A's and B's closures, each with its credential set."""
    world.service.apply(
        world.manifest(
            [world.official("sales", commit)],
            sales_closure(A, a_cred) + sales_closure(B, b_cred),
        )
    )


@pytest.fixture
def served(world: World) -> Iterator[tuple[World, str, ServedStore]]:
    commit = world.release({"sales/pack.json": sales_pack(1, stamp_all=True, ping=True)})
    _release(world, commit)
    server = ServedStore(world.url)
    yield world, commit, server
    server.close()


def _path(audience: str) -> str:
    kind, _, ident = audience.partition(":")
    return f"/v1/audiences/{kind}/{ident}/view"


class _Later:
    """A request made in a thread (a waiting watch), with its answer and duration."""

    def __init__(self, server: ServedStore, path: str, **kwargs: Any) -> None:
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0

        def run() -> None:
            started = time.monotonic()
            try:
                with httpx.Client(base_url=server.base, timeout=60) as http:
                    self.response = http.get(path, **kwargs)
            except BaseException as exc:  # reported by the test
                self.error = exc
            self.seconds = time.monotonic() - started

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def result(self, timeout: float = 30) -> httpx.Response:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the request did not end"
        assert self.error is None, self.error
        assert self.response is not None
        return self.response


def _waiting(server: ServedStore, count: int) -> None:
    """Until ``count`` watches wait (the server's own gauge), or fail after 60 s."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = server.client.get("/metrics").text
        for line in text.splitlines():
            if line.startswith("catalog_ledger_http_watchers ") and float(line.split()[1]) >= count:
                return
        time.sleep(0.05)
    raise AssertionError(f"{count} watchers never waited")


# -- watch ---------------------------------------------------------------------------------------


def test_r18_watch_answers_as_soon_as_the_audiences_own_content_changes(
    served: tuple[World, str, ServedStore],
) -> None:
    world, commit, server = served
    first = server.client.get(_path(A))
    etag = first.headers["etag"]
    later = _Later(server, _path(A), params={"wait": 60}, headers={"If-None-Match": etag})
    _waiting(server, 1)
    _release(world, commit, a_cred="erp-test")  # A's own grants change
    answer = later.result()
    assert answer.status_code == 200
    assert answer.headers["etag"] != etag
    assert answer.json()["revision"] == first.json()["revision"] + 1
    assert answer.json()["audience_digest"] == answer.headers["etag"][3:-1]
    assert later.seconds < 30  # woken by the change, long before its wait ended


def test_r18_a_publication_for_other_audiences_only_does_not_wake_a_watch(
    served: tuple[World, str, ServedStore],
) -> None:
    world, commit, server = served
    etag = server.client.get(_path(A)).headers["etag"]
    later = _Later(server, _path(A), params={"wait": 2}, headers={"If-None-Match": etag})
    _waiting(server, 1)
    _release(world, commit, b_cred="erp-prod")  # B changes, A does not
    answer = later.result()
    assert (answer.status_code, answer.headers["etag"]) == (304, etag)
    assert later.seconds >= 1.9  # it waited its whole wait
    # The revision moved, A's content did not: the same validator still confirms it.
    assert server.client.get(_path(B)).json()["revision"] == 2
    again = server.client.get(_path(A), headers={"If-None-Match": etag})
    assert again.status_code == 304


def test_r18_watch_without_a_validator_answers_at_once_and_wait_is_checked(
    served: tuple[World, str, ServedStore],
) -> None:
    _, _, server = served
    started = time.monotonic()
    assert server.client.get(_path(A), params={"wait": 300}).status_code == 200
    stale = server.client.get(_path(A), params={"wait": 300}, headers={"If-None-Match": '"x"'})
    assert stale.status_code == 200  # a validator that does not match: the view at once
    assert time.monotonic() - started < 120  # not the 300 s of a wait
    for bad in ("0", "301", "1.5", "-1", "soon", "١"):
        answer = server.client.get(_path(A), params={"wait": bad})
        assert answer.status_code == 400, bad
        assert answer.json()["error"] == "INVALID"
        assert answer.json()["details"]["field"] == "wait", bad


def test_r18_waiters_are_bounded_and_the_next_is_told_to_retry(world: World) -> None:
    commit = world.release({"sales/pack.json": sales_pack(1, stamp_all=True, ping=True)})
    _release(world, commit)
    server = ServedStore(world.url, serve_options=["--max-waiters", "1"])
    try:
        etag = server.client.get(_path(A)).headers["etag"]
        headers = {"If-None-Match": etag}
        # The first waits far longer than the test can take, so it is surely still
        # waiting when the second arrives; a change of A's own content then ends it.
        first = _Later(server, _path(A), params={"wait": 300}, headers=headers)
        _waiting(server, 1)
        refused = server.client.get(_path(A), params={"wait": 3}, headers=headers)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"] == "UNAVAILABLE"
        assert refused.json()["details"]["max_waiters"] == 1
        _release(world, commit, a_cred="erp-test")
        assert first.result().status_code == 200
    finally:
        server.close()


def test_r18_waiting_watches_do_not_delay_a_shutdown(
    served: tuple[World, str, ServedStore],
) -> None:
    _, _, server = served
    etag = server.client.get(_path(A)).headers["etag"]
    later = _Later(server, _path(A), params={"wait": 300}, headers={"If-None-Match": etag})
    _waiting(server, 1)
    started = time.monotonic()
    server.proc.terminate()
    server.proc.wait(timeout=150)
    assert time.monotonic() - started < 120  # not the 300 s of the wait
    assert later.result().status_code == 304


def test_r18_waiters_share_one_state_poll_and_read_no_view_while_nothing_changes(
    world: World,
) -> None:
    """50 waiters on 10 audiences through 12 polls (a counted clock, not real time):
    exactly one serving-state read per poll, not one per waiter per poll, and no view
    read, since nothing moved. Closing the hub after the 12th read answers every
    waiter with nothing changed."""
    commit = world.release({"sales/pack.json": sales_pack(1, stamp_all=True, ping=True)})
    _release(world, commit)
    reader = CatalogReader(world.db)
    view, state = reader.view_at(Audience.parse(A))
    polls = 12

    async def main() -> tuple[WatchHub, int]:
        slept = 0

        async def sleep(seconds: float) -> None:
            nonlocal slept
            assert seconds == 0.05
            slept += 1
            await asyncio.sleep(0)
            if slept > polls:
                hub.close()

        hub = WatchHub(reader, poll=0.05, sleep=sleep)
        audiences = [Audience.parse(f"app:w{n}") for n in range(10)] * 5
        etags = frozenset({view.etag.removeprefix("W/")})  # as If-None-Match is read
        outcomes = await asyncio.gather(*(hub.wait(a, etags, 60, state) for a in audiences))
        assert outcomes == [None] * 50
        return hub, slept

    hub, slept = asyncio.run(main())
    assert slept == polls + 1
    assert hub.state_reads == polls
    assert hub.view_reads == 0


def test_r18_reader_watch_yields_only_when_the_audiences_own_content_changes(
    world: World,
) -> None:
    commit = world.release({"sales/pack.json": sales_pack(1, stamp_all=True, ping=True)})
    _release(world, commit)
    steps: Iterator[Any] = iter(
        [
            lambda: _release(world, commit, b_cred="erp-prod"),  # others only: nothing
            lambda: None,  # nothing at all
            lambda: _release(world, commit, a_cred="erp-test", b_cred="erp-prod"),  # A's own
        ]
    )

    class Done(Exception):
        pass

    def sleep(_: float) -> None:
        step = next(steps, None)
        if step is None:
            raise Done
        step()

    reader = CatalogReader(world.db)
    seen = []
    with pytest.raises(Done):
        for view in reader.watch(Audience.parse(A), sleep=sleep):
            seen.append((view.revision, view.audience_digest))
    assert [revision for revision, _ in seen] == [1, 3]
    assert seen[0][1] != seen[1][1]


# -- HTTP correctness ---------------------------------------------------------------------------


def test_r19_an_etag_never_confirms_a_body_of_other_content(
    served: tuple[World, str, ServedStore],
) -> None:
    """Revisions 1 and 3 have one content digest and different bodies (the revision):
    the weak validator names A's content, so it confirms exactly that content."""
    world, commit, server = served
    r1 = server.client.get(_path(A))
    _release(world, commit, a_cred="erp-test")
    r2 = server.client.get(_path(A))
    _release(world, commit)  # back to revision 1's content
    r3 = server.client.get(_path(A))
    assert r1.json()["content_digest"] == r3.json()["content_digest"]
    assert r1.content != r3.content and r1.json()["revision"] == 1 and r3.json()["revision"] == 3
    assert r1.headers["etag"].startswith('W/"') and r1.headers["etag"] == r3.headers["etag"]
    assert r2.headers["etag"] != r1.headers["etag"]
    assert (
        server.client.get(_path(A), headers={"If-None-Match": r2.headers["etag"]}).status_code
        == 200
    )
    confirmed = server.client.get(_path(A), headers={"If-None-Match": r1.headers["etag"]})
    assert (confirmed.status_code, confirmed.content) == (304, b"")


def test_r19_head_star_and_method_not_allowed(served: tuple[World, str, ServedStore]) -> None:
    _, _, server = served
    got = server.client.get(_path(A))
    head = server.client.head(_path(A))
    assert head.status_code == 200 and head.content == b""
    assert head.headers["etag"] == got.headers["etag"]
    assert head.headers["content-length"] == str(len(got.content))
    assert server.client.get(_path(A), headers={"If-None-Match": "*"}).status_code == 304
    unknown = server.client.get(_path("app:never-seen"), headers={"If-None-Match": "*"})
    assert unknown.status_code == 404  # `*` matches a view that exists, nothing else
    posted = server.client.post(_path(A))
    assert posted.status_code == 405
    assert posted.headers["allow"] == "GET, HEAD"
    assert posted.json()["error"] == "INVALID"


def test_r1_invalid_utf8_in_a_path_id_is_invalid_naming_the_id(
    served: tuple[World, str, ServedStore],
) -> None:
    _, _, server = served
    for raw in ("erp%FF", "%C3%28", "%ED%A0%80x"):  # a lone byte, a bad pair, a surrogate
        answer = server.client.get(f"/v1/audiences/integration/{raw}/view")
        assert answer.status_code == 400, raw
        assert answer.json()["details"] == {"field": "audience.id", "part": "id"}, raw
    # U+FFFD itself is a character like any other: a valid id, unknown here.
    assert server.client.get("/v1/audiences/integration/a%EF%BF%BD/view").status_code == 404
    # A bad kind is still judged first.
    bad_kind = server.client.get("/v1/audiences/robot/%FF/view")
    assert bad_kind.json()["details"]["field"] == "audience.kind"


def test_r19_a_store_that_disappeared_is_unavailable(engine_url: str, tmp_path: Path) -> None:
    store = Store(engine_url)
    store.init()
    store.close()
    server = ServedStore(engine_url)
    try:
        assert server.client.get("/healthz").status_code == 200
        if engine_url.startswith("sqlite"):
            file = Path(engine_url.removeprefix("sqlite:///"))
            for leftover in [file, *file.parent.glob(file.name + "-*")]:
                os.remove(leftover)
        else:
            from bench.common import mysql_connect

            name = engine_url.rsplit("/", 1)[1].split("?", maxsplit=1)[0]
            with mysql_connect(engine_url) as conn, conn.cursor() as cur:
                cur.execute(f"DROP DATABASE {name}")
                cur.execute(f"CREATE DATABASE {name}")  # empty again, for the fixture
        for path in ("/healthz", "/v1/catalog/head"):
            answer = server.client.get(path)
            assert answer.status_code == 503, (path, answer.text)
            assert answer.json()["error"] == "UNAVAILABLE"
    finally:
        server.close()


def test_r19_a_busy_port_is_unavailable_exit_1(sqlite_url: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, body = cli_json("--db", sqlite_url, "serve", "--no-auth", "--port", str(port))
    assert code == 1
    assert body["error"] == "UNAVAILABLE"
    assert body["details"] == {"host": "127.0.0.1", "port": port}


def test_r19_no_docs_page_unless_asked_and_none_loads_outside_assets() -> None:
    plain = TestClient(create_app())
    for path in ("/docs", "/redoc"):
        assert plain.get(path).status_code == 404
    assert plain.get("/openapi.json").status_code == 200
    page = TestClient(create_app(docs=True)).get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/v1/audiences/{kind}/{audience_id}/view" in page.text
    assert "<script" not in page.text and "http://" not in page.text
    assert "https://" not in page.text and "<link" not in page.text


def test_r19_serve_connections_run_with_nagle_off_on_a_protocol_0_listener() -> None:
    """``serve --workers N`` listens on a socket uvicorn binds with protocol 0, on whose
    connections asyncio leaves Nagle on (a 40 ms delayed-ACK stall per response): the
    protocol ``serve`` runs turns it off. uvicorn's own protocol is the control."""
    from uvicorn.config import Config
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.server import ServerState

    from ledger.http.protocol import NoDelayH11Protocol

    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    async def nodelay_of(protocol: type[H11Protocol]) -> int:
        config = Config(app, log_config=None)
        config.load()
        seen: list[int] = []

        class Probe(protocol):  # type: ignore[valid-type,misc]
            def connection_made(self, transport: Any) -> None:
                super().connection_made(transport)
                sock = transport.get_extra_info("socket")
                seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        listener = socket.socket(socket.AF_INET)  # protocol 0, as uvicorn --workers binds
        listener.bind(("127.0.0.1", 0))
        state = ServerState()
        server = await asyncio.get_running_loop().create_server(
            lambda: Probe(config=config, server_state=state, app_state={}), sock=listener
        )
        _, writer = await asyncio.open_connection(*listener.getsockname())
        for _ in range(200):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
        server.close()
        return seen[0]

    assert asyncio.run(nodelay_of(NoDelayH11Protocol)) != 0
    assert asyncio.run(nodelay_of(H11Protocol)) == 0  # the stall this protocol removes


def test_r18_a_cached_view_is_never_served_past_a_commit_of_any_connection(
    world: World,
) -> None:
    """The reader reuses a verified view only while the serving state is unchanged, and
    (SQLite) reuses the state itself only while no other connection has committed: a
    release by this process's writer or by another process is seen by the next read."""
    commit = world.release({"sales/pack.json": sales_pack(1, stamp_all=True, ping=True)})
    _release(world, commit)
    reader = CatalogReader(world.db)
    first = reader.view(Audience.parse(A))
    assert reader.view(Audience.parse(A)) is first  # unchanged: the kept view
    _release(world, commit, a_cred="erp-test")  # this process, its write connection
    second = reader.view(Audience.parse(A))
    assert (second.revision, second.audience_digest != first.audience_digest) == (2, True)
    manifest = world.manifest(
        [world.official("sales", commit)], sales_closure(A) + sales_closure(B, "erp-test")
    )
    code, _ = cli_json("--db", world.url, "apply", str(manifest))  # another Store
    assert code == 0
    third = reader.view(Audience.parse(A))
    assert third.revision == 3 and third.audience_digest == first.audience_digest
    statements: list[str] = []
    real = world.db.query

    def counted(sql: str, params: Any = ()) -> list[Any]:
        statements.append(sql)
        return real(sql, params)

    world.db.query = counted  # type: ignore[method-assign]
    try:
        assert reader.view(Audience.parse(A)) is third
    finally:
        del world.db.query
    if world.db.is_sqlite:  # nothing committed since: not even the state statement ran
        assert statements == []
    else:
        assert len(statements) == 1
