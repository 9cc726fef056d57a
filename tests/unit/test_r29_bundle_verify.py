"""R29: the client's verification of a proof bundle, step by step (``domain.bundle``).

Pure and fast: the bundles come from ``tests.support.bundles`` (real signatures,
cosignatures, Merkle and audience-map proofs, built in memory), so every test changes
exactly one part of an honest bundle and expects the error type and reason of the step
that must refuse it (LOG-FORMAT "Verifying a bundle").
"""

from __future__ import annotations

import base64
import copy
from typing import Any

import orjson
import pytest

from domain.bundle import CATALOG_ID, Accepted, TrustPolicy, verify_bundle
from domain.catalog import catalog_id
from domain.errors import IntegrityFailure, InvalidInput, Stale
from domain.notes import SignerKey, WitnessKey, WitnessSigner
from tests.support.bundles import NOW, CatalogLog, b64, make_view

APP, ERP = "app:shop", "integration:erp-sync"


@pytest.fixture(scope="module")
def log() -> CatalogLog:
    """Three revisions; the audiences' views change at each one."""
    log = CatalogLog()
    for n in range(1, 4):
        log.publish({APP: {"topic": f"orders-{n}"}, ERP: {"n": n}, "app:other": {"x": 1}})
    return log


def integrity(reason: str, *args: Any) -> None:
    with pytest.raises(IntegrityFailure) as caught:
        verify_bundle(*args)
    assert caught.value.details.get("reason") == reason, caught.value.to_json()


def current(log: CatalogLog, audience: str = APP, revision: int = 3) -> Any:
    return log.revisions[revision - 1].views[audience]


# -- the happy paths ------------------------------------------------------------------


def test_r29_an_honest_bundle_is_accepted_with_its_checkpoint(log: CatalogLog) -> None:
    got = verify_bundle(current(log), log.bundle(APP), log.policy(), None, NOW)
    assert got == Accepted(3, log.checkpoint().root, 3)


def test_r29_moving_forward_needs_and_checks_a_consistency_proof(log: CatalogLog) -> None:
    policy = log.policy()
    first = verify_bundle(current(log, APP, 1), log.bundle(APP, size=1), policy, None, NOW)
    assert first == Accepted(1, log.checkpoint(1).root, 1)
    bundle = log.bundle(APP, since_size=1)
    assert verify_bundle(current(log), bundle, policy, first, NOW) == Accepted(
        3, log.checkpoint().root, 3
    )
    # The same head again needs no proof, and keeps the state.
    kept = Accepted(3, log.checkpoint().root, 3)
    assert verify_bundle(current(log), log.bundle(APP), policy, kept, NOW) is kept


# -- 1. origin and the log's signature ----------------------------------------------------


def test_r29_a_checkpoint_of_another_origin_is_wrong_origin(log: CatalogLog) -> None:
    other = copy.copy(log)
    other.origin = log.origin.replace("/catalog", "/other")
    integrity("wrong_origin", current(log), other.bundle(APP), log.policy(), None, NOW)


def test_r29_a_bad_log_signature_is_bad_signature(log: CatalogLog) -> None:
    note = log.note()
    raw = note.split("\n\n", 1)[1].splitlines()[0].rsplit(" ", 1)[1]  # the log's line
    decoded = bytearray(base64.b64decode(raw))
    decoded[-1] ^= 1
    forged = note.replace(raw, b64(bytes(decoded)), 1)
    bundle = log.bundle(APP, note=forged)
    integrity("bad_signature", current(log), bundle, log.policy(), None, NOW)


def test_r29_a_checkpoint_signed_by_no_pinned_key_is_no_signature(log: CatalogLog) -> None:
    stranger = copy.copy(log)
    stranger.log_key = SignerKey.generate(log.log_key.name)  # same name, another key
    bundle = log.bundle(APP, note=stranger.note())
    integrity("no_signature", current(log), bundle, log.policy(), None, NOW)
    unsigned = log.checkpoint().text()
    integrity("no_signature", current(log), log.bundle(APP, note=unsigned), log.policy(), None, NOW)


# -- 2. cosignatures ------------------------------------------------------------------------


def test_r29_an_invalid_cosignature_by_a_pinned_witness_is_bad_cosignature(
    log: CatalogLog,
) -> None:
    note = log.note()
    lines = note.split("\n")
    witness_line = next(i for i, line in enumerate(lines) if log.witnesses[1].name in line)
    dash, name, raw = lines[witness_line].split(" ")
    decoded = bytearray(base64.b64decode(raw))
    decoded[11] ^= 1  # the timestamp: the signature no longer covers it
    lines[witness_line] = f"{dash} {name} {b64(bytes(decoded))}"
    bundle = log.bundle(APP, note="\n".join(lines))
    integrity("bad_cosignature", current(log), bundle, log.policy(), None, NOW)


