"""R30/R14: the lean binding delta a release computes on top of the parent gives the
same grant/rebind/revoke changes, in the same order, and the same rows as
``plan_bindings`` (whose changes are appended as binding events: their order is log
bytes)."""

from __future__ import annotations

import random

import pytest

from domain.manifest import parse_manifest
from publisher.catalog import BindingRow, PackAuthority
from publisher.planning import BindingDelta, plan_bindings

PACKS = [f"pack-{n}" for n in range(5)]
AUDIENCES = [f"app:a{n}" for n in range(6)] + [f"integration:w{n}" for n in range(3)]


def binding(rng: random.Random) -> dict[str, str]:
    out = {
        "audience": rng.choice(AUDIENCES),
        "pack": rng.choice(PACKS),
        "kind": rng.choice(["callout_profile", "push_contract"]),
        "key": f"k{rng.randrange(4)}",
    }
    if rng.random() < 0.3:
        out["credential_set"] = rng.choice(["prod", "test"])
    return out


@pytest.mark.parametrize("seed", range(40))
def test_r30_binding_delta_equals_plan_bindings(seed: int) -> None:
    rng = random.Random(seed)
    packs = {
        p: PackAuthority(p, "official_repo", f"iid-{p}-{rng.randrange(2)}", "r", 1, f"h{p}")
        for p in PACKS
        if rng.random() < 0.9  # some packs have no authority: rows name ""
    }
    current: dict[tuple[str, ...], BindingRow] = {}
    for _ in range(rng.randrange(30)):
        b = binding(rng)
        kind, ident = b["audience"].split(":")
        row = BindingRow(
            kind,
            ident,
            b["pack"],
            b["kind"],
            b["key"],
            b.get("credential_set"),
            f"iid-{b['pack']}-{rng.randrange(2)}",
            f"h{b['pack']}" if rng.random() < 0.8 else "old",
        )
        current[row.ident] = row
    wanted = {tuple(sorted(b.items())): b for b in (binding(rng) for _ in range(30))}
    chosen = list(wanted.values())[: rng.randrange(30)]
    manifest = parse_manifest({"packs": [], "bindings": chosen}, file="m")
    assert manifest.bindings is not None
    rows, changes = plan_bindings(current.values(), manifest.bindings, packs)
    delta = BindingDelta.of(current, manifest.bindings, packs)
    assert delta.changes == changes
    everyone = {r.audience for r in rows}
    assert delta.rows_of(everyone) == rows
    some = set(rng.sample(sorted(everyone), len(everyone) // 2)) if everyone else set()
    assert delta.rows_of(some) == [r for r in rows if r.audience in some]
