"""The runtime reader: one audience's view at the active catalog revision (R18, R19).

One SELECT statement — one consistent snapshot on every engine, so it needs
no surrounding transaction — answers everything:

1. the views it reads are running, and the head revision, its content digest
   and this audience's recorded view digest;
2. the audience's grant edges in force at the head, each joined with the fact
   it names and with the pack's *current* activation.

Then, without another query, the reader fails closed: MISSING when the
audience has no grants (the same bytes whatever the cause), STALE when the
head is older than required or a bound generation is no longer active,
INTEGRITY when a fact's bytes or the audience's rows no longer match their
recorded digests. There is no fallback to the compatibility view, the log or
the sources.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from operator import itemgetter
from typing import Any, Protocol

import orjson

from domain.catalog import audience_digest
from domain.content import fact_hasher
from domain.errors import IntegrityFailure, InvalidInput, LifecycleRejected, Missing, Stale
from domain.identity import Audience
from projections.catalog_views import OPEN, CatalogView
from projections.framework import Projection, code_mismatch
from projections.lifecycle_views import PackActivationView, PackComponentView, PackGenerationView

#: The one MISSING answer, identical for every cause (R19: non-disclosing).
MISSING_MESSAGE = "no catalog view is published for this audience"


@dataclass(frozen=True)
class AudienceView:
    """What one audience may use at one revision."""

    audience: str
    revision: int
    content_digest: str
    audience_digest: str
    grants: list[dict[str, Any]]
    facts: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {
            "audience": self.audience,
            "revision": self.revision,
            "content_digest": self.content_digest,
            "audience_digest": self.audience_digest,
            "grants": self.grants,
            "facts": self.facts,
        }


@dataclass(frozen=True)
class CatalogHead:
    revision: int
    content_digest: str


def parse_audience(kind: str, ident: str) -> Audience:
    """Typed audience from its two parts; INVALID names which part is bad."""
    try:
        return Audience.of(kind, ident)
    except InvalidInput as exc:
        part = exc.details.get("part", "id")
        raise InvalidInput(
            f"audience {part} is invalid: {exc.message}", field=f"audience.{part}", part=part
        ) from None


def parse_revision(value: object, *, field: str = "min_revision") -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidInput(f"{field} must be a non-negative integer", field=field, part="revision")
    text = str(value)
    # isascii: str.isdigit() also accepts digits int() refuses ('²') or reads ('١').
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise InvalidInput(
            f"{field} must be a non-negative integer, got {text!r}", field=field, part="revision"
        )
    return int(text)


def _missing() -> Missing:
    return Missing(MISSING_MESSAGE)


def _code(name: str) -> str:
    return f"MAX(CASE WHEN name = X'{name.encode().hex()}' THEN code_version END)"


#: The view code versions this program serves (R25), in the order the statement reads them.
_SERVED: tuple[type[Projection], ...] = (
    CatalogView,
    PackComponentView,
    PackActivationView,
    PackGenerationView,
)


def _live(name: str) -> str:
    return f"MAX(CASE WHEN name = X'{name.encode().hex()}' THEN live_version END)"


#: The whole read as one statement (one snapshot, one round trip): a one-row header
#: (stopped flag and live versions of the three views, head revision, its digest,
#: this audience's recorded digest) left-joined with the audience's grants in force,
#: their facts and the packs' current activations, all by key on the physical view
#: tables. Rows are put in bytewise order in Python (cheaper than a temp b-tree).
_VIEW_SQL = """
SELECT h.stopped, h.revision, r.content_digest, u.digest, h.cc, h.pc, h.ac, h.nc,
       g.pack, g.kind, g.{key}, g.credential_set, g.install_id, g.payload_hash,
       c.fact, c.fact_digest, a.install_id,
       a.epoch, a.payload_hash, n.status, n.epoch, n.applied_payload_hash
