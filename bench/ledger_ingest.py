"""What the audit ledger costs report ingest: Store.save_report (report row + ledger entry in
one transaction) against the same report rows inserted with the same SQLite settings and no
ledger, in the same run.

Arms (interleaved, ROUNDS rounds of N reports each, a fresh database file per round):
  ledger  servewitness.server.store.Store.save_report: INSERT report + ledger.append (a read of
          the chain's last entry, a sha256 of the report, one more INSERT)
  raw     the same INSERT into the same schema, one transaction per report, no ledger
Reports carry BODY bytes each (a digest-only agent report is about this size). Both arms pay
synchronous=FULL per transaction, as the verifier does: a report is acknowledged only after
its commit.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
from _stats import print_rows, summary

from servewitness.server.schema import SQLITE as SCHEMA
from servewitness.server.store import Store, StoredReport

N = 2000
ROUNDS = 7
BODY = os.urandom(2048)


def ledger_arm(path: Path) -> float:
    s = Store(path)
    t0 = time.perf_counter()
    for i in range(N):
        s.save_report(StoredReport("agent", i + 1, "t", time.time(), BODY), {})
    dt = time.perf_counter() - t0
    s.close()
    return N / dt


def raw_arm(path: Path) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.executescript(SCHEMA)
    t0 = time.perf_counter()
    for i in range(N):
        db.execute("BEGIN IMMEDIATE")
        db.execute(
            "INSERT INTO reports (agent_id, seq, target, received_unix, report) "
            "VALUES (?, ?, ?, ?, ?)",
            ("agent", i + 1, "t", time.time(), BODY),
        )
        db.execute("COMMIT")
    dt = time.perf_counter() - t0
    db.close()
    return N / dt


def main() -> None:
    global N, ROUNDS  # the arms read N
    if _smoke.parse(__doc__).smoke:
        _smoke.begin("both arms, 20 reports each")
        N, ROUNDS = 20, _smoke.ROUNDS
    results: dict[str, list[float]] = {"ledger": [], "raw": []}
    with tempfile.TemporaryDirectory(prefix="ledger-bench-", dir=os.environ.get("TMPDIR")) as d:
        for r in range(ROUNDS):
            for name, arm in (("ledger", ledger_arm), ("raw", raw_arm)):
                results[name].append(arm(Path(d) / f"{name}-{r}.sqlite3"))
    stats = {k: summary(v) for k, v in results.items()}
    print(f"reports/s, {N} reports of {len(BODY)} bytes per round, {ROUNDS} rounds interleaved")
    print_rows(stats)
    ratio = stats["ledger"]["median"] / stats["raw"]["median"]
    print(f"  ledger / raw (medians): {ratio:.2f}")


if __name__ == "__main__":
    main()
