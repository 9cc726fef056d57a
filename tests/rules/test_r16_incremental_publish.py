"""R16/R17: an incremental publication is the full rebuild of the same revision.

``publish`` reuses, from the parent revision, the validation and digest of every
audience whose bindings and bound packs' authority did not change
(``ledger.commands.publishing.read_from_fragments``). These tests prove the reuse is
safe: on every step of a release history, the incremental plan equals the full
rebuild of the same snapshot (content digest, audience digests, activations,
counts), and two stores, one publishing incrementally and one always rebuilding,
end with identical catalog rows. A rejected closure rejects identically.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from domain.canonical import canonical_bytes_trusted
from domain.catalog import Catalog, PublishedView
from domain.content import parse_pack_content
from domain.digests import Purpose, digest
from domain.errors import LifecycleRejected
from domain.matrix import Advance
from ledger.commands import catalog_state, publish
from ledger.commands.publish import StagedPublication
from ledger.commands.publishing import (
    FullBuildDue,
    read_catalog_in_force,
    read_from_fragments,
)
from ledger.store.init import init_store
from ledger.store.kept_fragments import _labelled
from publisher.catalog import (
    BindingRow,
    CatalogInput,
    ContentDigest,
    ParentState,
    PublicationRejected,
    build_catalog,
    build_incremental,
)
from publisher.fragments import Fragments, audience_unit, encoded, pack_unit
from publisher.planning import content_authority
from tests.support.cli_inprocess import cli_json
from tests.support.gitrepo import component, pack_json
from tests.support.lifecycle_support import World

PACKS = 16
AUDIENCES = 96
CATALOG_TABLES = (
    "_System_CatalogRevision",
    "_System_CatalogActivation",
    "_System_CatalogGrant",
    "_System_CatalogAudience",
)


def pack_doc(n: int, version: int = 1) -> bytes:
    """A sales-like pack: a push contract requiring a profile (credential sets) and a map."""
    return pack_json(
        f"pack-{n}",
        components=[
            component(
                "push_contract",
                f"P{n}.push",
                {"v": version},
                requires=[
                    {"kind": "callout_profile", "key": f"erp{n}"},
                    {"kind": "outbound_mapping", "key": f"P{n}.out"},
                ],
            ),
            component("callout_profile", f"erp{n}", {"u": n}, credential_sets=["prod", "test"]),
            component("outbound_mapping", f"P{n}.out", {"f": n}),
            component("outbound_mapping", f"P{n}.spare", {"f": -n}),
        ],
    )


def closure(audience: str, n: int, cred: str = "prod") -> list[dict[str, Any]]:
    pack = f"pack-{n}"
    return [
        {"audience": audience, "pack": pack, "kind": "push_contract", "key": f"P{n}.push"},
        {
            "audience": audience,
            "pack": pack,
            "kind": "callout_profile",
            "key": f"erp{n}",
            "credential_set": cred,
        },
        {"audience": audience, "pack": pack, "kind": "outbound_mapping", "key": f"P{n}.out"},
    ]


def audience(a: int) -> str:
    # Case variants and non-ASCII identities: bytewise order, as everywhere (R3).
    return ["integration:w-", "app:W-", "app:wé-"][a % 3] + f"{a:03d}"


class History:
    """One store and its git repository, driven through a release history."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.versions = dict.fromkeys(range(PACKS), 1)
        self.applied: dict[int, int] = {}
        self.commits: dict[int, str] = {}
        self.bindings: dict[int, list[tuple[int, str]]] = {
            a: [(a % PACKS, "prod")] + ([((a + 3) % PACKS, "test")] if a % 5 == 0 else [])
            for a in range(AUDIENCES)
        }

    def manifest_bindings(self) -> list[dict[str, Any]]:
        return [
            b
            for a, bound in sorted(self.bindings.items())
            for n, cred in bound
            for b in closure(audience(a), n, cred)
        ]

    def release(self) -> None:
        """Apply the packs at their versions and the bindings, without publishing.

        A pack whose version did not change keeps its source revision (commit), so
        it keeps its active generation.
        """
        changed = [n for n, v in self.versions.items() if self.applied.get(n) != v]
        if changed:
            commit = self.world.release(
                {f"pack-{n}/pack.json": pack_doc(n, v) for n, v in self.versions.items()}
            )
            for n in changed:
                self.commits[n] = commit
                self.applied[n] = self.versions[n]
        packs = [self.world.official(f"pack-{n}", self.commits[n]) for n in range(PACKS)]
        self.world.service.apply(
            self.world.manifest(packs, self.manifest_bindings()), publish=False
        )


