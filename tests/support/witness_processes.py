"""Real ``catalog-ledger witness serve`` processes on loopback, for the R29 end-to-end
tests: each with its own key (``witness keygen``) and SQLite file, configured for one log
origin and its verifier key (for a catalog log's origin, its main log's too: the
collector ``cosign`` submits both)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from domain.notes import WitnessKey
from tests.support.cli_inprocess import cli_json
from tests.support.cli_support import SCRIPT, free_port


class Witness:
    def __init__(self, folder: Path, name: str, origin: str, log_key: str) -> None:
        self.folder, self.name = folder, name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        code, document = cli_json(
            "witness", "keygen", f"witness.example/{name}", "--out", str(folder / name)
        )
        assert code == 0, document
        self.key = WitnessKey.parse(document["verifier_key"])
        self.proc = subprocess.Popen(
            [str(SCRIPT), "witness", "serve", "--db", str(folder / f"{name}.db"),
             "--key", str(folder / name), "--log", f"{origin}={log_key}",
             # the catalog log's main log too: the collector has its checkpoint cosigned
             *(("--log", f"{origin.removesuffix('/catalog')}={log_key}")
               if origin.endswith("/catalog") else ()),
             "--listen", f"127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.stop()
            try:
                httpx.get(f"{self.url}/nothing", timeout=2)
                return
            except httpx.TransportError:
                time.sleep(0.05)
        raise AssertionError(f"witness {self.name} did not start")

    def stop(self) -> str:
        if self.proc.returncode is None:
            self.proc.terminate()
        _, err = self.proc.communicate(timeout=30)
        return err.decode(errors="replace")
