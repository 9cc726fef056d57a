"""The runtime client: audience views from `catalog-ledger serve`, failing closed (R18, R19, R26).

``CatalogClient(base_url, token=..., tls=...)`` mirrors the local reader
(``CatalogReader``): ``view(audience, min_revision=None)``, ``watch(audience)`` and
``head()`` return ``AudienceView`` / ``CatalogHead`` (``domain.served``, the same
fields as the reader's) and raise the same typed errors (``Missing``, ``Stale``,
``InvalidInput``, ``IntegrityFailure``, ``Unauthenticated``, ``Unavailable``), built
from the server's error body.

It imports only the pure domain, httpx, orjson, blake3 and cryptography: a runtime
needs none of the server stack (FastAPI, uvicorn, SQLAlchemy, eventsourcing,
pydantic) to read its catalog.

**What it verifies**, on every 200, before the view is kept or returned (any failure is
``IntegrityFailure``, and that audience's cached view is dropped):

- the body is the view of the audience asked for (``audience``), and its ``revision``
  is at least the ``min_revision`` asked for;
- every fact's digest, recomputed from the ``pack``, ``install_id``, ``payload_hash``,
  ``kind``, ``key``, ``payload``, ``requires`` and ``credential_sets`` received, encoded
  by ``domain.canonical`` (``domain.served.fact_digest``, the store's one definition);
- the audience digest, recomputed from the grants received and those fact digests
  (``domain.served.audience_digest``), and the ETag that names it (a proven view,
  below, may come without one: it is never revalidated).

Only the fields verified are returned (a field the server adds is dropped).

**What it takes on the server's word**, without a trust policy: that the view is of
the *current* revision (``revision`` and ``head()`` are not covered by any digest the
client can check, and a 304 confirms content, not currency); ``content_digest``, which
covers every audience's view, so a client that sees only its own cannot recompute it
(``AudienceView.content_digest_verified`` is ``False``); and that a proxy which
recomputes every digest is honest.

**With a trust policy** (``trust=``, R29; ``load_trust`` reads one from a file),
``view()`` asks for a proof bundle (``?proof=1&since_size=<accepted size>``) and
verifies it offline (``domain.bundle.verify_bundle``, LOG-FORMAT "Verifying a bundle"):
the view's digest is its audience's leaf of the revision's audience map, that revision
the last leaf of the catalog log, whose checkpoint the log signed and k pinned witnesses
cosigned within the maximum age, extending by a consistency proof the largest one this
client accepted (``accepted``: kept in memory and, with ``state_file=``, in a file
written atomically and re-read under a lock by every proven read of the clients sharing
it; one that does not parse is INTEGRITY, never a fresh start). A forged or re-digested
view, another audience's, a bad signature, too few cosignatures or an inconsistent tree
is ``IntegrityFailure``; a head older than the one accepted (a lagging replica, a
rollback) or cosigned longer ago than the maximum age (frozen) is ``Stale``; either way
nothing is kept and the accepted state does not move. **Key rotation**: the log keys
pinned are the policy's, amended by the rotations learned from the log (``refresh_keys``,
or by itself when a checkpoint carries a log key it does not pin or none it pins now):
``GET /v1/log/rotations``, each proven in the main log under a checkpoint k witnesses
cosigned (``ledger.client_keys``), kept in the state file; after a rotation's overlap the
old key alone is refused. Still on the server's word: ``content_digest`` (it covers
every audience's view) and ``head()`` (a runtime relies on its own view's revision).

- **ETag cache**: the last verified view of each audience is kept with its weak ETag
  and sent back as ``If-None-Match``; a 304 answers with the kept view. (A proven read
  sends none: a 304 carries no bundle. ``watch``'s long polls still use it.)
- **Fail closed**: after MISSING or INTEGRITY for an audience, its cached view is
  dropped; after 401 every cached view is (the credential is no longer good). None is
  ever returned in place of an error.
- **Retries**: only UNAVAILABLE (503, 429, other 5xx without an error body, or the
  server unreachable) is retried, with full jitter exponential backoff, waiting at least
  what ``Retry-After`` asks, until ``retry_total`` seconds would be spent; then the last
  UNAVAILABLE is raised. Nothing else is retried.
- **Watch**: ``watch`` yields the current view, then long-polls
  (``?wait=SECONDS`` with ``If-None-Match``) and yields each time the audience's own
  content changes; an error ends the iteration by raising it. With a trust policy each
  poll is followed by a proven read, so every view yielded is verified and a head that
  stops being re-cosigned ends the watch with STALE within one poll. It never spins: a poll
  that comes back with unchanged content sooner than ``watch_interval`` seconds (a
  proxy that drops ``If-None-Match`` or ``wait``) is followed by a pause until that
  interval has passed.
"""

