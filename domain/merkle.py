"""The log's Merkle tree (R22): RFC 6962 / RFC 9162 hashing, proofs and verification.

Why this exact tree: the DESIGN wants third-party verifiers and the published
``rfc6962`` vectors to apply to our checkpoints unchanged, so the tree is the
one RFC 9162 section 2.1 defines, with SHA-256 and its domain separation:

- leaf hash ``SHA-256(0x00 || data)`` and interior node ``SHA-256(0x01 || left || right)``,
  so a leaf can never be passed off as an interior node (second-preimage defence);
- the empty tree's root is ``SHA-256("")``;
- a tree of ``n > 1`` leaves splits at ``k``, the largest power of two below ``n``.

Everything here is pure (no I/O, no database). Proof *generation* is written
against a callable ``node(start, end)`` that returns the hash of a perfect,
aligned subtree (``end - start`` a power of two, ``start`` a multiple of it):
the only hashes a log has to cache. The generators ask for O(log n) of them and
assemble the few non-perfect right-edge subtrees themselves, so a store can
serve proofs over a million-event log without reading every leaf. The
list-based functions (``inclusion_proof``, ``consistency_proof``) are the same
generators over a ``node`` computed from an in-memory list.

Verification follows RFC 9162 sections 2.1.3.2 and 2.1.4.2 step by step. Every
mismatch or malformed input raises ``MerkleProofError`` (an ``IntegrityFailure``,
exit 6): a proof that does not check is evidence of tampering or of a broken
peer, never a condition to repair. Bad *requests* for a proof (an index past
the tree, ``size1 > size2``) are the caller's input and raise ``InvalidInput``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from domain.errors import IntegrityFailure, InvalidInput

HASH_SIZE = 32
"""Length of every hash in the tree (SHA-256)."""

EMPTY_ROOT = hashlib.sha256(b"").digest()
"""RFC 9162 section 2.1.1: the hash of an empty list is the hash of an empty string."""

_LEAF_PREFIX = b"\x00"
_NODE_PREFIX = b"\x01"

SubtreeHash = Callable[[int, int], bytes]
"""``node(start, end)``: hash of the perfect, aligned subtree over leaves ``[start, end)``."""


class MerkleProofError(IntegrityFailure):
    """A Merkle proof, root or hash does not check (R22).

    ``details["reason"]`` names the failed check (``proof_length``,
    ``root_mismatch``, ``hash_length``, …) so callers and tests never parse the
    message.
    """


# --------------------------------------------------------------------------- hashing


def leaf_hash(data: bytes) -> bytes:
    """``SHA-256(0x00 || data)``: the hash of one log entry (for us, an ``event_id``)."""
    return hashlib.sha256(_LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """``SHA-256(0x01 || left || right)``: the hash of an interior node."""
    return hashlib.sha256(_NODE_PREFIX + left + right).digest()


def root(leaf_hashes: Sequence[bytes]) -> bytes:
    """MTH over already-hashed leaves, computed bottom-up, level by level.

    Pairing neighbours and promoting an odd last node unchanged builds exactly
    the RFC tree (the split at the largest power of two below ``n`` is what
    leaves the right edge unpaired), without recursion: a million leaves cost
    one pass per level and no stack depth.
    """
    level = list(leaf_hashes)
    for position, value in enumerate(level):
        _require_hash(value, what="leaf hash", position=position)
    if not level:
        return EMPTY_ROOT
    sha256 = hashlib.sha256
    while len(level) > 1:
        paired = [
            sha256(_NODE_PREFIX + level[i] + level[i + 1]).digest()
            for i in range(0, len(level) - 1, 2)
        ]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0]


class MerkleStack:
    """Streaming RFC 9162 root: O(log n) perfect subtrees, optionally every leaf."""

    def __init__(self, keep_leaves: bool = False) -> None:
        self.stack: list[tuple[int, bytes]] = []
        self.leaves: list[bytes] | None = [] if keep_leaves else None

    def add(self, leaf: bytes) -> None:
        if self.leaves is not None:
            self.leaves.append(leaf)
        self.add_node(1, leaf)

    def add_node(self, size: int, value: bytes) -> None:
        """Append a perfect subtree of ``size`` leaves (aligned at the current end)."""
        while self.stack and self.stack[-1][0] == size:
            _, left = self.stack.pop()
            value = node_hash(left, value)
            size *= 2
        self.stack.append((size, value))

    def root(self) -> bytes:
        if not self.stack:
            return EMPTY_ROOT
        value = self.stack[-1][1]
        for _, left in reversed(self.stack[:-1]):
            value = node_hash(left, value)
        return value


def subtree_root(leaf_hashes: Sequence[bytes], start: int, end: int) -> bytes:
    """MTH over ``leaf_hashes[start:end]``: the value a ``node(start, end)`` must return.

    Meant for building and checking caches of subtree hashes; for a perfect,
    aligned range it is exactly the interior node of the log's tree.
    """
    _require_size(start, field="start")
    _require_size(end, field="end")
    if not start <= end <= len(leaf_hashes):
        raise InvalidInput(
            "subtree range is outside the leaves",
            field="end",
            start=start,
            end=end,
            leaves=len(leaf_hashes),
        )
    return root(leaf_hashes[start:end])


def root_from(node: SubtreeHash, size: int) -> bytes:
    """The root of the first ``size`` leaves from cached perfect subtrees (O(log n) calls)."""
    _require_size(size, field="size")
    if size == 0:
        return EMPTY_ROOT
    return _range_hash(node, 0, size)


# --------------------------------------------------------------------------- generation


def inclusion_proof_from(node: SubtreeHash, index: int, size: int) -> list[bytes]:
    """RFC 9162 section 2.1.3.1 ``PATH(index, D[size])``, leaf-to-root order.

    Walks down from the root: at each split the sibling of the side holding the
    leaf is recorded, then the list is reversed because the RFC lists the
    deepest sibling first. Only the first time the walk turns left while still
    on the tree's right edge is the sibling non-perfect; it is assembled from at
    most log2(size) perfect pieces, so the whole proof costs O(log n) calls.
    """
    _require_size(size, field="size")
    _require_size(index, field="index")
    if index >= size:
        raise InvalidInput("leaf index is not in the tree", field="index", index=index, size=size)
    path: list[bytes] = []
    start, end = 0, size
    while end - start > 1:
        middle = start + _split(end - start)
        if index < middle:
            path.append(_range_hash(node, middle, end))
            end = middle
        else:
            path.append(_perfect(node, start, middle))
            start = middle
    path.reverse()
    return path


def consistency_proof_from(node: SubtreeHash, size1: int, size2: int) -> list[bytes]:
    """RFC 9162 section 2.1.4.1 ``PROOF(size1, D[size2])``, deepest node first.

    ``SUBPROOF`` unrolled into a loop: while the old tree's edge ``size1`` lies
    in the left half, record the right half and descend left; otherwise record
    the (perfect) left half and descend right, which clears the RFC's flag ``b``.
    When the current subtree is exactly the old tree's edge, its own hash is
    added unless ``b`` is still set (the verifier already holds that hash as its
    old root). Equal sizes give the empty proof. A proof from the empty tree is
    refused, as RFC 9162 defines proofs for ``0 < size1`` only and the vectors
    reject any such proof.
    """
    _require_size(size1, field="size1")
    _require_size(size2, field="size2")
    if size1 > size2:
        raise InvalidInput("size1 is larger than size2", field="size1", size1=size1, size2=size2)
    if size1 == 0:
        raise InvalidInput(
            "a consistency proof from the empty tree is meaningless",
            field="size1",
            size1=size1,
            size2=size2,
        )
    if size1 == size2:
        return []
    path: list[bytes] = []
    start, end = 0, size2
    whole_old_tree = True  # the RFC's ``b``
    while size1 != end:
        middle = start + _split(end - start)
        if size1 <= middle:
            path.append(_range_hash(node, middle, end))
            end = middle
        else:
            path.append(_perfect(node, start, middle))
            start = middle
            whole_old_tree = False
    if not whole_old_tree:
        path.append(_range_hash(node, start, end))
    path.reverse()
    return path


def inclusion_proof(leaf_hashes: Sequence[bytes], index: int, size: int) -> list[bytes]:
    """Inclusion proof for leaf ``index`` in the tree of the first ``size`` leaves."""
    return inclusion_proof_from(_list_node(leaf_hashes, size), index, size)


def consistency_proof(leaf_hashes: Sequence[bytes], size1: int, size2: int) -> list[bytes]:
    """Consistency proof between the trees of the first ``size1`` and ``size2`` leaves."""
    return consistency_proof_from(_list_node(leaf_hashes, size2), size1, size2)


# --------------------------------------------------------------------------- verification


def root_from_inclusion(
    leaf_index: int, tree_size: int, leaf_hash: bytes, proof: Sequence[bytes]
) -> bytes:
    """RFC 9162 section 2.1.3.2 steps 1-4: the root that ``proof`` implies.

    Raises when the proof cannot be a proof for this position at all (index
    outside the tree, wrong length, malformed hashes); comparing the result with
    a trusted root is ``verify_inclusion``'s job.
    """
    _require_proof_size(leaf_index, "leaf_index")
    _require_proof_size(tree_size, "tree_size")
    if leaf_index >= tree_size:
        raise MerkleProofError(
            "leaf index is not in the tree",
            reason="index_out_of_range",
            leaf_index=leaf_index,
            tree_size=tree_size,
        )
    _require_hash(leaf_hash, what="leaf hash")
    _require_proof_hashes(proof)
    # The RFC loop below already rejects any other length; checking first gives
    # a precise error instead of a generic mismatch.
    inner = (leaf_index ^ (tree_size - 1)).bit_length()
    expected = inner + (leaf_index >> inner).bit_count()
    _require_proof_length(proof, expected)

    fn, sn = leaf_index, tree_size - 1
    r = leaf_hash
    for p in proof:
        if sn == 0:
            raise MerkleProofError("inclusion proof is too long", reason="proof_length")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise MerkleProofError("inclusion proof is too short", reason="proof_length")
    return r


def verify_inclusion(
    leaf_index: int, tree_size: int, leaf_hash: bytes, proof: Sequence[bytes], root: bytes
) -> None:
    """RFC 9162 section 2.1.3.2: raise unless ``proof`` puts ``leaf_hash`` at ``leaf_index``.

    Note that the proof binds the leaf's position, not the tree size: the size
    is authenticated by the checkpoint that carries ``root``.
    """
    computed = root_from_inclusion(leaf_index, tree_size, leaf_hash, proof)
    _require_hash(root, what="root")
    if computed != root:
        raise MerkleProofError(
            "inclusion proof does not lead to the root",
            reason="root_mismatch",
            leaf_index=leaf_index,
            tree_size=tree_size,
        )


def root_from_consistency(size1: int, size2: int, proof: Sequence[bytes], root1: bytes) -> bytes:
    """RFC 9162 section 2.1.4.2: check ``proof`` against ``root1``; return the root it implies.

    This is what a checkpoint follower needs: from the root it already trusts,
    learn which ``size2`` root the proof commits to (then compare it with the
    signed one). ``verify_consistency`` is this plus the final comparison.
    """
    _check_consistency_sizes(size1, size2)
    if size1 == size2:
        if proof:
            raise MerkleProofError(
                "equal sizes need an empty consistency proof",
                reason="proof_length",
                expected=0,
                got=len(proof),
            )
        return root1
    _require_hash(root1, what="root1")
    _require_proof_hashes(proof)
    # Step 1 of the RFC: an empty path never proves anything between different sizes.
    if not proof:
        raise MerkleProofError("consistency proof is empty", reason="proof_length")
    # Equivalent to what the loop below accepts; see ``root_from_inclusion``.
    _require_proof_length(proof, _consistency_proof_length(size1, size2))

    path = list(proof)
    if size1 & (size1 - 1) == 0:  # step 2: size1 is a power of two
        path.insert(0, root1)
    fn, sn = size1 - 1, size2 - 1  # step 3
    while fn & 1:  # step 4
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]  # step 5
    for c in path[1:]:  # step 6
        if sn == 0:
            raise MerkleProofError("consistency proof is too long", reason="proof_length")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:  # step 7
        raise MerkleProofError("consistency proof is too short", reason="proof_length")
    if fr != root1:
        raise MerkleProofError(
            "consistency proof does not lead to root1",
            reason="root_mismatch",
            size1=size1,
            size2=size2,
        )
    return sr


def verify_consistency(
    size1: int, size2: int, proof: Sequence[bytes], root1: bytes, root2: bytes
) -> None:
    """RFC 9162 section 2.1.4.2: raise unless the ``size2`` tree extends the ``size1`` tree.

    Special cases, as the RFC and the vectors fix them: ``size1 > size2`` fails;
    ``size1 == 0`` fails (no proof from the empty tree is defined, even to an
    empty tree); equal sizes need an empty proof and byte-equal roots.

    In the equal-size case the roots are only compared, not length-checked: the
    claim reduces to ``root1 == root2`` and the upstream vector
    ``sizes-are-equal-one-and-proof-is-empty`` requires accepting two equal
    12-byte roots. Everywhere else a root that is not 32 bytes is rejected.
    """
    computed = root_from_consistency(size1, size2, proof, root1)
    if size1 != size2:
        _require_hash(root2, what="root2")
    if computed != root2:
        raise MerkleProofError(
            "consistency proof does not lead to root2",
            reason="root_mismatch",
            size1=size1,
            size2=size2,
        )


# --------------------------------------------------------------------------- internals


def _split(n: int) -> int:
    """The RFC's ``k``: the largest power of two strictly smaller than ``n`` (``n > 1``)."""
    return 1 << ((n - 1).bit_length() - 1)


