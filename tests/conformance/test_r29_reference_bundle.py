"""R29: an independent verifier of proof bundles, written from LOG-FORMAT.md and C2SP alone.

``tests/support/reference_verifier.verify_bundle`` follows LOG-FORMAT "Verifying a
bundle"; ``tests/support/reference_bundle`` builds a catalog log, its views, the audience
map and a signed, cosigned checkpoint from the spec (fixed Ed25519 seeds). A bundle
verifies; every tampered variant is refused with the reason LOG-FORMAT names, or STALE.
Neither module imports the project; one test checks the project's domain code computes
the same digests, roots, proofs and notes, so the two cannot drift apart unseen.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.test_r23_log_format import (
    SPEC_ONLY,
    export_lines,
    realistic,
    reference_imports,
)
from tests.support import reference_audience_map as amap
from tests.support import reference_bundle as rb
from tests.support import reference_catalog_log as catalog_log
from tests.support import reference_verifier as ref
from tests.support.cli_inprocess import cli, cli_json
from tests.support.lifecycle_support import World

ROOT = Path(__file__).resolve().parents[2]
Case = Callable[[], tuple[dict[str, Any], dict[str, Any] | None]]

MAIN = rb.Catalog(3)
FORK = rb.Catalog(4, fork=True)  # the same revisions 1 and 2, another 3, then a 4
CRM, ERP, CAFE = rb.AUDIENCES


def accepted(revision: int, catalog: rb.Catalog = MAIN) -> dict[str, Any]:
    return ref.verify_bundle(catalog.bundle(revision=revision), rb.policy(), None, rb.NOW)


def verify(body: dict[str, Any], kept: dict[str, Any] | None = None, **policy: Any) -> Any:
    return ref.verify_bundle(body, {**rb.policy(), **policy}, kept, rb.NOW)


def edited(body: dict[str, Any], edit: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    body = copy.deepcopy(body)
    edit(body)
    return body


def flip(text: str, at: int = 10) -> str:
    raw = bytearray(base64.b64decode(text))
    raw[at] ^= 1
    return base64.b64encode(bytes(raw)).decode()


def with_note(**note: Any) -> dict[str, Any]:
    return MAIN.bundle(checkpoint=rb.note(3, MAIN.root(3), **note))


def relined(body: dict[str, Any], edit: Callable[[list[str]], list[str]]) -> dict[str, Any]:
    """The bundle with the checkpoint note's signature lines edited."""
    head, _, lines = body["proof"]["checkpoint"].partition("\n\n")
    body["proof"]["checkpoint"] = head + "\n\n" + "".join(edit(lines.splitlines(True)))
    return body


def line_edit(n: int) -> Callable[[list[str]], list[str]]:
    def edit(lines: list[str]) -> list[str]:
        dash, name, signature = lines[n].split(" ")
        lines[n] = f"{dash} {name} {flip(signature.strip(), 40)}\n"
        return lines

    return edit


def state_edit(**changes: Any) -> Callable[[dict[str, Any]], object]:
    def edit(body: dict[str, Any]) -> None:
        event = body["proof"]["revision_event"]
        state = json.loads(base64.b64decode(event["state_b64"]))
        event["state_b64"] = rb.b64(json.dumps({**state, **changes}).encode())

    return edit


def forged_with_its_own_map() -> dict[str, Any]:
    """A re-digested view, the audience map rebuilt over it and the revision event's
    audiences_root changed to match: only the catalog log can tell."""
    body = edited(MAIN.bundle(), lambda b: b["facts"][0]["payload"].update(url="https://evil"))
    rb.redigest(body)
    views = {**MAIN.views[2], CRM: body}
    leaves = rb.map_leaves(views)
    forged_root = amap.root(leaves)
    state_edit(audiences_root=forged_root.hex())(body)
    body["proof"]["audience"] = [rb.b64(h) for h in rb.audience_path(leaves, amap.key(*CRM))]
    return body


def forged(
    body: dict[str, Any], *, redigest: bool = True, keep_audience_digest: bool = False
) -> dict[str, Any]:
    """A fact's payload rewritten; its digests recomputed, as a forger would."""
    original = body["audience_digest"]
    body["facts"][1]["payload"]["url"] = "https://evil.example"
    if redigest:
        rb.redigest(body)
    if keep_audience_digest:
        body["audience_digest"] = original
    return body


