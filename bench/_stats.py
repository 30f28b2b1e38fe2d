"""Helpers shared by the benchmarks: interleaved micro-benchmark rounds and their summary."""

from __future__ import annotations

import math
import re
import statistics
import timeit
from collections.abc import Callable, Mapping


def summary(values: list[float]) -> dict[str, float]:
    """Median, min, max and relative spread ((max - min) / median) of VALUES."""
    med = statistics.median(values)
    return {
        "median": med,
        "min": min(values),
        "max": max(values),
        "spread": (max(values) - min(values)) / med if med else float("nan"),
    }


def interleaved_ns(
    arms: Mapping[str, Callable[[], object]], rounds: int, number: int
) -> dict[str, dict[str, float]]:
    """ns per call of every arm, the arms taking turns in each of ROUNDS rounds."""
    results: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(rounds):
        for name, fn in arms.items():
            results[name].append(timeit.timeit(fn, number=number) / number * 1e9)
    return {k: summary(v) for k, v in results.items()}


def interleaved(
    arms: Mapping[str, Callable[[], float]], rounds: int
) -> dict[str, dict[str, float]]:
    """Each arm run once to warm (the page cache, directory caches), then every arm in turn
    in each of ROUNDS rounds: the summary of what each returned (its own measure)."""
    for fn in arms.values():
        fn()
    results: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(rounds):
        for name, fn in arms.items():
            results[name].append(fn())
    return {k: summary(v) for k, v in results.items()}


def print_rows(stats: dict[str, dict[str, float]], fmt: str = "7.1f") -> None:
    """One line per arm: median, min, max and the noise floor (spread); ``parse_rows`` reads
    them back."""
    width = max(len(k) for k in stats)
    for k, v in stats.items():
        print(
            f"  {k:<{width}}  median {v['median']:{fmt}}  min {v['min']:{fmt}}  "
            f"max {v['max']:{fmt}}  spread {v['spread']:.1%}"
        )


_NUM = r"(-?\d+(?:\.\d+)?)"
ROW = re.compile(
    rf"^  (?P<arm>\S.*?)\s+median\s+{_NUM}\s+min\s+{_NUM}\s+max\s+{_NUM}\s+spread\s+{_NUM}%$"
)


def parse_rows(text: str) -> dict[str, dict[str, float]]:
    """The rows ``print_rows`` printed in TEXT, by arm (the machine-readable form of every
    benchmark's figures). A line that starts like a row (``median`` ... ``spread``) and does
    not parse, or that holds a NaN, raises ValueError: a row nobody can read is no figure."""
    rows: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if not (" median " in line and " spread " in line):
            continue
        m = ROW.match(line)
        if m is None:
            raise ValueError(f"a benchmark row that does not parse: {line!r}")
        values = [float(v) for v in m.groups()[1:]]
        if any(math.isnan(v) for v in values):
            raise ValueError(f"a benchmark row with NaN: {line!r}")
        median, low, high, spread = values
        rows[m["arm"]] = {"median": median, "min": low, "max": high, "spread": spread / 100}
    return rows