def _perfect_pieces(start: int, end: int) -> Iterator[tuple[int, int]]:
    """Split an RFC subtree ``[start, end)`` into perfect subtrees, largest first.

    For every range the RFC recursion produces, ``start`` is a multiple of the
    first piece's width, so each piece is aligned as ``node`` requires.
    """
    while start < end:
        width = 1 << ((end - start).bit_length() - 1)
        yield start, start + width
        start += width


def _range_hash(node: SubtreeHash, start: int, end: int) -> bytes:
    """MTH of an RFC subtree from its perfect pieces, folded from the right.

    A non-perfect subtree of ``n`` leaves is ``node_hash(first perfect piece,
    rest)`` by the RFC's definition, because its split point is the width of its
    largest perfect piece; folding right-to-left applies that definition
    iteratively.
    """
    pieces = [_perfect(node, s, e) for s, e in _perfect_pieces(start, end)]
    acc = pieces[-1]
    for piece in reversed(pieces[:-1]):
        acc = node_hash(piece, acc)
    return acc


def _perfect(node: SubtreeHash, start: int, end: int) -> bytes:
    """Call ``node`` and refuse a malformed answer: a bad cache must not yield a proof."""
    value = node(start, end)
    _require_hash(value, what="subtree hash", start=start, end=end)
    return value


