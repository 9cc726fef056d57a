"""R4: one canonical encoder; strict input parsing; purpose-separated digests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from domain.canonical import (
    MAX_DEPTH,
    _check_canonical,
    canonical_bytes,
    check_canonical,
    parse_json,
)
from domain.digests import Purpose, digest, lp
from domain.errors import InvalidInput
from ledger.log.transcoder import OrjsonTranscoder


def test_r4_keys_sorted_and_compact() -> None:
    assert (
        canonical_bytes({"b": 1, "a": [True, None, "é"]}) == b'{"a":[true,null,"\xc3\xa9"],"b":1}'
    )


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"x": 1.5}, "$.x"),
        ({"x": [2**63]}, "$.x[0]"),
        ({"x": -(2**63) - 1}, "$.x"),
        ({"x": "\ud800"}, "$.x"),
        ({"x": b"bytes"}, "$.x"),
        ({1: "non-string key"}, "$"),
    ],
)
def test_r4_non_canonical_values_rejected_with_path(value: object, field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        canonical_bytes(value)
    assert info.value.field == field


def test_r4_integer_range_edges_accepted() -> None:
    assert canonical_bytes([2**63 - 1, -(2**63)]) == b"[9223372036854775807,-9223372036854775808]"


@pytest.mark.parametrize(
    ("text", "reason", "field"),
    [
        ('{"a": 1, "a": 2}', "duplicate key", "release.json"),
        ('{"a": 1.0}', "float", "a"),
        ('{"a": NaN}', "NaN", "a"),
        ('{"a": 99999999999999999999}', "64-bit", "a"),
        ('{"b": [{"c": [0, 1e3]}]}', "float", "b[0].c[1]"),
        ("2.5", "float", "$"),
        ('{"a": ', "not valid JSON", "release.json"),
        ("[" * 5000 + "]" * 5000, "nested", "release.json"),
    ],
)
def test_r4_strict_input_parsing(text: str, reason: str, field: str) -> None:
    """A refused value is named by its JSON path in the file; a file that is not JSON
    at all is named by the file."""
    with pytest.raises(InvalidInput) as info:
        parse_json(text, source="release.json")
    assert info.value.field == field
    assert reason in info.value.message and "release.json" in info.value.message


def test_r4_invalid_utf8_input_rejected() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_json(b'{"a": "\xff"}', source="pack.json")
    assert "UTF-8" in info.value.message


def test_r4_digest_purposes_are_separated() -> None:
    data = b"same bytes"
    digests = {digest(p, data) for p in Purpose}
    assert len(digests) == len(Purpose)
    assert len({p.value for p in Purpose}) == len(Purpose)


def test_r2_length_prefix_prevents_aliasing() -> None:
    assert lp(b"ab", b"c") != lp(b"a", b"bc")


_ENCODE_SCRIPT = """
import sys
from datetime import datetime, timezone
from uuid import UUID
from eventsourcing.persistence import Mapper
from ledger.log.transcoder import OrjsonTranscoder
from tests.support.notes import Note
event = Note.Written(
    originator_id=UUID(int=7), originator_version=3,
    timestamp=datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=timezone.utc),
    text="h\\u00e9llo",
)
stored = Mapper(transcoder=OrjsonTranscoder()).to_stored_event(event)
sys.stdout.buffer.write(stored.state)
"""


def test_r4_same_event_encodes_to_same_bytes_in_two_processes() -> None:
    outputs = [
        subprocess.run(
            [sys.executable, "-c", _ENCODE_SCRIPT],
            capture_output=True,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout
        for seed in ("1", "2")
    ]
    assert outputs[0] == outputs[1]
    assert outputs[0] == (b'{"text":"h\xc3\xa9llo","timestamp":"2026-11-29T12:00:00.123456+00:00"}')


def test_r4_transcoder_round_trips_event_state() -> None:
    state = {"text": "x", "timestamp": datetime(2026, 1, 2, tzinfo=UTC), "n": [1, {"b": 2}]}
    transcoder = OrjsonTranscoder()
    assert transcoder.decode(transcoder.encode(state)) == state


_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=False),
    st.text(),
    st.sampled_from(["\ud800", "a\udfffb", Purpose.CHAIN, b"bytes", 1.0, True]),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1]),
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=4), st.just("\udc00"), st.integers()), inner),
    ),
    max_leaves=20,
)


def _verdict(check: Callable[[], None]) -> tuple[str, str] | None:
    try:
        check()
    except InvalidInput as exc:
        return (str(exc.field), str(exc))
    return None


@settings(max_examples=400, deadline=None)
@given(_VALUES)
@example(2**63)
@example([-(2**63) - 1, 2**63 - 1])
@example({"a": ["\ud800"]})
@example({"\udc00": 1})
@example(("tuple", 1.5))
@example({1: "non-string key"})
@example([Purpose.CHAIN, b"bytes"])
def test_r4_the_quick_canonical_check_agrees_with_the_path_naming_walk(value: object) -> None:
    """``check_canonical`` first walks without building paths; the verdict and the named
    path must be exactly the naming walk's, for canonical and non-canonical values alike."""
    assert _verdict(lambda: check_canonical(value, "$.x", 0)) == _verdict(
        lambda: _check_canonical(value, "$.x", 0)
    )


@pytest.mark.parametrize("depth", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1])
def test_r4_the_nesting_limit_is_the_same_on_both_walks(depth: int) -> None:
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    expected = None if depth <= MAX_DEPTH else f"$.x{'[0]' * (MAX_DEPTH + 1)}"
    found = _verdict(lambda: check_canonical(value, "$.x"))
    assert (found[0] if found else None) == expected
    assert found == _verdict(lambda: _check_canonical(value, "$.x", 0))
