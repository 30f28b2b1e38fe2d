"""What the probe's check of the import system costs each import (``_integrity.intact``).

The probe compares a fingerprint of the import system as each import begins (the
``_load_unlocked`` wrapper) and as a file's bytes leave the reader (``get_data``): a few
hundred dictionary entries and function code objects against the ones it took at start
(``servewitness_probe/_integrity.py``). Arms, interleaved
over ROUNDS rounds, each importing N fresh small modules (removed from ``sys.modules`` before
every round) through the probe's wrapped loaders:
  pyc, no check        imports from bytecode, ``intact`` replaced by a function that says yes
  pyc, check           the same with the check (what ships)
  source, no check     imports from source (no pyc), without the check
  source, check        the same, with it
  check alone          ``intact()`` called N times (the check's own cost)
ns per import; each pair's difference is the check's cost per import, against the spread of
the arms (the noise floor). A vLLM process imports about 5,000 modules at start.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
from _imports import import_all, modules
from _stats import interleaved, print_rows

N = 200  # modules per round
ROUNDS = 31


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.environ["VERIFIER_PROBE_DIR"] = str(tmp / "probe")
        sys.dont_write_bytecode = True  # the source arm must stay source
        from servewitness_probe import _core, _imports, _integrity, _loaders

        _core.state("bench")
        _imports.install()  # the wrapped loaders; no sweeper thread
        _loaders.install()
        _integrity.take()
        real = _integrity.intact
        pyc = modules(tmp, "pycmod", True, N)
        src = modules(tmp, "srcmod", False, N)

        def without(run: Callable[[], float]) -> Callable[[], float]:
            def arm() -> float:
                _integrity.intact = lambda: True
                try:
                    return run()
                finally:
                    _integrity.intact = real

            return arm

        def alone() -> float:
            t0 = time.perf_counter_ns()
            for _ in range(N):
                real()
            return (time.perf_counter_ns() - t0) / N

        assert real(), "the import system changed under the bench: its numbers would be wrong"
        arms: dict[str, Callable[[], float]] = {
            "pyc, no check": without(import_all(pyc)),
            "pyc, check": import_all(pyc),
            "source, no check": without(import_all(src)),
            "source, check": import_all(src),
            "check alone": alone,
        }
        s = interleaved(arms, ROUNDS)
        watched = f"{len(_integrity._refs)} names, {len(_integrity._funcs)} functions watched"
        print(f"{ROUNDS} interleaved rounds x {N} imports, ns per import ({watched})")
        print_rows(s)
        for kind in ("pyc", "source"):
            a, b = s[f"{kind}, no check"]["median"], s[f"{kind}, check"]["median"]
            print(f"  {kind}: the check adds {b - a:+.0f} ns per import ({(b - a) / a:+.1%})")
        print(
            f"  a vLLM process's ~5,000 imports: {5000 * s['check alone']['median'] / 1e6:.0f} ms"
        )


def cli() -> None:
    global N, ROUNDS  # the arms read them
    if _smoke.parse(__doc__).smoke:
        _smoke.begin("every arm, 10 modules per import round", [])
        N, ROUNDS = 10, _smoke.ROUNDS
    main()


if __name__ == "__main__":
    cli()
