"""What a runtime is served, and the digests that prove it (R18, R19, R29) — pure.

The one definition of the fact digest and of the audience digest, shared by the
store (``domain.content``, ``domain.catalog``, the views and the reader, which
re-export or import them from here) and by the runtime client
(``ledger.client``), which recomputes both from the bytes it receives. This
module imports only the standard library, ``domain.canonical`` and
``domain.digests`` (orjson, blake3): a runtime that reads its catalog needs no
server stack.

``AudienceView`` and ``CatalogHead`` are what the client returns; they carry the
same fields as the local reader's (``projections.reader``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import orjson

from domain.canonical import canonical_bytes, canonical_bytes_trusted
from domain.digests import Purpose, digest, hasher, lp, u64


def fact_digest(pack: str, install_id: str, payload_hash: str, fact: bytes) -> bytes:
    """Identity of one immutable fact: its generation coordinates and its exact bytes."""
    return fact_hasher(pack, install_id, payload_hash)(fact)


@lru_cache(maxsize=4096)
def fact_hasher(pack: str, install_id: str, payload_hash: str) -> Callable[[bytes], bytes]:
    """``fact_digest`` with the generation coordinates hashed once, for many facts.

    Same bytes as ``digest(FACT, lp(pack, install_id, payload_hash, fact))``.
    """
    base = hasher(Purpose.FACT)
    base.update(lp(pack.encode(), install_id.encode(), payload_hash.encode()))

    def one(fact: bytes) -> bytes:
        h = base.copy()
        h.update(u64(len(fact)))
        h.update(fact)
        return bytes(h.digest())

    return one


def fact_bytes(kind: str, key: str, payload: Any, requires: Any, credential_sets: Any) -> bytes:
    """The stored bytes of one fact (a component, ``Component.to_json``) from its parts.

    Checked canonical encoding (R4): a part that is not canonical JSON (a float, an
    out-of-range integer) raises ``InvalidInput`` naming its path."""
    return canonical_bytes(
        {
            "kind": kind,
            "key": key,
            "payload": payload,
            "requires": requires,
            "credential_sets": credential_sets,
        }
    )


def audience_digest(
    audience: tuple[str, str], grants: list[list[Any]], facts: list[list[Any]]
) -> str:
    """Digest of what one audience is served: its grant edges and the facts they name.

    ``grants`` are ``[pack, kind, key, credential_set, install_id]`` and ``facts``
    ``[pack, install_id, kind, key, fact_digest_hex]``, both in bytewise order.
    The publisher records it; the reader recomputes it from the rows it returns
    and fails with INTEGRITY on any difference (R19); the runtime client
    recomputes it from the body it receives, each fact digest recomputed first.
    """
    body = canonical_bytes_trusted({"audience": list(audience), "grants": grants, "facts": facts})
    return digest(Purpose.AUDIENCE_VIEW, body).hex()


@dataclass(frozen=True)
class AudienceView:
    """What one audience may use at one revision."""

    audience: str
    revision: int
    content_digest: str
    audience_digest: str
    grants: list[dict[str, Any]]
    facts: list[dict[str, Any]]
    #: False: ``content_digest`` is the server's word. It covers every audience's
    #: view, so a runtime that sees only its own cannot recompute it (R19, R29).
    content_digest_verified: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "audience": self.audience,
            "revision": self.revision,
            "content_digest": self.content_digest,
            "audience_digest": self.audience_digest,
            "grants": self.grants,
            "facts": self.facts,
        }

    @cached_property
    def body(self) -> bytes:
        """The JSON document of ``to_json``, serialized once per verified view."""
        return orjson.dumps(self.to_json())

    @property
    def etag(self) -> str:
        """The HTTP validator: weak, from the audience's own digest."""
        return f'W/"{self.audience_digest}"'


@dataclass(frozen=True)
class CatalogHead:
    revision: int
    content_digest: str
