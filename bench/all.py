"""Every benchmark in one run, and one table of their SUMMARY lines.

Runs each bench (append, audit, import_jsonl, apply, rebuild, publish, read, http, cli)
as a child process, one after another (they share 2 cores: running them at once
would measure contention), collects the ``SUMMARY {json}`` lines of their output
and prints one Markdown table: bench, figure, engine, workers, value, peer, peer
value, ratio, target, met. A bench that fails, times out or prints no SUMMARY line
is a row saying so. ``--quick`` runs each at a reduced size (the whole run in under
5 minutes on the 2-core reference machine); without it every bench runs at its
default size. Each bench's own output is kept in --log-dir when given.

Usage:
  python -m bench.all [--quick] [--json] [--only append,audit] [--engines sqlite,mariadb]
                      [--log-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import target_met

#: (bench, quick arguments, timeout in seconds at quick size, at full size)
BENCHES: list[tuple[str, list[str], int, int]] = [
    ("append", ["--events", "200", "--batch-events", "2000", "--repeat", "3"], 90, 3600),
    ("audit", ["--events", "60000", "--repeat", "3"], 90, 3600),
    ("import_jsonl", ["--events", "5000", "--repeat", "3"], 90, 3600),
    ("apply", ["--among", "25,100", "--repeat", "1"], 120, 7200),
    ("rebuild", ["--events", "20000", "--mysql-events", "5000", "--repeat", "3"], 90, 7200),
    ("publish", ["--scales", "1", "--repeat", "3"], 90, 7200),
    ("read", ["--reads", "500", "--repeat", "3"], 60, 3600),
    (
        "http",
        ["--seconds", "1", "--repeat", "3", "--workers", "1", "--audiences", "50"],
        150,  # with the /healthz-under-attack figure (about 10 s per engine)
        3600,
    ),
    ("cli", ["--repeat", "5", "--warmup", "1"], 120, 600),
]
#: Benches that take --engines.
ENGINE_FLAG = {"append", "import_jsonl", "apply", "rebuild", "read", "http"}
COLUMNS = (
    "bench",
    "figure",
    "engine",
    "workers",
    "value",
    "peer",
    "peer value",
    "ratio",
    "target",
    "met?",
)


def run_bench(
    name: str, extra: list[str], timeout: int, log_dir: Path | None
) -> tuple[list[dict[str, Any]], float]:
    """The SUMMARY rows of one bench (or one row saying why there are none), wall seconds."""
    command = [sys.executable, "-m", f"bench.{name}", *extra]
    print(f"[bench.all] {' '.join(command[1:])}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    # Its own session, so that a timeout ends the bench and whatever it started (servers,
    # workers) by its process group, and nothing else.
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        status = str(proc.returncode)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        status = f"timed out after {timeout} s"
    wall = time.perf_counter() - started
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"{name}.out").write_text(out + "\n--- stderr ---\n" + err)
    rows = []
    for line in out.splitlines():
        if line.startswith("SUMMARY "):
            try:
                row = json.loads(line[len("SUMMARY ") :])
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                row.setdefault("bench", name)
                row["met"] = target_met(row)
                rows.append(row)
    if status != "0" or not rows:
        if status != "0":
            why = "FAILED: " + (status if status.startswith("timed") else f"exit status {status}")
            tail = (err.strip().splitlines() or out.strip().splitlines() or [""])[-1]
        else:
            why, tail = "ran (exit 0) but printed no SUMMARY line", ""
        rows.append(
            {
                "bench": name,
                "figure": why + (f" ({tail[:120]})" if tail else ""),
                "engine": None,
                "workers": None,
                "value": None,
                "failed": True,
                "met": False if status != "0" else None,
            }
        )
    print(f"[bench.all] {name}: {len(rows)} rows in {wall:.0f} s", file=sys.stderr, flush=True)
    return rows, wall


def _number(value: Any, unit: str | None = None) -> str:
    if value is None:
        return ""
    if isinstance(value, float | int):
        text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
        return f"{text} {unit}" if unit else text
    return str(value)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        workers = row.get("workers")
        if row.get("peer_workers") not in (None, workers):
            workers = f"{workers} (peer {row['peer_workers']})"
        met = {True: "yes", False: "**no**", None: ""}[row.get("met")]
        cells = [
            row.get("bench"),
            row.get("figure"),
            row.get("engine"),
            workers,
            _number(row.get("value"), row.get("unit")),
            row.get("peer"),
            _number(row.get("peer_value"), row.get("unit")),
            f"{row['ratio']:.2f}" if isinstance(row.get("ratio"), float | int) else "",
            row.get("target"),
            met,
        ]
        lines.append("| " + " | ".join("" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="reduced sizes (< 5 minutes)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--only", default="", help="comma-separated benches to run")
    parser.add_argument("--engines", default="", help="passed to the benches that take it")
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args()
    only = {b for b in args.only.split(",") if b}
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    walls: dict[str, float] = {}
    for name, quick, quick_timeout, full_timeout in BENCHES:
        if only and name not in only:
            continue
        extra = list(quick) if args.quick else []
        if args.engines and name in ENGINE_FLAG:
            extra += ["--engines", args.engines]
        found, walls[name] = run_bench(
            name, extra, quick_timeout if args.quick else full_timeout, args.log_dir
        )
        rows.extend(found)
    wall = time.perf_counter() - started
    if args.json:
        print(json.dumps({"rows": rows, "wall_s": wall, "bench_wall_s": walls}, indent=1))
        return
    mode = "--quick" if args.quick else "default sizes"
    print(f"bench.all ({mode}): {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(", ".join(f"{name} {seconds:.0f} s" for name, seconds in walls.items()))
    print(f"wall time {wall:.0f} s\n")
    print(table(rows))


if __name__ == "__main__":
    main()
