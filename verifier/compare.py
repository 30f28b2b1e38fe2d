"""Boots, arms and the noise floor: a difference between configurations is priced against
how much replicate boots of the same configuration differ.

A *sample* is what one boot did during a stretch of load, from its probe's counters (the
process that runs the model): productive steps, tokens (prefill and decode), seconds, and
from those tokens per second and tokens per step. Samples of one boot (same boot id, pid and
start) are averaged into one value per boot: the noise floor is between boots, since one boot
per arm cannot price a difference (each boot has its own layout, caches and neighbours).

For each metric: each arm's median over its boots, its spread ((max - min) / median), the
floor (the larger arm spread), and the difference of the medians relative to arm A. With a
single boot in either arm the floor is unknown, and that is what is reported, not a bare
difference.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verifier.errors import ConfigError

METRICS = ("tokens_per_s", "tokens_per_step", "decode_tokens_per_s")


@dataclass(frozen=True)
class Sample:
    boot: str  # boot id / pid / start ticks of the process that ran the steps
    label: str
    values: dict[str, float]


@dataclass(frozen=True)
class MetricComparison:
    metric: str
    a: list[float]  # one value per boot
    b: list[float]
    median_a: float
    median_b: float
    spread_a: float | None  # None: one boot
    spread_b: float | None
    floor: float | None  # None: unknown (an arm has one boot)
    difference: float  # (median_b - median_a) / median_a
    verdict: str  # "real difference" | "within the noise floor" | "noise floor unknown"


def sample_values(steps: int, tokens: int, decode: int, seconds: float) -> dict[str, float]:
    return {
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "tokens_per_step": tokens / steps if steps else 0.0,
        "decode_tokens_per_s": decode / seconds if seconds > 0 else 0.0,
    }


def load_sample(path: Path) -> Sample:
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("sample") != 1:
            raise ValueError("not written by `verifier sample`")
        values = {m: float(data[m]) for m in METRICS}
        return Sample(str(data["boot"]), str(data.get("label") or path.name), values)
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: no such sample file") from e
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: not a sample file: {e}") from e


def per_boot(samples: list[Sample], metric: str) -> list[float]:
    """One value per boot: the mean of that boot's samples."""
    by_boot: dict[str, list[float]] = {}
    for s in samples:
        by_boot.setdefault(s.boot, []).append(s.values[metric])
    return [statistics.fmean(v) for v in by_boot.values()]


def _spread(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else None


def compare(a: list[Sample], b: list[Sample], metric: str) -> MetricComparison:
    va, vb = per_boot(a, metric), per_boot(b, metric)
    ma, mb = statistics.median(va), statistics.median(vb)
    sa, sb = _spread(va), _spread(vb)
    floor = None if sa is None or sb is None else max(sa, sb)
    diff = (mb - ma) / ma if ma else float("inf")
    if floor is None:
        verdict = "noise floor unknown"
    elif abs(diff) > floor:
        verdict = "real difference"
    else:
        verdict = "within the noise floor"
    return MetricComparison(metric, va, vb, ma, mb, sa, sb, floor, diff, verdict)


def render(c: MetricComparison) -> str:
    def pct(x: float | None) -> str:
        return "unknown" if x is None else f"{x:.1%}"

    head = (
        f"{c.metric}: A {c.median_a:.4g} ({len(c.a)} boot{'s' * (len(c.a) != 1)}, spread "
        f"{pct(c.spread_a)}), B {c.median_b:.4g} ({len(c.b)} boot{'s' * (len(c.b) != 1)}, "
        f"spread {pct(c.spread_b)})"
    )
    if c.floor is None:
        one = "A" if len(c.a) < 2 else "B"
        return (
            f"{head}\n  noise floor unknown: arm {one} has one boot, so a difference of "
            f"{c.difference:+.1%} cannot be priced (boot each arm at least twice)"
        )
    return f"{head}\n  B - A = {c.difference:+.1%}, noise floor {c.floor:.1%}: {c.verdict}"


def as_dict(c: MetricComparison) -> dict[str, Any]:
    return {
        "metric": c.metric,
        "a": c.a,
        "b": c.b,
        "median_a": c.median_a,
        "median_b": c.median_b,
        "spread_a": c.spread_a,
        "spread_b": c.spread_b,
        "noise_floor": c.floor,
        "difference": c.difference,
        "verdict": c.verdict,
    }