def _list_node(leaf_hashes: Sequence[bytes], size: int) -> SubtreeHash:
    """A ``node`` over an in-memory list (O(end - start) per call; fine below a log's size)."""
    _require_size(size, field="size")
    if size > len(leaf_hashes):
        raise InvalidInput(
            "tree size is larger than the number of leaves",
            field="size",
            size=size,
            leaves=len(leaf_hashes),
        )

    def node(start: int, end: int) -> bytes:
        return root(leaf_hashes[start:end])

    return node


def _consistency_proof_length(size1: int, size2: int) -> int:
    """How many hashes RFC 9162's verifier consumes for ``0 < size1 < size2``.

    After dropping the common low 1-bits of ``size1 - 1`` (step 4), one hash
    is used per level until the two edges meet (``inner``) and one per set bit
    above that (``border``), plus the first hash unless it is ``root1`` itself
    (``size1`` a power of two, step 2).
    """
    shift = (size1 & -size1).bit_length() - 1  # trailing zeros of size1 = low 1-bits of size1-1
    fn, sn = (size1 - 1) >> shift, (size2 - 1) >> shift
    inner = (fn ^ sn).bit_length()
    border = (fn >> inner).bit_count()
    first = 0 if size1 & (size1 - 1) == 0 else 1
    return first + inner + border


