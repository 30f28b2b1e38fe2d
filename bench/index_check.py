"""What checking the index tables against the ledgered content costs (issue 19, item 6a):
``servewitness.ledger.index_check.compare`` (every row, what ``verifier audit verify --db`` adds)
and ``check_processes`` for one target (what ``audit file``/``request``/``export`` run before
answering), on a database of N reports of TARGETS targets, each report three processes (API
server, engine core, a worker with its runner and files) and a batch of two request bindings,
as the test fixtures build them. Against the ledger walk (``chain.verify``) on the same
database, ROUNDS times each, interleaved.

Prints each arm's median, min, max and spread (the noise floor of ROUNDS repetitions) and the
ratio of each check to the ledger walk's median, measured in the same run.

Usage: PYTHONPATH=. python bench/index_check.py [--smoke] [N] [TARGETS]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _smoke
from _stats import print_rows, summary

from servewitness import wire
from servewitness.ledger import chain, index_check
from servewitness.model import TargetReport
from servewitness.server.db import open_database
from servewitness.server.index import processes_seen
from servewitness.server.store import Store, StoredReport
from tests.test_bindings_store import spans_for
from tests.test_policy_engine import api, engine, worker

N = 10_000
TARGETS = 10
ROUNDS = 5
M = "sha256:" + "3" * 64


def build(path: Path) -> int:
    procs = tuple(replace(p, manifest_digest=M, container_id="c" * 64)
                  for p in (api(), engine(), worker()))  # fmt: skip
    s = Store(path)
    s._db.execute("PRAGMA synchronous=OFF")  # building only: the check reads
    size = 0
    try:
        for i in range(N):
            target = f"t{i % TARGETS}"
            t = 1_700_000_000.0 + i
            body = wire.report_to_bytes(TargetReport("a", target, i + 1, "", t, procs))
            size += len(body)
            s.save_report(
                StoredReport(f"a{i % TARGETS}", i + 1, target, t, body),
                {M: procs[2].files or ()} if i == 0 else {},
                processes_seen(procs),
                spans_for(procs[2].key, t, None),
            )
    finally:
        s.close()
    return size // N


def main() -> None:
    global N, TARGETS, ROUNDS  # build() reads N and TARGETS
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("n", type=int, nargs="?", default=N, help="reports in the database")
    parser.add_argument("targets", type=int, nargs="?", default=TARGETS, help="targets")
    _smoke.add_args(parser)
    args = parser.parse_args()
    N, TARGETS = args.n, args.targets
    if args.smoke:
        _smoke.begin("every arm, 200 reports of 2 targets", ["a ledger of realistic size"])
        N, TARGETS, ROUNDS = 200, 2, _smoke.ROUNDS
    path = Path(tempfile.mkdtemp()) / "db.sqlite3"
    t0 = time.perf_counter()
    avg = build(path)
    print(f"built {N} reports ({avg} bytes each), {TARGETS} targets in "
          f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
    db = open_database(str(path), read_only=True)
    arms: dict[str, Callable[[], object]] = {
        "chain.verify": lambda: chain.verify(db),
        "index_check.compare (all)": lambda: index_check.compare(db),
        "check_processes (1 target)": lambda: index_check.check_processes(db, ["t0"]),
    }
    times: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(ROUNDS):
        for name, fn in arms.items():
            t = time.perf_counter()
            out = fn()
            times[name].append(time.perf_counter() - t)
            assert not isinstance(out, list) or not out, out[:3]
    stats = {name: summary(xs) for name, xs in times.items()}
    print(f"seconds per check, {ROUNDS} rounds interleaved")
    print_rows(stats, "8.3f")
    base = stats["chain.verify"]["median"]
    for name in ("index_check.compare (all)", "check_processes (1 target)"):
        print(f"  {name} / chain.verify (medians): {stats[name]['median'] / base:.2f}")


if __name__ == "__main__":
    main()
