"""R29: the runtime client with a trust policy — what it asks, keeps and refuses.

The server side is an in-memory catalog log (``tests.support.bundles``) answering the
view route through ``httpx.MockTransport``: the client's real HTTP code, parameters and
state file, no store (the store's own bundles are tested against a real ``serve`` in
the end-to-end tests). Each test checks the exact error and that nothing moved: no
cached view, the same accepted state, the same state file bytes.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from domain.bundle import Accepted
from domain.errors import IntegrityFailure, InvalidInput, LedgerError, Stale
from ledger.client import CatalogClient, load_trust
from tests.support.bundles import NOW, CatalogLog, make_view

APP = "app:shop"
PATH = "/v1/audiences/app/shop/view"


@dataclass
class Served:
    """What the fake server answers: the view of ``revision`` under the checkpoint of
    ``size`` (defaults: the latest), optionally with a replaced view or note."""

    log: CatalogLog
    size: int | None = None
    revision: int | None = None
    note: str | None = None
    view: Any = None
    asked: list[dict[str, str]] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        self.asked.append(params)
        assert request.url.path == PATH
        size = len(self.log.revisions) if self.size is None else self.size
        revision = size if self.revision is None else self.revision
        view = self.view or self.log.revisions[revision - 1].views[APP]
        body = view.to_json()
        headers = {"ETag": view.etag}
        if params.get("proof") == "1":
            headers = {}  # as serve: a proven view is never revalidated, so has no ETag
            since = int(params["since_size"]) if "since_size" in params else None
            if since is not None and since > size:
                since = None  # as serve: no proof from beyond its size (LOG-FORMAT)
            body["proof"] = self.log.bundle(
                APP, revision=revision, size=size, since_size=since, note=self.note
            )
        return httpx.Response(200, content=orjson.dumps(body), headers=headers)


@pytest.fixture
def log() -> CatalogLog:
    log = CatalogLog()
    for n in range(1, 4):
        log.publish({APP: {"n": n}, "app:other": {"n": -n}})
    return log


@pytest.fixture
def served(log: CatalogLog) -> Served:
    return Served(log)


def client(served: Served, state: Path | None = None, **kwargs: Any) -> CatalogClient:
    return CatalogClient(
        "http://catalog.test",
        transport=httpx.MockTransport(served.handle),
        trust=served.log.policy(),
        state_file=state,
        clock=lambda: NOW,
        **kwargs,
    )


def test_r29_client_proves_views_and_asks_from_the_size_it_accepted(served: Served) -> None:
    served.size = 1
    with client(served) as c:
        assert c.view(APP).revision == 1
        assert served.asked[-1] == {"proof": "1"}
        assert c.accepted == Accepted(1, served.log.checkpoint(1).root, 1)
        served.size = 3
        assert c.view(APP).revision == 3
        assert served.asked[-1] == {"proof": "1", "since_size": "1"}
        assert c.accepted == Accepted(3, served.log.checkpoint().root, 3)


def test_r29_client_state_file_persists_across_clients(served: Served, tmp_path: Path) -> None:
    state = tmp_path / "catalog-state.json"
    served.size = 2
    with client(served, state) as c:
        c.view(APP)
    document = orjson.loads(state.read_bytes())
    assert document["size"] == 2 and document["origin"] == served.log.origin
    assert [p.name for p in tmp_path.iterdir()] == ["catalog-state.json"]  # no temp left
    served.size = None
    with client(served, state) as c:
        assert c.accepted == Accepted(2, served.log.checkpoint(2).root, 2)
        c.view(APP)
        assert served.asked[-1] == {"proof": "1", "since_size": "2"}
    assert orjson.loads(state.read_bytes())["size"] == 3
    # A later client served the older head (a lagging replica) refuses it: STALE, in
    # one request (the server proves its smaller head, with no consistency proof).
    served.size = 2
    asked = len(served.asked)
    with client(served, state) as c, pytest.raises(Stale) as caught:
        c.view(APP)
    assert caught.value.details == {"axis": "checkpoint", "required": 3, "served": 2}
    assert orjson.loads(state.read_bytes())["size"] == 3
    assert served.asked[asked:] == [{"proof": "1", "since_size": "3"}]


@pytest.mark.parametrize(
    ("content", "field"),
    [
        (b"", "$"),
        (b"{not json", "$"),
        (b'{"format": 1, "origin": "elsewhere/catalog", "size": 1, "revision": 1}', "origin"),
        (None, "size"),
    ],
)
def test_r29_client_refuses_a_state_file_that_does_not_parse(
    served: Served, tmp_path: Path, content: bytes | None, field: str
) -> None:
    state = tmp_path / "state.json"
    if content is None:
        document = Accepted(2, bytes(32), 2).to_json(served.log.origin) | {"size": "2"}
        content = orjson.dumps(document)
    state.write_bytes(content)
    with pytest.raises(IntegrityFailure) as caught:
        client(served, state)
    assert caught.value.details == {"reason": "bad_state", "field": field}
    assert state.read_bytes() == content  # never silently reset


def test_r29_client_keeps_nothing_after_integrity_or_stale(served: Served, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    served.size = 2
    with client(served, state) as c:
        c.view(APP)
        kept, before = c.accepted, state.read_bytes()
        served.size = None
        too_few = "too_few_cosignatures"
        honest = served.log.revisions[2].views[APP]
        altered = replace(honest, facts=[honest.facts[0] | {"payload": {"n": "evil"}}])
        cases: list[tuple[dict[str, Any], type[LedgerError], str]] = [
            ({"view": altered}, IntegrityFailure, "bad_fact_digest"),
            ({"view": make_view(APP, 3, {"n": "evil"})}, IntegrityFailure, "bad_audience_proof"),
            ({"note": served.log.note(times=[NOW, None, None])}, IntegrityFailure, too_few),
            ({"note": served.log.note(times=[NOW - 7200] * 3)}, Stale, "freshness"),
        ]
        for change, error, reason in cases:
            served.view, served.note = change.get("view"), change.get("note")
            with pytest.raises(error) as caught:
                c.view(APP)
            got = caught.value.details.get("reason") or caught.value.details.get("axis")
            assert got == reason
            assert c.accepted == kept and state.read_bytes() == before
            assert APP not in c._cache  # nothing cached for that audience
        served.view = served.note = None
        assert c.view(APP).revision == 3


def test_r29_client_watch_proves_every_view_and_ends_stale_on_a_frozen_head(
    served: Served,
) -> None:
    clock = [float(NOW)]
    served.size = 2
    c = CatalogClient(
        "http://catalog.test",
        transport=httpx.MockTransport(served.handle),
        trust=served.log.policy(),
        clock=lambda: clock[0],
        sleep=lambda _: None,
    )
    views: Iterator[Any] = c.watch(APP, wait=1)
    assert next(views).revision == 2
    served.size = None
    assert next(views).revision == 3
    proven = [p for p in served.asked if p.get("proof") == "1"]
    assert proven[-1] == {"proof": "1", "since_size": "2"}
    clock[0] += 3601  # nobody re-cosigned for longer than the maximum age
    with pytest.raises(Stale) as caught:
        next(views)
    assert caught.value.details["axis"] == "freshness"
    c.close()


def test_r29_client_loads_its_trust_policy_from_a_file(log: CatalogLog, tmp_path: Path) -> None:
    path = tmp_path / "trust.json"
    path.write_bytes(orjson.dumps(log.policy_json(threshold=3)))
    assert load_trust(path) == log.policy(threshold=3)
    document = log.policy_json()
    document["witnesses"][1]["key"] = base64.b64encode(b"junk").decode()
    path.write_bytes(orjson.dumps(document))
    with pytest.raises(InvalidInput) as caught:
        load_trust(path)
    assert caught.value.field == "witnesses[1].key"
    path.write_bytes(b"{")
    with pytest.raises(InvalidInput) as caught:
        load_trust(path)
    assert caught.value.field == "$"
