"""The request and response envelopes of ``VerifierService``: an agent's Hello and Report,
a client's RegisterRun, GetRunStatus and ListRuns. The servicer, the agent and the client
build and read every message through these, so the checks run in production.

The domain values of the envelopes that ``servewitness.model`` has no type for (an agent's hello,
an acknowledgement, a run's registration) are the small frozen dataclasses defined here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote, unquote

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import RunVerdict, TargetReport, Verdict
from servewitness.wire import fields as F
from servewitness.wire import limits as L
from servewitness.wire.reports import report_from_pb, report_to_pb
from servewitness.wire.verdicts import (
    run_verdict_from_pb,
    set_run_verdict,
    verdict_from_pb,
    verdict_to_pb,
)


@dataclass(frozen=True)
class AgentHello:
    agent_id: str
    targets: tuple[str, ...]  # the targets this agent reports on


@dataclass(frozen=True)
class HelloReply:
    nonce: str  # to echo in the next report
    report_interval_s: float
    last_seq: int = 0  # highest sequence number the verifier stored for this agent


@dataclass(frozen=True)
class ReportAck:
    accepted: bool
    seq: int  # the seq acknowledged
    nonce: str  # the nonce to echo in the next report
    need_manifests: tuple[str, ...] = ()  # digests whose files the agent must resend
    next_report_in_s: float = 0.0  # the verifier's pace (0: the agent's own interval)


@dataclass(frozen=True)
class RunRegistration:
    name: str
    policy_toml: str
    source: str = ""  # where the policy came from (a path or a description)


@dataclass(frozen=True)
class RegisteredRun:
    name: str
    policy_digest: str
    created_unix: float


@dataclass(frozen=True)
class RunSummary:
    name: str
    policy_digest: str
    created_unix: float
    verdict: Verdict  # latest verdict (PENDING until evidence arrives)
    unsafe_flags: tuple[str, ...] = ()  # the policy's unsafe_* settings (policy.unsafe_flags)


AGENT_ID_HEADER = "x-verifier-agent-id"
TARGET_HEADER = "x-verifier-target"


def agent_metadata(agent_id: str, targets: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """The invocation metadata an agent sends with ``Hello`` and ``Report``: who it is and
    which targets it reports for. The verifier authorizes these claims before it reads the
    request (``servewitness.server.ingress``), then requires the request to say the same. Values
    are percent-encoded UTF-8 (gRPC metadata is printable ASCII): :func:`metadata_value`
    reads one back."""
    pairs = [(AGENT_ID_HEADER, agent_id), *((TARGET_HEADER, t) for t in targets)]
    return tuple((k, quote(v, safe=_SAFE)) for k, v in pairs)


_SAFE = "/:@+,;=!*'()"


def metadata_value(value: str) -> str:
    """A value of :func:`agent_metadata`, decoded; ValueError when it is not ASCII or its
    escapes are not UTF-8."""
    if not value.isascii():
        raise ValueError("not ASCII")
    return unquote(value, errors="strict")


def hello_request_to_pb(hello: AgentHello) -> pb.HelloRequest:
    return pb.HelloRequest(agent_id=hello.agent_id, targets=hello.targets)


def hello_request_from_pb(msg: pb.HelloRequest) -> AgentHello:
    L.at_most(L.TARGETS_PER_HELLO, len(msg.targets), "hello.targets")
    targets = F.texts(msg.targets, "hello.targets")
    for i, t in enumerate(targets):
        L.ident(t, f"hello.targets[{i}]")
    return AgentHello(
        agent_id=L.ident(F.required(msg.agent_id, "hello.agent_id"), "hello.agent_id"),
        targets=targets,
    )


def hello_response_to_pb(reply: HelloReply) -> pb.HelloResponse:
    return pb.HelloResponse(
        nonce=reply.nonce, report_interval_s=reply.report_interval_s, last_seq=reply.last_seq
    )


def hello_response_from_pb(msg: pb.HelloResponse) -> HelloReply:
    interval = msg.report_interval_s
    if not (math.isfinite(interval) and interval > 0):
        F.fail("hello_response.report_interval_s", f"must be a positive duration, got {interval}")
    return HelloReply(
        nonce=F.required(msg.nonce, "hello_response.nonce"),
        report_interval_s=interval,
        last_seq=F.count(msg.last_seq, "hello_response.last_seq"),
    )


def report_request_to_pb(report: TargetReport) -> pb.ReportRequest:
    return pb.ReportRequest(report=report_to_pb(report))


def report_request_from_pb(msg: pb.ReportRequest, *, bindings: bool = True) -> TargetReport:
    """The request's report (``report_from_pb``; BINDINGS as there)."""
    if not msg.HasField("report"):
        F.fail("report", "required, but absent")
    return report_from_pb(msg.report, bindings=bindings)