def restamped(line: str) -> str:
    """A cosignature line with its 8-byte timestamp changed (the signature kept)."""
    dash, name, signature = line.split(" ")
    raw = bytearray(base64.b64decode(signature))
    raw[11] ^= 1  # the timestamp's low byte: key id is bytes 0-3, the timestamp 4-11
    return f"{dash} {name} {base64.b64encode(bytes(raw)).decode()}\n"


def relabelled(body: dict[str, Any]) -> None:
    body["audience"] = "app:CRM"  # erp-sync's grants and facts, re-digested as CRM's
    rb.redigest(body)


INTEGRITY: dict[str, tuple[Case, str]] = {
    "a forged fact": (lambda: (forged(MAIN.bundle(), redigest=False), None), "bad_fact_digest"),
    "a forged fact, re-digested, under the old audience digest": (
        lambda: (forged(MAIN.bundle(), keep_audience_digest=True), None),
        "bad_audience_digest",
    ),
    "a re-digested view": (lambda: (forged(MAIN.bundle()), None), "bad_audience_proof"),
    "another audience's view, re-digested under this audience": (
        lambda: (edited(MAIN.bundle(ERP), relabelled), None),
        "bad_audience_proof",
    ),
    "this view with another audience's map proof": (
        lambda: (
            edited(
                MAIN.bundle(),
                lambda b: b["proof"].update(audience=MAIN.bundle(CAFE)["proof"]["audience"]),
            ),
            None,
        ),
        "bad_audience_proof",
    ),
    "a re-digested view with a matching audiences_root": (
        lambda: (forged_with_its_own_map(), None),
        "bad_inclusion",
    ),
    "another store's catalog log": (
        lambda: (with_note(origin="catalog-ledger/5eed0000000000000000000000000002/catalog"), None),
        "wrong_origin",
    ),
    "the main log's origin": (lambda: (with_note(origin=rb.MAIN_ORIGIN), None), "wrong_origin"),
    "a bad log signature": (lambda: (relined(MAIN.bundle(), line_edit(0)), None), "bad_signature"),
    "a changed root under the log signature": (
        lambda: (
            edited(
                MAIN.bundle(),
                lambda b: b["proof"].update(
                    checkpoint=b["proof"]["checkpoint"].replace(
                        rb.b64(MAIN.root(3)), rb.b64(MAIN.root(2))
                    )
                ),
            ),
            None,
        ),
        "bad_signature",
    ),
    "no log signature": (lambda: (relined(MAIN.bundle(), lambda ls: ls[1:]), None), "no_signature"),
    "a signature by an unpinned key under the log's name": (
        lambda: (with_note(signers=[rb.Signer.of(rb.MAIN_ORIGIN, 99, 0x01)]), None),
        "no_signature",
    ),
    "a bad cosignature": (lambda: (relined(MAIN.bundle(), line_edit(2)), None), "bad_cosignature"),
    "a cosignature with a changed timestamp": (
        lambda: (relined(MAIN.bundle(), lambda ls: [ls[0], restamped(ls[1]), *ls[2:]]), None),
        "bad_cosignature",
    ),
    "one cosignature of the two required": (
        lambda: (with_note(cosigners=[(rb.WITNESSES[0], rb.NOW)]), None),
        "too_few_cosignatures",
    ),
    "one witness's cosignature twice": (
        lambda: (
            with_note(cosigners=[(rb.WITNESSES[0], rb.NOW), (rb.WITNESSES[0], rb.NOW - 1)]),
            None,
        ),
        "too_few_cosignatures",
    ),
    "an unpinned witness's cosignature": (
        lambda: (
            with_note(
                cosigners=[
                    (rb.WITNESSES[0], rb.NOW),
                    (rb.Signer.of("witness.example/w9", 99, 0x04), rb.NOW),
                ]
            ),
            None,
        ),
        "too_few_cosignatures",
    ),
    "an older revision's event under the current checkpoint": (
        lambda: (MAIN.bundle(revision=2, size=3), None),
        "not_current",
    ),
    "a revision event of another revision": (
        lambda: (edited(MAIN.bundle(), state_edit(revision=2)), None),
        "wrong_revision_event",
    ),
    "a revision event without a 64-hex audiences_root": (
        lambda: (edited(MAIN.bundle(), state_edit(audiences_root="00" * 31)), None),
        "wrong_revision_event",
    ),
    "a schema v1 revision event": (
        lambda: (
            edited(
                MAIN.bundle(),
                lambda b: b["proof"]["revision_event"].update(topic="catalog.published@1"),
            ),
            None,
        ),
        "wrong_revision_event",
    ),
    "an event of another aggregate": (
        lambda: (
            edited(
                MAIN.bundle(),
                lambda b: b["proof"]["revision_event"].update(
                    aggregate_id="00000000-0000-0000-0000-000000000000"
                ),
            ),
            None,
        ),
        "wrong_revision_event",
    ),
    "a revision event with audiences_root changed": (
        lambda: (edited(MAIN.bundle(), state_edit(audiences_root="ab" * 32)), None),
        "bad_inclusion",
    ),
    "a bad inclusion proof": (
        lambda: (
            edited(
                MAIN.bundle(),
                lambda b: b["proof"].update(inclusion=[flip(h) for h in b["proof"]["inclusion"]]),
            ),
            None,
        ),
        "bad_inclusion",
    ),
    "a split view: the same size, another root": (
        lambda: (FORK.bundle(revision=3), accepted(3)),
        "inconsistent_tree",
    ),
    "a split view: a larger tree that does not extend the kept one": (
        lambda: (FORK.bundle(revision=4, since=3), accepted(3)),
        "inconsistent_tree",
    ),
    "a bad consistency proof": (
        lambda: (
            edited(
                MAIN.bundle(since=2),
                lambda b: b["proof"]["consistency"].update(
                    proof=[flip(h) for h in b["proof"]["consistency"]["proof"]]
                ),
            ),
            accepted(2),
        ),
        "inconsistent_tree",
    ),
    "a truncated consistency proof": (
        lambda: (
            edited(MAIN.bundle(since=1), lambda b: b["proof"]["consistency"]["proof"].pop()),
            accepted(1),
        ),
        "inconsistent_tree",
    ),
    "a larger tree without a consistency proof": (
        lambda: (MAIN.bundle(), accepted(2)),
        "missing_consistency",
    ),
    "a consistency proof from another size": (
        lambda: (MAIN.bundle(since=1), accepted(2)),
        "missing_consistency",
    ),
}


