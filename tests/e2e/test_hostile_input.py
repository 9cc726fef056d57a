"""Hostile input (issue 8, item 4): whatever a careless operator or an attacker hands the
ledger ends in success or in a typed error that names the field. Never a Python
traceback, never a hang, never a partial append, never an HTTP 5xx other than a 500
INTEGRITY.

The inputs attacked are the ones DESIGN.md names: identities (R1), release manifests
and ``pack.json`` content (R4, read from a directory and from a git commit), legacy
records (R7), whole CLI argument vectors, proof documents (R22) and HTTP requests to
the read service (R19, through schemathesis from ``schema/openapi.json`` and through
hand-made raw requests). Hostile strings cover case variants, NFC/NFD/NFKC pairs,
leading/trailing/internal and Unicode whitespace, control characters, 254-257 byte
boundaries with 1- to 4-byte characters, lone surrogates (``\\ud800`` escapes in files,
CESU bytes, ``surrogateescape`` argv), huge payloads (MBs), nesting thousands deep,
duplicate keys, floats/NaN/huge integers, wrong types, missing and extra fields,
invalid UTF-8, non-JSON, empty files, and directories where files are expected.

How every outcome is judged:

* the CLI runs in-process through ``ledger.cli.run`` (it must return an exit code and
  never raise) with stdout a strict UTF-8 stream, as a terminal under a UTF-8 locale
  is; an internal error (``"error": "ERROR"``, "internal error: ...") is a failure;
* with ``--json`` stdout is exactly one JSON document; errors have the DESIGN shape
  ``{"error", "message", "details"}``, the exit code that goes with their code, and
  ``INVALID`` carries a non-empty ``details.field`` (the exact spot, where the test
  knows which spot it spoiled);
* a rejected command leaves the log head where it was (no partial append);
* a watchdog (SIGALRM) turns any input that keeps the ledger busy into a failure.

The properties are plain ``check_*`` functions so that
``tests/campaigns/test_hostile_full.py`` runs the same ones with many more examples.
Set ``CATALOG_LEDGER_HOSTILE_TOTALS=1`` to print how many inputs of each kind ran.
"""

from __future__ import annotations

import base64
import copy
import io
import json
import os
import re
import signal
import sys
import textwrap
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Any, Generic, TypeVar
from urllib.parse import quote, unquote

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from domain.errors import InvalidInput
from domain.identity import (
    AppId,
    Audience,
    BusinessKey,
    Category,
    CommandId,
    ComponentKind,
    CredentialSet,
    Identity,
    InstallId,
    PackName,
    SourceRevision,
    WorkloadId,
)
from domain.notes import Checkpoint, SignerKey, VerifierKey
from ledger.cli.app import run as cli_run
from projections.reader import parse_revision
from tests.support.cli_support import ServedStore
from tests.support.gitrepo import local, official, pack_json, sales_closure, sales_doc
from tests.support.lifecycle_support import World

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("catalog-ledger"))
T = TypeVar("T")

#: Seconds one input may keep the ledger busy before it counts as a hang.
HANG_LIMIT = float(os.environ.get("CATALOG_LEDGER_HOSTILE_HANG_SECONDS", "90"))

#: The CLI's exit code for each typed error code (DESIGN "Errors and exit codes").
EXIT_CODES = {
    "USAGE": 2,
    "INVALID": 3,
    "CONFLICT": 4,
    "FAIL_CLOSED": 5,
    "MISSING": 5,
    "STALE": 5,
    "LIFECYCLE": 5,
    "INTEGRITY": 6,
    "UNAVAILABLE": 1,
    "PERMISSION": 7,
}


def hostile_settings(examples: int) -> settings:
    """Hypothesis settings for hostile-input properties: no deadline, one store per test."""
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )


# == tallies: how many inputs of each kind each test tried ==================================

TOTALS: dict[str, Counter[str]] = {}


@pytest.fixture
def tally(request: pytest.FixtureRequest) -> Iterator[Counter[str]]:
    """Counts the kinds of input one test tried; reported per module (see totals_reporter)."""
    counts: Counter[str] = Counter()
    yield counts
    TOTALS[request.node.nodeid] = counts


def totals_reporter(*, always: bool) -> Any:
    """A module fixture printing the tallies of that module's tests when it finishes."""

    @pytest.fixture(scope="module", autouse=True, name="hostile_totals")
    def fixture(request: pytest.FixtureRequest) -> Iterator[None]:
        yield
        if not (always or os.environ.get("CATALOG_LEDGER_HOSTILE_TOTALS")):
            return
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        module = request.node.nodeid
        lines = ["", f"hostile inputs tried in {module}:"]
        grand = 0
        for nodeid, counts in TOTALS.items():
            if not nodeid.startswith(module):
                continue
            total = sum(counts.values())
            grand += total
            kinds: Counter[str] = Counter()
            outcomes: Counter[str] = Counter()
            for key, n in counts.items():
                kind, _, outcome = key.partition(" -> ")
                kinds[re.sub(r" \([^)]*\)", "", kind)] += n
                outcomes[outcome or "?"] += n
            lines.append(f"  {nodeid.split('::', 1)[-1]}: {total} inputs")
            for title, part in (("kinds", kinds), ("outcomes", outcomes)):
                text = " | ".join(f"{k} {n}" for k, n in sorted(part.items()))
                lines.extend(
                    textwrap.wrap(
                        f"{title}: {text}",
                        width=110,
                        initial_indent="      ",
                        subsequent_indent="          ",
                    )
                )
        lines.append(f"  all tests: {grand}")
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else nullcontext():
            for line in lines:
                if reporter is not None:
                    reporter.write_line(line)
                else:  # pragma: no cover - terminal reporter disabled
                    print(line)

    return fixture


hostile_totals = totals_reporter(always=False)


# == tagged inputs ==========================================================================


@dataclass(frozen=True)
class Tagged(Generic[T]):
    """A hostile input and the kind it belongs to (the kind is what the tallies count)."""

    kind: str
    value: T
    #: The outcome this input must have when it is known without running it
    #: ("INVALID"), and the field the error must name (its JSON path), if known.
    expect: str | None = None
    field: str | None = None

    def __repr__(self) -> str:
        text = repr(self.value)
        if len(text) > 300:
            text = f"{text[:240]}...<{len(text)} chars>...{text[-40:]}"
        return f"Tagged({self.kind!r}, {text})"


@dataclass(frozen=True)
class Raw:
    """JSON text emitted verbatim: NaN, 1e999, -0, 5000-digit integers, deep nesting."""

    text: str

    def __repr__(self) -> str:
        return f"Raw({self.text[:60]!r}{'...' if len(self.text) > 60 else ''})"


@dataclass(frozen=True)
class Dup:
    """A JSON object written with repeated keys."""

    pairs: tuple[tuple[str, Any], ...]


