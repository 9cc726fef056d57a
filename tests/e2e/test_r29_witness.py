"""R29, the witnesses as real processes: three ``catalog-ledger witness serve`` on
loopback and a k = 2 policy. A log's checkpoint is cosigned by all three; a rewritten
log (the same size with another root, or a larger tree that does not extend the
cosigned one) is refused by each witness that cosigned it, which keeps the evidence;
a smaller size after a larger is refused; a witness killed and started again on its
file still refuses the fork; re-submitting the same tree gets a newer timestamp.

The processes start once for the module; each test uses its own log origin, so the
tests do not depend on their order. Time is a file the witnesses read (``--clock-file``):
tests move it instead of sleeping.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from domain import merkle
from domain.errors import IntegrityFailure
from domain.notes import (
    Checkpoint,
    SignerKey,
    WitnessKey,
    add_cosignatures,
    verify_cosignatures,
)
from ledger.witness.submit import SizeConflict, add_checkpoint, cosign_checkpoint
from tests.support.cli_inprocess import cli_json
from tests.support.cli_support import SCRIPT, free_port

K = 2
LOG = SignerKey.generate("catalog-ledger/r29-witness-test")
ORIGINS = [f"catalog-ledger/r29-{name}/catalog" for name in ("a", "b", "c", "d", "e")]
LEAVES = [merkle.leaf_hash(b"revision event %d" % i) for i in range(64)]
FORGED = [merkle.leaf_hash(b"rewritten event %d" % i) for i in range(64)]


def _note(origin: str, size: int, leaves: list[bytes] = LEAVES) -> str:
    return LOG.sign(Checkpoint(origin, size, merkle.root(leaves[:size])).text())


@dataclass
class WitnessProcess:
    folder: Path
    name: str
    clock: Path
    port: int = field(default_factory=free_port)
    key: WitnessKey | None = None
    proc: subprocess.Popen[bytes] | None = None
    stderr: list[bytes] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def db(self) -> Path:
        return self.folder / f"{self.name}.db"

    def keygen(self) -> None:
        code, document = cli_json(
            "witness",
            "keygen",
            f"witness.example/{self.name}",
            "--out",
            str(self.folder / self.name),
        )
        assert code == 0, document
        self.key = WitnessKey.parse(document["verifier_key"])

    def start(self) -> None:
        logs = [arg for o in ORIGINS for arg in ("--log", f"{o}={LOG.verifier.text()}")]
        self.proc = subprocess.Popen(
            [
                str(SCRIPT),
                "witness",
                "serve",
                "--db",
                str(self.db),
                "--key",
                str(self.folder / self.name),
                *logs,
                "--listen",
                f"127.0.0.1:{self.port}",
                "--clock-file",
                str(self.clock),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def wait_ready(self) -> None:
        probe = f"{self.url}/{hashlib.sha256(b'nobody').hexdigest()}/checkpoint"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise AssertionError(f"witness {self.name} exited: {self.stop()}")
            try:
                if httpx.get(probe, timeout=2).status_code == 404:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise AssertionError(f"witness {self.name} did not start")

    def kill(self) -> None:
        """SIGKILL: no shutdown handler runs, only what was committed survives."""
        assert self.proc is not None
        self.proc.kill()
        _, err = self.proc.communicate(timeout=30)
        self.stderr.append(err)

    def stop(self) -> str:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            _, err = self.proc.communicate(timeout=30)
            self.stderr.append(err)
        return b"".join(self.stderr).decode(errors="replace")


@dataclass
class Witnesses:
    all: list[WitnessProcess]
    clock: Path

    def set_time(self, seconds: int) -> None:
        staged = self.clock.with_suffix(".tmp")
        staged.write_text(f"{seconds}\n")
        os.replace(staged, self.clock)  # never a half-written clock

    @property
    def keys(self) -> list[WitnessKey]:
        return [w.key for w in self.all if w.key is not None]


@pytest.fixture(scope="module")
def witnesses(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Witnesses]:
    folder = tmp_path_factory.mktemp("witnesses")
    group = Witnesses([], folder / "clock")
    group.set_time(1_800_000_000)
    group.all = [WitnessProcess(folder, f"w{i}", group.clock) for i in range(3)]
    for witness in group.all:
        witness.keygen()
        witness.start()
    try:
        for witness in group.all:
            witness.wait_ready()
        yield group
    finally:
        for witness in group.all:
            err = witness.stop()
            assert "Traceback" not in err, err


def _cosign_all(group: Witnesses, origin: str, size: int, old: int = 0) -> str:
    """The note cosigned by every witness (from ``old``), as a collector builds it."""
    note = _note(origin, size)
    proof = merkle.consistency_proof(LEAVES, old, size) if 0 < old < size else []
    lines = [
        line
        for w in group.all
        for line in add_checkpoint(w.url, note, old, proof, key=w.key, timeout=10)
    ]
    return add_cosignatures(note, lines)


def _evidence(witness: WitnessProcess, origin: str) -> list[dict[str, object]]:
    code, document = cli_json("witness", "evidence", "--db", str(witness.db))
    assert code == 0, document
    return [e for e in document["evidence"] if e["origin"] == origin]


def test_r29_three_witnesses_cosign_a_checkpoint(witnesses: Witnesses) -> None:
    witnesses.set_time(1_800_000_100)
    cosigned = _cosign_all(witnesses, ORIGINS[0], 5)
    valid = verify_cosignatures(cosigned, witnesses.keys)
    assert len(valid) == 3 >= K
    assert set(valid.values()) == {1_800_000_100}


def test_r29_rewritten_log_is_refused_with_evidence(witnesses: Witnesses) -> None:
    """After the witnesses cosigned size 8, a rewrite at the same size and a larger
    rewritten tree are refused by each of them (INTEGRITY witness_refused, HTTP 422),
    each refusal kept as evidence; a client shown the rewritten head with the honest
    cosignatures rejects it (bad_cosignature); the honest log still moves on."""
    origin = ORIGINS[1]
    honest = _cosign_all(witnesses, origin, 8)
    same_size = _note(origin, 8, FORGED)
    larger = _note(origin, 12, FORGED)
    for w in witnesses.all:
        with pytest.raises(IntegrityFailure) as caught:
            add_checkpoint(w.url, same_size, 8, [])
        assert caught.value.details["status"] == 422
        with pytest.raises(IntegrityFailure) as caught:
            add_checkpoint(w.url, larger, 8, merkle.consistency_proof(FORGED, 8, 12))
        assert caught.value.details["status"] == 422
        evidence = _evidence(w, origin)
        assert [e["reason"] for e in evidence] == ["root_mismatch", "inconsistent_tree"]
        assert [e["note"] for e in evidence] == [same_size, larger]
        assert {e["known"]["size"] for e in evidence} == {8}  # type: ignore[index]
    # A forger replaying the honest cosignatures on the rewritten head.
    lines = honest.split("\n\n", 1)[1].splitlines()[1:]
    with pytest.raises(IntegrityFailure) as caught:
        verify_cosignatures(add_cosignatures(same_size, lines), witnesses.keys)
    assert caught.value.details["reason"] == "bad_cosignature"
    assert len(verify_cosignatures(_cosign_all(witnesses, origin, 12, old=8), witnesses.keys)) == 3


def test_r29_smaller_size_after_larger_is_refused(witnesses: Witnesses) -> None:
    origin = ORIGINS[2]
    _cosign_all(witnesses, origin, 10)
    for w in witnesses.all:
        with pytest.raises(SizeConflict) as conflict:
            add_checkpoint(w.url, _note(origin, 6), 0, [])
        assert conflict.value.known_size == 10
        with pytest.raises(IntegrityFailure) as refused:  # old 10 > size 6: malformed
            add_checkpoint(w.url, _note(origin, 6), 10, [])
        assert refused.value.details["status"] == 400
        with pytest.raises(SizeConflict):  # the collector's retry keeps the refusal
            cosign_checkpoint(w.url, _note(origin, 6), lambda old: [], key=w.key)


def test_r29_restarted_witness_keeps_its_memory(witnesses: Witnesses) -> None:
    origin = ORIGINS[3]
    _cosign_all(witnesses, origin, 4)
    witness = witnesses.all[0]
    witness.kill()
    witness.start()
    witness.wait_ready()
    with pytest.raises(IntegrityFailure) as caught:
        add_checkpoint(witness.url, _note(origin, 4, FORGED), 4, [])
    assert caught.value.details["status"] == 422
    with pytest.raises(SizeConflict) as conflict:
        add_checkpoint(witness.url, _note(origin, 2), 0, [])
    assert conflict.value.known_size == 4
    assert [e["reason"] for e in _evidence(witness, origin)] == ["root_mismatch"]
    lines = cosign_checkpoint(
        witness.url,
        _note(origin, 7),
        lambda old: merkle.consistency_proof(LEAVES, old, 7),
        key=witness.key,
    )
    assert len(lines) == 1


def test_r29_resubmission_gets_a_newer_timestamp(witnesses: Witnesses) -> None:
    """Re-cosigning an unchanged tree (old == size, no proof) is how a log that did not
    grow keeps fresh cosignatures for its clients' maximum age."""
    origin = ORIGINS[4]
    witnesses.set_time(1_800_001_000)
    first = verify_cosignatures(_cosign_all(witnesses, origin, 3), witnesses.keys)
    witnesses.set_time(1_800_004_600)
    again = verify_cosignatures(_cosign_all(witnesses, origin, 3, old=3), witnesses.keys)
    assert set(first.values()) == {1_800_001_000}
    assert set(again.values()) == {1_800_004_600}