def _check_consistency_sizes(size1: int, size2: int) -> None:
    _require_proof_size(size1, "size1")
    _require_proof_size(size2, "size2")
    if size1 > size2:
        raise MerkleProofError(
            "size1 is larger than size2", reason="size_order", size1=size1, size2=size2
        )
    if size1 == 0:
        raise MerkleProofError(
            "a consistency proof from the empty tree is meaningless",
            reason="empty_tree",
            size1=size1,
            size2=size2,
        )


def _require_proof_length(proof: Sequence[bytes], expected: int) -> None:
    if len(proof) != expected:
        raise MerkleProofError(
            f"proof has {len(proof)} hashes, expected {expected}",
            reason="proof_length",
            expected=expected,
            got=len(proof),
        )


def _require_proof_hashes(proof: Sequence[bytes]) -> None:
    for position, value in enumerate(proof):
        _require_hash(value, what="proof hash", position=position)


def _require_hash(value: object, *, what: str, **details: Any) -> None:
    if not isinstance(value, bytes) or len(value) != HASH_SIZE:
        got = len(value) if isinstance(value, bytes | bytearray) else type(value).__name__
        raise MerkleProofError(
            f"{what} must be {HASH_SIZE} bytes", reason="hash_length", what=what, got=got, **details
        )


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _require_proof_size(value: object, name: str) -> None:
    """Sizes and indices handed to a verifier: part of the claim being checked."""
    if not _is_size(value):
        raise MerkleProofError(
            f"{name} must be a non-negative integer", reason="bad_size", field=name, got=repr(value)
        )


def _require_size(value: object, *, field: str) -> None:
    """Sizes and indices of a proof request: the caller's input."""
    if not _is_size(value):
        raise InvalidInput(f"{field} must be a non-negative integer", field=field, got=repr(value))
