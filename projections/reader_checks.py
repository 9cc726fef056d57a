"""The runtime reader's checks of view rows against the log (R13, R18, R28): a row that is
missing, extra or edited is INTEGRITY naming table and key; a bound generation the log no
longer has active is STALE; a pointer that disagrees with its generation is
INCONSISTENT_STATE."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache
from operator import itemgetter
from typing import Any

import orjson

from domain.classifier import pointer_problem
from domain.errors import IntegrityFailure, LifecycleRejected, Stale
from domain.event_types import T_ACTIVATED, T_REMOVED, T_VIEW_PUBLISHED, Decoded
from domain.lifecycle import activation_id, generation_id
from domain.served import AudienceView, audience_digest, fact_hasher
from projections import checks

_GRANT_ORDER = itemgetter(0, 1, 2, 3)


def sorted_grants(
    pair: tuple[str, str], rows: list[tuple[Any, ...]]
) -> tuple[tuple[Any, ...], ...]:
    """The grant rows in the publisher's digest order; a key cell that is not the bytes
    the schema declares (a column stored as another type) is an edited row (INTEGRITY)."""
    for row in rows:
        if any(type(cell) is not bytes for cell in row[:6]):
            raise view_row_mismatch(
                "view_catalog_grant",
                {"audience": f"{pair[0]}:{pair[1]}"},
                "a grant cell is not the bytes the schema declares",
            )
    return tuple(sorted(rows, key=_GRANT_ORDER))


def text_cell(value: object) -> str:
    """A stored digest cell as text; another type is an edited row (INTEGRITY)."""
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            pass
    raise IntegrityFailure(
        f"a catalog view cell is {type(value).__name__}, not the text the schema declares",
        rule="R28",
    )


def view_row_mismatch(table: str, key: dict[str, Any], problem: str) -> IntegrityFailure:
    """A view row that is missing, extra or edited: INTEGRITY naming table and key (R28)."""
    return IntegrityFailure(
        f"{table} does not match the log ({problem}); `catalog-ledger projections verify` "
        "names the first differing row and `projections rebuild` restores the view",
        rule="R28",
        table=table,
        key=key,
    )


def log_shape(event: Decoded, problem: str) -> IntegrityFailure:
    return IntegrityFailure(
        f"the log row at position {event.position} ({event.type}) is not what its type "
        f"declares: {problem}",
        position=event.position,
    )


def revision_of(lineage: Decoded) -> tuple[int, str, bool]:
    """(revision, content digest, carries an audience map) of a revision event."""
    d = lineage.data
    revision, digest, root = d.get("revision"), d.get("content_digest"), d.get("audiences_root")
    if type(revision) is not int or type(digest) is not str or not isinstance(root, str | None):
        raise log_shape(lineage, "revision, content_digest or audiences_root")
    return revision, digest, root is not None


def view_digest(published: Decoded, revision: int) -> str | None:
    """The digest an ``audience_view.published`` event records (at most ``revision``)."""
    d = published.data
    value, at = d.get("digest"), d.get("revision")
    if published.type != T_VIEW_PUBLISHED or type(at) is not int or at > revision:
        raise log_shape(published, "not an audience view of a published revision")
    if value is not None and type(value) is not str:
        raise log_shape(published, "digest is not a string")
    return value


def bound_generations(grants: tuple[tuple[Any, ...], ...]) -> list[tuple[str, str]]:
    """The distinct (pack, install id) the grant rows name."""
    try:
        return sorted({(bytes(g[0]).decode(), bytes(g[4]).decode()) for g in grants})
    except (TypeError, UnicodeDecodeError):
        raise view_row_mismatch(
            "view_catalog_grant", {}, "a grant cell is not the text the schema declares"
        ) from None


@lru_cache(maxsize=1 << 16)
def _fact_matches(
    pack: str, install_id: str, payload_hash: str, fact: bytes, stored: bytes
) -> bool:
    """Does ``fact`` hash to ``stored``? Cached by the exact bytes (facts are shared by
    many audiences); a changed byte is another key and is hashed afresh."""
    return fact_hasher(pack, install_id, payload_hash)(fact) == stored


def still_active(
    pack: str,
    install_id: str,
    log: Mapping[Any, Decoded],
    revision: int,
    last_event: Callable[[Any], Decoded | None],
) -> None:
    """The pack's pointer, as its last log event has it, selects the bound generation, and
    that generation's last event agrees (R13, R18): else STALE (the pointer moved on to a
    consistent generation: ``last_event`` reads it) or INCONSISTENT_STATE (what the log
    says does not add up), naming what was found."""
    pointer = log.get(activation_id(pack))
    active = None
    if pointer is not None and pointer.type != T_REMOVED:
        active = pointer.data.get("install_id")
    if active != install_id:
        if pointer is not None and isinstance(active, str):
            _consistent(pack, active, pointer, last_event(generation_id(pack, active)))
        raise Stale(
            f"pack {pack!r} is no longer served by the bound generation {install_id}",
            axis="activation",
            served_revision=revision,
            pack=pack,
            bound_install_id=install_id,
            active_install_id=active if isinstance(active, str) else None,
        )
    assert pointer is not None
    _consistent(pack, install_id, pointer, log.get(generation_id(pack, install_id)))


def _consistent(pack: str, install_id: str, pointer: Decoded, generation: Decoded | None) -> None:
    """INCONSISTENT_STATE unless the pointer and its generation's last event agree (R13)."""
    problem = pointer_problem(
        install_id,
        pointer.data.get("epoch"),
        pointer.data.get("payload_hash"),
        None if generation is None else _GENERATION_STATUS.get(generation.type, generation.type),
        None if generation is None else generation.data.get("epoch"),
        None if generation is None else generation.data.get("applied_payload_hash"),
    )
    if problem is not None:
        raise LifecycleRejected(
            f"pack {pack!r} is in an inconsistent state: {problem}",
            reason="INCONSISTENT_STATE",
            rule="R13",
            pack=pack,
            found=problem,
        )