def emit(value: Any, *, ascii_only: bool = True) -> str:
    """JSON text that may hold what a strict reader rejects (NaN, duplicates, ...).

    With ``ascii_only`` lone surrogates become ``\\ud800`` escapes; without it they stay
    raw and ``encode`` turns them into CESU bytes (invalid UTF-8).
    """
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Dup | dict):
        pairs = value.pairs if isinstance(value, Dup) else tuple(value.items())
        body = ",".join(
            f"{json.dumps(k, ensure_ascii=ascii_only)}:{emit(v, ascii_only=ascii_only)}"
            for k, v in pairs
        )
        return "{" + body + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(emit(v, ascii_only=ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


def encode(value: Any, *, ascii_only: bool = True) -> bytes:
    return emit(value, ascii_only=ascii_only).encode("utf-8", "surrogatepass")


class Shape(StrEnum):
    """A file system object where a readable JSON file is expected."""

    DIRECTORY = "directory"
    MISSING = "missing"
    SYMLINK_LOOP = "symlink-loop"
    DEV_ZERO = "dev-zero (endless file)"
    DANGLING_SYMLINK = "dangling-symlink"


def place(path: Path, content: bytes | Shape) -> Path:
    """Put ``content`` at ``path``: bytes as a file, or the file system shape named."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is Shape.DIRECTORY:
        path.mkdir()
        (path / "pack.json").write_text("{}", encoding="utf-8")
    elif content is Shape.SYMLINK_LOOP:
        path.symlink_to(path.name)
    elif content is Shape.DEV_ZERO:
        path.symlink_to("/dev/zero")
    elif content is Shape.DANGLING_SYMLINK:
        path.symlink_to(path.parent / "nowhere" / "pack.json")
    return path


# == hostile strings ========================================================================

WHITESPACE = (
    " ",
    "\t",
    "\n",
    "\r",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x85",
    "\xa0",
    "\u1680",
    "\u2000",
    "\u2007",
    "\u2028",
    "\u2029",
    "\u202f",
    "\u3000",
)
#: Format characters: invisible, but neither whitespace nor control characters (valid).
INVISIBLE = ("\u200b", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u202e")
CONTROLS = tuple(chr(c) for c in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)))
SURROGATES = ("\ud800", "\udbff", "\udc00", "\udfff", "\udc80", "\udcff")
SEEDS = (
    "sales",
    "Sales",
    "SALES",
    "café",
    "cafe\u0301",
    "Å",
    "A\u030a",
    "\u212b",
    "straße",
    "STRASSE",
    "ﬁle",
    "İstanbul",
    "ıi",
    "ΣΑΣ",
    "ς",
    "ǅemo",
    "😀",
    "日本語",
    "erp-prod",
    "erp-sync",
    "Order.push",
    "push_contract",
    "callout_profile",
    "app:crm",
    "integration:erp-sync",
    "a:b",
    "a/b",
    "../x",
    ".",
    "..",
    "~",
    "~nosuchuser-hostile/x",
    "file://[bad/x",
    "file:///tmp/x",
    "http://127.0.0.1/x",
    "%2F",
    "null",
    "0",
    "-1",
    "'; DROP TABLE events; --",
    "\\",
    '"',
    "a b",
    "\uffff",
    "\U0010ffff",
    "\ufffd",
    "a" * 40,
    "0123456789abcdef0123456789abcdef01234567",
    "0123456789ABCDEF0123456789ABCDEF01234567",
    "x" * 5000,
)
#: 1- to 4-byte units (``e\u0301`` is an NFD pair, 3 bytes) for byte-length boundaries.
UNITS = ("a", "é", "€", "😀", "e\u0301", "\u212b")


def canonical(value: object) -> bool:
    """R1 written out independently: 1-255 bytes of UTF-8, no edge spaces, no Cc."""
    if not isinstance(value, str):
        return False
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    if not 1 <= len(raw) <= 255:
        return False
    if value[0].isspace() or value[-1].isspace():
        return False
    return not any(unicodedata.category(c) == "Cc" for c in value)


@st.composite
def _inserted(draw: st.DrawFn, pieces: Sequence[str], kind: str) -> Tagged[str]:
    base = draw(st.sampled_from(SEEDS[:30]))
    piece = draw(st.sampled_from(pieces))
    where = draw(st.sampled_from(["leading", "trailing", "internal", "alone", "both"]))
    if where == "leading":
        text = piece + base
    elif where == "trailing":
        text = base + piece
    elif where == "alone":
        text = piece * draw(st.integers(1, 3))
    elif where == "both":
        text = piece + base + piece
    else:
        at = draw(st.integers(0, len(base)))
        text = base[:at] + piece + base[at:]
    return Tagged(f"{kind} ({where})", text)


@st.composite
def boundary_texts(draw: st.DrawFn) -> Tagged[str]:
    """Exactly 254-257 UTF-8 bytes (or 0, 1, 1000), built from multi-byte units."""
    unit = draw(st.sampled_from(UNITS))
    target = draw(st.sampled_from([254, 255, 255, 256, 256, 257, 0, 1, 1000]))
    count, rest = divmod(target, len(unit.encode()))
    text = unit * count + "x" * rest
    return Tagged(f"byte boundary {len(text.encode())}", text)


CASE_OPS: dict[str, Callable[[str], str]] = {
    "upper": str.upper,
    "lower": str.lower,
    "swapcase": str.swapcase,
    "casefold": str.casefold,
    "title": str.title,
}
NORMS = ("NFC", "NFD", "NFKC", "NFKD")


def hostile_texts() -> st.SearchStrategy[Tagged[str]]:
    """Strings aimed at R1: every kind the issue lists, plus random Unicode."""
    seed = st.sampled_from(SEEDS)
    return st.one_of(
        seed.map(lambda s: Tagged("seed", s)),
        st.tuples(seed, st.sampled_from(sorted(CASE_OPS))).map(
            lambda p: Tagged("case variant", CASE_OPS[p[1]](p[0]))
        ),
        st.tuples(seed, st.sampled_from(NORMS)).map(
            lambda p: Tagged("NFC/NFD variant", unicodedata.normalize(p[1], p[0]))  # type: ignore[arg-type]
        ),
        _inserted(WHITESPACE, "whitespace"),
        _inserted(INVISIBLE, "invisible format char"),
        _inserted(CONTROLS, "control char"),
        _inserted(SURROGATES, "lone surrogate"),
        boundary_texts(),
        st.text(max_size=24).map(lambda s: Tagged("random unicode", s)),
        st.text(st.characters(codec="ascii"), max_size=12).map(lambda s: Tagged("random ascii", s)),
    )


def argv_safe(text: str) -> bool:
    """Can an operating system hand this string to a process as an argument?

    argv cannot carry NUL, and Python decodes undecodable argv bytes with
    ``surrogateescape``: only U+DC80..U+DCFF ever arrive as lone surrogates.
    """
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


# == hostile JSON documents =================================================================

NUMBERS = (
    Raw("NaN"),
    Raw("Infinity"),
    Raw("-Infinity"),
    Raw("1e999"),
    Raw("-0"),
    Raw("1.0"),
    Raw("0.1"),
    Raw("1E2"),
    Raw("9" * 5000),
    Raw("-" + "9" * 30),
    2**63,
    2**63 - 1,
    -(2**63),
    -(2**63) - 1,
    10**30,
    float("nan"),
    1.5,
)


#: Command-line and query spellings of numbers, including Unicode digits.
NUMERIC = (
    "0",
    "1",
    "2",
    "-1",
    "99999999999999999999999",
    "1" * 5000,
    "²",
    "١",
    "1e3",
    "0x10",
    " 1",
    "1.5",
    "nan",
    "inf",
    "",
)


def junk_values() -> st.SearchStrategy[Any]:
    """A JSON value of any type, often of a type the field does not take."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.sampled_from(NUMBERS),
        st.floats(allow_nan=True, allow_infinity=True),
        hostile_texts().map(lambda t: t.value),
        st.just([]),
        st.just({}),
        st.lists(st.integers(-5, 5), max_size=3),
        st.dictionaries(st.text(max_size=5), st.integers(-5, 5), max_size=3),
    )


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out.extend(_paths(value, (*prefix, key)))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            out.extend(_paths(value, (*prefix, index)))
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


#: The members of NUMBERS that are valid integers (within the signed 64-bit range).
VALID_INTEGERS: tuple[Any, ...] = (Raw("-0"), 2**63 - 1, -(2**63))


def json_path(path: tuple[Any, ...]) -> str:
    """A node's JSON path as errors name it: ``packs[0].source.path`` (``$``: the root)."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "$"


def deep(levels: int, *, objects: bool = False) -> Raw:
    if objects:
        return Raw('{"a":' * levels + "1" + "}" * levels)
    return Raw("[" * levels + "]" * levels)


DEPTHS = (65, 900, 1001, 5000, 100_000)
HUGE_BYTES = 3 * 1024 * 1024


@st.composite
def mutated_docs(draw: st.DrawFn, base: Any) -> Tagged[Any]:
    """``base`` with one node spoiled: wrong type, missing/extra/duplicate field, number,
    hostile string, deep nesting or a huge value."""
    doc = copy.deepcopy(base)
    path = draw(st.sampled_from(_paths(doc)))
    node = _get(doc, path)
    ops = ["wrong type", "hostile string", "number", "deep nesting", "huge value"]
    if path and isinstance(_get(doc, path[:-1]), dict):
        ops.append("missing field")
    if isinstance(node, dict):
        ops += ["extra field", "duplicate key"]
    if isinstance(node, list):
        ops += ["duplicated element", "empty list"]
    op = draw(st.sampled_from(ops))
    if op == "wrong type":
        doc = _set(doc, path, draw(junk_values()))
    elif op == "hostile string":
        text = draw(hostile_texts())
        op = f"hostile string: {text.kind}"
        doc = _set(doc, path, text.value)
    elif op == "number":
        number = draw(st.sampled_from(NUMBERS))
        doc = _set(doc, path, number)
        if number not in VALID_INTEGERS:  # a float or out of range: refused where it stands
            return Tagged(op, doc, "INVALID", json_path(path))
    elif op == "deep nesting":
        doc = _set(doc, path, deep(draw(st.sampled_from(DEPTHS)), objects=draw(st.booleans())))
    elif op == "huge value":
        huge = draw(st.sampled_from(["string", "list", "key"]))
        op = f"huge value ({huge}, {HUGE_BYTES // 1024 // 1024} MB)"
        if huge == "string":
            doc = _set(doc, path, "x" * HUGE_BYTES)
        elif huge == "list":
            doc = _set(doc, path, Raw("[" + "0," * (HUGE_BYTES // 2) + "0]"))
        else:
            doc = _set(doc, path, {"k" * HUGE_BYTES: 1})
    elif op == "missing field":
        del _get(doc, path[:-1])[path[-1]]
    elif op == "extra field":
        name = draw(st.sampled_from(["extra", "", "name", "\ud800", "Name", " kind"]))
        node[name + ("" if name not in node else "_")] = draw(junk_values())
        # Documents are strict (no unknown fields) except inside a component's free-form
        # payload, where any JSON object is content.
        return Tagged(op, doc, None if "payload" in path else "INVALID")
    elif op == "duplicate key":
        key = draw(st.sampled_from(sorted(node))) if node else "k"
        other = draw(st.one_of(st.just(node.get(key)), junk_values()))
        doc = _set(doc, path, Dup((*node.items(), (key, other))))
        return Tagged(op, doc, "INVALID")  # a repeated key is never read silently
    elif op == "duplicated element":
        if node:
            node.append(copy.deepcopy(node[0]))
    elif op == "empty list":
        node.clear()
    return Tagged(op, doc)


NOT_JSON = (
    b"packs: []\n",
    b"{'packs': []}",
    b"{packs: []}",
    b'{"packs": [],}',
    b"[1, 2,]",
    b"undefined",
    b"<packs/>",
    b"\x00",
    b"[",
    b"]",
    b'"',
    b'{"a"',
    b'{"packs": []} {"packs": []}',
    b"// comment\n{}",
    b"/* c */ []",
    b"\\u0000",
    b"\x1b[31m{}",
)
BAD_UTF8 = (
    b"\xff",
    b"\xc0\xaf",
    b"\xed\xa0\x80",
    b"\xe2\x82",
    b"\x80",
    b"\xf5\x80\x80\x80",
    b"\xfe",
)


@st.composite
def raw_files(draw: st.DrawFn, valid: bytes) -> Tagged[bytes | Shape]:
    """Whole-file hostility: empty, not JSON, invalid UTF-8, BOM, UTF-16, truncated,
    nesting thousands deep, several MB, or a directory/loop/endless file instead."""
    kind = draw(
        st.sampled_from(
            [
                "empty file",
                "whitespace only",
                "not JSON",
                "random bytes",
                "invalid UTF-8",
                "UTF-8 BOM",
                "UTF-16",
                "truncated",
                "deep nesting",
                "huge file",
                "file system shape",
            ]
        )
    )
    data: bytes | Shape
    if kind == "empty file":
        data = b""
    elif kind == "whitespace only":
        data = draw(st.sampled_from([b" ", b"\n\n", b"\t \r\n", "\u3000".encode()]))
    elif kind == "not JSON":
        data = draw(st.sampled_from(NOT_JSON))
    elif kind == "random bytes":
        data = draw(st.binary(max_size=64))
    elif kind == "invalid UTF-8":
        at = draw(st.integers(0, len(valid)))
        data = valid[:at] + draw(st.sampled_from(BAD_UTF8)) + valid[at:]
    elif kind == "UTF-8 BOM":
        data = b"\xef\xbb\xbf" + valid
    elif kind == "UTF-16":
        data = valid.decode("utf-8").encode(draw(st.sampled_from(["utf-16", "utf-16-le"])))
    elif kind == "truncated":
        data = valid[: draw(st.integers(0, max(len(valid) - 1, 0)))]
    elif kind == "deep nesting":
        levels = draw(st.sampled_from(DEPTHS))
        kind = f"deep nesting ({levels} levels)"
        data = deep(levels, objects=draw(st.booleans())).text.encode()
    elif kind == "huge file":
        style = draw(st.sampled_from(["padded valid", "list of zeros", "long string"]))
        kind = f"huge file ({style})"
        if style == "padded valid":
            data = b" " * HUGE_BYTES + valid + b"\n" * 1024
        elif style == "list of zeros":
            data = b"[" + b"0," * (HUGE_BYTES // 2) + b"0]"
        else:
            data = b'"' + b"x" * HUGE_BYTES + b'"'
    else:
        data = draw(st.sampled_from(list(Shape)))
        kind = f"{data.value} instead of a file"
    # These are never a readable JSON document; a huge file may be a padded valid one,
    # and BOMs and file-system shapes are judged by running them.
    unreadable = not kind.startswith(("huge file", "UTF-8 BOM")) and "instead of" not in kind
    return Tagged(kind, data, "INVALID" if unreadable else None)


def hostile_files(base: Any) -> st.SearchStrategy[Tagged[bytes | Shape]]:
    """File contents derived from the valid document ``base``: raw or structurally spoiled."""
    valid = encode(base)

    def as_bytes(pair: tuple[Tagged[Any], bool]) -> Tagged[bytes | Shape]:
        spoiled, ascii_only = pair
        data = encode(spoiled.value, ascii_only=ascii_only)
        kind = spoiled.kind + ("" if ascii_only else " (raw UTF-8)")
        return Tagged(kind, data, spoiled.expect, spoiled.field)

    return st.one_of(
        raw_files(valid),
        st.tuples(mutated_docs(base), st.booleans()).map(as_bytes),
        st.tuples(mutated_docs(base), st.booleans()).map(as_bytes),
    )


# == running the CLI in-process =============================================================


class Hang(BaseException):
    """Raised by the watchdog; a BaseException, so no ``except Exception`` swallows it."""


@contextmanager
def watchdog(seconds: float = HANG_LIMIT) -> Iterator[None]:
    """Fail the input (raise ``Hang``) if the block is still running after ``seconds``."""

    def fire(signum: int, frame: FrameType | None) -> None:
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class Outcome:
    """One CLI run: exit code, both streams, and the JSON document under ``--json``."""

    argv: tuple[str, ...]
    code: int
    stdout: str
    stderr: str
    document: Any

    def __repr__(self) -> str:
        argv = [a if len(a) < 80 else a[:60] + f"...<{len(a)}>" for a in self.argv]
        return (
            f"Outcome(argv={argv!r}, code={self.code}, stdout={self.stdout[:1500]!r}, "
            f"stderr={self.stderr[:1500]!r})"
        )

    @property
    def field(self) -> str:
        details = self.document.get("details", {}) if isinstance(self.document, dict) else {}
        return str(details.get("field", ""))


def run_cli(argv: Sequence[str]) -> Outcome:
    """``ledger.cli.run(argv)`` with stdout/stderr captured as a UTF-8 terminal would be."""
    out_raw, err_raw = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(out_raw, encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(err_raw, encoding="utf-8", errors="backslashreplace", write_through=True)
    with watchdog(), redirect_stdout(out), redirect_stderr(err):
        code = cli_run(list(argv))
    stdout = out_raw.getvalue().decode("utf-8")
    stderr = err_raw.getvalue().decode("utf-8")
    out.detach()
    err.detach()
    assert isinstance(code, int), f"run() returned {code!r}"
    assert "Traceback" not in stdout and "Traceback" not in stderr, (argv, stdout, stderr)
    document = None
    eager = {"--help", "-h", "--version"} & set(argv)
    if "--json" in argv and not (eager and code == 0 and not stdout.startswith("{")):
        # (--help and --version answer in text before any command, --json or not)
        try:
            document = json.loads(stdout)
        except ValueError:
            raise AssertionError(
                f"--json did not print exactly one JSON document: {stdout!r}"
            ) from None
    return Outcome(tuple(argv), code, stdout, stderr, document)


_HUMAN_ERROR = re.compile(r"^error \[([A-Z_]+)\]: ", re.MULTILINE)


def check_typed(outcome: Outcome) -> str:
    """``"OK"`` or the typed error code of ``outcome``; fails on anything untyped."""
    if outcome.code == 0:
        return "OK"
    if outcome.document is not None:
        doc = outcome.document
        assert isinstance(doc, dict), outcome
        assert set(doc) == {"error", "message", "details"}, f"not the error shape: {outcome}"
        code = doc["error"]
        assert code != "ERROR", f"internal error: {outcome}"
        assert not str(doc["message"]).startswith("internal error"), outcome
        assert EXIT_CODES.get(code) == outcome.code, f"exit code does not match: {outcome}"
        assert isinstance(doc["details"], dict), outcome
        if code == "INVALID":
            assert outcome.field, f"INVALID without a field: {outcome}"
        return str(code)
    assert "internal error" not in outcome.stderr, f"internal error: {outcome}"
    found = _HUMAN_ERROR.search(outcome.stderr)
    assert found is not None, f"no typed error line: {outcome}"
    code = found.group(1)
    assert code != "ERROR", f"internal error: {outcome}"
    assert EXIT_CODES.get(code) == outcome.code, f"exit code does not match: {outcome}"
    if code == "INVALID":
        assert "\n  field: " in outcome.stderr, f"INVALID without a field: {outcome}"
    return code


# == a store with a published release to attack =============================================


def sales_content(version: int = 1, name: str = "sales") -> bytes:
    return pack_json(**sales_doc(version, name))


#: The valid pack document hostile ``pack.json`` files are derived from.
PACK_DOC: dict[str, Any] = sales_doc(7, name="hostile")

LEGACY_DOC: list[dict[str, Any]] = [
    {
        "pack": "legacy-a",
        "install_id": "L-1",
        "status": "active",
        "category": "app",
        "source": {
            "kind": "official_repo",
            "repo": "repos/a",
            "revision": "a" * 40,
            "path": "pack.json",
        },
        "applied_payload_hash": "v1:" + "0" * 64,
    },
    {
        "pack": "legacy-b",
        "install_id": "L-2",
        "status": "active",
        "category": "app",
        "source": {"kind": "local_path", "path": "packs/b"},
        "applied_payload_hash": None,
    },
]


@dataclass
class Stage:
    """One store on a real engine with release 1 published: sales (official_repo, bound
    to integration:erp-sync) and devsample (local_path)."""

    world: World
    commit: str
    devsample: Path
    cases: int = 0
    files: Files | None = None

    @property
    def url(self) -> str:
        return self.world.url

    def folder(self) -> Path:
        """A fresh folder for one example's files."""
        self.cases += 1
        path = self.world.tmp / "hostile" / f"case-{self.cases}"
        path.mkdir(parents=True)
        return path

    def base_manifest(self) -> dict[str, Any]:
        return {
            "packs": [
                official("sales", self.world.repo.path, self.commit, "sales/pack.json"),
                local("devsample", self.devsample),
            ],
            "bindings": sales_closure("integration:erp-sync"),
        }

    def attempt(self, *args: str, as_json: bool = True) -> tuple[str, Outcome]:
        """Run ``catalog-ledger --db URL ARGS [--json]``: typed, and nothing written at all
        (no table changed: the log, the views, the head) unless it succeeded."""
        before = self.world.tables()
        outcome = run_cli(["--db", self.url, *args, *(["--json"] if as_json else [])])
        code = check_typed(outcome)
        if code != "OK":
            assert self.world.tables() == before, f"a rejected command wrote: {outcome}"
        if code == "INVALID" and as_json:
            assert outcome.field, f"INVALID names no field: {outcome}"
        return code, outcome


def make_stage(tmp_path: Path, url: str) -> Stage:
    world = World(tmp_path, url)
    commit = world.release({"sales/pack.json": sales_content()})
    stage = Stage(world, commit, world.local_dir("devsample", 1))
    path = stage.folder() / "release.json"
    path.write_text(json.dumps(stage.base_manifest()), encoding="utf-8")
    code, outcome = stage.attempt("apply", str(path))
    assert code == "OK", outcome
    return stage


@pytest.fixture
def stage(engine_url: str, tmp_path: Path) -> Iterator[Stage]:
    s = make_stage(tmp_path, engine_url)
    yield s
    s.world.close()


# == R1: identities =========================================================================

IDENTITY_CLASSES: tuple[type[Identity], ...] = (
    PackName,
    InstallId,
    ComponentKind,
    BusinessKey,
    CredentialSet,
    Category,
    CommandId,
    AppId,
    WorkloadId,
)


def hostile_values() -> st.SearchStrategy[Tagged[Any]]:
    """Hostile strings, and values of the wrong type altogether."""
    return st.one_of(
        hostile_texts(),
        hostile_texts(),
        junk_values().map(lambda v: Tagged(f"wrong type {type(v).__name__}", v)),
        st.binary(max_size=8).map(lambda b: Tagged("bytes", b)),
    )


def check_identity(cls: type[Identity], value: Any, field: str | None) -> str:
    """Accepted iff canonical, byte for byte as given; else INVALID naming the field."""
    try:
        made = cls(value, field=field)
    except InvalidInput as exc:
        assert not canonical(value) or (
            cls is SourceRevision and not re.fullmatch(r"[0-9a-f]{40}", value)
        ), f"{cls.__name__} rejected the canonical {value!r}: {exc.message}"
        assert exc.field == (field or cls.field), (exc.field, field, cls.field)
        assert exc.details.get("rule") == "R1", exc.details
        return "rejected"
    assert canonical(value), f"{cls.__name__} accepted the non-canonical {value!r}"
    assert isinstance(value, str)
    assert cls is not SourceRevision or re.fullmatch(r"[0-9a-f]{40}", value), value
    assert made == value and made.encode("utf-8") == value.encode("utf-8"), "repaired"
    return "accepted"


def check_audience(text: Any, kind: Any, ident: Any) -> str:
    """``Audience.parse``/``Audience.of``: a typed pair exactly as written, or INVALID
    naming the audience field; a ':' in the kind never moves into the id (R2)."""
    outcomes = []
    try:
        parsed = Audience.parse(text, field="bindings[3].audience")
    except InvalidInput as exc:
        assert exc.field.startswith("bindings[3].audience"), exc.field
        expected_ok = (
            isinstance(text, str)
            and text.partition(":")[0] in ("app", "integration")
            and canonical(text.partition(":")[2])
        )
        assert not expected_ok, f"rejected the canonical audience {text!r}"
        outcomes.append("parse rejected")
    else:
        assert isinstance(text, str) and str(parsed) == text, (parsed, text)
        assert canonical(parsed.id) and parsed.kind.value in ("app", "integration")
        outcomes.append("parse accepted")
    try:
        pair = Audience.of(kind, ident)
    except InvalidInput as exc:
        assert exc.field.startswith("audience"), exc.field
        assert not (kind in ("app", "integration") and canonical(ident)), (kind, ident)
        outcomes.append("of rejected")
    else:
        assert (pair.kind.value, str(pair.id)) == (kind, ident), f"{pair} from {(kind, ident)}"
        outcomes.append("of accepted")
    return ", ".join(outcomes)


def check_variants_distinct(family: Sequence[str]) -> None:
    """Valid case/normalization variants are different identities, ordered bytewise."""
    made = [PackName(v) for v in family]
    assert len({m.encode() for m in made}) == len(family)
    assert len(set(made)) == len(family)
    assert [m.encode() for m in sorted(made)] == sorted(m.encode() for m in made)


@st.composite
def variant_families(draw: st.DrawFn) -> Tagged[list[str]]:
    """2+ distinct canonical spellings of one word: case and NFC/NFD/NFKC variants."""
    letters = st.characters(
        categories=["Lu", "Ll", "Lt", "Mn"], exclude_characters=["\u0345"], max_codepoint=0x2FFF
    )
    base = draw(st.one_of(st.sampled_from(SEEDS[:20]), st.text(letters, min_size=1, max_size=10)))
    variants = {base, *(op(base) for op in CASE_OPS.values())}
    variants |= {unicodedata.normalize(n, v) for v in list(variants) for n in NORMS}  # type: ignore[arg-type]
    family = sorted(v for v in variants if canonical(v) and len(v.encode()) < 240)
    if len(family) < 2:
        family = sorted({"Sales", "sales", "SALES"})
    return Tagged("case+NFC/NFD family", family[:6])


@hostile_settings(300)
@given(
    cls=st.sampled_from([*IDENTITY_CLASSES, SourceRevision]),
    value=hostile_values(),
    field=st.sampled_from([None, "packs[2].name", "bindings[0].key"]),
)
def test_r1_identities_accept_exact_canonical_bytes_or_reject_naming_field(
    cls: type[Identity], value: Tagged[Any], field: str | None, tally: Counter[str]
) -> None:
    tally[f"{value.kind} -> {check_identity(cls, value.value, field)}"] += 1


@hostile_settings(200)
@given(
    text=hostile_texts(),
    kind=st.one_of(
        st.sampled_from(["app", "integration", "App", "APP", "app:x", "integration:", "", " app"]),
        hostile_texts().map(lambda t: t.value),
    ),
    ident=hostile_texts(),
    prefix=st.sampled_from(["app:", "integration:", "", "workload:", "app::", "APP:"]),
)
@example(
    text=Tagged("seed", "app:crm"),
    kind="app:x",
    ident=Tagged("seed", "y"),
    prefix="app:",
)
def test_r1_audiences_parse_into_typed_pairs_or_reject_naming_part(
    text: Tagged[str], kind: str, ident: Tagged[str], prefix: str, tally: Counter[str]
) -> None:
    tally[f"audience {text.kind} -> {check_audience(prefix + text.value, kind, ident.value)}"] += 1


@hostile_settings(100)
@given(family=variant_families())
def test_r1_case_and_normalization_variants_are_distinct_identities(
    family: Tagged[list[str]], tally: Counter[str]
) -> None:
    check_variants_distinct(family.value)
    tally[f"{family.kind} of {len(family.value)} -> distinct"] += 1


def check_variants_through_store(stage: Stage, family: Sequence[str]) -> None:
    """A manifest listing every spelling installs that many distinct packs (R1, R3)."""
    folder = stage.folder()
    packs = []
    # A common prefix keeps them variants of each other and apart from the stage's packs.
    family = [f"variant {name}" for name in family]
    for index, name in enumerate(family):
        pack_dir = folder / f"v{index}"
        pack_dir.mkdir()
        (pack_dir / "pack.json").write_bytes(sales_content(index, name=name))
        packs.append(local(name, pack_dir))
    manifest = folder / "release.json"
    manifest.write_bytes(encode({"packs": packs}, ascii_only=False))
    code, outcome = stage.attempt("apply", str(manifest))
    assert code == "OK", outcome
    _, status = stage.attempt("status")
    names = [p["pack"] for p in status.document["packs"]]
    for name in family:
        assert names.count(name) == 1, (name, names)
    for name in family:
        _, history = stage.attempt("history", "--pack", name)
        assert history.document["pack"] == name


@hostile_settings(6)
@given(family=variant_families())
@example(family=Tagged("case+NFC/NFD family", ["Café", "CAFÉ", "cafe\u0301", "café"]))
def test_r3_case_and_normalization_variants_install_as_distinct_packs(
    stage: Stage, family: Tagged[list[str]], tally: Counter[str]
) -> None:
    check_variants_through_store(stage, family.value)
    tally[f"{family.kind} of {len(family.value)} -> installed apart"] += 1


def check_revision(value: Any) -> str:
    """A revision bound is a plain ASCII integer (at most 18 digits), else INVALID."""
    plain = isinstance(value, int | str) and not isinstance(value, bool)
    text = str(value) if plain else ""
    expected = plain and text.isascii() and text.isdigit() and len(text) <= 18
    try:
        got = parse_revision(value)
    except InvalidInput as exc:
        assert not expected, f"rejected {value!r}"
        assert exc.field == "min_revision", exc.field
        return "rejected"
    assert expected or value is None, f"accepted {value!r} as {got!r}"
    assert got is None or got == int(text)
    return "accepted"


@hostile_settings(200)
@given(value=st.one_of(st.sampled_from(NUMERIC), hostile_values().map(lambda t: t.value)))
@example(value="²")
@example(value="١٢")
def test_r19_revision_bounds_are_plain_integers_or_invalid(value: Any, tally: Counter[str]) -> None:
    tally[f"{type(value).__name__} -> {check_revision(value)}"] += 1


# == R1 in a manifest: one spot spoiled, the error names that spot ==========================

SPOTS = (
    "packs[2].name",
    "packs[2].source.path",
    "packs[0].source.repo",
    "packs[0].source.revision",
    "packs[0].source.path",
    "bindings[0].audience",
    "bindings[0].pack",
    "bindings[0].kind",
    "bindings[0].key",
    "bindings[0].credential_set",
    "--command-id",
)


def check_manifest_spot(stage: Stage, spot: str, value: str, as_json: bool) -> str:
    """Put ``value`` at ``spot`` of the valid release; the outcome is success, or a typed
    error whose field names that spot (INVALID) or a fail-closed rejection (bindings)."""
    folder = stage.folder()
    doc = stage.base_manifest()
    args: list[str] = []
    if spot == "--command-id":
        if not argv_safe(value):
            value = value.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
        args = ["--command-id", value]
    elif spot.startswith("packs[2]"):
        hostile_dir = folder / "hostile-pack"
        hostile_dir.mkdir()
        name = value if spot == "packs[2].name" else "hostile-local"
        (hostile_dir / "pack.json").write_bytes(encode(sales_doc(3, name=name)))
        doc["packs"].append(local(name, hostile_dir))
        if spot == "packs[2].source.path":
            doc["packs"][2]["source"]["path"] = value
    else:
        section, _, rest = spot.partition(".")
        target = doc["packs"][0] if section == "packs[0]" else doc["bindings"][0]
        for part in rest.split(".")[:-1]:
            target = target[part]
        target[rest.split(".")[-1]] = value
    manifest = folder / "release.json"
    manifest.write_bytes(encode(doc))
    code, outcome = stage.attempt("apply", str(manifest), *args, as_json=as_json)
    if code == "INVALID" and as_json:
        wanted = spot.removeprefix("--").replace("-", "_")
        # pydantic puts the union tag into the path: packs[0].source.official_repo.revision
        named = re.sub(r"\.(official_repo|local_path)\b", "", outcome.field)
        assert wanted in named, f"the error names {outcome.field!r}, not {spot}"
    if code in ("LIFECYCLE", "FAIL_CLOSED", "MISSING", "STALE"):
        assert spot.startswith("bindings") or spot.startswith("packs[0]"), outcome
    return code


@hostile_settings(25)
@given(spot=st.sampled_from(SPOTS), value=hostile_texts(), as_json=st.booleans())
@example(spot="packs[2].source.path", value=Tagged("seed", "~nosuchuser-hostile/x"), as_json=True)
@example(spot="packs[0].source.repo", value=Tagged("seed", "file://[bad/x"), as_json=True)
@example(spot="packs[0].source.repo", value=Tagged("seed", "x" * 5000), as_json=True)
def test_r1_manifest_identities_apply_or_reject_naming_the_spot(
    stage: Stage, spot: str, value: Tagged[str], as_json: bool, tally: Counter[str]
) -> None:
    code = check_manifest_spot(stage, spot, value.value, as_json)
    tally[f"{spot}: {value.kind} -> {code}"] += 1


# == R4: hostile manifest files =============================================================


def expected(hostile: Tagged[Any], code: str, outcome: Outcome, as_json: bool) -> None:
    """Where the outcome is known without running the input, it must be exactly that."""
    if hostile.expect is not None:
        assert code == hostile.expect, f"{hostile.kind}: expected {hostile.expect}: {outcome}"
    if hostile.field is not None and as_json:
        assert outcome.field == hostile.field, f"{hostile.kind}: wrong field: {outcome}"


def check_manifest_file(stage: Stage, hostile: Tagged[bytes | Shape], as_json: bool) -> str:
    path = place(stage.folder() / "release.json", hostile.value)
    code, outcome = stage.attempt("apply", str(path), as_json=as_json)
    expected(hostile, code, outcome, as_json)
    return code


@hostile_settings(25)
@given(content=st.data(), as_json=st.booleans())
def test_r4_hostile_manifest_files_apply_or_reject_without_partial_append(
    stage: Stage, content: st.DataObject, as_json: bool, tally: Counter[str]
) -> None:
    hostile = content.draw(hostile_files(stage.base_manifest()))
    tally[f"{hostile.kind} -> {check_manifest_file(stage, hostile, as_json)}"] += 1


# == R4: hostile pack.json (local directory and git commit) =================================


def check_pack_file(
    stage: Stage, hostile: Tagged[bytes | Shape], source: str, as_json: bool
) -> str:
    """A release adding pack "hostile" whose pack.json is ``hostile``."""
    content = hostile.value
    folder = stage.folder()
    doc = stage.base_manifest()
    if source == "local_path":
        place(folder / "hostile" / "pack.json", content)
        doc["packs"].append(local("hostile", folder / "hostile"))
    else:
        repo = stage.world.repo
        target = repo.path / "hostile" / "pack.json"
        if target.is_dir() and not target.is_symlink():
            for child in target.iterdir():
                child.unlink()
            target.rmdir()
        elif target.exists() or target.is_symlink():
            target.unlink()
        place(target, content)
        commit = repo.commit({})
        doc["packs"].append(official("hostile", repo.path, commit, "hostile/pack.json"))
    manifest = folder / "release.json"
    manifest.write_bytes(encode(doc))
    code, outcome = stage.attempt("apply", str(manifest), as_json=as_json)
    expected(hostile, code, outcome, as_json)
    return code


@hostile_settings(25)
@given(
    content=st.data(),
    source=st.sampled_from(["local_path", "local_path", "official_repo"]),
    as_json=st.booleans(),
)
def test_r4_hostile_pack_json_installs_or_rejects_without_partial_append(
    stage: Stage, content: st.DataObject, source: str, as_json: bool, tally: Counter[str]
) -> None:
    hostile = content.draw(hostile_files(PACK_DOC))
    if source == "official_repo" and hostile.value in (Shape.DEV_ZERO, Shape.SYMLINK_LOOP):
        source = "local_path"  # git stores the link itself, not what it points at
    code = check_pack_file(stage, hostile, source, as_json)
    tally[f"{source}: {hostile.kind} -> {code}"] += 1


# == R7: hostile legacy records =============================================================


def check_legacy_file(stage: Stage, hostile: Tagged[bytes | Shape], as_json: bool) -> str:
    path = place(stage.folder() / "legacy.json", hostile.value)
    code, outcome = stage.attempt("import-legacy", str(path), as_json=as_json)
    expected(hostile, code, outcome, as_json)
    return code


@hostile_settings(25)
@given(content=st.data(), as_json=st.booleans())
def test_r7_hostile_legacy_records_import_or_reject_without_partial_append(
    stage: Stage, content: st.DataObject, as_json: bool, tally: Counter[str]
) -> None:
    hostile = content.draw(hostile_files(LEGACY_DOC))
    tally[f"{hostile.kind} -> {check_legacy_file(stage, hostile, as_json)}"] += 1


# == R19: whole CLI argument vectors ========================================================


@dataclass(frozen=True)
class Files:
    """Paths the argument vectors point at (all inside the test's temporary folder)."""

    manifest: Path
    legacy: Path
    bad_json: Path
    directory: Path
    missing: Path
    checkpoint: Path
    proof: Path
    signer: Path
    verifier: Path
    out: Path


def make_files(stage: Stage) -> Files:
    folder = stage.folder()
    manifest = folder / "release.json"
    manifest.write_text(json.dumps(stage.base_manifest()), encoding="utf-8")
    legacy = folder / "legacy.json"
    legacy.write_text(json.dumps(LEGACY_DOC), encoding="utf-8")
    bad = folder / "bad.json"
    bad.write_bytes(b'{"packs": [1.5, NaN], "packs": "\\ud800"}')
    _, cp = stage.attempt("audit", "checkpoint")
    checkpoint = folder / "checkpoint.txt"
    checkpoint.write_text(cp.document["note"], encoding="utf-8")
    proof = folder / "proof.json"
    proof.write_text(run_cli(["--db", stage.url, "audit", "prove", "--position", "1"]).stdout)
    signer = folder / "signer.key"
    _, _key = stage.attempt("audit", "keygen", "hostile-test", "--out", str(signer))
    return Files(
        manifest=manifest,
        legacy=legacy,
        bad_json=bad,
        directory=folder,
        missing=folder / "missing.json",
        checkpoint=checkpoint,
        proof=proof,
        signer=signer,
        verifier=Path(str(signer) + ".pub"),
        out=folder / "out",
    )


def stage_files(stage: Stage) -> Files:
    if stage.files is None:
        stage.files = make_files(stage)
    return stage.files


def _paths_of(files: Files) -> st.SearchStrategy[str]:
    return st.sampled_from(
        [
            str(files.manifest),
            str(files.legacy),
            str(files.bad_json),
            str(files.directory),
            str(files.missing),
            str(files.checkpoint),
            str(files.proof),
            str(files.signer),
            str(files.verifier),
            "/dev/null",
            "/dev/zero",
            "",
            "-",
        ]
    )


def _out_paths(files: Files) -> st.SearchStrategy[str]:
    """Where commands may write: only fresh or existing paths in the test's folder."""
    return st.builds(
        lambda n, existing: str(files.signer if existing else files.out / f"w{n}"),
        st.integers(0, 10**6),
        st.booleans(),
    ) | st.sampled_from([str(files.directory), str(files.out / "no" / "such" / "dir" / "f")])


def _argv_texts() -> st.SearchStrategy[str]:
    return hostile_texts().map(lambda t: t.value).filter(argv_safe).filter(lambda s: s != "--json")


#: (command words, positional kinds, {option: value kind}); flags have value kind "flag".
Command = tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]
GRAMMAR: tuple[Command, ...] = (
    (("init",), (), {}),
    (("log",), (), {"--from": "number", "--limit": "number"}),
    (("status",), (), {}),
    (("view",), ("audience",), {"--min-revision": "number", "--at-revision": "number"}),
    (("publish",), (), {"--command-id": "text"}),
    (("apply",), ("path",), {"--command-id": "text", "--wait": "number", "--no-publish": "flag"}),
    (("import-legacy",), ("path",), {"--command-id": "text"}),
    (("history",), (), {"--pack": "text", "--audience": "audience"}),
    (("credentials", "issue"), ("audience",), {"--expires-in": "text"}),
    (("credentials", "revoke"), ("text",), {}),
    (("credentials", "list"), (), {"--audience": "audience"}),
    (("export",), (), {"--jsonl": "flag", "--out": "out"}),
    (("import",), (), {"--jsonl": "path", "--workers": "number", "--legacy-no-trailer": "flag"}),
    (("pack", "hash"), ("path", "text"), {}),
    (("audit", "checkpoint"), (), {"--sign": "path", "--log": "text"}),
    (("cosign",), (), {"--sign": "path", "--policy": "path"}),
    (
        ("audit", "prove"),
        (),
        {
            "--position": "number",
            "--size": "number",
            "--from-size": "number",
            "--to-size": "number",
        },
    ),
    (
        ("audit", "verify"),
        (),
        {"--from-checkpoint": "path", "--key": "path", "--no-replay": "flag", "--no-views": "flag"},
    ),
    (("audit", "verify-proof"), ("path",), {"--checkpoint": "path", "--key": "path"}),
    (("audit", "keygen"), ("text",), {"--out": "out"}),
    (("projections", "status"), (), {}),
    (("projections", "verify"), ("view-name",), {}),
    (("projections", "catch-up"), ("view-name",), {}),
    (("schema", "dump"), (), {"--out": "out-dir", "--stdout": "dialect"}),
    (
        ("serve",),
        (),
        {"--port": "bad-port", "--host": "text", "--log-level": "text", "--no-auth": "flag"},
    ),
)
VIEW_NAMES = ("installed_packs", "generations", "catalog", "nope", "", "..", "INSTALLED_PACKS")


