"""Request bindings in the ledger: batched ingest rate against the raw insert rate of the same
database in the same run, and audit query latency (by request id, by file) at a large number
of stored bindings. SQLite and a real, throwaway PostgreSQL server (servewitness/testing/postgres).

Ingest: each arm stores ROUNDS x BATCHES batches of BATCH request bindings (a span row and an
id row per request), interleaved. ``store``: ``Store.save_report`` (report row, ledger entries,
index updates, every row digested into its batch's ledger subject, one transaction per batch).
``raw``: the same rows, executemany into tables with the same columns and no index, one
transaction per batch. Rates are requests per second; building the batches (what the agent
sends) is outside both clocks, turning them into rows is inside the store's.

Queries: the database is filled through ``Store.save_report`` to ROWS bindings (synthetic:
TARGETS targets of PROCS processes, MANIFESTS manifests of FILES files shared among them), then
QUERIES lookups by the client's id and by a file's sha256 go through the same functions the
CLI calls (``servewitness.ledger.queries.find_request`` / ``find_file``); p50 / p99 / max in ms.

Usage: bench/bindings_ledger.py [--backend sqlite|postgresql|both] [--rows N] [--queries N]
    [--batch N] [--db PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _smoke
from _stats import print_rows, summary

from servewitness import wire
from servewitness.ledger import bindings
from servewitness.ledger.queries import find_file, find_request
from servewitness.model import FileEntry, ProcessKey, RequestId, RequestSpan, TargetReport
from servewitness.server.db import open_database
from servewitness.server.index import ProcessSeen, processes_seen
from servewitness.server.store import Store, StoredReport
from servewitness.testing.postgres import PostgresServer
from tests.test_policy_engine import worker as worker_report

Rows = tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]
BATCH = 5000
BATCHES = 8
ROUNDS = 5
TARGETS = 10
PROCS = 10  # worker processes per target
MANIFESTS = 10
FILES = 2000
RUNNER = "vllm.v1.worker.cpu_model_runner.CPUModelRunner"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def manifest_files(m: int) -> tuple[FileEntry, ...]:
    # Most files shared by every manifest (the same wheel), a tenth particular to each.
    return tuple(
        FileEntry(path=f"/venv/lib/python3.11/site-packages/pkg/mod{i}.py",
                  sha256=sha(f"{i}" if i % 10 else f"{i}/{m}"), size=100, kind="source",
                  module=f"pkg.mod{i}", at="import")
        for i in range(FILES)
    )  # fmt: skip


def digest(m: int) -> str:
    return "sha256:" + sha(f"manifest {m}")


class Fleet:
    """Synthetic targets, processes and requests; request i is client id ``req<i>``."""

    def __init__(self) -> None:
        self.procs = [
            (f"t{t}", ProcessKey("boot", 1000 + t * PROCS + p, 5000 + p), digest((t + p) % MANIFESTS))
            for t in range(TARGETS)
            for p in range(PROCS)
        ]  # fmt: skip
        self.index = {digest(m): m for m in range(MANIFESTS)}
        self.seq: dict[str, int] = {}
        self.next_request = 0

    def report(self, store: Store, target: str, n: int, with_manifests: bool = False) -> None:
        """One report of TARGET carrying N bindings of its processes."""
        store.save_report(*self.build(target, n, with_manifests))

    def build(
        self, target: str, n: int, with_manifests: bool = False
    ) -> tuple[StoredReport, dict[str, Any], list[ProcessSeen], list[RequestSpan], list[RequestId]]:
        """save_report's arguments for one report of TARGET carrying N bindings."""
        seq = self.seq[target] = self.seq.get(target, 0) + 1
        now = time.time()
        mine = [(k, m) for t, k, m in self.procs if t == target]
        spans, ids = [], []
        for j in range(n):
            key, m = mine[j % len(mine)]
            i = self.next_request
            self.next_request += 1
            internal = f"cmpl-req{i}-0-{i:08x}"
            spans.append(RequestSpan(key, internal, 10 * i, 10 * i + 16, 16, 40, now - 1, now,
                                     m, m, RUNNER, (("step", 16), ("sample", 16))))  # fmt: skip
            ids.append(RequestId(ProcessKey("boot", 1, 1), internal, f"cmpl-req{i}-0", now - 1))
        # The processes are in the report's body too: the index rows are what the stored
        # report derives (verifier audit checks them against it), never rows of their own.
        procs = tuple(replace(worker_report(), key=k, manifest_digest=m, files=None)
                      for k, m in mine)  # fmt: skip
        body = wire.report_to_bytes(TargetReport("agent-" + target, target, seq, "", now, procs))
        manifests = {}
        if with_manifests:
            manifests = {m: manifest_files(self.index[m]) for _, m in mine}
        seen = processes_seen(procs)
        return StoredReport("agent-" + target, seq, target, now, body), manifests, seen, spans, ids


