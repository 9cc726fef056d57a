"""The runtime client: audience views from `catalog-ledger serve`, failing closed (R18, R19, R26).

``CatalogClient(base_url, token=..., tls=...)`` mirrors the local reader
(``CatalogReader``): ``view(audience, min_revision=None)``, ``watch(audience)`` and
``head()`` return the same ``AudienceView`` / ``CatalogHead`` and raise the same typed
errors (``Missing``, ``Stale``, ``InvalidInput``, ``IntegrityFailure``,
``Unauthenticated``, ``Unavailable``), built from the server's error body.

- **ETag cache**: the last view of each audience is kept with its weak ETag and sent
  back as ``If-None-Match``; a 304 answers with the kept view. Every view received is
  checked against its audience digest (the ETag's value) before it is kept or returned,
  so a cached body is always the content its validator names.
- **Fail closed**: after MISSING or INTEGRITY for an audience, its cached view is
  dropped; after 401 every cached view is (the credential is no longer good). None is
  ever returned in place of an error.
- **Retries**: only UNAVAILABLE (503, or the server unreachable) is retried, with full
  jitter exponential backoff, until ``retry_total`` seconds have been spent; then the
  last UNAVAILABLE is raised. Nothing else is retried.
- **Watch**: ``watch`` yields the current view, then long-polls
  (``?wait=SECONDS`` with ``If-None-Match``) and yields each time the audience's own
  content changes; an error ends the iteration by raising it.
"""

from __future__ import annotations

import random
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from domain.catalog import audience_digest
from domain.errors import (
    Conflict,
    IntegrityFailure,
    InvalidInput,
    LedgerError,
    Missing,
    Stale,
    Unauthenticated,
    Unavailable,
)
from domain.identity import Audience
from projections.reader import AudienceView, CatalogHead

_ERRORS: dict[str, type[LedgerError]] = {
    cls.code: cls
    for cls in (
        Missing,
        Stale,
        InvalidInput,
        IntegrityFailure,
        Unauthenticated,
        Unavailable,
        Conflict,
    )
}
#: Default long-poll of ``watch`` (seconds; the server accepts 1 to 300).
WATCH_SECONDS = 60


def tls_context(
    ca: str | Path | None = None, cert: str | Path | None = None, key: str | Path | None = None
) -> ssl.SSLContext:
    """A client TLS context trusting ``ca`` (else the system's), with a client certificate
    (``cert``/``key``, PEM) for servers that take certificates as credentials."""
    context = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
    if cert is not None:
        context.load_cert_chain(str(cert), str(key) if key is not None else None)
    return context


