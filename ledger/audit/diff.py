"""What changed between two catalog revisions, computed from the log alone (R17, R28).

``diff --from-revision A --to-revision B`` replays the catalog lineage with the replay
``view --at-revision`` and ``audit verify`` use (``CatalogReplay``): each revision's
served content is rebuilt from the lifecycle and binding events up to it and checked
against the content digest its revision event committed. No view row is read, so an
edited, missing or extra view row cannot change what the diff shows (R28).

Per audience whose digest differs between the two revisions:

- a fact is one component an audience is served, identified by pack, kind and key; it
  is *added*, *removed*, or *changed* when its document (payload, requires, credential
  sets) differs, shown as a JSON diff (``domain.json_diff``). The same document served
  by another generation of its pack is not a change of the fact: the grants that name
  it are *rebound*.
- a grant is identified by pack, kind, key and credential set: *added*, *removed*, or
  *rebound* when it names another install id.

Per pack that either revision binds (only the audience's packs with ``--audience``):
its activation (install id, source revision, epoch, payload hash) when it moved, or
was added or removed. Every list is in bytewise order; A > B is the reverse diff, and
A == B is empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import orjson

from domain.errors import IntegrityFailure, InvalidInput, Missing
from domain.event_types import T_PUBLISHED
from domain.identity import Audience
from domain.json_diff import JsonChange, json_changes
from ledger.audit.history import catalog_events, feed
from ledger.audit.replay import CatalogReplay
from ledger.store.runtime import Ledger
from projections.reader import parse_revision
from publisher.catalog import BuiltCatalog

Pair = tuple[str, str]
#: A grant as the diff identifies it: pack, kind, key, credential set.
GrantKey = tuple[str, str, str, str | None]
#: A fact as the diff identifies it: pack, kind, key.
FactKey = tuple[str, str, str]

# -- what the diff returns (``--json``; the API returns the same) ---------------------------


class DiffSide(TypedDict):
    revision: int
    position: int  # the log position of the revision event
    content_digest: str


class DiffFact(TypedDict):
    pack: str
    kind: str
    key: str
    install_id: str
    fact_digest: str
    payload: Any
    requires: list[Any]
    credential_sets: list[str] | None


class FactVersion(TypedDict):
    install_id: str
    fact_digest: str


FactChange = TypedDict(
    "FactChange",
    {
        "pack": str,
        "kind": str,
        "key": str,
        "from": FactVersion,
        "to": FactVersion,
        "changes": list[JsonChange],  # paths into the fact: /payload/…, /requires, …
    },
)


class DiffGrant(TypedDict):
    pack: str
    kind: str
    key: str
    credential_set: str | None
    install_id: str


class GrantRebind(TypedDict):
    pack: str
    kind: str
    key: str
    credential_set: str | None
    from_install_id: str
    to_install_id: str


class AudienceDiff(TypedDict):
    audience: str
    change: Literal["added", "removed", "changed"]
    from_digest: str | None
    to_digest: str | None
    facts_added: list[DiffFact]
    facts_removed: list[DiffFact]
    facts_changed: list[FactChange]
    grants_added: list[DiffGrant]
    grants_removed: list[DiffGrant]
    grants_rebound: list[GrantRebind]


class Activation(TypedDict):
    install_id: str
    revision: str  # the source commit of the generation
    epoch: int
    payload_hash: str


ActivationMove = TypedDict(
    "ActivationMove",
    {
        "pack": str,
        "change": Literal["added", "removed", "moved"],
        "from": Activation | None,
        "to": Activation | None,
    },
)


class DiffSummary(TypedDict):
    """Counts summed over the changed audiences (a fact added to two audiences counts 2)."""

    audiences_changed: int
    facts_added: int
    facts_changed: int
    facts_removed: int
    grants_added: int
    grants_removed: int
    grants_rebound: int
    activations_moved: int


RevisionDiff = TypedDict(
    "RevisionDiff",
    {
        "from": DiffSide,
        "to": DiffSide,
        "audience": str | None,  # the --audience it was restricted to, if any
        "summary": DiffSummary,
        "audiences": list[AudienceDiff],
        "activations": list[ActivationMove],
    },
)

# -- one revision's served content, rebuilt from the log ------------------------------------


@dataclass(frozen=True)
class _Revision:
    side: DiffSide
    digests: dict[Pair, str]
    grants: dict[Pair, dict[GrantKey, str]]  # audience -> grant -> install id
    facts: dict[tuple[str, str, str, str], tuple[bytes, str]]  # (pack, install, kind, key)
    activations: dict[str, list[Any]]  # pack -> [pack, install id, revision, epoch, hash]


def _capture(
    replay: CatalogReplay, position: int, revision: int, built: BuiltCatalog, only: Pair | None
) -> _Revision:
    """What ``built`` serves (to ``only``, if given), with each fact's exact bytes: the
    generation's components as the log's ``generation.prepared`` event recorded them,
    taken now, while the replay still holds them."""
    digest_of = {(f[0], f[1], f[2], f[3]): f[4] for f in built.facts}
    grants: dict[Pair, dict[GrantKey, str]] = {}
    facts: dict[tuple[str, str, str, str], tuple[bytes, str]] = {}
    for g in built.grants:
        audience: Pair = (g[0], g[1])
        if only is not None and audience != only:
            continue
        pack, kind, key, cred, install_id = g[2], g[3], g[4], g[5], g[6]
        grants.setdefault(audience, {})[(pack, kind, key, cred)] = install_id
        fact_id = (pack, install_id, kind, key)
        if fact_id not in facts:
            component = replay.components.get((pack, install_id), {}).get((kind, key))
            if component is None:  # the content digest matched: the replay is wrong
                raise IntegrityFailure(
                    f"revision {revision} serves {pack}/{kind}/{key} of generation "
                    f"{install_id}, which the log holds no component for",
                    revision=revision,
                )
            facts[fact_id] = (component.fact, digest_of[fact_id])
    digests = {a: d for a, d in built.audience_digests.items() if only is None or a == only}
    return _Revision(
        side={"revision": revision, "position": position, "content_digest": built.content_digest},
        digests=digests,
        grants=grants,
        facts=facts,
        activations={a[0]: list(a) for a in built.activations},
    )


def _replay(
    ledger: Ledger, wanted: set[int], only: Pair | None
) -> tuple[dict[int, _Revision], int]:
    """Each revision of ``wanted`` the log published, rebuilt in one scan of the catalog
    lineage (in one read snapshot), and the last revision the scan saw (0: none)."""
    pending = set(wanted)
    replay = CatalogReplay()  # keeps each built revision: taken (or dropped) at once below
    found: dict[int, _Revision] = {}
    last = 0
    with ledger.db.read() as conn:
        for position, name, data in catalog_events(ledger, conn):
            feed(replay, position, name, data)
            if name != T_PUBLISHED:
                continue
            last = data["revision"]
            kept = replay.revisions.pop(last)
            if last in pending:
                found[last] = _capture(replay, kept[0], last, kept[1], only)
                pending.discard(last)
            if not pending:
                break
    return found, last


def _never_published(flag: str, revision: int, last: int) -> Missing:
    field = flag.removeprefix("--").replace("-", "_")
    where = f"the last is {last}" if last else "none has been published yet"
    return Missing(
        f"{flag} {revision}: revision {revision} was never published ({where})",
        field=field,
        flag=flag,
        revision=revision,
        last_revision=last,
    )


def _revision(flag: str, value: object) -> int:
    """A revision argument; INVALID naming the flag unless a non-negative integer."""
    field = flag.removeprefix("--").replace("-", "_")
    try:
        found = parse_revision(value, field=field)
    except InvalidInput:
        found = None
    if found is None:
        raise InvalidInput(
            f"{flag} must be a non-negative integer, got {value!r}",
            field=field,
            flag=flag,
            part="revision",
        )
    return found


def parse_request(
    from_revision: object, to_revision: object, audience: str | None
) -> tuple[int, int, Pair | None]:
    """The two revisions and the audience (``app:<id>`` / ``integration:<id>``), parsed;
    INVALID naming the flag or the audience's bad part."""
    parsed = None
    if audience is not None:
        found = Audience.parse(audience, field="audience")
        parsed = (found.kind.value, str(found.id))
    return (
        _revision("--from-revision", from_revision),
        _revision("--to-revision", to_revision),
        parsed,
    )


