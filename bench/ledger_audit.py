"""What one audit answer or window seal costs the verifier as its ledger grows: the tree kept
in tiles (``servewitness/ledger/tiles.py``) against the whole ledger read per call.

Before the kept tree, every audit answer checked every stored checkpoint over a Merkle tree of
the whole ledger and built that tree twice more (for the bundle and for its note), and every
window seal built it once, each under the store's lock, which every report's write needs.
Arms, interleaved over ROUNDS rounds of N calls, at each ledger SIZE (entries chained as the
verifier chains them, a signed checkpoint every 1,000 entries as ``verifier serve`` signs
them by default):
  whole ledger  the calls' tree work before: ``checkpoints.check`` with the key, then
                ``tree_from_db`` twice (the answer's bundle, its note), a root and an
                inclusion proof
  kept tree     ``Store.audit_read`` (the tree brought up to date, the checkpoints stored
                since checked), then the same root and proof; between rounds 100 entries and
                a checkpoint are appended, as a running verifier would see
Also timed once: the kept tree's first call (built from the whole ledger and every stored
checkpoint checked: what a verifier pays once after it starts). Both arms' roots and proofs
are checked equal first. Prints ms per call, the ratio, the noise floor (spread).
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

SIZES = (100_000, 400_000)
ROUNDS = 5
N = 2
CHECKPOINT_EVERY = 1000


def _fill(store: Any, key: Any, first: int, count: int) -> None:
    """COUNT chained entries after entry FIRST - 1, a checkpoint every CHECKPOINT_EVERY."""
    from servewitness.ledger import chain, checkpoints, merkle

    db = store._db
    db.begin()
    row = db.execute("SELECT hash FROM ledger ORDER BY seq DESC LIMIT 1").fetchone()
    prev = str(row[0]) if row else chain.GENESIS
    frontier = merkle.Frontier()
    frontier.extend(
        bytes.fromhex(str(h)) for (h,) in db.execute("SELECT hash FROM ledger ORDER BY seq")
    )
    for seq in range(first, first + count):
        subject = hashlib.sha256(str(seq).encode()).hexdigest()
        entry = (seq, 1_700_000_000.0 + seq, "report", f"a/{seq}", subject, prev)
        prev = chain.entry_hash(entry)
        db.execute(
            "INSERT INTO ledger (seq, at_unix, kind, ref, subject, prev, hash) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (*entry, prev),
        )
        if seq % CHECKPOINT_EVERY == 0:
            checkpoints.sign(db, key, at=1_700_000_000.0 + seq, frontier=frontier)
    checkpoints.sign(db, key, at=time.time(), frontier=frontier)
    db.commit()


def measure(size: int, rounds: int, n: int) -> None:
    from servewitness.ledger import checkpoints, keys
    from servewitness.ledger.bundle import tree_from_db
    from servewitness.server.store import Store

    key = keys.generate()
    with tempfile.TemporaryDirectory() as d:
        store = Store(Path(d) / "verifier.sqlite3")
        t0 = time.perf_counter()
        _fill(store, key, 1, size)
        built_s = time.perf_counter() - t0
        probe = size // 3

        def whole(db: Any) -> tuple[bytes, list[bytes]]:
            _, problem = checkpoints.check(db, key.public_key())
            assert problem is None, problem
            tree_from_db(db)  # the answer's bundle
            tree = tree_from_db(db)  # its note
            return tree.root(), tree.inclusion_proof(probe)

        def kept() -> tuple[bytes, list[bytes]]:
            return store.audit_read(key, lambda db, t: (t.root(), t.inclusion_proof(probe)))

        c0 = time.process_time()
        first = kept()
        first_s = time.process_time() - c0
        same = first == store.read(whole)
        print(f"ledger of {size} entries ({built_s:.0f} s to write); both arms' root and proof "
              f"equal: {same}; the kept tree's first call {first_s * 1e3:.0f} ms CPU")  # fmt: skip
        if not same:
            raise SystemExit(1)
        per: dict[str, list[float]] = {"whole ledger": [], "kept tree": []}
        grown = size
        for i in range(rounds):
            order = ("whole ledger", "kept tree") if i % 2 == 0 else ("kept tree", "whole ledger")
            for arm in order:
                c0 = time.process_time()
                for _ in range(n):
                    store.read(whole) if arm == "whole ledger" else kept()
                per[arm].append((time.process_time() - c0) / n * 1e3)
            _fill(store, key, grown + 1, 100)
            grown += 100
        store.close()
    print(f"ledger of {size} entries: {rounds} interleaved rounds x {n} calls, CPU ms per call")
    print_rows({k: summary(v) for k, v in per.items()}, fmt="9.2f")
    ratios = [k / w for k, w in zip(per["kept tree"], per["whole ledger"], strict=True)]
    print(f"  kept tree / whole ledger at {size} entries = {summary(ratios)['median']:.4f} "
          f"(paired per round; spread {summary(ratios)['spread']:.1%})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    _smoke.add_args(parser)
    args = parser.parse_args()
    sizes, rounds, n = args.sizes, args.rounds, N
    if args.smoke:
        _smoke.begin("both arms over a ledger of 3,000 entries, one round of one call")
        sizes, rounds, n = [3000], _smoke.ROUNDS, 1
    for size in sizes:
        measure(size, rounds, n)


if __name__ == "__main__":
    main()