@st.composite
def argument_vectors(
    draw: st.DrawFn, stage: Stage, files: Files, grammar: Sequence[Command] = GRAMMAR
) -> Tagged[list[str]]:
    words, positionals, options = draw(st.sampled_from(grammar))
    values: dict[str, st.SearchStrategy[str]] = {
        "number": st.one_of(st.sampled_from(NUMERIC), _argv_texts()),
        "text": _argv_texts(),
        "path": _paths_of(files),
        "out": _out_paths(files),
        "out-dir": st.sampled_from([str(files.out / "schema"), str(files.signer)]),
        "dialect": st.sampled_from(["sqlite", "mysql", "postgres", ""]),
        "bad-port": st.sampled_from(["-1", "65536", "http", "1e3", "", "8080x"]),
        "audience": st.one_of(
            st.sampled_from(["integration:erp-sync", "app:crm", "integration:ERP-sync"]),
            st.tuples(st.sampled_from(["app:", "integration:", "", "x:"]), _argv_texts()).map(
                "".join
            ),
        ),
        "view-name": st.sampled_from(VIEW_NAMES),
    }
    argv = list(words)
    for kind in positionals:
        if draw(st.integers(0, 9)) > 0:  # sometimes missing
            argv.append(draw(values[kind]))
    chosen = draw(st.lists(st.sampled_from(sorted(options)), unique=True)) if options else []
    if words == ("schema", "dump") and "--out" not in chosen:
        chosen.append("--out")  # never let a fuzzed dump overwrite the repository's schema/
    if words == ("serve",) and "--port" not in chosen:
        chosen.append("--port")  # an invalid port: serve must fail before it listens
    if words == ("export",) and draw(st.booleans()):
        chosen = [c for c in chosen if c != "--jsonl"]
    for option in chosen:
        kind = options[option]
        argv.append(option)
        if kind != "flag":
            argv.append(draw(values[kind]))
    extra = draw(st.sampled_from(["none"] * 6 + ["junk", "unknown option", "help", "dangling"]))
    if extra == "junk":
        argv.append(draw(_argv_texts()))
    elif extra == "unknown option":
        argv.append("--no-such-option")
    elif extra == "help":
        argv.insert(draw(st.integers(0, len(argv))), draw(st.sampled_from(["--help", "-h"])))
    as_json = extra != "dangling" and draw(st.integers(0, 3)) > 0
    if extra == "dangling" and options:
        argv.append(draw(st.sampled_from(sorted(options))))
    db = draw(
        st.sampled_from(
            [stage.url] * 12
            + [
                "sqlite://",
                "sqlite:///:memory:",
                f"sqlite:///{files.directory}",
                f"sqlite:///{files.out}/no/such/dir/x.db",
                "mysql+pymysql://root@127.0.0.1:1/x",
                "mysql+pymysql://root@127.0.0.1:3306/",
                "postgresql://u@127.0.0.1/x",
                "::::",
                f"sqlite:///{files.directory}/\udcff.db",
            ]
        )
    )
    if db.startswith("sqlite:///") and db.endswith("x.db") and words == ("init",):
        db = stage.url  # `init` on a fresh path would just (correctly) create a store
    head = ["--db", db] if draw(st.integers(0, 9)) > 0 else []
    if draw(st.integers(0, 19)) == 0:
        head.append(draw(st.sampled_from(["--version", "--help", "--db"])))
    return Tagged(" ".join(words), [*head, *argv, *(["--json"] if as_json else [])])