# -- the difference -------------------------------------------------------------------------


def _order(values: tuple[str | None, ...]) -> tuple[bytes, ...]:
    """Bytewise, a missing credential set first (the publisher's binding order, R3)."""
    return tuple((v or "").encode() for v in values)


def _document(fact: bytes) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads(fact)
    return {k: v for k, v in data.items() if k not in ("kind", "key")}


def _fact(side: _Revision, key: FactKey, install_id: str) -> DiffFact:
    pack, kind, name = key
    fact, digest = side.facts[(pack, install_id, kind, name)]
    data = _document(fact)
    return {
        "pack": pack,
        "kind": kind,
        "key": name,
        "install_id": install_id,
        "fact_digest": digest,
        "payload": data.get("payload"),
        "requires": data.get("requires", []),
        "credential_sets": data.get("credential_sets"),
    }


def _grant(key: GrantKey, install_id: str) -> DiffGrant:
    pack, kind, name, cred = key
    return {
        "pack": pack,
        "kind": kind,
        "key": name,
        "credential_set": cred,
        "install_id": install_id,
    }


def _audience(audience: Pair, a: _Revision, b: _Revision) -> AudienceDiff | None:
    before, after = a.digests.get(audience), b.digests.get(audience)
    if before == after:
        return None  # equal digests: equal grants and facts
    ga, gb = a.grants.get(audience, {}), b.grants.get(audience, {})
    # One generation per pack in a revision: a fact's install id is its grants'.
    fa = {(g[0], g[1], g[2]): i for g, i in ga.items()}
    fb = {(g[0], g[1], g[2]): i for g, i in gb.items()}
    changed: list[FactChange] = []
    for key in sorted(fa.keys() & fb.keys(), key=_order):
        (pack, kind, name), ia, ib = key, fa[key], fb[key]
        old, old_digest = a.facts[(pack, ia, kind, name)]
        new, new_digest = b.facts[(pack, ib, kind, name)]
        if old != new:
            changed.append(
                {
                    "pack": pack,
                    "kind": kind,
                    "key": name,
                    "from": {"install_id": ia, "fact_digest": old_digest},
                    "to": {"install_id": ib, "fact_digest": new_digest},
                    "changes": json_changes(_document(old), _document(new)),
                }
            )
    return {
        "audience": f"{audience[0]}:{audience[1]}",
        "change": "added" if before is None else "removed" if after is None else "changed",
        "from_digest": before,
        "to_digest": after,
        "facts_added": [_fact(b, k, fb[k]) for k in sorted(fb.keys() - fa.keys(), key=_order)],
        "facts_removed": [_fact(a, k, fa[k]) for k in sorted(fa.keys() - fb.keys(), key=_order)],
        "facts_changed": changed,
        "grants_added": [_grant(g, gb[g]) for g in sorted(gb.keys() - ga.keys(), key=_order)],
        "grants_removed": [_grant(g, ga[g]) for g in sorted(ga.keys() - gb.keys(), key=_order)],
        "grants_rebound": [
            {
                "pack": g[0],
                "kind": g[1],
                "key": g[2],
                "credential_set": g[3],
                "from_install_id": ga[g],
                "to_install_id": gb[g],
            }
            for g in sorted(ga.keys() & gb.keys(), key=_order)
            if ga[g] != gb[g]
        ],
    }


