"""Client side of the verifier API for the CLI and harnesses (translates gRPC errors)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import grpc

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.client.deadline import DEFAULT_RPC_TIMEOUT_S, Deadline, Outage, retrying
from servewitness.errors import (
    CheckFailed,
    ConfigError,
    Error,
    NoAnswerInTime,
    NotAuthorized,
    TimeoutError_,
    UnavailableError,
    UsageError,
)
from servewitness.model import RunVerdict
from servewitness.security.refusal import connection_failed, tls_refusal
from servewitness.security.tls import ClientTLS, client_channel
from servewitness.wire.limits import POLICY_BYTES

T = TypeVar("T")

# A window call's answer comes after the verifier's own wait of the time given: the call's
# deadline is that time plus this (and no more: the command's whole time is bounded).
ANSWER_GRACE_S = 1.0
# The TLS refusal probe after a failed connection (``tls_refusal``): at most this long in all,
# and never more than is left of the call's own deadline (with this floor, so it can still
# run). Its timeout is per socket operation, and it makes up to PROBE_STEPS of them (connect,
# handshake, the first read): each gets its share, so a peer that stalls each in turn cannot
# stretch it (a peer that hangs up on gRPC and stalls the probe's handshake is in the tests).
PROBE_MAX_S = 3.0
PROBE_MIN_S = 0.3
PROBE_STEPS = 3
# gRPC backs off between connection attempts up to 120 s by default: a verifier back up
# would not be seen for minutes by a client that keeps its channel (``wait``). Capped here.
RECONNECT_OPTIONS: tuple[tuple[str, object], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def _translate(  # noqa: PLR0911 - one answer per status code
    address: str, e: grpc.RpcError, tls: ClientTLS | None = None, probe_s: float = PROBE_MAX_S
) -> Error:
    """The exit-code contract's error for a failed call. gRPC says UNAVAILABLE for a refused
    TLS handshake too: that is asked again (``tls_refusal``) and is NOT_AUTHORIZED (exit 10)
    with the side that refused and why; UNAVAILABLE stays for nothing there (exit 4)."""
    code, details = e.code(), e.details() or ""
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return NotAuthorized(f"verifier at {address} refused: {details or code.name}")
    if code == grpc.StatusCode.UNAVAILABLE and connection_failed(details):
        refused = tls_refusal(address, tls, probe_s / PROBE_STEPS)
        if refused is not None:
            return NotAuthorized(refused)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return NoAnswerInTime(f"verifier at {address} unreachable: {details or code.name}")
    if code == grpc.StatusCode.UNAVAILABLE:
        return UnavailableError(f"verifier at {address} unreachable: {details or code.name}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # back-pressure: up, but refusing load
        return UnavailableError(f"verifier at {address} busy: {details or code.name}")
    if code == grpc.StatusCode.FAILED_PRECONDITION:  # an index that disagrees with the ledger
        return CheckFailed(f"verifier at {address}: {details}")
    if code == grpc.StatusCode.INVALID_ARGUMENT and "policy" in details.lower():
        return ConfigError(details)
    if code in (
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.ALREADY_EXISTS,
    ):
        return UsageError(details)
    return Error(f"verifier error {code.name}: {details}")


class VerifierClient:
    """The verifier's RPCs with errors translated. TIMEOUT_S: each call's deadline (the
    per-call default, ``--rpc-timeout``); DEADLINE: the end of the time the user gave the
    command, which every call's deadline is also bounded by (``servewitness.client.deadline``)."""

    def __init__(
        self,
        address: str,
        timeout_s: float = DEFAULT_RPC_TIMEOUT_S,
        tls: ClientTLS | None = None,
        deadline: Deadline | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.tls = tls
        self.deadline = deadline
        options = [*wire.GRPC_OPTIONS, *RECONNECT_OPTIONS]
        self.channel = client_channel(address, tls, options)
        self.stub = pb_grpc.VerifierServiceStub(self.channel)
        self.audit_stub = pb_grpc.AuditServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> VerifierClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def within(self, deadline: Deadline) -> Iterator[None]:
        """Every call in the block bounded by DEADLINE too (the earlier of it and any
        deadline the client has)."""
        outer = self.deadline
        if outer is None or deadline.end < outer.end:
            self.deadline = deadline
        try:
            yield
        finally:
            self.deadline = outer

    def call_timeout(self) -> float:
        """This call's gRPC deadline: the per-call default, bounded by the command's."""
        if self.deadline is None:
            return self.timeout_s
        return self.deadline.rpc_timeout(self.timeout_s)

    def _invoke(
        self, fn: Callable[..., T], request: Any, timeout_s: float, *, window: bool = False
    ) -> T:
        """FN(REQUEST) within TIMEOUT_S, its gRPC error translated (a window call's
        FAILED_PRECONDITION is its verdict: timed out, exit 5, or refused, exit 1). The TLS
        refusal probe after a failed connection gets what is left of TIMEOUT_S."""
        end = time.monotonic() + timeout_s
        try:
            # gRPC takes no deadline of 0; a call with no time left fails at once
            return fn(request, timeout=max(timeout_s, 0.001))
        except grpc.RpcError as e:
            if window and e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                details = e.details() or ""
                if "timed out" in details:
                    raise TimeoutError_(details) from None
                raise CheckFailed(details) from None
            probe_s = min(PROBE_MAX_S, max(PROBE_MIN_S, end - time.monotonic()))
            raise _translate(self.address, e, self.tls, probe_s) from None

    def _call(self, fn: Callable[..., T], request: Any) -> T:
        return self._invoke(fn, request, self.call_timeout())

    def register_run(self, name: str, policy_toml: str, source: str) -> wire.RegisteredRun:
        """Register NAME with a policy (the same policy again is a no-op). A policy over the
        ``policy_bytes`` limit is a configuration error here, before it is sent: the verifier
        would refuse it, and one over the 64 MiB message limit would not even reach it."""
        size = len(policy_toml.encode())
        if size > POLICY_BYTES.value:
            raise ConfigError(
                f"invalid policy {source}: {size} bytes > limit {POLICY_BYTES.name} "
                f"({POLICY_BYTES.value})"
            )
        req = wire.register_run_request_to_pb(wire.RunRegistration(name, policy_toml, source))
        return wire.register_run_response_from_pb(self._call(self.stub.RegisterRun, req))

    def status(self, run: str) -> RunVerdict:
        req = wire.get_run_status_request_to_pb(run)
        return wire.get_run_status_response_from_pb(self._call(self.stub.GetRunStatus, req))

    def list_runs(self) -> tuple[wire.RunSummary, ...]:
        resp = self._call(self.stub.ListRuns, pb.ListRunsRequest())
        return wire.list_runs_response_from_pb(resp)

    def list_targets(self) -> tuple[wire.TargetStatus, ...]:
        resp = self._call(self.stub.ListTargets, pb.ListTargetsRequest())
        return wire.list_targets_response_from_pb(resp)

    # measurement windows: the verifier waits up to TIMEOUT_S itself, so the call may take
    # that long; the whole of it, calls again after the verifier was unreachable or busy
    # included, takes at most TIMEOUT_S + ANSWER_GRACE_S
    def _window_call(
        self, fn: Callable[..., T], request: Callable[[float], Any], timeout_s: float
    ) -> T:
        budget = Deadline(timeout_s)
        outage = Outage()

        def once() -> T:
            # the verifier's own wait: TIMEOUT_S, and what is left of it when called again
            wait_s = timeout_s if outage.attempts == 0 else budget.left()
            return self._invoke(fn, request(wait_s), wait_s + ANSWER_GRACE_S, window=True)

        got = retrying(once, budget, outage)
        if got is None:
            raise UnavailableError(
                f"{outage.describe(budget)} (the window call takes at most --timeout "
                f"{timeout_s:g} s + {ANSWER_GRACE_S:g} s for the answer)"
            )
        return got

    def open_window(self, run: str, timeout_s: float) -> wire.OpenedWindow:
        """Open a window on RUN (operator or harness role): TimeoutError_ (exit 5) when it
        does not PASS on fresh evidence within TIMEOUT_S, CheckFailed (exit 1) on a FAIL,
        UnavailableError (exit 4) when the verifier could not be reached until then."""

        def request(wait_s: float) -> Any:
            return wire.open_window_request_to_pb(wire.WindowOpening(run, wait_s))

        resp = self._window_call(self.stub.OpenWindow, request, timeout_s)
        return wire.open_window_response_from_pb(resp)

    def seal_window(self, sealing: wire.WindowSealing) -> wire.SealedWindow:
        """Seal a window: the signed seal document, held or not."""

        def request(wait_s: float) -> Any:
            return wire.seal_window_request_to_pb(replace(sealing, timeout_s=wait_s))

        resp = self._window_call(self.stub.SealWindow, request, sealing.timeout_s)
        return wire.seal_window_response_from_pb(resp)

    def forget_target(self, target: str) -> wire.TargetStatus:
        """Retire TARGET (operator role); UsageError (NOT_FOUND) when the verifier has none."""
        req = wire.forget_target_request_to_pb(target)
        return wire.forget_target_response_from_pb(self._call(self.stub.ForgetTarget, req))

    def audit(self, kind: str, query: str, limit: int = 0) -> AuditReply:
        """An audit query's answer (auditor or operator role), NOT yet checked: the caller
        checks it offline (``servewitness.ledger.answers.check_answer``) before using it."""
        fn, msg = {
            "request": (self.audit_stub.AuditServed, pb.AuditServedRequest),
            "file": (self.audit_stub.AuditFile, pb.AuditFileRequest),
            "run": (self.audit_stub.AuditRun, pb.AuditRunRequest),
        }[kind]
        got = self._call(fn, msg(query=query, limit=limit)).answer
        omitted = [Omitted(o.target, o.record, int(o.bytes)) for o in got.omitted]
        return AuditReply(bytes(got.bundle), got.note, got.total, got.truncated, omitted)

    def audit_checkpoint(self) -> str:
        """A checkpoint of the whole ledger signed now (a C2SP note), unchecked."""
        return str(self._call(self.audit_stub.AuditCheckpoint, pb.AuditCheckpointRequest()).note)

    def audit_consistency(self, old_size: int) -> tuple[str, list[bytes], bytes]:
        """(a note of the whole ledger signed now, the consistency proof from OLD_SIZE to it,
        the root at OLD_SIZE), unchecked: the caller checks all three against a note it kept."""
        req = pb.AuditConsistencyRequest(old_size=old_size)
        got = self._call(self.audit_stub.AuditConsistency, req)
        return str(got.note), [bytes(h) for h in got.proof], bytes(got.old_root)


@dataclass(frozen=True)
class Omitted:
    """A record the verifier left out of an answer for its size (not signed)."""

    target: str
    record: str
    bytes: int


@dataclass(frozen=True)
class AuditReply:
    """What an audit RPC returned: the signed bundle and note, and the record counts and the
    records left out for their size (these are not signed: only what the bundle holds is
    checked)."""

    bundle: bytes
    note: str
    total: int
    truncated: bool
    omitted: list[Omitted] = field(default_factory=list)