def test_r29_reference_verifier_accepts_a_bundle_built_from_the_spec() -> None:
    for audience in rb.AUDIENCES:
        kept = verify(MAIN.bundle(audience))
        assert kept == {"size": 3, "root": rb.b64(MAIN.root(3)), "revision": 3}
    assert verify(MAIN.bundle(revision=1)) == {
        "size": 1,
        "root": rb.b64(MAIN.root(1)),
        "revision": 1,
    }


def test_r29_reference_verifier_moves_forward_only_along_a_consistency_proof() -> None:
    for since in (1, 2):
        kept = accepted(since)
        assert verify(MAIN.bundle(since=since), kept)["size"] == 3
    # The same (size, root) re-cosigned later: accepted as is, no proof needed.
    fresh = rb.note(3, MAIN.root(3), cosigners=[(w, rb.NOW) for w in rb.WITNESSES[1:]])
    assert verify(MAIN.bundle(checkpoint=fresh), accepted(3))["revision"] == 3
    # The fork's revisions 1 and 2 are the main log's: it extends a kept size 2.
    assert verify(FORK.bundle(revision=4, since=2), accepted(2))["size"] == 4


@pytest.mark.parametrize("case", sorted(INTEGRITY))
def test_r29_reference_verifier_refuses_each_tampered_bundle(case: str) -> None:
    build, reason = INTEGRITY[case]
    body, kept = build()
    before = copy.deepcopy(kept)
    with pytest.raises(ref.BundleRejected) as refused:
        verify(body, kept)
    assert refused.value.reason == reason, refused.value
    assert kept == before