def raw_batch(
    db_target: str, fleet: Fleet, n: int
) -> tuple[Callable[[], Rows], Callable[[Rows], None]]:
    """(build a batch's rows, insert them in one transaction) into unindexed tables."""
    db = open_database(db_target)
    if db.kind == "postgresql":  # the same column types as the store's tables
        db.executescript("CREATE TABLE raw_spans (c0 TEXT, c1 TEXT, c2 TEXT, c3 BIGINT, c4 BIGINT,"
                         " c5 TEXT, c6 BIGINT, c7 BIGINT, c8 BIGINT, c9 BIGINT,"
                         " c10 DOUBLE PRECISION, c11 DOUBLE PRECISION, c12 TEXT, c13 TEXT,"
                         " c14 TEXT, c15 TEXT, c16 BIGINT, c17 TEXT);"
                         "CREATE TABLE raw_ids (c0 TEXT, c1 TEXT, c2 TEXT, c3 TEXT, c4 TEXT,"
                         " c5 DOUBLE PRECISION);")  # fmt: skip
    else:
        db.executescript(
            "CREATE TABLE raw_spans (" + ", ".join(f"c{i}" for i in range(18)) + ");"
            "CREATE TABLE raw_ids (" + ", ".join(f"c{i}" for i in range(6)) + ");"
        )
    span_sql = f"INSERT INTO raw_spans VALUES ({', '.join('?' * 18)})"  # noqa: S608 - fixed
    id_sql = "INSERT INTO raw_ids VALUES (?, ?, ?, ?, ?, ?)"

    def build() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        now = time.time()
        target, key, m = fleet.procs[0]
        spans, ids = [], []
        for _ in range(n):
            i = fleet.next_request
            fleet.next_request += 1
            internal = f"cmpl-req{i}-0-{i:08x}"
            b = RequestSpan(key, internal, 10 * i, 10 * i + 16, 16, 40, now - 1, now, m, m,
                            RUNNER, (("step", 16), ("sample", 16)))  # fmt: skip
            r = RequestId(ProcessKey("boot", 1, 1), internal, f"cmpl-req{i}-0", now - 1)
            spans.append(bindings.span_row("batch", target, b))
            ids.append(bindings.id_row("batch", target, r))
        return spans, ids

    def one(rows: tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]) -> None:
        db.begin()
        db.executemany(span_sql, rows[0])
        db.executemany(id_sql, rows[1])
        db.commit()

    return build, one


def ingest(target: str, label: str) -> None:
    fleet = Fleet()
    store = Store(target)
    fleet.report(store, "t0", 0, with_manifests=True)
    build_raw, insert_raw = raw_batch(target, fleet, BATCH)
    rates: dict[str, list[float]] = {"store": [], "raw": []}
    for _ in range(ROUNDS):  # the batches are built before each arm's clock starts
        reports = [fleet.build(f"t{b % TARGETS}", BATCH) for b in range(BATCHES)]
        t0 = time.perf_counter()
        for args in reports:
            store.save_report(*args)
        rates["store"].append(BATCH * BATCHES / (time.perf_counter() - t0))
        rows = [build_raw() for _ in range(BATCHES)]
        t0 = time.perf_counter()
        for r in rows:
            insert_raw(r)
        rates["raw"].append(BATCH * BATCHES / (time.perf_counter() - t0))
    store.close()
    stats = {k: summary(v) for k, v in rates.items()}
    print(f"{label}: ingest, requests/s (a span row and an id row each), batches of {BATCH}, "
          f"{BATCHES} batches x {ROUNDS} rounds interleaved")  # fmt: skip
    print_rows(stats, "9.0f")
    print(f"  store / raw (medians): {stats['store']['median'] / stats['raw']['median']:.2f}")


