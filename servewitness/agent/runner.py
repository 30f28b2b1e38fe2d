"""``verifier agent``: the sidecar loop (collect -> report, spool when the verifier is away).

The agent never exits because a target process went away: it reports it gone. It reconnects
with exponential backoff, keeps unacknowledged reports in a bounded on-disk spool and sends
them in order, each exactly once per sequence number (the verifier deduplicates by seq).
Unchanged manifests are sent as digests only; the verifier asks for any it lacks.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time

import grpc
import structlog
from grpc_health.v1 import health, health_pb2

from servewitness import wire
from servewitness._stop_signals import stop_on_signals
from servewitness.ageclock import BootInstant
from servewitness.agent import gcpause
from servewitness.agent.bindings import Bindings
from servewitness.agent.config import AgentConfig
from servewitness.agent.containers import ContainerDirectory, OwnPod
from servewitness.agent.discover import discover
from servewitness.agent.hookenv import hook_problems
from servewitness.agent.judged import Judged
from servewitness.agent.metrics import AgentMetrics
from servewitness.agent.parts import Part, Split, files_once
from servewitness.agent.ports import port_problems
from servewitness.agent.spool import Spool, spoolable
from servewitness.agent.trees import TreeMemory
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.errors import ConfigError, NotAuthorized, UnavailableError
from servewitness.evidence.container import container_of
from servewitness.evidence.journal import JournalCache
from servewitness.evidence.judge import started_environment
from servewitness.evidence.procfs import ProcFS
from servewitness.metrics.health import serve_health
from servewitness.metrics.http import serve_metrics
from servewitness.model import ProcessKey, ProcessReport, TargetReport
from servewitness.security.refusal import connection_failed, tls_refusal
from servewitness.security.tls import client_channel

log = structlog.get_logger("servewitness.agent")


# The health service a readiness probe asks (the overall service "" stays SERVING while the
# agent runs: liveness). SERVING only while the last report was acknowledged (the spool is
# drained) and its collect saw a vLLM process; NOT_SERVING before that, while the verifier
# cannot be reached or refuses, and while no vLLM process is visible (a sidecar in the wrong
# PID namespace). A Kubernetes readinessProbe on it keeps a pod whose evidence does not
# reach the verifier out of its Services' endpoints: nothing measures it unverified.
READY_SERVICE = "verifier.agent.Delivery"


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.procfs = ProcFS(config.proc_root)
        # In Kubernetes, the pod the downward API says the agent runs in (None elsewhere)
        self.containers = ContainerDirectory(
            config.docker_socket, OwnPod.from_env(os.environ), self.procfs
        )
        self.journals = JournalCache()  # probe journals are read once, then only appends
        self.judged = Judged(config, self.procfs)  # each process's last judgement (judged.py)
        # Independent vLLM trees seen under this one target (none when --pid selects one)
        self.trees = TreeMemory(selected=config.root_pid is not None)
        self._trees: dict[str, TreeMemory] = {}  # per container (--instance-per-container)
        # Request bindings the probes appended since the last report (offsets kept by the spool)
        self.bindings = Bindings(config.spool_dir / "bindings-offsets.json")
        self.spool = Spool(config.spool_dir, config.spool_max_bytes)
        self.metrics = AgentMetrics(
            lambda: (len(self.spool), self.spool.size_bytes(), self.spool.dropped)
        )
        counter = self.spool.load_counter()
        # A fresh spool cannot know what this agent id already delivered: its first Hello
        # says (last_seq), and reports it numbered before then are renumbered above that.
        self.fresh_spool = counter is None
        self.floor: int | None = None
        self.seq = max(counter or 0, self.spool.last_seq())
        self.nonce: str | None = None
        # When the agent received that nonce, on its age clock: each report says how long it
        # held it (``nonce_held_s``), which bounds the report's time on the way
        self.nonce_at: BootInstant | None = None
        # Whether the verifier ever accepted this agent's Hello: a refusal before then is a
        # configuration error the agent exits on (exit 10); after it, evidence stays spooled.
        self.connected = False
        self.interval = config.interval_s or 1.0
        self.pace = 0.0  # what the verifier's last acknowledgement asked to wait (0: nothing)
        self._paced = 0.0  # the pace last logged
        self.sent_digests: set[str] = set()
        self.seen: dict[ProcessKey, ProcessReport] = {}
        # The pids of the processes last reported, once all of them exited and until vLLM
        # processes are seen again: said in the report (_nothing_visible)
        self.exited: tuple[int, ...] = ()
        self.stop_event = threading.Event()
        opts = [
            *wire.GRPC_OPTIONS,
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", int(config.max_backoff_s * 1000)),
        ]
        self.channel = client_channel(config.verifier, config.tls, opts)
        self.stub = pb_grpc.VerifierServiceStub(self.channel)
        self.health = health.HealthServicer()
        self.health.set(READY_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.health_server: grpc.Server | None = None
        self.ready = False  # what READY_SERVICE says (set_ready)

    # collection ------------------------------------------------------------------------
    def collect(self) -> TargetReport:
        """One report of every vLLM process visible, as this agent's target."""
        with gcpause.paused():
            (report,) = self._collect(per_container=False)
        return report

    def collect_all(self) -> list[TargetReport]:
        """This collect's reports: one, or one per container (``--instance-per-container``:
        ``agent/parts.py``)."""
        with gcpause.paused():
            return self._collect(per_container=self.config.per_container)

    def _collect(self, per_container: bool) -> list[TargetReport]:
        began = time.time()  # the counters below are read from here on
        at = BootInstant.now()  # the same moment on the age clock (servewitness/ageclock.py)
        refused: list[str] = []
        found = discover(self.procfs, self.config.root_pid, self.journals, refused)
        tree = (
            set(self.procfs.descendants(self.config.root_pid))
            if self.config.root_pid
            else {p.identity.pid for p in found}
        )
        refused.extend(port_problems(self.procfs.root, found, tree))  # agent/ports.py
        refused.extend(hook_problems(found, lambda pid: started_environment(self.procfs, pid)))
        self.judged.new_collect()
        procs = [p for p in map(self.judged.report, found) if p is not None]
        spans, request_ids = self.bindings.collect(found, self.journals)
        keys = {p.key for p in procs}
        if procs:
            self.exited = ()
        elif self.seen:  # every process the last collect reported is gone
            self.exited = tuple(sorted(k.pid for k in self.seen))
        self.judged.forget(keys)
        gone = tuple(k for k in self.seen if k not in keys)
        was = {k: self.seen[k].container_id for k in gone}
        for k in gone:
            log.info("process_gone", pid=k.pid)
            del self.seen[k]
        for p in procs:
            self.seen[p.key] = p
        if not per_container:
            mixed = self.trees.observe(found)
            unobservable = tuple(refused) if procs or refused else (self._nothing_visible(),)
            part = Part(self.config.target, procs, gone, unobservable, mixed, spans, request_ids)
            return [self._build(part, began, at)]
        split = Split(self.config.target, self._trees, self._nothing_visible)
        parts = split.parts(found, procs, was, refused, (spans, request_ids))
        return [self._build(part, began, at) for part in parts]

    def _build(self, part: Part, began: float, at: BootInstant) -> TargetReport:
        # one process per container is enough to describe it (its ref: runtime, source)
        one_each = {p.container_id: p.key.pid for p in part.procs if p.container_id}
        refs = [r for r in (container_of(self.procfs, pid) for pid in one_each.values()) if r]
        # Digest only for manifests the verifier has already acknowledged.
        slim = files_once(
            dataclasses.replace(p, files=None)
            if p.manifest_digest and p.manifest_digest in self.sent_digests
            else p
            for p in part.procs
        )
        self.seq += 1
        self.spool.save_counter(self.seq)
        return TargetReport(
            self.config.agent_id,
            part.target,
            self.seq,
            self.nonce or "",
            time.time(),
            slim,
            part.gone,
            collected_unix=began,
            containers=self.containers.describe(refs, one_each),
            unobservable=part.unobservable,
            spans=part.spans,
            request_ids=part.request_ids,
            mixed_roots=part.mixed,
            collected_at=at,
        )

    def _nothing_visible(self) -> str:
        """Why a collect found no vLLM process: said in the report, so that a sidecar in the
        wrong PID namespace reads as unobservable rather than as a target that is idle, and
        one whose vLLM exited (or is restarting) says so."""
        if self.exited:
            return (
                f"no vLLM process is visible: the {len(self.exited)} this agent reported "
                f"before (pid {', '.join(map(str, self.exited))}) exited; vLLM stopped or is "
                "restarting"
            )
        if self.config.root_pid is not None:
            if not self.procfs.exists(self.config.root_pid):
                return (
                    f"pid {self.config.root_pid} (--pid) is not visible to the agent: it has "
                    "exited, or it runs in a PID namespace the agent does not share (docker run "
                    "--pid container:NAME; compose pid: service:NAME; Kubernetes "
                    "shareProcessNamespace: true)"
                )
            return f"no vLLM process under pid {self.config.root_pid} (--pid)"
        try:
            count = len(self.procfs.parents())
        except (UnavailableError, OSError):
            count = 0
        return (
            f"no vLLM process is visible in the agent's PID namespace ({count} processes "
            "there): the agent must share the serving container's PID namespace (docker run "
            "--pid container:NAME; compose pid: service:NAME; Kubernetes "
            "shareProcessNamespace: true)"
        )

    def _full(self, report: TargetReport, need: set[str]) -> TargetReport:
        procs = []
        for p in report.processes:
            current = self.seen.get(p.key)
            full = (
                p.files is None
                and p.manifest_digest in need
                and current is not None
                and current.manifest_digest == p.manifest_digest
            )
            procs.append(current if full and current is not None else p)
        return dataclasses.replace(report, processes=files_once(procs))

    # transport -------------------------------------------------------------------------
    def hello(self) -> None:
        hello = wire.AgentHello(self.config.agent_id, (self.config.target,))
        resp = wire.hello_response_from_pb(
            self.stub.Hello(
                wire.hello_request_to_pb(hello),
                timeout=5,
                metadata=wire.agent_metadata(hello.agent_id, hello.targets),
            )
        )
        self._took(resp.nonce)
        self.connected = True
        if self.floor is None:
            self.floor = resp.last_seq
            if self.seq < resp.last_seq:
                self.seq = resp.last_seq
                self.spool.save_counter(self.seq)
        if self.config.interval_s is None:
            self.interval = resp.report_interval_s
        log.info("connected", verifier=self.config.verifier, interval_s=self.interval)

    def _took(self, nonce: str) -> None:
        """NONCE, just received from the verifier: the one the next report carries."""
        self.nonce, self.nonce_at = nonce, BootInstant.now()

    def send(self, report: TargetReport) -> bool:
        """Deliver REPORT (re-Hello on a nonce mismatch); True when acknowledged."""
        for _ in range(3):
            if self.nonce is None:
                self.hello()
            # Stamped at each send: a report that waited in the spool is as old as it is. The
            # verifier dates evidence by its receipt minus this age, measured on the age clock
            # (a wall clock stepped back while the report waited would hide the wait from
            # sent_unix - collected_unix); a reading of another boot gives none: unknown.
            sent = max(time.time(), report.sent_unix)
            age = None if report.collected_at is None else report.collected_at.age_s()
            report = dataclasses.replace(
                report,
                nonce=self.nonce or "",
                sent_unix=sent,
                evidence_age_s=age,
                evidence_age_unknown=age is None,
                nonce_held_s=None if self.nonce_at is None else self.nonce_at.age_s(),
            )
            self.metrics.sent.inc()
            try:
                resp = wire.report_response_from_pb(
                    self.stub.Report(
                        wire.report_request_to_pb(report),
                        timeout=10,
                        metadata=wire.agent_metadata(report.agent_id, (report.target,)),
                    )
                )
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    self.metrics.refused.labels("nonce").inc()
                    self.nonce = None
                    continue
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    self.metrics.refused.labels("malformed").inc()
                    log.error("report_rejected", seq=report.seq, reason=e.details())
                    return True  # never deliverable: drop it rather than block the spool
                raise
            self._took(resp.nonce)
            if resp.accepted:
                # the verifier's pace while it is busy (server/pacing.py), bounded here: a
                # verifier cannot make an agent wait longer than its longest backoff
                self.pace = min(resp.next_report_in_s, self.config.max_backoff_s)
                self.metrics.acked(len(report.spans), len(report.request_ids))
                log.debug("report_acknowledged", seq=report.seq)
                for p in report.processes:
                    if p.files is not None and p.manifest_digest:
                        self.sent_digests.add(p.manifest_digest)
                return True
            self.metrics.refused.labels("need_manifests").inc()
            need = set(resp.need_manifests)
            self.sent_digests -= need
            report = self._full(report, need)
        return False

    def drain(self) -> None:
        if self.nonce is None:
            self.hello()
        for seq, data in self.spool.pending():
            try:
                report = wire.report_from_bytes(data)
            except wire.WireError as e:  # never deliverable: set aside, kept, not retried
                kept = self.spool.set_aside(seq)
                log.error("spooled_report_unreadable", seq=seq, reason=str(e), kept=str(kept))
                continue
            # when it was read, on the age clock (None: not known, sent as such)
            report = dataclasses.replace(report, collected_at=self.spool.collected_at(seq))
            if self.fresh_spool and self.floor is not None and seq <= self.floor:
                # Numbered before the first Hello in a fresh spool: collides with what an
                # earlier life of this agent id delivered, so it gets a new number.
                self.seq += 1
                self.spool.save_counter(self.seq)
                report = dataclasses.replace(report, seq=self.seq)
            if not self.send(report):
                return
            self.spool.ack(seq)

    def step(self) -> None:
        began = time.monotonic()
        reports = self.collect_all()
        self.metrics.collected(time.monotonic() - began)
        for report in reports:
            self.spool.put(report.seq, spoolable(report), report.collected_at)
        self.bindings.save()  # its bindings are in the spool now
        if self.spool.dropped:
            log.warning(
                "spool_dropped", dropped=self.spool.dropped, max_bytes=self.config.spool_max_bytes
            )
        self.drain()
        seen = any(r.processes for r in reports)
        self.set_ready(seen and len(self.spool) == 0, "" if seen else "no vLLM process visible")

    def _next_wait(self) -> float:
        """Seconds until the next collection: the agent's interval, or the pace the verifier
        asked while it is busy when that is longer (logged when it changes)."""
        # a pace is spread (+-10 %): agents told at once must not all come back at once
        wait = max(self.interval, self.pace * random.uniform(0.9, 1.1))  # noqa: S311 - jitter
        if self.pace != self._paced:
            log.info("verifier_pace", asked_s=self.pace, wait_s=wait)
            self._paced = self.pace
        return wait

    def set_ready(self, ready: bool, why: str = "") -> None:
        """Say READY or not on READY_SERVICE (logged when it changes, with WHY)."""
        if ready != self.ready:
            log.info("ready" if ready else "not_ready", reason=why or None)
        self.ready = ready
        status = health_pb2.HealthCheckResponse
        self.health.set(READY_SERVICE, status.SERVING if ready else status.NOT_SERVING)

    # lifecycle -------------------------------------------------------------------------
    def run(self) -> None:
        structlog.contextvars.bind_contextvars(  # on every line this agent logs
            target=self.config.target, agent_id=self.config.agent_id
        )
        metrics_http = serve_metrics(self.config.metrics_listen, self.metrics.registry)
        if self.config.health_listen:
            try:
                self.health_server, _ = serve_health(
                    self.config.health_listen, self.health, "--health", wire.EXCLUSIVE_PORT
                )
            except ConfigError:
                if metrics_http is not None:
                    metrics_http.stop()
                raise
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        backoff = 0.5
        refused_at_start: str | None = None
        while not self.stop_event.is_set():
            try:
                self.step()
                backoff = 0.5
                wait = self._next_wait()
            except grpc.RpcError as e:
                self.metrics.failed(e.code())
                if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    # Busy: refused before the verifier read the call, so the nonce it gave
                    # still holds. Saying Hello again would only add a call to an overloaded
                    # verifier (one per refusal: a fleet over capacity spent its CPU on them).
                    # A nonce that no longer holds is refused as such and Hello follows.
                    self.nonce = None
                self.set_ready(False, f"verifier: {e.code().name}")
                # gRPC says UNAVAILABLE for a refused TLS handshake too: asked again, so that
                # a refused certificate is said as such and not as an outage.
                refused = (
                    tls_refusal(self.config.verifier, self.config.tls)
                    if e.code() == grpc.StatusCode.UNAVAILABLE
                    and connection_failed(e.details() or "")
                    else None
                )
                if refused is not None or e.code() in (
                    grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.PERMISSION_DENIED,
                ):
                    # A configuration error, not an outage: said as such; evidence stays
                    # spooled (bounded) until the credentials are fixed.
                    log.error(
                        "not_authorized", reason=refused or e.details(), spooled=len(self.spool)
                    )
                    if not self.connected:  # never accepted: misconfigured, say so and stop
                        refused_at_start = refused or e.details() or e.code().name
                        break
                log.warning(
                    # RESOURCE_EXHAUSTED: the verifier is up but refusing load (back-pressure)
                    "verifier_busy"
                    if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    else "verifier_unreachable",
                    code=str(e.code()),
                    reason=e.details(),
                    spooled=len(self.spool),
                    retry_in_s=backoff,
                )
                wait = backoff
                backoff = min(backoff * 2, self.config.max_backoff_s)
            except wire.WireError as e:
                # The verifier answered something that is not a valid reply (another
                # version, or not a verifier): evidence stays spooled, retried like an outage.
                self.nonce = None
                self.set_ready(False, "verifier reply malformed")
                log.error("verifier_reply_malformed", reason=str(e), spooled=len(self.spool))
                wait = backoff
                backoff = min(backoff * 2, self.config.max_backoff_s)
            self.stop_event.wait(wait)
        if self.health_server is not None:
            self.health_server.stop(1).wait()
        if metrics_http is not None:
            metrics_http.stop()
        self.channel.close()
        if refused_at_start is not None:
            raise NotAuthorized(
                f"verifier {self.config.verifier} refused agent {self.config.agent_id!r} "
                f"(target {self.config.target}): {refused_at_start}; its evidence stays spooled "
                f"in {self.config.spool_dir}"
            )

    def serve_forever(self) -> None:
        with stop_on_signals(self.stop_event):
            self.run()
