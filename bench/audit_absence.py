"""What "not found" costs an audit answer: ``verifier audit request`` for an id no stored row
names checks every ledgered batch of bindings whole first (``ledger/completeness.py``), so a
row deleted behind the ledger's back is named instead of read as "never served".

A SQLite store holds BINDINGS requests in ledgered batches of ``seal_requests.BATCH`` (an id
row and a binding row each, as a serving target reports them). Arms, interleaved over ROUNDS
rounds:
  found       ``find_request`` of a served client id (its batch hashed, the answer built)
  not found   ``find_request`` of an id nobody sent: the same lookups, then every batch's
              rows hashed and compared with its ledger entry
  read rows   every span and id row read from SQLite in storage order, nothing hashed: the
              floor of any whole check on this schema
Prints ms per call per arm, the ratios (paired per round) and the noise floor (spread).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
import seal_requests
from _stats import print_rows, summary

BINDINGS = (10_000, 100_000)
ROUNDS = 5


def measure(bindings: int, rounds: int) -> None:
    from servewitness.errors import NotFound
    from servewitness.ledger import queries
    from servewitness.server import store as store_mod

    with tempfile.TemporaryDirectory() as d:
        st = store_mod.Store(Path(d) / "verifier.sqlite3")
        seal_requests._fill(st, bindings)
        db: Any = st._db

        def found() -> int:
            return len(queries.find_request(db, f"req{bindings // 2}"))

        def not_found() -> int:
            try:
                queries.find_request(db, "twin-0")
            except NotFound:
                return 0
            raise SystemExit("an id nobody sent was found")

        def read_rows() -> int:
            n = 0
            for sql in ("SELECT * FROM bindings ORDER BY rowid",
                        "SELECT * FROM request_ids ORDER BY rowid"):  # fmt: skip
                for _ in db.execute(sql):
                    n += 1
            return n

        arms = {"found": found, "not found": not_found, "read rows": read_rows}
        if (found(), read_rows()) != (1, 2 * bindings):
            raise SystemExit("the store does not hold what was filled")
        per: dict[str, list[float]] = {k: [] for k in arms}
        for i in range(rounds):
            for arm in list(arms) if i % 2 == 0 else list(reversed(arms)):
                t0 = time.perf_counter()
                arms[arm]()
                per[arm].append((time.perf_counter() - t0) * 1e3)
        st.close()
    print(f"{bindings} requests stored (a span and an id row each) in batches of "
          f"{seal_requests.BATCH}; {rounds} interleaved rounds, ms per call (wall)")  # fmt: skip
    print_rows({k: summary(v) for k, v in per.items()}, fmt="9.2f")
    for num, den in (("not found", "read rows"), ("not found", "found")):
        s = summary([a / b for a, b in zip(per[num], per[den], strict=True)])
        print(f"  {num} / {den} at {bindings} = {s['median']:.2f} (paired per round; spread "
              f"{s['spread']:.1%})")  # fmt: skip
    s = summary(per["not found"])
    print(f"  not found: {s['median'] * 1e3 / (2 * bindings):.2f} us per stored row")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--bindings", type=int, nargs="+", default=list(BINDINGS))
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    _smoke.add_args(parser)
    args = parser.parse_args()
    sizes, rounds = args.bindings, args.rounds
    if args.smoke:
        _smoke.begin("the three arms over 2,000 requests, one round")
        sizes, rounds = [2000], _smoke.ROUNDS
    for n in sizes:
        measure(n, rounds)


if __name__ == "__main__":
    main()
