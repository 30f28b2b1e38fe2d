"""The probe's cost of writing one request's bindings record, against ``json.dumps``.

Why: at batch 256 the probe's bindings drain was ~2.5 ms per phase of 256 requests on the GPU
host (BENCHMARKS.md, session 17's H100 rows), about half of it the records' text:
``json.dumps`` of a dict per request. ``_bindings._line`` writes the same text directly.

Arms, interleaved over ROUNDS rounds, each a flush's worth of text for BATCH finished
requests (ids like vLLM's, two declared hooks, the bytes a flush writes):
  json     ``json.dumps(_record(item))`` per request: what the probe wrote before, and what
           the text must equal (checked first)
  json2    the same again: the A/A arm, whose ratio to ``json`` is the noise floor
  line     ``_bindings._line(item)`` per request
Prints µs per record (median over rounds, min-max, spread) and the ratios, paired per round.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "probe"))
import _smoke
from _stats import print_rows, summary

BATCH = 256
ROUNDS = 31
REPS = 20


def items(n: int) -> list[Any]:
    """N finished requests' records as the fold leaves them (``_bindings._close``)."""
    rng = random.Random(1)  # noqa: S311 - test data, not secrets
    names = ("vllm.hook.a", "vllm.hook.b")
    out = []
    for i in range(n):
        snap0 = (names, (rng.randrange(1000), rng.randrange(1000)))
        t0 = 1_765_000_000_000_000_000 + i
        e = [100, 165, 66, 64, t0, t0 + 500_000_000, 5000, 5001, snap0, 0, 0]
        rid = f"cmpl-{rng.getrandbits(64):016x}-0"
        out.append(("req", rid, e, (names, (5000, 6000)), "finished", None))
    return out


def main() -> None:
    rounds, reps = ROUNDS, REPS
    if _smoke.parse(__doc__).smoke:
        _smoke.begin("every arm, 2 repetitions")
        rounds, reps = _smoke.ROUNDS, 2
    from servewitness_probe import _bindings

    batch = items(BATCH)

    def reference() -> bytes:
        dumps = json.dumps
        return "".join(
            dumps(_bindings._record(i), separators=(",", ":")) + "\n" for i in batch
        ).encode()

    def line() -> bytes:
        return "".join(_bindings._line(i) + "\n" for i in batch).encode()

    if line() != reference():
        raise SystemExit("the records' text differs from json.dumps'")
    arms: dict[str, Callable[[], bytes]] = {"json": reference, "json2": reference, "line": line}
    us: dict[str, list[float]] = {k: [] for k in arms}
    order = list(arms)
    for r in range(rounds):
        for name in order[r % 3 :] + order[: r % 3]:
            t = time.perf_counter_ns()
            for _ in range(reps):
                arms[name]()
            us[name].append((time.perf_counter_ns() - t) / reps / BATCH / 1000)
    print(f"bindings record text: {rounds} interleaved rounds x {reps} flushes of {BATCH} "
          "records, µs per record")  # fmt: skip
    print_rows({k: summary(v) for k, v in us.items()}, "8.3f")
    for name in ("line", "json2"):
        paired = statistics.median(a / b for a, b in zip(us[name], us["json"], strict=True))
        print(f"  {name} / json = {paired:.3f} (paired per round, median)")


if __name__ == "__main__":
    main()
