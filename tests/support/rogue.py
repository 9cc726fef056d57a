"""A rogue writer for the R11/R30 fence tests: another process appending without taking
the writer lease, under a copy of the release's lease handle."""

from __future__ import annotations

from domain.catalog import AudienceBindings, audience_bindings_id
from domain.identity import PackName
from domain.matrix import Decision, decide
from ledger.commands.steps import LifecycleSteps
from ledger.commands.unit_of_work import UnitOfWork
from ledger.commands.writer_lease import WRITER_LEASE, LeaseHandle, read_lease
from ledger.log.db import open_database
from ledger.store.runtime import Ledger
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World


class Rogue:
    """Another process writing without taking the writer lease: its own connection, unit
    of work and lifecycle steps, appending under a copy of the lease handle as the log
    has it (holder, epoch, version). The lease aggregate does not move, so the release's
    lease fence lets it pass; only the fences on what the release read can stop it."""

    def __init__(self, world: World, holder: str) -> None:
        self.world = world
        self.holder = holder
        self.ledger = Ledger(open_database(world.url))
        self.uow = UnitOfWork(self.ledger)
        self.steps = LifecycleSteps(self.uow)

    def close(self) -> None:
        self.ledger.close()

    def handle(self) -> LeaseHandle:
        lease, _ = read_lease(self.ledger)
        assert lease is not None and lease.holder == self.holder  # the release holds it
        return LeaseHandle(WRITER_LEASE, lease.holder, lease.epoch, lease.version)

    def advance(self, pack: str, version: int) -> None:
        """Prepare and activate ``pack`` at a new commit (two appends)."""
        resolved = self.world.resolved(pack, self.world.commit(pack, version))
        decision, command = decide(self.world.state(pack), resolved.target)
        assert decision is Decision.ADVANCE and command is not None
        handle = self.handle()
        candidates = self.steps.prepare(handle, [(resolved, command)])
        self.steps.activate(handle, candidates)

    def activate_newest(self, pack: str) -> None:
        """Activate ``pack``'s newest (preparing) attempt: the release's own candidate."""
        newest = self.world.state(pack).newest
        assert newest is not None
        self.steps.activate(self.handle(), {pack: newest.install_id})

    def remove(self, pack: str) -> None:
        """R7 remove, with no regard for the bindings that name the pack."""
        self.steps.activate(self.handle(), {}, removals=[PackName(pack)])

    def grant_closure(self, audience: str, pack: str) -> None:
        """Grant ``pack``'s push closure (contract + profile) of its active generation to
        ``audience``: one append of the audience's binding aggregate, fenced on the
        version read."""
        kind, ident = audience.split(":", 1)
        active = self.world.state(pack).active
        assert active is not None
        aid = audience_bindings_id(kind, ident)
        with self.ledger.snapshot() as reader:
            found = reader.get(aid, AudienceBindings)
            version = reader.version(aid)
        bindings = found or AudienceBindings(audience_kind=kind, audience_id=ident)
        for row in push_closure(audience, pack):
            bindings.grant(
                pack,
                row["kind"],
                row["key"],
                row.get("credential_set"),
                active.install_id,
                active.payload_hash,
            )
        self.ledger.app.save(bindings, fence={aid: version})

    def revoke_closure(self, audience: str, pack: str) -> None:
        """Revoke ``pack``'s push closure (bound to its active generation) from
        ``audience``: one append of the audience's binding aggregate."""
        kind, ident = audience.split(":", 1)
        active = self.world.state(pack).active
        assert active is not None
        aid = audience_bindings_id(kind, ident)
        with self.ledger.snapshot() as reader:
            found = reader.get(aid, AudienceBindings)
            version = reader.version(aid)
        assert found is not None
        for row in push_closure(audience, pack):
            found.revoke(
                pack, row["kind"], row["key"], row.get("credential_set"), active.install_id
            )
        self.ledger.app.save(found, fence={aid: version})
