"""R29: ``catalog-ledger witness`` follows the CLI conventions (``--help``, ``--json``,
exit codes: 2 usage, 3 invalid input naming the field) without a store."""

from __future__ import annotations

import stat
from pathlib import Path

from domain.notes import SignerKey, WitnessKey, WitnessSigner
from tests.support.cli_inprocess import cli, cli_json


def test_r29_witness_help() -> None:
    for args in (["witness", "--help"], ["witness", "serve", "--help"]):
        result = cli(*args)
        assert result.code == 0 and "Usage:" in result.stdout
    assert "--clock-file" not in cli("witness", "serve", "--help").stdout  # a test hook


def test_r29_witness_keygen_writes_a_private_file_and_prints_the_vkey(tmp_path: Path) -> None:
    out = tmp_path / "w.key"
    code, document = cli_json("witness", "keygen", "witness.example/w1", "--out", str(out))
    assert code == 0
    signer = WitnessSigner.parse(out.read_text())
    assert document == {"signer_key_file": str(out), "verifier_key": signer.verifier.text()}
    assert WitnessKey.parse(Path(f"{out}.pub").read_text()) == signer.verifier
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    code, error = cli_json("witness", "keygen", "witness.example/w1", "--out", str(out))
    assert (code, error["error"], error["details"]["field"]) == (3, "INVALID", "out")
    human = cli("witness", "keygen", "witness.example/w2", "--out", str(tmp_path / "w2.key"))
    assert WitnessKey.parse(human.stdout).name == "witness.example/w2"


def test_r29_witness_evidence_and_status_need_a_witness_file(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    code, error = cli_json("witness", "evidence", "--db", str(missing))
    assert (code, error["details"]["field"]) == (3, "db")
    assert not missing.exists()  # never created by a listing
    from ledger.witness.state import WitnessState

    WitnessState(tmp_path / "w.db")
    assert cli_json("witness", "evidence", "--db", str(tmp_path / "w.db")) == (0, {"evidence": []})
    assert cli_json("witness", "status", "--db", str(tmp_path / "w.db")) == (0, {"logs": []})
    assert cli("witness", "evidence", "--db", str(tmp_path / "w.db")).stdout == "no evidence\n"


def test_r29_witness_serve_checks_its_configuration_first(tmp_path: Path) -> None:
    key = tmp_path / "w.key"
    key.write_text(WitnessSigner.generate("witness.example/w1").text())
    vkey = SignerKey.generate("log.example").verifier.text()
    base = ["witness", "serve", "--db", str(tmp_path / "w.db"), "--key", str(key)]
    code, error = cli_json(*base, "--log", "no-equals-sign")
    assert (code, error["details"]["field"]) == (3, "log[0]")
    code, error = cli_json(*base, "--log", f"log.example={vkey}", "--log", "o=not+a+key")
    assert (code, error["details"]["field"]) == (3, "log[1]")
    code, error = cli_json(*base, "--log", f"log.example={vkey}", "--listen", "nowhere")
    assert (code, error["error"]) == (2, "USAGE")
    code, error = cli_json(
        "witness", "serve", "--db", str(tmp_path / "w.db"), "--key", str(tmp_path / "none"),
        "--log", f"log.example={vkey}",
    )  # fmt: skip
    assert (code, error["details"]["field"]) == (3, "key")
    code, error = cli_json(
        *base, "--log", f"log.example={WitnessSigner.generate('w').verifier.text()}"
    )
    assert (code, error["details"]["field"]) == (3, "log[0]")  # a witness key is no log key
