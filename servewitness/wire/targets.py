"""Targets as the verifier lists and retires them (``ListTargets``, ``ForgetTarget``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.wire import fields as F
from servewitness.wire import limits as L

TARGET_STATES = ("live", "stale", "expired")


@dataclass(frozen=True)
class TargetStatus:
    """One target: its latest report, how old it is on the verifier's age clock (None:
    unknown, stored before a restart), who sent it and whether it counts."""

    target: str
    last_report_unix: float  # the verifier's wall clock at receipt (display)
    age_s: float | None
    agent_id: str
    authenticated_as: str | None
    state: str  # TARGET_STATES


def _status_to_pb(t: TargetStatus) -> pb.TargetState:
    return pb.TargetState(
        target=t.target,
        last_report_unix=t.last_report_unix,
        age_s=t.age_s,
        agent_id=t.agent_id,
        authenticated_as=t.authenticated_as,
        state=t.state,
    )


def _status_from_pb(msg: pb.TargetState, at: str) -> TargetStatus:
    if msg.state not in TARGET_STATES:
        F.fail(f"{at}.state", f"{msg.state!r} is not one of {', '.join(TARGET_STATES)}")
    age = msg.age_s if msg.HasField("age_s") else None
    if age is not None and not math.isfinite(age):
        F.fail(f"{at}.age_s", f"must be finite, not {age}")
    return TargetStatus(
        target=F.required(msg.target, f"{at}.target"),
        last_report_unix=F.finite_time(msg.last_report_unix, f"{at}.last_report_unix"),
        age_s=age,
        agent_id=msg.agent_id,
        authenticated_as=msg.authenticated_as if msg.HasField("authenticated_as") else None,
        state=msg.state,
    )


def list_targets_response_to_pb(targets: Iterable[TargetStatus]) -> pb.ListTargetsResponse:
    return pb.ListTargetsResponse(targets=[_status_to_pb(t) for t in targets])


def list_targets_response_from_pb(msg: pb.ListTargetsResponse) -> tuple[TargetStatus, ...]:
    return tuple(
        _status_from_pb(t, f"list_targets_response.targets[{i}]") for i, t in enumerate(msg.targets)
    )


def forget_target_request_to_pb(target: str) -> pb.ForgetTargetRequest:
    return pb.ForgetTargetRequest(target=target)


def forget_target_request_from_pb(msg: pb.ForgetTargetRequest) -> str:
    at = "forget_target_request.target"
    return L.ident(F.required(msg.target, at), at)


def forget_target_response_to_pb(t: TargetStatus) -> pb.ForgetTargetResponse:
    return pb.ForgetTargetResponse(forgotten=_status_to_pb(t))


def forget_target_response_from_pb(msg: pb.ForgetTargetResponse) -> TargetStatus:
    if not msg.HasField("forgotten"):
        F.fail("forget_target_response.forgotten", "required, but absent")
    return _status_from_pb(msg.forgotten, "forget_target_response.forgotten")
