"""Typed failures shared by every layer.

Every failure a user can see is one of these classes. Each carries a stable
``code`` (the ``error`` field of the JSON error shape), the CLI exit code of
DESIGN.md and a ``details`` mapping, so callers never parse messages and no
Python traceback has to reach a user.
"""

from __future__ import annotations

from typing import Any, ClassVar


class LedgerError(Exception):
    """Base of every typed failure."""

    code: ClassVar[str] = "ERROR"
    exit_code: ClassVar[int] = 1

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    def to_json(self) -> dict[str, Any]:
        """The DESIGN.md error shape: ``{"error", "message", "details"}``."""
        return {"error": self.code, "message": self.message, "details": self.details}


class UsageError(LedgerError):
    """The command line itself is malformed (exit 2)."""

    code = "USAGE"
    exit_code = 2


class InvalidInput(LedgerError):
    """Bad input: names the field, nothing is written (exit 3)."""

    code = "INVALID"
    exit_code = 3

    def __init__(self, message: str, *, field: str, **details: Any) -> None:
        super().__init__(message, field=field, **details)
        self.field = field


class Conflict(LedgerError):
    """A lost race or a command id reused with other input (exit 4)."""

    code = "CONFLICT"
    exit_code = 4


class FailClosed(LedgerError):
    """Authority is missing, stale or forbids the transition (exit 5)."""

    code = "FAIL_CLOSED"
    exit_code = 5


class Missing(FailClosed):
    """Non-disclosing absence (R19)."""

    code = "MISSING"


class Stale(FailClosed):
    """The served state is older than required (R19): axis, required, served."""

    code = "STALE"


class Unauthenticated(FailClosed):
    """A runtime read without a valid credential (R26): missing, malformed, unknown,
    revoked or expired bearer token. HTTP 401 with ``WWW-Authenticate: Bearer``; exit 5
    (fail-closed authority) should a CLI path ever raise it."""

    code = "UNAUTHENTICATED"


class MigrationRequired(FailClosed):
    """The store's schema is older than this program's: run ``catalog-ledger migrate``."""

    code = "MIGRATION_REQUIRED"


class LifecycleRejected(FailClosed):
    """A lifecycle rule (R5-R14) rejects the command; ``reason`` names the rule."""

    code = "LIFECYCLE"

    def __init__(self, message: str, *, reason: str, **details: Any) -> None:
        super().__init__(message, reason=reason, **details)
        self.reason = reason


class IntegrityFailure(LedgerError):
    """Stored data does not match its digest or chain (exit 6)."""

    code = "INTEGRITY"
    exit_code = 6


class Unavailable(LedgerError):
    """The store cannot be reached or opened (server down, read-only path)."""

    code = "UNAVAILABLE"
    exit_code = 1


class Permission(LedgerError):
    """The database refused this account the operation (exit 7): a missing grant
    (MySQL 1142 table, 1143 column, 1044 database, 1227 privilege) or a refused login
    (1045). Not UNAVAILABLE: the server is up, and retrying will not help until an
    administrator changes the grants or the credentials."""

    code = "PERMISSION"
    exit_code = 7