class CatalogClient:
    """Reads one server's audience views for a runtime (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        timeout: float = 10.0,
        retry_total: float = 30.0,
        retry_base: float = 0.1,
        retry_cap: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        self._http = httpx.Client(
            base_url=base_url,
            headers=headers,
            verify=tls if tls is not None else True,
            timeout=timeout,
            transport=transport,
        )
        self.retry_total = retry_total
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self._sleep = sleep
        self._monotonic = monotonic
        self._jitter = jitter
        #: The last verified view of each audience, by ``kind:id``.
        self._cache: dict[str, AudienceView] = {}
        #: Requests sent, retries made (for tests and the benchmark).
        self.requests = 0
        self.retries = 0

    # -- reads --------------------------------------------------------------------------

    def view(self, audience: str, min_revision: int | None = None) -> AudienceView:
        """The audience's verified view at the active revision (at least ``min_revision``)."""
        return self._view(audience, min_revision=min_revision, wait=None)

    def watch(self, audience: str, *, wait: int = WATCH_SECONDS) -> Iterator[AudienceView]:
        """The audience's view now, then each time its own content changes."""
        last = self.view(audience)
        yield last
        while True:
            found = self._view(audience, min_revision=None, wait=wait)
            if found.audience_digest != last.audience_digest:
                last = found
                yield found

    def head(self) -> CatalogHead:
        """The active catalog revision and its content digest."""
        body = self._get("/v1/catalog/head", {}, {}, audience=None).json()
        return CatalogHead(int(body["revision"]), str(body["content_digest"]))

    # -- plumbing -----------------------------------------------------------------------

    def _view(self, audience: str, *, min_revision: int | None, wait: int | None) -> AudienceView:
        parsed = Audience.parse(audience)
        name = f"{parsed.kind.value}:{parsed.id}"
        path = (
            f"/v1/audiences/{quote(parsed.kind.value, safe='')}/"
            f"{quote(str(parsed.id), safe='')}/view"
        )
        params: dict[str, Any] = {}
        if min_revision is not None:
            params["min_revision"] = min_revision
        headers = {}
        cached = self._cache.get(name)
        # A 304 would confirm the content, not a revision: revalidate only a view that
        # satisfies the revision asked for.
        if cached is not None and (min_revision is None or cached.revision >= min_revision):
            headers["If-None-Match"] = cached.etag
            if wait is not None:
                params["wait"] = wait
        response = self._get(path, params, headers, audience=name)
        if response.status_code == 304:
            if cached is None:
                raise IntegrityFailure("the server answered 304 to a request without a validator")
            return cached
        try:
            found = _view_of(response)
        except IntegrityFailure:
            self._cache.pop(name, None)
            raise
        self._cache[name] = found
        return found

    def _get(
        self, path: str, params: dict[str, Any], headers: dict[str, str], *, audience: str | None
    ) -> httpx.Response:
        started = self._monotonic()
        attempt = 0
        while True:
            try:
                self.requests += 1
                response = self._http.get(path, params=params, headers=headers, timeout=_timeout(
                    self._http.timeout, params.get("wait")
                ))  # fmt: skip
                if response.status_code in (200, 304):
                    return response
                raise _error_of(response)
            except httpx.TransportError as exc:
                error: LedgerError = Unavailable(
                    f"the catalog server is unreachable: {type(exc).__name__}: {exc}"
                )
            except Unavailable as exc:
                error = exc
            except (Missing, IntegrityFailure):
                if audience is not None:
                    self._cache.pop(audience, None)
                raise
            except Unauthenticated:
                self._cache.clear()
                raise
            delay = min(self.retry_cap, self.retry_base * 2**attempt) * self._jitter()
            if self._monotonic() - started + delay > self.retry_total:
                raise error
            attempt += 1
            self.retries += 1
            self._sleep(delay)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CatalogClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _timeout(base: httpx.Timeout, wait: int | None) -> httpx.Timeout:
    """A long poll may hold the response for ``wait`` seconds: read past it."""
    if wait is None:
        return base
    read = (base.read or 0) + wait
    return httpx.Timeout(base.connect, read=read, write=base.write, pool=base.pool)


def _error_of(response: httpx.Response) -> LedgerError:
    try:
        body = response.json()
        cls = _ERRORS.get(body["error"])
        message, details = str(body["message"]), dict(body.get("details") or {})
    except (ValueError, KeyError, TypeError):
        cls, message, details = None, response.text[:200], {}
    if cls is None:
        cls = Unavailable if response.status_code >= 500 else IntegrityFailure
        message = f"HTTP {response.status_code} from the catalog server: {message}"
    return cls(message, **details)


def _view_of(response: httpx.Response) -> AudienceView:
    """The view of a 200, verified against its audience digest (and so its ETag)."""
    try:
        body = response.json()
        view = AudienceView(
            audience=str(body["audience"]),
            revision=int(body["revision"]),
            content_digest=str(body["content_digest"]),
            audience_digest=str(body["audience_digest"]),
            grants=list(body["grants"]),
            facts=list(body["facts"]),
        )
        kind, _, ident = view.audience.partition(":")
        grants = [
            [g["pack"], g["kind"], g["key"], g["credential_set"], g["install_id"]]
            for g in view.grants
        ]
        facts = [
            [f["pack"], f["install_id"], f["kind"], f["key"], f["fact_digest"]] for f in view.facts
        ]
        recomputed = audience_digest((kind, ident), grants, facts)
    except (ValueError, KeyError, TypeError) as exc:
        raise IntegrityFailure(f"the server sent a view that is not one: {exc}") from None
    if recomputed != view.audience_digest:
        raise IntegrityFailure("the view received does not match its audience digest")
    if response.headers.get("etag") != view.etag:
        raise IntegrityFailure("the view's ETag does not name its audience digest")
    return view