from __future__ import annotations

import contextlib
import random
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from email.utils import parsedate_to_datetime
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

try:
    import httpx
except ModuleNotFoundError as missing:  # the server's dependencies do not include it
    raise ModuleNotFoundError(
        "ledger.client needs httpx: pip install 'catalog-ledger[client]', or for a runtime "
        "without the server stack see README.md, 'The runtime client'",
        name=missing.name,
    ) from None
import orjson

from domain.bundle import Accepted, TrustPolicy, verify_bundle
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
from domain.key_rotation import PinnedKey
from domain.served import AudienceView, CatalogHead, audience_digest, fact_bytes, fact_digest
from ledger.client_keys import (
    KeyRing,
    adopt,
    load_trust,
    read_state,
    sharing,
    state_document,
    write_state,
)

__all__ = ["WATCH_INTERVAL", "WATCH_SECONDS", "CatalogClient", "load_trust", "tls_context"]

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
#: Default least time between two polls of ``watch`` whose content did not change.
WATCH_INTERVAL = 1.0
_DIGEST = re.compile(r"[0-9a-f]{64}")
_GRANT_FIELDS = ("pack", "kind", "key", "credential_set", "install_id")


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
        watch_interval: float = WATCH_INTERVAL,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
        transport: httpx.BaseTransport | None = None,
        trust: TrustPolicy | None = None,
        state_file: str | Path | None = None,
        clock: Callable[[], float] = time.time,
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
        self.watch_interval = watch_interval
        self._sleep = sleep
        self._monotonic = monotonic
        self._jitter = jitter
        #: The last verified view of each audience, by ``kind:id``.
        self._cache: dict[str, AudienceView] = {}
        #: Requests sent, retries made (for tests and the benchmark).
        self.requests = 0
        self.retries = 0
        #: R29: the pinned keys and limits (None: views are not proven current).
        self.trust = trust
        self._clock = clock
        self._state_file = Path(state_file) if state_file is not None else None
        self._state_lock = threading.Lock()
        self._accepted: Accepted | None = None
        self._keys: KeyRing | None = None
        self._tried: frozenset[tuple[str, bytes]] = frozenset()  # signers that hinted
        if trust is not None:
            self._accepted, self._keys = read_state(self._state_file, trust)

    @property
    def accepted(self) -> Accepted | None:
        """The largest catalog-log checkpoint this client accepted (R29; None: none yet)."""
        return self._accepted

    @property
    def log_keys(self) -> tuple[PinnedKey, ...]:
        """The log keys this client pins (R29): the policy's, as learned rotations amend
        them (an old key bounded by its overlap's end, the new key added)."""
        return () if self._keys is None else self._keys.keys

    def refresh_keys(self) -> tuple[PinnedKey, ...]:
        """Learn the log's key rotations from the log (``GET /v1/log/rotations``,
        ``ledger.client_keys``): each proven in the main log under a checkpoint signed by a
        key pinned now and cosigned by the policy's threshold of witnesses, each signed by
        a pinned old key within its overlap. Kept in the state file. INTEGRITY (nothing
        learned) otherwise. A proven read calls it itself when a checkpoint carries no
        signature by a pinned key."""
        if self.trust is None or self._keys is None:
            raise InvalidInput("refresh_keys needs a trust policy (trust=)", field="trust")
        with self._state_lock, sharing(self._state_file):
            self._accepted, self._keys = adopt(
                self._state_file, self.trust, self._accepted, self._keys
            )
            self._learn()
        return self._keys.keys

    def _learn(self) -> bool:
        assert self.trust is not None and self._keys is not None
        response = self._get("/v1/log/rotations", {}, {}, audience=None)
        try:
            document = orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            raise _integrity(f"the key rotations are not JSON: {exc}", "$") from None
        if not self._keys.learn(document, self._clock()):
            return False
        if self._state_file is not None:
            write_state(self._state_file, state_document(self.trust, self._accepted, self._keys))
        return True

    # -- reads --------------------------------------------------------------------------

    def view(self, audience: str, min_revision: int | None = None) -> AudienceView:
        """The audience's verified view at the active revision (at least ``min_revision``)."""
        return self._view(audience, min_revision=min_revision, wait=None)

    def watch(self, audience: str, *, wait: int = WATCH_SECONDS) -> Iterator[AudienceView]:
        """The audience's view now, then each time its own content changes."""
        last = self.view(audience)
        yield last
        while True:
            started = self._monotonic()
            found = self._view(audience, min_revision=None, wait=wait)
            if self.trust is not None:
                # The long poll said "changed" or "not yet": either way, what is yielded is
                # proven, and a head no longer re-cosigned is STALE within one poll.
                found = self.view(audience)
            if found.audience_digest != last.audience_digest:
                last = found
                yield found
                continue
            # Unchanged, and maybe at once (the wait or the validator lost on the way):
            # never poll again sooner than watch_interval after the last poll began.
            pause = self.watch_interval - (self._monotonic() - started)
            if pause > 0:
                self._sleep(pause)

    def head(self) -> CatalogHead:
        """The active catalog revision and its content digest."""
        response = self._get("/v1/catalog/head", {}, {}, audience=None)
        try:
            body = orjson.loads(response.content)
            revision, content = body["revision"], body["content_digest"]
            if type(revision) is not int or revision < 0 or not isinstance(content, str):
                raise TypeError("revision or content_digest has the wrong type")
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise IntegrityFailure(f"the server sent a head that is not one: {exc}") from None
        return CatalogHead(revision, content)

    # -- plumbing -----------------------------------------------------------------------

    def _view(self, audience: str, *, min_revision: int | None, wait: int | None) -> AudienceView:
        """A view verified as the module docstring says; proven (R29) when a trust policy
        is set, except the long polls of ``watch`` (``wait``), which only detect change.
        Proven reads run one at a time: each must extend the state the last one kept."""
        if self.trust is None or wait is not None:
            return self._fetch(audience, min_revision=min_revision, wait=wait, prove=False)
        with self._state_lock, sharing(self._state_file):
            self._accepted, self._keys = adopt(
                self._state_file, self.trust, self._accepted, self._keys
            )
            return self._fetch(audience, min_revision=min_revision, wait=None, prove=True)

    def _fetch(
        self, audience: str, *, min_revision: int | None, wait: int | None, prove: bool
    ) -> AudienceView:
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
        kept = self._accepted
        if prove:  # never a 304: the bundle is the point
            params["proof"] = 1
            if kept is not None:
                params["since_size"] = kept.size
        # A 304 would confirm the content, not a revision: revalidate only a view that
        # satisfies the revision asked for.
        elif cached is not None and (min_revision is None or cached.revision >= min_revision):
            headers["If-None-Match"] = cached.etag
            if wait is not None:
                params["wait"] = wait
        response = self._get(path, params, headers, audience=name)
        if response.status_code == 304:
            if cached is None:
                raise IntegrityFailure("the server answered 304 to a request without a validator")
            return cached
        try:
            body = _body(response)
            found = _verified_view(body, response, parsed, min_revision, proven=prove)
            if prove:
                state = self._prove(found, body.get("proof"), kept)
                if state != kept:
                    self._accepted = state
                    if self._state_file is not None:
                        assert self.trust is not None and self._keys is not None
                        write_state(self._state_file, state_document(self.trust, state, self._keys))
                self._hinted(body.get("proof"))
        except (IntegrityFailure, Stale):
            self._cache.pop(name, None)
            raise
        self._cache[name] = found
        return found

    def _prove(self, view: AudienceView, proof: object, kept: Accepted | None) -> Accepted:
        """``verify_bundle`` with the keys valid now; a checkpoint with no signature by
        any of them sends the client to learn the log's rotations, then verify again. The
        bundle's own verdict stands if nothing is learned (whatever learning met)."""
        assert self._keys is not None
        try:
            return verify_bundle(view, proof, self._keys.policy(self._clock()), kept, self._clock())
        except IntegrityFailure as exc:
            if exc.details.get("reason") != "no_signature":
                raise
            try:
                learned = self._learn()
            except LedgerError:
                learned = False
            if not learned:
                raise
        return verify_bundle(view, proof, self._keys.policy(self._clock()), kept, self._clock())

    def _hinted(self, proof: object) -> None:
        """A checkpoint also signed by a log key not pinned (a rotation's new key, during
        its overlap) sends the client to learn the rotations, once per such key: best
        effort (the read is proven already; ``refresh_keys`` raises what it finds)."""
        assert self._keys is not None
        fresh = self._keys.unknown_signers(proof) - self._tried
        if fresh:
            self._tried |= fresh
            with contextlib.suppress(LedgerError):
                self._learn()

    def _get(
        self, path: str, params: dict[str, Any], headers: dict[str, str], *, audience: str | None
    ) -> httpx.Response:
        started = self._monotonic()
        attempt = 0
        while True:
            asked = 0.0  # what the server's Retry-After asks (seconds)
            try:
                self.requests += 1
                response = self._http.get(path, params=params, headers=headers, timeout=_timeout(
                    self._http.timeout, params.get("wait")
                ))  # fmt: skip
                if response.status_code in (200, 304):
                    return response
                asked = _retry_after(response.headers.get("retry-after"), time.time())
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
            # Never sooner than the server's Retry-After (503, 429), within the bound.
            delay = max(asked, min(self.retry_cap, self.retry_base * 2**attempt) * self._jitter())
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
        # 429 Too Many Requests (a proxy's or a balancer's) is "come back later" too.
        retryable = response.status_code >= 500 or response.status_code == 429
        cls = Unavailable if retryable else IntegrityFailure
        message = f"HTTP {response.status_code} from the catalog server: {message}"
    return cls(message, **details)


