"""Client side of the verifier API for the CLI and harnesses (translates gRPC errors)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from verifier import wire
from verifier.api.v1 import verifier_pb2 as pb
from verifier.api.v1 import verifier_pb2_grpc as pb_grpc
from verifier.errors import (
    CheckFailed,
    ConfigError,
    Error,
    NotAuthorized,
    TimeoutError_,
    UnavailableError,
    UsageError,
)
from verifier.model import RunVerdict
from verifier.security.refusal import connection_failed, tls_refusal
from verifier.security.tls import ClientTLS, client_channel
from verifier.wire.limits import POLICY_BYTES

T = TypeVar("T")


def _translate(  # noqa: PLR0911 - one answer per status code
    address: str, e: grpc.RpcError, tls: ClientTLS | None = None
) -> Error:
    """The exit-code contract's error for a failed call. gRPC says UNAVAILABLE for a refused
    TLS handshake too: that is asked again (``tls_refusal``) and is NOT_AUTHORIZED (exit 10)
    with the side that refused and why; UNAVAILABLE stays for nothing there (exit 4)."""
    code, details = e.code(), e.details() or ""
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return NotAuthorized(f"verifier at {address} refused: {details or code.name}")
    if code == grpc.StatusCode.UNAVAILABLE and connection_failed(details):
        refused = tls_refusal(address, tls)
        if refused is not None:
            return NotAuthorized(refused)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
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
    def __init__(self, address: str, timeout_s: float = 10.0, tls: ClientTLS | None = None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.tls = tls
        self.channel = client_channel(address, tls, wire.GRPC_OPTIONS)
        self.stub = pb_grpc.VerifierServiceStub(self.channel)
        self.audit_stub = pb_grpc.AuditServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> VerifierClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: Callable[..., T], request: Any) -> T:
        try:
            return fn(request, timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise _translate(self.address, e, self.tls) from None

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
    # that long (the deadline leaves it room to answer)
    def _window_call(self, fn: Callable[..., T], request: Any, timeout_s: float) -> T:
        try:
            return fn(request, timeout=timeout_s + self.timeout_s)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                details = e.details() or ""
                if "timed out" in details:
                    raise TimeoutError_(details) from None
                raise CheckFailed(details) from None
            raise _translate(self.address, e, self.tls) from None

    def open_window(self, run: str, timeout_s: float) -> wire.OpenedWindow:
        """Open a window on RUN (operator or harness role): TimeoutError_ (exit 5) when it
        does not PASS on fresh evidence within TIMEOUT_S, CheckFailed (exit 1) on a FAIL."""
        req = wire.open_window_request_to_pb(wire.WindowOpening(run, timeout_s))
        resp = self._window_call(self.stub.OpenWindow, req, timeout_s)
        return wire.open_window_response_from_pb(resp)

    def seal_window(self, sealing: wire.WindowSealing) -> wire.SealedWindow:
        """Seal a window: the signed seal document, held or not."""
        req = wire.seal_window_request_to_pb(sealing)
        resp = self._window_call(self.stub.SealWindow, req, sealing.timeout_s)
        return wire.seal_window_response_from_pb(resp)

    def forget_target(self, target: str) -> wire.TargetStatus:
        """Retire TARGET (operator role); UsageError (NOT_FOUND) when the verifier has none."""
        req = wire.forget_target_request_to_pb(target)
        return wire.forget_target_response_from_pb(self._call(self.stub.ForgetTarget, req))

    def audit(self, kind: str, query: str, limit: int = 0) -> AuditReply:
        """An audit query's answer (auditor or operator role), NOT yet checked: the caller
        checks it offline (``verifier.ledger.answers.check_answer``) before using it."""
        fn, msg = {
            "request": (self.audit_stub.AuditServed, pb.AuditServedRequest),
            "file": (self.audit_stub.AuditFile, pb.AuditFileRequest),
            "run": (self.audit_stub.AuditRun, pb.AuditRunRequest),
        }[kind]
        got = self._call(fn, msg(query=query, limit=limit)).answer
        return AuditReply(bytes(got.bundle), got.note, got.total, got.truncated)

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
class AuditReply:
    """What an audit RPC returned: the signed bundle and note, and the record counts (the
    counts are not signed: only what the bundle holds is checked)."""

    bundle: bytes
    note: str
    total: int
    truncated: bool
