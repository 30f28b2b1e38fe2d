"""What ``verifier serve`` exports (docs/operations.md): reports by result and refusal reason,
bindings ingested, ingest time and lag, verdicts, the evidence of each target (processes,
steps, hook fires: bounded, ``Bounded``), the ledger's size, every VerifierService
and AuditService RPC by method and status, and every refused call by method and reason
(``RpcObserver``, a gRPC server interceptor). Known label values (results, reasons,
verdicts, methods) are exported at zero from the start.

A refusal's reason comes from its status code (``refusal_reason``) unless the code that
refused noted a more precise one for the call (``note_refusal``: "undecodable" bytes, a
"too_large" value over a ``wire.limits`` limit, "busy" for a call over its class's bound in
``admission.Admission``). Calls that gRPC refuses itself never reach the interceptor's wrapper
and are not counted here: over its own ``maximum_concurrent_rpcs`` (``admission.grpc_limit``:
above the classes' bounds, for the other methods) and messages over the 64 MiB limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import grpc
import structlog
from prometheus_client import Counter, Gauge, Histogram, generate_latest

from servewitness.metrics.registry import LATENCY_BUCKETS, Bounded, ScrapeTime, new_registry
from servewitness.model import RunVerdict, TargetReport

log = structlog.get_logger("servewitness.metrics")

REPORT_RESULTS = ("accepted", "duplicate", "need_manifests", "refused")
REFUSAL_REASONS = (
    "malformed",  # INVALID_ARGUMENT: a field that describes no valid value, a manifest that lies
    "undecodable",  # bytes that are not the method's request message
    "too_large",  # a value over a wire.limits limit
    "nonce",  # FAILED_PRECONDITION of a report: say Hello again
    "not_authorized",  # UNAUTHENTICATED, PERMISSION_DENIED
    "busy",  # RESOURCE_EXHAUSTED answered by the servicer (back-pressure)
    "storage",  # UNAVAILABLE: the database refused it, not acknowledged
    "precondition",  # FAILED_PRECONDITION of any other call
    "not_found",
    "exists",  # ALREADY_EXISTS
    "other",
)
VERDICTS = ("PASS", "FAIL", "PENDING", "STALE")
METHODS = ("Hello", "Report", "RegisterRun", "GetRunStatus", "ListRuns")
ZEROED_REFUSALS = ("Hello", "Report", "RegisterRun")  # refusals by reason exported at zero
SERVICE_PREFIX = "/verifier.api.v1.VerifierService/"
PREFIXES = (SERVICE_PREFIX, "/verifier.api.v1.AuditService/")


def method_name(full: str) -> str | None:
    """``Report`` for ``/verifier.api.v1.VerifierService/Report``; None for another service."""
    prefix = next((p for p in PREFIXES if full.startswith(p)), None)
    return None if prefix is None else full[len(prefix) :]


_NOTED: ContextVar[str | None] = ContextVar("verifier_refusal_reason", default=None)


def note_refusal(reason: str) -> None:
    """Say why the call being served is about to be refused, where its status code alone
    does not (REASON one of REFUSAL_REASONS); ``RpcObserver`` counts it once."""
    if reason not in REFUSAL_REASONS:
        raise ValueError(f"unknown refusal reason {reason!r}")
    _NOTED.set(reason)


def refusal_reason(code: grpc.StatusCode | None, method: str = "Report") -> str:
    """Why the verifier refused a call of METHOD, from the status it aborted with."""
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return "nonce" if method == "Report" else "precondition"
    return {
        grpc.StatusCode.INVALID_ARGUMENT: "malformed",
        grpc.StatusCode.UNAUTHENTICATED: "not_authorized",
        grpc.StatusCode.PERMISSION_DENIED: "not_authorized",
        grpc.StatusCode.RESOURCE_EXHAUSTED: "busy",
        grpc.StatusCode.UNAVAILABLE: "storage",  # the database refused it: not acknowledged
        grpc.StatusCode.NOT_FOUND: "not_found",
        grpc.StatusCode.ALREADY_EXISTS: "exists",
    }.get(code or grpc.StatusCode.UNKNOWN, "other")


# Series labelled by a name a peer chooses (an agent in insecure mode claims any target; an
# operator registers runs): at most this many names have series at once, each with at most
# HOOK_SERIES hooks; more are counted in verifier_metrics_series_refused_total, not exported.
# A target's series go when it expires or is forgotten. Read when VerifierMetrics is made.
MAX_TARGET_SERIES = 1024
MAX_RUN_SERIES = 1024
# verdict gauges remembered as set (a memo: past this many it is cleared and values re-set)
SHOWN_MAX = 4 * MAX_TARGET_SERIES
# observed handlers kept (RpcObserver): a few per method; a bound all the same
OBSERVED_MAX = 256
HOOK_SERIES = 64
STEP_KINDS = ("total", "productive")


class VerifierMetrics:
    """What ``verifier serve`` exports. LEDGER_SIZE is read at scrape time."""

    def __init__(
        self,
        ledger_size: Callable[[], int] | None = None,
        store_writes: Callable[[], tuple[int, float, float]] | None = None,
    ) -> None:
        """LEDGER_SIZE: the ledger's entries; STORE_WRITES: (write transactions, seconds
        they waited for the write lock, seconds they held it), each read when scraped."""
        r = self.registry = new_registry()
        self.received = Counter(
            "verifier_reports_received_total",
            "Report RPCs received (every attempt)",
            registry=r,
        )
        self.reports = Counter(
            "verifier_reports_total",
            "reports by result: accepted (stored), duplicate (seq already stored), "
            "need_manifests (sent back for manifests), refused",
            ["result"],
            registry=r,
        )
        self.refused = Counter(
            "verifier_reports_refused_total", "reports refused, by reason", ["reason"], registry=r
        )
        self.bindings = Counter(
            "verifier_bindings_ingested_total",
            "request bindings stored: kind=span (a request's steps), kind=request_id (an id map)",
            ["kind"],
            registry=r,
        )
        self.ingest = Histogram(
            "verifier_ingest_duration_seconds",
            "seconds from a report's receipt to the commit of its transaction",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.lag = Gauge(
            "verifier_ingest_lag_seconds",
            "receipt minus the agent's collected_unix of the target's latest stored report "
            "(spool wait included; the agent's clock: skew included)",
            ["target"],
            registry=r,
        )
        self.last_report = Gauge(
            "verifier_last_report_timestamp_seconds",
            "when the target's latest report was stored (unix s)",
            ["target"],
            registry=r,
        )
        self.processes = Gauge(
            "verifier_target_processes",
            "processes in the target's latest stored report",
            ["target"],
            registry=r,
        )
        self.steps = Gauge(
            "verifier_target_steps",
            "engine steps in the target's latest stored report (kind=total: every step; "
            "kind=productive: steps that scheduled tokens), the most any one process ran",
            ["target", "kind"],
            registry=r,
        )
        self.hook_fires = Gauge(
            "verifier_target_hook_fires",
            "fires of each hook in the target's latest stored report, the most any one "
            "process counted",
            ["target", "hook"],
            registry=r,
        )
        self.followed = Counter(
            "verifier_followed_total",
            "what other verifiers on the same database stored that this one took as its own "
            "(server/follow.py): kind=report (a target's newest report), kind=event (an expiry "
            "or forget), kind=failed (a poll that failed; the next one tries again)",
            ["kind"],
            registry=r,
        )
        for kind in ("report", "event", "failed"):
            self.followed.labels(kind)
        self.verdicts = Counter(
            "verifier_verdicts_total",
            "verdicts computed (status RPCs and the history keeper), by value",
            ["verdict"],
            registry=r,
        )
        self.run_verdict = Gauge(
            "verifier_run_verdict",
            "1 for each run's latest computed verdict, 0 for the others",
            ["run", "verdict"],
            registry=r,
        )
        self.target_verdict = Gauge(
            "verifier_target_verdict",
            "1 for each target's latest computed verdict under each run, 0 for the others (a "
            "target's series go with it; at most HOOK_SERIES series of a target)",
            ["target", "run", "verdict"],
            registry=r,
        )
        if ledger_size is not None:
            ScrapeTime(r, "verifier_ledger_entries", "entries in the audit ledger", ledger_size)
        if store_writes is not None:
            writes = store_writes
            ScrapeTime(
                r,
                "verifier_store_transactions",
                "write transactions begun (reports of one group commit share one)",
                lambda: writes()[0],
                counter=True,
            )
            ScrapeTime(
                r,
                "verifier_store_write_wait_seconds",
                "seconds write transactions waited for the database's write lock (another "
                "verifier's transaction on the same database, or this one's)",
                lambda: writes()[1],
                counter=True,
            )
            ScrapeTime(
                r,
                "verifier_store_write_held_seconds",
                "seconds write transactions held the database's write lock (statements and "
                "commit); near 1 a second, the lock is what limits ingest",
                lambda: writes()[2],
                counter=True,
            )
        self.rpcs = Counter(
            "verifier_rpcs_total",
            "RPCs answered, by method and gRPC status code",
            ["method", "code"],
            registry=r,
        )
        self.refusals = Counter(
            "verifier_refusals_total",
            "calls refused (any status but OK), by method and reason; a report's refusal is "
            "also in verifier_reports_refused_total",
            ["method", "reason"],
            registry=r,
        )
        self.rpc_duration = Histogram(
            "verifier_rpc_duration_seconds",
            "seconds to answer an RPC, by method",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        overflow = Counter(
            "verifier_metrics_series_refused_total",
            "values not exported because their series would exceed a bound, one per value "
            "dropped (label=target: a target beyond the bound on targets, or a hook beyond "
            "the bound of its target; label=run: a run beyond the bound on runs)",
            ["label"],
            registry=r,
        )
        self.targets = Bounded("target", MAX_TARGET_SERIES, HOOK_SERIES, overflow)
        self.runs = Bounded("run", MAX_RUN_SERIES, len(VERDICTS), overflow)
        for result in REPORT_RESULTS:
            self.reports.labels(result)
        for reason in REFUSAL_REASONS:
            self.refused.labels(reason)
            for method in ZEROED_REFUSALS:
                self.refusals.labels(method, reason)
        self._verdicts = {v: self.verdicts.labels(v) for v in VERDICTS}
        # what verdict() last set for (run, target) and (run, None): the run's own gauge
        self._shown: dict[tuple[str, str | None], str] = {}
        self._shown_lock = threading.Lock()
        self._accepted = self.reports.labels("accepted")
        self._spans, self._request_ids = (
            self.bindings.labels("span"),
            self.bindings.labels("request_id"),
        )

    def value(self, name: str, **labels: str) -> float:
        """The sample NAME with LABELS as a scrape would give it (0 when absent)."""
        got = self.registry.get_sample_value(name, labels)
        return 0.0 if got is None else got

    def refused_calls(self, method: str, reason: str) -> float:
        return self.value("verifier_refusals_total", method=method, reason=reason)

    def refused_reports(self, reason: str) -> float:
        return self.value("verifier_reports_refused_total", reason=reason)

    def render(self) -> str:
        """What a scrape in the text format gets."""
        return generate_latest(self.registry).decode()

    def report(self, result: str) -> None:
        self.reports.labels(result).inc()

    def stored(
        self,
        report: TargetReport,
        received_unix: float,
        ingest_s: float,
        bindings: tuple[int, int] | None = None,
    ) -> None:
        """REPORT was stored. BINDINGS: its spans and request ids, counted (None: REPORT's
        own, for a report converted with them)."""
        self._accepted.inc()
        self.ingest.observe(ingest_s)
        t, targets = report.target, self.targets
        if report.collected_unix is not None:
            targets.set(self.lag, t, received_unix - report.collected_unix)
        targets.set(self.last_report, t, received_unix)
        targets.set(self.processes, t, len(report.processes))
        steps = [p.steps for p in report.processes if p.steps is not None]
        targets.set(self.steps, t, max((s.total for s in steps), default=0), "total")
        targets.set(self.steps, t, max((s.productive for s in steps), default=0), "productive")
        fires: dict[tuple[str, ...], float] = {}
        for p in report.processes:
            for h in p.hooks:
                fires[(h.name,)] = max(fires.get((h.name,), 0), h.fired)
        targets.replace(self.hook_fires, t, fires)
        spans, ids = (len(report.spans), len(report.request_ids)) if bindings is None else bindings
        self._spans.inc(spans)
        self._request_ids.inc(ids)

    def forget_target(self, target: str) -> None:
        """TARGET expired or was forgotten: its series go."""
        with self._shown_lock:  # both at once: a verdict set in between would be forgotten
            self._shown = {k: v for k, v in self._shown.items() if k[1] != target}
            self.targets.forget(target)

    def verdict(self, verdict: RunVerdict) -> None:
        """A run's VERDICT was computed: the run's and each of its targets' gauges. Only the
        values that changed are set (the keeper and every status call compute a run's
        verdict over all of its targets; most of them are what they were); a value refused
        by a bound is tried again next time (a place may have been freed)."""
        run, value = verdict.run, verdict.verdict.value
        self._verdicts[value].inc()
        with self._shown_lock:  # the keeper and status threads: set in the order computed
            if len(self._shown) > SHOWN_MAX:  # only a memo: forgetting it re-sets every value
                self._shown.clear()
            self._show(self.runs, self.run_verdict, (run, None), value, run)
            for t in verdict.targets:
                now = t.verdict.value
                self._show(self.targets, self.target_verdict, (run, t.target), now, t.target, run)

    def _show(
        self,
        bounded: Bounded,
        family: Gauge,
        memo: tuple[str, str | None],
        value: str,
        key: str,
        *rest: str,
    ) -> None:
        """FAMILY's series for KEY and REST one-hot on VALUE, unless MEMO says they already
        are (the caller holds _shown_lock); remembered only when every one was exported."""
        if self._shown.get(memo) == value:
            return
        ok = [bounded.set(family, key, float(v == value), *rest, v) for v in VERDICTS]
        if all(ok):
            self._shown[memo] = value


class RpcObserver(grpc.ServerInterceptor):
    """Counts and times every VerifierService and AuditService RPC by method and status,
    counts every refused call by method and reason (and refused reports again, by reason, in
    the reports' own counters), and gives every log line written while serving a call the
    method and the peer (contextvars; the servicer adds the identity and, for a report,
    agent, target and seq)."""

    def __init__(self, metrics: VerifierMetrics) -> None:
        self.metrics = metrics
        for m in METHODS:
            self.metrics.rpcs.labels(m, "OK")
        # the observed handler of each inner handler, built once per (method, inner handler);
        # inner handlers are a fixed few (a method's, admission's refusal of it)
        self._made: dict[tuple[str, int], tuple[Any, grpc.RpcMethodHandler[Any, Any]]] = {}

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        method = method_name(handler_call_details.method)
        if handler is None or method is None:
            return handler
        made = self._made.get((method, id(handler)))
        if made is not None and made[0] is handler:
            return made[1]
        out = self._observe(method, handler)
        if len(self._made) < OBSERVED_MAX:
            self._made[(method, id(handler))] = (handler, out)
        return out

    def _observe(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        # unary calls, and admission's refusals (client-streaming: they never read a request)
        behavior = handler.unary_unary or handler.stream_unary
        if behavior is None:
            return handler
        make = (
            grpc.unary_unary_rpc_method_handler
            if handler.unary_unary is not None
            else grpc.stream_unary_rpc_method_handler
        )

        def observed(request: Any, context: grpc.ServicerContext) -> Any:
            structlog.contextvars.clear_contextvars()  # pool threads: nothing from a last call
            _NOTED.set(None)
            structlog.contextvars.bind_contextvars(method=method, peer=context.peer())
            began = time.monotonic()
            try:
                response = behavior(request, context)
            except BaseException:
                code: grpc.StatusCode | None = _code(context) or grpc.StatusCode.UNKNOWN
                raise
            else:
                code = _code(context) or grpc.StatusCode.OK
                return response
            finally:
                self._done(method, code, time.monotonic() - began, context)
                structlog.contextvars.clear_contextvars()

        # the threads an inner interceptor chose (admission.Admission), kept
        pool = getattr(behavior, "experimental_thread_pool", None)
        if pool is not None:
            observed.experimental_thread_pool = pool  # type: ignore[attr-defined]
        return make(
            observed,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _done(
        self,
        method: str,
        code: grpc.StatusCode | None,
        seconds: float,
        context: grpc.ServicerContext,
    ) -> None:
        name = code.name if code is not None else "UNKNOWN"
        self.metrics.rpcs.labels(method, name).inc()
        self.metrics.rpc_duration.labels(method).observe(seconds)
        if method == "Report":
            self.metrics.received.inc()
        if code == grpc.StatusCode.OK:
            return
        reason = _NOTED.get() or refusal_reason(code, method)
        self.metrics.refusals.labels(method, reason).inc()
        if method != "Report":
            return
        self.metrics.reports.labels("refused").inc()
        self.metrics.refused.labels(reason).inc()
        details = getattr(context, "details", lambda: b"")()
        if isinstance(details, bytes):
            details = details.decode(errors="replace")
        # A nonce mismatch is routine after a verifier restart: the agent says Hello again.
        emit = log.info if reason == "nonce" else log.warning
        emit("report_refused", reason=reason, code=name, details=details)


def _code(context: grpc.ServicerContext) -> grpc.StatusCode | None:
    code = getattr(context, "code", None)  # grpc's server context has it; the stubs do not
    got = code() if callable(code) else None
    return got if isinstance(got, grpc.StatusCode) else None
