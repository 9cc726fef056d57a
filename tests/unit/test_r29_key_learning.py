"""R29 (issue 28 item 6): the pure rule by which a client learns a key rotation from the
log (``domain.key_rotation.learn_rotations``, LOG-FORMAT "Learning a rotation from the
log").

A small main log is built in memory: a few events, then a ``log_key.rotated`` event; its
checkpoint is signed by the old key and cosigned by witnesses. The client's keys change
only when the note is signed by a key it pins now, cosigned by k pinned witnesses, and
the event is in that tree; otherwise INTEGRITY names the reason and nothing changes.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from domain import merkle
from domain.bundle import TrustPolicy
from domain.digests import event_id
from domain.errors import IntegrityFailure
from domain.key_rotation import PinnedKey, Rotation, learn_rotations, rotation_statement
from domain.notes import Checkpoint, SignerKey, WitnessSigner, add_cosignatures, key_id
from domain.origin import log_identity_id
from ledger.client_keys import read_state, state_document, write_state

MAIN = "catalog-ledger/00112233445566778899aabbccddeeff"
NOW = 1_800_000_000
OLD, NEW, OTHER = (SignerKey.generate("log") for _ in range(3))
WITNESSES = [WitnessSigner.generate(f"w{n}") for n in range(3)]
TOPIC = b"log_key.rotated@1"


def _document(
    *,
    origin: str = MAIN,
    signer: SignerKey = OLD,
    cosigners: int = 3,
    leaf_shift: int = 0,
    topic: bytes = TOPIC,
    statement: str | None = None,
) -> dict[str, Any]:
    statement = statement or rotation_statement(MAIN, OLD, NEW.verifier, NOW + 60)
    ident = log_identity_id().bytes
    state = json.dumps({"statement": statement}).encode()
    ids = [bytes([n]) * 32 for n in range(5)] + [event_id(ident, 2, topic, state)]
    leaves = [merkle.leaf_hash(i) for i in ids]
    body = Checkpoint(origin, len(ids), merkle.root(leaves)).text()
    note = signer.sign(body)
    note = add_cosignatures(note, [w.cosign(body, NOW - 5) for w in WITNESSES[:cosigners]])
    return {
        "format": 1,
        "checkpoint": note,
        "rotations": [
            {
                "event": {
                    "aggregate_id": str(log_identity_id()),
                    "version": 2,
                    "topic": topic.decode(),
                    "state_b64": base64.b64encode(state).decode(),
                },
                "leaf_index": 5 + leaf_shift,
                "inclusion": [
                    base64.b64encode(h).decode() for h in merkle.inclusion_proof(leaves, 5, 6)
                ],
            }
        ],
    }


def _learn(document: object, pinned: tuple[Any, ...] = (OLD.verifier,), now: int = NOW) -> Any:
    return learn_rotations(
        pinned,
        document,
        origin=MAIN,
        witnesses=[w.verifier for w in WITNESSES],
        threshold=2,
        now=now,
    )


def _reason(document: object, **kwargs: Any) -> dict[str, Any]:
    with pytest.raises(IntegrityFailure) as caught:
        _learn(document, **kwargs)
    return dict(caught.value.details)


def test_r29_a_witnessed_rotation_in_the_log_is_learned_once() -> None:
    learned = _learn(_document())
    assert learned == (PinnedKey(OLD.verifier, NOW + 60), PinnedKey(NEW.verifier))
    assert _learn(_document(), pinned=learned) == learned  # learned before: skipped
    # A client whose policy pins both keys: the old one is bounded all the same, even
    # after the overlap (it only narrows what is trusted).
    both = (OLD.verifier, NEW.verifier)
    bounded = (PinnedKey(OLD.verifier, NOW + 60), PinnedKey(NEW.verifier))
    assert _learn(_document(), pinned=both) == bounded
    assert _learn(_document(), pinned=both, now=NOW + 61) == bounded
    empty: dict[str, Any] = {"format": 1, "checkpoint": None, "rotations": []}
    assert _learn(empty) == (PinnedKey(OLD.verifier),)


def test_r29_a_rotation_not_witnessed_or_not_in_the_tree_is_refused() -> None:
    assert _reason(_document(cosigners=1)) == {
        "reason": "too_few_cosignatures",
        "cosigned": 1,
        "threshold": 2,
    }
    assert _reason(_document(signer=OTHER))["reason"] == "no_signature"
    assert _reason(_document(origin=MAIN + "/catalog"))["reason"] == "wrong_origin"
    assert _reason(_document(leaf_shift=-1))["reason"] == "bad_inclusion"
    assert _reason(_document(topic=b"log.named@1"))["reason"] == "not_a_rotation"
    # Signed by the old key after its overlap: that key is not valid now.
    learned = _learn(_document())
    assert _reason(_document(), pinned=(learned[0],), now=NOW + 61)["reason"] == "no_signature"
    # The statement is past its overlap: the old key no longer announces a successor.
    assert _reason(_document(), now=NOW + 61)["reason"] == "expired"
    # A statement naming the pinned key as old, signed by another key.
    forged = OTHER.sign(Rotation(MAIN, OLD.verifier, NEW.verifier, NOW + 60).body())
    assert _reason(_document(statement=forged)) == {"reason": "no_signature"}


def test_r29_a_rotations_body_not_shaped_like_one_names_the_json_path() -> None:
    good = _document()
    assert _reason({**good, "format": 2})["field"] == "$"
    assert _reason({**good, "rotations": [{"leaf_index": 5}]})["field"] == "$.rotations[0].event"
    bad = json.loads(json.dumps(good))
    bad["rotations"][0]["inclusion"] = ["AA=="]
    assert _reason(bad) == {
        "reason": "malformed_rotations",
        "field": "$.rotations[0]",
    }
    assert _reason({**good, "checkpoint": None})["field"] == "$.checkpoint"


# -- the client's key ring and its state file (ledger.client_keys) -----------------------


def _policy(*keys: SignerKey) -> TrustPolicy:
    return TrustPolicy.parse(
        {
            "origin": MAIN + "/catalog",
            "log_keys": [k.verifier.text() for k in keys or (OLD,)],
            "witnesses": [{"key": w.verifier.text()} for w in WITNESSES],
            "threshold": 2,
            "max_age_seconds": 3600,
        }
    )


def test_r29_learned_keys_survive_a_restart_and_bound_what_a_bundle_may_be_signed_by(
    tmp_path: Path,
) -> None:
    policy, path = _policy(), tmp_path / "state.json"
    accepted, ring = read_state(path, policy)
    assert (accepted, ring.keys) == (None, (PinnedKey(OLD.verifier),))
    assert ring.learn(_document(), NOW) is True
    assert ring.learn(_document(), NOW) is False  # nothing new
    write_state(path, state_document(policy, None, ring))  # learned before any bundle
    accepted, again = read_state(path, policy)
    assert accepted is None and again.keys == ring.keys
    assert again.policy(NOW).log_keys == (OLD.verifier, NEW.verifier)
    assert again.policy(NOW + 61).log_keys == (NEW.verifier,)  # the overlap is over
    # A new key in a signature line of a bundle's checkpoint is a hint; a witness's not.
    body = Checkpoint(MAIN + "/catalog", 1, bytes(32)).text()
    note = add_cosignatures(OTHER.sign(body), [WITNESSES[0].cosign(body, NOW)])
    assert again.unknown_signers({"checkpoint": note}) == {
        (OTHER.name, key_id(OTHER.name, OTHER.verifier.public))
    }
    # A kept key that does not parse is INTEGRITY bad_state naming it, never a fresh start.
    document = orjson.loads(path.read_bytes())
    document["log_keys"][1]["until"] = "soon"
    path.write_bytes(orjson.dumps(document))
    with pytest.raises(IntegrityFailure) as bad:
        read_state(path, policy)
    assert bad.value.details == {"reason": "bad_state", "field": "log_keys[1]"}


def test_r29_a_new_policy_replaces_the_keys_learned_under_the_old_one(tmp_path: Path) -> None:
    """A compromised key is re-pinned out of band (README "Keys and disaster recovery"):
    keys the client learned from the log under the old policy must not outlive it, else a
    key learned from a rotation the thief announced would still be trusted."""
    path = tmp_path / "state.json"
    _, ring = read_state(path, _policy())
    assert ring.learn(_document(), NOW) is True  # NEW learned under the policy pinning OLD
    write_state(path, state_document(_policy(), None, ring))
    assert NEW.verifier in read_state(path, _policy())[1].policy(NOW).log_keys
    repinned = _policy(OTHER)  # the operators' new policy: OTHER alone
    _, after = read_state(path, repinned)
    assert after.policy(NOW).log_keys == (OTHER.verifier,)


def test_r29_a_witness_pinned_with_two_keys_counts_once_for_a_rotation() -> None:
    """A witness is its name (as for bundles, ``domain.notes.witnessed_times``): one pinned
    with its old and new key that cosigned with both is one of the k witnesses, not two."""
    renewed = WitnessSigner.generate("w0")  # w0's second key, pinned alongside its first
    document = _document(cosigners=1)
    body = document["checkpoint"].partition("\n\n")[0] + "\n"
    document["checkpoint"] = add_cosignatures(document["checkpoint"], [renewed.cosign(body, NOW)])
    pinned = [w.verifier for w in WITNESSES] + [renewed.verifier]
    with pytest.raises(IntegrityFailure) as caught:
        learn_rotations(
            (OLD.verifier,), document, origin=MAIN, witnesses=pinned, threshold=2, now=NOW
        )
    assert caught.value.details == {"reason": "too_few_cosignatures", "cosigned": 1, "threshold": 2}
    # A second witness's cosignature makes two.
    document["checkpoint"] = add_cosignatures(
        document["checkpoint"], [WITNESSES[1].cosign(body, NOW)]
    )
    learned = learn_rotations(
        (OLD.verifier,), document, origin=MAIN, witnesses=pinned, threshold=2, now=NOW
    )
    assert learned[-1] == PinnedKey(NEW.verifier)


def test_r29_a_rotations_body_is_checked_without_assert() -> None:
    """Input checks are explicit (``python -O`` strips asserts): a non-text ``state_b64``
    is ``malformed_rotations`` naming the item, and the module holds no ``assert``."""
    import ast
    import inspect

    import domain.key_rotation

    bad = json.loads(json.dumps(_document()))
    bad["rotations"][0]["event"]["state_b64"] = 5
    assert _reason(bad) == {"reason": "malformed_rotations", "field": "$.rotations[0]"}
    tree = ast.parse(inspect.getsource(domain.key_rotation))
    assert [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assert)] == []