FROM (SELECT s.stopped, s.cv, s.pv, s.av, s.nv, s.cc, s.pc, s.ac, s.nc,
             (SELECT MAX(revision) FROM view_catalog_revision WHERE view_version = s.cv)
               AS revision
      FROM (SELECT MAX(stopped) AS stopped, {cat} AS cv, {comp} AS pv, {act} AS av,
                   {gen} AS nv, {cat_code} AS cc, {comp_code} AS pc, {act_code} AS ac,
                   {gen_code} AS nc
            FROM projection_state WHERE name IN ({views})) s) h
LEFT JOIN view_catalog_revision r ON r.view_version = h.cv AND r.revision = h.revision
LEFT JOIN view_catalog_audience u
  ON u.view_version = h.cv AND u.audience_kind = {p} AND u.audience_id = {p}
  AND u.to_revision = {p}
LEFT JOIN view_catalog_grant g
  ON g.view_version = h.cv AND g.audience_kind = {p} AND g.audience_id = {p}
  AND g.to_revision = {p}
LEFT JOIN view_pack_component c
  ON c.view_version = h.pv AND c.pack = g.pack AND c.install_id = g.install_id
  AND c.kind = g.kind AND c.{key} = g.{key}
LEFT JOIN view_pack_activation a ON a.view_version = h.av AND a.pack = g.pack
LEFT JOIN view_pack_generation n
  ON n.view_version = h.nv AND n.pack = a.pack AND n.install_id = a.install_id
"""

_VIEWS = ", ".join(
    f"X'{n.encode().hex()}'"
    for n in ("catalog", "pack_component", "pack_activation", "pack_generation")
)

_HEAD_SQL = """
SELECT revision, content_digest FROM _System_CatalogRevision ORDER BY revision DESC LIMIT 1
"""


class StatementStore(Protocol):
    @property
    def is_sqlite(self) -> bool: ...

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...


class CatalogReader:
    """Reads audience views; every failure is typed (R19)."""

    def __init__(self, store: StatementStore) -> None:
        self.store = store
        p = "?" if store.is_sqlite else "%s"
        key = '"key"' if store.is_sqlite else "`key`"
        self._view_sql = _VIEW_SQL.format(
            p=p,
            key=key,
            views=_VIEWS,
            cat=_live("catalog"),
            comp=_live("pack_component"),
            act=_live("pack_activation"),
            gen=_live("pack_generation"),
            cat_code=_code("catalog"),
            comp_code=_code("pack_component"),
            act_code=_code("pack_activation"),
            gen_code=_code("pack_generation"),
        )

    def head(self) -> CatalogHead:
        rows = self.store.query(_HEAD_SQL)
        if not rows:
            raise _missing()
        return CatalogHead(int(rows[0][0]), bytes(rows[0][1]).decode())

    def view(self, audience: Audience, *, min_revision: int | None = None) -> AudienceView:
        """The audience's facts at the head revision, verified, from one statement."""
        kind, ident = audience.kind.value.encode(), audience.id.encode()
        rows = self.store.query(self._view_sql, (kind, ident, OPEN, kind, ident, OPEN))
        stopped, revision, content, recorded = rows[0][:4]
        for view, built_with in zip(_SERVED, rows[0][4:8], strict=True):
            if built_with is not None and built_with != view.version:
                raise code_mismatch(view.name, int(built_with), view.version)
        if stopped:
            raise Stale(
                "a catalog view is stopped and behind the log; it is not served "
                "until it is rebuilt",
                axis="projection",
            )
        if revision is None:
            raise _missing()
        if min_revision is not None and min_revision > revision:
            raise Stale(
                f"revision {min_revision} is required; the catalog is at {revision}",
                axis="revision",
                required_revision=min_revision,
                served_revision=int(revision),
            )
        # Bytewise (pack, kind, key, credential set): the publisher's digest order (R3).
        # Both drivers return BLOBs as bytes, so the row slices are the cache key as is.
        grants = tuple(sorted([row[8:] for row in rows if row[8] is not None], key=_GRANT_ORDER))
        if not grants or recorded is None:
            raise _missing()
        pair = (audience.kind.value, audience.id)
        return _verified(pair, int(revision), bytes(content), bytes(recorded), grants)


_GRANT_ORDER = itemgetter(0, 1, 2, 3)


