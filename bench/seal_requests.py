"""What a seal's requests check costs the verifier: ``Store.request_steps`` over the request
ids a harness names (``seal --requests``), against the least a lookup of each id can cost.

A SQLite store holds BINDINGS requests as a serving target reports them (a ``request_ids`` row
mapping the client's id to the engine's, and a binding row), in ledgered batches of ``BATCH``
(the seal counts only rows their batch's ledger entry covers: each batch it touches is hashed
once per read). The ids asked for are half of
them served and half unknown (what a twin's requests look like: the check's worst case, each
id looked up as a client id, its derived client id and an internal id). Arms, interleaved
over ROUNDS rounds:
  indexed lookup   one ``SELECT ... FROM request_ids WHERE client_id = ?`` per id: the floor
                   of any per-id check on this schema
  request_steps    the seal's read (every way an id can name a request, then its bindings),
                   in chunks of ``REQUEST_STEPS_CHUNK`` ids per hold of the store's lock
Prints us per id per arm, the ratio (paired per round), the noise floor (spread), and the
longest hold of the store's lock by one chunk (what a report's write may wait behind).
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
from _stats import print_rows, summary

BINDINGS = 100_000
IDS = (10_000, 100_000)
ROUNDS = 5


BATCH = 1_000  # requests per stored batch (one agent report's worth)


def _fill(st: Any, n: int) -> None:
    """N served requests as reports store them: ledgered batches of BATCH requests, each an id
    row mapping the client's id to the engine's and a binding row (one target)."""
    from servewitness.ledger import bindings, chain

    def write(db: Any) -> None:
        for b, at in enumerate(range(0, n, BATCH)):
            ref = chain.bindings_ref("agent", b + 1)
            span_rows = [
                (ref, "t", "boot", 20, 111, f"cmpl-req{i}-0-ab12", i + 1, i + 5, 5, 9, 1.0,
                 2.0, "m", "m", "R", "{}", 1, None)
                for i in range(at, min(n, at + BATCH))
            ]  # fmt: skip
            id_rows = [
                (ref, "t", f"cmpl-req{i}-0-ab12", f"cmpl-req{i}-0", f"req{i}", 1.0)
                for i in range(at, min(n, at + BATCH))
            ]
            p = bindings.PreparedBatch(ref, "t", 1.0, span_rows, id_rows,
                (bindings.rows_sha256(span_rows), bindings.rows_sha256(id_rows),
                 bindings.counts_json(span_rows)))  # fmt: skip
            digests = bindings.write_batch(db, p)
            chain.append(db, 1.0, "bindings", ref,
                         chain.bindings_subject(ref, "t", 1.0, *digests))  # fmt: skip

    st._tx([], write)


def measure(bindings: int, count: int, rounds: int) -> None:
    from servewitness.server import store as store_mod

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "verifier.sqlite3"
        st = store_mod.Store(path)
        _fill(st, bindings)
        ids = [f"req{i}" for i in range(count // 2)] + [
            f"twin{i}" for i in range(count - count // 2)
        ]
        db: Any = st._db

        def floor() -> int:
            found = 0
            with st._lock, db.snapshot():
                for rid in ids:
                    row = db.execute(
                        "SELECT internal_id FROM request_ids WHERE client_id = ?", (rid,)
                    ).fetchone()
                    found += row is not None
            return found

        holds: list[float] = []
        lock = st._lock

        class Timed:  # the store's lock, each hold timed (the chunks' holds)
            def __enter__(self) -> None:
                lock.acquire()
                self.t0 = time.perf_counter()

            def __exit__(self, *exc: object) -> None:
                holds.append(time.perf_counter() - self.t0)
                lock.release()

        served = sum(1 for v in st.request_steps(ids).values() if v)
        if served != floor() or served != count // 2:
            raise SystemExit(f"arms disagree: {served} bound, {floor()} found")
        per: dict[str, list[float]] = {"indexed lookup": [], "request_steps": []}
        for i in range(rounds):
            order = list(per) if i % 2 == 0 else list(reversed(per))
            for arm in order:
                c0 = time.perf_counter()
                if arm == "indexed lookup":
                    floor()
                else:
                    st._lock = Timed()  # type: ignore[assignment]
                    try:
                        st.request_steps(ids)
                    finally:
                        st._lock = lock
                per[arm].append((time.perf_counter() - c0) / count * 1e6)
        st.close()
    print(f"{count} ids ({count // 2} served, {count - count // 2} unknown) over {bindings} "
          f"bindings; {rounds} interleaved rounds, us per id (wall)")  # fmt: skip
    print_rows({k: summary(v) for k, v in per.items()}, fmt="8.2f")
    ratios = [r / f for r, f in zip(per["request_steps"], per["indexed lookup"], strict=True)]
    s = summary(ratios)
    print(f"  request_steps / indexed lookup at {count} ids = {s['median']:.2f} (paired per "
          f"round; spread {s['spread']:.1%}); longest hold of the store's lock by one chunk of "
          f"{store_mod.REQUEST_STEPS_CHUNK} ids: {max(holds) * 1e3:.1f} ms")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--bindings", type=int, default=BINDINGS)
    parser.add_argument("--ids", type=int, nargs="+", default=list(IDS))
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    _smoke.add_args(parser)
    args = parser.parse_args()
    bindings, counts, rounds = args.bindings, args.ids, args.rounds
    if args.smoke:
        _smoke.begin("both arms over 2,000 bindings and 1,000 ids, one round")
        bindings, counts, rounds = 2000, [1000], _smoke.ROUNDS
    for count in counts:
        measure(bindings, count, rounds)


if __name__ == "__main__":
    main()
