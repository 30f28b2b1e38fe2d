"""What ``verifier serve`` exports (docs/operations.md): reports by result and refusal reason,
bindings ingested, ingest time and lag, verdicts, the ledger's size, every VerifierService
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

import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import grpc
import structlog

from verifier.metrics.registry import Registry
from verifier.model import TargetReport

log = structlog.get_logger("verifier.metrics")

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


class VerifierMetrics:
    """What ``verifier serve`` exports. LEDGER_SIZE is read at scrape time."""

    def __init__(self, ledger_size: Callable[[], int] | None = None) -> None:
        r = self.registry = Registry()
        self.received = r.counter(
            "verifier_reports_received_total", "Report RPCs received (every attempt)"
        )
        self.reports = r.counter(
            "verifier_reports_total",
            "reports by result: accepted (stored), duplicate (seq already stored), "
            "need_manifests (sent back for manifests), refused",
            ["result"],
        )
        self.refused = r.counter(
            "verifier_reports_refused_total", "reports refused, by reason", ["reason"]
        )
        self.bindings = r.counter(
            "verifier_bindings_ingested_total",
            "request bindings stored: kind=span (a request's steps), kind=request_id (an id map)",
            ["kind"],
        )
        self.ingest = r.histogram(
            "verifier_ingest_duration_seconds",
            "seconds from a report's receipt to the commit of its transaction",
        )
        self.lag = r.gauge(
            "verifier_ingest_lag_seconds",
            "receipt minus the agent's collected_unix of the target's latest stored report "
            "(spool wait included; the agent's clock: skew included)",
            ["target"],
        )
        self.last_report = r.gauge(
            "verifier_last_report_timestamp_seconds",
            "when the target's latest report was stored (unix s)",
            ["target"],
        )
        self.verdicts = r.counter(
            "verifier_verdicts_total",
            "verdicts computed (status RPCs and the history keeper), by value",
            ["verdict"],
        )
        self.run_verdict = r.gauge(
            "verifier_run_verdict",
            "1 for each run's latest computed verdict, 0 for the others",
            ["run", "verdict"],
        )
        self.ledger = r.gauge("verifier_ledger_entries", "entries in the audit ledger")
        if ledger_size is not None:
            self.ledger.set_function(lambda: [((), float(ledger_size()))])
        self.rpcs = r.counter(
            "verifier_rpcs_total",
            "RPCs answered, by method and gRPC status code",
            ["method", "code"],
        )
        self.refusals = r.counter(
            "verifier_refusals_total",
            "calls refused (any status but OK), by method and reason; a report's refusal is "
            "also in verifier_reports_refused_total",
            ["method", "reason"],
        )
        self.rpc_duration = r.histogram(
            "verifier_rpc_duration_seconds", "seconds to answer an RPC, by method", ["method"]
        )
        for result in REPORT_RESULTS:
            self.reports.zero(result=result)
        for reason in REFUSAL_REASONS:
            self.refused.zero(reason=reason)
            for method in ZEROED_REFUSALS:
                self.refusals.zero(method=method, reason=reason)
        for kind in ("span", "request_id"):
            self.bindings.zero(kind=kind)
        for verdict in VERDICTS:
            self.verdicts.zero(verdict=verdict)

    def report(self, result: str) -> None:
        self.reports.inc(result=result)

    def stored(self, report: TargetReport, received_unix: float, ingest_s: float) -> None:
        self.reports.inc(result="accepted")
        self.ingest.observe(ingest_s)
        if report.collected_unix is not None:
            self.lag.set(received_unix - report.collected_unix, target=report.target)
        self.last_report.set(received_unix, target=report.target)
        self.bindings.inc(len(report.spans), kind="span")
        self.bindings.inc(len(report.request_ids), kind="request_id")

    def verdict(self, run: str, value: str) -> None:
        self.verdicts.inc(verdict=value)
        for v in VERDICTS:
            self.run_verdict.set(1.0 if v == value else 0.0, run=run, verdict=v)


class RpcObserver(grpc.ServerInterceptor):
    """Counts and times every VerifierService and AuditService RPC by method and status,
    counts every refused call by method and reason (and refused reports again, by reason, in
    the reports' own counters), and gives every log line written while serving a call the
    method and the peer (contextvars; the servicer adds the identity and, for a report,
    agent, target and seq)."""

    def __init__(self, metrics: VerifierMetrics) -> None:
        self.metrics = metrics
        for m in METHODS:
            self.metrics.rpcs.zero(method=m, code="OK")

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        method = method_name(handler_call_details.method)
        if handler is None or method is None:
            return handler
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
        self.metrics.rpcs.inc(method=method, code=name)
        self.metrics.rpc_duration.observe(seconds, method=method)
        if method == "Report":
            self.metrics.received.inc()
        if code == grpc.StatusCode.OK:
            return
        reason = _NOTED.get() or refusal_reason(code, method)
        self.metrics.refusals.inc(method=method, reason=reason)
        if method != "Report":
            return
        self.metrics.reports.inc(result="refused")
        self.metrics.refused.inc(reason=reason)
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
