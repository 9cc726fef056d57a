"""R29: the witness's memory is one compare-and-swap per origin in its own SQLite file:
it never cosigns a smaller tree after a larger one, nor another root for a size it
cosigned, whatever the order of requests or a reopening of the file; refused forks
are kept as evidence."""

from __future__ import annotations

import base64
import threading
from pathlib import Path

import pytest

from domain import merkle
from domain.errors import InvalidInput
from domain.notes import Checkpoint, SignerKey, WitnessSigner, verify_cosignatures
from ledger.witness.state import SizeMismatch, Unprocessable, WitnessState

ORIGIN = "log.example/r29"
LOG = SignerKey.generate("log.example/r29")
WITNESS = WitnessSigner.generate("witness.example/w1")
LEAVES = [merkle.leaf_hash(b"leaf %d" % i) for i in range(32)]
FORGED = [merkle.leaf_hash(b"forged %d" % i) for i in range(32)]


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _cp(size: int, leaves: list[bytes] = LEAVES) -> tuple[Checkpoint, str]:
    checkpoint = Checkpoint(ORIGIN, size, merkle.root(leaves[:size]))
    return checkpoint, LOG.sign(checkpoint.text())


def _advance(
    state: WitnessState,
    size: int,
    old: int,
    proof: list[bytes] | None = None,
    *,
    leaves: list[bytes] = LEAVES,
    clock: Clock | None = None,
) -> int:
    checkpoint, note = _cp(size, leaves)
    if proof is None:
        proof = merkle.consistency_proof(leaves, old, size) if 0 < old < size else []
    cosigned = state.advance(
        checkpoint,
        note,
        old,
        proof,
        cosign=lambda t: WITNESS.cosign(checkpoint.text(), t),
        clock=clock or Clock(1000),
    )
    assert verify_cosignatures(note + cosigned.line + "\n", [WITNESS.verifier]) == {
        WITNESS.verifier: cosigned.timestamp
    }
    return cosigned.timestamp


@pytest.fixture
def state(tmp_path: Path) -> WitnessState:
    return WitnessState(tmp_path / "witness.db")


def test_r29_first_cosign_then_extend_with_a_proof(state: WitnessState) -> None:
    _advance(state, 5, 0)
    _advance(state, 9, 5)
    known = state.known(ORIGIN)
    assert known is not None
    assert (known.size, known.root) == (9, merkle.root(LEAVES[:9]))
    assert verify_cosignatures(known.note, [WITNESS.verifier])  # the kept note is cosigned


def test_r29_old_size_must_be_the_cosigned_size(state: WitnessState) -> None:
    with pytest.raises(SizeMismatch):  # nothing cosigned yet: old must be 0
        _advance(state, 5, 3)
    _advance(state, 5, 0)
    for old in (0, 4, 6):
        with pytest.raises(SizeMismatch) as caught:
            _advance(state, 9, old)
        assert caught.value.known == 5


def test_r29_a_smaller_size_after_a_larger_is_refused(state: WitnessState) -> None:
    _advance(state, 10, 0)
    with pytest.raises(SizeMismatch) as caught:
        _advance(state, 6, 0)
    assert caught.value.known == 10
    assert state.known(ORIGIN).size == 10  # type: ignore[union-attr]
    assert state.evidence() == []  # an old checkpoint is no fork


def test_r29_same_size_other_root_is_refused_and_kept(state: WitnessState) -> None:
    _advance(state, 8, 0)
    with pytest.raises(Unprocessable) as caught:
        _advance(state, 8, 8, leaves=FORGED, clock=Clock(2000))
    assert caught.value.reason == "root_mismatch"
    [evidence] = state.evidence()
    assert evidence["id"] == caught.value.evidence
    assert (evidence["reason"], evidence["recorded_at"], evidence["old_size"]) == (
        "root_mismatch",
        2000,
        8,
    )
    assert evidence["note"] == _cp(8, FORGED)[1]
    assert evidence["known"]["size"] == 8
    assert state.known(ORIGIN).root == merkle.root(LEAVES[:8])  # type: ignore[union-attr]


