"""Publish: time and peak memory as the catalog grows, against a SQL closure peer, and
an incremental publication against the full rebuild of the same catalog.

Base: 250 packs x 20 components, 1,000 audiences, 10,000 bindings. For each
scale a fresh SQLite store gets the packs (one git commit) and the bindings
through `apply --no-publish`. Then one warm-up of each and --repeat rounds
alternating A B A B (medians), each run in a fresh child process on a fresh
copy of the store:

  publish   - `CommandService.publish()` of the whole catalog (its first revision):
              the figure is the publish call; the child's interpreter start and
              imports are printed beside it; peak RSS is the child's (wait4)
  sql peer  - the same closure as one straightforward SQL query on the same engine
              and store file: every binding joined to its pack's active generation
              and component, each `requires` checked against the same audience's
              bindings and each credential set against the component's (json_each),
              every row fetched in canonical order. No dedupe, digest or append.

Then, at --incremental-scale (default: the largest), the store is published, a
release changes pack 0 (a new payload; its audiences re-bound) and is published
incrementally, and a release changes pack 1, not published: the state every
release after the first finds. Alternating on fresh copies of that state:

  incremental - `publish()`: digests the parent's kept fragments, re-encoding only
                the audiences it re-validates and the packs they bind
  full        - `publish()` with `incremental = False`: the full rebuild, same state
  cold        - `publish()` of pack 0's change, whose parent was a full build (no
                kept fragments): the incremental build that streams the whole content

Printed: the engine's durability settings, one row per scale, the growth exponent
1x -> Nx beside n log n's, and SUMMARY lines (bench.all collects them).

Usage:
  python -m bench.publish [--scales 1,4,16] [--repeat 3] [--incremental-scale N]
                          [--setup-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import alternate, durability, summary
from ledger.commands.service import CommandService
from ledger.log.db import open_database
from ledger.sources.files import MAX_MANIFEST_BYTES, read_input_file
from ledger.store.init import init_store
from ledger.store.runtime import Ledger
from tests.support.gitrepo import Repo

BASE_PACKS, COMPONENTS, BASE_AUDIENCES, PER_AUDIENCE = 250, 20, 1000, 10


def pack_document(n: int) -> dict[str, Any]:
    components = []
    for c in range(COMPONENTS):
        comp: dict[str, Any] = {
            "kind": "callout_profile" if c % 2 == 0 else "push_contract",
            "key": f"p{n}.c{c}",
            "payload": {"pack": n, "component": c, "url": f"https://svc-{n}.example/{c}"},
        }
        if c % 2 == 1:  # each contract requires the profile before it
            comp["requires"] = [{"kind": "callout_profile", "key": f"p{n}.c{c - 1}"}]
        if c % 4 == 0:
            comp["credential_sets"] = ["prod", "test"]
        components.append(comp)
    return {"name": f"pack-{n:05d}", "category": "app", "components": components}


def audience_bindings(audience: int, pack: int) -> list[dict[str, Any]]:
    """The bench's ``PER_AUDIENCE`` bindings of workload ``audience`` to ``pack``."""
    out: list[dict[str, Any]] = []
    for c in range(PER_AUDIENCE):
        binding = {
            "audience": f"integration:workload-{audience:06d}",
            "pack": f"pack-{pack:05d}",
            "kind": "callout_profile" if c % 2 == 0 else "push_contract",
            "key": f"p{pack}.c{c}",
        }
        if c % 4 == 0:
            binding["credential_set"] = "prod"
        out.append(binding)
    return out


def official_pack(n: int, repo: Path, commit: str) -> dict[str, Any]:
    """Manifest entry of pack ``n`` at ``commit`` of the bench's pack repository."""
    return {
        "name": f"pack-{n:05d}",
        "source": {
            "kind": "official_repo",
            "repo": str(repo),
            "revision": commit,
            "path": f"pack-{n:05d}/pack.json",
        },
    }


def setup(folder: Path, scale: int) -> tuple[str, dict[str, int]]:
    """A fresh SQLite store in ``folder`` with the scaled catalog applied, unpublished."""
    url = f"sqlite:///{folder / 'catalog.db'}"
    return url, setup_store(folder, url, scale)


