"""R6: a generation is one attempt (preparing -> active | failed_clean | failed_dirty;
active -> retired); a failed attempt stays in the history with its reason and a retry is
a new generation. Real stores: SQLite file and MariaDB."""

from __future__ import annotations

from domain.classifier import Condition, classify
from domain.matrix import Advance
from tests.support.lifecycle_support import World


def test_r6_failed_attempt_then_successful_retry_keeps_history(world: World) -> None:
    c1, c2 = world.commit("sales", 1), world.commit("sales", 2)
    world.apply(world.official("sales", c1))
    handle = world.service.acquire_lease()
    target = world.resolved("sales", c2)
    (failed_id,) = world.service.prepare(handle, [(target, Advance(target.target, c1))]).values()
    world.service.fail(handle, "sales", failed_id, dirty=False, reason="apply step failed")
    world.service.release_lease(handle)
    assert classify(world.state("sales")) is Condition.ACTIVE_FAILED_CLEAN

    retry = world.apply(world.official("sales", c2))
    assert retry["packs"][0]["decision"] == "advance"
    new_id = retry["packs"][0]["install_id"]
    assert new_id != failed_id
    state = world.state("sales")
    assert state.history is not None and state.history.attempts[1:] == [failed_id, new_id]
    with world.db.read() as conn:
        from projections.queries.status import pack_status

        (row,) = pack_status(conn)
    assert row["active_install_id"] == new_id and row["dirty"] is False
    # The failed attempt is kept as history with its reason.
    failed = _generation_row(world, "sales", failed_id)
    assert failed["status"] == "failed_clean"
    assert failed["failure_reason"] == "apply step failed"


def _generation_row(world: World, pack: str, install_id: str) -> dict[str, object]:
    import sqlalchemy as sa

    with world.db.read() as conn:
        row = conn.execute(
            sa.text(
                "SELECT status, failure_reason FROM _System_PackGeneration "
                "WHERE pack = :p AND install_id = :i"
            ),
            {"p": pack.encode(), "i": install_id.encode()},
        ).one()
    return {
        "status": bytes(row[0]).decode(),
        "failure_reason": bytes(row[1]).decode() if row[1] is not None else None,
    }
