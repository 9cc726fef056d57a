"""Which store a command opens: ``--db``, then ``CATALOG_LEDGER_DB``, then the default.

Standard library only, so the CLI checks ``--db`` before it imports a database driver.
"""

from __future__ import annotations

import os

from domain.errors import InvalidInput

DEFAULT_URL = "sqlite:///catalog.db"
ENV_VAR = "CATALOG_LEDGER_DB"


def resolve_url(explicit: str | None) -> str:
    """``--db`` wins, then ``CATALOG_LEDGER_DB``, then the SQLite default.

    An empty ``--db`` is a mistake, not a request for the default store.
    """
    if explicit is not None and not explicit.strip():
        raise InvalidInput(
            "--db is empty; give a store URL such as sqlite:///catalog.db", field="db"
        )
    return explicit or os.environ.get(ENV_VAR) or DEFAULT_URL
