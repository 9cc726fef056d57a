"""A log's origin and the id of its identity aggregate (R29), apart from the aggregate
itself (``domain.log_identity``): the runtime client checks origins and rotation events
without loading ``eventsourcing`` (``tests/e2e/test_r26_client.py``)."""

from __future__ import annotations

from uuid import UUID

from domain.digests import aggregate_id
from domain.errors import InvalidInput

#: The origin a log has before it is named: its store's id (``ledger_meta.store_id``).
ORIGIN_PREFIX = "catalog-ledger/"
_MAX_ORIGIN = 255
#: A catalog log's origin is its main log's followed by this (LOG-FORMAT "Catalog log").
CATALOG_SUFFIX = "/catalog"


def catalog_origin(main_origin: str) -> str:
    """The catalog log's checkpoint origin from its main log's."""
    return main_origin + CATALOG_SUFFIX


def main_log_origin(catalog_origin: str) -> str:
    """The main log's origin from its catalog log's (a trust policy's ``origin``): the
    main log's checkpoint covers the log's key rotations. INVALID naming ``origin``
    otherwise."""
    if not catalog_origin.endswith(CATALOG_SUFFIX) or catalog_origin == CATALOG_SUFFIX:
        raise InvalidInput(
            f"the origin {catalog_origin!r} is not a catalog log's (...{CATALOG_SUFFIX}): no "
            "main log to learn key rotations from",
            field="origin",
        )
    return catalog_origin.removesuffix(CATALOG_SUFFIX)


def log_identity_id() -> UUID:
    """The one ``LogIdentity`` aggregate of a log (a fixed id: one index seek finds it)."""
    return aggregate_id("log", "identity")


def default_origin(store_id: str) -> str:
    """The origin of a log that has no ``log.named`` event: its store's id."""
    return f"{ORIGIN_PREFIX}{store_id}"


def check_origin(origin: object, *, field: str = "origin") -> str:
    """A checkpoint origin: one non-empty line of printable text, no spaces or '+' (so that
    it can also be a note key name, tlog-checkpoint's advice), at most 255 characters."""
    ok = (
        isinstance(origin, str)
        and 0 < len(origin) <= _MAX_ORIGIN
        and origin.isprintable()
        and not any(c.isspace() or c == "+" for c in origin)
    )
    if not ok:
        raise InvalidInput(
            f"{field} must be one line of printable text without spaces or '+' "
            f"(1-{_MAX_ORIGIN} characters)",
            field=field,
        )
    assert isinstance(origin, str)
    return origin
