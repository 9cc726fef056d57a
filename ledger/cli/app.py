"""The ``catalog-ledger`` command line.

Conventions (DESIGN "CLI conventions"): ``--db``, ``--log-format`` and
``--log-level`` are global and come before the command (logs go to stderr
only, see ``ledger.observability``); every command takes ``--json`` after
its name and then prints exactly one JSON document on stdout, result or
error. Exit codes: 0 ok, 1 store unavailable or internal error, 2 usage,
3 invalid input, 4 conflict, 5 fail-closed authority, 6 integrity. ``main``
is the only entry point and it turns every failure into one of those codes;
no traceback reaches a user unless ``CATALOG_LEDGER_DEBUG=1`` asks for it.

Start-up stays cheap (issue 25.7): this module and the command modules declare the
command tree with click alone; a command imports what it uses (``ledger.api``, the
database drivers, the HTTP server) inside its body, and the store is opened on
first use. ``tests/e2e/test_cli_basics.py`` checks which modules stay out.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import click
import orjson

from domain.errors import LedgerError, UsageError
from ledger.log.url import resolve_url
from ledger.observability import FORMAT_ENV, FORMATS, LEVEL_ENV, LEVELS, configure, reset

if TYPE_CHECKING:
    from ledger.api import Store

F = TypeVar("F", bound=Callable[..., Any])


def json_option(func: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print exactly one JSON document on stdout."
    )(func)


def lease_options(func: F) -> F:
    """``--wait`` and ``--lease-ttl``: how a writer waits for, and holds, the lease."""
    func = click.option(
        "--lease-ttl",
        type=click.FloatRange(min=0.1),
        default=30.0,
        show_default=True,
        help="Seconds the writer lease lasts unless renewed (it is renewed every third of it "
        "while the release runs): if this process dies holding it, the next writer waits "
        "at most this long (or `lease break` frees it at once) (R12).",
    )(func)
    return click.option(
        "--wait",
        type=click.FloatRange(min=0),
        default=30.0,
        show_default=True,
        help="Seconds to wait for the writer lease held by another process.",
    )(func)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "hex:" + raw.hex()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def _scrub(value: Any) -> Any:
    """``value`` with lone surrogates in strings written as ``\\udcff`` text and
    integers beyond 64 bits as decimal strings (orjson encodes neither)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, int) and not -(2**63) <= value < 2**64:
        return str(value)
    if isinstance(value, dict):
        return {_scrub(k): _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


def dump_json(document: Any) -> str:
    """One JSON document; never fails on bytes, sets, non-string keys or lone surrogates."""
    options = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
    try:
        return orjson.dumps(document, option=options, default=_json_default).decode() + "\n"
    except orjson.JSONEncodeError:
        # Undecodable bytes of an argument or a file name arrive as lone surrogates
        # (surrogateescape), which are not UTF-8, and an input may carry a huge
        # integer: show both as text instead of failing.
        scrubbed = orjson.dumps(
            _scrub(document), option=options, default=lambda v: _scrub(_json_default(v))
        )
        return scrubbed.decode() + "\n"


def emit(as_json: bool, document: Any, human: Callable[[], None]) -> None:
    """Print a result as JSON or through the human renderer."""
    if as_json:
        sys.stdout.write(dump_json(document))
    else:
        human()


#: ``ctx.meta`` key of this invocation's ``(log format, log level)``.
LOG_SETTINGS = "catalog_ledger.log"


def log_settings() -> tuple[str, str]:
    """The ``--log-format`` and ``--log-level`` of this invocation."""
    found: tuple[str, str] = click.get_current_context().meta[LOG_SETTINGS]
    return found


class StoreHandle:
    """The ``--db`` of this invocation; the ``Store`` (and with it ``ledger.api`` and the
    database layer) is created on first use, so commands that need no store never
    import it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._store: Store | None = None

    def open(self) -> Store:
        if self._store is None:
            with imports_without_gc():
                from ledger.api import Store

            self._store = Store(self.url)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


class _Process:
    #: Set by the console-script ``main``: one short-lived process, whose imports may
    #: run without the cyclic garbage collector (``imports_without_gc``).
    console = False


@contextmanager
def imports_without_gc() -> Iterator[None]:
    """In the console script, import the store's modules with the cyclic garbage
    collector off, then freeze what they built: an import builds many long-lived objects
    (classes, tables, compiled statements) and collections in the middle of it find no
    garbage, they only cost time (about a tenth of the store's import time). Frozen
    objects are never scanned again. In-process callers (tests, ``run``) keep their
    collector as it is."""
    if not (_Process.console and gc.isenabled()):
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def store() -> Store:
    """The store of this invocation (``--db``), opened on first use."""
    handle = click.get_current_context().find_object(StoreHandle)
    assert handle is not None
    return handle.open()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    "db_url",
    metavar="URL",
    default=None,
    help="Store URL (default: $CATALOG_LEDGER_DB or sqlite:///catalog.db). "
    "Examples: sqlite:///catalog.db, mysql+pymysql://root@127.0.0.1:3306/test",
)
@click.option(
    "--log-format",
    type=click.Choice(FORMATS, case_sensitive=False),
    default="text",
    show_default=True,
    envvar=FORMAT_ENV,
    show_envvar=True,
    help="Structured logs on stderr: one JSON object per line, or text.",
)
@click.option(
    "--log-level",
    type=click.Choice(LEVELS, case_sensitive=False),
    default="warning",
    show_default=True,
    envvar=LEVEL_ENV,
    show_envvar=True,
    help="Least severe log record written (info: every apply phase with its duration).",
)
@click.version_option(package_name="catalog-ledger")
@click.pass_context
def cli(ctx: click.Context, db_url: str | None, log_format: str, log_level: str) -> None:
    """Catalog Ledger: an event-sourced catalog publication store."""
    configure(log_format.lower(), log_level.lower())
    ctx.meta[LOG_SETTINGS] = (log_format.lower(), log_level.lower())
    handle = StoreHandle(resolve_url(db_url))  # an empty --db is INVALID now, as before
    ctx.obj = handle
    ctx.call_on_close(handle.close)


@contextmanager
def progress_bar(enabled: bool, label: str, unit: str) -> Iterator[Callable[[int, int], None]]:
    """A tqdm bar (rate and ETA) when stdout is a terminal; silent otherwise."""
    if not (enabled and sys.stdout.isatty()):
        yield lambda done, total: None
        return
    from tqdm import tqdm

    bar = tqdm(desc=label, unit=unit, unit_scale=True, dynamic_ncols=True)
    try:

        def update(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        yield update
    finally:
        bar.close()


def _report(error: LedgerError, as_json: bool) -> int:
    if as_json:
        sys.stdout.write(dump_json(error.to_json()))
    else:
        click.echo(f"error [{error.code}]: {error.message}", err=True)
        for key, value in error.details.items():
            click.echo(f"  {key}: {value}", err=True)
    return error.exit_code


def _reader_went_away() -> int:
    """``log | head``: the reader closed the pipe. Stop quietly, as Unix tools do, and
    keep Python from reporting the failed flush of stdout at exit."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0


def run(argv: Sequence[str]) -> int:
    """Run the CLI with ``argv`` and return the exit code (never raises)."""
    try:
        return _run(list(argv))
    finally:
        reset()  # in-process callers (tests) never accumulate handlers


def _run(args: list[str]) -> int:
    as_json = "--json" in args
    try:
        result = cli.main(args=args, prog_name="catalog-ledger", standalone_mode=False)
    except click.UsageError as exc:
        message = exc.format_message()
        if as_json:
            return _report(UsageError(message), True)
        if exc.ctx is not None:
            click.echo(exc.ctx.get_usage(), err=True)
        click.echo(f"error [USAGE]: {message}", err=True)
        return 2
    except click.ClickException as exc:
        return _report(UsageError(exc.format_message()), as_json)
    except click.Abort:
        click.echo("aborted", err=True)
        return 130
    except LedgerError as exc:
        return _report(exc, as_json)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except BrokenPipeError:
        return _reader_went_away()
    except SystemExit as exc:
        if type(sys.stdout).__name__ == "_PacifyFlushWrapper":  # click met EPIPE on stdout
            return _reader_went_away()
        return exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:  # the last line of defense: never show a traceback
        if os.environ.get("CATALOG_LEDGER_DEBUG"):
            traceback.print_exc()
        internal = LedgerError(
            f"internal error: {type(exc).__name__}: {exc}",
            hint="set CATALOG_LEDGER_DEBUG=1 for a traceback and report it",
        )
        internal_code = _report(internal, as_json)
        return internal_code
    return result if isinstance(result, int) else 0


def main() -> None:
    """Console-script entry point."""
    _Process.console = True
    sys.exit(run(sys.argv[1:]))
