"""R29 under attack, server side, on SQLite and MariaDB: a ``catalog.published`` row of
the main log rewritten under a running server, or before one starts, is never served in
a bundle (the app in process, the collector with in-process fake witnesses, as
``test_r29_proof_bundle``)."""

from __future__ import annotations

from pathlib import Path

import orjson
import sqlalchemy as sa
from fastapi.testclient import TestClient

from domain.catalog import catalog_id
from domain.digests import event_id
from ledger.api import Store
from ledger.http.app import create_app
from tests.e2e.test_r29_proof_bundle import PATH, Collector, publish
from tests.support.lifecycle_support import World

OTHER = "/v1/audiences/integration/b/view"


def _rewrite_revision_1(world: World, *, with_its_id: bool) -> None:
    """Revision 1's event gets other state bytes (and, ``with_its_id``, the event id of
    those bytes, so that the row is consistent in itself)."""
    with world.db.write() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT position, version, topic, state FROM ledger_events WHERE aggregate_id = :a"
            ),
            {"a": catalog_id().bytes},
        ).all()
        position, version, topic, stored = next(
            r for r in rows if bytes(r[2]).startswith(b"catalog.published@")
        )
        document = orjson.loads(bytes(stored))
        document["timestamp"] = "2001-01-01T00:00:00+00:00"  # still revision 1's state
        state = orjson.dumps(document, option=orjson.OPT_SORT_KEYS)
        ident = event_id(catalog_id().bytes, version, bytes(topic), state)
        sets = "state = :s, event_id = :i" if with_its_id else "state = :s"
        changed = conn.execute(
            sa.text(f"UPDATE ledger_events SET {sets} WHERE position = :p"),
            {"s": state, "i": ident, "p": position},
        ).rowcount
    assert changed == 1


def _refused(client: TestClient, path: str, table: str) -> None:
    answer = client.get(path, params={"proof": "1"})
    assert (answer.status_code, answer.json()["error"]) == (500, "INTEGRITY"), answer.text
    assert answer.json()["details"].get("table") == table, answer.text


def test_r29_a_revision_event_rewritten_under_the_server_is_never_served(
    world: World, tmp_path: Path
) -> None:
    """The running server's catalog log holds revision 1's event id when the row is
    rewritten: the next bundle it builds (another audience's: the cache misses) re-reads
    the row and refuses it, naming ledger_events; so does a server started afterwards
    (it recomputes each event id). A row rewritten with the id of its new bytes is
    consistent in itself, but then the catalog log is not the stored cosigned
    checkpoint's tree: refused naming ledger_checkpoint."""
    publish(world, 1)
    Collector(world, tmp_path).run()
    with TestClient(create_app(Store(world.url).opener(), auth=False)) as client:
        assert client.get(PATH, params={"proof": "1"}).status_code == 200
        _rewrite_revision_1(world, with_its_id=False)
        _refused(client, OTHER, "ledger_events")
    with TestClient(create_app(Store(world.url).opener(), auth=False)) as client:
        _refused(client, PATH, "ledger_events")
        _rewrite_revision_1(world, with_its_id=True)
    with TestClient(create_app(Store(world.url).opener(), auth=False)) as client:
        _refused(client, PATH, "ledger_checkpoint")