def fill(target: str, label: str, rows: int, batch: int) -> int:
    """Store ROWS bindings in reports of BATCH bindings each; the number stored."""
    fleet = Fleet()
    store = Store(target)
    t0 = time.perf_counter()
    for t in range(TARGETS):
        fleet.report(store, f"t{t}", 0, with_manifests=True)
    step = min(batch, rows)
    for b in range(rows // step):
        fleet.report(store, f"t{b % TARGETS}", step)
    took = time.perf_counter() - t0
    store.close()
    total = fleet.next_request
    print(f"{label}: filled {total:,} bindings in {took:.0f} s ({total / took:,.0f}/s), "
          f"batches of {step:,}")  # fmt: skip
    return total


def queries(target: str, label: str, rows: int, n: int, batch: int = 20_000) -> None:
    """Fill TARGET (unless it holds bindings already: ``--db``), then N lookups of each kind,
    taking turns; p50 / p99 / max, and each kind's p50 per fifth of the lookups as rows (their
    spread is the noise floor of the p50)."""
    db = open_database(target, read_only=True) if Path(target).exists() else None
    total = 0
    if db is not None:
        got = db.execute("SELECT COUNT(*) FROM bindings").fetchone()
        total = int(got[0]) if got else 0
        db.close()
    if not total:
        total = fill(target, label, rows, batch)
    db = open_database(target, read_only=True)
    rng = random.Random(7)  # noqa: S311 - which rows to look up, not a secret
    lat: dict[str, list[float]] = {"by request id": [], "by file sha256": []}
    for _ in range(n):
        i = rng.randrange(total)
        t1 = time.perf_counter()
        (got,) = find_request(db, f"req{i}")
        lat["by request id"].append((time.perf_counter() - t1) * 1e3)
        assert got.internal_id == f"cmpl-req{i}-0-{i:08x}"
        f = rng.randrange(FILES)
        m = rng.randrange(MANIFESTS)
        t1 = time.perf_counter()
        hits = find_file(db, sha(f"{f}" if f % 10 else f"{f}/{m}"))
        lat["by file sha256"].append((time.perf_counter() - t1) * 1e3)
        assert hits
    db.close()
    print(f"{label}: audit query latency at {total:,} bindings, {n} lookups each (ms)")
    fifths = max(1, n // 5)
    per_round = {
        f"{k} p50 per {fifths} lookups": [
            statistics.median(v[i : i + fifths]) for i in range(0, len(v) - fifths + 1, fifths)
        ]
        for k, v in lat.items()
    }
    for k, v in lat.items():
        v.sort()
        p99 = v[min(len(v) - 1, int(len(v) * 0.99))]
        print(f"  {k:<15}  p50 {statistics.median(v):6.2f}  p99 {p99:6.2f}  max {v[-1]:6.2f}")
    print_rows({k: summary(v) for k, v in per_round.items()}, "8.2f")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--rows", type=int, default=10_000_000, help="bindings for the query arm")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument(
        "--batch",
        type=int,
        default=20_000,
        help="bindings per report when filling the query arm's database",
    )
    ap.add_argument("--db", metavar="PATH",
                    help="the query arm's SQLite file: filled if new, reused if it holds "
                         "bindings (to time two commits' queries on one database)")  # fmt: skip
    ap.add_argument("--skip-ingest", action="store_true")
    ap.add_argument("--skip-queries", action="store_true")
    ap.add_argument("--pg-dbs", metavar="INGEST_URL,QUERY_URL",
                    help="two empty databases of a running PostgreSQL, instead of starting one")  # fmt: skip
    _smoke.add_args(ap)
    args = ap.parse_args()
    if args.smoke:
        global BATCH, BATCHES, ROUNDS, TARGETS, PROCS, MANIFESTS, FILES  # the fleet reads them
        _smoke.begin(
            "ingest (2 batches of 50) and queries (10 lookups at 200 bindings) on each backend, "
            "2 targets of 2 processes, 2 manifests of 100 files"
        )
        BATCH, BATCHES, ROUNDS = 50, 2, _smoke.ROUNDS
        TARGETS, PROCS, MANIFESTS, FILES = 2, 2, 2, 100
        args.rows, args.queries = 200, 10
    with tempfile.TemporaryDirectory(prefix="bindings-bench-", dir=os.environ.get("TMPDIR")) as d:
        if args.backend in ("sqlite", "both"):
            if not args.skip_ingest:
                ingest(str(Path(d) / "ingest.sqlite3"), "sqlite")
            if not args.skip_queries:
                path = args.db or str(Path(d) / "query.sqlite3")
                queries(path, "sqlite", args.rows, args.queries, args.batch)
        if args.backend in ("postgresql", "both") and args.pg_dbs:
            ingest_db, query_db = args.pg_dbs.split(",")
            if not args.skip_ingest:
                ingest(ingest_db, "postgresql")
            if not args.skip_queries:
                queries(query_db, "postgresql", args.rows, args.queries, args.batch)
        elif args.backend in ("postgresql", "both"):
            with PostgresServer() as pg:
                if not args.skip_ingest:
                    ingest(pg.createdb("ingest"), "postgresql")
                if not args.skip_queries:
                    queries(pg.createdb("query"), "postgresql", args.rows, args.queries, args.batch)


if __name__ == "__main__":
    main()