def test_r29_threshold_minus_one_cosignatures_is_too_few(log: CatalogLog) -> None:
    note = log.note(times=[NOW, None, None])  # k - 1 = 1 valid cosignature for k = 2
    # An unpinned witness's valid cosignature counts for nothing.
    stranger = WitnessSigner.generate("stranger.example")
    note += stranger.cosign(log.checkpoint().text(), NOW) + "\n"
    bundle = log.bundle(APP, note=note)
    integrity("too_few_cosignatures", current(log), bundle, log.policy(), None, NOW)
    # Two lines by one witness are one witness.
    twice = log.note(times=[NOW, None, None])
    twice += log.witnesses[0].cosign(log.checkpoint().text(), NOW - 1) + "\n"
    bundle = log.bundle(APP, note=twice)
    integrity("too_few_cosignatures", current(log), bundle, log.policy(), None, NOW)
    assert verify_bundle(current(log), log.bundle(APP), log.policy(threshold=3), None, NOW)


# -- 3. the revision event ----------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"aggregate_id": "00000000-0000-0000-0000-000000000000"},
        {"topic": "catalog.published@1"},
        {"topic": "domain.catalog:Catalog.Published"},
        {"state_b64": "not base64!"},
    ],
)
def test_r29_a_revision_event_not_the_catalogs_v2_is_wrong_revision_event(
    log: CatalogLog, change: dict[str, str]
) -> None:
    bundle = log.bundle(APP)
    bundle["revision_event"].update(change)
    integrity("wrong_revision_event", current(log), bundle, log.policy(), None, NOW)


def test_r29_a_revision_event_of_another_revision_is_wrong_revision_event(
    log: CatalogLog,
) -> None:
    bundle = log.bundle(APP, size=2)  # revision 2's event, for a view of revision 3
    integrity("wrong_revision_event", current(log), bundle, log.policy(), None, NOW)
    state = orjson.loads(base64.b64decode(bundle["revision_event"]["state_b64"]))
    state["audiences_root"] = None
    bundle["revision_event"]["state_b64"] = b64(orjson.dumps(state))
    view2 = current(log, APP, 2)
    integrity("wrong_revision_event", view2, bundle, log.policy(), None, NOW)


# -- 4. current: the last leaf of the checkpoint -------------------------------------------


def test_r29_an_older_revision_under_a_newer_checkpoint_is_not_current(log: CatalogLog) -> None:
    bundle = log.bundle(APP, revision=2, size=3)  # a true inclusion, but not the last leaf
    integrity("not_current", current(log, APP, 2), bundle, log.policy(), None, NOW)


def test_r29_a_bad_inclusion_proof_is_bad_inclusion(log: CatalogLog) -> None:
    bundle = log.bundle(APP)
    bundle["inclusion"][0] = b64(bytes(32))
    integrity("bad_inclusion", current(log), bundle, log.policy(), None, NOW)
    # A changed revision event (same revision, other bytes) is not the logged leaf.
    bundle = log.bundle(APP)
    state = orjson.loads(base64.b64decode(bundle["revision_event"]["state_b64"]))
    state["content_digest"] = "d" * 64
    bundle["revision_event"]["state_b64"] = b64(orjson.dumps(state))
    integrity("bad_inclusion", current(log), bundle, log.policy(), None, NOW)


# -- 5. the audience's view ---------------------------------------------------------------


def test_r29_a_forged_redigested_view_is_bad_audience_proof(log: CatalogLog) -> None:
    forged = make_view(APP, 3, {"topic": "orders-evil"})  # every digest recomputed
    integrity("bad_audience_proof", forged, log.bundle(APP), log.policy(), None, NOW)


def test_r29_another_audiences_view_is_bad_audience_proof(log: CatalogLog) -> None:
    integrity("bad_audience_proof", current(log, ERP), log.bundle(APP), log.policy(), None, NOW)
    # The other audience's view under its own name with APP's map proof: still refused.
    theirs = current(log, ERP)
    integrity("bad_audience_proof", theirs, log.bundle("app:other"), log.policy(), None, NOW)


# -- 6. freshness -----------------------------------------------------------------------------


def test_r29_a_head_cosigned_longer_ago_than_max_age_is_stale_freshness(log: CatalogLog) -> None:
    policy = log.policy(max_age=3600)
    old = log.bundle(APP, note=log.note(times=[NOW - 3601] * 3))
    with pytest.raises(Stale) as caught:
        verify_bundle(current(log), old, policy, None, NOW)
    assert caught.value.details["axis"] == "freshness"
    assert caught.value.details["served"] == "2026-12-04T19:59:59Z"
    assert caught.value.details["required"] == "2026-12-04T20:00:00Z"
    # At exactly the limit it is fresh.
    edge = log.bundle(APP, note=log.note(times=[NOW - 3600] * 3))
    assert verify_bundle(current(log), edge, policy, None, NOW).size == 3


