"""The audience map: a sparse Merkle tree of every audience's view digest (R28, R29).

Each catalog revision (``catalog.published`` v2) carries the root of this map over
the audiences in force at that revision; an audience's leaf holds its view digest
(``domain.served.audience_digest``). The root commits every audience's digest in
32 bytes, so

* the log can answer "this audience's digest at revision n" from the revision event
  and the audience's own ``audience_view.published`` event, checked against each
  other, without listing other audiences' names in the revision event (R19);
* a publication that changes k audiences updates the root in O(k log N) from the
  stored nodes (``update``), checking those nodes against the parent's root first;
* a runtime can later be given an inclusion proof of its own leaf (R29) that
  reveals nothing of other audiences but sibling hashes.

The tree (``schema/LOG-FORMAT.md``, "Audience map"), all digests BLAKE3 derive-key:

* ``key(a) = H_key(lp(kind, id))`` — 256 bits, read most significant bit first;
* ``leaf(k, v) = H_leaf(k || v)`` with ``v`` the 32-byte audience digest;
* ``node(l, r) = H_node(l || r)``; the empty tree is 32 zero bytes;
* the root of a set S of leaves at depth d: empty → zeros; one leaf → that leaf's
  hash (a lone leaf sits as high as it can); otherwise ``node(root(S0, d+1),
  root(S1, d+1))`` with S0/S1 the leaves whose key bit d is 0/1.

The shape is a function of the set alone (no insertion order), so any two parties
that agree on the audiences and digests agree on the root. Pure: storage is a
``Fetch`` callback of the caller's (a view table, or a dict in memory).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from domain.digests import Purpose, digest, lp

EMPTY = bytes(32)

#: A node's place in the tree: (depth, the first ``depth`` bits of its keys as bytes,
#: ``ceil(depth / 8)`` long, bits past ``depth`` zero).
Position = tuple[int, bytes]
ROOT: Position = (0, b"")


@dataclass(frozen=True, slots=True)
class Node:
    """A stored node: an inner node (``key is None``) or a leaf with its key and value."""

    hash: bytes
    key: bytes | None = None
    value: bytes | None = None

    @property
    def is_leaf(self) -> bool:
        return self.key is not None


#: Reads the stored nodes at some positions (absent positions are empty subtrees).
Fetch = Callable[[Collection[Position]], Mapping[Position, Node]]


def key_of(kind: str, ident: str) -> bytes:
    """The map key of audience ``kind:ident``."""
    return digest(Purpose.AUDIENCE_MAP_KEY, lp(kind.encode(), ident.encode()))


def leaf_hash(key: bytes, value: bytes) -> bytes:
    return digest(Purpose.AUDIENCE_MAP_LEAF, key + value)


def node_hash(left: bytes, right: bytes) -> bytes:
    return digest(Purpose.AUDIENCE_MAP_NODE, left + right)


def leaf(key: bytes, value: bytes) -> Node:
    return Node(leaf_hash(key, value), key, value)


def bit(key: bytes, depth: int) -> int:
    """Bit ``depth`` of ``key``, most significant first."""
    return (key[depth >> 3] >> (7 - (depth & 7))) & 1


def child(position: Position, side: int) -> Position:
    """The position of ``position``'s child on ``side`` (0 or 1)."""
    depth, prefix = position
    if depth & 7 == 0:
        return depth + 1, prefix + bytes([side << 7])
    return depth + 1, prefix[:-1] + bytes([prefix[-1] | (side << (7 - (depth & 7)))])


def position_of(key: bytes, depth: int) -> Position:
    """The position at ``depth`` on ``key``'s path."""
    size, rest = divmod(depth, 8)
    prefix = key[:size]
    if rest:
        prefix += bytes([key[size] & (0xFF << (8 - rest)) & 0xFF])
    return depth, prefix


