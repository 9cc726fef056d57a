"""R28: the audience map — the incremental update, the spec and its vectors agree."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from domain import audience_map as m
from tests.support import reference_audience_map as ref

VECTORS = Path(__file__).resolve().parents[2] / "schema" / "vectors" / "log" / "audience_map.json"

_names = st.tuples(st.sampled_from(["app", "integration"]), st.text(max_size=6))
_digest = st.binary(min_size=32, max_size=32)
#: batches of changes: an audience and its new digest, or None (its grants are gone)
_batches = st.lists(
    st.dictionaries(_names, st.none() | _digest, min_size=0, max_size=12), max_size=8
)


@settings(deadline=None)
@given(_batches)
def test_r28_incremental_updates_give_the_specs_root_and_canonical_nodes(
    batches: list[dict[tuple[str, str], bytes | None]],
) -> None:
    nodes: dict[m.Position, m.Node] = {}
    leaves: dict[bytes, bytes] = {}
    for batch in batches:
        changes = {m.key_of(*a): v for a, v in batch.items()}
        fetched: list[int] = []
        depth = max((p[0] for p in nodes), default=0)  # of the tree the update reads
        result = m.update(_counting(m.memory_fetch(nodes), fetched), changes)
        m.apply_writes(nodes, result.writes)
        for k, v in changes.items():
            if v is None:
                leaves.pop(k, None)
            else:
                leaves[k] = v
        assert result.root == ref.root(leaves) == m.root_of(leaves)
        # The stored nodes are the tree of the set, whatever the order of changes.
        assert nodes == m.nodes_of(leaves)
        # One read per level, and only the changed keys' paths and their siblings.
        assert len(fetched) <= depth + 2
        assert sum(fetched) <= 1 + 2 * max(len(changes), 1) * (depth + 2)
    for k, v in leaves.items():
        siblings, found = m.inclusion_proof(m.memory_fetch(nodes), k)
        assert found == m.leaf(k, v)
        assert ref.root_from_proof(k, v, siblings) == ref.root(leaves)


def _counting(inner: m.Fetch, fetched: list[int]) -> m.Fetch:
    def fetch(positions: Collection[m.Position]) -> Mapping[m.Position, m.Node]:
        fetched.append(len(positions))
        return inner(positions)

    return fetch


def test_r28_an_edited_node_is_caught_by_the_parent_root_or_changes_nothing() -> None:
    """The publisher first re-applies the changed audiences' current values to the stored
    nodes and compares with the parent's root (``root_with``), then applies the new values.
    The check must cover exactly the keys the update changes, new ones included (their
    current value: absent). A single edited node (its hash, key or value) is either
    caught by that check, or lies where the update recomputes it: the new root is then
    still the true one. A wrong view fails closed; it never changes an answer (R28)."""
    leaves = {m.key_of("app", f"t{i}"): bytes([i]) * 32 for i in range(24)}
    nodes = m.nodes_of(leaves)
    good = m.root_of(leaves)
    keys = sorted(leaves)
    new = {keys[0]: bytes([99]) * 32, keys[1]: None, m.key_of("app", "new"): bytes(range(32))}
    # The same keys as the update, at their current values (a new key's: absent).
    current = {k: leaves.get(k) for k in new}
    after = {k: v for k, v in {**leaves, **new}.items() if v is not None}
    assert m.root_with(m.memory_fetch(nodes), current) == good
    caught = 0
    for position, n in nodes.items():
        edits = [m.Node(bytes(32), n.key, n.value)]
        if n.is_leaf:
            edits += [m.Node(n.hash, bytes(32), n.value), m.Node(n.hash, n.key, bytes(32))]
        for edited_node in edits:
            edited = {**nodes, position: edited_node}
            fetch = m.memory_fetch(edited)
            if m.root_with(fetch, current) != good:
                caught += 1
                continue
            assert m.update(fetch, new).root == m.root_of(after), (position, edited_node)
    # The siblings of the changed paths are read, and an edit of one is caught; nodes the
    # update neither reads nor rewrites don't take part (a later update that reads them
    # checks them then).
    assert caught > 0


def test_r28_the_reference_computation_reproduces_the_audience_map_vectors() -> None:
    doc = json.loads(VECTORS.read_text(encoding="utf-8"))
    assert doc["empty_root"] == ref.EMPTY.hex() == ref.root({}).hex()
    leaves: dict[bytes, bytes] = {}
    for n, a in enumerate(doc["audiences"], 1):
        k = ref.key(a["kind"], a["id"])
        assert k.hex() == a["key"]
        assert ref.leaf(k, bytes.fromhex(a["digest"])).hex() == a["leaf"]
        leaves[k] = bytes.fromhex(a["digest"])
        assert doc["roots"][n - 1] == {"audiences": n, "root": ref.root(leaves).hex()}
    assert doc["inclusion"]["root"] == ref.root(leaves).hex()
    for proof, a in zip(doc["inclusion"]["proofs"], doc["audiences"], strict=True):
        siblings = [bytes.fromhex(h) for h in proof["siblings"]]
        got = ref.root_from_proof(bytes.fromhex(a["key"]), bytes.fromhex(a["digest"]), siblings)
        assert got.hex() == doc["inclusion"]["root"]
    for a in doc["audiences"][:4]:
        del leaves[bytes.fromhex(a["key"])]
    assert ref.root(leaves).hex() == doc["after_removing_first_four"]


def test_r30_an_update_told_the_map_size_reads_its_paths_in_one_round_trip() -> None:
    """R30 (the head lock): given the map's size, an update of a few keys reads the
    levels their paths span in one ``fetch`` up front instead of one per level, and
    gives the same root and writes as the update level by level."""
    leaves = {m.key_of("app", f"a{n}"): bytes([n % 251]) * 32 for n in range(3000)}
    nodes: dict[m.Position, m.Node] = {}
    m.apply_writes(nodes, m.update(m.memory_fetch(nodes), dict(leaves)).writes)
    calls: list[int] = []
    stored = m.memory_fetch(nodes)

    def counted(positions: Collection[m.Position]) -> Mapping[m.Position, m.Node]:
        calls.append(len(positions))
        return stored(positions)

    changes: dict[bytes, bytes | None] = {m.key_of("app", "a7"): bytes(32)}
    changes[m.key_of("app", "new")] = bytes([9]) * 32
    changes[m.key_of("app", "a8")] = None
    plain = m.update(stored, changes)
    told = m.update(counted, changes, size=len(leaves))
    assert (told.root, told.writes) == (plain.root, plain.writes)
    assert len(calls) <= 2  # the prefetch, and at most one read below the map's usual depth
