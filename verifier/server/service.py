"""The gRPC servicer: agents say Hello and Report; clients register runs and ask for status.

Every request is validated at this edge: malformed or inconsistent reports are rejected with a
gRPC status and a reason, never stored and never able to produce a PASS.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from typing import Any

import grpc
import structlog

from verifier import wire
from verifier.api.v1 import verifier_pb2 as pb
from verifier.api.v1 import verifier_pb2_grpc as pb_grpc
from verifier.errors import Error
from verifier.model import FileEntry, RunVerdict, TargetReport, merkle_root
from verifier.policy import PolicyError, load_policy, policy_digest, unsafe_flags
from verifier.security.auth import READ_ROLES, Authorizer
from verifier.server.evaluate import Evaluator
from verifier.server.index import processes_seen
from verifier.server.metrics import VerifierMetrics
from verifier.server.store import RunExists, Store, StoredReport, UnknownRun

log = structlog.get_logger("verifier.serve")
REPORT_INTERVAL_S = 0.5  # keeps gate latency under 1 s (BENCHMARKS.md)


def verdict_detail(v: RunVerdict) -> dict[str, Any]:
    """What the verdict history keeps: verdicts and finding ids per target (no timestamps)."""
    return {
        "policy_digest": v.policy_digest,
        "run": [f.id for f in v.findings],
        "targets": {
            t.target: [t.verdict.value, sorted(f.id for f in t.findings)] for t in v.targets
        },
    }


OPERATOR = frozenset({"operator"})


class VerifierService(pb_grpc.VerifierServiceServicer):
    def __init__(
        self,
        store: Store,
        report_interval_s: float = REPORT_INTERVAL_S,
        auth: Authorizer | None = None,
    ) -> None:
        self.store = store
        self.auth = auth or Authorizer(secure=False)
        self.evaluator = Evaluator(store)
        self.report_interval_s = report_interval_s
        self._nonces: dict[str, str] = {}
        self._lock = threading.Lock()
        self._known: set[str] = set()  # manifest digests already stored
        self.dirty = threading.Event()  # new evidence: the history keeper re-evaluates
        self.metrics = VerifierMetrics(store.ledger_size)

    # agents ----------------------------------------------------------------------------
    def Hello(self, request: pb.HelloRequest, context: grpc.ServicerContext) -> pb.HelloResponse:
        try:
            hello = wire.hello_request_from_pb(request)
        except wire.WireError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed hello: {e}")
        self.auth.require_agent(context, hello.agent_id, hello.targets)
        nonce = secrets.token_hex(16)
        with self._lock:
            self._nonces[hello.agent_id] = nonce
        log.info("hello", agent=hello.agent_id, targets=list(hello.targets))
        reply = wire.HelloReply(nonce, self.report_interval_s, self.store.last_seq(hello.agent_id))
        return wire.hello_response_to_pb(reply)

    def Report(self, request: pb.ReportRequest, context: grpc.ServicerContext) -> pb.ReportResponse:
        received = time.monotonic()
        try:
            report = wire.report_request_from_pb(request)
        except wire.WireError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed report: {e}")
        structlog.contextvars.bind_contextvars(  # every line about this report names it
            agent=report.agent_id, target=report.target, seq=report.seq
        )
        peer = self.auth.require_agent(context, report.agent_id, [report.target])
        with self._lock:
            expected = self._nonces.get(report.agent_id)
            if expected is None or not secrets.compare_digest(expected, report.nonce):
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "nonce mismatch: say Hello and report again with the nonce it returns",
                )
            if report.seq <= self.store.last_seq(report.agent_id):
                self.metrics.report("duplicate")
                return wire.report_response_to_pb(wire.ReportAck(True, report.seq, expected))
            manifests, need = self._manifests(report, context)
            if need:
                self.metrics.report("need_manifests")
                ack = wire.ReportAck(False, report.seq, expected, tuple(need))
                return wire.report_response_to_pb(ack)
            stripped = dataclasses.replace(
                report,
                processes=tuple(dataclasses.replace(p, files=None) for p in report.processes),
                spans=(),
                request_ids=(),
            )
            stored = StoredReport(
                report.agent_id,
                report.seq,
                report.target,
                time.time(),
                wire.report_to_bytes(stripped),
            )
            try:
                self.store.save_report(
                    stored,
                    manifests,
                    processes_seen(report.processes),
                    report.spans,
                    report.request_ids,
                )
            except self.store.errors as e:
                # Not stored, so never acknowledged: the agent keeps it spooled and retries.
                log.error("report_not_stored", agent=report.agent_id, seq=report.seq, error=str(e))
                context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"report {report.seq} not stored, the verifier's database refused it: {e}",
                )
            ingest_s = time.monotonic() - received
            self.metrics.stored(report, stored.received_unix, ingest_s)
            log.debug("report_stored", ingest_s=round(ingest_s, 6), processes=len(report.processes))
            self.evaluator.note(stripped, stored.received_unix, self.auth.authenticated_as(peer))
            nonce = secrets.token_hex(16)
            self._nonces[report.agent_id] = nonce
        self.dirty.set()
        return wire.report_response_to_pb(wire.ReportAck(True, report.seq, nonce))

    def _manifests(
        self, report: TargetReport, context: grpc.ServicerContext
    ) -> tuple[dict[str, tuple[FileEntry, ...]], list[str]]:
        manifests: dict[str, tuple[FileEntry, ...]] = {}
        need: list[str] = []
        for p in report.processes:
            digest = p.manifest_digest
            if digest is None or digest in manifests:
                continue
            if self._known_manifest(digest):
                continue  # content-addressed: already verified and stored once
            if p.files is None:
                need.append(digest)
                continue
            actual = merkle_root((f.path, f.sha256) for f in p.files if f.sha256)
            if actual != digest:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"pid {p.key.pid}: manifest digest {digest} does not match its files "
                    f"({actual})",
                )
            manifests[digest] = p.files
        return manifests, need

    def _known_manifest(self, digest: str) -> bool:
        if digest in self._known:
            return True
        if self.store.has_manifest(digest):
            self._known.add(digest)
            return True
        return False

    # clients ---------------------------------------------------------------------------
    def RegisterRun(
        self, request: pb.RegisterRunRequest, context: grpc.ServicerContext
    ) -> pb.RegisterRunResponse:
        self.auth.require_role(context, OPERATOR)
        try:
            reg = wire.register_run_request_from_pb(request)
        except wire.WireError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed registration: {e}")
        try:
            load_policy(reg.policy_toml, reg.source or "<policy>")
            rec = self.store.register_run(
                reg.name, reg.policy_toml, policy_digest(reg.policy_toml), reg.source
            )
        except PolicyError as e:
            # "invalid policy" is what the client's translation reads as a configuration
            # error (exit 3): a policy's own message need not contain the word.
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid policy: {e.explain()}")
        except RunExists as e:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, e.explain())
        log.info("run_registered", run=rec.name, policy=rec.policy_digest)
        self.dirty.set()
        registered = wire.RegisteredRun(rec.name, rec.policy_digest, rec.created_unix)
        return wire.register_run_response_to_pb(registered)

    def GetRunStatus(
        self, request: pb.GetRunStatusRequest, context: grpc.ServicerContext
    ) -> pb.GetRunStatusResponse:
        self.auth.require_role(context, READ_ROLES)
        try:
            name = wire.get_run_status_request_from_pb(request)
        except wire.WireError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed status request: {e}")
        try:
            run = self.store.get_run(name)
            if run is None:  # get_run raises UnknownRun; this only narrows the type
                raise UnknownRun(f"no run named {name!r}")
            verdict = self.evaluator.run_verdict(run, time.time())
        except UnknownRun as e:
            context.abort(grpc.StatusCode.NOT_FOUND, e.explain())
        except Error as e:
            context.abort(grpc.StatusCode.INTERNAL, e.explain())
        self.store.record_verdict(run.name, verdict.verdict.value, verdict_detail(verdict))
        self.metrics.verdict(run.name, verdict.verdict.value)
        return wire.get_run_status_response_to_pb(verdict)

    def ListRuns(
        self, request: pb.ListRunsRequest, context: grpc.ServicerContext
    ) -> pb.ListRunsResponse:
        self.auth.require_role(context, READ_ROLES)
        now = time.time()
        snaps = self.evaluator.snapshots()
        out = [
            wire.RunSummary(
                run.name,
                run.policy_digest,
                run.created_unix,
                self.evaluator.run_verdict(run, now, snaps).verdict,
                unsafe_flags(self.evaluator.policy(run)),
            )
            for run in self.store.list_runs()
        ]
        return wire.list_runs_response_to_pb(out)

    def refresh_verdicts(self) -> None:
        """Re-evaluate every run after new evidence; history records each change."""
        now = time.time()
        snaps = self.evaluator.snapshots()
        for run in self.store.list_runs():
            try:
                verdict = self.evaluator.run_verdict(run, now, snaps)
            except Error as e:
                log.error("evaluate_failed", run=run.name, error=e.explain())
                continue
            self.metrics.verdict(run.name, verdict.verdict.value)
            if self.store.record_verdict(run.name, verdict.verdict.value, verdict_detail(verdict)):
                log.info("verdict", run=run.name, verdict=verdict.verdict.value)