def setup_store(folder: Path, url: str, scale: int) -> dict[str, int]:
    """Apply the scaled packs and bindings to the store at ``url`` (not published)."""
    packs, audiences = BASE_PACKS * scale, BASE_AUDIENCES * scale
    repo = Repo(folder / "repo")
    files = {f"pack-{n:05d}/pack.json": json.dumps(pack_document(n)).encode() for n in range(packs)}
    commit = repo.commit(files)
    bindings = []
    for a in range(audiences):
        bindings.extend(audience_bindings(a, a % packs))
    manifest = {
        "packs": [official_pack(n, repo.path, commit) for n in range(packs)],
        "bindings": bindings,
    }
    path = folder / "release.json"
    path.write_text(json.dumps(manifest, separators=(",", ":")))
    db = open_database(url)
    init_store(db)
    # The 64x manifest (640k bindings) is above the operator-file limit of 64 MiB; the
    # bench's own file may be larger (the limit guards operator input, not the publisher).
    defaults = read_input_file.__kwdefaults__
    assert defaults is not None
    defaults["limit"] = max(MAX_MANIFEST_BYTES, path.stat().st_size)
    try:
        CommandService(Ledger(db)).apply(path, publish=False)
    finally:
        defaults["limit"] = MAX_MANIFEST_BYTES
    db.close()
    return {
        "packs": packs,
        "components": packs * COMPONENTS,
        "audiences": audiences,
        "bindings": len(bindings),
    }


# The benchmark process is large after setup, and a forked child's peak RSS counts the
# parent's pages it inherited before exec; a tiny wrapper process starts the child instead.
_WRAPPER = """
import json, os, subprocess, sys, time
started = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
_, status, usage = os.wait4(proc.pid, 0)
wall = time.perf_counter() - started
print(json.dumps({"wall": wall, "maxrss_kib": usage.ru_maxrss, "status": status,
                  "stdout": proc.stdout.read().decode(), "stderr": proc.stderr.read().decode()}))
"""

_PUBLISH = """
import json, sys, time
started = time.perf_counter()
from ledger.commands.service import CommandService
from ledger.log.db import open_database
from ledger.store.runtime import Ledger
db = open_database(sys.argv[1])
service = CommandService(Ledger(db))
service.incremental = sys.argv[2] == "incremental"
ready = time.perf_counter()
result = service.publish()
done = time.perf_counter()
db.close()
print(json.dumps({"seconds": done - ready, "startup": ready - started, "result": result}))
"""

# The closure of R15 as one query over the views' physical tables, each at its live
# version (projection_state).
_PEER_SQL = """
SELECT b.audience_kind, b.audience_id, b.pack, b.kind, b.key, b.credential_set,
       b.install_id, c.fact_digest, a.pack IS NULL AS stale,
       (SELECT count(*) FROM json_each(CAST(c.fact AS TEXT), '$.requires') r
         WHERE NOT EXISTS (
           SELECT 1 FROM view_audience_binding b2
            WHERE b2.view_version = b.view_version
              AND b2.audience_kind = b.audience_kind AND b2.audience_id = b.audience_id
              AND b2.pack = COALESCE(CAST(json_extract(r.value, '$.pack') AS BLOB), b.pack)
              AND b2.kind = CAST(json_extract(r.value, '$.kind') AS BLOB)
              AND b2.key = CAST(json_extract(r.value, '$.key') AS BLOB))) AS missing,
       CASE WHEN json_extract(CAST(c.fact AS TEXT), '$.credential_sets') IS NULL
              THEN b.credential_set != x''
            WHEN EXISTS (SELECT 1 FROM json_each(CAST(c.fact AS TEXT), '$.credential_sets') s
                          WHERE CAST(s.value AS BLOB) = b.credential_set) THEN 0
            ELSE 1 END AS unauthorized
  FROM view_audience_binding b
  LEFT JOIN view_pack_activation a
    ON a.view_version = :va AND a.pack = b.pack AND a.install_id = b.install_id
   AND a.payload_hash = b.payload_hash
  LEFT JOIN view_pack_component c
    ON c.view_version = :vc AND c.pack = b.pack AND c.install_id = b.install_id
   AND c.kind = b.kind AND c.key = b.key
 WHERE b.view_version = :vb
 ORDER BY b.audience_kind, b.audience_id, b.pack, b.kind, b.key, b.credential_set
"""

