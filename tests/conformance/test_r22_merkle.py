"""R22: the log's Merkle tree is RFC 6962 / RFC 9162 and passes every shared vector.

Three kinds of evidence, because each alone can miss a class of bug:

- the third-party vectors in ``../shared/vectors/rfc6962`` (every file, each
  giving exactly its ``wantErr``), which pin the verifiers to the reference
  implementation, special cases included;
- independent transcriptions of the RFC's recursive definitions (MTH, PATH,
  PROOF) compared with the iterative code, which pin the generators;
- property tests: every generated proof verifies, and any flipped bit or wrong
  position fails.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain import merkle
from domain.errors import IntegrityFailure, InvalidInput
from domain.merkle import MerkleProofError

VECTORS = Path(__file__).resolve().parents[3] / "shared" / "vectors" / "rfc6962"

# The inputs the vectors were generated from: the RFC 6962 reference leaves
# (their 8-leaf root is 5dc9da79…4328, the root of inclusion/1/happy-path).
RFC6962_LEAVES = [
    bytes.fromhex(h)
    for h in (
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    )
]

Node = Callable[[int, int], bytes]


# --------------------------------------------------------------------------- vectors


def _vector_files(kind: str) -> list[Path]:
    """Every case of one kind; a missing or empty folder is an error, never a skip."""
    folder = VECTORS / kind
    files = sorted(folder.rglob("*.json")) if folder.is_dir() else []
    if not files:
        raise RuntimeError(
            f"R22 conformance vectors are missing: no *.json under {folder}. "
            "They live in ../shared/vectors/rfc6962 next to the repository."
        )
    return files


def _vector_id(path: Path) -> str:
    """``inclusion/1/happy-path.json`` -> ``1/happy-path`` (the kind is in the test name)."""
    return "/".join(path.relative_to(VECTORS).with_suffix("").parts[1:])


INCLUSION_FILES = _vector_files("inclusion")
CONSISTENCY_FILES = _vector_files("consistency")


def _load(path: Path) -> dict[str, Any]:
    case = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(case, dict), f"{path}: a vector must be a JSON object"
    assert isinstance(case.get("wantErr"), bool), f"{path}: wantErr must be true or false"
    return case


def _b64(value: object) -> bytes:
    """A base64 field; ``null`` or missing means no bytes (which no check accepts)."""
    if value is None:
        return b""
    assert isinstance(value, str), f"hash field must be a base64 string, got {value!r}"
    return base64.b64decode(value, validate=True)


def _b64_list(value: object) -> list[bytes]:
    if value is None:
        return []
    assert isinstance(value, list), f"proof must be a list, got {value!r}"
    return [_b64(item) for item in value]


def _size(case: dict[str, Any], key: str) -> int:
    value = case[key]
    assert isinstance(value, int), f"{key} must be an integer, got {value!r}"
    return value


def _expect(want_err: bool, desc: str, check: Callable[[], None]) -> None:
    """Exactly ``wantErr``: a typed rejection iff the case is bad; any other exception is a bug."""
    try:
        check()
    except MerkleProofError as err:
        assert want_err, f"rejected a valid case ({desc}): {err.message} {err.details}"
    else:
        assert not want_err, f"accepted an invalid case ({desc})"


@pytest.mark.parametrize("path", INCLUSION_FILES, ids=_vector_id)
def test_r22_inclusion_vector(path: Path) -> None:
    case = _load(path)
    leaf_index, tree_size = _size(case, "leafIdx"), _size(case, "treeSize")
    leaf, proof, root = (
        _b64(case.get("leafHash")),
        _b64_list(case.get("proof")),
        _b64(case.get("root")),
    )
    _expect(
        case["wantErr"],
        str(case.get("desc")),
        lambda: merkle.verify_inclusion(leaf_index, tree_size, leaf, proof, root),
    )


@pytest.mark.parametrize("path", CONSISTENCY_FILES, ids=_vector_id)
def test_r22_consistency_vector(path: Path) -> None:
    case = _load(path)
    size1, size2 = _size(case, "size1"), _size(case, "size2")
    proof = _b64_list(case.get("proof"))
    root1, root2 = _b64(case.get("root1")), _b64(case.get("root2"))
    _expect(
        case["wantErr"],
        str(case.get("desc")),
        lambda: merkle.verify_consistency(size1, size2, proof, root1, root2),
    )


HAPPY_FILES = [p for p in INCLUSION_FILES + CONSISTENCY_FILES if p.name == "happy-path.json"]


@pytest.mark.parametrize(
    "path", HAPPY_FILES, ids=lambda p: p.relative_to(VECTORS).with_suffix("").as_posix()
)
def test_r22_generators_reproduce_vector_happy_paths(path: Path) -> None:
    """Our generators emit, byte for byte, the proofs the vectors were made with."""
    case = _load(path)
    hashes = [merkle.leaf_hash(d) for d in RFC6962_LEAVES]
    if "leafIdx" in case:
        index, size = _size(case, "leafIdx"), _size(case, "treeSize")
        assert merkle.leaf_hash(RFC6962_LEAVES[index]) == _b64(case["leafHash"])
        assert merkle.root(hashes[:size]) == _b64(case["root"])
        assert merkle.inclusion_proof(hashes, index, size) == _b64_list(case.get("proof"))
    else:
        size1, size2 = _size(case, "size1"), _size(case, "size2")
        assert merkle.root(hashes[:size1]) == _b64(case["root1"])
        assert merkle.root(hashes[:size2]) == _b64(case["root2"])
        assert merkle.consistency_proof(hashes, size1, size2) == _b64_list(case.get("proof"))


# --------------------------------------------------------------------------- RFC definitions


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def _mth(data: Sequence[bytes]) -> bytes:
    """RFC 9162 2.1.1, transcribed recursively over raw entries."""
    if not data:
        return _sha256(b"")
    if len(data) == 1:
        return _sha256(b"\x00" + data[0])
    k = _k(len(data))
    return _sha256(b"\x01" + _mth(data[:k]) + _mth(data[k:]))


def _path(m: int, data: Sequence[bytes]) -> list[bytes]:
    """RFC 9162 2.1.3.1 PATH(m, D[n]), transcribed recursively."""
    if len(data) == 1:
        return []
    k = _k(len(data))
    if m < k:
        return [*_path(m, data[:k]), _mth(data[k:])]
    return [*_path(m - k, data[k:]), _mth(data[:k])]


def _subproof(m: int, data: Sequence[bytes], b: bool) -> list[bytes]:
    """RFC 9162 2.1.4.1 SUBPROOF(m, D[n], b), transcribed recursively."""
    if m == len(data):
        return [] if b else [_mth(data)]
    k = _k(len(data))
    if m <= k:
        return [*_subproof(m, data[:k], b), _mth(data[k:])]
    return [*_subproof(m - k, data[k:], False), _mth(data[:k])]


def test_r22_empty_tree_and_domain_separation() -> None:
    assert merkle.root([]) == hashlib.sha256(b"").digest() == merkle.EMPTY_ROOT
    assert merkle.leaf_hash(b"abc") == _sha256(b"\x00abc")
    assert merkle.node_hash(b"L" * 32, b"R" * 32) == _sha256(b"\x01" + b"L" * 32 + b"R" * 32)
    assert merkle.root([merkle.leaf_hash(b"")]) == _sha256(b"\x00")


@pytest.mark.parametrize("n", range(70))
def test_r22_root_matches_recursive_mth(n: int) -> None:
    data = [i.to_bytes(2, "big") * (i % 3) for i in range(n)]
    hashes = [merkle.leaf_hash(d) for d in data]
    assert merkle.root(hashes) == _mth(data)
    assert merkle.root_from(_cached_node(hashes), n) == _mth(data)
    if n:
        assert merkle.subtree_root(hashes, 1, n) == _mth(data[1:])


def test_r22_proofs_match_recursive_rfc_definitions() -> None:
    data = [b"entry %d" % i for i in range(40)]
    hashes = [merkle.leaf_hash(d) for d in data]
    for n in range(1, len(data) + 1):
        for m in range(n):
            assert merkle.inclusion_proof(hashes, m, n) == _path(m, data[:n]), (m, n)
        for m in range(1, n + 1):
            assert merkle.consistency_proof(hashes, m, n) == _subproof(m, data[:n], True), (m, n)


# --------------------------------------------------------------------------- properties


def _cached_node(leaf_hashes: Sequence[bytes]) -> Node:
    """A subtree cache that also enforces the contract: only perfect, aligned ranges."""

    @functools.cache
    def node(start: int, end: int) -> bytes:
        width = end - start
        assert width > 0, (start, end)
        assert width & (width - 1) == 0, f"non-perfect subtree requested: {(start, end)}"
        assert start % width == 0, f"unaligned subtree requested: {(start, end)}"
        if width == 1:
            return leaf_hashes[start]
        middle = start + width // 2
        return merkle.node_hash(node(start, middle), node(middle, end))

    return node


def _distinct_leaves(salt: bytes, count: int) -> list[bytes]:
    """Distinct entries: with duplicates a proof for one index can honestly fit another."""
    return [merkle.leaf_hash(salt + i.to_bytes(4, "big")) for i in range(count)]


def _flip_bit(value: bytes, rnd: random.Random) -> bytes:
    bit = rnd.randrange(len(value) * 8)
    flipped = bytearray(value)
    flipped[bit // 8] ^= 1 << (bit % 8)
    return bytes(flipped)


def _tampered(proof: list[bytes], rnd: random.Random) -> list[list[bytes]]:
    """One variant per element, each with one random bit of that element flipped."""
    return [[*proof[:i], _flip_bit(proof[i], rnd), *proof[i + 1 :]] for i in range(len(proof))]


EXTRA = 8  # leaves past the tree, so "wrong size" can also be too large


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(1, 300),
    salt=st.binary(max_size=8),
    rnd=st.randoms(use_true_random=False),
)
def test_r22_every_inclusion_proof_verifies_and_tampering_fails(
    size: int, salt: bytes, rnd: random.Random
) -> None:
    leaves = _distinct_leaves(salt, size + EXTRA)
    node = _cached_node(leaves)
    roots = functools.cache(lambda n: merkle.root(leaves[:n]))
    tree_root = roots(size)
    for index in range(size):
        proof = merkle.inclusion_proof_from(node, index, size)
        if rnd.random() < 0.05:
            assert merkle.inclusion_proof(leaves, index, size) == proof
        merkle.verify_inclusion(index, size, leaves[index], proof, tree_root)

        for bad in _tampered(proof, rnd):
            with pytest.raises(MerkleProofError):
                merkle.verify_inclusion(index, size, leaves[index], bad, tree_root)
        with pytest.raises(MerkleProofError):
            merkle.verify_inclusion(index, size, _flip_bit(leaves[index], rnd), proof, tree_root)
        with pytest.raises(MerkleProofError):
            merkle.verify_inclusion(index, size, leaves[index], proof, _flip_bit(tree_root, rnd))
        with pytest.raises(MerkleProofError):
            merkle.verify_inclusion(size, size, leaves[index], proof, tree_root)
        if size > 1:
            other = rnd.choice(
                [
                    i
                    for i in (index - 1, index + 1, rnd.randrange(size))
                    if i != index and 0 <= i < size
                ]
            )
            with pytest.raises(MerkleProofError):
                merkle.verify_inclusion(other, size, leaves[index], proof, tree_root)
        # A wrong size, checked against that size's own root. (Against the right
        # root a wrong size can pass: the proof binds the position, the signed
        # checkpoint binds the size; see the test below.)
        wrong = rnd.choice(
            [n for n in (index + 1, size - 1, size + 1, size + EXTRA) if n > index and n != size]
        )
        with pytest.raises(MerkleProofError):
            merkle.verify_inclusion(index, wrong, leaves[index], proof, roots(wrong))


@settings(max_examples=40, deadline=None)
@given(
    size2=st.integers(1, 300),
    salt=st.binary(max_size=8),
    rnd=st.randoms(use_true_random=False),
)
def test_r22_every_consistency_proof_verifies_and_tampering_fails(
    size2: int, salt: bytes, rnd: random.Random
) -> None:
    leaves = _distinct_leaves(salt, size2 + EXTRA)
    node = _cached_node(leaves)
    roots = [merkle.root(leaves[:n]) for n in range(len(leaves) + 1)]
    for size1 in range(1, size2 + 1):
        proof = merkle.consistency_proof_from(node, size1, size2)
        if rnd.random() < 0.05:
            assert merkle.consistency_proof(leaves, size1, size2) == proof
        merkle.verify_consistency(size1, size2, proof, roots[size1], roots[size2])
        assert merkle.root_from_consistency(size1, size2, proof, roots[size1]) == roots[size2]
        if size1 == size2:
            assert proof == []
            with pytest.raises(MerkleProofError):
                merkle.verify_consistency(size1, size2, [roots[size1]], roots[size1], roots[size2])
            continue

        for bad in _tampered(proof, rnd):
            with pytest.raises(MerkleProofError):
                merkle.verify_consistency(size1, size2, bad, roots[size1], roots[size2])
        with pytest.raises(MerkleProofError):
            merkle.verify_consistency(size1, size2, proof, roots[size2], roots[size1])
        with pytest.raises(MerkleProofError):
            merkle.verify_consistency(
                size1, size2, proof, _flip_bit(roots[size1], rnd), roots[size2]
            )
        with pytest.raises(MerkleProofError):
            merkle.verify_consistency(
                size1, size2, proof, roots[size1], _flip_bit(roots[size2], rnd)
            )
        with pytest.raises(MerkleProofError):
            merkle.verify_consistency(size1, size2, proof[:-1], roots[size1], roots[size2])
        with pytest.raises(MerkleProofError):
            merkle.verify_consistency(size1, size2, [*proof, proof[-1]], roots[size1], roots[size2])
        # Wrong sizes, each checked against the roots of the sizes claimed.
        m = rnd.randrange(1, len(leaves) + 1)
        n = rnd.randrange(m, len(leaves) + 1)
        for wrong1, wrong2 in {(size1 - 1, size2), (size1 + 1, size2), (size1, size2 + 1), (m, n)}:
            if (wrong1, wrong2) == (size1, size2) or not 0 < wrong1 <= wrong2:
                continue
            with pytest.raises(MerkleProofError):
                merkle.verify_consistency(wrong1, wrong2, proof, roots[wrong1], roots[wrong2])


def test_r22_inclusion_proof_does_not_bind_tree_size() -> None:
    """RFC 9162 as written: the proof fixes the leaf's path, the checkpoint fixes the size.

    PATH(0, D[5]) has the same shape as a path in a 6-leaf tree, so it checks
    against the 5-leaf root with either size; what an auditor trusts is the
    signed (size, root) pair. Kept as a test so nobody "tightens" the verifier
    away from the RFC and the vectors.
    """
    leaves = _distinct_leaves(b"size", 6)
    proof = merkle.inclusion_proof(leaves, 0, 5)
    merkle.verify_inclusion(0, 6, leaves[0], proof, merkle.root(leaves[:5]))
    with pytest.raises(MerkleProofError):
        merkle.verify_inclusion(0, 6, leaves[0], proof, merkle.root(leaves[:6]))


# --------------------------------------------------------------------------- scale


def test_r22_proofs_over_a_million_leaves_use_log_many_subtree_hashes() -> None:
    """A store answers proofs from cached subtree hashes: O(log n) lookups, no leaf scan.

    With every leaf equal, the hash of each perfect subtree depends only on its
    height, so a million-leaf tree is cheap to describe exactly; the bottom-up
    ``root`` over the real list must agree with it (and must not recurse).
    """
    size = 1_000_000
    leaf = merkle.leaf_hash(b"same")
    heights = [leaf]
    for _ in range(size.bit_length()):
        heights.append(merkle.node_hash(heights[-1], heights[-1]))
    calls: list[tuple[int, int]] = []

    def node(start: int, end: int) -> bytes:
        width = end - start
        assert width & (width - 1) == 0 and start % width == 0, (start, end)
        calls.append((start, end))
        return heights[width.bit_length() - 1]

    tree_root = merkle.root([leaf] * size)
    assert merkle.root_from(node, size) == tree_root
    budget = 2 * size.bit_length()
    for index in (0, 1, 123_456, 524_287, 524_288, size - 1):
        calls.clear()
        proof = merkle.inclusion_proof_from(node, index, size)
        assert len(calls) <= budget, (index, len(calls))
        merkle.verify_inclusion(index, size, leaf, proof, tree_root)
    for size1 in (1, 2, 3, 123_457, 524_288, 765_432, size - 1):
        calls.clear()
        proof = merkle.consistency_proof_from(node, size1, size)
        assert len(calls) <= budget, (size1, len(calls))
        merkle.verify_consistency(size1, size, proof, merkle.root_from(node, size1), tree_root)


# --------------------------------------------------------------------------- malformed input


H = merkle.leaf_hash(b"x")


@pytest.mark.parametrize(
    ("leaf_index", "tree_size", "leaf", "proof", "root"),
    [
        pytest.param(0, 0, H, [], H, id="empty-tree"),
        pytest.param(1, 1, H, [], H, id="index-equals-size"),
        pytest.param(-1, 1, H, [], H, id="negative-index"),
        pytest.param(0, -1, H, [], H, id="negative-size"),
        pytest.param(True, 2, H, [H], H, id="bool-index"),
        pytest.param(0, 1, H[:31], [], H[:31], id="short-leaf"),
        pytest.param(0, 1, H, [], H + b"\x00", id="long-root"),
        pytest.param(0, 2, H, [H[:31]], H, id="short-proof-hash"),
        pytest.param(0, 2, H, [H, H], H, id="proof-too-long"),
        pytest.param(0, 2, H, [], H, id="proof-too-short"),
        pytest.param(2**64 - 1, 1, H, [], H, id="uint64-wrapped-index"),
    ],
)
def test_r22_verify_inclusion_rejects_malformed_input(
    leaf_index: int, tree_size: int, leaf: bytes, proof: list[bytes], root: bytes
) -> None:
    with pytest.raises(MerkleProofError) as caught:
        merkle.verify_inclusion(leaf_index, tree_size, leaf, proof, root)
    assert isinstance(caught.value, IntegrityFailure)
    assert caught.value.code == "INTEGRITY" and caught.value.exit_code == 6
    assert caught.value.details["reason"]


@pytest.mark.parametrize(
    ("size1", "size2", "proof", "root1", "root2"),
    [
        pytest.param(2, 1, [], H, H, id="size1-above-size2"),
        pytest.param(0, 0, [], H, H, id="both-empty"),
        pytest.param(0, 3, [H], merkle.EMPTY_ROOT, H, id="from-empty"),
        pytest.param(-1, 3, [H], H, H, id="negative-size1"),
        pytest.param(3, 3, [H], H, H, id="equal-sizes-with-proof"),
        pytest.param(3, 3, [], H, merkle.EMPTY_ROOT, id="equal-sizes-other-root"),
        pytest.param(1, 2, [], H, H, id="empty-proof"),
        pytest.param(1, 2, [H[:16]], H, H, id="short-proof-hash"),
        pytest.param(1, 2, [H], H[:16], H, id="short-root1"),
        pytest.param(1, 2, [H], H, H[:16], id="short-root2"),
        pytest.param(3, 4, [H], H, H, id="proof-too-short"),
    ],
)
def test_r22_verify_consistency_rejects_malformed_input(
    size1: int, size2: int, proof: list[bytes], root1: bytes, root2: bytes
) -> None:
    with pytest.raises(MerkleProofError) as caught:
        merkle.verify_consistency(size1, size2, proof, root1, root2)
    assert caught.value.details["reason"]


def test_r22_proof_requests_outside_the_tree_are_invalid_input() -> None:
    leaves = _distinct_leaves(b"req", 4)
    with pytest.raises(InvalidInput):
        merkle.inclusion_proof(leaves, 4, 4)
    with pytest.raises(InvalidInput):
        merkle.inclusion_proof(leaves, 0, 5)
    with pytest.raises(InvalidInput):
        merkle.consistency_proof(leaves, 3, 2)
    with pytest.raises(InvalidInput):
        merkle.consistency_proof(leaves, 0, 2)
    with pytest.raises(InvalidInput):
        merkle.subtree_root(leaves, 2, 5)
    with pytest.raises(MerkleProofError):
        merkle.root([*leaves, b"short"])


def test_r22_a_corrupt_subtree_cache_cannot_yield_a_proof() -> None:
    with pytest.raises(MerkleProofError):
        merkle.inclusion_proof_from(lambda start, end: b"\x00" * 31, 0, 4)


# -- proof files whose fields repeat each other ----------------------------------------------


@pytest.fixture(scope="module")
def proof_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An inclusion proof of position 5 and a consistency proof from size 3, from a real
    SQLite store, with the checkpoint they were made against (the check is offline: no
    engine is involved in what these tests prove)."""
    from tests.support.cli_inprocess import cli, cli_json
    from tests.support.lifecycle_support import World

    tmp = tmp_path_factory.mktemp("proofs")
    world = World(tmp, f"sqlite:///{tmp / 'ledger.db'}")
    try:
        world.apply(world.official("sales", world.commit("sales", 1)))
        world.apply(world.official("sales", world.commit("sales", 2)))
        assert world.head() >= 7
        checkpoint = tmp / "cp.txt"
        checkpoint.write_text(cli("--db", world.url, "audit", "checkpoint").stdout)
        inclusion = cli_json("--db", world.url, "audit", "prove", "--position", "5")[1]
        other = cli_json("--db", world.url, "audit", "prove", "--position", "6")[1]
        consistency = cli_json("--db", world.url, "audit", "prove", "--from-size", "3")[1]
    finally:
        world.close()
    return {
        "folder": tmp,
        "checkpoint": checkpoint,
        "inclusion": inclusion,
        "other": other,
        "consistency": consistency,
    }