def test_r29_freshness_is_the_threshold_th_newest_cosignature(log: CatalogLog) -> None:
    policy = log.policy(threshold=2, max_age=60)
    one_fresh = log.bundle(APP, note=log.note(times=[NOW, NOW - 3600, None]))
    with pytest.raises(Stale) as caught:
        verify_bundle(current(log), one_fresh, policy, None, NOW)
    assert caught.value.details["axis"] == "freshness"
    two_fresh = log.bundle(APP, note=log.note(times=[NOW - 3600, NOW - 10, NOW]))
    assert verify_bundle(current(log), two_fresh, policy, None, NOW).size == 3


# -- 7. rollback and split views -------------------------------------------------------------


def test_r29_a_smaller_tree_than_accepted_is_stale_checkpoint(log: CatalogLog) -> None:
    kept = Accepted(3, log.checkpoint().root, 3)
    lagging = log.bundle(APP, size=2)
    with pytest.raises(Stale) as caught:
        verify_bundle(current(log, APP, 2), lagging, log.policy(), kept, NOW)
    assert caught.value.details == {"axis": "checkpoint", "required": 3, "served": 2}


def test_r29_the_same_size_with_another_root_is_inconsistent_tree(log: CatalogLog) -> None:
    split = CatalogLog(log_key=log.log_key, witnesses=log.witnesses)
    for n in range(1, 4):
        split.publish({APP: {"topic": f"orders-{n}"}, ERP: {"n": -n}})
    # Every signature and proof of the split log is valid on its own.
    assert verify_bundle(current(split), split.bundle(APP), log.policy(), None, NOW)
    kept = Accepted(3, log.checkpoint().root, 3)
    integrity("inconsistent_tree", current(split), split.bundle(APP), log.policy(), kept, NOW)
    # And a larger split tree cannot prove it extends the accepted one.
    split.publish({APP: {"topic": "orders-4"}})
    bundle = split.bundle(APP, since_size=3)
    integrity("inconsistent_tree", current(split, APP, 4), bundle, log.policy(), kept, NOW)


def test_r29_moving_forward_without_a_consistency_proof_is_missing_consistency(
    log: CatalogLog,
) -> None:
    kept = Accepted(1, log.checkpoint(1).root, 1)
    policy = log.policy()
    integrity("missing_consistency", current(log), log.bundle(APP), policy, kept, NOW)
    from_two = log.bundle(APP, since_size=2)  # a proof from another size than the kept one
    integrity("missing_consistency", current(log), from_two, policy, kept, NOW)
    failing = log.bundle(APP, since_size=1)
    failing["consistency"]["proof"][0] = b64(bytes(32))
    integrity("inconsistent_tree", current(log), failing, policy, kept, NOW)


# -- order, shape --------------------------------------------------------------------------


def test_r29_the_steps_run_in_order(log: CatalogLog) -> None:
    # Wrong origin (1) and too few cosignatures (2) and a forged view (5): step 1 speaks.
    other = copy.copy(log)
    other.origin = "elsewhere/catalog"
    bundle = other.bundle(APP, note=other.note(times=[None, None, None]))
    forged = make_view(APP, 3, {"forged": True})
    integrity("wrong_origin", forged, bundle, log.policy(), None, NOW)
    # A forged view (5) under a stale head (6) of a rolled-back tree (7): step 5 speaks.
    kept = Accepted(3, log.checkpoint().root, 3)
    old = log.bundle(APP, size=2, note=log.note(2, times=[NOW - 10**6] * 3))
    integrity("bad_audience_proof", make_view(APP, 2, {}), old, log.policy(), kept, NOW)


@pytest.mark.parametrize(
    ("bundle", "field"),
    [
        (None, "$.proof"),
        ({"format": 2}, "$.proof.format"),
        ({"checkpoint": 5}, "$.proof.checkpoint"),
        ({"inclusion": ["AAAA"]}, "$.proof.inclusion[0]"),
        ({"audience": "x"}, "$.proof.audience"),
        ({"consistency": {"from_size": 0, "proof": []}}, "$.proof.consistency"),
        ({"checkpoint": "not a checkpoint"}, "$.proof.checkpoint"),
    ],
)
def test_r29_a_malformed_bundle_is_integrity_naming_the_field(
    log: CatalogLog, bundle: dict[str, Any] | None, field: str
) -> None:
    whole = None if bundle is None else log.bundle(APP) | bundle
    with pytest.raises(IntegrityFailure) as caught:
        verify_bundle(current(log), whole, log.policy(), None, NOW)
    assert caught.value.details == {"reason": "malformed_proof", "field": field}