def catalog_rows(world: World) -> dict[str, list[dict[str, Any]]]:
    out = {}
    with world.db.read() as conn:
        for table in CATALOG_TABLES:
            rows = [
                {
                    k: bytes(v) if isinstance(v, bytes | memoryview) else v
                    for k, v in r._mapping.items()
                }
                for r in conn.execute(sa.text(f"SELECT * FROM {table}"))
            ]
            out[table] = sorted(rows, key=lambda r: sorted(r.items()))
    return out


def staged_event(staged: Any) -> dict[str, Any]:
    """The staged revision event and its audience view events."""
    assert isinstance(staged, StagedPublication), staged
    (lineage,) = [a for a in staged.aggregates if isinstance(a, Catalog)]
    event = lineage.pending_events[-1]  # the revision (the first one follows Opened)
    out = {
        k: getattr(event, k)
        for k in (
            "revision",
            "content_digest",
            "parent_digest",
            "activations",
            "released_packs",
            "audiences",
            "counts",
            "bindings_position",
            "audiences_root",
        )
    }
    out["views"] = [
        (v.audience_kind, v.audience_id, v.pending_events[-1].digest)  # type: ignore[attr-defined]
        for v in staged.aggregates
        if isinstance(v, PublishedView)
    ]
    return out


def stage_both(
    world: World, monkeypatch: pytest.MonkeyPatch, *, from_fragments: bool = False
) -> tuple[Any, Any, int]:
    """Stage the same snapshot incrementally and fully; the incremental one must not
    read the whole snapshot, and ``from_fragments``, not even stream the whole content
    (it digests the parent's kept fragments). Returns (incremental, full, affected
    audience count)."""
    with world.ledger.snapshot() as reader:
        try:
            inc = read_from_fragments(world.ledger, reader.conn)
        except FullBuildDue:
            inc = None
    affected = -1 if inc is None else len(inc.affected)

    def no_full_read(*_: Any, **__: Any) -> Any:
        raise AssertionError("the incremental publication read the whole snapshot")

    def no_stream(*_: Any) -> Any:
        raise AssertionError("read the catalog views though the parent's fragments were kept")

    service = world.service
    if inc is not None:
        with monkeypatch.context() as m:
            m.setattr(publish, "read_catalog_in_force", no_full_read)
            if from_fragments:
                m.setattr(catalog_state, "fragments_from_views", no_stream)
            incremental = service.stage_publication()
    else:
        incremental = service.stage_publication()
    service.incremental = False
    try:
        full = service.stage_publication()
    finally:
        service.incremental = True
    return incremental, full, affected


def check_against_full_rebuild(world: World) -> None:
    """The revision in force equals the full build of its inputs, row for row."""
    with world.ledger.snapshot() as reader:
        snap = read_catalog_in_force(world.ledger, reader.conn)
        rows = catalog_rows(world)
    built = build_catalog(snap.input())
    head = max(rows["_System_CatalogRevision"], key=lambda r: int(r["revision"]))
    open_ = 2**62
    assert head["content_digest"].decode() == built.content_digest
    audiences = {
        (r["audience_kind"].decode(), r["audience_id"].decode()): r["digest"].decode()
        for r in rows["_System_CatalogAudience"]
        if r["to_revision"] == open_
    }
    assert audiences == built.audience_digests
    grants = sorted(
        [
            *(r[c].decode() for c in ("audience_kind", "audience_id", "pack", "kind", "key")),
            r["credential_set"].decode() or None,
            r["install_id"].decode(),
        ]
        for r in rows["_System_CatalogGrant"]
        if r["to_revision"] == open_
    )
    assert grants == built.grants


