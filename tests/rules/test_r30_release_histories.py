"""R30/R16/R17: random release histories through ``apply`` publish exactly what a full
rebuild of the same snapshot publishes, after every step, on SQLite and on MariaDB.

Each example is a fresh store and git repository driven through the real command service
(manifest files, ``apply`` and ``publish``) by a random history: pack installs (also a
removed pack installed again), advances (a new commit changing a payload), removals
(manifest ``remove``), bindings moved to another component or pack, revocations,
credential-set changes, audiences moving between packs, new grants, ``apply`` without
publishing, changes gathered into one release, and plain ``publish`` between applies.

Beside the store runs a model of the release: every pack's version and commit, every
audience's bindings. Whenever a step publishes, the expected revision is built *fully*
from the model's bindings and the packs' active generations (``build_catalog``, the full
build, over the store's own log authorities) and compared, field for field, with what the
step published:

* the ``catalog.published`` event: revision, content digest, parent digest, counts, the
  activation entries and released packs (the delta against the previous expected
  revision), and the audience map root, recomputed from every audience's digest by the
  independent ``tests/support/reference_audience_map``;
* every audience's ``audience_view.published`` event: an event at this revision exactly
  for the audiences whose digest changed, each with the full build's digest;
* the catalog views' rows in force: the head row, activations, audience digests, grants;
* the served views: every audience's grants and facts through ``CatalogReader`` (which
  re-checks its digest against the log), and MISSING for an audience with no binding.

A step that does not publish must leave the revision in force as it was, and whether a
step publishes is itself checked (content changed or not). After every step the kept
fragments (``publish_fragment``), when their marker names the revision in force, must be
that revision's content cut into fragments, row for row. An ``apply`` or ``publish``
that got one audience digest, one activation entry or one fragment wrong fails here.

The campaign variant (``tests/campaigns/test_release_histories_full.py``) runs longer
histories and more examples.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from domain.catalog import catalog_id, published_view_id
from domain.errors import Missing
from domain.identity import Audience
from ledger.commands.catalog_state import log_authorities
from projections.reader import CatalogReader
from projections.views.catalog import OPEN
from publisher.catalog import BindingRow, BuiltCatalog, CatalogInput, ParentState, build_catalog
from publisher.fragments import encoded
from tests.conftest import ENGINES
from tests.support import reference_audience_map as reference
from tests.support.gitrepo import component, pack_json
from tests.support.lifecycle_support import World
from tests.support.stores import INITIALIZED, MariaDBStores, SqliteTemplate

#: Pack names: case variants and a non-ASCII one (bytewise order, R3). The first
#: ``INSTALLED`` are installed by the first release; the others wait for an install step.
PACKS = ("Ops", "ops", "pâck", "sales", "sales-2", "tax", "web", "zeta")
INSTALLED = 6
#: Enough audiences that a step touching a few of them stays under the share above which
#: ``publish`` rebuilds everything (``publishing.INCREMENTAL_LIMIT``): the incremental path
#: is what is on trial.
AUDIENCES = tuple(
    f"{('app', 'integration')[a % 2]}:{('w', 'W', 'wé')[a % 3]}-{a:02d}" for a in range(40)
)
CREDS = ("prod", "test")
KINDS = (
    "install",
    "advance",
    "remove",
    "move",
    "rebind",
    "revoke",
    "cred",
    "grant",
    "publish",
)
#: How a changing step ends: ``apply`` (publishing); ``apply --no-publish`` then a plain
#: ``publish`` at once (``then-publish``); ``apply --no-publish`` (``no-publish``: left for
#: a later step); or ``defer`` (gathered into the next release).
MODES = ("then-publish", "apply", "no-publish", "then-publish", "defer", "apply")
CATALOG_TABLES = (
    "_System_CatalogRevision",
    "_System_CatalogActivation",
    "_System_CatalogGrant",
    "_System_CatalogAudience",
)


def pack_doc(pack: str, version: int) -> bytes:
    """A push contract requiring the pack's profile (credential sets) and mapping, and a
    spare mapping; ``version`` is the push contract's payload."""
    return pack_json(
        pack,
        components=[
            component(
                "push_contract",
                "push",
                {"v": version},
                requires=[
                    {"kind": "callout_profile", "key": "erp"},
                    {"kind": "outbound_mapping", "key": "out"},
                ],
            ),
            component("callout_profile", "erp", {"u": pack}, credential_sets=list(CREDS)),
            component("outbound_mapping", "out", {"f": 1}),
            component("outbound_mapping", "spare", {"f": 2}),
        ],
    )


