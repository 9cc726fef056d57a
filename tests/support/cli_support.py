"""Running the real ``catalog-ledger`` console script in a child process."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

SCRIPT = Path(sys.executable).with_name("catalog-ledger")


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> Result:
    full_env = dict(os.environ)
    full_env.pop("CATALOG_LEDGER_DB", None)
    full_env.pop("CATALOG_LEDGER_DEBUG", None)
    full_env.pop("CATALOG_LEDGER_LOG_FORMAT", None)
    full_env.pop("CATALOG_LEDGER_LOG_LEVEL", None)
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        timeout=timeout,
        check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stdout, proc.stdout
    return Result(proc.returncode, proc.stdout, proc.stderr)


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServedStore:
    """``catalog-ledger serve`` in a child process on loopback, with an HTTP client."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30,
        options: Sequence[str] = (),
        serve_options: Sequence[str] = (),
        env: dict[str, str] | None = None,
        auth: bool = False,
        https_ca: Path | None = None,
    ) -> None:
        """``options`` go before ``serve`` (``--log-format json``), ``serve_options`` after.

        ``auth=False`` serves with ``--no-auth`` (loopback): for tests whose point is not
        authentication; the R26 tests serve with bearer tokens (``auth=True``).
        ``https_ca``: the server serves HTTPS (``--tls-cert`` in ``serve_options``) with a
        certificate this CA signed; the client trusts it."""
        self.port = free_port()
        self.base = f"{'https' if https_ca else 'http'}://127.0.0.1:{self.port}"
        no_auth = () if auth else ("--no-auth",)
        self.proc = subprocess.Popen(
            [
                str(SCRIPT),
                "--db",
                url,
                *options,
                "serve",
                "--port",
                str(self.port),
                *no_auth,
                *serve_options,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=None if env is None else {**os.environ, **env},
        )
        self.stderr = ""
        verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=str(https_ca)) if https_ca else True
        )
        self.client = httpx.Client(base_url=self.base, timeout=timeout, verify=verify)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self.client.get("/healthz")
                return
            except httpx.TransportError:
                time.sleep(0.1)
        self.close()
        raise AssertionError("server did not start")

    def view(self, audience: str, *, token: str | None = None, **params: Any) -> httpx.Response:
        kind, _, ident = audience.partition(":")
        return self.client.get(
            f"/v1/audiences/{quote(kind, safe='')}/{quote(ident, safe='')}/view",
            params=params,
            headers={"authorization": f"Bearer {token}"} if token is not None else None,
        )

    def close(self) -> None:
        """Stop the server; it must not have printed a traceback."""
        self.client.close()
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=30)
        self.stderr = err.decode(errors="replace")
        assert b"Traceback" not in err, self.stderr