_PEER = """
import json, sqlite3, sys, time
started = time.perf_counter()
conn = sqlite3.connect(sys.argv[1])
live = {bytes(n).decode(): v for n, v in conn.execute(
    "SELECT name, live_version FROM projection_state")}
ready = time.perf_counter()
rows = conn.execute(sys.argv[2], {"vb": live["audience_binding"],
                                  "va": live["pack_activation"],
                                  "vc": live["pack_component"]}).fetchall()
done = time.perf_counter()
print(json.dumps({
    "seconds": done - ready, "startup": ready - started, "rows": len(rows),
    "problems": sum(1 for r in rows if r[7] is None or r[8] or r[9] or r[10]),
    "facts": len({(r[2], r[6], r[3], r[4]) for r in rows}),
    "audiences": len({(r[0], r[1]) for r in rows}),
}))
"""


def child(script: str, *args: str) -> dict[str, Any]:
    """Run ``script`` in a fresh interpreter (through the wrapper): its JSON report with
    the child's wall time and peak RSS (MiB)."""
    out = subprocess.run(
        [sys.executable, "-c", _WRAPPER, sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(out.stdout)
    if report["status"] != 0:
        raise SystemExit(f"child failed: {report['stdout']} {report['stderr']}")
    doc: dict[str, Any] = json.loads(report["stdout"])
    doc["wall"] = report["wall"]
    doc["peak_mib"] = report["maxrss_kib"] / 1024
    return doc


def timed_publish(url: str, mode: str = "incremental") -> dict[str, Any]:
    """`publish()` in a child process (``mode``: "incremental" or "full")."""
    return child(_PUBLISH, url, mode)


def timed_peer(url: str) -> dict[str, Any]:
    return child(_PEER, url.removeprefix("sqlite:///"), _PEER_SQL)


class Copies:
    """A fresh copy of one store file for each run (removed after it)."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self.count = 0

    def run(self, measure: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
        self.count += 1
        copy = self.source.with_name(f"{self.source.stem}-run{self.count}.db")
        shutil.copyfile(self.source, copy)
        try:
            return measure(f"sqlite:///{copy}")
        finally:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{copy}{suffix}").unlink(missing_ok=True)


def change_one_pack(folder: Path, url: str, pack: int = 0) -> None:
    """Publish the store at ``url``, then apply a release that changes one pack's payload:
    a new generation, its audiences re-bound, not published."""
    db = open_database(url)
    try:
        service = CommandService(Ledger(db))
        service.publish()
        repo = Repo(folder / "repo")
        document = pack_document(pack)
        document["components"][0]["payload"]["url"] += "/v2"
        name = f"pack-{pack:05d}"
        commit = repo.commit({f"{name}/pack.json": json.dumps(document).encode()})
        manifest = {
            "packs": [
                {
                    "name": name,
                    "source": {
                        "kind": "official_repo",
                        "repo": str(repo.path),
                        "revision": commit,
                        "path": f"{name}/pack.json",
                    },
                }
            ]
        }  # no "bindings": the current ones stay, re-bound to the new generation (R14)
        path = folder / f"change-{name}.json"
        path.write_text(json.dumps(manifest))
        result = service.apply(path, publish=False)
        assert result["packs"][0]["decision"] == "advance", result
    finally:
        db.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scales", default="1,4,16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--incremental-scale",
        type=int,
        default=None,
        help="scale of the incremental-vs-full run (default: the largest of --scales; 0: none)",
    )
    parser.add_argument(
        "--setup-dir",
        default=None,
        help="keep each scale's store in DIR/s<scale> and reuse it on the next run "
        "(setting 64x up takes minutes)",
    )
    args = parser.parse_args()
    scales = [int(s) for s in args.scales.split(",")]
    inc_scale = max(scales) if args.incremental_scale is None else args.incremental_scale
    print(
        "publish benchmark (SQLite): publish() in a child process, peak RSS of that child; "
        f"1 warm-up, then A B A B x {args.repeat}, medians"
    )
    with tempfile.TemporaryDirectory() as tmp:
        durability(f"sqlite:///{Path(tmp) / 'durability.db'}", "ledger")
    print("durability (sql peer, sqlite): the same store file, read only (sqlite3 module)")
    print(
        f"{'scale':>5} {'packs':>6} {'facts':>7} {'audiences':>9} {'bindings':>8} "
        f"{'publish s':>9} {'startup':>7} {'peak MiB':>8} {'sql s':>7} {'x sql':>6} "
        f"{'x 1x':>6} {'nlogn x':>7}",
        flush=True,
    )
    results: dict[int, dict[str, Any]] = {}
    for scale in scales:
        if args.setup_dir is not None:
            folder = Path(args.setup_dir) / f"s{scale}"
            results[scale] = run_scale(folder, scale, args.repeat, scale == inc_scale)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                results[scale] = run_scale(Path(tmp), scale, args.repeat, scale == inc_scale)
        row, base = results[scale], results[scales[0]]
        n, n0 = row["sizes"]["bindings"], base["sizes"]["bindings"]
        nlogn = (n * math.log(n)) / (n0 * math.log(n0))
        print(
            f"{scale:>5} {row['sizes']['packs']:>6} {row['counts']['facts']:>7} "
            f"{row['sizes']['audiences']:>9} {n:>8} {row['publish']:>9.2f} "
            f"{row['startup']:>7.2f} {row['peak']:>8.0f} {row['sql']:>7.2f} "
            f"{row['publish'] / row['sql']:>6.1f} {row['publish'] / base['publish']:>6.1f} "
            f"{nlogn:>7.1f}",
            flush=True,
        )
        if "incremental" in row:
            print(
                f"  1 changed pack among {row['sizes']['packs']}: incremental "
                f"{row['incremental']:.3f} s (peak {row['incremental_peak']:.0f} MiB), full "
                f"rebuild of the same catalog {row['full_same']:.3f} s (peak "
                f"{row['full_same_peak']:.0f} MiB): ratio "
                f"{row['incremental'] / row['full_same']:.3f}; with the parent a full build "
                f"(no kept fragments) incremental {row['incremental_cold']:.3f} s: ratio "
                f"{row['incremental_cold'] / row['full_same']:.3f}",
                flush=True,
            )
    report(scales, results)


def prepared(folder: Path, scale: int) -> tuple[str, dict[str, int]]:
    """``setup`` in ``folder``, or the store a previous run left there (``--setup-dir``)."""
    done = folder / "sizes.json"
    if done.exists() and (folder / "catalog.db").exists():
        return f"sqlite:///{folder / 'catalog.db'}", dict(json.loads(done.read_text()))
    folder.mkdir(parents=True, exist_ok=True)
    url, sizes = setup(folder, scale)
    done.write_text(json.dumps(sizes))
    return url, sizes


def run_scale(folder: Path, scale: int, repeat: int, incremental: bool) -> dict[str, Any]:
    """Set one scale up and measure it (publish vs SQL peer; incremental vs full)."""
    _, sizes = prepared(folder, scale)
    copies = Copies(folder / "catalog.db")
    docs: list[dict[str, Any]] = []

    def publish_once() -> float:
        doc = copies.run(timed_publish)
        assert not doc["result"]["noop"], doc
        docs.append(doc)
        return float(doc["seconds"])

    def peer_once() -> float:
        doc = copies.run(timed_peer)
        assert doc["problems"] == 0 and doc["rows"] == sizes["bindings"], doc
        assert doc["facts"] == docs[-1]["result"]["counts"]["facts"], doc
        return float(doc["seconds"])

    measured = alternate({"publish": publish_once, "sql peer": peer_once}, repeat)
    measured_docs = docs[1:] or docs  # after the warm-up
    row: dict[str, Any] = {
        "sizes": sizes,
        "counts": docs[-1]["result"]["counts"],
        "publish": measured["publish"].median,
        "peak": statistics.median(d["peak_mib"] for d in measured_docs),
        "startup": statistics.median(d["startup"] for d in measured_docs),
        "sql": measured["sql peer"].median,
    }
    if not incremental:
        return row
    # "cold": published once (a full build, so no kept fragments), then pack 0 changed.
    # "steady": that change published too (incrementally: its fragments are kept), then
    # pack 1 changed, as every release after the first finds the store.
    shutil.copyfile(folder / "catalog.db", folder / "cold.db")
    change_one_pack(folder, f"sqlite:///{folder / 'cold.db'}", pack=0)
    shutil.copyfile(folder / "cold.db", folder / "steady.db")
    change_one_pack(folder, f"sqlite:///{folder / 'steady.db'}", pack=1)
    stores = {"cold": Copies(folder / "cold.db"), "steady": Copies(folder / "steady.db")}
    peaks: dict[str, list[float]] = {"incremental": [], "full": [], "cold": []}

    def publish_mode(name: str, store: str, mode: str) -> Callable[[], float]:
        def once() -> float:
            doc = stores[store].run(lambda u: timed_publish(u, mode))
            assert doc["result"]["published"], doc
            peaks[name].append(doc["peak_mib"])
            return float(doc["seconds"])

        return once

    runs = alternate(
        {
            "incremental": publish_mode("incremental", "steady", "incremental"),
            "full": publish_mode("full", "steady", "full"),
            "cold": publish_mode("cold", "cold", "incremental"),
        },
        repeat,
    )
    row["incremental"] = runs["incremental"].median
    row["full_same"] = runs["full"].median
    row["incremental_cold"] = runs["cold"].median
    for name in peaks:
        row[f"{name}_peak"] = statistics.median(peaks[name][1:])
    row["full_same_peak"] = row.pop("full_peak")
    return row


def report(scales: list[int], results: dict[int, dict[str, Any]]) -> None:
    """The SUMMARY lines (targets of issue 18 item 4 apply at 64x and 16x)."""
    largest = max(scales)
    top = results[largest]
    summary(
        bench="publish",
        figure=f"full publish s ({largest}x, {top['sizes']['bindings']} bindings)",
        engine="sqlite",
        workers=1,
        value=top["publish"],
        unit="s",
        peer="sql closure query (no dedupe/digest/append)",
        peer_value=top["sql"],
        target="value<=60" if largest == 64 else None,
    )
    summary(
        bench="publish",
        figure=f"peak RSS of full publish ({largest}x)",
        engine="sqlite",
        workers=1,
        value=top["peak"],
        unit="MiB",
        target="value<=1536" if largest == 64 else None,
    )
    if len(scales) > 1:
        first = results[scales[0]]
        n0, n = first["sizes"]["bindings"], top["sizes"]["bindings"]
        exponent = math.log(top["publish"] / first["publish"]) / math.log(n / n0)
        bound = math.log((n * math.log(n)) / (n0 * math.log(n0))) / math.log(n / n0)
        print(
            f"growth {scales[0]}x -> {largest}x: time ~ n^{exponent:.2f} "
            f"(n log n over this range: n^{bound:.2f})"
        )
        summary(
            bench="publish",
            figure=f"growth exponent {scales[0]}x->{largest}x",
            engine="sqlite",
            workers=1,
            value=exponent,
            unit="exponent",
            peer="n log n",
            peer_value=bound,
            target=f"value<={bound:.3f}",
        )
    for scale in scales:
        row = results[scale]
        if "incremental" not in row:
            continue
        packs = row["sizes"]["packs"]
        for figure, value, target in (
            (f"incremental/full publish, 1 pack changed among {packs}", "incremental", "<=0.10"),
            (
                "incremental publish, parent a full build (no kept fragments)",
                "incremental_cold",
                None,
            ),
        ):
            summary(
                bench="publish",
                figure=figure,
                engine="sqlite",
                workers=1,
                value=row[value],
                unit="s",
                peer="full rebuild (incremental=False), same catalog",
                peer_value=row["full_same"],
                ratio=row[value] / row["full_same"],
                target=target,
            )


if __name__ == "__main__":
    main()
