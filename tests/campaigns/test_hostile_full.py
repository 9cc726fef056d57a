"""Hostile-input campaign (issue 8, item 4): the properties of ``tests/e2e/test_hostile_input.py``
with many more examples, on SQLite files and on the MariaDB/MySQL server.

Run::

    .venv/bin/python -m pytest -m campaign tests/campaigns/test_hostile_full.py

``CATALOG_LEDGER_HOSTILE_EXAMPLES`` sets the examples per store property (default 300);
properties that touch no store run ten times as many. The kinds and outcomes of all
inputs tried are printed when the module finishes.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.identity import Identity, SourceRevision
from tests.e2e import test_hostile_input as h
from tests.support.cli_support import ServedStore

EXAMPLES = int(os.environ.get("CATALOG_LEDGER_HOSTILE_EXAMPLES", "300"))
PURE = EXAMPLES * 10

# The fast module's fixtures, and a report of the totals at the end of this module.
tally = h.tally
stage = h.stage
served = h.served
proof_stage = h.proof_stage
hostile_totals = h.totals_reporter(always=True)

#: The campaign also rebuilds projections (slow: it starts worker processes).
GRAMMAR: tuple[h.Command, ...] = (
    *h.GRAMMAR,
    (("projections", "rebuild"), ("view-name",), {"--workers": "number"}),
)


@pytest.mark.campaign
@h.hostile_settings(PURE)
@given(
    cls=st.sampled_from([*h.IDENTITY_CLASSES, SourceRevision]),
    value=h.hostile_values(),
    field=st.sampled_from([None, "packs[2].name", "bindings[0].key"]),
)
def test_r1_identities_accept_exact_canonical_bytes_or_reject_naming_field(
    cls: type[Identity], value: h.Tagged[Any], field: str | None, tally: Counter[str]
) -> None:
    tally[f"{value.kind} -> {h.check_identity(cls, value.value, field)}"] += 1


@pytest.mark.campaign
@h.hostile_settings(PURE)
@given(
    text=h.hostile_texts(),
    kind=st.one_of(
        st.sampled_from(["app", "integration", "App", "app:x", "integration:", "", " app"]),
        h.hostile_texts().map(lambda t: t.value),
    ),
    ident=h.hostile_texts(),
    prefix=st.sampled_from(["app:", "integration:", "", "workload:", "app::", "APP:"]),
)
def test_r1_audiences_parse_into_typed_pairs_or_reject_naming_part(
    text: h.Tagged[str], kind: str, ident: h.Tagged[str], prefix: str, tally: Counter[str]
) -> None:
    outcome = h.check_audience(prefix + text.value, kind, ident.value)
    tally[f"audience {text.kind} -> {outcome}"] += 1


@pytest.mark.campaign
@h.hostile_settings(PURE)
@given(family=h.variant_families())
def test_r1_case_and_normalization_variants_are_distinct_identities(
    family: h.Tagged[list[str]], tally: Counter[str]
) -> None:
    h.check_variants_distinct(family.value)
    tally[f"{family.kind} of {len(family.value)} -> distinct"] += 1


@pytest.mark.campaign
@h.hostile_settings(max(EXAMPLES // 10, 5))
@given(family=h.variant_families())
def test_r3_case_and_normalization_variants_install_as_distinct_packs(
    stage: h.Stage, family: h.Tagged[list[str]], tally: Counter[str]
) -> None:
    h.check_variants_through_store(stage, family.value)
    tally[f"{family.kind} of {len(family.value)} -> installed apart"] += 1


@pytest.mark.campaign
@h.hostile_settings(PURE)
@given(value=st.one_of(st.sampled_from(h.NUMERIC), h.hostile_values().map(lambda t: t.value)))
def test_r19_revision_bounds_are_plain_integers_or_invalid(value: Any, tally: Counter[str]) -> None:
    tally[f"{type(value).__name__} -> {h.check_revision(value)}"] += 1


@pytest.mark.campaign
@h.hostile_settings(EXAMPLES)
@given(spot=st.sampled_from(h.SPOTS), value=h.hostile_texts(), as_json=st.booleans())
def test_r1_manifest_identities_apply_or_reject_naming_the_spot(
    stage: h.Stage, spot: str, value: h.Tagged[str], as_json: bool, tally: Counter[str]
) -> None:
    code = h.check_manifest_spot(stage, spot, value.value, as_json)
    tally[f"{spot}: {value.kind} -> {code}"] += 1


@pytest.mark.campaign
@h.hostile_settings(EXAMPLES)
@given(data=st.data(), as_json=st.booleans())
def test_r4_hostile_manifest_files_apply_or_reject_without_partial_append(
    stage: h.Stage, data: st.DataObject, as_json: bool, tally: Counter[str]
) -> None:
    hostile = data.draw(h.hostile_files(stage.base_manifest()))
    tally[f"{hostile.kind} -> {h.check_manifest_file(stage, hostile, as_json)}"] += 1


@pytest.mark.campaign
@h.hostile_settings(EXAMPLES)
@given(
    data=st.data(),
    source=st.sampled_from(["local_path", "local_path", "official_repo"]),
    as_json=st.booleans(),
)
def test_r4_hostile_pack_json_installs_or_rejects_without_partial_append(
    stage: h.Stage, data: st.DataObject, source: str, as_json: bool, tally: Counter[str]
) -> None:
    hostile = data.draw(h.hostile_files(h.PACK_DOC))
    if source == "official_repo" and hostile.value in (h.Shape.DEV_ZERO, h.Shape.SYMLINK_LOOP):
        source = "local_path"
    code = h.check_pack_file(stage, hostile, source, as_json)
    tally[f"{source}: {hostile.kind} -> {code}"] += 1


@pytest.mark.campaign
@h.hostile_settings(EXAMPLES)
@given(data=st.data(), as_json=st.booleans())
def test_r7_hostile_legacy_records_import_or_reject_without_partial_append(
    stage: h.Stage, data: st.DataObject, as_json: bool, tally: Counter[str]
) -> None:
    hostile = data.draw(h.hostile_files(h.LEGACY_DOC))
    tally[f"{hostile.kind} -> {h.check_legacy_file(stage, hostile, as_json)}"] += 1


@pytest.mark.campaign
@h.hostile_settings(EXAMPLES)
@given(data=st.data())
def test_r19_hostile_cli_argument_vectors_exit_with_typed_codes(
    stage: h.Stage, data: st.DataObject, tally: Counter[str]
) -> None:
    argv = data.draw(h.argument_vectors(stage, h.stage_files(stage), GRAMMAR))
    tally[f"{argv.kind} -> {h.check_argument_vector(stage, argv.value)}"] += 1


@pytest.mark.campaign
@h.hostile_settings(PURE)
@given(note=h.hostile_notes())
def test_r22_checkpoint_and_key_texts_parse_or_reject_naming_field(
    note: h.Tagged[str], tally: Counter[str]
) -> None:
    tally[f"{note.kind} -> {h.check_note(note.value)}"] += 1


@pytest.mark.campaign
@h.hostile_settings(EXAMPLES)
@given(data=st.data(), which=st.sampled_from(["inclusion", "consistency"]), as_json=st.booleans())
def test_r22_hostile_proof_documents_verify_or_reject(
    proof_stage: tuple[h.Stage, h.Proofs],
    data: st.DataObject,
    which: str,
    as_json: bool,
    tally: Counter[str],
) -> None:
    stage, proofs = proof_stage
    hostile = data.draw(h.hostile_files(getattr(proofs, which)))
    code = h.check_proof(stage, proofs, hostile.value, as_json)
    tally[f"{which}: {hostile.kind} -> {code}"] += 1


@pytest.mark.campaign
@h.hostile_settings(EXAMPLES * 2)
@given(case=h.schemathesis_cases())
def test_r19_http_schemathesis_cases_get_documented_typed_answers(
    served: tuple[h.Stage, ServedStore], case: Any, tally: Counter[str]
) -> None:
    _, server = served
    tally[f"{case.operation.label} -> {h.check_schemathesis_case(server, case)}"] += 1


@pytest.mark.campaign
@h.hostile_settings(EXAMPLES * 2)
@given(request=h.raw_requests())
def test_r19_http_raw_hostile_requests_get_typed_answers(
    served: tuple[h.Stage, ServedStore],
    request: h.Tagged[tuple[str, str, list[tuple[str, str]], dict[str, str]]],
    tally: Counter[str],
) -> None:
    _, server = served
    method, path, query, headers = request.value
    tally[f"{request.kind} -> {h.check_raw_request(server, method, path, query, headers)}"] += 1