def check_argument_vector(stage: Stage, argv: list[str]) -> str:
    """Any vector: an exit code with a typed error (or success), and nothing written
    unless it succeeded."""
    before = stage.world.tables()
    outcome = run_cli(argv)
    code = check_typed(outcome)
    if code != "OK":
        assert stage.world.tables() == before, f"a rejected command wrote: {outcome}"
    return code


# Once, on SQLite: arguments are refused before any store is read.
@pytest.mark.parametrize("engine_url", ["sqlite"], indirect=True)
@hostile_settings(40)
@given(data=st.data())
def test_r19_hostile_cli_argument_vectors_exit_with_typed_codes(
    stage: Stage, data: st.DataObject, tally: Counter[str]
) -> None:
    argv = data.draw(argument_vectors(stage, stage_files(stage)))
    tally[f"{argv.kind} -> {check_argument_vector(stage, argv.value)}"] += 1


# Once, on SQLite: arguments are refused before any store is read.
@pytest.mark.parametrize("engine_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    "args",
    [
        ["apply", "\udcff.json"],
        ["import-legacy", "\udcff/legacy.json"],
        ["history", "--pack", "\udcff"],
        ["view", "app:crm", "--min-revision", "²"],
        ["view", "app:crm", "--at-revision", "١٢"],
        ["view", "app:x\udcff"],
        ["pack", "hash", "\udcfe", "sales"],
        ["credentials", "issue", "app:x\udcff"],
        ["credentials", "issue", "app:crm", "--expires-in", "\u0661\u0662d"],
        ["credentials", "revoke", "\udcff"],
        ["history", "--audience", "app:\udcff"],
    ],
)
def test_r19_undecodable_and_unicode_digit_arguments_get_typed_errors(
    stage: Stage, args: list[str]
) -> None:
    for as_json in (True, False):
        check_argument_vector(stage, ["--db", stage.url, *args, *(["--json"] * as_json)])


