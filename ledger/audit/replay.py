"""Replaying the catalog lineage from the log (R14-R17).

``CatalogReplay`` rebuilds the publisher's input at every revision from the
lifecycle and binding events and recomputes each revision's content digest
and parent link with the publisher's own rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from domain.audience_map import Node, Position, apply_writes, key_of, memory_fetch, update
from domain.event_types import (
    T_ACTIVATED,
    T_ADVANCED,
    T_FAILED,
    T_GRANTED,
    T_LEGACY,
    T_LOCAL_INSTALLED,
    T_LOCAL_REINSTALLED,
    T_LOCAL_REMOVED,
    T_PREPARED,
    T_PUBLISHED,
    T_REBOUND,
    T_REINSTALLED,
    T_REMOVED,
    T_RETIRED,
    T_REVOKED,
    T_STARTED,
    T_VIEW_PUBLISHED,
)
from publisher.catalog import (
    BindingRow,
    BuiltCatalog,
    CatalogInput,
    Fact,
    PackAuthority,
    PublicationRejected,
    build_catalog,
    component_facts,
)

# -- replaying the catalog ----------------------------------------------------------------------

CATALOG_TYPES = frozenset(
    {
        T_PREPARED,
        T_ACTIVATED,
        T_RETIRED,
        T_FAILED,
        T_STARTED,
        T_ADVANCED,
        T_REMOVED,
        T_REINSTALLED,
        T_LOCAL_INSTALLED,
        T_LOCAL_REMOVED,
        T_LOCAL_REINSTALLED,
        T_LEGACY,
        T_GRANTED,
        T_REBOUND,
        T_REVOKED,
        T_PUBLISHED,
        T_VIEW_PUBLISHED,
    }
)


@dataclass
class CatalogReplay:
    """Rebuilds the publisher's input at every revision and recomputes its digest (R17)."""

    bindings: dict[tuple[str, ...], BindingRow] = field(default_factory=dict)
    pending: list[tuple[int, str, BindingRow]] = field(default_factory=list)
    activations: dict[str, list[Any]] = field(default_factory=dict)
    components: dict[tuple[str, str], dict[tuple[str, str], Fact]] = field(default_factory=dict)
    newest: dict[str, tuple[str, str]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    revisions: dict[int, tuple[int, BuiltCatalog]] = field(default_factory=dict)
    keep: int | None = None  # keep the built catalog of this revision (as-of views)
    recorded: dict[tuple[str, str], tuple[int, str | None]] = field(default_factory=dict)
    # R28: the audience events of the revision being appended, the audience map's nodes
    # (in memory) and whether a revision with a map root was seen (the map's first).
    views: list[tuple[int, tuple[str, str], int, str | None]] = field(default_factory=list)
    nodes: dict[Position, Node] = field(default_factory=dict)
    mapped: bool = False

    def feed(self, position: int, topic: str, d: dict[str, Any]) -> str | None:
        if topic == T_PREPARED:
            self.components[(d["pack"], d["install_id"])] = component_facts(
                d["pack"], d["install_id"], d["payload_hash"], d["components"]
            )
            self.newest[d["pack"]] = (d["install_id"], "preparing")
        elif topic in (T_ACTIVATED, T_RETIRED, T_FAILED):
            status = {T_ACTIVATED: "active", T_RETIRED: "retired"}.get(
                topic, "failed_dirty" if d.get("dirty") else "failed_clean"
            )
            if self.newest.get(d["pack"], ("",))[0] == d["install_id"]:
                self.newest[d["pack"]] = (d["install_id"], status)
            if status != "active":
                self.components.pop((d["pack"], d["install_id"]), None)
        elif topic in (T_STARTED, T_ADVANCED, T_REINSTALLED):
            self.activations[d["pack"]] = [
                d["pack"],
                d["install_id"],
                d["revision"],
                d["epoch"],
                d["payload_hash"],
            ]
        elif topic == T_REMOVED:  # R7: nothing of the pack is authority any more
            self.activations.pop(d["pack"], None)
            self.kinds.pop(d["pack"], None)
        elif topic in (T_LOCAL_INSTALLED, T_LOCAL_REINSTALLED):
            self.kinds[d["pack"]] = "local_path"
        elif topic == T_LOCAL_REMOVED:
            self.kinds.pop(d["pack"], None)
        elif topic == T_LEGACY:
            self.kinds.setdefault(d["pack"], "legacy")
        elif topic in (T_GRANTED, T_REBOUND, T_REVOKED):
            row = BindingRow(
                d["audience_kind"],
                d["audience_id"],
                d["pack"],
                d["kind"],
                d["key"],
                d.get("credential_set"),
                d.get("install_id") or "",
                d.get("payload_hash", ""),
            )
            self.pending.append((position, "revoke" if topic == T_REVOKED else "grant", row))
        elif topic == T_VIEW_PUBLISHED:
            audience = (d["audience_kind"], d["audience_id"])
            self.views.append((position, audience, d["revision"], d["digest"]))
        elif topic == T_PUBLISHED:
            return self._published(position, d)
        return None

    def finish(self) -> list[tuple[int, str]]:
        """Problems that only the end of the log shows: audience events no revision claimed."""
        return [
            (position, f"audience {a[0]}:{a[1]}'s view event has no revision event after it")
            for position, a, _, _ in self.views
        ]

    def _published(self, position: int, d: dict[str, Any]) -> str | None:
        cut = d.get("bindings_position")
        cut = position - 1 if cut is None else cut
        later = []
        for change_position, op, row in self.pending:
            if change_position > cut:
                later.append((change_position, op, row))
            elif op == "revoke":
                self.bindings.pop(row.ident, None)
            else:
                self.bindings[row.ident] = row
        self.pending = later
        try:
            built = build_catalog(  # judged by the rules of its time (R15's declared sets)
                CatalogInput(list(self.bindings.values()), self._packs()), declared_sets=False
            )
        except PublicationRejected as exc:
            return f"revision {d['revision']} was published with an invalid closure: {exc}"
        if built.content_digest != d["content_digest"]:
            return (
                f"revision {d['revision']}'s content digest does not match its content "
                f"(recomputed {built.content_digest})"
            )
        for kind, ident, value in d["audiences"]:
            if built.audience_digests.get((kind, ident)) != value:
                return f"revision {d['revision']}'s digest of audience {kind}:{ident} is wrong"
            self.recorded[(kind, ident)] = (d["revision"], value)
        problem = self._audience_views(d, built)
        if problem is not None:
            return problem
        if self.keep is None or self.keep == d["revision"]:
            self.revisions[d["revision"]] = (position, built)
        return None

    def _audience_views(self, d: dict[str, Any], built: BuiltCatalog) -> str | None:
        """R28: a revision with an audience map root is preceded, in its append, by one
        view event for exactly each audience whose digest changed (for the map's first
        revision: every audience in force, and each gone one), with the built digest; the
        root is the map of every audience's digest after it."""
        revision, views, self.views = d["revision"], self.views, []
        root = d.get("audiences_root")
        if root is None:
            if views:
                return f"revision {revision} has audience view events but no audience map root"
            return None
        now = built.audience_digests
        before = {a: v for a, (_, v) in self.recorded.items() if v is not None}
        expected: dict[tuple[str, str], str | None] = {
            a: now.get(a) for a in set(now) | set(before) if now.get(a) != before.get(a)
        }
        if not self.mapped:
            expected.update(now)
        got: dict[tuple[str, str], str | None] = {}
        for _, audience, at, digest in views:
            if at != revision:
                return f"audience {audience[0]}:{audience[1]}'s view event names revision {at}"
            if audience in got:
                return f"revision {revision} has two view events for {audience[0]}:{audience[1]}"
            got[audience] = digest
        if got != expected:
            wrong = sorted(set(got) ^ set(expected)) or sorted(
                a for a in got if got[a] != expected[a]
            )
            kind, ident = wrong[0]
            return (
                f"revision {revision}'s audience view events do not match its content "
                f"(first at audience {kind}:{ident})"
            )
        for audience, digest in got.items():
            self.recorded[audience] = (revision, digest)
        changes = {key_of(*a): None if v is None else bytes.fromhex(v) for a, v in expected.items()}
        result = update(memory_fetch(self.nodes), changes)
        apply_writes(self.nodes, result.writes)
        self.mapped = True
        if result.root.hex() != root:
            return f"revision {revision}'s audience map root does not match its audiences"
        return None

    def _packs(self) -> dict[str, PackAuthority]:
        packs: dict[str, PackAuthority] = {}
        for pack, entry in self.activations.items():
            packs[pack] = PackAuthority.official(
                entry,
                self.components.get((pack, entry[1]), {}),
                dirty=self.newest.get(pack, ("", ""))[1] == "failed_dirty",
            )
        for pack, kind in self.kinds.items():
            packs.setdefault(pack, PackAuthority(pack=pack, source_kind=kind))
        for pack, (_, status) in self.newest.items():
            packs.setdefault(
                pack, PackAuthority(pack=pack, source_kind="absent", dirty=status == "failed_dirty")
            )
        return packs
