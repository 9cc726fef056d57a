"""Closure assembly, validation, deduplication and the canonical catalog digest (R14-R17).

Pure: the ledger reads the inputs (bindings, each pack's active generation and
its components) in one snapshot and hands them here; this module decides.

Order of work is the rule of R15 and of the lessons behind it:

1. each audience's closure is assembled from *that audience's* bindings only;
2. every audience is validated completely and every problem is collected
   (audience, pack, component, missing or unauthorized requirement);
3. only if nothing failed are byte-identical immutable facts deduplicated
   (one fact per pack + install id + kind + key), while every audience keeps
   its own grant edges;
4. the catalog is put in bytewise canonical order and digested; the digest
   covers content only (no time, no revision number), so unchanged content
   publishes nothing (R17).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from domain.canonical import canonical_bytes_trusted
from domain.digests import Purpose, hasher
from domain.errors import LifecycleRejected
from domain.served import audience_digest, fact_hasher

#: Most problems listed in one error; the total is always reported.
MAX_LISTED_PROBLEMS = 200

Audience = tuple[str, str]


@dataclass(frozen=True, slots=True)
class BindingRow:
    """One binding as recorded: an audience, a component, the generation it names."""

    audience_kind: str
    audience_id: str
    pack: str
    kind: str
    key: str
    credential_set: str | None
    install_id: str
    payload_hash: str

    @property
    def audience(self) -> Audience:
        return (self.audience_kind, self.audience_id)

    def grant(self) -> list[Any]:
        """The binding's entry in the content's grants section."""
        return [
            self.audience_kind,
            self.audience_id,
            self.pack,
            self.kind,
            self.key,
            self.credential_set,
            self.install_id,
        ]

    @property
    def ident(self) -> tuple[str, str, str, str, str, str]:
        """Bytewise identity and sort key (a missing credential set sorts first as "")."""
        return (
            self.audience_kind,
            self.audience_id,
            self.pack,
            self.kind,
            self.key,
            self.credential_set or "",
        )


@dataclass(frozen=True, slots=True)
class Fact:
    """One immutable component of a generation: its canonical bytes and digest."""

    kind: str
    key: str
    fact: bytes
    fact_digest: bytes
    requires: tuple[tuple[str | None, str, str], ...]
    credential_sets: frozenset[str] | None

    @classmethod
    def parse(cls, fact: bytes, fact_digest: bytes) -> Fact:
        data = orjson.loads(fact)
        creds = data.get("credential_sets")
        return cls(
            kind=data["kind"],
            key=data["key"],
            fact=fact,
            fact_digest=fact_digest,
            requires=tuple((r.get("pack"), r["kind"], r["key"]) for r in data["requires"]),
            credential_sets=frozenset(creds) if creds is not None else None,
        )


def component_facts(
    pack: str, install_id: str, payload_hash: str, components: Iterable[Mapping[str, Any]]
) -> dict[tuple[str, str], Fact]:
    """A generation's components as facts (canonical bytes and digest), by kind and key:
    the one derivation the publisher, the replay and a candidate's authority share."""
    digest_of = fact_hasher(pack, install_id, payload_hash)
    out: dict[tuple[str, str], Fact] = {}
    for component in components:
        fact = canonical_bytes_trusted(component)
        out[(component["kind"], component["key"])] = Fact.parse(fact, digest_of(fact))
    return out


@dataclass(frozen=True)
class PackAuthority:
    """What the store says about one pack at the snapshot: its active generation."""

    pack: str
    source_kind: str  # "official_repo", "local_path", "legacy" or "absent"
    install_id: str | None = None
    revision: str | None = None
    epoch: int | None = None
    payload_hash: str | None = None
    dirty: bool = False
    components: Mapping[tuple[str, str], Fact] = field(default_factory=dict)

    def entry(self) -> list[Any]:
        return [self.pack, self.install_id, self.revision, self.epoch, self.payload_hash]

    @classmethod
    def official(
        cls, entry: Sequence[Any], components: Mapping[tuple[str, str], Fact], *, dirty: bool
    ) -> PackAuthority:
        """An official pack's authority from its activation entry (``entry()``'s order)."""
        pack, install_id, revision, epoch, payload_hash = entry
        return cls(
            pack=pack,
            source_kind="official_repo",
            install_id=install_id,
            revision=revision,
            epoch=epoch,
            payload_hash=payload_hash,
            dirty=dirty,
            components=components,
        )