def payload(pack: str, version: int, kind: str, key: str) -> Any:
    if kind == "push_contract":
        return {"v": version}
    if kind == "callout_profile":
        return {"u": pack}
    return {"f": 1 if key == "out" else 2}


Binding = tuple[str, str, str, str | None]  # pack, kind, key, credential set


def pair(audience: str) -> tuple[str, str]:
    kind, ident = audience.split(":", 1)
    return kind, ident


@dataclass
class Release:
    """What a release converges to: packs (version, commit) and every audience's bindings:
    closures (pack -> credential set) and single mappings ((pack, key))."""

    versions: dict[str, int] = field(default_factory=dict)
    commits: dict[str, str] = field(default_factory=dict)
    closures: dict[str, dict[str, str]] = field(default_factory=dict)
    singles: dict[str, set[tuple[str, str]]] = field(default_factory=dict)

    def bindings(self) -> dict[str, set[Binding]]:
        out: dict[str, set[Binding]] = {}
        for audience in AUDIENCES:
            bound: set[Binding] = set()
            for pack, cred in self.closures.get(audience, {}).items():
                bound |= {
                    (pack, "push_contract", "push", None),
                    (pack, "callout_profile", "erp", cred),
                    (pack, "outbound_mapping", "out", None),
                }
            for pack, key in self.singles.get(audience, set()):
                bound.add((pack, "outbound_mapping", key, None))
            if bound:
                out[audience] = bound
        return out

    def manifest_bindings(self) -> list[dict[str, Any]]:
        return [
            {"audience": a, "pack": p, "kind": k, "key": key}
            | ({} if cred is None else {"credential_set": cred})
            for a, bound in sorted(self.bindings().items())
            for p, k, key, cred in sorted(bound, key=lambda b: (b[0], b[1], b[2], b[3] or ""))
        ]


@dataclass
class Expected:
    """A revision as the full build of its snapshot makes it."""

    revision: int
    built: BuiltCatalog
    root: str
    versions: dict[str, int]

    def parent(self) -> ParentState:
        return ParentState(
            self.revision,
            self.built.content_digest,
            {a[0]: a for a in self.built.activations},
            dict(self.built.audience_digests),
        )


@dataclass
class Stats:
    examples: int = 0
    steps: Counter[str] = field(default_factory=Counter)
    #: Revisions published, by command.
    publications: Counter[str] = field(default_factory=Counter)
    #: Of those, the ones after which the store kept the new revision's fragments (the
    #: incremental path: a full build keeps none).
    kept: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.steps.items()))
        published = ", ".join(
            f"{c} {n} ({self.kept[c]} kept fragments)" for c, n in sorted(self.publications.items())
        )
        return (
            f"{self.examples} examples, {sum(self.steps.values())} steps ({kinds}); "
            f"revisions published by {published}"
        )


