"""R14: a binding names the exact active generation of its pack (install id, payload
digest, kind, key) and one audience; a binding whose generation is no longer active fails
publication closed until it is re-bound. Real stores: SQLite file and MariaDB."""

from __future__ import annotations

import pytest

from domain.errors import LifecycleRejected
from tests.rules.test_publisher import _advance, release
from tests.support.gitrepo import sales
from tests.support.gitrepo import sales_closure as full
from tests.support.lifecycle_support import World


def test_r14_binding_to_a_no_longer_active_generation_fails_until_rebound(world: World) -> None:
    c1, c2 = (world.release({"sales/pack.json": sales(v)}) for v in (1, 2))
    release(world, c1, full("integration:a"), publish=False)
    # The activation moves without re-binding (the service's lower-level steps).
    cand = _advance(world, c1, c2)
    handle = world.service.acquire_lease()
    world.service.activate(handle, {"sales": cand})
    world.service.release_lease(handle)
    head = world.head()
    with pytest.raises(LifecycleRejected) as info:
        world.service.publish()
    assert {p["reason"] for p in info.value.details["problems"]} == {"STALE_BINDING"}
    assert world.head() == head
    rebound = release(world, c2, full("integration:a"))  # apply re-binds what moved
    assert len(rebound["bindings"]["rebound"]) == 3 and rebound["catalog"]["published"]
