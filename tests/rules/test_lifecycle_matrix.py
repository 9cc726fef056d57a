"""R11/R13: every lifecycle state x every command is allowed or rejected with a named reason,
and no rejected command appends anything. Real stores: SQLite file and MariaDB.

Removal (R7) is a command of its own and "removed" a state of its own; every state a pack
can reach again after a removal (a fresh incarnation) is judged exactly as the first time."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from domain.classifier import Condition, classify
from domain.errors import LedgerError, LifecycleRejected
from domain.identity import PackName
from domain.lifecycle import Generation
from domain.matrix import Adopt, Advance, Install
from ledger.commands.writer_lease import LeaseHandle
from tests.support.lifecycle_support import World

C = Condition
OK = None
# The specification: (condition, command) -> None (allowed) or the rejection reason.
EXPECTED: dict[str, dict[Condition, str | None]] = {
    "install": {
        C.ABSENT: OK,
        C.LEGACY_ACTIVE: "LEGACY_RECORD_EXISTS",
        C.LEGACY_INACTIVE: "LEGACY_RECORD_EXISTS",
        C.LEGACY_LOCAL: "LEGACY_RECORD_EXISTS",
        C.LOCAL: "SOURCE_KIND_CHANGE",
        C.FIRST_PREPARING: "ATTEMPT_IN_PROGRESS",
        C.FIRST_FAILED_CLEAN: OK,
        C.FIRST_FAILED_DIRTY: OK,
        C.ACTIVE: "ALREADY_ACTIVE",
        C.ACTIVE_PREPARING: "ATTEMPT_IN_PROGRESS",
        C.ACTIVE_FAILED_CLEAN: "ALREADY_ACTIVE",
        C.ACTIVE_FAILED_DIRTY: "ALREADY_ACTIVE",
        C.REMOVED: OK,  # R7: installed again, as a fresh incarnation
    },
    "adopt": {
        C.ABSENT: "NO_LEGACY_RECORD",
        C.LEGACY_ACTIVE: OK,
        C.LEGACY_INACTIVE: "LEGACY_NOT_ACTIVE",
        C.LEGACY_LOCAL: "LOCAL_PATH_NOT_AUTHORITY",
        C.LOCAL: "SOURCE_KIND_CHANGE",
        C.FIRST_PREPARING: "PACK_HAS_HISTORY",
        C.FIRST_FAILED_CLEAN: "PACK_HAS_HISTORY",
        C.FIRST_FAILED_DIRTY: "PACK_HAS_HISTORY",
        C.ACTIVE: "ALREADY_ACTIVE",
        C.ACTIVE_PREPARING: "ALREADY_ACTIVE",
        C.ACTIVE_FAILED_CLEAN: "ALREADY_ACTIVE",
        C.ACTIVE_FAILED_DIRTY: "ALREADY_ACTIVE",
        C.REMOVED: "PACK_HAS_HISTORY",
    },
    "advance": {
        C.ABSENT: "MISSING_AUTHORITY",
        C.LEGACY_ACTIVE: "MISSING_AUTHORITY",
        C.LEGACY_INACTIVE: "MISSING_AUTHORITY",
        C.LEGACY_LOCAL: "MISSING_AUTHORITY",
        C.LOCAL: "MISSING_AUTHORITY",
        C.FIRST_PREPARING: "MISSING_AUTHORITY",
        C.FIRST_FAILED_CLEAN: "MISSING_AUTHORITY",
        C.FIRST_FAILED_DIRTY: "MISSING_AUTHORITY",
        C.ACTIVE: OK,
        C.ACTIVE_PREPARING: "ATTEMPT_IN_PROGRESS",
        C.ACTIVE_FAILED_CLEAN: OK,
        C.ACTIVE_FAILED_DIRTY: OK,
        C.REMOVED: "MISSING_AUTHORITY",  # a removed pack is installed again, never advanced
    },
    "activate": {
        c: ("NOT_PREPARING" if c not in (C.FIRST_PREPARING, C.ACTIVE_PREPARING) else OK)
        for c in Condition
    },
    "fail": {
        c: ("NOT_PREPARING" if c not in (C.FIRST_PREPARING, C.ACTIVE_PREPARING) else OK)
        for c in Condition
    },
    "local_update": {
        C.ABSENT: OK,
        C.LEGACY_ACTIVE: "LOCAL_PATH_NOT_AUTHORITY",
        C.LEGACY_INACTIVE: "LOCAL_PATH_NOT_AUTHORITY",
        C.LEGACY_LOCAL: OK,
        C.LOCAL: OK,
        **{
            c: "LOCAL_PATH_NOT_AUTHORITY"
            for c in Condition
            if c.value.startswith(("first", "active"))
        },
        C.REMOVED: OK,  # a fresh incarnation may be local_path (R5: never authority)
    },
    "import_legacy": {
        C.ABSENT: OK,
        C.LEGACY_ACTIVE: "LEGACY_RECORD_EXISTS",
        C.LEGACY_INACTIVE: "LEGACY_RECORD_EXISTS",
        C.LEGACY_LOCAL: "LEGACY_RECORD_EXISTS",
        **{
            c: "PACK_HAS_HISTORY"
            for c in Condition
            if c not in (C.ABSENT, C.LEGACY_ACTIVE, C.LEGACY_INACTIVE, C.LEGACY_LOCAL)
        },
    },
    # R7 remove: the pointer moves from the active generation to none (epoch + 1), or a
    # local_path record goes. A failed newest attempt belongs to the removed incarnation.
    # (``apply`` turns NOT_INSTALLED into INVALID naming ``remove[i]`` before this.)
    "remove": {
        C.ABSENT: "NOT_INSTALLED",
        C.LEGACY_ACTIVE: "LEGACY_NOT_ADOPTED",
        C.LEGACY_INACTIVE: "LEGACY_NOT_ADOPTED",
        C.LEGACY_LOCAL: "LEGACY_NOT_ADOPTED",
        C.LOCAL: OK,
        C.FIRST_PREPARING: "NOT_INSTALLED",
        C.FIRST_FAILED_CLEAN: "NOT_INSTALLED",
        C.FIRST_FAILED_DIRTY: "NOT_INSTALLED",
        C.ACTIVE: OK,
        C.ACTIVE_PREPARING: "ATTEMPT_IN_PROGRESS",
        C.ACTIVE_FAILED_CLEAN: OK,
        C.ACTIVE_FAILED_DIRTY: OK,
        C.REMOVED: "NOT_INSTALLED",
    },
}
#: The states a pack can be in again after its history ended in removal (R7).
AFTER_REMOVAL = frozenset(c for c in Condition if not c.value.startswith(("absent", "legacy")))


class Matrix:
    """Puts fresh packs into each condition and runs each command against them."""

    def __init__(self, world: World) -> None:
        self.w = world
        self.handle: LeaseHandle = world.service.acquire_lease()
        self.counter = 0
        self.pause_lease = False

    def new_pack(self) -> str:
        self.counter += 1
        return f"p{self.counter}"

    def legacy(self, pack: str, *, status: str = "active", kind: str = "official_repo") -> None:
        commit = self.w.commit(pack, 1)
        resolved = self.w.resolved(pack, commit)
        self.w.service.release_lease(self.handle)
        self.w.service.import_legacy(
            self.w.legacy_file(
                [
                    {
                        "pack": pack,
                        "install_id": f"legacy-{pack}",
                        "status": status,
                        "category": "app",
                        "source": {"kind": kind, "repo": "old", "revision": commit},
                        "applied_payload_hash": resolved.content.payload_hash_v1,
                    }
                ]
            )
        )
        self.handle = self.w.service.acquire_lease()

    def remove(self, pack: str) -> None:
        self.w.service.activate(self.handle, {}, removals=[PackName(pack)])

    def installed_and_removed(self, pack: str, version: int) -> None:
        s, h = self.w.service, self.handle
        target = self.w.resolved(pack, self.w.commit(pack, version))
        (install_id,) = s.prepare(h, [(target, Install(target.target))]).values()
        s.activate(h, {pack: install_id})
        self.remove(pack)

    def into(self, condition: Condition, *, after_removal: bool = False) -> str:
        pack = self.new_pack()
        s, h = self.w.service, self.handle
        if after_removal:  # an earlier incarnation, installed and removed
            assert condition in AFTER_REMOVAL
            self.installed_and_removed(pack, 5)
        if condition is C.ABSENT:
            return pack
        if condition is C.REMOVED:
            self.installed_and_removed(pack, 1)
            assert classify(self.w.state(pack)) is condition
            return pack
        if condition is C.LEGACY_ACTIVE:
            self.legacy(pack)
        elif condition is C.LEGACY_INACTIVE:
            self.legacy(pack, status="failed")
        elif condition is C.LEGACY_LOCAL:
            self.legacy(pack, kind="local_path")
        elif condition is C.LOCAL:
            s.activate(
                h, {}, local_updates=[self.w.resolved_local(pack, self.w.local_dir(pack, 1))]
            )
        else:
            first = self.w.resolved(pack, self.w.commit(pack, 1))
            (install_id,) = s.prepare(h, [(first, Install(first.target))]).values()
            if condition is C.FIRST_FAILED_CLEAN:
                s.fail(h, pack, install_id, dirty=False, reason="test")
            elif condition is C.FIRST_FAILED_DIRTY:
                s.fail(h, pack, install_id, dirty=True, reason="test")
            elif condition is not C.FIRST_PREPARING:
                s.activate(h, {pack: install_id})
                if condition is not C.ACTIVE:
                    second = self.w.resolved(pack, self.w.commit(pack, 2))
                    advance = Advance(second.target, str(first.source.revision))
                    (candidate,) = s.prepare(h, [(second, advance)]).values()
                    if condition is C.ACTIVE_FAILED_CLEAN:
                        s.fail(h, pack, candidate, dirty=False, reason="test")
                    elif condition is C.ACTIVE_FAILED_DIRTY:
                        s.fail(h, pack, candidate, dirty=True, reason="test")
        assert classify(self.w.state(pack)) is condition
        return pack

    def command(self, name: str, pack: str) -> Callable[[], object]:
        s, h, w = self.w.service, self.handle, self.w
        state = w.state(pack)
        newest = state.newest.install_id if state.newest else "no-such-attempt"
        target = w.resolved(pack, w.commit(pack, 7))
        if name == "install":
            return lambda: s.prepare(h, [(target, Install(target.target))])
        if name == "adopt":
            # Adopt exactly the content the legacy record's hash proves.
            legacy_content = w.resolved(pack, w.commit(pack, 1))
            return lambda: s.activate(h, {}, adoptions=[legacy_content])
        if name == "advance":
            frm = (state.activation.revision if state.activation else None) or "0" * 40
            return lambda: s.prepare(h, [(target, Advance(target.target, frm))])
        if name == "activate":
            return lambda: s.activate(h, {pack: newest})
        if name == "fail":
            return lambda: s.fail(h, pack, newest, dirty=False, reason="matrix")
        if name == "local_update":
            folder = w.local_dir(pack, 9)
            return lambda: s.activate(h, {}, local_updates=[w.resolved_local(pack, folder)])
        if name == "remove":
            return lambda: s.activate(h, {}, removals=[PackName(pack)])
        assert name == "import_legacy"
        path = w.legacy_file(
            [
                {
                    "pack": pack,
                    "install_id": f"other-{pack}",
                    "status": "active",
                    "category": "app",
                    "source": {"kind": "official_repo"},
                    "applied_payload_hash": None,
                }
            ]
        )

        self.pause_lease = True
        return lambda: s.import_legacy(path)

    def before(self) -> None:
        """import-legacy takes the writer lease itself: do not hold it meanwhile."""
        if self.pause_lease:
            self.w.service.release_lease(self.handle)

    def after(self) -> None:
        if self.pause_lease:
            self.handle = self.w.service.acquire_lease()
            self.pause_lease = False


def test_r13_the_matrix_has_a_cell_for_every_state_and_command() -> None:
    assert {c: set(row) for c, row in EXPECTED.items()} == {c: set(Condition) for c in EXPECTED}


@pytest.mark.parametrize("command", sorted(EXPECTED))
def test_r13_state_command_matrix_rejects_by_name_and_appends_nothing(
    world: World, command: str
) -> None:
    assert _mismatches(world, command, after_removal=False) == []


@pytest.mark.parametrize("command", sorted(EXPECTED))
def test_r7_r13_states_reached_again_after_a_removal_are_judged_as_the_first_time(
    tmp_path: Path, sqlite_url: str, command: str
) -> None:
    """Every state a fresh incarnation can reach, on a pack whose earlier incarnation was
    installed and removed (R7), gets the same cell as the first time. The classifier and
    the matrix are pure; the engines are both covered by the test above, so this one runs
    on SQLite only to keep the suite fast."""
    world = World(tmp_path, sqlite_url)
    try:
        assert _mismatches(world, command, after_removal=True) == []
    finally:
        world.close()


def _mismatches(world: World, command: str, *, after_removal: bool) -> list[str]:
    matrix = Matrix(world)
    mismatches = []
    for condition, expected in EXPECTED[command].items():
        if after_removal and condition not in AFTER_REMOVAL:
            continue
        pack = matrix.into(condition, after_removal=after_removal)
        run = matrix.command(command, pack)
        matrix.before()
        before = world.head()
        try:
            run()
            outcome: str | None = None
        except LifecycleRejected as exc:
            outcome = exc.reason
            assert exc.details["rejections"][0]["pack"] == pack
        except LedgerError as exc:  # reported as a mismatch below
            outcome = f"{exc.code}: {exc.message}"
        after = world.head()
        matrix.after()
        if outcome != expected:
            mismatches.append(f"{condition.value}: expected {expected}, got {outcome}")
        elif expected is not None and after != before:
            mismatches.append(f"{condition.value}: rejected but appended {after - before} events")
        elif expected is None and after == before:
            mismatches.append(f"{condition.value}: allowed but appended nothing")
    return mismatches


def test_r11_category_change_rejected_in_preflight(world: World) -> None:
    matrix = Matrix(world)
    pack = matrix.into(C.ACTIVE)
    state = world.state(pack)
    other = world.resolved(pack, world.commit(pack, 3, category="integration"))
    before = world.head()
    with pytest.raises(LifecycleRejected) as info:
        world.service.prepare(matrix.handle, [(other, Advance(other.target, _revision(state)))])
    assert info.value.reason == "CATEGORY_CHANGE"
    assert world.head() == before


def test_r11_exhausted_epoch_rejected_before_any_append(world: World, tmp_path: Path) -> None:
    from ledger.commands.service import CommandService

    matrix = Matrix(world)
    pack = matrix.into(C.ACTIVE)
    capped = CommandService(world.ledger, max_epoch=1, holder=world.service.holder)
    state = world.state(pack)
    target = world.resolved(pack, world.commit(pack, 4))
    before = world.head()
    with pytest.raises(LifecycleRejected) as info:
        capped.prepare(matrix.handle, [(target, Advance(target.target, _revision(state)))])
    assert info.value.reason == "EPOCH_EXHAUSTED"
    assert world.head() == before


def test_r11_wrong_from_revision_rejected(world: World) -> None:
    matrix = Matrix(world)
    pack = matrix.into(C.ACTIVE)
    target = world.resolved(pack, world.commit(pack, 5))
    before = world.head()
    with pytest.raises(LifecycleRejected) as info:
        world.service.prepare(matrix.handle, [(target, Advance(target.target, "f" * 40))])
    assert info.value.reason == "FROM_REVISION_MISMATCH"
    assert world.head() == before


def test_r5_local_path_rejected_where_authority_is_needed(world: World) -> None:
    matrix = Matrix(world)
    pack = matrix.into(C.ABSENT)
    local = world.resolved_local(pack, world.local_dir(pack, 1))
    before = world.head()
    for command in (Install(local.target), Adopt(local.target), Advance(local.target, "a" * 40)):
        with pytest.raises(LifecycleRejected) as info:
            world.service.prepare(matrix.handle, [(local, command)])
        assert info.value.reason in ("LOCAL_PATH_NOT_AUTHORITY", "MISSING_AUTHORITY")
    assert world.head() == before


def test_r11_stale_decision_never_commits(world: World) -> None:
    """A decision made on state read before another writer moved it fails inside the append."""
    matrix = Matrix(world)
    pack = matrix.into(C.ACTIVE)
    stale = {p: world.state(p) for p in [pack]}
    state = stale[pack]
    target = world.resolved(pack, world.commit(pack, 6))
    command = Advance(target.target, _revision(state))
    world.service.prepare(matrix.handle, [(target, command)])  # the pack moves meanwhile
    before = world.head()
    from domain.errors import Conflict
    from domain.identity import PackName

    def build(_states: object) -> list[Generation]:
        # A brand-new aggregate: only the fence and the terminal check can stop it.
        return [
            Generation(
                pack=pack,
                install_id="stale-candidate",
                ordinal=99,
                origin="advance",
                category="app",
                source=target.source.to_json(),
                payload_hash=target.content.payload_hash_v1,
                components=[],
                from_install_id=None,
            )
        ]

    with pytest.raises((Conflict, LifecycleRejected)):
        world.service.checked_append(
            matrix.handle, {PackName(pack): command}, build, states={PackName(pack): state}
        )
    assert world.head() == before


def _revision(state: object) -> str:
    activation = getattr(state, "activation", None)
    assert activation is not None
    return str(activation.revision)