# == R22: hostile checkpoints, keys and proof documents =====================================


def check_note(text: str) -> str:
    """Checkpoint and key parsers: a value or INVALID naming the field."""
    outcomes = []
    for parse, field in (
        (Checkpoint.parse, "checkpoint"),
        (VerifierKey.parse, "key"),
        (SignerKey.parse, "sign"),
    ):
        try:
            parse(text)
        except InvalidInput as exc:
            assert exc.field == field, exc.field
            outcomes.append("rejected")
        else:
            outcomes.append("parsed")
    return "/".join(outcomes)


@st.composite
def hostile_notes(draw: st.DrawFn) -> Tagged[str]:
    origin = draw(st.sampled_from(["catalog-ledger/x", "", " ", "o\u2028x"]))
    size = draw(st.one_of(st.sampled_from(NUMERIC), st.integers(0, 2**70).map(str)))
    root = draw(
        st.sampled_from(
            [
                base64.b64encode(b"\x00" * 32).decode(),
                base64.b64encode(b"\x00" * 31).decode(),
                "!!!",
                "",
                "A" * 44,
            ]
        )
    )
    rest = draw(st.sampled_from(["", "\n", "\n\n— name AAAA\n", "\n\n\n"]))
    key = draw(
        st.sampled_from(
            [
                "",
                "name+00000000+" + base64.b64encode(b"\x01" + b"\x00" * 32).decode(),
                "PRIVATE+KEY+name+00000000+" + base64.b64encode(b"\x01" + b"\x00" * 32).decode(),
                "PRIVATE+KEY+n+zz+!!!",
                "a+b+c",
                "+++",
            ]
        )
    )
    mode = draw(st.sampled_from(["checkpoint", "key", "text"]))
    if mode == "checkpoint":
        return Tagged("checkpoint note", f"{origin}\n{size}\n{root}\n{rest}")
    if mode == "key":
        return Tagged("key text", key)
    text = draw(hostile_texts())
    return Tagged(f"note from {text.kind}", text.value)


