"""The daemons' Prometheus registries, on ``prometheus_client`` (which vLLM ships too).

``new_registry`` gives a registry of its own (never the library's global one) carrying the
process metrics (``process_*``: CPU, memory, open files, start time), the interpreter's
(``python_info``, ``python_gc_*``) and ``verifier_build_info``. Counters export no ``_created``
series. ``ScrapeTime`` reads a value when scraped (a database count, a spool's size); one that
cannot be read is left out of that scrape, never failing it. ``Bounded`` keeps the series
labelled by a value a peer chooses (a target name, a run name) to a fixed number, so that a
flood of names costs bounded memory and scrape size.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from servewitness import __version__

log = structlog.get_logger("servewitness.metrics")

# Seconds: an ingest is a commit (milliseconds), a collect hashes files (up to seconds).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def new_registry() -> CollectorRegistry:
    """A registry with the process, platform and GC collectors and ``verifier_build_info``."""
    disable_created_metrics()  # type: ignore[no-untyped-call]  # this process's setting: a daemon of its own, never vLLM's
    r = CollectorRegistry()
    ProcessCollector(registry=r)
    PlatformCollector(registry=r)
    GCCollector(registry=r)
    info = Gauge(
        "verifier_build_info", "the verifier's version (always 1)", ["version"], registry=r
    )
    info.labels(version=__version__).set(1)
    return r


class ScrapeTime(Collector):
    """One unlabelled gauge or counter whose value READ gives at scrape time."""

    def __init__(
        self,
        registry: CollectorRegistry,
        name: str,
        help: str,
        read: Callable[[], float],
        *,
        counter: bool = False,
    ) -> None:
        self.name, self.help, self.read, self.counter = name, help, read, counter
        registry.register(self)

    def _family(self, value: float | None) -> Metric:
        if self.counter:
            return CounterMetricFamily(self.name, self.help, value=value)
        return GaugeMetricFamily(self.name, self.help, value=value)

    def describe(self) -> Iterable[Metric]:
        return [self._family(None)]

    def collect(self) -> Iterable[Metric]:
        try:
            value = float(self.read())
        except Exception as e:  # noqa: BLE001 - a scrape never fails for one value
            log.warning("metric_unreadable", metric=self.name, error=f"{type(e).__name__}: {e}")
            return []
        return [self._family(value)]


class Bounded:
    """Series keyed by the value of one label that peers choose (LABEL: ``target``, ``run``):
    at most LIMIT values have series at once, each with at most PER_KEY series in a family
    (a target's hooks). The key label comes first in every family given here. A series
    refused for being over a bound is counted in OVERFLOW (labelled LABEL), and ``forget``
    removes every series of a key (a target expired or forgotten), which frees its place."""

    def __init__(self, label: str, limit: int, per_key: int, overflow: Counter) -> None:
        self.label, self.limit, self.per_key = label, limit, per_key
        self._overflow = overflow.labels(label)  # 0 from the start
        self._lock = threading.Lock()
        # key -> (family, the rest of the labels) -> that series' child: a series already
        # admitted is found with one lookup (a report sets seven of them, a verdict one per
        # target), never admitted nor looked up in the family again
        self._series: dict[str, dict[tuple[MetricWrapperBase, tuple[str, ...]], Any]] = {}

    def keys(self) -> int:
        with self._lock:
            return len(self._series)

    def child(self, family: MetricWrapperBase, key: str, *rest: str) -> Any | None:
        """FAMILY's series for KEY (and the REST of its labels), or None (over a bound)."""
        with self._lock:
            mine = self._series.get(key)
            got = None if mine is None else mine.get((family, rest))
            if got is not None:
                return got
            if mine is None:
                if len(self._series) >= self.limit:
                    mine = None
                else:
                    mine = self._series[key] = {}
            if mine is not None and sum(f is family for f, _ in mine) < self.per_key:
                got = mine[(family, rest)] = family.labels(key, *rest)
        if got is None:
            self._overflow.inc()
        return got

    def set(self, family: Gauge, key: str, value: float, *rest: str) -> bool:
        """Set FAMILY's series for KEY and REST to VALUE; False: over a bound, not exported."""
        child = self.child(family, key, *rest)
        if child is not None:
            child.set(value)
        return child is not None

    def replace(self, family: Gauge, key: str, values: Mapping[tuple[str, ...], float]) -> None:
        """KEY's series of FAMILY are exactly VALUES (the rest of the labels: value): those
        not in VALUES are removed (a hook no longer reported)."""
        with self._lock:
            mine = self._series.get(key, {})
            gone = [r for f, r in mine if f is family and r not in values]
            for rest in gone:
                del mine[(family, rest)]
        for rest in gone:
            _remove(family, (key, *rest))
        for rest, value in sorted(values.items()):
            self.set(family, key, value, *rest)

    def forget(self, key: str) -> None:
        with self._lock:
            series = self._series.pop(key, {})
        for family, rest in series:
            _remove(family, (key, *rest))


def _remove(family: MetricWrapperBase, values: tuple[str, ...]) -> None:
    with contextlib.suppress(KeyError):  # never set
        family.remove(*values)
