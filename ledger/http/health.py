"""Operations routes: ``/healthz`` (log head, served revision, projection lag, on a
replica its replication, the schema contract) and ``/metrics`` (Prometheus, left out of
the OpenAPI document). Neither needs a credential.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from domain.errors import Missing
from ledger.http.metrics import HttpMetrics
from ledger.http.models import Health, Replication
from ledger.http.state import ServiceState
from ledger.store.replica import replication


def add_health_routes(app: FastAPI, state: ServiceState, metrics: HttpMetrics) -> None:
    """``/healthz`` over ``state`` and ``/metrics`` from ``metrics``."""

    @app.get("/healthz", response_model=Health, responses={503: {"model": Health}})
    def healthz() -> JSONResponse:
        """Log head, served catalog revision, projection lag and, on a replica, its
        replication state and lag; 503 when a view has stopped."""
        state.reader()  # UNAVAILABLE when the store is gone
        ledger = state.ledger
        assert ledger is not None
        status = ledger.runner.status(ledger.db)
        try:
            revision: int | None = state.reader().head().revision
        except Missing:
            revision = None
        views = {
            v["name"]: {
                "lag": v.get("lag"),
                "state": v.get("state"),
                "mode": v.get("mode"),
                "error": v.get("error"),
                "rebuild_needed": v.get("rebuild_needed"),
            }
            for v in status["views"]
        }
        # A view built by other view code is not served (R25): not healthy either.
        healthy = all(v["state"] == "running" and not v["rebuild_needed"] for v in views.values())
        differences: list[dict[str, Any]] = state.schema
        schema_ok = all(d["safe"] for d in differences)
        healthy = healthy and schema_ok
        replica = replication(ledger.db)
        body = Health(
            healthy=healthy,
            log_head=status["head"],
            catalog_revision=revision,
            projections=views,
            writes=state.writes,
            replication=Replication(**replica) if replica is not None else None,
            schema_ok=schema_ok,
            schema_differences=differences,
        )
        return JSONResponse(body.model_dump(), status_code=200 if healthy else 503)

    @app.get("/metrics", include_in_schema=False)
    def prometheus_metrics() -> Response:
        """Prometheus text format (``ledger.http.metrics``); not part of the API document."""
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