def _verify(files: dict[str, Any], document: dict[str, Any]) -> tuple[int, Any]:
    from tests.support.cli_inprocess import cli_json

    path = files["folder"] / "edited.json"
    path.write_text(json.dumps(document))
    return cli_json("audit", "verify-proof", str(path), "--checkpoint", str(files["checkpoint"]))


ZERO_ROOT = base64.b64encode(bytes(32)).decode()


@pytest.mark.parametrize(
    ("kind", "edit", "fields"),
    [
        ("inclusion", {"position": 6}, ["position", "leaf_index"]),
        ("inclusion", {"leaf_index": 5}, ["position", "leaf_index"]),
        ("inclusion", {"position": 4}, ["position", "leaf_index"]),
        ("inclusion", {"tree_size": -1}, ["tree_size", "checkpoint.size"]),
        ("inclusion", {"root": ZERO_ROOT}, ["root", "checkpoint.root"]),
        ("inclusion", {"leaf_hash": "other"}, ["leaf_hash", "event_id"]),
        ("inclusion", {"event_id": "other"}, ["leaf_hash", "event_id"]),
        ("consistency", {"size2": -1}, ["size2", "checkpoint.size"]),
        ("consistency", {"root2": ZERO_ROOT}, ["root2", "checkpoint.root"]),
    ],
)
def test_r22_a_proof_field_that_disagrees_with_the_field_it_repeats_is_integrity_naming_both(
    proof_files: dict[str, Any], kind: str, edit: dict[str, Any], fields: list[str]
) -> None:
    original = proof_files[kind]
    assert _verify(proof_files, original)[0] == 0  # the unedited proof verifies
    edited = dict(original)
    for name, given_value in edit.items():
        value = given_value
        if given_value == "other":  # the same field of the proof of the next position
            value = proof_files["other"][name]
        elif given_value == -1:
            value = original[name] - 1
        assert value != original[name]
        edited[name] = value
    code, error = _verify(proof_files, edited)
    assert (code, error["error"]) == (6, "INTEGRITY"), error
    assert error["details"]["fields"] == fields, error
    assert f"the proof's {fields[0]} and {fields[1]} disagree" in error["message"], error


def test_r22_verify_proof_never_reports_a_position_its_proof_does_not_prove(
    proof_files: dict[str, Any],
) -> None:
    """The issue's case (position 5 -> 6, leaf_index still 4), and the same claim made
    consistently (position 6, leaf_index 5): that proof is not one of position 6."""
    original = proof_files["inclusion"]
    assert (original["position"], original["leaf_index"]) == (5, 4)
    code, result = _verify(proof_files, original)
    assert (code, result["position"]) == (0, 5)
    code, error = _verify(proof_files, {**original, "position": 6})
    assert code == 6 and "position 6 is not leaf_index 4 + 1" in error["message"], error
    code, error = _verify(proof_files, {**original, "position": 6, "leaf_index": 5})
    assert (code, error["error"]) == (6, "INTEGRITY"), error
    assert "position" not in error.get("details", {}).get("fields", []), error
