"""``/metrics`` of the read service, in the Prometheus text format.

Two kinds of metric:

- request metrics, counted as requests are served:
  ``catalog_ledger_http_requests_total{route,outcome}`` and the histogram
  ``catalog_ledger_http_request_duration_seconds{route}``. ``route`` is the
  route *template* (``/v1/audiences/{kind}/{audience_id}/view``) or
  ``unmatched``, never the raw path: no audience id ever becomes a label.
  ``outcome`` is ``ok``, ``not_modified``, the error code of an error
  response (``MISSING``, ``STALE``, ``INVALID``…) or the status class;
  ``catalog_ledger_http_watchers``, the watches waiting now.
- store gauges, computed from the store at scrape time (nothing to keep in
  step): ``catalog_ledger_log_head_position``, ``catalog_ledger_catalog_revision``,
  ``catalog_ledger_projection_lag_events{view}``,
  ``catalog_ledger_projection_stopped{view}``, ``catalog_ledger_lease_epoch``
  ``catalog_ledger_store_up`` (0 when the store could not be read; the
  other store gauges are then absent rather than wrong) and
  ``catalog_ledger_checkpoint_age_seconds``: the age of the stored cosigned checkpoint
  of the catalog log (R29), from its *oldest* cosignature. Every stored cosignature
  comes from one collector run that stored only because at least the policy's
  threshold cosigned, so the oldest is never newer than the threshold-th newest the
  clients use: the gauge never under-states their view. Clients go STALE when it
  passes their ``max_age_seconds``: alert well before (absent: nothing stored yet).

With ``serve --workers N`` each worker process counts its own requests into
prometheus-client's multiprocess files (``PROMETHEUS_MULTIPROC_DIR``, a
temporary folder the serve command creates and removes) and a scrape of any
worker sums them all; the store gauges are the same from every worker.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from domain.errors import Missing
from ledger.http.settings import MULTIPROC_ENV
from ledger.store.catalog_log import cosignature_times, query_checkpoint
from ledger.store.replica import replication
from projections.reader import CatalogReader

#: The writer lease's name (``ledger.commands.writer_lease.WRITER_LEASE``; checked by a test).
WRITER_LEASE = "writer"
UNMATCHED = "unmatched"
#: Sub-millisecond reads up to slow ones.
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: An error code as the DESIGN error shape writes it; anything else is a status class.
_CODE = re.compile(rb'"error"\s*:\s*"([A-Z][A-Z_]{0,31})"')
#: Error bodies are small; a larger one is not parsed for its code.
_MAX_ERROR_BODY = 4096


class StoreCollector:
    """The store gauges, read from the store at each scrape."""

    def __init__(self, ledger: Callable[[], Any | None]) -> None:
        self._ledger = ledger

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        up, head, revision, lag, stopped, epoch, age, running, behind = families
        ledger = self._ledger()
        if ledger is None:
            up.add_metric([], 0)
            return [up]
        try:
            status = ledger.runner.status(ledger.db)
            try:
                served: int = CatalogReader(ledger.db).head().revision
            except Missing:  # nothing published yet
                served = 0
            with ledger.snapshot() as repository:
                lease = repository.lease(WRITER_LEASE)
            replica = replication(ledger.db)
            cosigned = _checkpoint_times(ledger)
        except Exception:  # the store is down: say so, never fail the scrape
            up.add_metric([], 0)
            return [up]
        up.add_metric([], 1)
        head.add_metric([], status["head"])
        revision.add_metric([], served)
        for view in status["views"]:
            if "lag" in view:
                lag.add_metric([view["name"]], view["lag"])
            stopped.add_metric([view["name"]], 0 if view.get("state") == "running" else 1)
        epoch.add_metric([], 0 if lease is None else lease.epoch)
        if cosigned:
            age.add_metric([], max(0.0, time.time() - min(cosigned)))
        if replica is None:  # not a replica: no replication gauges
            return families[:7]
        running.add_metric([], 1 if replica["io_running"] and replica["sql_running"] else 0)
        if replica["seconds_behind_primary"] is not None:
            behind.add_metric([], replica["seconds_behind_primary"])
        return families

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily("catalog_ledger_store_up", "1 when the store could be read."),
            GaugeMetricFamily(
                "catalog_ledger_log_head_position", "Position of the newest event in the log."
            ),
            GaugeMetricFamily(
                "catalog_ledger_catalog_revision",
                "The active (served) catalog revision; 0 before the first publication.",
            ),
            GaugeMetricFamily(
                "catalog_ledger_projection_lag_events",
                "Events of the log a view has not applied yet (log head - view position).",
                labels=["view"],
            ),
            GaugeMetricFamily(
                "catalog_ledger_projection_stopped",
                "1 when a view is stopped (poison event) or missing, so it is not served.",
                labels=["view"],
            ),
            GaugeMetricFamily(
                "catalog_ledger_lease_epoch", "Epoch of the writer lease (acquisitions and breaks)."
            ),
            GaugeMetricFamily(
                "catalog_ledger_checkpoint_age_seconds",
                "Age of the stored cosigned catalog-log checkpoint, from its oldest "
                "cosignature: clients go STALE past their max_age_seconds (R29).",
            ),
            GaugeMetricFamily(
                "catalog_ledger_replication_running",
                "On a replica: 1 when both replication threads run, 0 when paused or failed.",
            ),
            GaugeMetricFamily(
                "catalog_ledger_replication_lag_seconds",
                "On a replica: seconds behind its primary (absent while replication is stopped).",
            ),
        ]


def _checkpoint_times(ledger: Any) -> list[int]:
    """The cosignature times of the stored catalog-log checkpoint (none: nothing stored)."""
    from ledger.api import catalog_origin

    stored = query_checkpoint(ledger.db, catalog_origin(ledger))
    return [] if stored is None else cosignature_times(stored.note)


class HttpMetrics:
    """Request metrics and the exposition of one app (one worker process)."""

    def __init__(self, store: StoreCollector, *, multiprocess_dir: str | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
        self.store = store
        # In multiprocess mode the values live in the folder's files, summed at scrape;
        # otherwise in this app's own registry (never the process-wide default one).
        self.registry = None if multiprocess_dir else CollectorRegistry()
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}
        self.requests = Counter(
            "catalog_ledger_http_requests",
            "HTTP requests served, by route template and outcome.",
            ["route", "outcome"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "catalog_ledger_http_request_duration_seconds",
            "Time to serve an HTTP request, by route template.",
            ["route"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.watchers = Gauge(
            "catalog_ledger_http_watchers",
            "Watches (`?wait=`) waiting now, summed over the workers.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        if self.registry is not None:
            self.registry.register(store)

    def observe(self, route: str, outcome: str, seconds: float) -> None:
        children = self._children.get((route, outcome))
        if children is None:  # a few route templates and outcomes: looked up once each
            children = (self.requests.labels(route, outcome), self.duration.labels(route))
            self._children[(route, outcome)] = children
        children[0].inc()
        children[1].observe(seconds)

    def exposition(self) -> bytes:
        """Every metric in the Prometheus text format."""
        if self.registry is not None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self.multiprocess_dir)  # type: ignore[no-untyped-call]
        registry.register(self.store)
        return generate_latest(registry)


def multiprocess_dir() -> str | None:
    """The multiprocess folder when this process serves as one of several workers."""
    return os.environ.get(MULTIPROC_ENV) or None


def route_of(scope: Scope) -> str:
    """The matched route's template, or ``unmatched``; never the raw path."""
    route = scope.get("route")
    template = getattr(route, "path_format", None)
    return template if isinstance(template, str) else UNMATCHED


def outcome_of(status: int, body: bytes) -> str:
    if status == 304:
        return "not_modified"
    if status < 400:
        return "ok"
    found = _CODE.search(body[:_MAX_ERROR_BODY])
    return found.group(1).decode() if found else f"{status // 100}xx"


class MetricsMiddleware:
    """Counts and times every HTTP request by route template and outcome (pure ASGI)."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        body = bytearray()

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif (
                message["type"] == "http.response.body"
                and status >= 400
                and len(body) < _MAX_ERROR_BODY
            ):
                body.extend(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except BaseException:
            self.metrics.observe(route_of(scope), "ERROR", time.perf_counter() - start)
            raise
        outcome = outcome_of(status, bytes(body))
        self.metrics.observe(route_of(scope), outcome, time.perf_counter() - start)
