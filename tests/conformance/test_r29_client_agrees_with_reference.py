"""R29: the runtime client and the independent reference verifier agree on every bundle.

Each bundle of ``test_r29_reference_bundle`` (built from LOG-FORMAT and C2SP alone by
``tests/support/reference_bundle``) is served to the project's ``CatalogClient`` with a
trust policy, through its real HTTP code (``httpx.MockTransport``): the honest ones are
accepted with the state the reference keeps, and each tampered one is refused with the
reference's reason (INTEGRITY) or axis (STALE), leaving no cached view and the state
file as it was. So the project's verifier (``domain.bundle``) cannot drift from the
spec-only one unseen.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from domain.bundle import Accepted, TrustPolicy
from domain.errors import IntegrityFailure, InvalidInput, LedgerError, Stale
from ledger.client import CatalogClient
from tests.conformance.test_r29_reference_bundle import INTEGRITY, MAIN, WITH_POLICY, accepted
from tests.support import reference_bundle as rb


def serve(
    body: dict[str, Any], kept: dict[str, Any] | None, tmp_path: Path, **changes: Any
) -> tuple[CatalogClient, Path]:
    """A client with the reference's policy (and ``changes``) and ``kept`` as its state
    file, whose server answers ``body`` to every read, and a log with no key rotation to a
    client that looks for one (a checkpoint with no signature by a pinned key)."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/log/rotations":
            empty: dict[str, Any] = {"format": 1, "checkpoint": None, "rotations": []}
            return httpx.Response(200, content=orjson.dumps(empty))
        assert request.url.params["proof"] == "1"
        return httpx.Response(200, content=orjson.dumps(body))

    policy = TrustPolicy.parse({**rb.policy(), **changes})
    state = tmp_path / "state.json"
    state.unlink(missing_ok=True)
    if kept is not None:
        accepted_state = Accepted(kept["size"], base64.b64decode(kept["root"]), kept["revision"])
        state.write_bytes(orjson.dumps(accepted_state.to_json(policy.origin)))
    client = CatalogClient(
        "http://catalog.test",
        transport=httpx.MockTransport(handle),
        trust=policy,
        state_file=state,
        clock=lambda: rb.NOW,
    )
    return client, state


def verdict(
    body: dict[str, Any], kept: dict[str, Any] | None, tmp_path: Path, **changes: Any
) -> str:
    """The client's reason (INTEGRITY) or axis (STALE); nothing kept either way."""
    client, state = serve(body, kept, tmp_path, **changes)
    before = state.read_bytes() if state.exists() else None
    with client, pytest.raises((IntegrityFailure, Stale)) as refused:
        client.view(str(body.get("audience", "app:CRM")))
    assert client._cache == {}
    assert (state.read_bytes() if state.exists() else None) == before
    error: LedgerError = refused.value
    return str(error.details.get("reason") or error.details.get("axis"))


def test_r29_client_accepts_what_the_reference_accepts(tmp_path: Path) -> None:
    for audience in rb.AUDIENCES:
        body = MAIN.bundle(audience)
        client, state = serve(body, None, tmp_path)
        with client:
            assert client.view(body["audience"]).audience_digest == body["audience_digest"]
        assert orjson.loads(state.read_bytes())["size"] == 3
    for since in (1, 2):
        client, state = serve(MAIN.bundle(since=since), accepted(since), tmp_path)
        with client:
            client.view("app:CRM")
        document = orjson.loads(state.read_bytes())
        assert {k: document[k] for k in ("size", "root", "revision")} == accepted(3)


@pytest.mark.parametrize("case", sorted(INTEGRITY))
def test_r29_client_refuses_each_tampered_bundle_as_the_reference_does(
    case: str, tmp_path: Path
) -> None:
    build, reason = INTEGRITY[case]
    body, kept = build()
    assert verdict(body, kept, tmp_path) == reason


@pytest.mark.parametrize("case", sorted(WITH_POLICY))
def test_r29_client_refuses_what_the_specs_forbid_as_the_reference_does(
    case: str, tmp_path: Path
) -> None:
    build, changes, reason = WITH_POLICY[case]
    if case == "one witness key pinned under two names counts once":
        # The client refuses such a policy outright (INVALID naming the repeated key)
        # rather than counting the key once: it never verifies a bundle under it.
        with pytest.raises(InvalidInput) as invalid:
            TrustPolicy.parse({**rb.policy(), **changes})
        assert invalid.value.field == "witnesses[1].key"
        return
    assert verdict(build(), None, tmp_path, **changes) == reason


def test_r29_client_calls_a_rollback_and_a_frozen_head_stale_as_the_reference_does(
    tmp_path: Path,
) -> None:
    assert verdict(MAIN.bundle(revision=2), accepted(3), tmp_path) == "checkpoint"
    old = rb.NOW - rb.MAX_AGE - 1
    frozen = rb.note(
        3,
        MAIN.root(3),
        cosigners=[(rb.WITNESSES[0], rb.NOW), (rb.WITNESSES[1], old), (rb.WITNESSES[2], old - 5)],
    )
    assert verdict(MAIN.bundle(checkpoint=frozen), None, tmp_path) == "freshness"
