"""R29 (issue 28 item 6): a runtime learns the log's key rotation from the log, as k
witnesses cosigned it, and refuses the old key once the overlap is over.

The collector (``Store.cosign``) has the catalog log's and the main log's checkpoints
cosigned by three in-process witnesses (``tests.support.witness_fakes``, k = 2); the
server is a real ``catalog-ledger serve`` child process (``GET /v1/log/rotations``), the
client reads it over loopback with a credential. A rotation is appended by the operator's
path (``Store.rotate_key``: the statement signed by the old key); a forged one by the
store's own append (``record_rotation``), as a compromised server could.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from domain.errors import IntegrityFailure
from domain.key_rotation import PinnedKey, rotation_statement
from domain.notes import SignerKey
from ledger.api import open_store
from ledger.client import CatalogClient, load_trust
from ledger.store.log_identity import record_rotation
from tests.support.cli_support import ServedStore
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World
from tests.support.witness_fakes import Witnesses

A = "integration:a"
NOW = 1_700_000_000
OVERLAP = 3600


def publish(world: World, version: int) -> None:
    world.service.apply(
        world.manifest(
            [world.official("sales", world.commit("sales", version))], push_closure(A, "sales")
        )
    )


@dataclass
class Rotating:
    world: World
    server: ServedStore
    token: str
    now: list[int]
    witnesses: Witnesses
    tmp: Path
    old: SignerKey
    new: SignerKey

    def key_file(self, key: SignerKey) -> Path:
        path = self.tmp / f"{key.name}-{key.verifier.text().split('+')[1]}.key"
        path.write_text(key.text() + "\n", encoding="utf-8")
        return path

    def policy(self, name: str, *keys: SignerKey) -> Path:
        """A trust policy pinning ``keys`` (the first is the one ``witnesses.policy`` takes)."""
        path = self.witnesses.policy(self.tmp / name, self.origin, keys[0])
        document = orjson.loads(path.read_bytes())
        document["log_keys"] = [k.verifier.text() for k in keys]
        path.write_bytes(orjson.dumps(document))
        return path

    @property
    def origin(self) -> str:
        with open_store(self.world.url) as store:
            return str(store.checkpoint(log="catalog")["origin"])

    def cosign(self, *signers: SignerKey) -> dict[str, Any]:
        with open_store(self.world.url) as store:
            return dict(
                store.cosign(
                    sign=[self.key_file(k) for k in signers],
                    policy=self.policy("collector.json", self.old, self.new),
                    add_checkpoint=self.witnesses.add_checkpoint,
                    clock=lambda: self.now[0],
                )
            )

    def rotate(self) -> None:
        with open_store(self.world.url) as store:
            store.rotate_key(
                old=self.key_file(self.old), new=self.new.verifier.text(), overlap=OVERLAP,
                now=self.now[0],
            )  # fmt: skip

    def client(self, state: str = "state.json", **kwargs: Any) -> CatalogClient:
        return CatalogClient(
            self.server.base,
            token=self.token,
            trust=load_trust(self.policy("client.json", self.old)),  # pins the old key only
            state_file=self.tmp / state,
            clock=lambda: self.now[0],
            **kwargs,
        )


@pytest.fixture
def rotating(world: World, tmp_path: Path) -> Iterator[Rotating]:
    publish(world, 1)
    token = str(world.service.credentials_issue(A)["token"])
    now = [NOW]
    server = ServedStore(world.url, auth=True)
    state = Rotating(
        world, server, token, now, Witnesses(now), tmp_path,
        SignerKey.generate("log"), SignerKey.generate("log"),
    )  # fmt: skip
    state.cosign(state.old)
    yield state
    server.close()


def test_r29_a_client_pinned_to_the_old_key_learns_the_rotation_and_reads_the_new_keys_bundles(
    rotating: Rotating,
) -> None:
    with rotating.client() as client:
        client.view(A)
        assert client.log_keys == (PinnedKey(rotating.old.verifier),)
        assert client.refresh_keys() == (PinnedKey(rotating.old.verifier),)  # none yet
    rotating.rotate()
    # Not covered by a stored main-log note yet: 503 checkpoint_pending; a credential is
    # needed as for any runtime read (R26).
    route = f"{rotating.server.base}/v1/log/rotations"
    assert httpx.get(route).status_code == 401
    pending = httpx.get(route, headers={"Authorization": f"Bearer {rotating.token}"})
    assert (pending.status_code, pending.json()["details"]["reason"]) == (
        503,
        "checkpoint_pending",
    )
    rotating.now[0] += 60
    # During the overlap both keys sign; a client that sees the new key's line learns the
    # rotation from the log at once (the main-log note is signed by the key it pins).
    rotating.cosign(rotating.old, rotating.new)
    until = NOW + OVERLAP
    learned = (PinnedKey(rotating.old.verifier, until), PinnedKey(rotating.new.verifier))
    with rotating.client() as client:
        client.view(A)
        assert client.log_keys == learned
    kept = orjson.loads((rotating.tmp / "state.json").read_bytes())
    assert kept["log_keys"] == [
        {"key": rotating.old.verifier.text(), "until": until},
        {"key": rotating.new.verifier.text(), "until": None},
    ]
    # The collector drops the old key: a restarted client remembers the new one.
    rotating.now[0] += 60
    rotating.cosign(rotating.new)
    with rotating.client() as client:
        assert client.log_keys == learned
        assert client.view(A).revision == 1
    # A client that never read during the overlap learns it on a bundle with no pinned
    # signature only while the main-log note carries one: here it does not.
    with rotating.client("late.json") as client, pytest.raises(IntegrityFailure) as late:
        client.view(A)
    assert late.value.details["reason"] == "no_signature"
    assert not (rotating.tmp / "late.json").exists()
    # After the overlap a checkpoint signed by the old key alone is refused, and the
    # kept state does not move.
    rotating.now[0] = until + 1
    rotating.cosign(rotating.old)
    good = (rotating.tmp / "state.json").read_bytes()
    with rotating.client() as client, pytest.raises(IntegrityFailure) as refused:
        client.view(A)
    assert refused.value.details["reason"] == "no_signature"
    assert (rotating.tmp / "state.json").read_bytes() == good
    rotating.cosign(rotating.new)
    with rotating.client() as client:
        assert client.view(A).revision == 1


@pytest.mark.parametrize("engine_url", ["sqlite"], indirect=True)
def test_r29_a_rotation_cosigned_by_fewer_than_k_witnesses_or_forged_is_refused(
    rotating: Rotating,
) -> None:
    rotating.rotate()
    # One witness does not answer for the main log: its note carries two cosignatures,
    # enough for the collector's k = 2, one short of a client that pins k = 3.
    main = rotating.origin.removesuffix("/catalog")
    rotating.witnesses.all[2].down_for.add(main)
    done = rotating.cosign(rotating.old, rotating.new)
    assert done["main"]["cosigned"] == ["w0", "w1"] and len(done["cosigned"]) == 3
    strict = rotating.witnesses.policy(rotating.tmp / "strict.json", rotating.origin,
                                       rotating.old, threshold=3)  # fmt: skip
    with CatalogClient(
        rotating.server.base, token=rotating.token, trust=load_trust(strict),
        state_file=rotating.tmp / "strict-state.json", clock=lambda: rotating.now[0],
    ) as client:  # fmt: skip
        client.view(A)  # the catalog note has its three cosignatures; the hint fails quietly
        assert client.log_keys == (PinnedKey(rotating.old.verifier),)
        with pytest.raises(IntegrityFailure) as few:
            client.refresh_keys()
        assert few.value.details == {
            "reason": "too_few_cosignatures",
            "cosigned": 2,
            "threshold": 3,
        }
        assert client.log_keys == (PinnedKey(rotating.old.verifier),)
    assert "log_keys" not in orjson.loads((rotating.tmp / "strict-state.json").read_bytes())
    # k = 2 suffices for the policy that asks for 2.
    with rotating.client() as client:
        learned = client.refresh_keys()
        assert learned[-1] == PinnedKey(rotating.new.verifier)
        # A forged rotation: naming the pinned key as old, signed by another key of the
        # same name, appended to the log (as a compromised store could) and cosigned.
        forger, successor = SignerKey.generate("log"), SignerKey.generate("log")
        statement = rotation_statement(main, forger, successor.verifier, NOW + OVERLAP)
        forged = statement.replace(forger.verifier.text(), rotating.old.verifier.text())
        with open_store(rotating.world.url) as store:
            record_rotation(store.ledger, forged)
        rotating.cosign(rotating.old, rotating.new)
        with pytest.raises(IntegrityFailure) as refused:
            client.refresh_keys()
        assert refused.value.details["reason"] == "no_signature"
        assert client.log_keys == learned
