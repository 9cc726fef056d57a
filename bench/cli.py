"""CLI start-up: wall time of one ``catalog-ledger`` process, next to ``python -c pass``.

Builds the demo store (``examples/demo.sh``: two releases applied and published, on
the embedded SQLite default) in a temporary folder, then times whole processes of
the installed console script, as a user runs them:
  --version                      - target <= 0.15 s
  --help                         - target <= 0.15 s
  status                         - target <= 0.5 s
  view integration:erp-sync      - target <= 0.5 s
Each command alternates with its floor, the same interpreter running ``-c pass``
(A B A B, after --warmup rounds); medians of wall time, and the ratio command / floor.

Bytecode: an installed package runs from cached bytecode (pip compiles it; a source
checkout writes ``__pycache__`` on its first run). Where ``PYTHONDONTWRITEBYTECODE``
is set, every process would compile this project's modules from source again (about
0.1 s), which no user's second run does. So both peers run with the variable unset and
``PYTHONPYCACHEPREFIX`` in the bench's temporary folder (filled by the warm-up rounds;
nothing is written beside the sources). ``--no-bytecode-cache`` keeps the caller's
environment as it is.
The CPU time (user + system) of the same processes is printed beside them: on a
shared machine it moves less with the load than wall time does. A command that exits
non-zero stops the bench.

Usage:
  python -m bench.cli [--repeat 15] [--warmup 2] [--only status,view] [--no-bytecode-cache]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from bench.common import alternate, summary

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CLI = str(BIN / "catalog-ledger")

#: (name, arguments, target in seconds)
COMMANDS: list[tuple[str, list[str], float]] = [
    ("version", ["--version"], 0.15),
    ("help", ["--help"], 0.15),
    ("status", ["status"], 0.5),
    ("view", ["view", "integration:erp-sync"], 0.5),
]


def build_demo(work: Path) -> None:
    """The demo store in ``work`` (examples/demo.sh with this interpreter's scripts)."""
    env = {**os.environ, "DEMO_DIR": str(work), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("CATALOG_LEDGER_DB", None)
    subprocess.run(
        ["sh", str(ROOT / "examples" / "demo.sh")],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def environment(pycache: Path | None) -> dict[str, str]:
    """The environment of the timed processes: no ``CATALOG_LEDGER_*`` settings, and with
    ``pycache`` their bytecode cached there (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CATALOG_LEDGER_")}
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def timer(argv: list[str], cwd: Path, env: dict[str, str], cpu: list[float]) -> float:
    """Wall seconds of one process from start to exit (its CPU seconds appended to
    ``cpu``); a failure stops the bench."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, check=False, cwd=cwd, env=env, capture_output=True)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated: version,help,status,view")
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="time the processes in this environment as it is (no PYTHONPYCACHEPREFIX)",
    )
    args = parser.parse_args()
    only = {name for name in args.only.split(",") if name}
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        work = Path(tmp) / "demo"
        build_demo(work)
        env = environment(None if args.no_bytecode_cache else Path(tmp) / "pycache")
        bytecode = (
            f"bytecode cached in {env['PYTHONPYCACHEPREFIX']}"
            if "PYTHONPYCACHEPREFIX" in env
            else "environment as given"
            + (" (PYTHONDONTWRITEBYTECODE set)" if "PYTHONDONTWRITEBYTECODE" in env else "")
        )
        print(
            f"demo store: {work / 'catalog.db'}; {args.repeat} rounds after {args.warmup}; "
            f"{bytecode}"
        )
        print(
            f"{'command':<42}{'median s':>10}{'floor s':>10}{'ratio':>8}{'target s':>10}"
            f"{'cpu s':>8}{'floor cpu':>10}"
        )
        for name, argv, target in COMMANDS:
            if only and name not in only:
                continue
            cpu: list[float] = []
            floor_cpu: list[float] = []
            measured = alternate(
                {
                    name: partial(timer, [CLI, *argv], work, env, cpu),
                    "floor": partial(timer, [sys.executable, "-c", "pass"], work, env, floor_cpu),
                },
                args.repeat,
                args.warmup,
            )
            value, floor = measured[name].median, measured["floor"].median
            # The warm-up rounds' CPU times are left out, as their wall times are.
            cpu_s = statistics.median(cpu[args.warmup :])
            floor_cpu_s = statistics.median(floor_cpu[args.warmup :])
            label = "catalog-ledger " + " ".join(argv)
            print(
                f"{label:<42}{value:>10.3f}{floor:>10.3f}{value / floor:>8.1f}{target:>10.2f}"
                f"{cpu_s:>8.3f}{floor_cpu_s:>10.3f}"
            )
            summary(
                bench="cli",
                figure=f"{name} wall time",
                engine="sqlite",
                value=value,
                unit="s",
                peer="python -c pass",
                peer_value=floor,
                target=f"value<={target}",
                cpu_s=float(f"{cpu_s:.4g}"),
                peer_cpu_s=float(f"{floor_cpu_s:.4g}"),
                bytecode_cache="PYTHONPYCACHEPREFIX" in env,
            )


if __name__ == "__main__":
    main()
