"""The bindings' fast conversion (``wire.reports.span_fields``, ``request_id_fields``) accepts
exactly what the checked conversion accepts, with the same value, and hands everything else to
it, so a refusal still names its field: a valid binding and one mutation per check, each over
its bound by one, and each at its bound (which both accept)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.wire import WireError
from servewitness.wire import fields as F
from servewitness.wire import limits as L
from servewitness.wire import reports as R

TEXT = F.MAX_TEXT


def span() -> pb.RequestSpan:
    return pb.RequestSpan(
        process=pb.ProcessKey(boot_id="b", pid=7, start_ticks=70), internal_id="req-1",
        first_step=3, last_step=9, steps=5, tokens=40, first_unix=1.5e9, last_unix=1.5e9 + 2,
        manifest_first="sha256:" + "a" * 64, manifest_last="", runner="GPUModelRunner",
        hooks={"h1": 3, "h0": 0}, finished=True,
    )  # fmt: skip


def request_id() -> pb.RequestId:
    return pb.RequestId(
        process=pb.ProcessKey(boot_id="b", pid=6, start_ticks=60), internal_id="req-1",
        external_id="cmpl-1", unix=1.5e9,
    )  # fmt: skip


def setter(field: str, value: Any) -> Callable[[Any], None]:
    def apply(msg: Any) -> None:
        target = msg
        *path, last = field.split(".")
        for name in path:
            target = getattr(target, name)
        if last == "hooks":
            target.hooks.clear()
            target.hooks.update(value)
        else:
            setattr(target, last, value)

    return apply


SPAN_CASES: dict[str, Callable[[Any], None]] = {
    "valid": lambda m: None,
    "pid 0": setter("process.pid", 0),
    "pid 1": setter("process.pid", 1),
    "ticks -1": setter("process.start_ticks", -1),
    "first -1": setter("first_step", -1),
    "last before first": setter("last_step", 2),
    "last == first": setter("last_step", 3),
    "steps -1": setter("steps", -1),
    "tokens -1": setter("tokens", -1),
    "no internal id": setter("internal_id", ""),
    "internal id at limit": setter("internal_id", "x" * TEXT),
    "internal id over": setter("internal_id", "x" * (TEXT + 1)),
    "nan time": setter("first_unix", math.nan),
    "inf time": setter("last_unix", math.inf),
    "negative time": setter("first_unix", -1.0),
    "time at limit": setter("last_unix", float(F.MAX_UNIX_TIME)),
    "time over": setter("last_unix", float(F.MAX_UNIX_TIME + 1)),
    "manifest over": setter("manifest_first", "x" * (TEXT + 1)),
    "manifest_last over": setter("manifest_last", "x" * (TEXT + 1)),
    "runner over": setter("runner", "x" * (TEXT + 1)),
    "hook key over": setter("hooks", {"x" * (TEXT + 1): 1}),
    "hook count -1": setter("hooks", {"h": -1}),
    "hooks at limit": setter("hooks", {f"h{i}": i for i in range(L.HOOKS_PER_PROCESS.value)}),
    "hooks over": setter("hooks", {f"h{i}": i for i in range(L.HOOKS_PER_PROCESS.value + 1)}),
    "no hooks": setter("hooks", {}),
    "spec": lambda m: m.spec.CopyFrom(pb.RequestSpec(drafts=2, accepted_per_position=[1])),
}

SPAN_REFUSED = {c for c in SPAN_CASES if "over" in c or "-1" in c} | {
    "pid 0", "ticks -1", "last before first", "no internal id", "nan time", "inf time",
    "negative time",
}  # fmt: skip

ID_CASES: dict[str, Callable[[Any], None]] = {
    "valid": lambda m: None,
    "pid 0": setter("process.pid", 0),
    "no internal id": setter("internal_id", ""),
    "no external id": setter("external_id", ""),
    "external over": setter("external_id", "x" * (TEXT + 1)),
    "external at limit": setter("external_id", "x" * TEXT),
    "nan time": setter("unix", math.nan),
    "time over": setter("unix", float(F.MAX_UNIX_TIME + 1)),
}


def checked(convert: Callable[[Any, str], Any], msg: Any) -> Any:
    try:
        return convert(msg, "report.spans[0]")
    except WireError as e:
        return e


@pytest.mark.parametrize("case", SPAN_CASES)
def test_a_span_converts_fast_only_when_the_checked_path_accepts_it(case: str) -> None:
    """Fast and checked conversions agree: equal values, or None where the checked path
    refuses (it names the field) or handles what the fast one leaves to it (a spec)."""
    msg = span()
    SPAN_CASES[case](msg)
    slow = checked(R.span_checked, msg)
    fast = R.span_from_pb(msg, "x") if R.span_fields(msg) is not None else None
    refused = case in SPAN_REFUSED
    expect_fast = None if refused or case == "spec" else slow
    assert (fast, isinstance(slow, WireError)) == (expect_fast, refused)


@pytest.mark.parametrize("case", ID_CASES)
def test_a_request_id_converts_fast_only_when_the_checked_path_accepts_it(case: str) -> None:
    msg = request_id()
    ID_CASES[case](msg)
    slow = checked(R.request_id_checked, msg)
    fast = R.request_id_from_pb(msg, "x") if R.request_id_fields(msg) is not None else None
    refused = case not in ("valid", "external at limit")
    assert (fast, isinstance(slow, WireError)) == (None if refused else slow, refused)


def test_relaxed_reads_a_time_over_the_limit_through_the_checked_path() -> None:
    """Stored bytes are read under ``relaxed``: a time over ``unix_time`` is left by the fast
    path to the checked one, which accepts it there."""
    msg = span()
    msg.last_unix = float(F.MAX_UNIX_TIME + 1)
    rep = pb.TargetReport(agent_id="a", target="t", seq=1, sent_unix=1.0, spans=[msg])
    with F.relaxed():
        spans, _ = R._bindings_from_pb(rep, "report")
    assert (R.span_fields(msg), spans[0].last_unix) == (None, float(F.MAX_UNIX_TIME + 1))
