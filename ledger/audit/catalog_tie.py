"""The tie from the stored cosigned checkpoints to the main log (R29), for ``audit verify``.

Runtimes are shown the notes of ``ledger_checkpoint``; auditors replay the main log. Each
stored row must therefore be a checkpoint of a log this store derives from its main log:
its note parses as the row's own origin, size and root, and that (size, root) is the
catalog log's recomputed from the main log's stored bytes (``ledger.store.catalog_log``
recomputes every revision event's id), or the main log's own for a row of its origin.
Anything else is a problem naming the table and the origin: a runtime may have been shown
a history the auditors never see (a split view).
"""

from __future__ import annotations

from domain.errors import IntegrityFailure, InvalidInput
from domain.notes import Checkpoint
from domain.origin import catalog_origin
from ledger.audit.proofs import MerkleLog, origin_of
from ledger.store.catalog_log import (
    CHECKPOINT_TABLE,
    CatalogLog,
    stored_checkpoints,
)
from ledger.store.migrations import read_version
from ledger.store.runtime import Ledger

#: The schema version that added ``ledger_checkpoint``.
SINCE = 3


def checkpoint_problems(ledger: Ledger) -> list[str]:
    """What is wrong with each stored checkpoint row (nothing: every row is tied)."""
    with ledger.db.read() as conn:
        version, _ = read_version(conn)
        if version is None or version < SINCE:
            return []
        try:
            rows = stored_checkpoints(conn)
        except IntegrityFailure as exc:
            return [exc.message]
        catalog = CatalogLog(ledger.db)
        try:
            catalog.refresh(conn)
        except IntegrityFailure as exc:
            return [f"the catalog log cannot be recomputed: {exc.message}"]
    main = origin_of(ledger)
    problems = []
    for row in rows:
        problem = _problem(ledger, row.origin, row.size, row.root, row.note, main, catalog)
        if problem is not None:
            problems.append(
                f"{CHECKPOINT_TABLE} row of origin {row.origin!r} (size {row.size}): {problem}"
            )
    return problems


def _problem(
    ledger: Ledger,
    origin: str,
    size: int,
    root: bytes,
    note: str,
    main: str,
    catalog: CatalogLog,
) -> str | None:
    try:
        parsed = Checkpoint.parse(note)
    except InvalidInput as exc:
        return f"its note does not parse ({exc.message})"
    if parsed != Checkpoint(origin, size, root):
        return "its note is not the row's own origin, size and root"
    if origin == catalog_origin(main):
        if size > catalog.size:
            return f"the catalog log recomputed from the main log has {catalog.size} revisions"
        if catalog.root(size) != root:
            return f"its root is not the catalog log's at size {size}, recomputed from the main log"
        return None
    if origin == main:
        log = MerkleLog(ledger)
        if size > log.size():
            return f"the main log has {log.size()} events"
        return None if log.root(size) == root else f"its root is not the main log's at size {size}"
    return "the origin is neither this store's main log nor its catalog log"