def _split(keys: Iterable[bytes], depth: int) -> tuple[list[bytes], list[bytes]]:
    zeros: list[bytes] = []
    ones: list[bytes] = []
    for k in keys:
        (ones if bit(k, depth) else zeros).append(k)
    return zeros, ones


def root_of(leaves: Mapping[bytes, bytes]) -> bytes:
    """The root over ``leaves`` (key -> value), computed from scratch."""
    top = _build(ROOT, {k: leaf(k, v) for k, v in leaves.items()}, {})
    return EMPTY if top is None else top.hash


def nodes_of(leaves: Mapping[bytes, bytes]) -> dict[Position, Node]:
    """Every node of the tree over ``leaves``, by position (what a store keeps)."""
    out: dict[Position, Node | None] = {}
    top = _build(ROOT, {k: leaf(k, v) for k, v in leaves.items()}, out)
    if top is not None:
        out[ROOT] = top
    return {p: n for p, n in out.items() if n is not None}


def _build(
    position: Position, items: Mapping[bytes, Node], writes: dict[Position, Node | None]
) -> Node | None:
    """The node at ``position`` over ``items`` (leaves), writing every node below it."""
    if not items:
        return None
    if len(items) == 1:
        return next(iter(items.values()))
    depth = position[0]
    halves: tuple[dict[bytes, Node], dict[bytes, Node]] = ({}, {})
    for k, n in items.items():
        halves[bit(k, depth)][k] = n
    tops = []
    for side in (0, 1):
        below = child(position, side)
        top = _build(below, halves[side], writes)
        if top is not None:
            writes[below] = top
        tops.append(top)
    left, right = tops
    return Node(node_hash(left.hash if left else EMPTY, right.hash if right else EMPTY))


@dataclass(frozen=True)
class MapUpdate:
    """The map after some changes: its root and the node writes (``None``: delete)."""

    root: bytes
    writes: dict[Position, Node | None]


def update(
    fetch: Fetch, changes: Mapping[bytes, bytes | None], *, size: int | None = None
) -> MapUpdate:
    """The map after setting each key of ``changes`` to its value (``None``: remove it).

    Reads only the stored nodes on the changed keys' paths and their siblings, one
    ``fetch`` per level (O(k log N) nodes for k changes); given the map's ``size`` (its
    leaves, about), the levels a path of that map spans are read in one ``fetch``
    first. Nothing is trusted beyond that: to check stored nodes against a known root,
    apply the keys' *current* values and compare the result with that root
    (``root_with``)."""
    known: dict[Position, Node | None] = {}
    frontier: dict[Position, list[bytes]] = {ROOT: sorted(changes)}
    if size is not None:
        fetch = _prefetched(fetch, changes, size)
    while frontier:
        got = fetch(list(frontier))
        following: dict[Position, list[bytes]] = {}
        for position, keys in frontier.items():
            node = got.get(position)
            known[position] = node
            if keys and node is not None and not node.is_leaf:
                zeros, ones = _split(keys, position[0])
                following[child(position, 0)] = zeros
                following[child(position, 1)] = ones
        frontier = following
    writes: dict[Position, Node | None] = {}
    if not changes:
        top = known.get(ROOT)
    else:
        top = _changed(ROOT, sorted(changes), changes, known, writes)
        writes[ROOT] = top
    return MapUpdate(EMPTY if top is None else top.hash, writes)


#: Paths are read in one ``fetch`` up front for up to this many changed keys.
PREFETCH_KEYS = 64


