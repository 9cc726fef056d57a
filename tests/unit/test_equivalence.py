"""The payload-equivalence digest (publisher.equivalence; schema/LOG-FORMAT.md) — pure."""

from __future__ import annotations

import json

from blake3 import blake3

from domain.canonical import canonical_bytes
from domain.rollback import (
    ActivePack,
    FrozenSource,
    Grant,
    RevisionContent,
    StoreNow,
    plan_rollback,
)
from publisher.equivalence import EquivalenceEntry, equivalence_digest, equivalence_digests

CONTEXT = "catalog-ledger 2026-12 payload equivalence v1"


def _fact(kind: str, key: str, payload: object, creds: list[str] | None = None) -> bytes:
    component = {
        "kind": kind,
        "key": key,
        "payload": payload,
        "requires": [],
        "credential_sets": creds,
    }
    return canonical_bytes(component)


ENTRIES: list[EquivalenceEntry] = [
    ("integration", "erp", "sales", "push_contract", "Order.push", None, _fact("push", "O", 1)),
    ("app", "crm", "core", "callout_profile", "audit", "w", _fact("c", "a", {"u": "é"}, ["w"])),
    ("app", "crm", "core", "callout_profile", "audit", None, _fact("c", "a", {"u": "é"}, ["w"])),
]


def _by_the_document(entries: list[EquivalenceEntry]) -> str:
    """The LOG-FORMAT.md definition, with the standard library's JSON."""
    rows = [[*e[:6], json.loads(e[6])] for e in entries]
    rows.sort(key=lambda r: (*r[:5], r[5] or ""))
    body = json.dumps(rows, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return str(blake3(body.encode(), derive_key_context=CONTEXT).hexdigest())


def test_r17_the_streamed_digest_is_the_documented_one_in_any_input_order() -> None:
    expected = _by_the_document(ENTRIES)
    assert equivalence_digest(ENTRIES) == expected
    assert equivalence_digest(reversed(ENTRIES)) == expected
    assert equivalence_digest([]) == _by_the_document([])


def test_r17_the_digest_moves_with_a_payload_a_grant_or_a_credential_set() -> None:
    base = equivalence_digest(ENTRIES)
    changed_payload = [*ENTRIES[:2], (*ENTRIES[2][:6], _fact("c", "a", {"u": "e"}, ["w"]))]
    other_set = [*ENTRIES[:1], (*ENTRIES[1][:5], "x", ENTRIES[1][6]), ENTRIES[2]]
    assert equivalence_digest(changed_payload) != base
    assert equivalence_digest(other_set) != base
    assert equivalence_digest(ENTRIES[:2]) != base


def test_r17_each_audience_digest_is_the_same_rule_over_its_own_grants() -> None:
    overall, audiences = equivalence_digests(ENTRIES)
    assert overall == equivalence_digest(ENTRIES)
    assert audiences == {
        ("app", "crm"): equivalence_digest(ENTRIES[1:]),
        ("integration", "erp"): equivalence_digest(ENTRIES[:1]),
    }


def _pack(name: str, revision: str, install: str) -> ActivePack:
    return ActivePack(
        name, install, revision, 1, f"v1:{revision}", FrozenSource("/r", revision, "p")
    )


def _revision(n: int, packs: list[ActivePack], grants: list[Grant]) -> RevisionContent:
    return RevisionContent(n, f"c{n}", f"e{n}", {}, {p.pack: p for p in packs}, tuple(grants))


def test_r7_the_plan_decides_each_pack_from_revision_n_and_the_store_now() -> None:
    grant = Grant("app", "crm", "a", "k", "x", None)
    target = _revision(
        1,
        [_pack("a", "1" * 40, "i1"), _pack("b", "1" * 40, "i2"), _pack("c", "1" * 40, "i3")],
        [grant],
    )
    now = StoreNow(
        {
            "a": _pack("a", "2" * 40, "i4"),
            "c": _pack("c", "1" * 40, "i3"),
            "d": _pack("d", "1" * 40, "i5"),
        },
        frozenset({"dev"}),
        (),
        None,
    )
    plan = plan_rollback(target, now)
    assert {s.pack: s.action for s in plan.steps} == {
        "a": "advance",
        "b": "reinstall",
        "c": "unchanged",
        "d": "remove",
    }
    assert plan.restore == (grant,) and plan.revoke == () and plan.local == ("dev",)
    assert plan.manifest()["remove"] == ["d"]
    assert [p["name"] for p in plan.manifest()["packs"]] == ["a", "b", "c"]
    assert plan.summary() == (
        "1 pack advances, 1 reinstalled, 1 removed; bindings 1 restored; no audience changes"
    )
