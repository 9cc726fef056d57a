"""Structured logs: one setup per CLI invocation, records on stderr only.

Every product logger is ``catalog_ledger.<area>`` (``apply``, ``lease``,
``publish``, ``projections``, ``http``, …); uvicorn's loggers go through the
same handler. Two formats:

- ``json``: one JSON object per line — ``ts`` (RFC 3339 UTC), ``level``,
  ``logger``, ``event`` (the message), then the record's own fields
  (``command_id``, ``phase``, ``duration_ms``, counts…);
- ``text``: ``ts LEVEL logger: event key=value …`` for people.

A command method runs inside :func:`command_log` (``@logged_command``): its
phases (``@phased`` / :func:`phase`) are logged with ``duration_ms``, and its
command id, once known (:func:`bind`), is added to every record logged
meanwhile, also by layers that only use the stdlib ``logging`` module (the
projection runner's ``views`` phase). Nothing secret
is ever passed to a log call; as a second line of defence, a field whose name
says it holds a secret is written as ``[redacted]``. Logs never go to stdout,
so ``--json`` output stays exactly one document.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar

import orjson

P = ParamSpec("P")
R = TypeVar("R")

ROOT = "catalog_ledger"
FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error", "critical")
FORMAT_ENV = "CATALOG_LEDGER_LOG_FORMAT"
LEVEL_ENV = "CATALOG_LEDGER_LOG_LEVEL"
#: Loggers of the ASGI server, routed through the same handler at the same level.
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")

#: Field names that must never carry their value into a log.
_SECRET_WORDS = ("token", "secret", "password", "passwd", "authorization", "private", "signer")
#: Attributes every ``LogRecord`` has; anything else on a record is a field of its own.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
#: uvicorn's coloured duplicate of the message.
_IGNORED = {"color_message"}

_context: ContextVar[Mapping[str, Any] | None] = ContextVar(
    "catalog_ledger_log_context", default=None
)


def get_logger(area: str) -> logging.Logger:
    """The product logger of ``area`` (``catalog_ledger.<area>``)."""
    return logging.getLogger(f"{ROOT}.{area}")


class CommandLog:
    """The phases of one command, each logged with its duration and the command id.

    A derived command id is only known once the preflight has read the log head,
    after the first phase (``resolve``) ended: records of phases that end
    before :meth:`bind` wait and are written with the id as soon as it is
    known (or without it, if the command fails first).
    """

    def __init__(self, log: logging.Logger, kind: str, command_id: str | None) -> None:
        self.log = log
        self.kind = kind
        self.fields: dict[str, Any] = {"command": kind}
        if command_id is not None:
            self.fields["command_id"] = command_id
        #: Fields of the command's final record (what it did), set by the command.
        self.summary: dict[str, Any] = {}
        self._pending: list[dict[str, Any]] = []

    @contextmanager
    def phase(self, name: str, **fields: Any) -> Iterator[dict[str, Any]]:
        """Time the block as phase ``name``; the block may add fields to the yielded dict."""
        extra: dict[str, Any] = dict(fields)
        start = time.perf_counter()
        try:
            yield extra
        except BaseException as exc:
            self._record({**extra, "phase": name, "duration_ms": _ms(start), **_failure(exc)})
            raise
        self._record({**extra, "phase": name, "duration_ms": _ms(start), "outcome": "ok"})

    def bind(self, **fields: Any) -> None:
        """Add ``fields`` (the command id) to this and every later record of the command."""
        self.fields.update(fields)
        _context.set({**(_context.get() or {}), **fields})
        self.flush()

    def flush(self) -> None:
        for extra in self._pending:
            self.log.info("phase", extra={**extra, **self.fields})
        self._pending.clear()

    def _record(self, extra: dict[str, Any]) -> None:
        self._pending.append(extra)
        if "command_id" in self.fields:
            self.flush()


_command: ContextVar[CommandLog | None] = ContextVar("catalog_ledger_command", default=None)


@contextmanager
def command_log(
    log: logging.Logger, kind: str, command_id: str | None = None
) -> Iterator[CommandLog]:
    """The phases of one ``kind`` command; the whole command is logged at the end with
    its total ``duration_ms``, outcome and summary. Fields bound meanwhile (the
    command id) are added to every record logged inside the block, by any layer."""
    phases = CommandLog(log, kind, command_id)
    token = _context.set({**(_context.get() or {}), **phases.fields})
    current = _command.set(phases)
    start = time.perf_counter()
    try:
        yield phases
    except BaseException as exc:
        phases.flush()
        log.info(kind, extra={**phases.fields, "duration_ms": _ms(start), **_failure(exc)})
        raise
    finally:
        _command.reset(current)
        _context.reset(token)
    phases.flush()
    done = {**phases.summary, **phases.fields, "duration_ms": _ms(start), "outcome": "ok"}
    log.info(kind, extra=done)


@contextmanager
def phase(name: str, **fields: Any) -> Iterator[dict[str, Any]]:
    """Phase ``name`` of the command in progress (not logged outside a command)."""
    current = _command.get()
    if current is None:
        yield dict(fields)
        return
    with current.phase(name, **fields) as extra:
        yield extra


def bind(**fields: Any) -> None:
    """Bind ``fields`` (the command id, once known) to the command in progress."""
    current = _command.get()
    if current is not None:
        current.bind(**fields)


def logged_command(
    log: logging.Logger, kind: str, summary: Callable[[Any], Mapping[str, Any]] | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run the decorated command method inside :func:`command_log` (its ``command_id``
    keyword, when given, is the id from the start); ``summary(result)`` gives the
    fields of the command's final record."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            given = kwargs.get("command_id")
            with command_log(log, kind, given if isinstance(given, str) else None) as command:
                result = func(*args, **kwargs)
                if summary is not None:
                    command.summary.update(summary(result))
                return result

        return run

    return decorate


def phased(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run the decorated function as phase ``name`` of the command in progress."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with phase(name):
                return func(*args, **kwargs)

        return run

    return decorate


def _failure(exc: BaseException) -> dict[str, Any]:
    code = getattr(exc, "code", None)
    return {"outcome": "error", "error": code if isinstance(code, str) else type(exc).__name__}


def _ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 3)


def _rfc3339(created: float) -> str:
    stamp = datetime.fromtimestamp(created, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _is_secret(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """Context fields, then the record's own extra fields (secret-named ones redacted)."""
    found: dict[str, Any] = dict(_context.get() or {})
    if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
        client, method, path, version, status = record.args
        found.update(client=client, method=method, path=path, http=version, status=status)
    for key, value in vars(record).items():
        if key not in _STANDARD and key not in _IGNORED and not key.startswith("_"):
            found[key] = value
    return {k: "[redacted]" if _is_secret(k) else v for k, v in found.items()}


