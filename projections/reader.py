"""The runtime reader: one audience's view at the active catalog revision (R18, R19).

One read transaction (a consistent snapshot: REPEATABLE READ on the MySQL
family, a read transaction on SQLite) answers everything:

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

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from sqlalchemy.engine import Connection

from domain.catalog import audience_digest
from domain.content import fact_hasher
from domain.errors import IntegrityFailure, InvalidInput, Missing, Stale
from domain.identity import Audience
from projections.catalog_views import OPEN

#: The one MISSING answer, identical for every cause (R19: non-disclosing).
MISSING_MESSAGE = "no catalog view is published for this audience"


class ReadStore(Protocol):
    @property
    def is_sqlite(self) -> bool: ...

    def read(self) -> AbstractContextManager[Connection]: ...


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
    if not text.isdigit() or len(text) > 18:
        raise InvalidInput(
            f"{field} must be a non-negative integer, got {text!r}", field=field, part="revision"
        )
    return int(text)


def _missing() -> Missing:
    return Missing(MISSING_MESSAGE)


_READ_VIEWS = ", ".join(
    f"X'{n.encode().hex()}'" for n in ("catalog", "pack_component", "pack_activation")
)
_STATE_SQL = """
SELECT
  (SELECT MAX(stopped) FROM projection_state WHERE name IN ({views})),
  (SELECT revision FROM _System_CatalogRevision ORDER BY revision DESC LIMIT 1),
  (SELECT content_digest FROM _System_CatalogRevision ORDER BY revision DESC LIMIT 1),
  (SELECT digest FROM _System_CatalogAudience
    WHERE audience_kind = {p} AND audience_id = {p} AND to_revision = {p})
"""

_GRANTS_SQL = """
SELECT g.pack, g.kind, g.{key}, g.credential_set, g.install_id, g.payload_hash,
       c.fact, c.fact_digest, a.install_id
FROM _System_CatalogGrant g
LEFT JOIN _System_PackComponent c
  ON c.pack = g.pack AND c.install_id = g.install_id AND c.kind = g.kind AND c.{key} = g.{key}
LEFT JOIN _System_PackActivation a ON a.pack = g.pack
WHERE g.audience_kind = {p} AND g.audience_id = {p} AND g.to_revision = {p}
ORDER BY g.pack, g.kind, g.{key}, g.credential_set
"""

_HEAD_SQL = """
SELECT revision, content_digest FROM _System_CatalogRevision ORDER BY revision DESC LIMIT 1
"""


class CatalogReader:
    """Reads audience views; every failure is typed (R19)."""

    def __init__(self, store: ReadStore) -> None:
        self.store = store
        p = "?" if store.is_sqlite else "%s"
        key = '"key"' if store.is_sqlite else "`key`"
        self._state_sql = _STATE_SQL.format(p=p, views=_READ_VIEWS)
        self._grants_sql = _GRANTS_SQL.format(p=p, key=key)

    def head(self) -> CatalogHead:
        with self.store.read() as conn:
            cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                cursor.execute(_HEAD_SQL)
                row = cursor.fetchone()
            finally:
                cursor.close()
        if row is None:
            raise _missing()
        return CatalogHead(int(row[0]), bytes(row[1]).decode())

    def view(self, audience: Audience, *, min_revision: int | None = None) -> AudienceView:
        """The audience's facts at the head revision, verified, in one snapshot."""
        kind, ident = audience.kind.value.encode(), audience.id.encode()
        with self.store.read() as conn:
            cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                cursor.execute(self._state_sql, (kind, ident, OPEN))
                state = cursor.fetchone()
                assert state is not None  # one row of scalar subqueries, always
                stopped, revision, content, recorded = state
                if stopped:
                    raise Stale(
                        "a catalog view is stopped and behind the log; it is not "
                        "served until it is rebuilt",
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
                cursor.execute(self._grants_sql, (kind, ident, OPEN))
                rows = list(cursor.fetchall())
            finally:
                cursor.close()
        if not rows or recorded is None:
            raise _missing()
        return self._verify(
            audience, int(revision), bytes(content).decode(), bytes(recorded).decode(), rows
        )

    @staticmethod
    def _verify(
        audience: Audience, revision: int, content: str, recorded: str, rows: list[Any]
    ) -> AudienceView:
        grants: list[list[Any]] = []
        facts: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        for (
            pack_b,
            kind_b,
            key_b,
            cred_b,
            install_b,
            hash_b,
            fact_raw,
            fact_digest,
            active_b,
        ) in rows:
            pack, kind, key = bytes(pack_b).decode(), bytes(kind_b).decode(), bytes(key_b).decode()
            cred = bytes(cred_b).decode() or None
            install_id, payload_hash = bytes(install_b).decode(), bytes(hash_b).decode()
            if active_b is None or bytes(active_b) != bytes(install_b):
                raise Stale(
                    f"pack {pack!r} is no longer served by the bound generation {install_id}",
                    axis="activation",
                    served_revision=revision,
                    pack=pack,
                    bound_install_id=install_id,
                    active_install_id=bytes(active_b).decode() if active_b else None,
                )
            if fact_raw is None:
                raise IntegrityFailure(
                    f"the fact {pack}/{kind}/{key} of a grant is missing",
                    pack=pack,
                    kind=kind,
                    key=key,
                )
            fact = bytes(fact_raw)
            if fact_hasher(pack, install_id, payload_hash)(fact) != bytes(fact_digest):
                raise IntegrityFailure(
                    f"the stored fact {pack}/{kind}/{key} does not match its digest",
                    pack=pack,
                    kind=kind,
                    key=key,
                    revision=revision,
                )
            grants.append([pack, kind, key, cred, install_id])
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
                    "fact_digest": bytes(fact_digest).hex(),
                }
        fact_entries = [[*k, facts[k]["fact_digest"]] for k in sorted(facts)]
        pair = (audience.kind.value, audience.id)
        if audience_digest(pair, grants, fact_entries) != recorded:
            raise IntegrityFailure(
                "the stored view of this audience does not match its recorded digest",
                revision=revision,
            )
        return AudienceView(
            audience=str(audience),
            revision=revision,
            content_digest=content,
            audience_digest=recorded,
            grants=[
                {
                    "pack": g[0],
                    "kind": g[1],
                    "key": g[2],
                    "credential_set": g[3],
                    "install_id": g[4],
                }
                for g in grants
            ],
            facts=[facts[k] for k in sorted(facts)],
        )
