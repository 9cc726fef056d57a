"""Running the real ``catalog-ledger`` console script in a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