def report_response_to_pb(ack: ReportAck) -> pb.ReportResponse:
    return pb.ReportResponse(
        accepted=ack.accepted,
        seq=ack.seq,
        nonce=ack.nonce,
        need_manifests=ack.need_manifests,
        next_report_in_s=ack.next_report_in_s,
    )


def report_response_from_pb(msg: pb.ReportResponse) -> ReportAck:
    at = "report_response"
    return ReportAck(
        accepted=msg.accepted,
        seq=F.count(msg.seq, f"{at}.seq"),
        nonce=F.required(msg.nonce, f"{at}.nonce"),
        need_manifests=tuple(
            F.digest(d, f"{at}.need_manifests[{i}]") for i, d in enumerate(msg.need_manifests)
        ),
        next_report_in_s=_pace(msg.next_report_in_s, f"{at}.next_report_in_s"),
    )


def _pace(value: float, at: str) -> float:
    if not (math.isfinite(value) and value >= 0):
        F.fail(at, f"must be a duration of 0 or more, got {value}")
    return value


def register_run_request_to_pb(reg: RunRegistration) -> pb.RegisterRunRequest:
    return pb.RegisterRunRequest(name=reg.name, policy_toml=reg.policy_toml, source=reg.source)


def register_run_request_from_pb(msg: pb.RegisterRunRequest) -> RunRegistration:
    # An empty or malformed policy is the policy loader's to name (with its line and key).
    policy_bytes = len(msg.policy_toml.encode())
    L.at_most(L.POLICY_BYTES, policy_bytes, "register_run.policy_toml")
    return RunRegistration(
        name=L.ident(F.required(msg.name, "register_run.name"), "register_run.name"),
        policy_toml=msg.policy_toml,
        source=F.text(msg.source, "register_run.source"),
    )


def register_run_response_to_pb(run: RegisteredRun) -> pb.RegisterRunResponse:
    return pb.RegisterRunResponse(
        name=run.name, policy_digest=run.policy_digest, created_unix=run.created_unix
    )


def register_run_response_from_pb(msg: pb.RegisterRunResponse) -> RegisteredRun:
    at = "register_run_response"
    return RegisteredRun(
        name=F.required(msg.name, f"{at}.name"),
        policy_digest=F.required(msg.policy_digest, f"{at}.policy_digest"),
        created_unix=F.finite_time(msg.created_unix, f"{at}.created_unix"),
    )


def get_run_status_request_to_pb(name: str) -> pb.GetRunStatusRequest:
    return pb.GetRunStatusRequest(name=name)


def get_run_status_request_from_pb(msg: pb.GetRunStatusRequest) -> str:
    return L.ident(F.required(msg.name, "get_run_status.name"), "get_run_status.name")


def get_run_status_response_to_pb(verdict: RunVerdict) -> pb.GetRunStatusResponse:
    msg = pb.GetRunStatusResponse()
    msg.verdict.SetInParent()  # present even if every field of it were a default
    set_run_verdict(msg.verdict, verdict)  # in place: never a copy of the whole verdict
    return msg


def get_run_status_response_from_pb(msg: pb.GetRunStatusResponse) -> RunVerdict:
    if not msg.HasField("verdict"):
        F.fail("get_run_status_response.verdict", "required, but absent")
    return run_verdict_from_pb(msg.verdict, "get_run_status_response.verdict")


def _run_summary_to_pb(run: RunSummary) -> pb.RunSummary:
    return pb.RunSummary(
        name=run.name,
        policy_digest=run.policy_digest,
        created_unix=run.created_unix,
        verdict=verdict_to_pb(run.verdict),
        unsafe_flags=run.unsafe_flags,
    )


def _run_summary_from_pb(msg: pb.RunSummary, at: str = "run_summary") -> RunSummary:
    return RunSummary(
        name=F.required(msg.name, f"{at}.name"),
        policy_digest=F.required(msg.policy_digest, f"{at}.policy_digest"),
        created_unix=F.finite_time(msg.created_unix, f"{at}.created_unix"),
        verdict=verdict_from_pb(msg.verdict, f"{at}.verdict"),
        unsafe_flags=tuple(msg.unsafe_flags),
    )


def list_runs_response_to_pb(runs: Iterable[RunSummary]) -> pb.ListRunsResponse:
    return pb.ListRunsResponse(runs=[_run_summary_to_pb(r) for r in runs])


def list_runs_response_from_pb(msg: pb.ListRunsResponse) -> tuple[RunSummary, ...]:
    return tuple(
        _run_summary_from_pb(r, f"list_runs_response.runs[{i}]") for i, r in enumerate(msg.runs)
    )
