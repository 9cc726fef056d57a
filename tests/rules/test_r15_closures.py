"""R15: an audience's closure is assembled from its own bindings only, credential sets are
admitted per component, and every closure is validated before anything is deduplicated.
Real stores: SQLite file and MariaDB."""

from __future__ import annotations

import pytest

from domain.errors import LifecycleRejected
from tests.rules.test_publisher import bind, catalog_rows, release
from tests.support.gitrepo import sales
from tests.support.gitrepo import sales_closure as full
from tests.support.lifecycle_support import World


def test_r15_cross_workload_borrowing_fails_naming_the_audience(world: World) -> None:
    commit = world.release({"sales/pack.json": sales()})
    borrowing = [
        bind("integration:a", "Order.push", "push_contract"),
        bind("integration:b", "erp", "callout_profile", credential_set="erp-prod"),
        bind("integration:b", "Order.out", "outbound_mapping"),
    ]
    head = world.head()
    with pytest.raises(LifecycleRejected) as info:
        release(world, commit, borrowing)
    assert info.value.reason == "CLOSURE_INVALID"
    problems = info.value.details["problems"]
    assert {(p["audience"], p["reason"], p["requirement"]["kind"]) for p in problems} == {
        ("integration:a", "MISSING_REQUIREMENT", "callout_profile"),
        ("integration:a", "MISSING_REQUIREMENT", "outbound_mapping"),
    }
    assert all(p["component"] == {"kind": "push_contract", "key": "Order.push"} for p in problems)
    assert world.head() == head  # nothing at all was appended, not even the packs
    # Bind the profile and mapping to A as well: it publishes.
    result = release(world, commit, [*borrowing[1:], *full("integration:a")])
    assert result["catalog"]["published"] and result["catalog"]["revision"] == 1


def test_r15_validate_before_dedupe_then_identical_closures_stored_once(world: World) -> None:
    commit = world.release({"sales/pack.json": sales()})
    unauthorized = [
        *full("integration:a"),
        bind("integration:b", "erp", "callout_profile", credential_set="erp-staging"),
    ]
    with pytest.raises(LifecycleRejected) as info:
        release(world, commit, unauthorized)
    (problem,) = info.value.details["problems"]
    assert problem["audience"] == "integration:b"
    assert problem["reason"] == "CREDENTIAL_SET_NOT_ADMITTED"
    assert world.head() == 0
    result = release(world, commit, full("integration:a") + full("integration:c"))
    counts = result["catalog"]["counts"]
    assert counts == {"audiences": 2, "activations": 1, "facts": 3, "grants": 6}
    grants = catalog_rows(world, "_System_CatalogGrant")
    assert {(g[0], g[1]) for g in grants} == {(b"integration", b"a"), (b"integration", b"c")}
    assert len(grants) == 6