def _activation(entry: list[Any] | None) -> Activation | None:
    if entry is None:
        return None
    _, install_id, revision, epoch, payload_hash = entry
    return {
        "install_id": install_id,
        "revision": revision,
        "epoch": epoch,
        "payload_hash": payload_hash,
    }


def _activations(a: _Revision, b: _Revision, only: Pair | None) -> list[ActivationMove]:
    packs = set(a.activations) | set(b.activations)
    if only is not None:  # the packs the audience is served from, on either side
        packs = {g[0] for side in (a, b) for g in side.grants.get(only, {})}
    out: list[ActivationMove] = []
    for pack in sorted(packs, key=str.encode):
        before, after = a.activations.get(pack), b.activations.get(pack)
        if before != after:
            out.append(
                {
                    "pack": pack,
                    "change": "added"
                    if before is None
                    else "removed"
                    if after is None
                    else "moved",
                    "from": _activation(before),
                    "to": _activation(after),
                }
            )
    return out


def revision_diff(
    ledger: Ledger, from_revision: int, to_revision: int, audience: Pair | None = None
) -> RevisionDiff:
    """What changed from ``from_revision`` to ``to_revision`` (for ``audience`` only, if
    given), from the log alone. MISSING naming the flag for a revision never published,
    and naming ``--audience`` for an audience neither revision serves."""
    found, last = _replay(ledger, {from_revision, to_revision}, audience)
    for flag, revision in (("--from-revision", from_revision), ("--to-revision", to_revision)):
        if revision not in found:
            raise _never_published(flag, revision, last)
    a, b = found[from_revision], found[to_revision]
    if audience is not None and audience not in a.digests and audience not in b.digests:
        raise Missing(
            f"--audience {audience[0]}:{audience[1]}: no catalog view is published for this "
            f"audience at revision {from_revision} or {to_revision}",
            field="audience",
            flag="--audience",
        )
    audiences = [
        found_diff
        for pair in sorted(set(a.digests) | set(b.digests), key=_order)
        if (found_diff := _audience(pair, a, b)) is not None
    ]
    activations = _activations(a, b, audience)
    return {
        "from": a.side,
        "to": b.side,
        "audience": None if audience is None else f"{audience[0]}:{audience[1]}",
        "summary": {
            "audiences_changed": len(audiences),
            "facts_added": sum(len(d["facts_added"]) for d in audiences),
            "facts_changed": sum(len(d["facts_changed"]) for d in audiences),
            "facts_removed": sum(len(d["facts_removed"]) for d in audiences),
            "grants_added": sum(len(d["grants_added"]) for d in audiences),
            "grants_removed": sum(len(d["grants_removed"]) for d in audiences),
            "grants_rebound": sum(len(d["grants_rebound"]) for d in audiences),
            "activations_moved": len(activations),
        },
        "audiences": audiences,
        "activations": activations,
    }


