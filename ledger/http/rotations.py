"""``GET /v1/log/rotations`` (R29): the log's key rotations, each with its inclusion proof
under the stored cosigned main-log checkpoint (``ledger.audit.rotation_proofs``), for a
runtime client to learn the log's new signing key from the log, as k witnesses saw it.

Authenticated like the head (any valid credential, R26). The body is cached by (the
stored main-log note, the log's head position): it is rebuilt when either changes (any
append moves the head, a new rotation among them); otherwise a request costs only indexed
reads (the log's origin, the stored note's row, the head row).
"""

from __future__ import annotations

import threading

import anyio.to_thread
import orjson
from fastapi import Depends, FastAPI
from fastapi.responses import Response

from ledger.http.caller import authenticated
from ledger.http.models import ROTATIONS_RESPONSES, Rotations
from ledger.http.state import ServiceState


def add_rotation_routes(app: FastAPI, state: ServiceState) -> None:
    lock = threading.Lock()
    cache: dict[str, tuple[object, bytes]] = {}

    def build() -> bytes:
        from ledger.api import log_rotations
        from ledger.store.catalog_log import query_checkpoint
        from ledger.store.log_identity import origin_of

        state.reader()  # UNAVAILABLE without a store
        ledger = state.ledger
        assert ledger is not None
        key = (query_checkpoint(ledger.db, origin_of(ledger)), ledger.recorder.head().position)
        with lock:
            found = cache.get("body")
            if found is not None and found[0] == key:
                return found[1]
        body = orjson.dumps(log_rotations(ledger))
        with lock:
            cache["body"] = (key, body)
        return body

    @app.get(
        "/v1/log/rotations",
        response_model=Rotations,
        responses=ROTATIONS_RESPONSES,
        dependencies=[Depends(authenticated)],  # any valid credential (R26)
    )
    async def rotations() -> Response:
        """The log's key rotations, each with its inclusion proof under the stored cosigned
        checkpoint of the main log (503 UNAVAILABLE `checkpoint_pending` while that does not
        cover the last one)."""
        body = await anyio.to_thread.run_sync(build)
        return Response(body, media_type="application/json", headers={"cache-control": "no-store"})
