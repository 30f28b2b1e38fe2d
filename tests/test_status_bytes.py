"""A status answer assembled as bytes from kept encodings (``wire.run_status_bytes``), the
history's detail made from kept entries (``server.history_detail``), a verdict's copy at
another time (``TargetVerdict.at``) and a snapshot's container ids made once: each gives
exactly what the code it replaced gave, for verdicts made anew, kept, stale and changed."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import (
    Finding,
    HookCount,
    RunVerdict,
    Severity,
    TargetReport,
    TargetVerdict,
    Verdict,
)
from servewitness.server import history_detail
from servewitness.server.history_detail import verdict_detail
from servewitness.server.store import Store
from tests.helpers import agent_stub, as_weak_as_needed, running_verifier
from tests.test_policy_engine import HOOK_V1, api, engine, snap, worker

_text = st.text(max_size=12)
_times = st.floats(allow_nan=False, allow_infinity=False, width=64)
_findings = st.builds(
    Finding,
    id=st.sampled_from(["evidence.stale", "liveness.hook.not_firing", "evidence.unauthenticated"]),
    severity=st.sampled_from(list(Severity)),
    message=_text,
    target=_text,
    context=st.dictionaries(_text, st.integers(-5, 5) | _text, max_size=3),
)
_hooks = st.builds(
    HookCount,
    name=_text,
    pid=st.integers(1, 2**31),
    role=_text,
    rank=st.none() | st.integers(0, 8),
    fired=st.integers(0, 2**40),
    fired_productive=st.integers(0, 9),
    productive_steps=st.integers(0, 9),
    total_steps=st.integers(0, 9),
)
_targets = st.builds(
    TargetVerdict,
    target=st.text(min_size=1, max_size=8),
    verdict=st.sampled_from(list(Verdict)),
    findings=st.lists(_findings, max_size=3).map(tuple),
    evaluated_unix=_times,
    report_unix=st.none() | _times,
    hooks=st.lists(_hooks, max_size=2).map(tuple),
)


def _naive_detail(v: RunVerdict) -> dict[str, object]:
    """The detail as it was made before entries were kept (c39d2bbf's ``verdict_detail``)."""
    return {
        "policy_digest": v.policy_digest,
        "run": [f.id for f in v.findings],
        "targets": {
            t.target: [t.verdict.value, sorted(f.id for f in t.findings)] for t in v.targets
        },
    }


def _parsed(rv: RunVerdict) -> pb.GetRunStatusResponse:
    return pb.GetRunStatusResponse.FromString(wire.run_status_bytes(rv))


@settings(max_examples=300, deadline=None)
@given(
    targets=st.lists(_targets, max_size=6, unique_by=lambda t: t.target),
    findings=st.lists(_findings, max_size=2).map(tuple),
    verdict=st.sampled_from(list(Verdict)),
    first=_times,
    later=_times,
)
def test_the_encoded_answer_parses_to_the_message_made_the_old_way(
    targets: list[TargetVerdict],
    findings: tuple[Finding, ...],
    verdict: Verdict,
    first: float,
    later: float,
) -> None:
    """Made anew (the first answer), then from kept encodings with another time (the second:
    what a fresh target's verdict is on the next status call), then with one target's
    findings changed (a new report): each parses to the message built field by field, and
    its detail is the one made without kept entries."""
    rv = RunVerdict("r", "sha256:" + "0" * 64, verdict, tuple(targets), findings, first)
    again = dataclasses.replace(
        rv, targets=tuple(t.at(later) for t in targets), evaluated_unix=later
    )
    for v in (rv, again):
        assert _parsed(v) == wire.get_run_status_response_to_pb(v)
        got = _parsed(v).verdict
        assert [t.evaluated_unix for t in got.targets] == [t.evaluated_unix for t in v.targets]
        assert json.dumps(verdict_detail(v), sort_keys=True) == json.dumps(
            _naive_detail(v), sort_keys=True
        )
    if targets and findings:
        changed = dataclasses.replace(targets[0], findings=(*targets[0].findings, findings[0]))
        v = dataclasses.replace(again, targets=(changed, *again.targets[1:]))
        assert _parsed(v) == wire.get_run_status_response_to_pb(v)
        assert json.dumps(verdict_detail(v), sort_keys=True) == json.dumps(
            _naive_detail(v), sort_keys=True
        )


def test_a_kept_verdicts_answer_carries_this_calls_time_not_the_first() -> None:
    """The negative control of appending the time: a kept encoding was made at the first
    call's time; the answer at a later time must say the later one for every target."""
    hook = HookCount("h", 7, "worker", None, 3, 3, 3, 3)
    found = (Finding("liveness.hook.not_firing", Severity.ERROR, "m", "t"),)
    tv = TargetVerdict("t", Verdict.FAIL, found, 100.0, 99.0, (hook,))
    rv = RunVerdict("r", "d", Verdict.FAIL, (tv,), (), 100.0)
    assert _parsed(rv).verdict.targets[0].evaluated_unix == 100.0
    later = dataclasses.replace(rv, targets=(tv.at(250.5),), evaluated_unix=250.5)
    body = wire.run_status_bytes(later)
    assert _parsed(later).verdict.targets[0].evaluated_unix == 250.5
    assert body.count(b"liveness.hook.not_firing") == 1  # the kept encoding, once


def test_a_verdict_at_another_time_is_replace_field_for_field() -> None:
    """``TargetVerdict.at`` builds the copy itself: a field added to the class and not to it
    would be lost silently, so every field is compared with ``dataclasses.replace``'s."""
    hook = HookCount("h", 7, "worker", 0, 3, 3, 3, 3)
    tv = TargetVerdict("t", Verdict.STALE, (Finding("x", Severity.INFO, "m"),), 1.0, 2.0, (hook,))
    assert tv.at(5.0) == dataclasses.replace(tv, evaluated_unix=5.0)
    names = {f.name for f in dataclasses.fields(TargetVerdict)}
    assert names == {"target", "verdict", "findings", "evaluated_unix", "report_unix", "hooks"}


def test_a_snapshots_container_ids_are_its_own_then_its_processes_each_once() -> None:
    s = dataclasses.replace(
        snap(
            dataclasses.replace(api(), container_id="c2"),
            dataclasses.replace(engine(), container_id="c1"),
            worker(),
        ),
        container_ids=("c1", "c0"),
    )
    assert s.every_container_id == ("c1", "c0", "c2")
    assert s.every_container_id is s.every_container_id  # made once


def test_the_history_records_each_change_and_only_changes(tmp_path: Path) -> None:
    """``Store.record_verdict`` keeps the last detail's JSON: an equal detail (shared entries
    or not) is not recorded again, and a changed one, even to a detail seen two changes ago,
    is (A, B, A: three records)."""
    s = Store(tmp_path / "db.sqlite3")
    a = {"policy_digest": "d", "run": [], "targets": {"t": ("PASS", ())}}
    b = {"policy_digest": "d", "run": [], "targets": {"t": ("FAIL", ("liveness.x",))}}
    assert s.record_verdict("r", "PASS", a)
    assert not s.record_verdict("r", "PASS", dict(a))  # equal, another object
    assert s.record_verdict("r", "FAIL", b)
    assert s.record_verdict("r", "PASS", a)
    assert not s.record_verdict("r", "PASS", a)
    assert [(v, d["targets"]["t"][0]) for _, v, d in s.verdict_history("r")] == [
        ("PASS", "PASS"),
        ("FAIL", "FAIL"),
        ("PASS", "PASS"),
    ]
    # another store on the same database changed it meanwhile: this one's memo of A must not
    # hide its change back to A
    other = Store(tmp_path / "db.sqlite3")
    assert other.record_verdict("r", "FAIL", b)
    assert s.record_verdict("r", "PASS", a)
    assert len(s.verdict_history("r")) == 5


def test_the_detail_kept_by_findings_is_remade_when_they_change() -> None:
    """Kept by the findings tuple's identity: a new tuple (a new report) with other ids gets
    its own entry, and clearing the table (full) loses nothing but time."""
    one = (Finding("b.x", Severity.ERROR, "m"), Finding("a.y", Severity.INFO, "m"))
    tv = TargetVerdict("t", Verdict.FAIL, one, 1.0, None)
    rv = RunVerdict("r", "d", Verdict.FAIL, (tv,), (), 1.0)
    assert verdict_detail(rv)["targets"]["t"] == ("FAIL", ("a.y", "b.x"))
    other = (Finding("c.z", Severity.ERROR, "m"),)
    rv2 = dataclasses.replace(rv, targets=(dataclasses.replace(tv, findings=other),))
    assert verdict_detail(rv2)["targets"]["t"] == ("FAIL", ("c.z",))
    history_detail._kept.clear()
    assert verdict_detail(rv)["targets"]["t"] == ("FAIL", ("a.y", "b.x"))


POLICY = as_weak_as_needed(f"version = 1\n{HOOK_V1}[evidence]\nfreshness_s = 600\n")


def test_a_status_call_over_grpc_answers_what_the_evaluator_says(tmp_path: Path) -> None:
    """Through a real server and a real client: the answer the servicer assembles as bytes
    decodes, with the generated stub, to the verdict the evaluator gives (times aside), twice
    (the second from kept encodings)."""
    addr = f"unix:{tmp_path}/v.sock"
    with (
        running_verifier(addr, tmp_path / "v.sqlite3") as server,
        grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch,
    ):
        stub = agent_stub(ch)
        stub.RegisterRun(pb.RegisterRunRequest(name="r", policy_toml=POLICY))
        for i in range(3):
            agent, target = f"a{i}", f"t{i}"
            hello = stub.Hello(pb.HelloRequest(agent_id=agent, targets=[target]))
            report = TargetReport(
                agent, target, 1, hello.nonce, time.time(), (api(), engine(), worker())
            )
            ack = stub.Report(pb.ReportRequest(report=wire.report_to_pb(report)))
            assert ack.accepted
        run = server.store.get_run("r")
        for _ in range(2):
            got = wire.get_run_status_response_from_pb(
                stub.GetRunStatus(pb.GetRunStatusRequest(name="r"))
            )
            want = server.service.evaluator.run_verdict(run, time.time())
            assert _untimed(got) == _untimed(want)
            assert [t.target for t in got.targets] == ["t0", "t1", "t2"]


def _untimed(rv: RunVerdict) -> RunVerdict:
    return dataclasses.replace(rv, evaluated_unix=0.0, targets=tuple(t.at(0.0) for t in rv.targets))