@hostile_settings(200)
@given(note=hostile_notes())
@example(note=Tagged("checkpoint note", "o\n²\n" + "A" * 43 + "=\n"))
@example(note=Tagged("checkpoint note", "o\n" + "9" * 5000 + "\n" + "A" * 43 + "=\n"))
def test_r22_checkpoint_and_key_texts_parse_or_reject_naming_field(
    note: Tagged[str], tally: Counter[str]
) -> None:
    tally[f"{note.kind} -> {check_note(note.value)}"] += 1


@dataclass(frozen=True)
class Proofs:
    folder: Path
    checkpoint: Path
    inclusion: dict[str, Any]
    consistency: dict[str, Any]


def make_proofs(stage: Stage) -> Proofs:
    folder = stage.folder()
    _, cp = stage.attempt("audit", "checkpoint")
    checkpoint = folder / "checkpoint.txt"
    checkpoint.write_text(cp.document["note"], encoding="utf-8")
    inclusion = json.loads(run_cli(["--db", stage.url, "audit", "prove", "--position", "1"]).stdout)
    consistency = json.loads(
        run_cli(["--db", stage.url, "audit", "prove", "--from-size", "1"]).stdout
    )
    for doc in (inclusion, consistency):
        proof = folder / "proof.json"
        proof.write_text(json.dumps(doc), encoding="utf-8")
        code, outcome = stage.attempt(
            "audit", "verify-proof", str(proof), "--checkpoint", str(checkpoint)
        )
        assert code == "OK", outcome
    return Proofs(folder, checkpoint, inclusion, consistency)


