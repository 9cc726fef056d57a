"""The log as an ``eventsourcing`` application a downstream consumer can build itself.

``eventsourcing``'s ``ProjectionRunner`` and ``System`` build the application they
follow as ``application_class(env)``. ``LedgerApplication`` needs an opened
``Database``, so they cannot build it; ``LedgerLog`` can: it opens the store named by
``env["CATALOG_LEDGER_DB"]`` (else ``$CATALOG_LEDGER_DB``, else ``sqlite:///catalog.db``,
as every command does), refuses a store whose schema differs unsafely from the
declared one (R24; every schema version this release reads is accepted, as for the
read-only audit commands), and serves the log read-only:

* ``recorder.subscribe(gt=...)`` and ``recorder.select_notifications(...)`` yield every
  event in position order (gapless: the notification id is the log position);
* ``mapper.to_domain_event(...)`` turns each into the domain event of this release,
  upcast from older schema versions (R23).

Appending is refused: writes go through ``catalog-ledger`` commands (leases, fences,
inline views), never through a follower.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

from eventsourcing.domain import DomainEventProtocol, MutableOrImmutableAggregate
from eventsourcing.persistence import Recording

from domain.errors import UsageError
from ledger.log.application import LedgerApplication
from ledger.log.db import open_database
from ledger.log.url import ENV_VAR, resolve_url
from ledger.store import contract
from ledger.store.init import require_schema


class LedgerLog(LedgerApplication):
    """The store's log, read-only, built from ``env`` alone (``LedgerLog(env)``)."""

    name = "CatalogLedger"

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        db = open_database(resolve_url((env or {}).get(ENV_VAR)), create=False)
        try:
            require_schema(db)
            contract.require(db, allow_older=True)
            super().__init__(db, env=env)
        except BaseException:
            db.close()
            raise

    def save(
        self,
        *objs: MutableOrImmutableAggregate[UUID] | DomainEventProtocol[UUID] | None,
        **kwargs: Any,
    ) -> list[Recording[UUID]]:
        raise UsageError(
            "LedgerLog follows the log read-only; append with catalog-ledger commands",
            method="save",
        )

    def close(self) -> None:
        super().close()
        self.db.close()
