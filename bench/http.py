"""HTTP read throughput of `catalog-ledger serve` against the server stack's own limit.

Catalog: the publisher benchmark's base size (250 packs x 20 components, 1,000
audiences, 10,000 bindings), applied and published, with one credential for each
of ``--audiences`` audiences. Two servers, on loopback, on the same uvicorn and
Starlette and with the same uvicorn settings:

  serve  - `catalog-ledger serve` (authentication on: every request carries its
           audience's bearer token), reading a random audience's view per request
  peer   - a minimal Starlette endpoint that answers every request with the bytes
           (body and headers) `serve` sends for one of those audiences: what the
           stack costs with no application work at all (uvicorn with the protocol
           `serve` runs, ``ledger.http.protocol.NoDelayH11Protocol``)

The load generator is `wrk` (installed with apt-get when missing), driven by a Lua
script that sends the very same requests to both: a random audience's path and
token per request, for the 200 figure without `If-None-Match`, for the 304 figure
with the audience's current ETag. Where wrk cannot be had, a Python load generator
(httpx, threads) stands in and the report says so; its figures are lower and
measure the client as much as the server.

Each figure is the median of ``--repeat`` runs after a warm-up of each server, and
the two servers alternate (serve, peer, serve, peer, ...). Reported for
``--workers`` 1 and 2 (both servers at the same worker count): reads/s, p99 and
the serve/peer ratio of reads/s.

Under attack (issue 25.1): `serve` (one worker) under ``ulimit -n --nofile`` (256),
and ``/healthz`` on a fresh connection, one after another for ``--seconds``: quiet,
then while ``--slow-clients`` (300) connections send headers that never finish
(``bench.attack.SlowClients``, reconnecting when dropped), alternating. Reported:
the p99 latency of each (median of ``--repeat``), and how many probes were not 200
within 2 s. ``--slow-clients 0`` skips it.

Usage:
  python -m bench.http [--engines sqlite,mariadb] [--seconds 5] [--repeat 3]
                       [--workers 1,2] [--connections 32] [--audiences 200]
                       [--slow-clients 300] [--nofile 256]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from bench.attack import SlowClients, fresh_healthz
from bench.common import (
    DEFAULT_MYSQL,
    durability,
    free_port,
    mysql_scratch,
    summary,
    wait_http,
)
from domain.served import AudienceView
from ledger.api import Store

CLI = str(Path(sys.executable).with_name("catalog-ledger"))
#: The peer's answer, as ``{"status", "headers", "body"}`` JSON in this file.
PEER_ENV = "CATALOG_LEDGER_BENCH_PEER"

_LUA = """
local targets = {}
for line in io.lines("%(targets)s") do
  local path, token, etag = line:match("([^\\t]*)\\t([^\\t]*)\\t([^\\t]*)")
  targets[#targets + 1] = {path, token, etag}
end
local conditional = %(conditional)s
math.randomseed(os.time())
request = function()
  local t = targets[math.random(#targets)]
  local headers = {["Authorization"] = "Bearer " .. t[2]}
  if conditional then headers["If-None-Match"] = t[3] end
  return wrk.format("GET", t[1], headers)
end
"""


def peer_app() -> Any:
    """The peer: one route answering every GET with the recorded bytes (uvicorn factory)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    answers = json.loads(Path(os.environ[PEER_ENV]).read_text())
    ok, not_modified = answers["200"], answers["304"]
    body = ok["body"].encode()

    async def endpoint(request: Request) -> Response:
        if "if-none-match" in request.headers:
            return Response(status_code=304, headers=not_modified["headers"])
        return Response(body, headers=ok["headers"], media_type=None)

    return Starlette(routes=[Route("/{rest:path}", endpoint)])


def _wrk() -> str | None:
    found = shutil.which("wrk")
    if found is None and shutil.which("apt-get"):
        subprocess.run(
            ["apt-get", "install", "-y", "wrk"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        found = shutil.which("wrk")
    return found


_LATENCY = re.compile(r"^\s*99%\s+([\d.]+)(us|ms|s)\s*$", re.M)
_RATE = re.compile(r"^Requests/sec:\s+([\d.]+)", re.M)
_NON_2XX = re.compile(r"Non-2xx or 3xx responses:\s+(\d+)")


def _wrk_run(
    wrk: str, base: str, script: Path, seconds: float, connections: int
) -> tuple[float, float]:
    out = subprocess.run(
        [
            wrk,
            "-t2",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--latency",
            "-s",
            str(script),
            base,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    bad = _NON_2XX.search(out)
    if bad:
        raise SystemExit(f"wrk saw {bad.group(1)} failed responses:\n{out}")
    rate = _RATE.search(out)
    p99 = _LATENCY.search(out)
    if rate is None or p99 is None:
        raise SystemExit(f"unreadable wrk output:\n{out}")
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[p99.group(2)]
    return float(rate.group(1)), float(p99.group(1)) * scale


def _python_run(
    base: str, targets: list[tuple[str, str, str]], conditional: bool, seconds: float, clients: int
) -> tuple[float, float]:
    import random

    samples: list[float] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    failures: list[int] = []

    def client() -> None:
        rng = random.Random()
        mine = []
        with httpx.Client(base_url=base, timeout=30) as http:
            while time.monotonic() < deadline:
                path, token, etag = rng.choice(targets)
                headers = {"Authorization": f"Bearer {token}"}
                if conditional:
                    headers["If-None-Match"] = etag
                t = time.perf_counter()
                response = http.get(path, headers=headers)
                mine.append(time.perf_counter() - t)
                if response.status_code not in (200, 304):
                    failures.append(response.status_code)
        with lock:
            samples.extend(mine)

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit(f"HTTP failures: {failures[:5]}")
    elapsed = time.perf_counter() - started
    samples.sort()
    return len(samples) / elapsed, samples[int(0.99 * (len(samples) - 1))] * 1000


@contextmanager
def _server(command: list[str], env: dict[str, str], port: int) -> Iterator[str]:
    process = subprocess.Popen(
        command, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def measure(label: str, url: str, folder: Path, args: argparse.Namespace) -> list[str]:
    from bench.publish import setup_store

    sizes = setup_store(folder, url, 1)
    store = Store(url)
    store.publish()
    targets: list[tuple[str, str, str]] = []
    for a in range(min(args.audiences, sizes["audiences"])):
        audience = f"integration:workload-{a:06d}"
        token = store.credentials_issue(audience)["token"]
        view = store.view(audience)
        assert isinstance(view, AudienceView)
        path = f"/v1/audiences/integration/{quote(audience.split(':', 1)[1], safe='')}/view"
        targets.append((path, token, f'W/"{view.audience_digest}"'))
    store.close()
    lines = "".join(f"{p}\t{t}\t{e}\n" for p, t, e in targets)
    (folder / "targets.tsv").write_text(lines)
    scripts = {}
    for name, conditional in (("200", "false"), ("304", "true")):
        script = folder / f"load-{name}.lua"
        script.write_text(_LUA % {"targets": folder / "targets.tsv", "conditional": conditional})
        scripts[name] = script
    # The peer answers with what serve sends for the first audience.
    path, token, etag = targets[0]
    answers = {}
    port = free_port()
    with _server([CLI, "--db", url, "serve", "--port", str(port)], {}, port) as base:
        for name, extra in (("200", {}), ("304", {"If-None-Match": etag})):
            r = httpx.get(base + path, headers={"Authorization": f"Bearer {token}", **extra})
            assert r.status_code == int(name), (r.status_code, r.text)
            keep = {k: v for k, v in r.headers.items() if k not in ("date", "server")}
            keep.pop("content-length", None)
            answers[name] = {"headers": keep, "body": r.text}
    (folder / "peer.json").write_text(json.dumps(answers))
    wrk = None if args.python_load else _wrk()
    generator = "wrk" if wrk else f"Python load generator ({args.connections} threads)"
    print(
        f"\n{label}: {sizes['audiences']} audiences, {sizes['bindings']} bindings, "
        f"{len(targets)} audiences with credentials; load: {generator}, "
        f"{args.connections} connections, {args.seconds:.0f} s per run, "
        f"median of {args.repeat} after a warm-up"
    )
    durability(url)
    rows = []
    for workers in args.workers:
        figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
        port_s, port_p = free_port(), free_port()
        serve_cmd = [
            CLI, "--db", url, "serve", "--port", str(port_s), "--workers", str(workers),
        ]  # fmt: skip
        peer_cmd = [
            sys.executable, "-c",
            "import uvicorn; uvicorn.run('bench.http:peer_app', factory=True, "
            f"host='127.0.0.1', port={port_p}, workers={workers}, log_level='warning', "
            "log_config=None, http='ledger.http.protocol:NoDelayH11Protocol')",
        ]  # fmt: skip
        peer_env = {PEER_ENV: str(folder / "peer.json")}
        with (
            _server(serve_cmd, {}, port_s) as serve_base,
            _server(peer_cmd, peer_env, port_p) as peer_base,
        ):
            for status in ("200", "304"):
                for base in (serve_base, peer_base):  # warm-up
                    _load(wrk, base, scripts[status], targets, status, 1.0, args)
                for _ in range(args.repeat):
                    for who, base in (("serve", serve_base), ("peer", peer_base)):
                        got = _load(wrk, base, scripts[status], targets, status, args.seconds, args)
                        figures.setdefault((who, status), []).append(got)
        for status in ("200", "304"):
            serve_rate = statistics.median(r for r, _ in figures[("serve", status)])
            peer_rate = statistics.median(r for r, _ in figures[("peer", status)])
            serve_p99 = statistics.median(p for _, p in figures[("serve", status)])
            peer_p99 = statistics.median(p for _, p in figures[("peer", status)])
            line = (
                f"  {label:<8} workers {workers}  {status}:  serve {serve_rate:8,.0f} reads/s "
                f"p99 {serve_p99:6.2f} ms   peer {peer_rate:8,.0f} reads/s "
                f"p99 {peer_p99:6.2f} ms   ratio {serve_rate / peer_rate:5.2f}"
            )
            print(line, flush=True)
            rows.append(line)
            summary(
                bench="http",
                figure=f"serve {status}s, authentication on",
                engine=label.lower(),
                workers=workers,
                value=serve_rate,
                unit="reads/s",
                peer="static-bytes endpoint, same stack",
                peer_value=peer_rate,
                target=">=0.7",
            )
    if args.slow_clients:
        rows.append(under_attack(label, url, args))
    return rows


def _probe(port: int, seconds: float) -> tuple[list[float], int]:
    """``/healthz`` on fresh connections, back to back for ``seconds``: the latencies
    (ms) of those answered 200 within 2 s, and how many were not."""
    latencies, failed = [], 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status, took = fresh_healthz(port, timeout=2.0)
        if status == 200:
            latencies.append(took * 1000)
        else:
            failed += 1
        time.sleep(0.01)
    return latencies, failed


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[int(0.99 * (len(ordered) - 1))] if ordered else float("nan")


def under_attack(label: str, url: str, args: argparse.Namespace) -> str:
    """``/healthz`` p99 quiet and under ``--slow-clients`` slow clients, ``ulimit -n``."""
    port = free_port()
    serve = [CLI, "--db", url, "serve", "--port", str(port), "--log-level", "warning"]
    command = ["sh", "-c", f'ulimit -n {int(args.nofile)} && exec "$@"', "sh", *serve]
    quiet: list[float] = []
    attacked: list[float] = []
    failed = {"quiet": 0, "attack": 0}
    with _server(command, {}, port):
        _probe(port, 1.0)  # warm-up
        for _ in range(max(1, args.repeat)):
            samples, bad = _probe(port, args.seconds)
            quiet.append(_p99(samples))
            failed["quiet"] += bad
            with SlowClients("127.0.0.1", port, args.slow_clients) as attack:
                attack.wait_connected()
                samples, bad = _probe(port, args.seconds)
            attacked.append(_p99(samples))
            failed["attack"] += bad
    quiet_p99, attack_p99 = statistics.median(quiet), statistics.median(attacked)
    line = (
        f"  {label:<8} /healthz under {args.slow_clients} slow clients (ulimit -n "
        f"{args.nofile}): p99 {attack_p99:7.2f} ms   quiet p99 {quiet_p99:6.2f} ms   "
        f"not 200 within 2 s: {failed['attack']} under attack, {failed['quiet']} quiet"
    )
    print(line, flush=True)
    summary(
        bench="http",
        figure=f"/healthz p99 under {args.slow_clients} slow clients, ulimit -n {args.nofile}",
        engine=label.lower(),
        workers=1,
        value=attack_p99,
        unit="ms",
        peer="quiet /healthz p99",
        peer_value=quiet_p99,
        target="value<=2000",
        not_200=failed["attack"],
    )
    return line


def _load(
    wrk: str | None,
    base: str,
    script: Path,
    targets: list[tuple[str, str, str]],
    status: str,
    seconds: float,
    args: argparse.Namespace,
) -> tuple[float, float]:
    if wrk is not None:
        return _wrk_run(wrk, base, script, seconds, args.connections)
    return _python_run(base, targets, status == "304", seconds, args.connections)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="sqlite,mariadb")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=lambda s: [int(w) for w in s.split(",")], default=[1, 2])
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--audiences", type=int, default=200)
    parser.add_argument("--python-load", action="store_true", help="Use the Python generator.")
    parser.add_argument("--slow-clients", type=int, default=300, help="0: no attack figure.")
    parser.add_argument("--nofile", type=int, default=256, help="`ulimit -n` under attack.")
    parser.add_argument("--mysql-url", default=DEFAULT_MYSQL)
    args = parser.parse_args()
    engines = args.engines.split(",")
    if "sqlite" in engines:
        with tempfile.TemporaryDirectory() as tmp:
            measure("SQLite", f"sqlite:///{Path(tmp) / 'http.db'}", Path(tmp), args)
    if "mariadb" in engines:
        with mysql_scratch(args.mysql_url) as (url, _), tempfile.TemporaryDirectory() as tmp:
            measure("MariaDB", url, Path(tmp), args)


if __name__ == "__main__":
    main()
