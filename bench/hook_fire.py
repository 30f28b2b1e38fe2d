"""Cost of one hook fire, against a plain Python call measured in the same run.

Arms, interleaved over ROUNDS rounds of N calls each:
  baseline  a call to an empty function taking one argument (what any hook costs at least)
  fire      hook.fire("name") on the shared-memory counters
  decorated a call to a @hook-decorated empty function, minus nothing (compare to baseline)
  plain     the same empty function undecorated (baseline for decorated)
Prints ns per call (median over rounds, min-max as the noise floor) and ratios.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
from _stats import interleaved_ns, print_rows

N = 200_000
ROUNDS = 15


def main() -> None:
    n, rounds = N, ROUNDS
    if _smoke.parse(__doc__).smoke:
        _smoke.begin("every arm, 1,000 calls")
        n, rounds = 1000, _smoke.ROUNDS
    with tempfile.TemporaryDirectory() as d:
        os.environ["VERIFIER_PROBE_DIR"] = d
        import servewitness_probe as p

        p.start("bench")
        hook = p.hook

        def empty(name: str) -> None:
            return None

        def plain() -> None:
            return None

        @hook("decorated")
        def decorated() -> None:
            return None

        hook.fire("bench")  # declare once
        arms = {
            "baseline": lambda: empty("bench"),
            "fire": lambda: hook.fire("bench"),
            "plain": plain,
            "decorated": decorated,
        }
        s = interleaved_ns(arms, rounds, n)
        print(f"hook fire cost: {rounds} interleaved rounds x {n} calls, ns per call")
        print_rows(s)
        fire_extra = s["fire"]["median"] - s["baseline"]["median"]
        dec_extra = s["decorated"]["median"] - s["plain"]["median"]
        print(
            f"  fire / baseline call      = {s['fire']['median'] / s['baseline']['median']:.2f}x"
            f"  (+{fire_extra:.0f} ns)"
        )
        print(
            f"  decorated / plain call    = {s['decorated']['median'] / s['plain']['median']:.2f}x"
            f"  (+{dec_extra:.0f} ns)"
        )


if __name__ == "__main__":
    main()