def _counted(noun: str, counts: list[tuple[int, str]]) -> str | None:
    """``3 facts added, 1 changed``: the noun on the first non-zero count only."""
    parts = [(n, verb) for n, verb in counts if n]
    if not parts:
        return None
    (first, verb), rest = parts[0], parts[1:]
    head = f"{first} {noun}{'' if first == 1 else 's'} {verb}"
    return ", ".join([head, *(f"{n} {verb}" for n, verb in rest)])


def summary_line(diff: RevisionDiff) -> str:
    """``2 audiences change: 3 facts added, 1 changed, 1 removed; 1 pack activation moved``."""
    s = diff["summary"]
    n, moved = s["audiences_changed"], s["activations_moved"]
    details = [
        _counted(
            "fact",
            [
                (s["facts_added"], "added"),
                (s["facts_changed"], "changed"),
                (s["facts_removed"], "removed"),
            ],
        ),
        _counted(
            "grant",
            [
                (s["grants_added"], "added"),
                (s["grants_removed"], "removed"),
                (s["grants_rebound"], "rebound"),
            ],
        ),
    ]
    said = ", ".join(d for d in details if d is not None)
    audiences = (
        "no audience changes"
        if n == 0
        else f"{n} audience{' changes' if n == 1 else 's change'}" + (f": {said}" if said else "")
    )
    packs = (
        "no pack activation moved"
        if moved == 0
        else (f"{moved} pack activation{'' if moved == 1 else 's'} moved")
    )
    return f"{audiences}; {packs}"