#: A generation's status after its last event.
_GENERATION_STATUS = {
    T_ACTIVATED: "active",
    "generation.prepared": "preparing",
    "generation.retired": "retired",
    "generation.failed": "failed",
}


# A verified view is cached by its *complete* stored input (the exact rows, fact
# bytes and digests included, the revision and the recorded digests): unchanged
# rows skip re-verification, while a single changed byte is another key and is
# verified, and caught, afresh. Cached views are shared: treat them as read-only.
@lru_cache(maxsize=4096)
def verified(
    pair: tuple[str, str],
    revision: int,
    content: bytes,
    recorded: bytes,
    rows: tuple[tuple[Any, ...], ...],
) -> AudienceView:
    grants: list[list[Any]] = []
    facts: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for row in rows:
        try:
            pack_b, kind_b, key_b, cred_b, install_b, hash_b, fact, fact_digest = row[:8]
            pack, kind, key = pack_b.decode(), kind_b.decode(), key_b.decode()
            install_id, payload_hash = install_b.decode(), hash_b.decode()
            cred = cred_b.decode() or None
        except (AttributeError, UnicodeDecodeError):
            raise view_row_mismatch(
                "view_catalog_grant",
                {"audience": f"{pair[0]}:{pair[1]}", "revision": revision},
                "a grant cell is not the text the schema declares",
            ) from None
        if fact is None:
            raise IntegrityFailure(
                f"the fact {pack}/{kind}/{key} of a grant is missing", pack=pack, kind=kind, key=key
            )
        if (
            type(fact) is not bytes
            or type(fact_digest) is not bytes
            or (
                checks.on(checks.FACT)
                and not _fact_matches(pack, install_id, payload_hash, fact, fact_digest)
            )
        ):
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
                "payload_hash": payload_hash,
                "fact_digest": fact_digest.hex(),
            }
    fact_entries = [[*k, facts[k]["fact_digest"]] for k in sorted(facts)]
    if (
        checks.on(checks.DIGEST)
        and audience_digest(pair, grants, fact_entries) != recorded.decode()
    ):
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
