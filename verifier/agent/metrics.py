"""What ``verifier agent`` exports (docs/operations.md): collects and their duration, reports
sent, acknowledged and refused, failed exchanges with the verifier, bindings sent, and the
spool's size. Known label values (refusal reasons, binding kinds) are exported at zero from
the start.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from verifier.metrics.registry import Registry


class AgentMetrics:
    """What ``verifier agent`` exports. SPOOL_SIZE gives (reports, bytes, dropped) at scrape."""

    def __init__(self, spool_size: Callable[[], tuple[int, int, int]] | None = None) -> None:
        r = self.registry = Registry()
        self.collects = r.counter("verifier_agent_collects_total", "collects of the target")
        self.collect_duration = r.histogram(
            "verifier_agent_collect_duration_seconds", "seconds one collect took"
        )
        self.sent = r.counter(
            "verifier_agent_reports_sent_total", "Report RPCs sent (retries and resends included)"
        )
        self.acknowledged = r.counter(
            "verifier_agent_reports_acknowledged_total", "reports the verifier acknowledged"
        )
        self.refused = r.counter(
            "verifier_agent_reports_refused_total",
            "reports the verifier answered without acknowledging, by reason (malformed: dropped; "
            "nonce: said Hello again; need_manifests: resent with them)",
            ["reason"],
        )
        self.errors = r.counter(
            "verifier_agent_verifier_errors_total",
            "failed exchanges with the verifier (unreachable, refused credentials, storage), "
            "by gRPC status code; the reports stay spooled",
            ["code"],
        )
        self.bindings = r.counter(
            "verifier_agent_bindings_sent_total",
            "request bindings in acknowledged reports (kind=span, kind=request_id)",
            ["kind"],
        )
        self.last_ack = r.gauge(
            "verifier_agent_last_report_timestamp_seconds",
            "when the verifier last acknowledged a report (unix s; 0: never)",
        )
        self.spool_reports = r.gauge(
            "verifier_agent_spool_reports", "reports spooled, not yet acknowledged"
        )
        self.spool_bytes = r.gauge("verifier_agent_spool_bytes", "bytes of the spooled reports")
        self.dropped = r.counter(
            "verifier_agent_spool_dropped_total",
            "spooled reports dropped, oldest first, to keep the spool under --spool-max-bytes",
        )
        self.last_ack.set(0.0)
        for reason in ("malformed", "nonce", "need_manifests"):
            self.refused.zero(reason=reason)
        for kind in ("span", "request_id"):
            self.bindings.zero(kind=kind)
        if spool_size is not None:
            self.spool_reports.set_function(lambda: [((), float(spool_size()[0]))])
            self.spool_bytes.set_function(lambda: [((), float(spool_size()[1]))])
            self.dropped.set_function(lambda: [((), float(spool_size()[2]))])

    def collected(self, seconds: float) -> None:
        self.collects.inc()
        self.collect_duration.observe(seconds)

    def acked(self, spans: int, request_ids: int) -> None:
        self.acknowledged.inc()
        self.bindings.inc(spans, kind="span")
        self.bindings.inc(request_ids, kind="request_id")
        self.last_ack.set(time.time())

    def failed(self, code: grpc.StatusCode | None) -> None:
        self.errors.inc(code=code.name if code is not None else "UNKNOWN")