def signed_body(body: str, *cosigners: tuple[rb.Signer, int]) -> dict[str, Any]:
    """The current bundle under a note of any ``body``, validly signed and cosigned."""
    note = body + "\n" + rb.LOG.line(body) + "".join(w.line(body, t) for w, t in cosigners)
    return MAIN.bundle(checkpoint=note)


W1, W2, W3 = rb.WITNESSES
TWIN = rb.Signer("witness.example/twin", W1.key, 0x04)  # W1's key under another name
ROTATED = rb.Signer.of(rb.MAIN_ORIGIN + "/next", 2, 0x01)
CHECKPOINT = f"{rb.ORIGIN}\n3\n{rb.b64(MAIN.root(3))}\n"

#: case -> (bundle, policy changes, reason)
WITH_POLICY: dict[str, tuple[Callable[[], dict[str, Any]], dict[str, Any], str]] = {
    "one witness key pinned under two names counts once": (
        lambda: signed_body(CHECKPOINT, (W1, rb.NOW), (TWIN, rb.NOW)),
        {"witnesses": [{"key": W1.vkey()}, {"key": TWIN.vkey()}, {"key": W2.vkey()}]},
        "too_few_cosignatures",
    ),
    "a validly signed cosignature timestamp beyond 2^63 - 1": (
        lambda: signed_body(CHECKPOINT, (W1, rb.NOW), (W2, 2**63)),
        {},
        "bad_cosignature",
    ),
    "a bad line by one pinned log key beside a good one by another": (
        lambda: relined(
            MAIN.bundle(checkpoint=rb.note(3, MAIN.root(3), signers=[rb.LOG, ROTATED])),
            line_edit(1),
        ),
        {"log_keys": [rb.LOG.vkey(), ROTATED.vkey()]},
        "bad_signature",
    ),
    "no proof member": (
        lambda: edited(MAIN.bundle(), lambda b: b.pop("proof")),
        {},
        "malformed_proof",
    ),
    "a proof of another format": (
        lambda: edited(MAIN.bundle(), lambda b: b["proof"].update(format=2)),
        {},
        "malformed_proof",
    ),
    "a checkpoint without a blank line and signatures": (
        lambda: MAIN.bundle(checkpoint=CHECKPOINT),
        {},
        "no_signature",
    ),
    "a checkpoint note with a control character": (
        lambda: signed_body(CHECKPOINT.replace(rb.ORIGIN, rb.ORIGIN + "\t"), (W1, rb.NOW)),
        {},
        "malformed_proof",
    ),
    "an inclusion proof hash that is not 32 bytes": (
        lambda: edited(MAIN.bundle(), lambda b: b["proof"]["inclusion"].append(rb.b64(b"short"))),
        {},
        "malformed_proof",
    ),
    "a signed size with a leading zero (tlog-checkpoint)": (
        lambda: signed_body(CHECKPOINT.replace("\n3\n", "\n03\n"), (W1, rb.NOW), (W2, rb.NOW)),
        {},
        "malformed_proof",
    ),
}


@pytest.mark.parametrize("case", sorted(WITH_POLICY))
def test_r29_reference_verifier_refuses_what_the_specs_forbid(case: str) -> None:
    build, changes, reason = WITH_POLICY[case]
    with pytest.raises(ref.BundleRejected) as refused:
        verify(build(), **changes)
    assert refused.value.reason == reason, refused.value
    # The same policy accepts the untampered bundle: the refusal is the tampering's.
    assert verify(MAIN.bundle(), **changes)["size"] == 3


def test_r29_reference_verifier_calls_a_rollback_stale() -> None:
    with pytest.raises(ref.BundleStale) as stale:
        verify(MAIN.bundle(revision=2), accepted(3))
    assert (stale.value.axis, stale.value.required, stale.value.served) == ("checkpoint", 3, 2)


