"""Running the CLI in-process (no child process), for tests where a subprocess isn't the point."""

from __future__ import annotations

import io
import json
import os
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

from ledger.cli.app import run
from tests.support.cli_support import Result


def cli(*args: str) -> Result:
    """``catalog-ledger ARGS`` in this process: exit code, stdout and stderr."""
    saved = {
        k: os.environ.pop(k)
        for k in (
            "CATALOG_LEDGER_DB",
            "CATALOG_LEDGER_DEBUG",
            "CATALOG_LEDGER_LOG_FORMAT",
            "CATALOG_LEDGER_LOG_LEVEL",
        )
        if k in os.environ
    }
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = run(list(args))
    finally:
        os.environ.update(saved)
    result = Result(code, out.getvalue(), err.getvalue())
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result


def cli_json(*args: str) -> tuple[int, Any]:
    """``cli(*args, "--json")``: exit code and the one JSON document it printed."""
    result = cli(*args, "--json")
    return result.code, json.loads(result.stdout)
