"""R29 (issue 28 item 6): the pure rule a client applies to a key rotation statement.

Given its pinned log keys and a rotation statement (a signed note by the old key), a
client gets the new key set — the old key valid until the statement's ``until``, the new
one without end — or INTEGRITY naming the reason, and its keys stay as they were.
"""

from __future__ import annotations

import pytest

from domain.errors import IntegrityFailure, InvalidInput
from domain.key_rotation import PinnedKey, Rotation, apply_rotation, rotation_statement
from domain.notes import SignerKey

ORIGIN = "catalog-ledger/00112233445566778899aabbccddeeff"
NOW = 1_800_000_000


@pytest.fixture(scope="module")
def keys() -> tuple[SignerKey, SignerKey, SignerKey]:
    return SignerKey.generate(ORIGIN), SignerKey.generate(ORIGIN), SignerKey.generate("other")


def _reason(pinned: object, statement: str, *, origin: str = ORIGIN, now: int = NOW) -> str:
    with pytest.raises(IntegrityFailure) as caught:
        apply_rotation(pinned, statement, origin=origin, now=now)  # type: ignore[arg-type]
    return str(caught.value.details["reason"])


def test_r29_a_rotation_by_the_pinned_key_adds_the_new_key_and_bounds_the_old(
    keys: tuple[SignerKey, SignerKey, SignerKey],
) -> None:
    old, new, other = keys
    statement = rotation_statement(ORIGIN, old, new.verifier, NOW + 60)
    assert statement.split("\n")[:5] == [
        "catalog-ledger key rotation v1",
        f"origin {ORIGIN}",
        f"old {old.verifier.text()}",
        f"new {new.verifier.text()}",
        f"until {NOW + 60}",
    ]
    assert Rotation.parse(statement).until == NOW + 60
    after = apply_rotation([other.verifier, old.verifier], statement, origin=ORIGIN, now=NOW)
    assert after == (
        PinnedKey(other.verifier),
        PinnedKey(old.verifier, NOW + 60),
        PinnedKey(new.verifier),
    )
    assert [k.valid_at(NOW + 61) for k in after] == [True, False, True]
    # After the overlap the old key signs nothing a client accepts, rotations included.
    third = rotation_statement(ORIGIN, old, other.verifier, NOW + 600)
    assert _reason(after, third, now=NOW + 61) == "not_pinned"
    # The new key announces the next one.
    nxt = rotation_statement(ORIGIN, new, other.verifier, NOW + 600)
    assert apply_rotation(after, nxt, origin=ORIGIN, now=NOW + 61)[-1] == PinnedKey(other.verifier)


def test_r29_a_rotation_is_refused_for_each_reason_and_nothing_changes(
    keys: tuple[SignerKey, SignerKey, SignerKey],
) -> None:
    old, new, other = keys
    good = rotation_statement(ORIGIN, old, new.verifier, NOW + 60)
    pinned = [old.verifier]
    assert _reason(pinned, good, origin=ORIGIN + "/catalog") == "wrong_origin"
    assert _reason(pinned, good, now=NOW + 61) == "expired"
    assert _reason([other.verifier], good) == "not_pinned"
    # A forger's statement naming the pinned key as old, signed by another key.
    forged = other.sign(Rotation(ORIGIN, old.verifier, other.verifier, NOW + 60).body())
    assert _reason(pinned, forged) == "no_signature"
    body, _, signature = good.partition("\n\n")
    tampered = body.replace(f"until {NOW + 60}", f"until {NOW + 99}") + "\n\n" + signature
    assert _reason(pinned, tampered) == "bad_signature"
    assert _reason(pinned, body + "\n") == "no_signature"
    assert _reason(pinned, "catalog-ledger key rotation v2\n") == "malformed_rotation"
    assert pinned == [old.verifier]


def test_r29_a_rotation_to_the_same_key_or_a_bad_origin_is_not_written(
    keys: tuple[SignerKey, SignerKey, SignerKey],
) -> None:
    old, _, _ = keys
    with pytest.raises(InvalidInput) as same:
        rotation_statement(ORIGIN, old, old.verifier, NOW)
    assert same.value.details["field"] == "new"
    with pytest.raises(InvalidInput) as bad:
        rotation_statement("two words", old, keys[1].verifier, NOW)
    assert bad.value.details["field"] == "origin"
