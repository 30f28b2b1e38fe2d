"""A small Prometheus registry (counters, gauges, histograms, with labels) rendered in the
text exposition format 0.0.4.

Values are kept in memory and start at zero with each process, as Prometheus expects of
counters; a metric's ``zero()`` exports a known label value at zero from the start, so that
"none yet" reads as 0, not as a missing series. A metric given ``set_function`` reads its
values at scrape time. Every registry carries ``verifier_build_info`` and
``process_start_time_seconds``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import structlog

from verifier import __version__

log = structlog.get_logger("verifier.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds: an ingest is a commit (milliseconds), a collect hashes files (up to seconds).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

Labels = tuple[str, ...]


def _escape_label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return repr(float(v))


def _sample(name: str, names: Sequence[str], values: Sequence[str], v: float) -> str:
    if not names:
        return f"{name} {_number(v)}"
    inner = ",".join(f'{k}="{_escape_label(x)}"' for k, x in zip(names, values, strict=True))
    return f"{name}{{{inner}}} {_number(v)}"


class Metric:
    kind = "untyped"

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        self.name, self.help, self.labelnames = name, help, tuple(labels)
        self._lock = threading.Lock()
        self._values: dict[Labels, float] = {}
        self._fn: Callable[[], Iterable[tuple[Labels, float]]] | None = None

    def _key(self, labels: dict[str, str]) -> Labels:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name}: labels {sorted(labels)} != {self.labelnames}")
        return tuple(str(labels[k]) for k in self.labelnames)

    def set_function(self, fn: Callable[[], Iterable[tuple[Labels, float]]]) -> None:
        """Read the values at scrape time (a directory's size, a database count)."""
        self._fn = fn

    def samples(self) -> Iterator[str]:
        if self._fn is not None:
            try:
                values = list(self._fn())
            except Exception as e:  # noqa: BLE001 - a scrape never fails for one value
                log.warning("metric_unreadable", metric=self.name, error=f"{type(e).__name__}: {e}")
                return
        else:
            with self._lock:
                values = sorted(self._values.items())
        for key, v in values:
            yield _sample(self.name, self.labelnames, key, v)

    def render(self) -> str:
        head = f"# HELP {self.name} {self.help.replace(chr(92), chr(92) * 2)}\n"
        head += f"# TYPE {self.name} {self.kind}\n"
        return head + "".join(s + "\n" for s in self.samples())

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def zero(self, **labels: str) -> None:
        """Export this label set at 0 before anything happened."""
        key = self._key(labels)
        with self._lock:
            self._values.setdefault(key, 0.0)


class Counter(Metric):
    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter only goes up")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount


class Gauge(Metric):
    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = value


class Histogram(Metric):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        help: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> None:
        super().__init__(name, help, labels)
        self.buckets = tuple(sorted(buckets))
        self._obs: dict[Labels, tuple[list[int], list[float]]] = {}  # counts, [sum]

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            counts, total = self._obs.setdefault(key, ([0] * (len(self.buckets) + 1), [0.0]))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    counts[i] += 1
                    break
            else:
                counts[-1] += 1
            total[0] += value

    def samples(self) -> Iterator[str]:
        with self._lock:
            obs = sorted((k, (list(c), s[0])) for k, (c, s) in self._obs.items())
        names = (*self.labelnames, "le")
        for key, (counts, total) in obs:
            running = 0
            for bound, n in zip((*self.buckets, math.inf), counts, strict=True):
                running += n
                le = "+Inf" if math.isinf(bound) else repr(float(bound))
                yield _sample(f"{self.name}_bucket", names, (*key, le), running)
            yield _sample(f"{self.name}_sum", self.labelnames, key, total)
            yield _sample(f"{self.name}_count", self.labelnames, key, running)

    def count(self, **labels: str) -> int:
        with self._lock:
            got = self._obs.get(self._key(labels))
            return sum(got[0]) if got else 0


class Registry:
    def __init__(self) -> None:
        self._metrics: list[Metric] = []
        info = self.gauge("verifier_build_info", "the verifier's version (always 1)", ["version"])
        info.set(1, version=__version__)
        start = self.gauge("process_start_time_seconds", "when this process started (unix s)")
        start.set(time.time())

    def _add(self, m: Any) -> Any:
        self._metrics.append(m)
        return m

    def counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Counter:
        assert name.endswith("_total"), name  # noqa: S101 - a programming error, caught by tests
        c: Counter = self._add(Counter(name, help, labels))
        return c

    def gauge(self, name: str, help: str, labels: Sequence[str] = ()) -> Gauge:
        g: Gauge = self._add(Gauge(name, help, labels))
        return g

    def histogram(self, name: str, help: str, labels: Sequence[str] = ()) -> Histogram:
        h: Histogram = self._add(Histogram(name, help, labels))
        return h

    def render(self) -> str:
        return "".join(m.render() for m in self._metrics)