@pytest.fixture
def pair(world: World, tmp_path: Path, sibling_store: str) -> Any:
    """``world`` publishes incrementally; ``other`` (same deterministic repository and
    history) always rebuilds the whole revision."""
    other = World(tmp_path / "other", sibling_store)
    other.service.incremental = False
    try:
        yield History(world), History(other)
    finally:
        other.close()


def test_r16_incremental_publication_equals_the_full_rebuild_at_every_step(
    pair: tuple[History, History], monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, theirs = pair
    steps: list[tuple[str, Any]] = [
        ("first revision", lambda h: None),
        ("one pack advances, its audiences re-bound", lambda h: h.versions.update({3: 2})),
        (
            "an audience is granted, another revoked",
            lambda h: (h.bindings.update({AUDIENCES: [(1, "prod")]}), h.bindings.pop(7)),
        ),
        ("one credential set changes", lambda h: h.bindings.update({12: [(4, "test")]})),
        (
            "two packs advance, one audience moves between packs",
            lambda h: (h.versions.update({0: 2, 5: 3}), h.bindings.update({9: [(2, "prod")]})),
        ),
        ("a pack nobody binds any more is released", lambda h: _unbind_pack(h, 6)),
    ]
    for number, (name, change) in enumerate(steps, start=1):
        for history in (mine, theirs):
            change(history)
            history.release()
        # The second revision digests the views and keeps its fragments; from the third
        # on, each publication digests its parent's fragments with its changes.
        incremental, full, affected = stage_both(mine.world, monkeypatch, from_fragments=number > 2)
        assert staged_event(incremental) == staged_event(full), name
        if name == "every pack advances":
            assert affected == -1, name
        elif number > 1:
            assert 0 < affected <= AUDIENCES // 4, (name, affected)
        assert mine.world.service.commit_publication(incremental)["revision"] == number
        assert theirs.world.service.publish()["revision"] == number, name
        assert catalog_rows(mine.world) == catalog_rows(theirs.world), name
        check_against_full_rebuild(mine.world)
    # Unchanged content publishes nothing either way (R17).
    assert mine.world.service.publish()["noop"] is True
    assert theirs.world.service.publish()["noop"] is True


def _unbind_pack(history: History, pack: int) -> None:
    for a, bound in list(history.bindings.items()):
        history.bindings[a] = [(n, c) for n, c in bound if n != pack] or [
            ((pack + 1) % PACKS, "prod")
        ]


def test_r16_a_dirty_pack_rejects_the_incremental_publication_as_the_full_one(
    pair: tuple[History, History], monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, theirs = pair
    rejections = []
    for history in (mine, theirs):
        history.release()
        history.world.service.publish()
        world = history.world
        history.versions[2] = 2
        commit = world.release(
            {f"pack-{n}/pack.json": pack_doc(n, v) for n, v in history.versions.items()}
        )
        handle = world.service.acquire_lease()
        target = world.resolved("pack-2", commit)
        (cand,) = world.service.prepare(
            handle, [(target, Advance(target.target, history.commits[2]))]
        ).values()
        world.service.fail(handle, "pack-2", cand, dirty=True, reason="dirty")
        world.service.release_lease(handle)
        head = world.head()
        with pytest.raises(LifecycleRejected) as info:
            world.service.publish()
        assert world.head() == head  # nothing appended (R16)
        rejections.append((info.value.reason, info.value.details))
    assert rejections[0] == rejections[1]
    assert rejections[0][0] == "CLOSURE_INVALID"
    assert {p["reason"] for p in rejections[0][1]["problems"]} == {"DIRTY_PACK"}
    assert rejections[0][1]["problem_count"] == 3 * len(
        [a for a, bound in mine.bindings.items() for n, _ in bound if n == 2]
    )


# -- pure parts -----------------------------------------------------------------------------


def test_r17_streamed_content_digest_is_the_canonical_digest() -> None:
    activations = [["pé", "i1", "r", 3, "h"], ["q", "i2", "r", 1, "h"]]
    facts = [["pé", "i1", "k", "kéy", "ab" * 32], ["q", "i2", "k", 'q"\\', "cd" * 32]]
    grants = [
        ["app", f"a{n}", "pé", "k", "kéy", None if n % 2 else "c\u2028", "i1"] for n in range(9)
    ]
    for a, f, g in [(activations, facts, grants), ([], [], []), (activations, [], grants)]:
        expected = digest(
            Purpose.CATALOG,
            canonical_bytes_trusted({"format": 1, "activations": a, "facts": f, "grants": g}),
        ).hex()
        streamed = ContentDigest()
        streamed.add(a)
        streamed.next_section()
        for start in range(0, len(f), 1):
            streamed.add(f[start : start + 1])
        streamed.next_section()
        for start in range(0, len(g), 4):
            streamed.add(g[start : start + 4])
        streamed.add([])
        assert streamed.hexdigest() == expected


def _authority(pack: str) -> Any:
    content = parse_pack_content(
        json.loads(
            pack_json(
                pack,
                components=[
                    component(
                        "push_contract", "x", requires=[{"kind": "callout_profile", "key": "y"}]
                    ),
                    component("callout_profile", "y", credential_sets=["prod"]),
                ],
            )
        ),
        file="pack.json",
    )
    return content_authority(pack, f"{pack}-i1", "r1", 1, content)


def test_r16_build_incremental_validates_every_affected_audience_before_anything() -> None:
    auth = _authority("p")
    row = BindingRow(
        "app", "a", "p", "push_contract", "x", None, auth.install_id, auth.payload_hash
    )
    # The profile the contract requires is not bound to this audience.
    with pytest.raises(PublicationRejected) as info:
        build_incremental(
            CatalogInput([row], {"p": auth}),
            {("app", "a")},
            ParentState(1, "00", {}, {("app", "b"): "ff"}),
            lambda: pytest.fail("content streamed before validation"),
        )
    assert [p.reason for p in info.value.problems] == ["MISSING_REQUIREMENT"]


# -- kept fragments (ledger.store.kept_fragments) ------------------------------------------------


#: Whether the incremental store's ``publish`` is running (``_streams`` counts only then).
_COUNTING = [False]


def _streams(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the incremental publications that read the parent's content from the catalog
    views (``apply``'s and the full-rebuild store's reads are not counted)."""
    calls: list[int] = []
    real = catalog_state.fragments_from_views

    def counted(*args: Any, **kwargs: Any) -> Any:
        if _COUNTING[0]:
            calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(catalog_state, "fragments_from_views", counted)
    return calls


def _step(pair: tuple[History, History], change: Any) -> None:
    """One release on both stores, published; then both revisions are identical."""
    for history in pair:
        change(history)
        history.release()
        _COUNTING[0] = history is pair[0]
        try:
            history.world.service.publish()
        finally:
            _COUNTING[0] = False
    assert catalog_rows(pair[0].world) == catalog_rows(pair[1].world)
    check_against_full_rebuild(pair[0].world)


def test_r17_kept_fragments_that_do_not_digest_to_the_parent_are_not_used(
    pair: tuple[History, History], monkeypatch: pytest.MonkeyPatch
) -> None:
    streams = _streams(monkeypatch)
    _step(pair, lambda h: None)  # the first revision: a full build
    _step(pair, lambda h: h.versions.update({3: 2}))  # digests the views, keeps fragments
    assert len(streams) == 1
    _step(pair, lambda h: h.versions.update({4: 2}))  # from the fragments
    assert len(streams) == 1
    # An unaffected audience's fragment edited: valid JSON, another credential set.
    world = pair[0].world
    unit = {"a": b"integration", "u": b"w-000"}  # binds packs 0 and 3, not 5 or 9
    with world.db.write() as conn:
        body = conn.execute(
            sa.text(
                "SELECT body FROM publish_fragment "
                "WHERE section = 3 AND unit_a = :a AND unit_b = :u"
            ),
            unit,
        ).scalar_one()
        assert b'"prod"' in bytes(body)
        conn.execute(
            sa.text(
                "UPDATE publish_fragment SET body = :b "
                "WHERE section = 3 AND unit_a = :a AND unit_b = :u"
            ),
            {"b": bytes(body).replace(b'"prod"', b'"test"'), **unit},
        )
    _step(pair, lambda h: h.versions.update({5: 2}))  # not trusted: the views again
    assert len(streams) == 2
    _step(pair, lambda h: h.bindings.update({40: [(9, "test")]}))  # kept anew, used
    assert len(streams) == 2
    # The digest covers bodies, not keys: a key renamed (in the same order) is caught too.
    with world.db.write() as conn:
        conn.execute(
            sa.text(
                "UPDATE publish_fragment SET unit_b = :renamed "
                "WHERE section = 3 AND unit_a = :a AND unit_b = :u"
            ),
            {"renamed": b"w-000x", **unit},
        )
    _step(pair, lambda h: h.versions.update({6: 2}))
    assert len(streams) == 3
    _step(pair, lambda h: h.versions.update({7: 2}))
    assert len(streams) == 3
    # Entries moved to the neighbouring fragment (same bytes, same order): caught too.
    with world.db.write() as conn:
        rows = {
            bytes(u): (int(n), bytes(b))
            for u, n, b in conn.execute(
                sa.text(
                    "SELECT unit_b, entries, body FROM publish_fragment "
                    "WHERE section = 3 AND unit_a = :a AND unit_b IN (:x, :y)"
                ),
                {"a": b"integration", "x": b"w-000", "y": b"w-003"},
            )
        }
        (n0, b0), (n3, b3) = rows[b"w-000"], rows[b"w-003"]
        conn.execute(
            sa.text(
                "DELETE FROM publish_fragment WHERE section = 3 AND unit_a = :a AND unit_b = :y"
            ),
            {"a": b"integration", "y": b"w-003"},
        )
        conn.execute(
            sa.text(
                "UPDATE publish_fragment SET entries = :n, body = :b "
                "WHERE section = 3 AND unit_a = :a AND unit_b = :x"
            ),
            {"n": n0 + n3, "b": b0 + b"," + b3, "a": b"integration", "x": b"w-000"},
        )
    _step(pair, lambda h: h.versions.update({8: 2}))
    assert len(streams) == 4


def test_r17_a_store_without_the_fragment_table_publishes_from_the_views(
    pair: tuple[History, History], monkeypatch: pytest.MonkeyPatch
) -> None:
    world = pair[0].world
    with world.db.write() as conn:
        conn.execute(sa.text("DROP TABLE publish_fragment"))
    streams = _streams(monkeypatch)
    _step(pair, lambda h: None)
    _step(pair, lambda h: h.versions.update({3: 2}))
    _step(pair, lambda h: h.versions.update({4: 2}))
    assert len(streams) == 2  # every incremental publication digests the views
    code, doctor = cli_json("--db", world.url, "doctor")
    assert code == 0
    assert {
        "object": "table publish_fragment",
        "expected": "present",
        "found": "missing",
        "safe": True,
    } in doctor["differences"]
    init_store(world.db)  # creates it; the next publication keeps fragments, then uses them
    _step(pair, lambda h: h.versions.update({5: 2}))
    _step(pair, lambda h: h.versions.update({6: 2}))
    assert len(streams) == 3


def test_r17_fragment_labels_hold_for_identities_json_escapes() -> None:
    """Identities may hold a quote or a backslash (JSON escapes them): their fragments
    are still recognized as their own, and a body under another key is not."""
    pack, audience = 'pa"ck', ("app", "a\\b")
    entry = [pack, "i1", "r", 1, "h"]
    grants = [["app", "a\\b", pack, "k", f"key{n}", None, "i1"] for n in range(3)]
    kept = Fragments(1, "")
    kept.sections[0][pack_unit(pack)] = encoded([entry])
    kept.sections[1][pack_unit(pack)] = encoded([[pack, "i1", "k", "key0", "ab" * 32]])
    kept.sections[2][audience_unit(audience)] = encoded(grants)
    assert _labelled(kept)
    kept.sections[2][(b"app", b"other")] = kept.sections[2].pop(audience_unit(audience))
    assert not _labelled(kept)
