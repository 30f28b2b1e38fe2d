"""Prometheus metrics of ``verifier serve`` and ``verifier agent`` (docs/operations.md).

A small registry (counters, gauges, histograms, with labels) rendered in the Prometheus text
exposition format 0.0.4, served by the standard library's ``http.server`` from a daemon
thread (``--metrics-listen``): no dependency the agent's vLLM environment would have to carry.
Values are kept in memory and start at zero with each process, as Prometheus expects of
counters; known label values (results, reasons, verdicts) are exported at zero from the start
so that "none yet" reads as 0, not as a missing series.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import structlog

from verifier import __version__
from verifier.errors import ConfigError
from verifier.model import TargetReport

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


# The verifier -------------------------------------------------------------------------------

REPORT_RESULTS = ("accepted", "duplicate", "need_manifests", "refused")
REFUSAL_REASONS = ("malformed", "nonce", "not_authorized", "storage", "other")
VERDICTS = ("PASS", "FAIL", "PENDING", "STALE")
METHODS = ("Hello", "Report", "RegisterRun", "GetRunStatus", "ListRuns")
SERVICE_PREFIX = "/verifier.api.v1.VerifierService/"


def refusal_reason(code: grpc.StatusCode | None) -> str:
    """Why the verifier refused a report, from the status its servicer aborted with."""
    return {
        grpc.StatusCode.INVALID_ARGUMENT: "malformed",  # undecodable, or a manifest that lies
        grpc.StatusCode.FAILED_PRECONDITION: "nonce",
        grpc.StatusCode.UNAUTHENTICATED: "not_authorized",
        grpc.StatusCode.PERMISSION_DENIED: "not_authorized",
        grpc.StatusCode.UNAVAILABLE: "storage",  # the database refused it: not acknowledged
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
        self.rpc_duration = r.histogram(
            "verifier_rpc_duration_seconds", "seconds to answer an RPC, by method", ["method"]
        )
        for result in REPORT_RESULTS:
            self.reports.zero(result=result)
        for reason in REFUSAL_REASONS:
            self.refused.zero(reason=reason)
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
    """Counts and times every VerifierService RPC by method and status, counts refused reports
    by reason, and gives every log line written while serving a call the method and the peer
    (contextvars; the servicer adds the identity and, for a report, agent, target and seq)."""

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
        full = handler_call_details.method
        if handler is None or handler.unary_unary is None or not full.startswith(SERVICE_PREFIX):
            return handler
        method = full[len(SERVICE_PREFIX) :]
        behavior = handler.unary_unary

        def observed(request: Any, context: grpc.ServicerContext) -> Any:
            structlog.contextvars.clear_contextvars()  # pool threads: nothing from a last call
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

        return grpc.unary_unary_rpc_method_handler(
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
        if method != "Report":
            return
        self.metrics.received.inc()
        if code == grpc.StatusCode.OK:
            return
        reason = refusal_reason(code)
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


# The agent ---------------------------------------------------------------------------------


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


# The endpoint --------------------------------------------------------------------------------


def parse_listen(value: str) -> tuple[str, int]:
    """HOST:PORT, [IPv6]:PORT, :PORT or PORT (loopback when no host is given)."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "", value
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--metrics-listen {value!r}: expected HOST:PORT or PORT")
    return host, int(port)


class MetricsServer:
    """GET /metrics (the text format) from a daemon thread; anything else is 404."""

    def __init__(self, listen: str, registry: Registry) -> None:
        host, port = parse_listen(listen)
        render = registry.render

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics is served here")
                    return
                body = render().encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # scrapes every few seconds are not worth a log line

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            address_family = _family(host)

        try:
            self.httpd = Server((host, port), Handler)
        except OSError as e:
            raise ConfigError(f"--metrics-listen {listen}: cannot listen: {e.strerror}") from e
        self.port = int(self.httpd.server_address[1])
        self.address = f"{host}:{self.port}"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="metrics-http", daemon=True
        )

    def start(self) -> MetricsServer:
        self._thread.start()
        log.info("metrics_serving", listen=self.address)
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _family(host: str) -> Any:
    import socket

    return socket.AF_INET6 if ":" in host else socket.AF_INET


def serve_metrics(listen: str | None, registry: Registry) -> MetricsServer | None:
    return MetricsServer(listen, registry).start() if listen else None