def _error_text(record: logging.LogRecord, formatter: logging.Formatter) -> str | None:
    """The exception of a record: its type and message; the traceback only in debug mode
    (no traceback reaches a user unless ``CATALOG_LEDGER_DEBUG=1`` asks for it)."""
    if not record.exc_info or record.exc_info[1] is None:
        return None
    if os.environ.get("CATALOG_LEDGER_DEBUG"):
        return formatter.formatException(record.exc_info)
    exc = record.exc_info[1]
    return f"{type(exc).__name__}: {exc}"


def _default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, event, then the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": _rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in _fields(record).items():
            document.setdefault(key, value)
        error = _error_text(record, self)
        if error is not None:
            document["exc"] = error
        try:
            return orjson.dumps(document, default=_default, option=orjson.OPT_NON_STR_KEYS).decode()
        except (TypeError, orjson.JSONEncodeError):  # lone surrogates, huge integers
            return orjson.dumps({k: repr(v) for k, v in document.items()}).decode()


class TextFormatter(logging.Formatter):
    """``ts LEVEL logger: event key=value …`` for people."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            _rfc3339(record.created),
            record.levelname,
            f"{record.name}:",
            record.getMessage(),
        ]
        parts.extend(f"{k}={v}" for k, v in _fields(record).items())
        line = " ".join(parts)
        error = _error_text(record, self)
        return line if error is None else f"{line}\n{error}"


class StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (never stdout)."""

    def emit(self, record: logging.LogRecord) -> None:
        line = self.format(record) + "\n"
        # A closed or broken stderr loses the record, never the command.
        with suppress(OSError, ValueError):
            sys.stderr.write(line)
            sys.stderr.flush()


_INSTALLED: list[tuple[logging.Handler, dict[str, int]]] = []


def formatter(fmt: str) -> logging.Formatter:
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    return JsonFormatter() if fmt == "json" else TextFormatter()


def level_number(level: str) -> int:
    if level.lower() not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    return int(logging.getLevelName(level.upper()))


def configure(fmt: str = "text", level: str = "warning") -> None:
    """Install the one stderr handler (replacing an earlier one) at ``level``.

    Product and uvicorn loggers log at ``level``; everything else (libraries)
    only at warning or above, whatever the level: a debug run never dumps
    SQLAlchemy's statements and parameters. Called once per CLI invocation;
    :func:`reset` undoes it (the in-process CLI of the tests calls both).
    """
    reset()
    number = level_number(level)
    handler = StderrHandler()
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    names = ("", ROOT, *UVICORN_LOGGERS)
    saved = {name: logging.getLogger(name).level for name in names}
    root.addHandler(handler)
    root.setLevel(max(number, logging.WARNING))
    for name in (ROOT, *UVICORN_LOGGERS):
        logging.getLogger(name).setLevel(number)
    _INSTALLED.append((handler, saved))


def reset() -> None:
    """Remove the handler :func:`configure` installed and restore the levels it changed."""
    while _INSTALLED:
        handler, saved = _INSTALLED.pop()
        logging.getLogger().removeHandler(handler)
        for name, number in saved.items():
            logging.getLogger(name).setLevel(number)


def configure_from_environment() -> None:
    """``configure`` from ``CATALOG_LEDGER_LOG_FORMAT`` / ``CATALOG_LEDGER_LOG_LEVEL``
    (server worker processes inherit the parent's choice this way)."""
    configure(
        os.environ.get(FORMAT_ENV, "text").lower() or "text",
        os.environ.get(LEVEL_ENV, "warning").lower() or "warning",
    )