def test_r29_reference_verifier_calls_a_frozen_head_stale_from_the_kth_newest_cosignature() -> None:
    old = rb.NOW - rb.MAX_AGE - 1
    frozen = rb.note(
        3,
        MAIN.root(3),
        cosigners=[(rb.WITNESSES[0], rb.NOW), (rb.WITNESSES[1], old), (rb.WITNESSES[2], old - 5)],
    )
    with pytest.raises(ref.BundleStale) as stale:
        verify(MAIN.bundle(checkpoint=frozen))
    assert (stale.value.axis, stale.value.required, stale.value.served) == (
        "freshness",
        rb.NOW - rb.MAX_AGE,
        old,
    )
    # With k = 1 the newest cosignature suffices; at exactly the maximum age it is fresh.
    assert verify(MAIN.bundle(checkpoint=frozen), threshold=1)["size"] == 3
    edge = rb.note(3, MAIN.root(3), cosigners=[(w, rb.NOW - rb.MAX_AGE) for w in rb.WITNESSES[:2]])
    assert verify(MAIN.bundle(checkpoint=edge))["size"] == 3


def test_r29_reference_verifier_reads_the_c2sp_examples() -> None:
    """signed-note "Verifier keys / Example" (the vkey verifies the note), and the
    tlog-cosignature example: its witness line is key id 8d66cf3f at time 1679315147,
    the time of the spec's own signed-message example."""
    vkey = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
    example = (
        "This is an example message.\n\n\u2014 example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6Tf"
        "Xppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n"
    )
    text, ((name, signature),) = ref.split_note(example)
    key = ref.PinnedKey.parse(vkey, ref.LOG_KEY_TYPE)
    assert (text, name, signature[:4]) == ("This is an example message.\n", key.name, key.id)
    assert key.verifies(signature[4:], text.encode())
    assert not key.verifies(signature[4:], b"This is an example message!\n")
    cosigned = (
        "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n\n"
        "\u2014 example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URY"
        "N7u5/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n"
        "\u2014 witness.example.com/w1 jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXcrtPHeolMI5OWXEhZCB9"
        "dlrDJsX3b2oyin1nPZqhf5nNo0xUe+mbIUBkBIfZ+qnA==\n"
    )
    text, signatures = ref.split_note(cosigned)
    assert ref.parse_checkpoint(text)[:2] == ("example.com/behind-the-sofa", 20852163)
    (_, log), (witness, cosignature) = signatures
    assert (len(log), witness, len(cosignature)) == (68, "witness.example.com/w1", 76)
    assert cosignature[:4].hex() == "8d66cf3f"
    assert int.from_bytes(cosignature[4:12], "big") == 1679315147


def test_r29_the_project_computes_what_the_reference_builder_does() -> None:
    """The project's domain code and the spec-only builder agree on every artifact of a
    bundle: catalog id, event ids, fact and audience digests, audience map root and proof,
    catalog log root and proofs, and the signed note."""
    from domain import audience_map, merkle
    from domain.catalog import catalog_id
    from domain.digests import event_id
    from domain.notes import VerifierKey
    from domain.served import audience_digest, fact_bytes, fact_digest

    assert catalog_id() == rb.CATALOG_ID
    for event, leaf in zip(MAIN.events, MAIN.leaves, strict=True):
        state = base64.b64decode(event["state_b64"])
        eid = event_id(rb.CATALOG_ID.bytes, event["version"], event["topic"].encode(), state)
        assert merkle.leaf_hash(eid) == leaf
    for views in MAIN.views:
        for (kind, ident), body in views.items():
            facts = []
            for f in body["facts"]:
                parts = (f["kind"], f["key"], f["payload"], f["requires"], f["credential_sets"])
                stored = fact_bytes(*parts)
                digest = fact_digest(f["pack"], f["install_id"], f["payload_hash"], stored)
                assert digest.hex() == f["fact_digest"]
                facts.append([f["pack"], f["install_id"], f["kind"], f["key"], digest.hex()])
            grants = [list(g.values()) for g in body["grants"]]
            assert audience_digest((kind, ident), grants, facts) == body["audience_digest"]
        leaves = rb.map_leaves(views)
        nodes = audience_map.nodes_of(leaves)
        assert audience_map.root_of(leaves) == amap.root(leaves)
        for kind, ident in views:
            key = audience_map.key_of(kind, ident)
            siblings, _ = audience_map.inclusion_proof(audience_map.memory_fetch(nodes), key)
            assert siblings == rb.audience_path(leaves, key)
    for size in range(1, 4):
        assert merkle.root(MAIN.leaves[:size]) == MAIN.root(size)
        for index in range(size):
            path = rb.inclusion_path(index, MAIN.leaves[:size])
            assert merkle.inclusion_proof(MAIN.leaves, index, size) == path
        for old in range(1, size):
            path = rb.consistency_path(old, MAIN.leaves[:size])
            assert merkle.consistency_proof(MAIN.leaves, old, size) == path
    checkpoint = VerifierKey.parse(rb.LOG.vkey()).verify(rb.note(3, MAIN.root(3)))
    assert (checkpoint.origin, checkpoint.size, checkpoint.root) == (rb.ORIGIN, 3, MAIN.root(3))


