"""What ``verifier agent`` exports (docs/operations.md): collects and their duration, reports
sent, acknowledged and refused, failed exchanges with the verifier, bindings sent, and the
spool's size. Known label values (refusal reasons, binding kinds) are exported at zero from
the start.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
from prometheus_client import Counter, Gauge, Histogram

from servewitness.metrics.registry import LATENCY_BUCKETS, ScrapeTime, new_registry


class AgentMetrics:
    """What ``verifier agent`` exports. SPOOL_SIZE gives (reports, bytes, dropped) at scrape."""

    def __init__(self, spool_size: Callable[[], tuple[int, int, int]] | None = None) -> None:
        r = self.registry = new_registry()
        self.collects = Counter(
            "verifier_agent_collects_total", "collects of the target", registry=r
        )
        self.collect_duration = Histogram(
            "verifier_agent_collect_duration_seconds",
            "seconds one collect took",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.sent = Counter(
            "verifier_agent_reports_sent_total",
            "Report RPCs sent (retries and resends included)",
            registry=r,
        )
        self.acknowledged = Counter(
            "verifier_agent_reports_acknowledged_total",
            "reports the verifier acknowledged",
            registry=r,
        )
        self.refused = Counter(
            "verifier_agent_reports_refused_total",
            "reports the verifier answered without acknowledging, by reason (malformed: dropped; "
            "nonce: said Hello again; need_manifests: resent with them)",
            ["reason"],
            registry=r,
        )
        self.errors = Counter(
            "verifier_agent_verifier_errors_total",
            "failed exchanges with the verifier (unreachable, refused credentials, storage), "
            "by gRPC status code; the reports stay spooled",
            ["code"],
            registry=r,
        )
        self.bindings = Counter(
            "verifier_agent_bindings_sent_total",
            "request bindings in acknowledged reports (kind=span, kind=request_id)",
            ["kind"],
            registry=r,
        )
        self.last_ack = Gauge(
            "verifier_agent_last_report_timestamp_seconds",
            "when the verifier last acknowledged a report (unix s; 0: never)",
            registry=r,
        )
        for reason in ("malformed", "nonce", "need_manifests"):
            self.refused.labels(reason)
        for kind in ("span", "request_id"):
            self.bindings.labels(kind)
        if spool_size is not None:
            ScrapeTime(
                r,
                "verifier_agent_spool_reports",
                "reports spooled, not yet acknowledged",
                lambda: spool_size()[0],
            )
            ScrapeTime(
                r,
                "verifier_agent_spool_bytes",
                "bytes of the spooled reports",
                lambda: spool_size()[1],
            )
            ScrapeTime(
                r,
                "verifier_agent_spool_dropped_total",
                "spooled reports dropped, oldest first, to keep the spool under --spool-max-bytes",
                lambda: spool_size()[2],
                counter=True,
            )

    def collected(self, seconds: float) -> None:
        self.collects.inc()
        self.collect_duration.observe(seconds)

    def acked(self, spans: int, request_ids: int) -> None:
        self.acknowledged.inc()
        self.bindings.labels("span").inc(spans)
        self.bindings.labels("request_id").inc(request_ids)
        self.last_ack.set(time.time())

    def failed(self, code: grpc.StatusCode | None) -> None:
        self.errors.labels(code.name if code is not None else "UNKNOWN").inc()
