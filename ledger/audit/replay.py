"""Replaying the catalog lineage from the log (R14-R17).

``CatalogReplay`` rebuilds the publisher's input at every revision from the
lifecycle and binding events and recomputes each revision's content digest
and parent link with the publisher's own rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
        elif topic == T_PUBLISHED:
            return self._published(position, d)
        return None

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
            built = build_catalog(CatalogInput(list(self.bindings.values()), self._packs()))
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
        if self.keep is None or self.keep == d["revision"]:
            self.revisions[d["revision"]] = (position, built)
        return None

    def _packs(self) -> dict[str, PackAuthority]:
        packs: dict[str, PackAuthority] = {}
        for pack, entry in self.activations.items():
            packs[pack] = PackAuthority(
                pack=pack,
                source_kind="official_repo",
                install_id=entry[1],
                revision=entry[2],
                epoch=entry[3],
                payload_hash=entry[4],
                dirty=self.newest.get(pack, ("", ""))[1] == "failed_dirty",
                components=self.components.get((pack, entry[1]), {}),
            )
        for pack, kind in self.kinds.items():
            packs.setdefault(pack, PackAuthority(pack=pack, source_kind=kind))
        for pack, (_, status) in self.newest.items():
            packs.setdefault(
                pack, PackAuthority(pack=pack, source_kind="absent", dirty=status == "failed_dirty")
            )
        return packs