@dataclass(frozen=True)
class CatalogInput:
    bindings: Sequence[BindingRow]
    packs: Mapping[str, PackAuthority]


@dataclass(frozen=True)
class ParentState:
    """The parent revision as the delta is computed against it."""

    revision: int = 0
    content_digest: str | None = None
    activations: Mapping[str, list[Any]] = field(default_factory=dict)
    audiences: Mapping[Audience, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BuiltCatalog:
    """A validated, deduplicated catalog and everything a revision event needs.

    A lean build (``keep_rows=False``, or an incremental one) does not keep
    ``facts`` and ``grants`` (they were only streamed into the digest);
    ``totals`` then carries the counts.
    """

    activations: list[list[Any]]
    facts: list[list[Any]]
    grants: list[list[Any]]
    content_digest: str
    audience_digests: dict[Audience, str]
    totals: dict[str, int] | None = None

    @property
    def counts(self) -> dict[str, int]:
        if self.totals is not None:
            return dict(self.totals)
        return {
            "audiences": len(self.audience_digests),
            "activations": len(self.activations),
            "facts": len(self.facts),
            "grants": len(self.grants),
        }

    def delta(self, parent: ParentState) -> tuple[list[list[Any]], list[str], list[list[Any]]]:
        """(changed activations, released packs, changed audiences) against ``parent``."""
        mine = {a[0]: a for a in self.activations}
        changed = [a for p, a in sorted(mine.items()) if parent.activations.get(p) != a]
        released = sorted(set(parent.activations) - set(mine))
        audiences: list[list[Any]] = [
            [kind, ident, value]
            for (kind, ident), value in sorted(self.audience_digests.items())
            if parent.audiences.get((kind, ident)) != value
        ]
        audiences.extend(
            [kind, ident, None]
            for kind, ident in sorted(set(parent.audiences) - set(self.audience_digests))
        )
        audiences.sort(key=lambda a: (a[0], a[1]))
        return changed, released, audiences


@dataclass(frozen=True)
class Problem:
    """One reason an audience's closure cannot be published."""

    audience: str
    pack: str
    kind: str
    key: str
    reason: str
    message: str
    requirement: dict[str, str | None] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "audience": self.audience,
            "pack": self.pack,
            "component": {"kind": self.kind, "key": self.key},
            "reason": self.reason,
            "message": self.message,
        }
        if self.requirement is not None:
            out["requirement"] = self.requirement
        return out