class History:
    """One example: a fresh store, its repository, the model, and the checks."""

    def __init__(self, world: World, stats: Stats) -> None:
        self.world = world
        self.stats = stats
        self.wanted = Release()  # what the next release converges to
        self.applied = Release()  # what the store holds (its last release)
        self.removing: list[str] = []  # removals gathered for the next release
        self.in_force: Expected | None = None
        #: Check every audience's served view at the next publication (not only those
        #: whose view changed).
        self.everything = True
        self.releases = 0

    # -- the model's steps -------------------------------------------------------------

    def commit(self, pack: str, version: int) -> None:
        self.wanted.versions[pack] = version
        self.wanted.commits[pack] = self.world.release(
            {f"{pack}/pack.json": pack_doc(pack, version)}
        )

    def first_release(self) -> None:
        for pack in PACKS[:INSTALLED]:
            self.commit(pack, 1)
        for n, audience in enumerate(AUDIENCES):
            cred = CREDS[n % 4 == 0]
            self.wanted.closures[audience] = {PACKS[n % INSTALLED]: cred}
            if n % 7 == 3:
                self.wanted.singles[audience] = {(PACKS[(n + 1) % INSTALLED], "spare")}
        self.release(publish=True)
        self.everything = False

    def step(self, kind: str, i: int, j: int, flag: bool, mode: str) -> None:
        self.stats.steps[kind] += 1
        if kind == "publish":
            self.publish()
            return
        getattr(self, f"_{kind}")(i, j, flag)
        if mode != "defer":
            self.release(publish=mode == "apply")
        if mode == "then-publish":
            self.publish()

    def live(self) -> list[str]:
        return sorted(self.wanted.versions)

    def _install(self, i: int, j: int, flag: bool) -> None:
        idle = [p for p in PACKS if p not in self.wanted.versions and p not in self.removing]
        if not idle:
            return
        pack = idle[i % len(idle)]
        # A pack removed before comes back as a fresh incarnation (a new commit, with the
        # content it had before or other content).
        self.commit(pack, 1 + j % 2)
        if flag:  # and an audience binds it at once
            self.wanted.closures.setdefault(AUDIENCES[j % len(AUDIENCES)], {})[pack] = CREDS[0]

    def _advance(self, i: int, j: int, flag: bool) -> None:
        pack = self.live()[i % len(self.live())]
        self.commit(pack, self.wanted.versions[pack] + 1)

    def _remove(self, i: int, j: int, flag: bool) -> None:
        live = self.live()
        if len(live) <= 2:
            return
        pack = live[i % len(live)]
        others = [p for p in live if p != pack]
        del self.wanted.versions[pack], self.wanted.commits[pack]
        if pack in self.applied.versions:  # else its install was only gathered: dropped
            self.removing.append(pack)
        for audience in AUDIENCES:  # nothing may stay bound to it (R7)
            closures = self.wanted.closures.get(audience, {})
            if pack in closures:
                cred = closures.pop(pack)
                if flag:  # its audiences move to another pack, or lose that binding
                    closures.setdefault(others[(i + j) % len(others)], cred)
            singles = self.wanted.singles.get(audience, set())
            singles -= {s for s in singles if s[0] == pack}

    def _move(self, i: int, j: int, flag: bool) -> None:
        """An audience moves from one pack to another (or is granted one)."""
        audience = AUDIENCES[i % len(AUDIENCES)]
        closures = self.wanted.closures.setdefault(audience, {})
        live = self.live()
        targets = [p for p in live if p not in closures]
        if not targets:
            return
        target = targets[j % len(targets)]
        if closures:
            source = sorted(closures)[j % len(closures)]
            closures[target] = closures.pop(source)
        else:
            closures[target] = CREDS[flag]

    def _rebind(self, i: int, j: int, flag: bool) -> None:
        """A single binding moves to another component or pack (or one is granted)."""
        audience = AUDIENCES[i % len(AUDIENCES)]
        singles = self.wanted.singles.setdefault(audience, set())
        live = self.live()
        target = (live[j % len(live)], ("out", "spare")[flag])
        if singles:
            singles.discard(sorted(singles)[j % len(singles)])
        singles.add(target)

    def _revoke(self, i: int, j: int, flag: bool) -> None:
        audience = AUDIENCES[i % len(AUDIENCES)]
        closures = self.wanted.closures.get(audience, {})
        singles = self.wanted.singles.get(audience, set())
        if closures and (flag or not singles):
            del closures[sorted(closures)[j % len(closures)]]
        elif singles:
            singles.discard(sorted(singles)[j % len(singles)])

    def _cred(self, i: int, j: int, flag: bool) -> None:
        audience = AUDIENCES[i % len(AUDIENCES)]
        closures = self.wanted.closures.get(audience, {})
        if closures:
            pack = sorted(closures)[j % len(closures)]
            closures[pack] = CREDS[closures[pack] == CREDS[0]]

    def _grant(self, i: int, j: int, flag: bool) -> None:
        audience = AUDIENCES[i % len(AUDIENCES)]
        live = self.live()
        self.wanted.closures.setdefault(audience, {}).setdefault(live[j % len(live)], CREDS[flag])

    # -- running them against the store ------------------------------------------------

    def release(self, *, publish: bool) -> None:
        """``apply`` the wanted release (a manifest file) and check what it published."""
        wanted = self.wanted
        document = {
            "packs": [self.world.official(p, wanted.commits[p]) for p in self.live()],
            "remove": list(self.removing),
            "bindings": wanted.manifest_bindings(),
        }
        self.releases += 1
        path = self.world.tmp / f"release-{self.releases}.json"
        path.write_bytes(orjson.dumps(document))
        result = self.world.service.apply(path, publish=publish)
        self.applied = copy.deepcopy(wanted)
        self.removing = []
        catalog = result["catalog"]
        self.published("apply", publish, catalog["published"], catalog["revision"])

    def publish(self) -> None:
        result = self.world.service.publish()
        self.published("publish", True, result["published"], result["revision"])

    def published(self, command: str, publishing: bool, published: bool, revision: int) -> None:
        """Check the step's outcome: a new revision exactly when the full build of the
        snapshot differs from the revision in force, and that revision field for field."""
        in_force = 0 if self.in_force is None else self.in_force.revision
        if publishing:
            expected = self.full_build()
            changed = (
                self.in_force is None
                or expected.built.content_digest != self.in_force.built.content_digest
            )
            assert (published, revision) == (changed, in_force + changed), (
                f"{command}: published {published} revision {revision}; the full build "
                f"{'changes' if changed else 'keeps'} the content of revision {in_force}"
            )
            if changed:
                self.check_revision(expected)
                self.in_force = expected
                self.stats.publications[command] += 1
                self.stats.kept[command] += self.fragments_kept()
        else:
            assert (published, revision) == (False, in_force), (
                f"{command} without publishing: published {published}, revision {revision}"
            )
        self.check_in_force()
        self.check_kept_fragments()

    # -- the full build of the snapshot ------------------------------------------------

    def full_build(self) -> Expected:
        """The next revision built fully from the model's bindings and the store's log
        authorities of the model's packs (each the model's commit, active, not dirty)."""
        applied = self.applied
        with self.world.ledger.snapshot() as reader:
            packs, _ = log_authorities(reader, list(applied.versions))
        for pack, version in applied.versions.items():
            auth = packs[pack]
            assert (auth.source_kind, auth.revision, auth.dirty) == (
                "official_repo",
                applied.commits[pack],
                False,
            ), (pack, version, auth)
        rows = [
            BindingRow(
                kind, ident, p, k, key, cred, packs[p].install_id or "", packs[p].payload_hash or ""
            )
            for audience, bound in applied.bindings().items()
            for kind, ident in [pair(audience)]
            for p, k, key, cred in bound
        ]
        built = build_catalog(CatalogInput(rows, packs))
        root = reference.root(
            {reference.key(*a): bytes.fromhex(d) for a, d in built.audience_digests.items()}
        ).hex()
        revision = 1 if self.in_force is None else self.in_force.revision + 1
        return Expected(revision, built, root, dict(applied.versions))

    # -- the checks --------------------------------------------------------------------

    def check_revision(self, expected: Expected) -> None:
        """The revision just published, in the log, in the views and as served."""
        built = expected.built
        parent = self.in_force.parent() if self.in_force is not None else ParentState()
        activations, released, changed = built.delta(parent)
        recorder = self.world.ledger.recorder
        with self.world.ledger.snapshot() as reader:
            event = recorder.last_events(reader.conn, [catalog_id()])[catalog_id()]
            ids = {published_view_id(*pair(a)): a for a in AUDIENCES}
            views = recorder.last_events(reader.conn, list(ids))
        assert {k: event.data[k] for k in REVISION_FIELDS} == {
            "revision": expected.revision,
            "content_digest": built.content_digest,
            "parent_digest": parent.content_digest,
            "activations": activations,
            "released_packs": released,
            "audiences": [],
            "counts": built.counts,
            "audiences_root": expected.root,
        }
        moved = {f"{kind}:{ident}" for kind, ident, _ in changed}
        for view_id, audience in ids.items():
            want = built.audience_digests.get(pair(audience))
            found = views.get(view_id)
            if audience in moved:
                assert found is not None, audience
                assert (found.data["revision"], found.data["digest"]) == (
                    expected.revision,
                    want,
                ), audience
            elif found is None:
                assert want is None, f"{audience}: no view event, digest {want}"
            else:
                assert found.data["revision"] < expected.revision, audience
                assert found.data["digest"] == want, audience
        self.check_served(expected, AUDIENCES if self.everything else sorted(moved))

    def check_in_force(self) -> None:
        """The catalog views' rows in force are the revision in force's full build."""
        rows = catalog_rows(self.world)
        expected = self.in_force
        if expected is None:
            assert not any(rows.values()), rows
            return
        built = expected.built
        (head,) = [r for r in rows["_System_CatalogRevision"] if r["revision"] == expected.revision]
        assert max(r["revision"] for r in rows["_System_CatalogRevision"]) == expected.revision
        assert head["content_digest"].decode() == built.content_digest
        assert {k: head[k] for k in built.counts} == built.counts
        open_ = [r for r in rows["_System_CatalogActivation"] if r["to_revision"] == OPEN]
        assert (
            sorted(
                [
                    r["pack"].decode(),
                    r["install_id"].decode(),
                    r["revision"].decode(),
                    r["epoch"],
                    r["payload_hash"].decode(),
                ]
                for r in open_
            )
            == built.activations
        )
        assert {
            (r["audience_kind"].decode(), r["audience_id"].decode()): r["digest"].decode()
            for r in rows["_System_CatalogAudience"]
            if r["to_revision"] == OPEN
        } == built.audience_digests
        assert (
            sorted(
                [
                    *(
                        r[c].decode()
                        for c in ("audience_kind", "audience_id", "pack", "kind", "key")
                    ),
                    r["credential_set"].decode() or None,
                    r["install_id"].decode(),
                ]
                for r in rows["_System_CatalogGrant"]
                if r["to_revision"] == OPEN
            )
            == built.grants
        )

    def check_served(self, expected: Expected, audiences: Sequence[str]) -> None:
        """Each of ``audiences`` is served its part of the full build (or MISSING).

        After most steps, the audiences whose view changed; the others' rows in force are
        the full build's (``check_in_force``) and so is their digest in the log."""
        built = expected.built
        facts = {tuple(f[:4]): f[4] for f in built.facts}
        reader = CatalogReader(self.world.db)
        for audience in audiences:
            kind_id = pair(audience)
            grants = [g for g in built.grants if (g[0], g[1]) == kind_id]
            if not grants:
                with pytest.raises(Missing):
                    reader.view(Audience.parse(audience))
                continue
            view = reader.view(Audience.parse(audience))
            assert (view.revision, view.content_digest, view.audience_digest) == (
                expected.revision,
                built.content_digest,
                built.audience_digests[kind_id],
            ), audience
            assert [
                [g["pack"], g["kind"], g["key"], g["credential_set"], g["install_id"]]
                for g in view.grants
            ] == [g[2:] for g in grants], audience
            ids = sorted({(g[2], g[6], g[3], g[4]) for g in grants})
            assert [
                [f["pack"], f["install_id"], f["kind"], f["key"], f["fact_digest"], f["payload"]]
                for f in view.facts
            ] == [
                [*i, facts[i], payload(i[0], expected.versions[i[0]], i[2], i[3])] for i in ids
            ], audience

    def check_kept_fragments(self) -> None:
        """The kept fragments, when their marker names the revision in force, are its
        content: one row per pack (activation, facts) and per audience (grants)."""
        kept = fragment_rows(self.world)
        marker = kept.pop((0, b"", b""), None)
        if marker is None or self.in_force is None or marker[0] != self.in_force.revision:
            return
        built = self.in_force.built
        assert marker[1] == built.content_digest.encode(), "kept fragments' marker digest"
        expected: dict[tuple[int, bytes, bytes], tuple[int, bytes]] = {}
        for section, entries, unit in (
            (1, built.activations, lambda e: (e[0].encode(), b"")),
            (2, built.facts, lambda e: (e[0].encode(), b"")),
            (3, built.grants, lambda e: (e[0].encode(), e[1].encode())),
        ):
            grouped: dict[tuple[bytes, bytes], list[list[Any]]] = {}
            for entry in entries:
                grouped.setdefault(unit(entry), []).append(entry)
            for (a, b), group in grouped.items():
                expected[(section, a, b)] = encoded(group)
        assert kept == expected, "kept fragments differ from the revision in force"

    def fragments_kept(self) -> bool:
        marker = fragment_rows(self.world).get((0, b"", b""))
        return (
            marker is not None and self.in_force is not None and marker[0] == self.in_force.revision
        )


