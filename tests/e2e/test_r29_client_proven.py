"""R29: the runtime client with a trust policy against a started ``catalog-ledger serve``.

The store's catalog checkpoints are cosigned by the collector (``Store.cosign``) through
in-process witnesses (``tests.support.witness_fakes``: the witnesses as real processes
are ``tests/e2e/test_r29_witness.py``'s point); the server is a real child process, the
client reads it over loopback with a credential (R26). It proves each view, keeps its
state in a file across client instances, and refuses a frozen head, a lagging one, a
state file that does not parse and a view re-digested by a proxy, keeping nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from domain.bundle import Accepted
from domain.errors import IntegrityFailure, Stale, Unavailable
from domain.identity import Audience
from domain.notes import SignerKey
from domain.served import audience_digest, fact_bytes, fact_digest
from ledger.api import open_store
from ledger.client import CatalogClient, load_trust
from projections.reader import CatalogReader
from tests.support.cli_support import ServedStore
from tests.support.gitrepo import push_closure
from tests.support.http_proxy import TamperingProxy
from tests.support.lifecycle_support import World
from tests.support.witness_fakes import Witnesses

A, B = "integration:a", "integration:b"
ON_SQLITE = pytest.mark.parametrize("engine_url", ["sqlite"], indirect=True)


def publish(world: World, version: int) -> None:
    world.service.apply(
        world.manifest(
            [world.official("sales", world.commit("sales", version))],
            push_closure(A, "sales") + push_closure(B, "sales", "erp-test"),
        )
    )


@dataclass
class Proven:
    world: World
    server: ServedStore
    token: str
    now: list[int]
    witnesses: Witnesses
    key: Path
    policy: Path
    state: Path

    def cosign(self) -> None:
        with open_store(self.world.url) as store:
            store.cosign(
                sign=self.key,
                policy=self.policy,
                add_checkpoint=self.witnesses.add_checkpoint,
                clock=self.witnesses.clock,
            )

    def client(self, base: str | None = None, **kwargs: Any) -> CatalogClient:
        return CatalogClient(
            base or self.server.base,
            token=self.token,
            trust=load_trust(self.policy),
            state_file=self.state,
            clock=lambda: self.now[0],
            **kwargs,
        )


@pytest.fixture
def proven(world: World, tmp_path: Path) -> Iterator[Proven]:
    publish(world, 1)
    signer = SignerKey.generate("log")
    key = tmp_path / "log.key"
    key.write_text(signer.text() + "\n", encoding="utf-8")
    now = [1_700_000_000]
    witnesses = Witnesses(now)
    with open_store(world.url) as store:
        origin = store.checkpoint(log="catalog")["origin"]
    policy = witnesses.policy(tmp_path / "policy.json", origin, signer)
    token = str(world.service.credentials_issue(A)["token"])
    server = ServedStore(world.url, auth=True)
    state = Proven(world, server, token, now, witnesses, key, policy, tmp_path / "state.json")
    state.cosign()
    yield state
    server.close()


def test_r29_client_proves_served_views_and_keeps_its_state_across_clients(
    proven: Proven,
) -> None:
    expected = CatalogReader(proven.world.db).view(Audience.parse(A)).to_json()
    with proven.client() as client:
        assert client.view(A).to_json() == expected  # the reader's view, proven
        assert client.accepted is not None and client.accepted.size == 1
    kept = orjson.loads(proven.state.read_bytes())
    assert kept["size"] == kept["revision"] == 1
    publish(proven.world, 2)
    # Not cosigned yet: the server cannot prove revision 2 (retried, then UNAVAILABLE).
    with proven.client(retry_total=0.2) as client, pytest.raises(Unavailable) as caught:
        client.view(A)
    assert caught.value.details["reason"] == "checkpoint_pending"
    assert orjson.loads(proven.state.read_bytes()) == kept
    proven.now[0] += 60
    proven.cosign()
    # A new client starts from the file and moves forward with a consistency proof.
    with proven.client() as client:
        assert client.accepted == Accepted.from_json(kept, kept["origin"])
        assert client.view(A).revision == 2
        assert client.accepted is not None and client.accepted.size == 2
    assert orjson.loads(proven.state.read_bytes())["size"] == 2


@ON_SQLITE
def test_r29_client_refuses_a_frozen_head_a_lagging_one_and_a_bad_state_file(
    proven: Proven,
) -> None:
    with proven.client() as client:
        client.view(A)
    good = proven.state.read_bytes()
    # Frozen: nobody re-cosigned for longer than the policy's maximum age.
    proven.now[0] += 3601
    with proven.client() as client, pytest.raises(Stale) as caught:
        client.view(A)
    assert caught.value.details["axis"] == "freshness"
    assert proven.state.read_bytes() == good
    proven.now[0] -= 3601
    # Lagging: this client already accepted a larger catalog log than the server's.
    ahead = orjson.loads(good) | {"size": 5, "revision": 5}
    proven.state.write_bytes(orjson.dumps(ahead))
    with proven.client() as client, pytest.raises(Stale) as caught:
        client.view(A)
    assert caught.value.details == {"axis": "checkpoint", "required": 5, "served": 1}
    assert orjson.loads(proven.state.read_bytes()) == ahead
    # A state file that does not parse is INTEGRITY, never a fresh start.
    proven.state.write_bytes(good[:-3])
    with pytest.raises(IntegrityFailure) as failure:
        proven.client()
    assert failure.value.details == {"reason": "bad_state", "field": "$"}
    assert proven.state.read_bytes() == good[:-3]


def _redigest_as(audience: str, payload: Any) -> Any:
    """A proxy's rewrite of the first fact's payload with every digest recomputed, as
    ``audience``'s view: each digest the plain client checks agrees (R26 alone cannot
    tell it from the truth)."""

    def rewrite(body: dict[str, Any]) -> dict[str, Any]:
        fact = body["facts"][0]
        fact["payload"] = payload
        stored = fact_bytes(
            fact["kind"], fact["key"], payload, fact["requires"], fact["credential_sets"]
        )
        fact["fact_digest"] = fact_digest(
            fact["pack"], fact["install_id"], fact["payload_hash"], stored
        ).hex()
        body["audience"] = audience
        grants = [  # in the order served: bytewise already
            [g["pack"], g["kind"], g["key"], g["credential_set"], g["install_id"]]
            for g in body["grants"]
        ]
        facts = [
            [f["pack"], f["install_id"], f["kind"], f["key"], f["fact_digest"]]
            for f in body["facts"]
        ]
        kind, _, ident = audience.partition(":")
        body["audience_digest"] = audience_digest((kind, ident), grants, facts)
        return body

    return rewrite


@ON_SQLITE
def test_r29_client_refuses_a_view_a_proxy_rewrote_and_redigested(
    proven: Proven,
) -> None:
    with proven.client() as client:
        client.view(A)
    good = proven.state.read_bytes()
    with TamperingProxy(proven.server.base) as proxy:
        proxy.rewrite = _redigest_as(A, {"endpoint": "https://attacker.example"})
        with proven.client(proxy.base) as client:
            with pytest.raises(IntegrityFailure) as caught:
                client.view(A)
            assert caught.value.details["reason"] == "bad_audience_proof"
            assert client._cache == {}
        assert proven.state.read_bytes() == good
