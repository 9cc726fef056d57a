"""R1/R2: identities are canonical opaque byte strings, rejected (never repaired)."""

from __future__ import annotations

import sys
import unicodedata

import pytest

from domain.errors import InvalidInput
from domain.identity import (
    Audience,
    AudienceKind,
    BusinessKey,
    ComponentKind,
    ComponentRef,
    PackName,
    SourceRevision,
    identity_problem,
)

NFC = unicodedata.normalize("NFC", "packé")
NFD = unicodedata.normalize("NFD", "packé")

BAD = [
    ("", "must not be empty"),
    (" pack", "leading or trailing whitespace"),
    ("pack ", "leading or trailing whitespace"),
    ("pa\tck", "control characters"),
    ("\tpack", "leading or trailing whitespace"),
    ("pa\x00ck", "control characters"),
    ("pa\x7fck", "control characters"),
    ("pack\u2003", "leading or trailing whitespace"),
    ("x" * 256, "at most 255 bytes"),
    ("é" * 128, "at most 255 bytes"),
    ("pa\ud800ck", "valid UTF-8"),
]


@pytest.mark.parametrize(("value", "reason"), BAD)
def test_r1_non_canonical_identity_rejected_naming_field(value: str, reason: str) -> None:
    with pytest.raises(InvalidInput) as info:
        PackName(value, field="packs[3].name")
    assert info.value.field == "packs[3].name"
    assert reason in info.value.message
    assert info.value.details["rule"] == "R1"


def test_r1_default_field_name_is_the_identity_kind() -> None:
    with pytest.raises(InvalidInput) as info:
        BusinessKey(" k")
    assert info.value.field == "key"


def test_r1_non_string_rejected() -> None:
    with pytest.raises(InvalidInput):
        PackName(42)


@pytest.mark.parametrize("value", ["x" * 255, "パック", "🙂pack", NFC, NFD, "a b", "Pack"])
def test_r1_canonical_identities_accepted_unchanged(value: str) -> None:
    assert str(PackName(value)) == value
    assert PackName(value).encode() == value.encode("utf-8")


@pytest.mark.parametrize("value", ["abc1234", "main", "v1.0", "A" * 40, "g" * 40, "a" * 41])
def test_r5_revision_must_be_full_lowercase_commit_id(value: str) -> None:
    with pytest.raises(InvalidInput) as info:
        SourceRevision(value)
    assert info.value.field == "revision"


def test_r5_full_commit_id_accepted() -> None:
    assert SourceRevision("0123456789abcdef0123456789abcdef01234567")


def test_r2_audience_parses_to_typed_pair() -> None:
    audience = Audience.parse("integration:erp:sync")
    assert audience.kind is AudienceKind.INTEGRATION
    assert audience.id == "erp:sync"
    assert str(audience) == "integration:erp:sync"


@pytest.mark.parametrize(
    ("text", "part"),
    [("erp-sync", "kind"), ("App:x", "kind"), ("workload:x", "kind")],
)
def test_r2_audience_kind_must_be_app_or_integration(text: str, part: str) -> None:
    with pytest.raises(InvalidInput) as info:
        Audience.parse(text)
    assert info.value.details["part"] == part


@pytest.mark.parametrize("text", ["app:", "app: x", "integration:x\n"])
def test_r1_audience_id_must_be_canonical(text: str) -> None:
    with pytest.raises(InvalidInput) as info:
        Audience.parse(text, field="bindings[0].audience")
    assert info.value.field == "bindings[0].audience.id"


def test_r2_composite_keys_are_typed_tuples_not_joined_strings() -> None:
    # "a|b" + "c" and "a" + "b|c" collide when joined with "|"; typed tuples do not.
    left = ComponentRef(PackName("a|b"), ComponentKind("c"), BusinessKey("k"))
    right = ComponentRef(PackName("a"), ComponentKind("b|c"), BusinessKey("k"))
    assert left != right
    assert len({left, right}) == 2


def test_r1_control_characters_are_exactly_unicode_category_cc() -> None:
    """Every code point is tried: an identity is refused for a control character exactly
    when Unicode's database calls it Cc, and the message names the first one's index."""
    refused, cc = [], []
    for point in range(sys.maxunicode + 1):
        char = chr(point)
        problem = identity_problem(f"a{char}b")
        if problem is not None and problem.startswith("must not contain control"):
            assert problem.endswith(f"(U+{point:04X} at 1)"), problem
            refused.append(point)
        if unicodedata.category(char) == "Cc":
            cc.append(point)
    assert refused == cc
    assert len(cc) == 65