def check_proof(stage: Stage, proofs: Proofs, content: bytes | Shape, as_json: bool) -> str:
    path = place(stage.folder() / "proof.json", content)
    code, _ = stage.attempt(
        "audit", "verify-proof", str(path), "--checkpoint", str(proofs.checkpoint), as_json=as_json
    )
    return code


@pytest.fixture
def proof_stage(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[Stage, Proofs]]:
    s = make_stage(tmp_path, sqlite_url)
    yield s, make_proofs(s)
    s.world.close()


@hostile_settings(30)
@given(data=st.data(), which=st.sampled_from(["inclusion", "consistency"]), as_json=st.booleans())
def test_r22_hostile_proof_documents_verify_or_reject(
    proof_stage: tuple[Stage, Proofs],
    data: st.DataObject,
    which: str,
    as_json: bool,
    tally: Counter[str],
) -> None:
    stage, proofs = proof_stage
    hostile = data.draw(hostile_files(getattr(proofs, which)))
    code = check_proof(stage, proofs, hostile.value, as_json)
    tally[f"{which}: {hostile.kind} -> {code}"] += 1


# == R19: the HTTP read service =============================================================


@pytest.fixture
def served(stage: Stage) -> Iterator[tuple[Stage, ServedStore]]:
    server = ServedStore(stage.url, timeout=HANG_LIMIT)
    yield stage, server
    server.close()


#: What a catalog-ledger read response may be: success, 304, or the DESIGN error shape.
ERROR_STATUS = {400: "INVALID", 404: "MISSING", 405: "INVALID", 409: "STALE", 500: "INTEGRITY"}


#: Why a ``proof=1`` read may be 503 UNAVAILABLE (R29): these stores have no cosigned
#: checkpoint of the catalog log, so a proven read waits for the collector.
PROOF_PENDING = {"checkpoint_pending", "unprovable_revision"}


def _proof_pending(body: bytes) -> bool:
    try:
        document = json.loads(body)
    except ValueError:
        return False
    return (
        isinstance(document, dict)
        and document.get("error") == "UNAVAILABLE"
        and isinstance(document.get("details"), dict)
        and document["details"].get("reason") in PROOF_PENDING
    )


def check_http(method: str, status: int, body: bytes, what: str) -> str:
    """No 5xx but a 500 INTEGRITY (and the 503 of a proven read no cosigned checkpoint
    covers yet); every error in the DESIGN shape, typed, INVALID with a field. Returns
    the status as a tally key."""
    if status == 503 and "proof" in what and _proof_pending(body):
        return "HTTP 503 UNAVAILABLE (proof pending)"
    assert status < 500 or status == 500, f"{what}: HTTP {status} {body[:500]!r}"
    if status in (200, 304) or method == "HEAD":
        return f"HTTP {status}"
    # No redirect ever (issue 25.2: none is built from the client's Host header).
    assert not 300 <= status < 400, f"{what}: HTTP {status} redirect"
    try:
        document = json.loads(body)
    except ValueError:
        raise AssertionError(f"{what}: HTTP {status} body is not JSON: {body[:500]!r}") from None
    assert isinstance(document, dict), f"{what}: {body[:500]!r}"
    assert set(document) == {"error", "message", "details"}, f"{what}: {document}"
    assert document["error"] != "ERROR", f"{what}: internal error {document}"
    if status == 500:
        assert document["error"] == "INTEGRITY", f"{what}: {document}"
    if status in ERROR_STATUS and status != 405:
        assert document["error"] == ERROR_STATUS[status], f"{what}: {document}"
    if document["error"] == "INVALID":
        assert isinstance(document["details"], dict)
    if status == 400:
        assert document["details"].get("field"), f"{what}: INVALID without a field {document}"
    return f"HTTP {status} {document['error']}"