#: Each reference module -> the other spec-only references it may read.
REFERENCES = {
    "reference_verifier": {"reference_audience_map"},
    "reference_bundle": {"reference_audience_map"},
    "reference_catalog_log": {"reference_audience_map", "reference_verifier"},
    "reference_audience_map": set(),
}


@pytest.mark.parametrize("module", sorted(REFERENCES))
def test_r29_the_reference_modules_import_no_project_code(module: str) -> None:
    imported = reference_imports(module)
    assert {m.split(".")[0] for m in imported} - {"tests"} <= SPEC_ONLY, imported
    references = {m.removeprefix("tests.support.") for m in imported if m.startswith("tests")}
    assert references == REFERENCES[module]


def test_r29_reference_verifier_accepts_bundles_assembled_from_a_real_store(
    world: World, tmp_path: Path
) -> None:
    """On SQLite and MariaDB: the catalog log and each revision's audience map, recomputed
    by the reference from an export alone, commit to the views the store serves; a bundle
    assembled from them (signed with the reference's keys) verifies, from no kept state
    and along a consistency proof from revision 1."""
    realistic(world)  # revision 1: three audiences; revision 2: an advance, app:café gone
    events = catalog_log.records(export_lines(world.url, tmp_path))
    leaves = catalog_log.leaves(events)
    revisions = catalog_log.revision_events(events)
    assert len(leaves) == len(revisions) == 2
    for revision, event in enumerate(revisions, start=1):
        in_force = catalog_log.audiences_at(events, revision)
        state = json.loads(base64.b64decode(event["state_b64"]))
        assert (event["topic"], state["audiences"]) == ("catalog.published@2", [])
        assert catalog_log.audiences_root(in_force).hex() == state["audiences_root"]
        for kind, ident in in_force:
            at = ("--at-revision", str(revision))
            code, view = cli_json("--db", world.url, "view", f"{kind}:{ident}", *at)
            assert code == 0 and bytes.fromhex(view["audience_digest"]) == in_force[kind, ident]
    assert set(catalog_log.audiences_at(events, 1)) - set(in_force) == {("app", "café")}
    assert cli_json("--db", world.url, "view", "app:café")[0] == 5  # MISSING: not in force
    origin = cli("--db", world.url, "audit", "checkpoint").stdout.splitlines()[0] + "/catalog"
    policy = {**rb.policy(), "origin": origin}
    note = rb.note(2, rb.mth(leaves), origin=origin)
    first = {"size": 1, "root": rb.b64(rb.mth(leaves[:1])), "revision": 1}
    for kind, ident in in_force:
        code, view = cli_json("--db", world.url, "view", f"{kind}:{ident}")
        assert code == 0 and view["revision"] == 2
        for kept, since in ((None, None), (first, 1)):
            body = rb.prove(
                view, checkpoint=note, event=revisions[1], leaves=leaves, in_force=in_force,
                since=since,
            )  # fmt: skip
            assert ref.verify_bundle(body, policy, kept, rb.NOW) == {
                "size": 2, "root": rb.b64(rb.mth(leaves)), "revision": 2,
            }  # fmt: skip
        older = rb.prove(
            view, checkpoint=note, event=revisions[0], leaves=leaves, in_force=in_force
        )
        body["proof"]["revision_event"] = older["proof"]["revision_event"]  # revision 1's
        with pytest.raises(ref.BundleRejected) as refused:
            ref.verify_bundle(body, policy, first, rb.NOW)
        assert refused.value.reason == "wrong_revision_event"
