"""Agents paced by the verifier while it is busy, instead of refused and retrying.

Why: a verifier over capacity answers agents' calls RESOURCE_EXHAUSTED (server/admission.py),
and each agent backs off and tries again. A refusal is not free: it costs the verifier about
0.5 ms of its interpreter lock, more than gRPC's whole cost of an acknowledged report; at 500
agents a saturated verifier spent 16 % of its capacity saying "busy" (BENCHMARKS.md, "Status
answers that copy fresh verdicts, and what refusing agents costs"). Paced, agents slow down
together and the verifier's time goes to the reports it acknowledges.

How (multiplicative both ways, in small steps: a rise by half a second overshot, and the
verifier idled at 55 % with its agents held back; BENCHMARKS.md): every acknowledgement carries
the current pace, ``ReportResponse.next_report_in_s``, the seconds the agent should wait before
its next report (0: its own interval). Once a second (``TICK_S``, on the calls themselves: no
thread), a second in which more than ``REFUSED_SHARE`` of agents' calls were refused raises the
pace by 15 % (from the verifier's report interval when off); any other second lowers it by 5 %,
and below the report interval it is off again. The pace never exceeds ``limit_s()``: half the
smallest ``evidence.freshness_s`` of the registered runs, at most ``PACE_MAX_S``. A slower pace
would make evidence STALE, which is the safe side (never a PASS on old evidence) but blocks
every gate; a verifier too slow for its fleet even at that pace refuses the rest, as before.
Agents bound what they obey by their longest backoff (``AgentConfig.max_backoff_s``, 30 s) and
spread it by 10 %, so that agents told at once do not all come back at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from servewitness.metrics.registry import ScrapeTime
from servewitness.policy import PolicyError

if TYPE_CHECKING:
    from servewitness.server.evaluate import Evaluator
    from servewitness.server.store import Store

TICK_S = 1.0
PACE_MAX_S = 10.0
RAISE = 1.15
LOWER = 0.95
# A second raises the pace only when more than this share of agents' calls were refused: a
# few refusals are what a verifier at its capacity gives (agents' reports arrive in bursts),
# and raising the pace on them (by half, then) kept it far above what the verifier needed
# (measured: 0.59x the reports acknowledged, the verifier at 55 % CPU).
REFUSED_SHARE = 0.05


class Pacer:
    """The pace agents are asked to keep. INTERVAL_S: the verifier's report interval (where a
    pace starts, and below which it is off); LIMIT_S() the most it may ask; CLOCK: seconds."""

    def __init__(
        self,
        interval_s: float,
        limit_s: Callable[[], float] = lambda: PACE_MAX_S,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self._limit_s = limit_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pace = 0.0
        self._refused = 0  # agents' calls refused since the last tick
        self._acked = 0  # and acknowledged
        self._tick_at = clock()
        if registry is not None:
            ScrapeTime(
                registry,
                "verifier_agent_pace_seconds",
                "seconds agents are asked to wait between reports while the verifier is busy "
                "(0: their own interval)",
                self.current_s,
            )

    def current_s(self) -> float:
        """The pace as last decided (the metric; no tick)."""
        return self._pace

    def refused(self) -> None:
        """An agent's call was refused (busy)."""
        with self._lock:
            self._refused += 1

    def pace_s(self) -> float:
        """The pace to send with an acknowledgement now (0: none)."""
        now = self._clock()
        self._acked += 1  # a count lost to a race costs nothing: it only weighs refusals
        if now - self._tick_at < TICK_S:
            return self._pace
        limit = min(self._limit_s(), PACE_MAX_S)  # outside the lock: it may read the runs
        with self._lock:
            if now - self._tick_at >= TICK_S:  # not ticked by another call meanwhile
                if self._refused > REFUSED_SHARE * (self._refused + self._acked):
                    pace = max(self._pace * RAISE, self.interval_s * RAISE)
                else:
                    pace = self._pace * LOWER
                    if pace < self.interval_s:
                        pace = 0.0
                self._pace = min(pace, limit)
                self._refused = self._acked = 0
                self._tick_at = now
            return self._pace


def freshness_limit_s(store: Store, evaluator: Evaluator) -> float:
    """The slowest pace agents may be asked to keep: half the smallest ``freshness_s`` of the
    registered runs (slower, their targets would go STALE), at most PACE_MAX_S."""
    limit = PACE_MAX_S
    for run in store.list_runs():
        pol = evaluator.policy(run)
        if not isinstance(pol, PolicyError):
            limit = min(limit, pol.evidence.freshness_s / 2)
    return limit