def test_r29_a_note_not_shaped_as_a_signed_checkpoint_is_malformed(log: CatalogLog) -> None:
    body = log.checkpoint().text()
    leading_zero = body.replace("\n3\n", "\n03\n")
    junk_line = log.note() + "\u2014 witness0.example not-base64!\n"
    # The shape is checked before step 1: a junk line beside another origin is malformed.
    elsewhere = copy.copy(log)
    elsewhere.origin = "elsewhere/catalog"
    junk_elsewhere = elsewhere.note() + "\u2014 witness0.example not-base64!\n"
    unsigned_zero = log.note(body=leading_zero, times=[None, None, None])
    notes = (unsigned_zero, junk_line, log.note().rstrip("\n"), junk_elsewhere)
    for note in notes:
        with pytest.raises(IntegrityFailure) as caught:
            verify_bundle(current(log), log.bundle(APP, note=note), log.policy(), None, NOW)
        assert caught.value.details == {"reason": "malformed_proof", "field": "$.proof.checkpoint"}


# -- the policy and the state --------------------------------------------------------------


def test_r29_the_catalog_id_is_the_catalog_aggregates() -> None:
    assert catalog_id() == CATALOG_ID


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"origin": ""}, "origin"),
        ({"log_keys": []}, "log_keys"),
        ({"log_keys": ["nope"]}, "log_keys[0]"),
        ({"witnesses": [{"key": "w+00000000+AAAA"}]}, "witnesses[0].key"),
        ({"threshold": 0}, "threshold"),
        ({"threshold": 4}, "threshold"),
        ({"threshold": True}, "threshold"),
        ({"max_age_seconds": 0}, "max_age_seconds"),
        ({"extra": 1}, "extra"),
    ],
)
def test_r29_a_bad_policy_field_is_invalid_naming_its_path(
    log: CatalogLog, change: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        TrustPolicy.parse(log.policy_json() | change)
    assert caught.value.field == field


def test_r29_a_policy_refuses_duplicate_witnesses_and_log_keys(log: CatalogLog) -> None:
    document = log.policy_json()
    document["witnesses"][1]["key"] = document["witnesses"][0]["key"]
    with pytest.raises(InvalidInput) as caught:
        TrustPolicy.parse(document)
    assert caught.value.field == "witnesses[1].key"
    # The same public key under another name counts once too (cosignature/v1 does not
    # sign the name): refused.
    renamed = WitnessSigner("renamed.example", log.witnesses[0].seed)
    document = log.policy_json()
    document["witnesses"][2]["key"] = renamed.verifier.text()
    with pytest.raises(InvalidInput) as caught:
        TrustPolicy.parse(document)
    assert caught.value.field == "witnesses[2].key"
    document = log.policy_json()
    document["log_keys"] *= 2
    with pytest.raises(InvalidInput) as caught:
        TrustPolicy.parse(document)
    assert caught.value.field == "log_keys[1]"
    # One name may pin two keys (a witness's old and new key): each key counts once.
    document = log.policy_json()
    document["witnesses"][1]["key"] = WitnessSigner.generate(log.witnesses[0].name).verifier.text()
    assert len(TrustPolicy.parse(document).witnesses) == 3
    # A log key (alg 0x01) is no witness key (0x04).
    document = log.policy_json()
    document["witnesses"][0]["key"] = log.log_key.verifier.text()
    with pytest.raises(InvalidInput) as caught:
        TrustPolicy.parse(document)
    assert caught.value.field == "witnesses[0].key"


def test_r29_a_policy_round_trips_through_json(log: CatalogLog) -> None:
    policy = log.policy(threshold=3, max_age=30)
    assert TrustPolicy.parse(policy.to_json()) == policy
    assert policy.witness_urls[1] == "http://127.0.0.1:9001"
    vkey = log.witnesses[2].verifier.text()
    assert WitnessKey.parse(vkey) == policy.witnesses[2]


def test_r29_the_kept_state_round_trips_and_a_bad_one_is_integrity(log: CatalogLog) -> None:
    kept = Accepted(3, log.checkpoint().root, 3)
    document = orjson.loads(orjson.dumps(kept.to_json(log.origin)))
    assert Accepted.from_json(document, log.origin) == kept
    for bad, field in [
        ([], "$"),
        (document | {"format": 2}, "$"),
        (document | {"origin": "elsewhere/catalog"}, "origin"),
        (document | {"size": 0}, "size"),
        (document | {"revision": 2}, "revision"),
        (document | {"root": "AAAA"}, "root"),
    ]:
        with pytest.raises(IntegrityFailure) as caught:
            Accepted.from_json(bad, log.origin)
        assert caught.value.details == {"reason": "bad_state", "field": field}
