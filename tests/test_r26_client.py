"""The runtime client (``ledger.client.CatalogClient``) against a started server (R18, R19, R26).

It returns what the local reader returns, keeps an ETag cache, raises the reader's
typed errors, never returns cached content after MISSING, INTEGRITY or 401, and retries
UNAVAILABLE only, with jittered backoff, up to a bounded total.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from domain.errors import InvalidInput, Missing, Stale, Unauthenticated, Unavailable
from domain.identity import Audience
from ledger.client import CatalogClient
from projections.reader import CatalogReader
from tests.cli_support import ServedStore, free_port
from tests.gitrepo import sales as sales_pack
from tests.gitrepo import sales_closure
from tests.lifecycle_support import World

A, B = "integration:erp-sync", "app:crm"


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
        assert first == CatalogReader(world.db).view(Audience.parse(A))
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
