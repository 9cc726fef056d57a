"""Planning a release's publication from given inputs (pure: imports only ``domain``).

``plan_publication`` builds and validates the whole revision in memory and
describes the one event that publishes it (R16, R17), or nothing when the
content is unchanged. ``plan_bindings`` turns a manifest's binding set into
the bindings after the release and the grant/rebind/revoke events that get
there (R14). ``content_authority`` is the authority a candidate generation
will have once activated, so a release is validated before anything moves.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from domain.content import PackContent
from domain.errors import InvalidInput, LifecycleRejected
from domain.manifest import BindingSpec
from publisher.catalog import (
    BindingRow,
    BuiltCatalog,
    CatalogInput,
    PackAuthority,
    ParentState,
    Problem,
    PublicationRejected,
    build_catalog,
    component_facts,
)


@dataclass(frozen=True)
class PublishPlan:
    """A validated revision ready to append (or ``None`` when unchanged).

    ``blocked`` lists why nothing can be published now although the release
    itself is valid: bindings of packs whose newest attempt is failed_dirty
    (R12). Then ``built`` is ``None`` and ``event`` is ``None``.
    """

    built: BuiltCatalog | None
    parent: ParentState
    event: dict[str, Any] | None
    blocked: tuple[Problem, ...] = ()

    @property
    def changed(self) -> bool:
        return self.event is not None

    @property
    def dirty_packs(self) -> list[str]:
        return sorted({p.pack for p in self.blocked})


def plan_publication(
    catalog: CatalogInput,
    parent: ParentState,
    bindings_position: int | None,
    *,
    defer_if_dirty: Iterable[BindingRow] | None = None,
    keep_rows: bool = True,
) -> PublishPlan:
    """Build and validate in memory; describe the revision event if content changed.

    With ``defer_if_dirty`` (the bindings a release changes), a catalog that
    fails only because packs the release does not bind anew are failed_dirty
    is not an error: nothing is published and the plan says what blocks it.
    Any other problem, or a dirty pack the release itself binds, still
    rejects the release before any append (R11, R16). ``keep_rows=False``
    streams facts and grants into the digest without keeping them.
    """
    try:
        built = build_catalog(catalog, keep_rows=keep_rows)
    except PublicationRejected as exc:
        if defer_if_dirty is None:
            raise
        changed = {
            (f"{r.audience_kind}:{r.audience_id}", r.pack, r.kind, r.key) for r in defer_if_dirty
        }
        if any(
            p.reason != "DIRTY_PACK" or (p.audience, p.pack, p.kind, p.key) in changed
            for p in exc.problems
        ):
            raise
        return PublishPlan(None, parent, None, tuple(exc.problems))
    return plan_built(built, parent, bindings_position)


def plan_built(
    built: BuiltCatalog, parent: ParentState, bindings_position: int | None
) -> PublishPlan:
    """The revision event of an already validated ``built`` catalog (or none if unchanged)."""
    if parent.content_digest == built.content_digest:
        return PublishPlan(built, parent, None)
    activations, released, audiences = built.delta(parent)
    event = {
        "revision": parent.revision + 1,
        "content_digest": built.content_digest,
        "activations": activations,
        "released_packs": released,
        "audiences": audiences,
        "counts": built.counts,
        "bindings_position": bindings_position,
    }
    return PublishPlan(built, parent, event)


# -- releases: bindings converged together with the packs ---------------------------------


@dataclass(frozen=True)
class BindingChange:
    """One binding event a release appends."""

    op: str  # "grant", "rebind" or "revoke"
    row: BindingRow
    from_install_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "audience": f"{self.row.audience_kind}:{self.row.audience_id}",
            "pack": self.row.pack,
            "kind": self.row.kind,
            "key": self.row.key,
            "credential_set": self.row.credential_set,
        }
        if self.op != "revoke":
            out["install_id"] = self.row.install_id
        if self.from_install_id is not None:
            out["from_install_id"] = self.from_install_id
        return out


def check_binding_credentials(
    desired: Sequence[BindingSpec] | None, packs: Mapping[str, PackAuthority]
) -> None:
    """A binding may name a credential set only for a component that declares some (R15).

    A component without ``credential_sets`` has nothing to choose from, so a
    credential set on its binding is a mistake in the manifest: INVALID, naming
    the binding, before anything is written.
    """
    for spec in desired or ():
        auth = packs.get(spec.pack)
        fact = auth.components.get((spec.kind, spec.key)) if auth is not None else None
        if spec.credential_set is not None and fact is not None and fact.credential_sets is None:
            field = f"bindings[{spec.index}].credential_set"
            raise InvalidInput(
                f"{field}: component {spec.kind}/{spec.key} of pack {spec.pack} declares no "
                f"credential_sets, so its binding cannot name one ({spec.credential_set})",
                field=field,
                rule="R15",
            )


#: Most bindings listed in a removal's PACK_IN_USE error; the total is always reported.
MAX_LISTED_BINDINGS = 200


def check_removals(
    current: Iterable[BindingRow],
    desired: Sequence[BindingSpec] | None,
    removed: Mapping[str, int],
) -> None:
    """R7: a pack is removed only if no binding uses it after the release.

    ``removed`` maps each removed pack to its ``remove[i]`` index; the bindings
    after the release are the manifest's (``desired``) or, without ``bindings``
    in the manifest, the current ones. Rejected before any append, naming every
    binding that still uses a removed pack.
    """
    if not removed:
        return
    users: list[dict[str, Any]] = []
    if desired is not None:
        for spec in desired:
            if spec.pack in removed:
                users.append(
                    {
                        "field": f"bindings[{spec.index}]",
                        "audience": f"{spec.audience.kind.value}:{spec.audience.id}",
                        "pack": spec.pack,
                        "kind": spec.kind,
                        "key": spec.key,
                        "credential_set": spec.credential_set,
                    }
                )
    else:
        for row in sorted(current, key=lambda r: r.ident):
            if row.pack in removed:
                users.append(
                    {
                        "field": None,
                        "audience": f"{row.audience_kind}:{row.audience_id}",
                        "pack": row.pack,
                        "kind": row.kind,
                        "key": row.key,
                        "credential_set": row.credential_set,
                    }
                )
    if not users:
        return
    packs = sorted({u["pack"] for u in users}, key=lambda p: removed[p])
    named = "; ".join(
        f"{u['audience']} {u['pack']}/{u['kind']}/{u['key']}"
        + (f" ({u['credential_set']})" if u["credential_set"] else "")
        + (f" at {u['field']}" if u["field"] else "")
        for u in users[:20]
    )
    more = f" and {len(users) - 20} more" if len(users) > 20 else ""
    source = "the manifest's bindings" if desired is not None else "the current bindings"
    first = f"remove[{removed[packs[0]]}]"
    raise LifecycleRejected(
        f"{first}: cannot remove {', '.join(repr(p) for p in packs)}: {len(users)} "
        f"binding(s) would still use it after the release ({source}): {named}{more}; "
        "revoke them in the same release (list bindings without them) or keep the pack",
        reason="PACK_IN_USE",
        rule="R7",
        field=first,
        packs=packs,
        binding_count=len(users),
        bindings=users[:MAX_LISTED_BINDINGS],
    )


def plan_bindings(
    current: Iterable[BindingRow],
    desired: Iterable[BindingSpec] | None,
    packs: Mapping[str, PackAuthority],
) -> tuple[list[BindingRow], list[BindingChange]]:
    """The bindings after a release and the events that get there.

    ``desired`` is the manifest's complete binding set; ``None`` (no
    ``bindings`` in the manifest) keeps the current set. Either way every
    binding is bound to its pack's active generation after the release, so
    what moved is re-bound in the same release (R14).
    """
    now: dict[tuple[str, ...], BindingRow] = {row.ident: row for row in current}
    wanted: dict[tuple[str, ...], BindingRow] = {}
    specs: Iterable[tuple[str, str, str, str, str, str | None]] = (
        (
            (s.audience.kind._value_, s.audience.id, s.pack, s.kind, s.key, s.credential_set)
            for s in desired
        )
        if desired is not None
        else (
            (r.audience_kind, r.audience_id, r.pack, r.kind, r.key, r.credential_set)
            for r in now.values()
        )
    )
    for kind, ident, pack, ckind, key, cred in specs:
        auth = packs.get(pack)
        row = BindingRow(
            kind,
            ident,
            pack,
            ckind,
            key,
            cred,
            (auth.install_id if auth else None) or "",
            (auth.payload_hash if auth else None) or "",
        )
        wanted[(kind, ident, pack, ckind, key, cred or "")] = row  # row.ident, built once
    changes: list[BindingChange] = []
    order = sorted(wanted)
    for wanted_key in order:
        row = wanted[wanted_key]
        before = now.get(wanted_key)
        if before is None:
            changes.append(BindingChange("grant", row))
        elif before.install_id != row.install_id or before.payload_hash != row.payload_hash:
            changes.append(BindingChange("rebind", row, before.install_id))
    changes.extend(BindingChange("revoke", now[i]) for i in sorted(now.keys() - wanted.keys()))
    return [wanted[i] for i in order], changes


@dataclass(frozen=True)
class BindingDelta:
    """``plan_bindings`` for a complete desired set, lean: the same changes in the same
    order, with a row built only for a changed binding and for the audiences asked
    (``rows_of``), so a release that changes few bindings among many builds few rows."""

    changes: list[BindingChange]
    wanted: Mapping[tuple[str, ...], str | None]  # ident -> credential set as given
    packs: Mapping[str, PackAuthority]

    @classmethod
    def of(
        cls,
        current: Mapping[tuple[str, ...], BindingRow],
        desired: Iterable[BindingSpec],
        packs: Mapping[str, PackAuthority],
    ) -> BindingDelta:
        wanted: dict[tuple[str, ...], str | None] = {}
        for spec in desired:
            wanted[spec.sort_key()] = spec.credential_set
        moved: list[tuple[str, ...]] = []
        for key in wanted:
            before = current.get(key)
            auth = packs.get(key[2])
            install_id = (auth.install_id if auth else None) or ""
            payload_hash = (auth.payload_hash if auth else None) or ""
            if (
                before is None
                or before.install_id != install_id
                or before.payload_hash != payload_hash
            ):
                moved.append(key)
        delta = cls([], wanted, packs)
        for key in sorted(moved):
            row, before = delta.row(key), current.get(key)
            delta.changes.append(
                BindingChange("grant", row)
                if before is None
                else BindingChange("rebind", row, before.install_id)
            )
        delta.changes.extend(
            BindingChange("revoke", current[i]) for i in sorted(current.keys() - wanted.keys())
        )
        return delta

    def row(self, key: tuple[str, ...]) -> BindingRow:
        auth = self.packs.get(key[2])
        return BindingRow(
            key[0],
            key[1],
            key[2],
            key[3],
            key[4],
            self.wanted[key],
            (auth.install_id if auth else None) or "",
            (auth.payload_hash if auth else None) or "",
        )

    def rows_of(self, audiences: Collection[tuple[str, str]]) -> list[BindingRow]:
        """The bindings after the release of ``audiences``, in ident order."""
        return [self.row(k) for k in sorted(k for k in self.wanted if k[:2] in audiences)]


def content_authority(
    pack: str, install_id: str, revision: str, epoch: int, content: PackContent
) -> PackAuthority:
    """The authority a generation of ``content`` will have once activated."""
    payload_hash = content.payload_hash_v1
    components = component_facts(
        pack, install_id, payload_hash, (c.to_json() for c in content.components)
    )
    return PackAuthority.official(
        [pack, install_id, revision, epoch, payload_hash], components, dirty=False
    )
