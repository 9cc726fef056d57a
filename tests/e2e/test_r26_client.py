"""The runtime client (``ledger.client.CatalogClient``) against a started server (R18, R19, R26).

It returns what the local reader returns, keeps an ETag cache, raises the reader's
typed errors, never returns cached content after MISSING, INTEGRITY or 401, and retries
UNAVAILABLE only, with jittered backoff honouring ``Retry-After``, up to a bounded total.
Behind a tampering proxy (``tests/support/http_proxy.py``: real sockets, the real server) it
recomputes every fact digest and the audience digest, checks the audience and the
revision asked for, raises INTEGRITY and caches nothing; its watch never spins.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from email.utils import formatdate
from pathlib import Path
from typing import Any

import httpx
import pytest

from domain.errors import (
    IntegrityFailure,
    InvalidInput,
    Missing,
    Stale,
    Unauthenticated,
    Unavailable,
)
from domain.identity import Audience
from ledger.client import CatalogClient
from projections.reader import CatalogReader
from tests.support.cli_support import ServedStore, free_port
from tests.support.gitrepo import sales as sales_pack
from tests.support.gitrepo import sales_closure
from tests.support.http_proxy import TamperingProxy
from tests.support.lifecycle_support import World

A, B = "integration:erp-sync", "app:crm"
ROOT = Path(__file__).resolve().parents[2]
#: For what concerns the network path, not the database: one engine keeps them fast (the
#: tampering test and the reader's payload hashes run on every engine).
ON_SQLITE = pytest.mark.parametrize("engine_url", ["sqlite"], indirect=True)


class Recording(httpx.HTTPTransport):
    """Records the status of every response the client received."""

    def __init__(self) -> None:
        super().__init__()
        self.statuses: list[int] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.statuses.append(response.status_code)
        return response


def _release(world: World, commit: str, a: str | None = "erp-prod", b: str = "erp-test") -> None:
    bindings = sales_closure(B, b) + (sales_closure(A, a) if a is not None else [])
    world.service.apply(world.manifest([world.official("sales", commit)], bindings))


@pytest.fixture
def served(world: World) -> Iterator[tuple[World, str, ServedStore, dict[str, Any]]]:
    commit = world.release({"sales/pack.json": sales_pack(1, stamp_all=True, ping=True)})
    _release(world, commit)
    issued = world.service.credentials_issue(A)
    server = ServedStore(world.url, auth=True)
    yield world, commit, server, dict(issued)
    server.close()


def test_r18_client_view_is_the_readers_view_and_revalidates_by_etag(
    served: tuple[World, str, ServedStore, dict[str, Any]],
) -> None:
    world, _, server, issued = served
    transport = Recording()
    with CatalogClient(server.base, token=issued["token"], transport=transport) as client:
        first = client.view(A)
        # The reader's fields, the payload hashes included (the client's view type is the
        # pure ``domain.served.AudienceView``: no server stack in a runtime).
        assert first.to_json() == CatalogReader(world.db).view(Audience.parse(A)).to_json()
        assert first.content_digest_verified is False
        again = client.view(A)
        assert again is first  # the kept view, confirmed by a 304
        assert transport.statuses == [200, 304]
        head = client.head()
        assert (head.revision, head.content_digest) == (first.revision, first.content_digest)
        with pytest.raises(Stale) as stale:
            client.view(A, min_revision=first.revision + 1)
        assert stale.value.details["required_revision"] == first.revision + 1
        assert transport.statuses[-1] == 409  # asked afresh, not confirmed from the cache
        with pytest.raises(InvalidInput):
            client.view("integration: spaced")


def test_r19_client_fails_closed_after_missing_and_never_returns_the_cache(
    served: tuple[World, str, ServedStore, dict[str, Any]],
) -> None:
    world, commit, server, issued = served
    with CatalogClient(server.base, token=issued["token"]) as client:
        assert client.view(A).facts
        _release(world, commit, a=None)  # A's grants are gone
        with pytest.raises(Missing):
            client.view(A)
        with pytest.raises(Missing):  # and again: nothing cached comes back
            client.view(A)
        # Another audience than the token's is MISSING too (R19), never B's content.
        with pytest.raises(Missing):
            client.view(B)


def test_r26_client_after_a_revocation_raises_401_and_drops_its_cache(
    served: tuple[World, str, ServedStore, dict[str, Any]],
) -> None:
    world, _, server, issued = served
    transport = Recording()
    with CatalogClient(server.base, token=issued["token"], transport=transport) as client:
        client.view(A)
        world.service.credentials_revoke(issued["credential_id"])
        deadline = time.monotonic() + 60
        with pytest.raises(Unauthenticated):
            while time.monotonic() < deadline:  # the server re-reads credentials each second
                client.view(A)
                time.sleep(0.2)
        assert transport.statuses[-1] == 401
        with pytest.raises(Unauthenticated):
            client.view(A)
        assert client._cache == {}


def test_r19_client_retries_unavailable_only_with_jittered_backoff_up_to_a_bound() -> None:
    clock = [0.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock[0] += seconds

    client = CatalogClient(
        f"http://127.0.0.1:{free_port()}",  # nobody listens: UNAVAILABLE every time
        token="x",
        retry_total=2.0,
        retry_base=0.1,
        retry_cap=1.0,
        sleep=sleep,
        monotonic=lambda: clock[0],
        jitter=lambda: 0.5,
    )
    with client, pytest.raises(Unavailable):
        client.view(A)
    # Full jitter of 0.1 * 2^n capped at 1 s, stopping before the 2 s total is spent.
    assert sleeps == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]
    assert client.requests == 7 and client.retries == 6
    assert sum(sleeps) <= 2.0


def test_r19_client_does_not_retry_what_is_not_unavailable(
    served: tuple[World, str, ServedStore, dict[str, Any]],
) -> None:
    _, _, server, issued = served
    slept: list[float] = []
    with CatalogClient(server.base, token=issued["token"], sleep=slept.append) as client:
        with pytest.raises(Missing):
            client.view("app:never-seen")
        with pytest.raises(Unauthenticated):
            CatalogClient(server.base, token="not-a-token", sleep=slept.append).view(A)
        assert client.requests == 1 and slept == []


def test_r18_client_watch_yields_when_the_audiences_content_changes(
    served: tuple[World, str, ServedStore, dict[str, Any]],
) -> None:
    world, commit, server, issued = served
    with CatalogClient(server.base, token=issued["token"]) as client:
        watching = client.watch(A, wait=30)
        first = next(watching)
        _release(world, commit, a="erp-test")
        started = time.monotonic()
        second = next(watching)
        assert time.monotonic() - started < 20
        assert second.audience_digest != first.audience_digest
        assert second.revision == first.revision + 1


# -- 24.6: the client verifies everything it can ------------------------------------------


def _first_fact(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], Any]:
    def rewrite(body: dict[str, Any]) -> dict[str, Any]:
        change(body["facts"][0])
        return body

    return rewrite


def _other_requires(fact: dict[str, Any]) -> None:
    fact["requires"] = fact["requires"][:-1] or [{"kind": "x", "key": "y", "pack": None}]


def _other_credential_sets(fact: dict[str, Any]) -> None:
    fact["credential_sets"] = None if fact["credential_sets"] else ["stolen"]


def _other_grant(body: dict[str, Any]) -> dict[str, Any]:
    body["grants"][0]["credential_set"] = "stolen"
    return body


#: Each rewrite a middlebox that does not recompute digests might make, and the JSON
#: path and the message fragment the client's INTEGRITY names.
TAMPERING: dict[str, tuple[Callable[[dict[str, Any]], Any], str, str]] = {
    "payload": (
        _first_fact(lambda f: f.update(payload={"endpoint": "https://attacker.example"})),
        "$.facts[0]",
        "does not match its fact digest",
    ),
    "requires": (_first_fact(_other_requires), "$.facts[0]", "does not match its fact digest"),
    "credential_sets": (
        _first_fact(_other_credential_sets),
        "$.facts[0]",
        "does not match its fact digest",
    ),
    "payload_hash": (
        _first_fact(lambda f: f.update(payload_hash="v1:" + "0" * 64)),
        "$.facts[0]",
        "does not match its fact digest",
    ),
    "fact_digest": (
        _first_fact(lambda f: f.update(fact_digest="0" * 64)),
        "$.facts[0]",
        "does not match its fact digest",
    ),
    "grant": (_other_grant, "$.audience_digest", "do not match $.audience_digest"),
    "float": (
        _first_fact(lambda f: f.update(payload=1.5)),
        "$.facts[0]",
        "is not canonical JSON",
    ),
}


def test_r26_client_recomputes_every_digest_and_refuses_each_tampered_view(
    served: tuple[World, str, ServedStore, dict[str, Any]],
) -> None:
    world, _, server, issued = served
    expected = CatalogReader(world.db).view(Audience.parse(A)).to_json()
    assert all(f["payload_hash"].startswith("v1:") for f in expected["facts"])
    with TamperingProxy(server.base) as proxy:
        with CatalogClient(proxy.base, token=issued["token"]) as honest:
            assert honest.view(A).to_json() == expected  # the proxy itself is transparent
        for alteration, (rewrite, field, fragment) in TAMPERING.items():
            proxy.rewrite, before = rewrite, proxy.tampered
            with CatalogClient(proxy.base, token=issued["token"]) as client:
                with pytest.raises(IntegrityFailure) as failure:
                    client.view(A)
                assert proxy.tampered == before + 1, alteration
                assert fragment in failure.value.message, alteration
                assert failure.value.details["field"] == field, alteration
                assert failure.value.code == "INTEGRITY"
                assert client._cache == {}, alteration  # nothing tampered is kept


@ON_SQLITE
def test_r26_client_drops_its_verified_view_when_a_tampered_one_follows(
    served: tuple[World, str, ServedStore, dict[str, Any]],
) -> None:
    world, commit, server, issued = served
    with (
        TamperingProxy(server.base) as proxy,
        CatalogClient(proxy.base, token=issued["token"]) as client,
    ):
        good = client.view(A)
        _release(world, commit, a="erp-test")  # A's content moves: a 200, not a 304
        proxy.rewrite = TAMPERING["payload"][0]
        with pytest.raises(IntegrityFailure):
            client.view(A)
        assert client._cache == {}
        proxy.rewrite = None
        fresh = client.view(A)
        assert fresh.revision == good.revision + 1
        assert fresh.audience_digest != good.audience_digest


@ON_SQLITE
def test_r26_client_refuses_a_200_below_the_min_revision_it_asked_for(
    served: tuple[World, str, ServedStore, dict[str, Any]],
) -> None:
    _, _, server, issued = served
    with TamperingProxy(server.base) as proxy:
        with CatalogClient(proxy.base, token=issued["token"]) as client:
            current = client.view(A).revision
        # The proxy drops min_revision: the server answers 200 at the current revision.
        proxy.drop_params = frozenset({"min_revision"})
        with CatalogClient(proxy.base, token=issued["token"]) as client:
            with pytest.raises(IntegrityFailure) as failure:
                client.view(A, min_revision=current + 1)
            assert failure.value.details["field"] == "$.revision"
            assert f"below the min_revision {current + 1}" in failure.value.message
            assert client._cache == {}


@ON_SQLITE
def test_r26_client_refuses_another_audiences_view_and_caches_it_under_no_name(
    served: tuple[World, str, ServedStore, dict[str, Any]],
) -> None:
    world, _, server, issued = served
    other = dict(world.service.credentials_issue(B))

    def mixed_up(path: str, headers: dict[str, str]) -> tuple[str, dict[str, str]]:
        # A shared cache that mixes up tenants: B's genuine, self-consistent answer.
        path = path.replace("/integration/erp-sync/", "/app/crm/")
        return path, {**headers, "authorization": f"Bearer {other['token']}"}

    with (
        TamperingProxy(server.base) as proxy,
        CatalogClient(proxy.base, token=issued["token"]) as client,
    ):
        proxy.route = mixed_up
        with pytest.raises(IntegrityFailure) as failure:
            client.view(A)
        assert failure.value.details["field"] == "$.audience"
        assert "'app:crm', not the audience asked for 'integration:erp-sync'" in (
            failure.value.message
        )
        assert client._cache == {}
        proxy.route = None
        assert client.view(A).audience == A


# -- 25.3: the client under a misbehaving network ------------------------------------------


class _Stop(Exception):
    pass


def _watch_polls(base: str, token: str, proxy_setup: Callable[[TamperingProxy], None]) -> Any:
    """The pauses and requests of a watch behind a proxy set up by ``proxy_setup``, on an
    injected clock, stopped at the fifth pause."""
    clock, sleeps = [0.0], []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock[0] += seconds
        if len(sleeps) == 5:
            raise _Stop

    readings = [0]

    def monotonic() -> float:
        readings[0] += 1
        if readings[0] > 100:  # a client that spins fails here instead of hanging
            raise AssertionError(f"{readings[0]} clock readings without a pause: it spins")
        return clock[0]

    with TamperingProxy(base) as proxy:
        proxy_setup(proxy)
        client = CatalogClient(
            proxy.base, token=token, watch_interval=2.0, sleep=sleep, monotonic=monotonic
        )
        with client, pytest.raises(_Stop):
            for _ in client.watch(A, wait=30):
                pass
        return sleeps, proxy.requests


def _drop_validator(proxy: TamperingProxy) -> None:
    proxy.drop_headers = frozenset({"if-none-match"})  # 200 at once, the same content


def _drop_wait(proxy: TamperingProxy) -> None:
    proxy.drop_params = frozenset({"wait"})  # 304 at once instead of a long poll


@ON_SQLITE
def test_r18_client_watch_never_spins_when_polls_return_at_once_unchanged(
    served: tuple[World, str, ServedStore, dict[str, Any]],
) -> None:
    _, _, server, issued = served
    for setup in (_drop_validator, _drop_wait):
        sleeps, requests = _watch_polls(server.base, issued["token"], setup)
        # One view, then one poll per 2 s of (injected) time: never a tight loop.
        assert sleeps == [2.0] * 5, setup.__name__
        assert requests == 6, setup.__name__


@ON_SQLITE
def test_r19_client_honours_retry_after_of_429_and_503(
    served: tuple[World, str, ServedStore, dict[str, Any]],
) -> None:
    _, _, server, issued = served
    clock, sleeps = [1000.0], []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock[0] += seconds

    with (
        TamperingProxy(server.base) as proxy,
        CatalogClient(
            proxy.base,
            token=issued["token"],
            retry_total=30.0,
            sleep=sleep,
            monotonic=lambda: clock[0],
            jitter=lambda: 0.5,
        ) as client,
    ):
        proxy.refuse(429, "3")
        assert client.view(A).audience == A
        proxy.refuse(503, "7")
        assert client.view(A).audience == A
        assert sleeps == [3.0, 7.0]  # not the 0.05 s of the backoff
        proxy.refuse(503, formatdate(time.time() + 6, usegmt=True))  # an HTTP-date
        client.view(A)
        assert 4.0 <= sleeps[-1] <= 6.0
        # More than the retry budget: raised at once, without sleeping past the bound.
        proxy.refuse(503, "100")
        count = len(sleeps)
        with pytest.raises(Unavailable):
            client.view(A)
        assert len(sleeps) == count
        assert client.retries == 3


# -- 25.5: a runtime can install the client -------------------------------------------------


def test_r26_client_module_loads_no_server_stack() -> None:
    # A fresh interpreter: what importing the client loads (the full proof, in a venv
    # where these packages are absent, is .ci/client-install-check).
    probe = (
        "import sys, ledger.client; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'fastapi', 'uvicorn', "
        "'sqlalchemy', 'eventsourcing', 'pydantic', 'starlette', 'pymysql', 'projections'}))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert found.stdout.strip() == "[]"