def _prefetched(fetch: Fetch, changes: Collection[bytes], size: int) -> Fetch:
    """``fetch`` answering the positions on the changed keys' paths (and their
    siblings) down to about the depth of a map of ``size`` random keys from one read made
    up front, so an update of a few keys costs one round trip to storage instead of one
    per level; deeper or other positions are read from ``fetch`` as asked. The nodes
    read, and so the result, are the same."""
    if not changes or len(changes) > PREFETCH_KEYS:
        return fetch
    levels = min(256, max(size, 1).bit_length() + 2)
    wanted: set[Position] = {ROOT}
    for key in changes:
        for depth in range(levels):
            here = position_of(key, depth)
            wanted.add(child(here, 0))
            wanted.add(child(here, 1))
    got = fetch(list(wanted))

    def cached(positions: Collection[Position]) -> Mapping[Position, Node]:
        rest = [p for p in positions if p not in wanted]
        out = {p: got[p] for p in positions if p in got}
        if rest:
            out.update(fetch(rest))
        return out

    return cached


def root_with(fetch: Fetch, values: Mapping[bytes, bytes | None]) -> bytes:
    """The root of the stored map with ``values`` in place of its own for those keys."""
    return update(fetch, values).root


def _changed(
    position: Position,
    keys: list[bytes],
    changes: Mapping[bytes, bytes | None],
    known: Mapping[Position, Node | None],
    writes: dict[Position, Node | None],
) -> Node | None:
    """The node now at ``position`` (which the caller writes); writes every node below."""
    node = known.get(position)
    if node is None or node.is_leaf:
        items: dict[bytes, Node] = {}
        if node is not None and node.key not in changes:
            assert node.key is not None
            items[node.key] = node
        for k in keys:
            value = changes[k]
            if value is not None:
                items[k] = leaf(k, value)
        return _build(position, items, writes)
    zeros, ones = _split(keys, position[0])
    places = (child(position, 0), child(position, 1))
    tops: list[Node | None] = []
    for side, subset in ((0, zeros), (1, ones)):
        place = places[side]
        tops.append(_changed(place, subset, changes, known, writes) if subset else known.get(place))
    left, right = tops
    lone = right if left is None else left if right is None else None
    if lone is not None and lone.is_leaf:  # one leaf left below: it moves up here
        for place in places:
            if known.get(place) is not None:
                writes[place] = None
        return lone
    if left is None and right is None:
        for place in places:
            if known.get(place) is not None:
                writes[place] = None
        return None
    for side, subset in ((0, zeros), (1, ones)):
        if subset:
            writes[places[side]] = tops[side]
    return Node(node_hash(left.hash if left else EMPTY, right.hash if right else EMPTY))


def inclusion_proof(fetch: Fetch, key: bytes) -> tuple[list[bytes], Node | None]:
    """The sibling hashes from the root down to where ``key``'s path ends, and the node
    found there (``key``'s leaf, another leaf, or ``None``: an empty subtree)."""
    siblings: list[bytes] = []
    position = ROOT
    node = fetch([position]).get(position)
    while node is not None and not node.is_leaf:
        side = bit(key, position[0])
        here, other = child(position, side), child(position, 1 - side)
        got = fetch([here, other])
        sibling = got.get(other)
        siblings.append(sibling.hash if sibling is not None else EMPTY)
        position, node = here, got.get(here)
    return siblings, node


def root_from_proof(key: bytes, value: bytes, siblings: list[bytes]) -> bytes:
    """The root an inclusion proof of ``key -> value`` implies (compare with the root)."""
    h = leaf_hash(key, value)
    for depth in range(len(siblings) - 1, -1, -1):
        sibling = siblings[depth]
        h = node_hash(sibling, h) if bit(key, depth) else node_hash(h, sibling)
    return h


def memory_fetch(nodes: Mapping[Position, Node]) -> Fetch:
    """A ``Fetch`` over nodes held in memory."""

    def fetch(positions: Collection[Position]) -> Mapping[Position, Node]:
        return {p: nodes[p] for p in positions if p in nodes}

    return fetch


def apply_writes(nodes: dict[Position, Node], writes: Mapping[Position, Node | None]) -> None:
    """Apply ``update``'s writes to nodes held in memory."""
    for position, node in writes.items():
        if node is None:
            nodes.pop(position, None)
        else:
            nodes[position] = node