class PublicationRejected(LifecycleRejected):
    """Some audience's closure is invalid: nothing is published (R16)."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        first = problems[0]
        super().__init__(
            f"publication rejected: {len(problems)} problem(s); first: audience "
            f"{first.audience}, pack {first.pack!r}, component {first.kind}/{first.key}: "
            f"{first.message}",
            reason="CLOSURE_INVALID",
            rule="R15",
            problem_count=len(problems),
            problems=[p.to_json() for p in problems[:MAX_LISTED_PROBLEMS]],
        )
        self.problems = list(problems)


def _problem(
    b: BindingRow, reason: str, message: str, requirement: dict[str, str | None] | None = None
) -> Problem:
    return Problem(
        f"{b.audience_kind}:{b.audience_id}", b.pack, b.kind, b.key, reason, message, requirement
    )


def validate(catalog: CatalogInput, *, declared_sets: bool = True) -> list[Problem]:
    """Every problem of every audience's closure (R14, R15, R5, R12); empty when valid.

    ``declared_sets``: a binding may name a credential set only for a component that
    declares some (R15). Every publication checks it; the audit's replay of revisions
    published before it was checked here passes ``False`` (a log is judged by the rules
    it was written under)."""
    problems: list[Problem] = []
    by_audience: dict[Audience, list[BindingRow]] = defaultdict(list)
    for binding in catalog.bindings:
        by_audience[binding.audience].append(binding)
    for audience in sorted(by_audience):
        bindings = by_audience[audience]
        bound = {(b.pack, b.kind, b.key) for b in bindings}  # this audience's only (R15)
        for b in sorted(bindings, key=lambda x: x.ident):
            problems.extend(
                _check_binding(b, catalog.packs.get(b.pack), bound, catalog.packs, declared_sets)
            )
    return problems


def _check_binding(
    b: BindingRow,
    auth: PackAuthority | None,
    bound: set[tuple[str, str, str]],
    packs: Mapping[str, PackAuthority],
    declared_sets: bool,
) -> list[Problem]:
    if auth is None or auth.source_kind == "absent":
        return [_problem(b, "NO_ACTIVE_GENERATION", "the pack has no active generation")]
    if auth.source_kind == "local_path":
        return [
            _problem(
                b, "LOCAL_PATH_NOT_AUTHORITY", "a local_path pack is never catalog authority (R5)"
            )
        ]
    if auth.install_id is None:
        return [
            _problem(
                b, "NO_ACTIVE_GENERATION", f"the pack has no active generation ({auth.source_kind})"
            )
        ]
    if b.install_id != auth.install_id or b.payload_hash != auth.payload_hash:
        return [
            _problem(
                b,
                "STALE_BINDING",
                f"bound to generation {b.install_id}, but {auth.install_id} is active; "
                "re-bind it (R14)",
            )
        ]
    if auth.dirty:
        return [
            _problem(
                b,
                "DIRTY_PACK",
                "the pack's newest attempt is failed_dirty; publication is blocked "
                "until a later generation activates (R12)",
            )
        ]
    fact = auth.components.get((b.kind, b.key))
    if fact is None:
        return [_problem(b, "UNKNOWN_COMPONENT", "the active generation has no such component")]
    found: list[Problem] = []
    if declared_sets and fact.credential_sets is None and b.credential_set is not None:
        found.append(
            _problem(
                b,
                "CREDENTIAL_SET_NOT_ADMITTED",
                f"credential set {b.credential_set!r} is not admitted: the component "
                "declares no credential sets (R15)",
                {"credential_set": b.credential_set},
            )
        )
    if fact.credential_sets is not None and b.credential_set not in fact.credential_sets:
        allowed = ", ".join(sorted(fact.credential_sets))
        found.append(
            _problem(
                b,
                "CREDENTIAL_SET_NOT_ADMITTED",
                (
                    f"credential set {b.credential_set!r} is not admitted"
                    if b.credential_set is not None
                    else "the binding names no credential set, but the component requires one"
                )
                + f" (allowed: {allowed})",
                {"credential_set": b.credential_set},
            )
        )
    for req_pack, req_kind, req_key in fact.requires:
        target = req_pack or b.pack
        if (target, req_kind, req_key) not in bound:
            requirement: dict[str, str | None] = {"pack": target, "kind": req_kind, "key": req_key}
            target_auth = packs.get(target)
            exists = target_auth is not None and (req_kind, req_key) in target_auth.components
            found.append(
                _problem(
                    b,
                    "MISSING_REQUIREMENT",
                    f"requires {target}/{req_kind}/{req_key}, which is not bound to this audience"
                    + ("" if exists else " (and is not in that pack's active generation)"),
                    requirement,
                )
            )
    return found


@dataclass(frozen=True, slots=True)
class EncodedChunk:
    """Entries already in canonical JSON: ``count`` of them, comma-separated in ``body``."""

    body: bytes
    count: int


#: Content entries as values (``list[list[Any]]``) or already encoded.
Chunk = list[list[Any]] | EncodedChunk


class ContentDigest:
    """The catalog content digest, streamed: the same bytes as
    ``canonical_bytes_trusted({"format": 1, "activations": ..., "facts": ...,
    "grants": ...})`` (sorted keys: activations, facts, format, grants), fed to
    the hasher in chunks so the whole content never sits in memory at once."""

    _SECTIONS = (b'{"activations":[', b'],"facts":[', b'],"format":1,"grants":[')

    def __init__(self) -> None:
        self._hash = hasher(Purpose.CATALOG)
        self._section = 0
        self._empty = True
        self._hash.update(self._SECTIONS[0])
        self.count = 0

    def next_section(self) -> None:
        self._section += 1
        self._hash.update(self._SECTIONS[self._section])
        self._empty = True
        self.count = 0

    def add(self, entries: list[list[Any]]) -> None:
        """Append entries (already in canonical order) to the current section."""
        if not entries:
            return
        body = orjson.dumps(entries)
        if not self._empty:
            self._hash.update(b",")
        self._hash.update(memoryview(body)[1:-1])
        self._empty = False
        self.count += len(entries)

    def add_encoded(self, body: bytes, count: int) -> None:
        """Append ``count`` entries given as their canonical JSON, comma-separated (what
        ``orjson.dumps(entries)`` would give between its brackets)."""
        if not count:
            return
        if not self._empty:
            self._hash.update(b",")
        self._hash.update(body)
        self._empty = False
        self.count += count

    def add_chunk(self, chunk: Chunk) -> None:
        if isinstance(chunk, EncodedChunk):
            self.add_encoded(chunk.body, chunk.count)
        else:
            self.add(chunk)

    def hexdigest(self) -> str:
        assert self._section == 2, "activations, facts and grants, in that order"
        self._hash.update(b"]}")
        return str(self._hash.hexdigest())


_CHUNK = 4096


def build_catalog(
    catalog: CatalogInput, *, keep_rows: bool = True, declared_sets: bool = True
) -> BuiltCatalog:
    """Validate every audience, then deduplicate and digest; raise if any is invalid.

    With ``keep_rows=False`` the facts and grants are streamed into the digest
    and not kept (publication needs only digests, activations and counts).
    """
    problems = validate(catalog, declared_sets=declared_sets)
    if problems:
        raise PublicationRejected(problems)
    ordered = sorted(catalog.bindings, key=lambda x: x.ident)
    facts: dict[tuple[str, str, str, str], str] = {}
    activations: dict[str, list[Any]] = {}
    packs = catalog.packs
    for b in ordered:  # dedupe only after every audience validated
        fact_id = (b.pack, b.install_id, b.kind, b.key)
        if fact_id not in facts:
            facts[fact_id] = packs[b.pack].components[(b.kind, b.key)].fact_digest.hex()
        if b.pack not in activations:
            activations[b.pack] = packs[b.pack].entry()
    content = ContentDigest()
    activation_entries = [activations[p] for p in sorted(activations)]
    content.add(activation_entries)
    content.next_section()
    fact_entries = [[*k, facts[k]] for k in sorted(facts)]
    for start in range(0, len(fact_entries), _CHUNK):
        content.add(fact_entries[start : start + _CHUNK])
    fact_count = len(fact_entries)
    if not keep_rows:
        del fact_entries
    content.next_section()
    grants: list[list[Any]] = []
    chunk: list[list[Any]] = []
    audience_digests: dict[Audience, str] = {}
    for audience, rows in _by_audience(ordered):
        edges = []
        ids = set()
        for b in rows:
            chunk.append(b.grant())
            edges.append([b.pack, b.kind, b.key, b.credential_set, b.install_id])
            ids.add((b.pack, b.install_id, b.kind, b.key))
        audience_digests[audience] = audience_digest(
            audience, edges, [[*k, facts[k]] for k in sorted(ids)]
        )
        if len(chunk) >= _CHUNK:
            content.add(chunk)
            if keep_rows:
                grants.extend(chunk)
            chunk = []
    content.add(chunk)
    if keep_rows:
        grants.extend(chunk)
    totals = {
        "audiences": len(audience_digests),
        "activations": len(activation_entries),
        "facts": fact_count,
        "grants": len(ordered),
    }
    return BuiltCatalog(
        activations=activation_entries,
        facts=fact_entries if keep_rows else [],
        grants=grants,
        content_digest=content.hexdigest(),
        audience_digests=audience_digests,
        totals=None if keep_rows else totals,
    )


def digest_of(
    audience: Audience, rows: Sequence[BindingRow], packs: Mapping[str, PackAuthority]
) -> str:
    """The audience digest of one audience's (validated) bindings, in ``ident`` order."""
    edges = [[b.pack, b.kind, b.key, b.credential_set, b.install_id] for b in rows]
    ids = sorted({(b.pack, b.install_id, b.kind, b.key) for b in rows})
    facts = [[*k, packs[k[0]].components[(k[2], k[3])].fact_digest.hex()] for k in ids]
    return audience_digest(audience, edges, facts)


