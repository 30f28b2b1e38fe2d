"""The gRPC servicer: agents say Hello and Report; clients register runs and ask for status.

Every request is validated at this edge: malformed or inconsistent reports are rejected with a
gRPC status and a reason, never stored and never able to produce a PASS.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
import time
from typing import TYPE_CHECKING, Any

import grpc
import structlog

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.errors import Error
from servewitness.ledger import bindings
from servewitness.model import FileEntry, TargetReport, manifest_digest
from servewitness.policy import Policy, PolicyError, load_policy, policy_digest, unsafe_flags
from servewitness.security.auth import READ_ROLES, Authorizer
from servewitness.server import binding_rows, clock, follow, report_rows, vouch
from servewitness.server.bounded import KeyedLocks, LruCache
from servewitness.server.evaluate import Evaluator, Tracked
from servewitness.server.history_detail import verdict_detail
from servewitness.server.index import processes_seen
from servewitness.server.metrics import VerifierMetrics
from servewitness.server.nonces import Nonces
from servewitness.server.pacing import Pacer, freshness_limit_s
from servewitness.server.store import RunExists, RunRecord, Store, StoredReport, UnknownRun
from servewitness.server.window_errors import WindowError
from servewitness.server.windows import MAX_WAITING, Windows

if TYPE_CHECKING:
    from servewitness.ledger.keys import Ed25519PrivateKey

log = structlog.get_logger("verifier.serve")
REPORT_INTERVAL_S = 0.5  # keeps gate latency under 1 s (BENCHMARKS.md)


OPERATOR = frozenset({"operator"})
WINDOW_ROLES = frozenset({"operator", "harness"})  # auditors read; they do not measure
# A target silent this long is expired: in no run's verdict, recorded in the ledger.
DEFAULT_TARGET_EXPIRY_S = 3600.0
# What the service remembers across requests, each bounded (docs/operations.md, "Contention and
# memory"): the current nonce of this many agents (least recently heard from forgotten first:
# such an agent's next report is refused with "nonce mismatch" and it says Hello again), and
# this many manifest digests known to be stored (a forgotten one is asked of the database).
MAX_AGENT_NONCES = 65_536
MAX_KNOWN_MANIFESTS = 65_536
# Verdicts status calls computed, waiting for the history keeper to record them.
MAX_SEEN_VERDICTS = 1024


def expiry_error(pol: Policy, expiry_s: float) -> str | None:
    """Why POL cannot be judged under a target expiry of EXPIRY_S, or None: a target must go
    stale (freshness_s) before it expires, or a run would drop a silent target from its verdict
    while its evidence still counted as fresh."""
    if pol.freshness_s >= expiry_s:
        return (
            f"freshness_s {pol.freshness_s:g} is not below the verifier's --target-expiry "
            f"{expiry_s:g}: a target must go stale before it expires"
        )
    return None


class VerifierService(pb_grpc.VerifierServiceServicer):
    def __init__(
        self,
        store: Store,
        report_interval_s: float = REPORT_INTERVAL_S,
        auth: Authorizer | None = None,
        target_expiry_s: float = DEFAULT_TARGET_EXPIRY_S,
        signing_key: Ed25519PrivateKey | None = None,
        *,
        max_window_waits: int = MAX_WAITING,
        max_agent_nonces: int = MAX_AGENT_NONCES,
        max_known_manifests: int = MAX_KNOWN_MANIFESTS,
    ) -> None:
        self.store = store
        self.target_expiry_s = target_expiry_s
        self.auth = auth or Authorizer(secure=False)
        self.evaluator = Evaluator(store)
        self.report_interval_s = report_interval_s
        # each agent's current nonce and when it was issued (a report carrying it left after)
        self.nonces = Nonces(max_agent_nonces)
        # Nonce and seq are per agent: one agent's reports are ingested one at a time, other
        # agents' alongside (the store's one writer is the only thing they share), and a
        # target's report is stored and noted with ForgetTarget kept out (("target", name)).
        self._locks = KeyedLocks()
        self.known: LruCache[str, bool] = LruCache(max_known_manifests)  # digests stored
        # Each agent's last stored seq: read from the database at its Hello (another verifier
        # on the same database may have stored its reports), then kept here as its reports
        # are stored, so a Report does not wait on the store (a commit in progress) to read it.
        self._last_seqs: LruCache[str, int] = LruCache(max_agent_nonces)
        # (run, verdict, detail) a status call computed: recorded by the history keeper, so
        # a status call never waits for a report's transaction to write its history.
        self._seen: collections.deque[tuple[str, str, dict[str, Any]]] = collections.deque(
            maxlen=MAX_SEEN_VERDICTS
        )
        self.dirty = threading.Event()  # new evidence: the history keeper re-evaluates
        self.metrics = VerifierMetrics(store.ledger_size, store.write_times)
        limit = functools.partial(freshness_limit_s, store, self.evaluator)
        self.pacer = Pacer(report_interval_s, limit, self.metrics.registry)  # server/pacing.py
        # server/windows.py
        self.windows = Windows(store, self.evaluator, signing_key, max_waiting=max_window_waits)
        self.receipt_key = vouch.receipt_key(signing_key)  # server/vouch.py

    # agents ----------------------------------------------------------------------------
    def Hello(self, request: pb.HelloRequest, context: grpc.ServicerContext) -> pb.HelloResponse:
        try:
            hello = wire.hello_request_from_pb(request)
        except wire.WireError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed hello: {e}")
        self.auth.require_agent(context, hello.agent_id, hello.targets)
        with self._locks.hold(("agent", hello.agent_id)):
            last = self.store.last_seq(hello.agent_id)
            self._last_seqs.put(hello.agent_id, last)
            nonce = self.nonces.issue(hello.agent_id)
        log.info("hello", agent=hello.agent_id, targets=list(hello.targets))
        reply = wire.HelloReply(nonce, self.report_interval_s, last)
        return wire.hello_response_to_pb(reply)

    def Report(self, request: pb.ReportRequest, context: grpc.ServicerContext) -> pb.ReportResponse:
        received = time.monotonic()
        received_boot_s = clock.boot_s()  # its age is measured from here (server/clock.py)
        try:
            # its bindings made the store's rows straight from the message (no objects)
            report = wire.report_request_from_pb(request, bindings=False)
            tails = binding_rows.tails_from_pb(request.report)
        except wire.WireError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed report: {e}")
        structlog.contextvars.bind_contextvars(  # every line about this report names it
            agent=report.agent_id, target=report.target, seq=report.seq
        )
        peer = self.auth.require_agent(context, report.agent_id, [report.target])
        with self._locks.hold(("agent", report.agent_id)):
            issued = self.nonces.current(report.agent_id, report.nonce)
            if issued is None:
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "nonce mismatch: say Hello and report again with the nonce it returns",
                )
            expected = issued.nonce
            if report.seq <= self._last_seq(report.agent_id):
                self.metrics.report("duplicate")
                ack = wire.ReportAck(True, report.seq, expected, (), self.pacer.pace_s())
                return wire.report_response_to_pb(ack)
            manifests, need = self._manifests(report, context)
            if need:
                self.metrics.report("need_manifests")
                ack = wire.ReportAck(False, report.seq, expected, tuple(need))
                return wire.report_response_to_pb(ack)
            self._ingest(
                report,
                request.report,
                tails,
                manifests,
                peer=peer,
                received=(received, received_boot_s),
                transit_s=issued.transit_s(received_boot_s, report.nonce_held_s),
                context=context,
            )
            nonce = self.nonces.issue(report.agent_id)
            self._last_seqs.put(report.agent_id, report.seq)
        self.dirty.set()
        ack = wire.ReportAck(True, report.seq, nonce, (), self.pacer.pace_s())
        return wire.report_response_to_pb(ack)

    def _last_seq(self, agent_id: str) -> int:
        """AGENT_ID's last stored seq (call holding its lock)."""
        last = self._last_seqs.get(agent_id)
        if last is None:
            last = self.store.last_seq(agent_id)
            self._last_seqs.put(agent_id, last)
        return last

    def ingesting(self) -> list[str]:
        """The agents whose report is being ingested now (after its nonce check, until it is
        stored and noted): what a test or a debugger looks at; nothing decides on it."""
        return sorted(
            str(k[1]) for k in self._locks.held() if isinstance(k, tuple) and k[0] == "agent"
        )

    def _ingest(
        self,
        report: TargetReport,
        msg: pb.TargetReport,
        tails: bindings.Tails,
        manifests: dict[str, tuple[FileEntry, ...]],
        *,
        peer: Any,
        received: tuple[float, float],
        transit_s: float,
        context: grpc.ServicerContext,
    ) -> None:
        """Store REPORT (converted from MSG, its bindings as TAILS) with its new MANIFESTS and
        make it its target's latest evidence. Everything that needs no
        database (the stored body, the manifests' JSON, ledger subjects and index rows) is
        built first: the store's lock, which every agent shares, is held only for the
        writes."""
        stripped = dataclasses.replace(  # its bindings were never made objects (TAILS)
            report, processes=tuple(dataclasses.replace(p, files=None) for p in report.processes)
        )
        stored = StoredReport(
            report.agent_id, report.seq, report.target, time.time(), wire.stored_bytes(msg)
        )
        prepared = self.store.prepare_manifests(manifests)
        seen = processes_seen(report.processes)
        unstorable = report_rows.unstorable_text(stored, prepared, seen, tails)
        if unstorable is not None:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"report {report.seq} not storable alike in every database: {unstorable}",
            )
        who = self.auth.authenticated_as(peer)
        key = self.receipt_key  # vouched for, so a follower knows a verifier wrote it
        row = "" if key is None else vouch.row_digest(*report_rows.identity(stored))
        receipt = follow.ReceiptAt(who, received[1], transit_s, key, row)  # as its row is written

        with self._locks.hold(("target", report.target)):  # ForgetTarget waits
            try:
                rowid = self.store.save_report(stored, prepared, seen, receipt=receipt, tails=tails)
            except self.store.errors as e:
                # Not stored, so never acknowledged: the agent keeps it spooled and retries.
                log.error("report_not_stored", agent=report.agent_id, seq=report.seq, error=str(e))
                context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"report {report.seq} not stored, the verifier's database refused it: {e}",
                )
            del prepared  # a large manifest's rows are garbage from here on
            for digest in manifests:
                self.known.put(digest, True)
            if rowid is None:
                # Another verifier on this database stored this seq first (its agent moved
                # between them mid-retry): what is stored is that report, not this one.
                self.metrics.report("duplicate")
                log.info("report_stored_elsewhere", agent=report.agent_id, seq=report.seq)
                return
            ingest_s = time.monotonic() - received[0]
            self.metrics.stored(
                report, stored.received_unix, ingest_s, (len(tails.spans), len(tails.ids))
            )
            log.debug("report_stored", ingest_s=round(ingest_s, 6), processes=len(report.processes))
            self.evaluator.note(
                stripped,
                stored.received_unix,
                who,
                received[1],
                manifests,
                rowid=rowid,
                transit_s=transit_s,
            )

    def _manifests(
        self, report: TargetReport, context: grpc.ServicerContext
    ) -> tuple[dict[str, tuple[FileEntry, ...]], list[str]]:
        manifests: dict[str, tuple[FileEntry, ...]] = {}
        need: list[str] = []
        for p in report.processes:
            digest = p.manifest_digest
            if digest is None and p.files is not None:
                # never stored, and judged as loading nothing: refused (an agent sends every
                # probed process's digest, and its files only with it)
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"pid {p.key.pid}: {len(p.files)} files sent without a manifest_digest",
                )
            if digest is None or digest in manifests:
                continue
            if self._known_manifest(digest):
                continue  # content-addressed: already verified and stored once
            if p.files is None:
                need.append(digest)
                continue
            actual = manifest_digest(p.files)
            if actual != digest:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"pid {p.key.pid}: manifest digest {digest} does not match its files "
                    f"({actual})",
                )
            manifests[digest] = p.files
        return manifests, need

    def _known_manifest(self, digest: str) -> bool:
        if digest in self.known:
            return True
        if self.store.has_manifest(digest):
            self.known.put(digest, True)
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
            pol = load_policy(reg.policy_toml, reg.source or "<policy>")
            why = expiry_error(pol, self.target_expiry_s)
            if why is not None:
                raise PolicyError(reg.source or "<policy>", None, "evidence.freshness_s", why)
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

    def GetRunStatus(self, request: pb.GetRunStatusRequest, context: grpc.ServicerContext) -> bytes:
        """The run's verdict now, as the encoded ``GetRunStatusResponse`` (assembled from each
        target's kept encoding: ``wire.run_status_bytes``; the ingress sends bytes as they
        are)."""
        self.auth.require_role(context, READ_ROLES)
        try:
            name = wire.get_run_status_request_from_pb(request)
        except wire.WireError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed status request: {e}")
        try:
            run = self.store.get_run(name)
            if run is None:  # get_run raises UnknownRun; this only narrows the type
                raise UnknownRun(f"no run named {name!r}")
            self.evaluator.asked()  # judge reports ahead while status calls come
            verdict = self.evaluator.run_verdict(run, time.time())
        except UnknownRun as e:
            context.abort(grpc.StatusCode.NOT_FOUND, e.explain())
        except Error as e:
            context.abort(grpc.StatusCode.INTERNAL, e.explain())
        # The history records what a client was told; written by the history keeper, so this
        # call never waits for a report's transaction (the keeper records it within a second).
        self._seen.append((run.name, verdict.verdict.value, verdict_detail(verdict)))
        self.dirty.set()
        self.metrics.verdict(verdict)
        return wire.run_status_bytes(verdict)

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
                self._unsafe_flags(run),
            )
            for run in self.store.list_runs()
        ]
        return wire.list_runs_response_to_pb(out)

    def _unsafe_flags(self, run: RunRecord) -> tuple[str, ...]:
        pol = self.evaluator.policy(run)
        return unsafe_flags(pol) if isinstance(pol, Policy) else ()  # refused: nothing loaded

    # targets ---------------------------------------------------------------------------
    def _status(self, t: Tracked, freshness_s: float, now_boot_s: float) -> wire.TargetStatus:
        at = t.snapshot.evidence_boot_s
        age = None if at is None else now_boot_s - at
        state = "expired" if t.expired else "stale" if age is None or age > freshness_s else "live"
        return wire.TargetStatus(
            t.snapshot.target,
            t.snapshot.received_unix,
            age,
            t.agent_id,
            t.snapshot.authenticated_as,
            state,
        )

    def _freshness_s(self) -> float:
        """The smallest freshness_s of the registered runs: what ``live`` means in a list."""
        policies = [self.evaluator.policy(r) for r in self.store.list_runs()]
        fresh = [p.freshness_s for p in policies if isinstance(p, Policy)]  # refused: none
        return min(fresh, default=10.0)

    def ListTargets(
        self, request: pb.ListTargetsRequest, context: grpc.ServicerContext
    ) -> pb.ListTargetsResponse:
        self.auth.require_role(context, READ_ROLES)
        self.expire_targets()
        fresh, now = self._freshness_s(), clock.boot_s()
        out = [self._status(t, fresh, now) for t in self.evaluator.targets()]
        return wire.list_targets_response_to_pb(out)

    def ForgetTarget(
        self, request: pb.ForgetTargetRequest, context: grpc.ServicerContext
    ) -> pb.ForgetTargetResponse:
        peer = self.auth.require_role(context, OPERATOR)
        try:
            name = wire.forget_target_request_from_pb(request)
        except wire.WireError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed forget request: {e}")
        by = self.auth.authenticated_as(peer) or "unauthenticated"
        with self._locks.hold(("target", name)):  # no report of it is stored in between
            gone = self.evaluator.get(name)
            if gone is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"no target named {name!r}")
            status = self._status(gone, self._freshness_s(), clock.boot_s())
            try:  # recorded first: a forget the ledger does not hold did not happen
                _, _, rowid = self.store.retire_target(
                    name, "forgotten", by, (gone.agent_id, gone.seq), key=self.receipt_key
                )
            except self.store.errors as e:
                log.error("forget_not_stored", target=name, error=str(e))
                context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"target {name!r} not forgotten, the verifier's database refused it: {e}",
                )
            self.evaluator.forget(name)
            self.evaluator.forgotten_up_to(name, rowid)  # what was stored before stays out
            self.metrics.forget_target(name)
        log.info("target_forgotten", target=name, by=by)
        self.dirty.set()
        return wire.forget_target_response_to_pb(status)

    def expire_targets(self) -> None:
        """Expire every target silent past the target expiry, each recorded in the ledger."""
        for t in self.evaluator.due_to_expire(self.target_expiry_s):
            target, last = t.snapshot.target, (t.agent_id, t.seq)
            key = self.receipt_key  # vouched for: the other verifiers apply it (server/vouch.py)
            self.store.retire_target(target, "expired", "verifier", last, key=key)  # first
            self.evaluator.retired(target, "expired", last)
            self.metrics.forget_target(target)
            log.info("target_expired", target=target, expiry_s=self.target_expiry_s)

    def record_seen(self) -> None:
        """Record the verdicts status calls computed since the last call (history keeps
        each change, so one the keeper would also compute is written once)."""
        while self._seen:
            run, verdict, detail = self._seen.popleft()
            if self.store.record_verdict(run, verdict, detail):
                log.info("verdict", run=run, verdict=verdict)

    def refresh_verdicts(self) -> None:
        """Record what status calls saw, then re-evaluate every run after new evidence;
        history records each change."""
        self.record_seen()
        self.expire_targets()
        now = time.time()
        snaps = self.evaluator.snapshots()
        for run in self.store.list_runs():
            try:
                verdict = self.evaluator.run_verdict(run, now, snaps)
            except Error as e:
                log.error("evaluate_failed", run=run.name, error=e.explain())
                continue
            self.metrics.verdict(verdict)
            if self.store.record_verdict(run.name, verdict.verdict.value, verdict_detail(verdict)):
                log.info("verdict", run=run.name, verdict=verdict.verdict.value)

    # measurement windows (server/windows.py) -----------------------------------------------
    def OpenWindow(
        self, request: pb.OpenWindowRequest, context: grpc.ServicerContext
    ) -> pb.OpenWindowResponse:
        self.auth.require_role(context, WINDOW_ROLES)
        try:
            req = wire.open_window_request_from_pb(request)
            opened = self.windows.open(req, context.is_active)
        except wire.WireError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed window request: {e}")
        except WindowError as e:
            context.abort(e.code, e.message)
        self.dirty.set()
        return wire.open_window_response_to_pb(opened)

    def SealWindow(
        self, request: pb.SealWindowRequest, context: grpc.ServicerContext
    ) -> pb.SealWindowResponse:
        self.auth.require_role(context, WINDOW_ROLES)
        try:
            req = wire.seal_window_request_from_pb(request)
            sealed = self.windows.seal(req, context.is_active)
        except wire.WireError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed seal request: {e}")
        except WindowError as e:
            context.abort(e.code, e.message)
        self.dirty.set()
        return wire.seal_window_response_to_pb(sealed)