REVISION_FIELDS = (
    "revision",
    "content_digest",
    "parent_digest",
    "activations",
    "released_packs",
    "audiences",
    "counts",
    "audiences_root",
)


def catalog_rows(world: World) -> dict[str, list[dict[str, Any]]]:
    out = {}
    with world.db.read() as conn:
        for table in CATALOG_TABLES:
            out[table] = [
                {
                    k: bytes(v) if isinstance(v, bytes | memoryview) else v
                    for k, v in r._mapping.items()
                }
                for r in conn.execute(sa.text(f"SELECT * FROM {table}"))
            ]
    return out


def fragment_rows(world: World) -> dict[tuple[int, bytes, bytes], tuple[int, bytes]]:
    with world.db.read() as conn:
        return {
            (int(s), bytes(a), bytes(b)): (int(n), bytes(body))
            for s, a, b, n, body in conn.execute(
                sa.text("SELECT section, unit_a, unit_b, entries, body FROM publish_fragment")
            )
        }


# -- the strategy and the runner -----------------------------------------------------------------

STEP = st.tuples(
    st.sampled_from(KINDS),
    st.integers(0, 63),
    st.integers(0, 63),
    st.booleans(),
    st.sampled_from(MODES),
)


class Stores:
    """A fresh, initialized store per example on one engine (a copy of the worker's
    template store, ``tests/support/stores.py``)."""

    def __init__(
        self, engine: str, tmp: Path, template: SqliteTemplate | None, mariadb: MariaDBStores | None
    ) -> None:
        self.engine, self.tmp, self.template, self.mariadb = engine, tmp, template, mariadb
        self.count = 0

    @contextmanager
    def world(self) -> Iterator[World]:
        self.count += 1
        folder = self.tmp / f"history-{self.count}"
        folder.mkdir()
        if self.template is not None:
            self.template.copy_to(folder / "ledger.db")
            url = f"sqlite:///{folder / 'ledger.db'}"
        else:
            assert self.mariadb is not None
            url = self.mariadb.take()
        INITIALIZED.add(url)
        world = World(folder, url)
        try:
            yield world
        finally:
            world.close()
            INITIALIZED.discard(url)
            if self.mariadb is not None:
                self.mariadb.give_back(url)


