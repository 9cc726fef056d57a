"""One writer of the Galera campaign, run as a child process.

    python -m tests.support.cluster_worker CONFIG.json

CONFIG names the writer's nodes (its own first), the work directory holding the
releases (``tests.support.concurrency_worker.build``), the seconds to run, a seed, the
``--wait`` and ``--lease-ttl`` of its applies and the JSON-lines file to write.

Until the deadline the writer runs ``apply RELEASE`` or ``publish``, each with a
command id of its own, through the CLI's own entry point in this process
(``ledger.cli.app.run``: the exit codes and the one JSON document a user gets).
When its node does not answer (UNAVAILABLE, exit 1) it retries the very same
command, same command id, against the other nodes in turn until one answers
(R10: an exact retry returns the recorded result, or runs the command if it never
committed). Every attempt is one line of the output file.
"""

from __future__ import annotations

import io
import json
import random
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

from ledger.cli.app import run
from tests.support.concurrency_worker import build

#: How long a writer keeps looking for a live node for one command.
RETRY_FOR = 90.0


def call(url: str, args: list[str], command_id: str) -> dict[str, Any]:
    """One CLI invocation: exit code, timing and the JSON document it printed."""
    out = io.StringIO()
    start = time.time()
    with redirect_stdout(out):
        code = run(["--db", url, *args, "--command-id", command_id, "--json"])
    end = time.time()
    try:
        document: Any = json.loads(out.getvalue())
    except ValueError:
        document = {"error": "NO_JSON", "message": out.getvalue()[-500:], "details": {}}
    attempt: dict[str, Any] = {
        "url": url,
        "cid": command_id,
        "action": args[0],
        "code": code,
        "start": start,
        "end": end,
    }
    if code == 0:
        attempt["result"] = document
    else:
        attempt["error"] = document.get("error")
        attempt["message"] = str(document.get("message", ""))[:400]
        attempt["details"] = document.get("details", {})
    return attempt


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    urls: list[str] = config["urls"]
    releases = build(Path(config["workdir"]))
    rng = random.Random(config["seed"])
    deadline = time.monotonic() + float(config["seconds"])
    counts: dict[str, int] = {}
    with Path(config["out"]).open("w", encoding="utf-8") as out:

        def record(attempt: dict[str, Any]) -> None:
            out.write(json.dumps(attempt) + "\n")
            out.flush()
            key = f"{attempt['action']}:{attempt['code']}"
            counts[key] = counts.get(key, 0) + 1

        n = 0
        while time.monotonic() < deadline:
            n += 1
            command_id = f"{config['seed']}-{n}"
            if rng.random() < 0.75:
                args = [
                    "apply",
                    str(rng.choice(releases)),
                    "--wait",
                    str(config["wait"]),
                    "--lease-ttl",
                    str(config["lease_ttl"]),
                ]
            else:
                args = ["publish"]
            attempt = call(urls[0], args, command_id)
            record(attempt)
            give_up = time.monotonic() + RETRY_FOR
            turn = 0
            while attempt["code"] == 1 and time.monotonic() < give_up:
                other = urls[1 + turn % (len(urls) - 1)]
                turn += 1
                attempt = call(other, args, command_id)
                attempt["retry"] = turn
                record(attempt)
                if attempt["code"] == 1 and turn % (len(urls) - 1) == 0:
                    time.sleep(0.5)  # every node refused: the cluster is changing views
    print(json.dumps({"commands": n, "counts": counts}))


if __name__ == "__main__":
    main()
