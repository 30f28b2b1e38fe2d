"""Boots, arms and the noise floor: a difference between configurations is priced against
how much replicate boots of the same configuration differ.

A *sample* is what one boot did during a stretch of load, from its probe's counters (the
process that runs the model): productive steps, tokens (prefill and decode), seconds, and
from those tokens per second and tokens per step. Samples of one boot (same boot id, pid and
start) are averaged into one value per boot: the noise floor is between boots, since one boot
per arm cannot price a difference (each boot has its own layout, caches and neighbours).

For each metric, on the log scale (the metrics are rates; a ratio is what a reader asks for):
the difference is the ratio of the arms' geometric means, minus one; the noise floor is the
smallest such difference that a two-sided Student's t test on the per-boot values calls real
at the chosen confidence (pooled variance, n_A + n_B - 2 degrees of freedom): t times the
standard error, as a ratio minus one. So with replicate boots of one configuration in both
arms, a "real difference" is reported in at most 1 - confidence of comparisons (for normal
boot-to-boot noise on the log scale), and with few boots the floor is wide, as it must be:
two boots per arm leave two degrees of freedom. A floor taken as the larger arm's spread
((max - min) / median, what this module used before) calls one same-configuration
comparison in five "real" with two boots per arm. With a single boot in either arm the
floor is unknown, and that is what is reported, not a bare difference. Each arm's median
and spread are reported too, for the reader.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servewitness.errors import ConfigError

METRICS = ("tokens_per_s", "tokens_per_step", "decode_tokens_per_s")
CONFIDENCES = (0.95, 0.99, 0.999)
DEFAULT_CONFIDENCE = 0.99
# Two-sided critical values of Student's t: degrees of freedom -> one per CONFIDENCES entry.
# Between rows the lower row is used (a wider floor); beyond 30, the normal distribution's.
_T = {
    1: (12.706, 63.657, 636.619),
    2: (4.303, 9.925, 31.599),
    3: (3.182, 5.841, 12.924),
    4: (2.776, 4.604, 8.610),
    5: (2.571, 4.032, 6.869),
    6: (2.447, 3.707, 5.959),
    7: (2.365, 3.499, 5.408),
    8: (2.306, 3.355, 5.041),
    9: (2.262, 3.250, 4.781),
    10: (2.228, 3.169, 4.587),
    12: (2.179, 3.055, 4.318),
    15: (2.131, 2.947, 4.073),
    20: (2.086, 2.845, 3.850),
    30: (2.042, 2.750, 3.646),
}
_Z = (1.960, 2.576, 3.291)


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
    difference: float  # geometric mean of B / geometric mean of A - 1
    verdict: str  # "real difference" | "within the noise floor" | "noise floor unknown"
    confidence: float = DEFAULT_CONFIDENCE


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


def t_critical(df: int, confidence: float) -> float:
    """Two-sided critical value of Student's t with DF degrees of freedom (DF >= 1)."""
    col = CONFIDENCES.index(confidence)
    if df > max(_T):
        return _Z[col]
    return _T[max(k for k in _T if k <= df)][col]


def floor_log(a: list[float], b: list[float], confidence: float) -> float | None:
    """t times the standard error of the difference of the arms' mean logs (None: an arm has
    one boot, no degrees of freedom)."""
    df = len(a) + len(b) - 2
    if len(a) < 2 or len(b) < 2:
        return None
    la, lb = [math.log(x) for x in a], [math.log(x) for x in b]
    pooled = ((len(a) - 1) * statistics.variance(la) + (len(b) - 1) * statistics.variance(lb)) / df
    se = math.sqrt(pooled * (1 / len(a) + 1 / len(b)))
    return t_critical(df, confidence) * se


def compare(
    a: list[Sample], b: list[Sample], metric: str, confidence: float = DEFAULT_CONFIDENCE
) -> MetricComparison:
    if confidence not in CONFIDENCES:
        raise ConfigError(f"confidence {confidence:g} is not one of {CONFIDENCES}")
    va, vb = per_boot(a, metric), per_boot(b, metric)
    for arm, values in (("A", va), ("B", vb)):
        if any(v <= 0 for v in values):
            raise ConfigError(f"arm {arm}: a boot has {metric} <= 0; nothing to compare")
    ma, mb = statistics.median(va), statistics.median(vb)
    diff_log = statistics.fmean(math.log(x) for x in vb) - statistics.fmean(math.log(x) for x in va)
    width = floor_log(va, vb, confidence)
    floor = None if width is None else math.expm1(width)
    if width is None:
        verdict = "noise floor unknown"
    elif abs(diff_log) > width:
        verdict = "real difference"
    else:
        verdict = "within the noise floor"
    return MetricComparison(
        metric, va, vb, ma, mb, _spread(va), _spread(vb), floor, math.expm1(diff_log),
        verdict, confidence,
    )  # fmt: skip


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
    return (
        f"{head}\n  B / A = {c.difference:+.1%}, noise floor \u00b1{c.floor:.1%} "
        f"({c.confidence:.1%} confidence, {len(c.a) + len(c.b) - 2} degrees of freedom): "
        f"{c.verdict}"
    )


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
        "confidence": c.confidence,
        "difference": c.difference,
        "verdict": c.verdict,
    }
