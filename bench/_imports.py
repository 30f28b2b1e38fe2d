"""Fresh small modules to import, and the timing of importing them (the probe benchmarks'
common arms: ``identity_cost.py``, ``import_check.py``)."""

from __future__ import annotations

import importlib
import py_compile
import sys
import time
from collections.abc import Callable
from pathlib import Path

BODY = "".join(f"def f{i}(x):\n    return x * {i} + len(str(x))\n\n" for i in range(40))


def modules(root: Path, name: str, compiled: bool, n: int) -> list[str]:
    """N modules of BODY in ROOT/NAME (with their pycs when COMPILED), put on sys.path: their
    names."""
    d = root / name
    d.mkdir()
    names = []
    for i in range(n):
        mod = f"{name}_{i}"
        (d / f"{mod}.py").write_text(BODY)
        if compiled:
            py_compile.compile(str(d / f"{mod}.py"), doraise=True)
        names.append(mod)
    sys.path.insert(0, str(d))
    return names


def import_all(names: list[str]) -> Callable[[], float]:
    """An arm: NAMES removed from sys.modules and imported again, ns per import."""

    def run() -> float:
        for n in names:
            sys.modules.pop(n, None)
        importlib.invalidate_caches()
        t0 = time.perf_counter_ns()
        for n in names:
            importlib.import_module(n)
        return (time.perf_counter_ns() - t0) / len(names)

    return run
