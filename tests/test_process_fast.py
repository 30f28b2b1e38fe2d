"""A process's fast conversion (``wire.process_fast.process_fast``, taken for nearly every process
of every report) against the checked one it stands in for: on any message, the fast path
gives the checked path's answer, or steps aside (None) for the checked path to give it; it
never accepts what the checked path refuses. Generated hostile processes (tests/
fuzz_reports.py), under the wire's limits and relaxed as for stored bytes, and the fullest
process the wire carries, which must take the fast path (else it would be untested)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import ProcessReport
from servewitness.wire import fields as F
from servewitness.wire import limits as L
from servewitness.wire.process import _process_checked, process_from_pb
from servewitness.wire.process_fast import process_fast
from tests import fuzz_reports as fz
from tests.test_wire import full_report

AT = "report.processes[0]"


def answers(msg: pb.ProcessReport) -> tuple[ProcessReport | str | None, ProcessReport | str]:
    """(fast, checked): each a conversion, or its error's text; fast may be None."""
    try:
        fast: ProcessReport | str | None = process_fast(msg, AT)
    except F.WireError as e:
        fast = str(e)
    try:
        checked: ProcessReport | str = _process_checked(msg, AT)
    except F.WireError as e:
        checked = str(e)
    return fast, checked


def agree(msg: pb.ProcessReport) -> None:
    fast, checked = answers(msg)
    if isinstance(checked, str):  # refused: the fast path refuses too, or steps aside
        assert fast is None or fast == checked, (fast, checked)
    else:
        assert fast is None or fast == checked, (fast, checked)


@settings(max_examples=400, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(msg=st.one_of(fz.process(fz.VALID), fz.process(fz.ANY)), relaxed=st.booleans())
def test_the_fast_path_gives_the_checked_answer_or_steps_aside(
    msg: pb.ProcessReport, relaxed: bool
) -> None:
    if relaxed:
        with L.relaxed():
            agree(msg)
    else:
        agree(msg)


def fullest_processes() -> list[pb.ProcessReport]:
    """tests/test_wire.py's full report's processes as an agent sends them after its first
    report: every part filled, files left out (the digest only)."""
    report = full_report()
    one = [dataclasses.replace(report, processes=(dataclasses.replace(p, files=None),))
           for p in report.processes]  # fmt: skip
    return [wire.report_to_pb(r).processes[0] for r in one]


def test_full_processes_take_the_fast_path_and_convert_as_the_checked_path_does() -> None:
    procs = fullest_processes()
    assert any(p.HasField("provenance") and p.code and p.native_mappings for p in procs)
    for msg in procs:
        fast, checked = answers(msg)
        assert isinstance(checked, ProcessReport)
        if msg.steps.HasField("spec"):
            assert fast is None  # speculation: the checked path, by design
        else:
            assert fast == checked


# One field at a time made invalid: the fast path must not be the one that accepts it.
BREAKS = [
    ("key.pid", lambda m: setattr(m.key, "pid", 0)),
    ("key.start_ticks", lambda m: setattr(m.key, "start_ticks", -1)),
    ("ns_pid", lambda m: setattr(m, "ns_pid", -1)),
    ("ppid", lambda m: setattr(m, "ppid", -3)),
    ("start_time", lambda m: setattr(m, "start_time", float("nan"))),
    ("start_time", lambda m: setattr(m, "start_time", -1.0)),
    ("role", lambda m: setattr(m, "role", "")),
    ("rank", lambda m: setattr(m, "rank", -1)),
    ("runner.cls", lambda m: setattr(m.runner, "cls", "")),
    ("runner.sha256", lambda m: setattr(m.runner, "sha256", "A" * 64)),
    ("steps.total", lambda m: setattr(m.steps, "total", -1)),
    ("steps.raised", lambda m: setattr(m.steps, "raised", -1)),
    ("hooks[0].name", lambda m: setattr(m.hooks[0], "name", "")),
    ("hooks[0].fired", lambda m: setattr(m.hooks[0], "fired", -1)),
    ("hooks[0].first_step", lambda m: setattr(m.hooks[0], "first_step", -2)),
    ("hooks[0].device_base", lambda m: setattr(m.hooks[0], "device_base", -2)),
    ("manifest_digest", lambda m: setattr(m, "manifest_digest", "sha256:XYZ")),
    ("runner_file_sha256_now", lambda m: setattr(m, "runner_file_sha256_now", "0" * 63)),
    ("roles", lambda m: m.roles.append("")),
    ("hashed_after", lambda m: m.hashed_after.extend(["/x"] * (m.hashed_after_count + 1))),
    ("hashed_after_count", lambda m: setattr(m, "hashed_after_count", -1)),
    ("files", lambda m: m.files.add(path="/f", sha256="0" * 64)),
    ("stack_witness", lambda m: setattr(m.stack_witness, "runner_file_hits", 10**9)),
    ("evidence_problems", lambda m: m.evidence_problems.add(id="no.such.problem")),
]


@pytest.mark.parametrize(("field", "brk"), BREAKS, ids=[f for f, _ in BREAKS])
def test_a_process_with_one_invalid_field_is_refused_naming_it(field: str, brk: object) -> None:
    (msg,) = [p for p in fullest_processes() if not p.steps.HasField("spec")][:1]
    assert process_fast(msg, AT) is not None  # the intact process takes the fast path
    assert callable(brk)
    brk(msg)
    fast, checked = answers(msg)
    assert isinstance(checked, str), f"the checked path accepted a broken {field}"
    assert fast is None or fast == checked
    with pytest.raises(F.WireError) as got:
        process_from_pb(msg, AT)
    assert str(got.value) == checked
