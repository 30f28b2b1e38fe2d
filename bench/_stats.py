"""Helpers shared by the benchmarks: interleaved micro-benchmark rounds and their summary."""

from __future__ import annotations

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


def print_rows(stats: dict[str, dict[str, float]], fmt: str = "7.1f") -> None:
    width = max(len(k) for k in stats)
    for k, v in stats.items():
        print(
            f"  {k:<{width}}  median {v['median']:{fmt}}  min {v['min']:{fmt}}  "
            f"max {v['max']:{fmt}}  spread {v['spread']:.1%}"
        )
