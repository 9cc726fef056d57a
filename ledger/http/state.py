"""What one read service's routes share: the opened store and what serves from it.

Filled when the app starts (``open``) with the store ``ledger_factory`` opens, a
``CatalogReader`` over it, on a networked store the ``StateGate`` that lets concurrent
requests share one serving-state read, the ``WatchHub`` of waiting watches, whether
this process may write (a replica's may not, R19) and the schema contract's differences
found at start (R24). Empty for an app built for its OpenAPI document alone: then every
route that reads answers UNAVAILABLE.
"""

from __future__ import annotations

import threading
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from domain.errors import LedgerError, Unavailable
from ledger.http.serving import StateGate
from ledger.store import contract
from ledger.store.replica import writable
from projections.reader import CatalogReader

if TYPE_CHECKING:
    from ledger.http.proofs import ProofService
    from ledger.http.watch import WatchHub
    from ledger.store.runtime import Ledger


class ServiceState:
    """The store one app serves, once it has started."""

    def __init__(self) -> None:
        self.ledger: Ledger | None = None
        self.catalog: CatalogReader | None = None
        self.gate: StateGate | None = None
        #: Proof bundles (R29), made on the first ``proof=1`` read; on a networked store
        #: the stored checkpoint is read through a gate of its own (``note_gate``).
        self.proofs: ProofService | None = None
        self.note_gate: StateGate | None = None
        self.watch: WatchHub | None = None
        #: False when this service writes nothing (read-only server or SELECT-only account).
        self.writes = False
        #: The schema contract's differences (R24), checked once when the service started.
        self.schema: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def open(self, ledger: Ledger) -> CatalogReader:
        """Serve ``ledger``: its reader, and the gate on a networked store."""
        self.ledger = ledger
        self.catalog = CatalogReader(ledger.db)
        if not ledger.db.is_sqlite:
            self.gate = StateGate(self.catalog.serving_state)
        return self.catalog

    def probe(self) -> None:
        """Whether this process may write, and the schema contract's differences."""
        assert self.ledger is not None
        self.writes = writable(self.ledger.db)
        self.schema = [d.to_json() for d in contract.check(self.ledger.db)]

    def reader(self) -> CatalogReader:
        """The catalog reader; UNAVAILABLE without a store or when it is gone."""
        found = self.catalog
        if found is None:
            raise Unavailable("the read service has no store")
        assert self.ledger is not None
        gone = self.ledger.db.vanished()
        if gone is not None:  # never serve a store that is no longer there
            raise Unavailable(f"the store is unavailable: {gone}")
        return found

    def proof_service(self) -> ProofService:
        """The proof bundles of this service's store (made on first use)."""
        if self.proofs is None:
            from ledger.api import catalog_origin
            from ledger.http.proofs import ProofService

            self.reader()  # UNAVAILABLE without a store
            ledger = self.ledger
            assert ledger is not None
            proofs = ProofService(ledger, lambda: catalog_origin(ledger))
            if not ledger.db.is_sqlite:
                self.note_gate = StateGate(proofs.stored)
            self.proofs = proofs
        return self.proofs

    def watch_hub(self) -> WatchHub:
        if self.watch is None:
            raise Unavailable("the read service has no store")
        return self.watch

    def follow(self, every: float) -> None:
        """Keep the catch-up views current until ``stop`` (a thread of its own)."""
        ledger = self.ledger
        assert ledger is not None
        while not self.stop.wait(every):
            for projection in ledger.runner.projections:
                if not projection.inline:
                    with suppress(LedgerError):
                        ledger.runner.catch_up(ledger.db, projection.name)

    def close(self) -> None:
        self.stop.set()
        if self.watch is not None:
            self.watch.close()
        if self.ledger is not None:
            self.ledger.close()