@lru_cache(maxsize=1 << 16)
def _fact_matches(
    pack: str, install_id: str, payload_hash: str, fact: bytes, stored: bytes
) -> bool:
    """Does ``fact`` hash to ``stored``? Cached by the exact bytes (facts are shared by
    many audiences); a changed byte is another key and is hashed afresh."""
    return fact_hasher(pack, install_id, payload_hash)(fact) == stored


def _consistent(
    pack: str,
    active: bytes,
    epoch: int,
    payload_hash: bytes,
    status: bytes | None,
    generation_epoch: int | None,
    applied: bytes | None,
) -> None:
    """The pointer selects an active generation that agrees with it (R13), or the read
    fails closed naming what was found (the classifier's rules, on the views)."""
    if status is None:
        found = "the activation names a generation that is not in the log"
    elif status != b"active":
        found = f"the activation names generation {active.decode()} which is {status.decode()}"
    elif generation_epoch != epoch or applied != payload_hash:
        found = "the active generation and the activation disagree"
    else:
        return
    raise LifecycleRejected(
        f"pack {pack!r} is in an inconsistent state: {found}",
        reason="INCONSISTENT_STATE",
        rule="R13",
        pack=pack,
        found=found,
    )


# A verified view is cached by its *complete* stored input (the exact rows, fact
# bytes and digests included, the revision and the recorded digests): unchanged
# rows skip re-verification, while a single changed byte is another key and is
# verified, and caught, afresh. Cached views are shared: treat them as read-only.
@lru_cache(maxsize=4096)
def _verified(
    pair: tuple[str, str],
    revision: int,
    content: bytes,
    recorded: bytes,
    rows: tuple[tuple[Any, ...], ...],
) -> AudienceView:
    grants: list[list[Any]] = []
    facts: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for row in rows:
        pack_b, kind_b, key_b, cred_b, install_b, hash_b, fact, fact_digest, active_b = row[:9]
        pack, kind, key = pack_b.decode(), kind_b.decode(), key_b.decode()
        install_id, payload_hash = install_b.decode(), hash_b.decode()
        if active_b is not None:
            _consistent(pack, active_b, *row[9:])
        if active_b != install_b:
            raise Stale(
                f"pack {pack!r} is no longer served by the bound generation {install_id}",
                axis="activation",
                served_revision=revision,
                pack=pack,
                bound_install_id=install_id,
                active_install_id=active_b.decode() if active_b else None,
            )
        if fact is None:
            raise IntegrityFailure(
                f"the fact {pack}/{kind}/{key} of a grant is missing", pack=pack, kind=kind, key=key
            )
        if not _fact_matches(pack, install_id, payload_hash, fact, fact_digest):
            raise IntegrityFailure(
                f"the stored fact {pack}/{kind}/{key} does not match its digest",
                pack=pack,
                kind=kind,
                key=key,
                revision=revision,
            )
        grants.append([pack, kind, key, cred_b.decode() or None, install_id])
        fact_id = (pack, install_id, kind, key)
        if fact_id not in facts:
            data = orjson.loads(fact)
            facts[fact_id] = {
                "pack": pack,
                "install_id": install_id,
                "kind": kind,
                "key": key,
                "payload": data["payload"],
                "requires": data["requires"],
                "credential_sets": data["credential_sets"],
                "fact_digest": fact_digest.hex(),
            }
    fact_entries = [[*k, facts[k]["fact_digest"]] for k in sorted(facts)]
    if audience_digest(pair, grants, fact_entries) != recorded.decode():
        raise IntegrityFailure(
            "the stored view of this audience does not match its recorded digest",
            revision=revision,
        )
    return AudienceView(
        audience=f"{pair[0]}:{pair[1]}",
        revision=revision,
        content_digest=content.decode(),
        audience_digest=recorded.decode(),
        grants=[
            {"pack": g[0], "kind": g[1], "key": g[2], "credential_set": g[3], "install_id": g[4]}
            for g in grants
        ],
        facts=[facts[k] for k in sorted(facts)],
    )
