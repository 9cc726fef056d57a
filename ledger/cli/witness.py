"""``witness keygen | serve | evidence | status``: a C2SP tlog-witness (R29).

The witness keeps its own SQLite file (``--db FILE``, not a store URL): the last tree
it cosigned per log, and the evidence of the forks it refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from domain.errors import InvalidInput, UsageError
from ledger.cli.app import cli, emit, json_option, log_settings

if TYPE_CHECKING:
    from domain.notes import VerifierKey, WitnessSigner


@cli.group("witness")
def witness_group() -> None:
    """A transparency-log witness (C2SP tlog-witness, cosignature/v1): cosigns a log's
    checkpoints, never two inconsistent trees of one log nor a smaller one after a
    larger one, and keeps the evidence of the forks it refused."""


_DB = click.option(
    "--db",
    "db",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    metavar="FILE",
    help="The witness's own SQLite file (created if missing).",
)


@witness_group.command("keygen")
@click.argument("name")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Private key file to create, mode 0600 (its .pub sibling gets the verifier key).",
)
@json_option
def witness_keygen(name: str, out: Path, as_json: bool) -> None:
    """Create the witness key NAME (Ed25519, cosignature/v1) and print its verifier key
    (NAME+<id>+<base64(0x04||key)>), the text logs and clients pin."""
    from domain.notes import WitnessSigner
    from ledger.audit.operations import write_key_pair

    key = WitnessSigner.generate(name)
    write_key_pair(out, key.text(), key.verifier.text())
    document = {"signer_key_file": str(out), "verifier_key": key.verifier.text()}
    emit(as_json, document, lambda: click.echo(document["verifier_key"]))


def _signer(path: Path) -> WitnessSigner:
    from domain.notes import WitnessSigner

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read the witness key {path}: {exc}", field="key") from None
    return WitnessSigner.parse(text, field="key")


def _logs(values: tuple[str, ...]) -> dict[str, list[VerifierKey]]:
    from domain.notes import VerifierKey

    logs: dict[str, list[VerifierKey]] = {}
    for index, value in enumerate(values):
        origin, sep, vkey = value.partition("=")
        if not sep or not origin:
            raise InvalidInput(f"--log {value!r} is not ORIGIN=VKEY", field=f"log[{index}]")
        logs.setdefault(origin, []).append(VerifierKey.parse(vkey, field=f"log[{index}]"))
    return logs


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--listen {value!r} is not HOST:PORT")
    return host, int(port)


def _clock(clock_file: Path | None) -> Callable[[], int]:
    if clock_file is None:
        return lambda: int(time.time())

    def from_file() -> int:  # tests move time by writing the file: no sleeping
        return int(clock_file.read_text(encoding="utf-8").strip())

    return from_file


@witness_group.command("serve")
@_DB
@click.option(
    "--key",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    metavar="KEYFILE",
    help="The witness's private key file (`witness keygen`).",
)
@click.option(
    "--log",
    "logs",
    multiple=True,
    required=True,
    metavar="ORIGIN=VKEY",
    help="A log to witness: its origin line and an Ed25519 verifier key of its checkpoints "
    "(repeat for more logs, or for more keys of one log during a key rotation).",
)
@click.option(
    "--listen",
    default="127.0.0.1:7380",
    show_default=True,
    metavar="HOST:PORT",
    help="Address to serve POST /add-checkpoint on.",
)
@click.option("--clock-file", type=click.Path(path_type=Path), default=None, hidden=True)
@json_option
def witness_serve(
    db: Path,
    key: Path,
    logs: tuple[str, ...],
    listen: str,
    clock_file: Path | None,
    as_json: bool,
) -> None:
    """Serve C2SP tlog-witness: POST /add-checkpoint (old size, consistency proof, signed
    checkpoint) answers this witness's cosignature/v1 line; GET /<sha256(origin)>/checkpoint
    the last cosigned checkpoint."""
    import uvicorn

    from ledger.cli.read import _port_is_free, url_host
    from ledger.witness.app import create_app
    from ledger.witness.protocol import Witness
    from ledger.witness.state import WitnessState

    host, port = _listen(listen)
    signer, followed = _signer(key), _logs(logs)  # checked before the file is created
    witness = Witness(WitnessState(db), signer, followed, _clock(clock_file))
    _port_is_free(host, port)
    _, log_level = log_settings()
    listening = {
        "url": f"http://{url_host(host)}:{port}",
        "db": str(db),
        "verifier_key": witness.signer.verifier.text(),
        "logs": sorted(witness.logs),
    }
    emit(as_json, listening, lambda: click.echo(f"witness serving on {listening['url']}"))
    uvicorn.run(create_app(witness), host=host, port=port, log_level=log_level, log_config=None)


@witness_group.command("evidence")
@_DB
@json_option
def witness_evidence(db: Path, as_json: bool) -> None:
    """The checkpoints this witness refused as forks (a failed consistency proof from
    the tree it cosigned, or its cosigned size with another root), with what it knew."""
    from ledger.witness.state import WitnessState

    _exists(db)
    found = WitnessState(db).evidence()

    def human() -> None:
        if not found:
            click.echo("no evidence")
        for item in found:
            first = item["note"].split("\n")
            click.echo(
                f"#{item['id']} at {item['recorded_at']}: {item['origin']} {item['reason']}: "
                f"size {first[1]} root {first[2]} (old {item['old_size']}) against the "
                f"cosigned size {item['known']['size']} root {item['known']['root']}"
            )

    emit(as_json, {"evidence": found}, human)


@witness_group.command("status")
@_DB
@json_option
def witness_status(db: Path, as_json: bool) -> None:
    """The last tree this witness cosigned for each log, and when."""
    import base64

    from ledger.witness.state import WitnessState

    _exists(db)
    logs = [
        {
            "origin": k.origin,
            "size": k.size,
            "root": base64.b64encode(k.root).decode(),
            "cosigned_at": k.cosigned_at,
        }
        for k in WitnessState(db).logs()
    ]

    def human() -> None:
        for log in logs:
            click.echo(f"{log['origin']}  size {log['size']}  cosigned at {log['cosigned_at']}")

    emit(as_json, {"logs": logs}, human)


def _exists(db: Path) -> None:
    if not db.is_file():
        raise InvalidInput(f"{db} is not a witness file", field="db")