def _schema() -> Any:
    import schemathesis

    return schemathesis.openapi.from_path(str(ROOT / "schema" / "openapi.json"))


def schemathesis_cases() -> st.SearchStrategy[Any]:
    """Positive cases for every operation and negative ones for the view (schemathesis)."""
    from schemathesis import GenerationMode

    schema = _schema()
    view = schema["/v1/audiences/{kind}/{audience_id}/view"]["GET"]
    return st.one_of(
        schema.as_strategy(generation_mode=GenerationMode.POSITIVE),
        view.as_strategy(generation_mode=GenerationMode.NEGATIVE),
        view.as_strategy(
            generation_mode=GenerationMode.POSITIVE,
            path_parameters={"kind": "integration", "audience_id": "erp-sync"},
        ),
    )


def _long_poll_seconds(query: Any) -> float:
    """How long a watch may take by contract: with a valid ``wait`` (1..300) and an
    ``If-None-Match`` that matches (``*`` does), the view answers only after up to that
    many seconds. That is the documented long poll, not a hang."""
    raw = query.get("wait") if isinstance(query, dict) else None
    try:
        seconds = int(str(raw))
    except ValueError:
        return 0.0
    return float(seconds) if 1 <= seconds <= 300 else 0.0


def check_schemathesis_case(server: ServedStore, case: Any) -> str:
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    limit = HANG_LIMIT + _long_poll_seconds(case.query)
    with watchdog(limit):
        response = case.call(base_url=server.base, timeout=limit)
    what = f"{case.method} {case.formatted_path} query={case.query!r}"
    outcome = check_http(case.method, response.status_code, response.content, what)
    case.validate_response(
        response,
        checks=[status_code_conformance, content_type_conformance, response_schema_conformance],
    )
    return outcome


# Once, on SQLite: the HTTP layer answers these; the engine does not matter.
@pytest.mark.parametrize("engine_url", ["sqlite"], indirect=True)
@hostile_settings(40)
@given(case=schemathesis_cases())
def test_r19_http_schemathesis_cases_get_documented_typed_answers(
    served: tuple[Stage, ServedStore], case: Any, tally: Counter[str]
) -> None:
    _, server = served
    tally[f"{case.operation.label} -> {check_schemathesis_case(server, case)}"] += 1


def _pct(raw: bytes) -> str:
    return "".join(f"%{b:02X}" for b in raw)


SEGMENTS = (
    "app",
    "integration",
    "erp-sync",
    "crm",
    "ERP-sync",
    "never-seen",
    "",
    ".",
    "..",
    "%",
    "%zz",
    "%ff",
    "%00",
    "%ED%A0%80",
    "%C0%AF",
    "%2F",
    "%2e%2e",
    "%20",
    "%09",
    "%0A",
    "app%3Ax",
    "integration%3Aerp-sync",
    "%E2%80%A8",
    "caf%C3%A9",
    "cafe%CC%81",
    "x" * 3000,
)


def _segments() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(SEGMENTS),
        st.binary(max_size=12).map(_pct),
        hostile_texts().map(lambda t: quote(t.value.encode("utf-8", "surrogatepass"), safe="")),
    )


@st.composite
def raw_requests(draw: st.DrawFn) -> Tagged[tuple[str, str, list[tuple[str, str]], dict[str, str]]]:
    """A method, a raw (percent-encoded) path, query pairs and headers."""
    shape = draw(
        st.sampled_from(["view"] * 6 + ["head", "healthz", "random path", "openapi", "deep path"])
    )
    kind = draw(_segments())
    ident = draw(_segments())
    if shape == "view":
        path = f"/v1/audiences/{kind}/{ident}/view"
    elif shape == "head":
        path = "/v1/catalog/head" + draw(st.sampled_from(["", "/", "/x", "%00"]))
    elif shape == "healthz":
        path = "/healthz"
    elif shape == "openapi":
        path = draw(st.sampled_from(["/openapi.json", "/docs", "/redoc", "/"]))
    elif shape == "deep path":
        path = "/v1/audiences/app/" + "a/" * draw(st.integers(1, 2000)) + "view"
    else:
        path = "/" + "/".join(draw(st.lists(_segments(), max_size=5)))
    numbers = st.one_of(
        st.sampled_from(NUMERIC),
        st.sampled_from(["1", "2", "0", "1000000", "9" * 18, "9" * 19]),
        hostile_texts().map(lambda t: t.value),
    )
    query: list[tuple[str, str]] = []
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(["min_revision", "min_revision", "MIN_REVISION", "x", ""]))
        query.append((name, draw(numbers)))
    headers: dict[str, str] = {}
    if draw(st.booleans()):
        headers["If-None-Match"] = draw(
            st.sampled_from(['"x"', "*", 'W/"x"', "", ",,,", '"' + "a" * 5000 + '"'])
        )
    method = draw(st.sampled_from(["GET"] * 8 + ["HEAD", "POST", "PUT", "DELETE", "OPTIONS"]))
    return Tagged(f"{method} {shape}", (method, path, query, headers))


def _query_string(pairs: list[tuple[str, str]]) -> str:
    return "&".join(
        f"{quote(k.encode('utf-8', 'surrogatepass'), safe='')}="
        f"{quote(v.encode('utf-8', 'surrogatepass'), safe='')}"
        for k, v in pairs
    )


def check_raw_request(
    server: ServedStore,
    method: str,
    path: str,
    query: list[tuple[str, str]],
    headers: dict[str, str],
) -> str:
    raw = path + ("?" + _query_string(query) if query else "")
    url = httpx.URL(server.base).copy_with(raw_path=raw.encode("ascii"))
    with watchdog():
        response = server.client.request(method, url, headers=headers)
    what = f"{method} {raw[:300]} {headers!r}"[:600]
    outcome = check_http(method, response.status_code, response.content, what)
    found = re.fullmatch(r"/v1/audiences/([^/]+)/(.*)/view", path)
    # "." and ".." are dot segments: URL normalization removes them (RFC 3986 5.2.4),
    # so such a request names another path altogether.
    dotted = any(unquote(segment) in (".", "..") for segment in path.split("/"))
    if found and method == "GET" and response.status_code != 405 and not dotted:
        kind = unquote(found.group(1))
        if "/" not in kind and kind not in ("app", "integration"):
            # R1/R2: a bad kind is rejected naming the kind; a ':' never moves into the id.
            assert response.status_code == 400, f"{what}: kind {kind!r} -> {outcome}"
            assert response.json()["details"]["field"] == "audience.kind", what
    return outcome


# Once, on SQLite: the HTTP layer answers these; the engine does not matter.
@pytest.mark.parametrize("engine_url", ["sqlite"], indirect=True)
@hostile_settings(40)
@given(request=raw_requests())
@example(request=Tagged("GET view", ("GET", "/v1/audiences/app%3Acrm/x/view", [], {})))
@example(request=Tagged("GET view", ("GET", "/v1/audiences/./app/view", [], {})))
@example(request=Tagged("GET view", ("GET", "/v1/audiences/erp-sync/./view", [], {})))
@example(
    request=Tagged("GET view", ("GET", "/v1/audiences/app/crm/view", [("min_revision", "²")], {}))
)
def test_r19_http_raw_hostile_requests_get_typed_answers(
    served: tuple[Stage, ServedStore],
    request: Tagged[tuple[str, str, list[tuple[str, str]], dict[str, str]]],
    tally: Counter[str],
) -> None:
    _, server = served
    method, path, query, headers = request.value
    tally[f"{request.kind} -> {check_raw_request(server, method, path, query, headers)}"] += 1


def test_r19_http_success_paths_are_exercised(served: tuple[Stage, ServedStore]) -> None:
    """The seeded catalog answers, so the hostile requests above also reach success paths."""
    _, server = served
    ok = server.client.get("/v1/audiences/integration/erp-sync/view")
    assert ok.status_code == 200, ok.text
    etag = ok.headers["etag"]
    again = server.client.get(
        "/v1/audiences/integration/erp-sync/view", headers={"If-None-Match": etag}
    )
    assert again.status_code == 304
    assert server.client.get("/v1/catalog/head").status_code == 200