def _by_audience(ordered: Sequence[BindingRow]) -> Iterator[tuple[Audience, list[BindingRow]]]:
    """Consecutive runs of one audience in bindings sorted by ``ident``."""
    run: list[BindingRow] = []
    current: Audience | None = None
    for b in ordered:
        audience = (b.audience_kind, b.audience_id)
        if audience != current:
            if run:
                assert current is not None
                yield current, run
            run, current = [], audience
        run.append(b)
    if run:
        assert current is not None
        yield current, run


@dataclass(frozen=True)
class CatalogContent:
    """The whole revision's content as the store streams it, in canonical order, for
    an incremental build: bound activations, deduplicated facts ``[pack, install_id,
    kind, key, fact_digest_hex]`` and grant rows, each as chunks of entries."""

    activations: list[list[Any]]
    facts: Iterable[Chunk]
    grants: Iterable[Chunk]


def build_incremental(
    changed: CatalogInput,
    affected: Collection[Audience],
    parent: ParentState,
    content: Callable[[], CatalogContent],
) -> BuiltCatalog:
    """A revision that reuses the parent's validation and digests of every audience
    outside ``affected``.

    The caller proves the reuse is safe: an audience is left out of ``affected``
    only when neither its bindings nor the authority (active generation, dirty
    flag, source kind) of any pack it binds changed since the parent revision,
    which validated it completely (R16); a generation's components are immutable,
    so its closure, its validity and its digest are the parent's. ``changed``
    holds every binding of every affected audience and the authority of every
    pack they bind; they are validated completely here before anything else.
    ``content`` then streams the whole revision (every binding now validated)
    for the content digest, which covers everything (R17).
    """
    problems = validate(changed)
    if problems:
        raise PublicationRejected(problems)
    ordered = sorted(changed.bindings, key=lambda x: x.ident)
    digests = {a: d for a, d in parent.audiences.items() if a not in affected}
    packs = changed.packs
    for audience, rows in _by_audience(ordered):
        assert audience in affected, audience
        digests[audience] = digest_of(audience, rows, packs)
    streamed = content()
    content_of = ContentDigest()
    content_of.add(streamed.activations)
    content_of.next_section()
    for entries in streamed.facts:
        content_of.add_chunk(entries)
    fact_count = content_of.count
    content_of.next_section()
    for entries in streamed.grants:
        content_of.add_chunk(entries)
    totals = {
        "audiences": len(digests),
        "activations": len(streamed.activations),
        "facts": fact_count,
        "grants": content_of.count,
    }
    return BuiltCatalog(
        activations=streamed.activations,
        facts=[],
        grants=[],
        content_digest=content_of.hexdigest(),
        audience_digests=dict(sorted(digests.items())),
        totals=totals,
    )