@pytest.fixture(params=ENGINES)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Stores:
    sqlite = request.param == "sqlite"
    return Stores(
        request.param,
        tmp_path,
        request.getfixturevalue("sqlite_template") if sqlite else None,
        None if sqlite else request.getfixturevalue("mariadb_stores"),
    )


def run_histories(stores: Stores, *, examples: int, steps: int, shrink: bool) -> Stats:
    """Run ``examples`` random histories of ``steps // 2`` to ``steps`` steps each.

    Without ``shrink`` a failing history is reported as drawn: shrinking one replays
    histories on fresh stores for up to five minutes (the campaign shrinks)."""
    stats = Stats()
    phases = tuple(Phase) if shrink else (Phase.explicit, Phase.reuse, Phase.generate)

    @settings(
        max_examples=examples,
        deadline=None,
        phases=phases,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(history=st.lists(STEP, min_size=steps // 2, max_size=steps))
    def check(history: list[tuple[str, int, int, bool, str]]) -> None:
        stats.examples += 1
        with stores.world() as world:
            run = History(world, stats)
            run.first_release()
            for step in history:
                run.step(*step)
            run.everything = True  # every audience's served view, at the end
            run.release(publish=True)  # whatever was gathered or left unpublished

    check()
    return stats


def test_r30_release_histories_publish_what_the_full_rebuild_publishes(stores: Stores) -> None:
    stats = run_histories(stores, examples=5, steps=14, shrink=False)
    print(f"\n[release histories {stores.engine}] {stats.summary()}")
    assert stats.examples >= 5
    # Not only the first releases; and some publications went the incremental way.
    assert stats.publications["apply"] > stats.examples and stats.publications["publish"] > 0
    assert sum(stats.kept.values()) > 0