def test_r29_same_size_other_root_with_a_proof_is_still_kept(state: WitnessState) -> None:
    """A needless proof does not turn a fork into a mere malformed request."""
    _advance(state, 8, 0)
    with pytest.raises(Unprocessable) as caught:
        _advance(state, 8, 8, [LEAVES[0]], leaves=FORGED)
    assert caught.value.reason == "root_mismatch"
    assert [e["reason"] for e in state.evidence()] == ["root_mismatch"]


def test_r29_inconsistent_larger_tree_is_refused_and_kept(state: WitnessState) -> None:
    _advance(state, 8, 0)
    forged_proof = merkle.consistency_proof(FORGED, 8, 12)
    with pytest.raises(Unprocessable) as caught:
        _advance(state, 12, 8, forged_proof, leaves=FORGED)
    assert caught.value.reason == "inconsistent_tree"
    [evidence] = state.evidence()
    assert evidence["proof"] == [base64.b64encode(h).decode() for h in forged_proof]
    assert state.known(ORIGIN).size == 8  # type: ignore[union-attr]
    _advance(state, 12, 8)  # the honest log still moves on


def test_r29_spec_422_cases_without_evidence(state: WitnessState) -> None:
    """tlog-witness: size 0 needs the empty tree's root; no proof is sent from size 0;
    the same size needs an empty proof."""
    empty_forged = Checkpoint(ORIGIN, 0, merkle.leaf_hash(b"x"))
    with pytest.raises(Unprocessable) as caught:
        state.advance(
            empty_forged,
            LOG.sign(empty_forged.text()),
            0,
            [],
            cosign=lambda t: WITNESS.cosign(empty_forged.text(), t),
            clock=Clock(1),
        )
    assert caught.value.reason == "empty_root"
    with pytest.raises(Unprocessable) as caught:
        _advance(state, 4, 0, [LEAVES[0]])
    assert caught.value.reason == "proof_length"
    _advance(state, 4, 0)
    with pytest.raises(Unprocessable) as caught:
        _advance(state, 4, 4, [LEAVES[0]])
    assert caught.value.reason == "proof_length"
    assert state.evidence() == []


def test_r29_recosign_same_tree_gives_a_fresh_timestamp(state: WitnessState) -> None:
    assert _advance(state, 6, 0, clock=Clock(1000)) == 1000
    assert _advance(state, 6, 6, clock=Clock(1060)) == 1060
    assert state.known(ORIGIN).cosigned_at == 1060  # type: ignore[union-attr]


def test_r29_memory_survives_reopening(tmp_path: Path) -> None:
    _advance(WitnessState(tmp_path / "w.db"), 7, 0)
    again = WitnessState(tmp_path / "w.db")
    with pytest.raises(Unprocessable):
        _advance(again, 7, 7, leaves=FORGED)
    with pytest.raises(SizeMismatch):
        _advance(again, 3, 0)
    assert len(WitnessState(tmp_path / "w.db").evidence()) == 1


def test_r29_racing_requests_cosign_one_tree(tmp_path: Path) -> None:
    """Two writers (threads with their own connections, as two HTTP requests) advance
    from the same old size to different sizes: exactly one wins the CAS, the other sees
    the new size (never a rollback of the winner)."""
    state = WitnessState(tmp_path / "w.db")
    _advance(state, 4, 0)
    results: dict[int, object] = {}
    barrier = threading.Barrier(2)

    def run(size: int) -> None:
        barrier.wait()
        try:
            results[size] = _advance(WitnessState(tmp_path / "w.db"), size, 4)
        except SizeMismatch as exc:
            results[size] = exc.known

    threads = [threading.Thread(target=run, args=(size,)) for size in (9, 13)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winner = 9 if results[9] == 1000 else 13
    loser = 13 if winner == 9 else 9
    assert results[loser] == winner
    assert state.known(ORIGIN).size == winner  # type: ignore[union-attr]


def test_r29_a_file_that_is_not_a_witness_file_is_invalid(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    other.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(InvalidInput) as caught:
        WitnessState(other)
    assert caught.value.field == "db"
