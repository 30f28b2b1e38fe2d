"""What counting the other windows costs a seal: ``Store.record_seal`` with the count
(``window_rows.other_windows``, read inside the seal's write transaction) against the same
call with the count left out, as the ledger holds more windows.

A SQLite store holds WINDOWS windows, each sealed with a content of a real seal's size (two
processes, eight hooks each, evidence, a finding: ~5 kB of canonical JSON), and 20 report
entries per window between them. Arms, interleaved over ROUNDS rounds of N seals (each seal of
a window opened just before it, as a harness does):
  no count     ``record_seal`` with ``other_windows`` made to return nothing: the transaction's
               other work (the seal row, its ledger entry, the commit)
  with count   ``record_seal`` as it is
Prints ms per seal (wall: the time the store's lock and the write lock are held), the ratio
(paired per round) and the noise floor (spread).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
from _stats import print_rows, summary

WINDOWS = (100, 1000, 10_000)
ROUNDS = 5
N = 5
REPORTS_BETWEEN = 20


def _content(i: int) -> dict[str, Any]:
    """A seal's content of a real one's shape and size (tests/test_window_seal.py's)."""
    hooks = {
        f"{pid}/h{k}": {"name": f"h{k}", "pid": pid, "role": "worker", "fired": 6, "steps": 6,
                        "on": "productive", "fired_in_all": 99, "total_steps": 99}
        for pid in (100 + i, 200 + i) for k in range(8)
    }  # fmt: skip
    evidence = [
        {"agent_id": f"agent-{pid}", "report_seq": i, "ledger_seq": i, "ledger_hash": "ab" * 32,
         "manifest_digest": "cd" * 32, "authenticated_as": "unix:uid=0,pid=1",
         "evidence_age_s": 0.2, "probe_errors": [], "probe_error_count": 0}
        for pid in (100 + i, 200 + i)
    ]  # fmt: skip
    return {
        "window_id": f"w{i}",
        "run": "r",
        "held": i % 3 != 0,
        "hooks": hooks,
        "evidence": evidence,
        "findings": [] if i % 3 else [{"id": "window.hook_lagged", "message": "x" * 200}],
        "results": {"name": "results.json", "sha256": "ef" * 32, "size": 123},
    }


def _fill(st: Any, windows: int) -> None:
    from servewitness.ledger import chain

    for i in range(windows):

        def reports(db: Any, i: int = i) -> None:
            for k in range(REPORTS_BETWEEN):
                subject = hashlib.sha256(f"{i}/{k}".encode()).hexdigest()
                chain.append(db, 1_700_000_000.0 + i, "report", f"a/{i}/{k}", subject)

        st._tx([], reports)
        st.record_window(f"w{i}", "r", 1_700_000_000.0 + i, {"window_id": f"w{i}"})
        if i % 5:  # one in five never sealed
            st.record_seal(f"w{i}", "r", 1_700_000_001.0 + i, _content(i))


def measure(windows: int, rounds: int, n: int) -> None:
    from servewitness.server import store as store_mod
    from servewitness.server import window_rows

    real = window_rows.other_windows
    with tempfile.TemporaryDirectory() as d:
        st = store_mod.Store(Path(d) / "verifier.sqlite3")
        _fill(st, windows)
        counted = real(st._db, "none", "r")["ledger"]
        if counted["opened"] != windows:
            raise SystemExit(f"the count says {counted['opened']} windows, not {windows}")
        per: dict[str, list[float]] = {"no count": [], "with count": []}
        made = windows
        for i in range(rounds):
            order = list(per) if i % 2 == 0 else list(reversed(per))
            for arm in order:
                window_rows.other_windows = real if arm == "with count" else _nothing
                try:
                    total = 0.0
                    for _ in range(n):
                        wid = f"w{made}"
                        st.record_window(wid, "r", 1_700_100_000.0 + made, {"window_id": wid})
                        t0 = time.perf_counter()
                        st.record_seal(wid, "r", 1_700_100_001.0 + made, _content(made))
                        total += time.perf_counter() - t0
                        made += 1
                finally:
                    window_rows.other_windows = real
                per[arm].append(total / n * 1e3)
        st.close()
    print(f"{windows} windows in the ledger (one in five never sealed), {REPORTS_BETWEEN} "
          f"reports between each; {rounds} interleaved rounds of {n} seals, ms per seal "
          "(wall)")  # fmt: skip
    print_rows({k: summary(v) for k, v in per.items()}, fmt="8.2f")
    ratios = [c / b for c, b in zip(per["with count"], per["no count"], strict=True)]
    s = summary(ratios)
    extra = [c - b for c, b in zip(per["with count"], per["no count"], strict=True)]
    print(f"  with count / no count at {windows} windows = {s['median']:.2f} (paired per "
          f"round; spread {s['spread']:.1%}); the count adds {summary(extra)['median']:.2f} ms "
          "per seal")  # fmt: skip


def _nothing(db: Any, wid: str, run: str) -> dict[str, Any]:
    return {}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--windows", type=int, nargs="+", default=list(WINDOWS))
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("-n", type=int, default=N)
    _smoke.add_args(parser)
    args = parser.parse_args()
    windows, rounds, n = args.windows, args.rounds, args.n
    if args.smoke:
        _smoke.begin("both arms at 20 windows, one round of 2 seals")
        windows, rounds, n = [20], _smoke.ROUNDS, 2
    for w in windows:
        measure(w, rounds, n)


if __name__ == "__main__":
    main()