def _retry_after(value: str | None, now: float) -> float:
    """Seconds a ``Retry-After`` asks for (delta-seconds or an HTTP-date; RFC 9110 10.2.3),
    0 when absent or unreadable."""
    if value is None:
        return 0.0
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(int(text[:9]))
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return 0.0
    if when.tzinfo is None:
        return 0.0
    return max(0.0, when.timestamp() - now)


def _integrity(message: str, field: str, **reason: str) -> IntegrityFailure:
    return IntegrityFailure(
        f"the view received is not the one asked for: {message}", field=field, **reason
    )


def _text(obj: dict[str, Any], name: str, path: str, *, nullable: bool = False) -> Any:
    value = obj.get(name)
    if isinstance(value, str) or (nullable and value is None and name in obj):
        return value
    raise _integrity(f"{path}.{name} is not a string", f"{path}.{name}")


def _objects(body: dict[str, Any], name: str) -> list[dict[str, Any]]:
    items = body.get(name)
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise _integrity(f"$.{name} is not a list of objects", f"$.{name}")
    return items


def _body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError as exc:
        raise _integrity(f"the body is not JSON: {exc}", "$") from None
    if not isinstance(body, dict):
        raise _integrity("the body is not a JSON object", "$")
    return body


def _verified_view(
    body: dict[str, Any],
    response: httpx.Response,
    audience: Audience,
    min_revision: int | None,
    *,
    proven: bool = False,
) -> AudienceView:
    """The view of a 200, every digest the client can check recomputed (module docstring).

    Built only from the verified fields; raises ``IntegrityFailure`` naming the JSON path
    of the first field that does not check out."""
    name = f"{audience.kind.value}:{audience.id}"
    if body.get("audience") != name:
        raise _integrity(
            f"$.audience is {body.get('audience')!r}, not the audience asked for {name!r}",
            "$.audience",
        )
    revision = body.get("revision")
    if type(revision) is not int or revision < 0:
        raise _integrity("$.revision is not a non-negative integer", "$.revision")
    if min_revision is not None and revision < min_revision:
        raise _integrity(
            f"$.revision is {revision}, below the min_revision {min_revision} asked for "
            "(the server must answer STALE)",
            "$.revision",
        )
    content = _text(body, "content_digest", "$")
    recorded = _text(body, "audience_digest", "$")
    grants, grant_rows = [], []
    for n, g in enumerate(_objects(body, "grants")):
        at = f"$.grants[{n}]"
        row = [
            _text(g, "pack", at),
            _text(g, "kind", at),
            _text(g, "key", at),
            _text(g, "credential_set", at, nullable=True),
            _text(g, "install_id", at),
        ]
        grant_rows.append(row)
        grants.append(dict(zip(_GRANT_FIELDS, row, strict=True)))
    facts, fact_rows = [], []
    for n, f in enumerate(_objects(body, "facts")):
        at = f"$.facts[{n}]"
        pack, install_id = _text(f, "pack", at), _text(f, "install_id", at)
        kind, key = _text(f, "kind", at), _text(f, "key", at)
        payload_hash, claimed = _text(f, "payload_hash", at), _text(f, "fact_digest", at)
        parts = {p: f.get(p) for p in ("payload", "requires", "credential_sets")}
        if not all(p in f for p in parts):
            raise _integrity(f"{at} lacks payload, requires or credential_sets", at)
        try:
            stored = fact_bytes(
                kind, key, parts["payload"], parts["requires"], parts["credential_sets"]
            )
        except InvalidInput as exc:
            raise _integrity(
                f"{at} is not canonical JSON: {exc.message}", at, reason="bad_fact_digest"
            ) from None
        recomputed = fact_digest(pack, install_id, payload_hash, stored).hex()
        if recomputed != claimed:
            raise _integrity(
                f"{at} ({pack}/{kind}/{key}) does not match its fact digest: its payload, "
                "requires or credential_sets were altered",
                at,
                reason="bad_fact_digest",
            )
        fact_rows.append([pack, install_id, kind, key, recomputed])
        facts.append(
            {
                "pack": pack,
                "install_id": install_id,
                "kind": kind,
                "key": key,
                **parts,
                "payload_hash": payload_hash,
                "fact_digest": recomputed,
            }
        )
    if not _DIGEST.fullmatch(recorded) or recorded != audience_digest(
        (audience.kind.value, str(audience.id)), grant_rows, fact_rows
    ):
        raise _integrity(
            "the grants and facts received do not match $.audience_digest",
            "$.audience_digest",
            reason="bad_audience_digest",
        )
    view = AudienceView(
        audience=name,
        revision=revision,
        content_digest=content,
        audience_digest=recorded,
        grants=grants,
        facts=facts,
    )
    # A proven view (R29) may come without one: it is never revalidated by ETag.
    etag = response.headers.get("etag")
    if etag != view.etag and (etag is not None or not proven):
        raise _integrity("the ETag does not name the audience digest", "etag")
    return view
