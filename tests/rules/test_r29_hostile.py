"""R29 under attack: what a hostile server, witness, co-tenant or clock tried, and what
refuses it now (each test failed before its fix, or pins a property no other test does).

Fast and in-process: bundles from ``tests.support.bundles`` (real signatures and
proofs), the client's real HTTP code over ``httpx.MockTransport``, the witness's real
app and SQLite file through Starlette's test client, the collector's line filter.
"""

from __future__ import annotations

from typing import Any

import pytest

from domain.bundle import TrustPolicy, verify_bundle
from domain.errors import IntegrityFailure, InvalidInput, Stale
from domain.notes import WitnessSigner
from tests.support.bundles import NOW, CatalogLog

APP = "app:shop"


@pytest.fixture(scope="module")
def log() -> CatalogLog:
    log = CatalogLog()
    for n in range(1, 4):
        log.publish({APP: {"n": n}, "app:other": {"n": -n}})
    return log


def view(log: CatalogLog, revision: int = 3) -> Any:
    return log.revisions[revision - 1].views[APP]


# -- the client ---------------------------------------------------------------------------


def test_r29_one_witness_pinned_with_two_keys_counts_once(log: CatalogLog) -> None:
    """A policy may pin a witness's old and new key (its rotation); that witness
    cosigning with both is one witness, not two towards k = 2."""
    new_key = WitnessSigner.generate(log.witnesses[0].name)
    document = log.policy_json(threshold=2)
    document["witnesses"].append({"key": new_key.verifier.text()})
    policy = TrustPolicy.parse(document)
    body = log.checkpoint().text()
    note = log.log_key.sign(body)
    note += log.witnesses[0].cosign(body, NOW) + "\n" + new_key.cosign(body, NOW) + "\n"
    with pytest.raises(IntegrityFailure) as caught:
        verify_bundle(view(log), log.bundle(APP, note=note), policy, None, NOW)
    assert caught.value.details == {
        "reason": "too_few_cosignatures",
        "cosigned": 1,
        "threshold": 2,
    }
    # With a second witness it is two; and k cannot exceed the distinct witnesses.
    note += log.witnesses[1].cosign(body, NOW) + "\n"
    assert verify_bundle(view(log), log.bundle(APP, note=note), policy, None, NOW).size == 3
    two_names = {**document, "witnesses": document["witnesses"][:1] + document["witnesses"][3:]}
    with pytest.raises(InvalidInput) as refused:
        TrustPolicy.parse(two_names)
    assert refused.value.field == "threshold"


@pytest.mark.parametrize("now", [float("nan"), float("inf"), float("-inf")])
def test_r29_a_clock_that_is_no_time_fails_closed(log: CatalogLog, now: float) -> None:
    """``now`` is injected: NaN compared with anything is False, which made any head
    fresh; infinity crashed formatting the STALE details."""
    with pytest.raises(Stale) as caught:
        verify_bundle(view(log), log.bundle(APP), log.policy(), None, now)
    assert caught.value.details["axis"] == "freshness"
