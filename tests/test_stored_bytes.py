"""What a store keeps of a report (``wire.stored_bytes``): cut from the message as it arrived,
it must read back as the conversion the verifier judged, stripped of files and bindings, so
that a restarted verifier, a follower on another replica and an auditor's export see exactly
the evidence the receiving verifier saw. Checked on the fullest report the wire carries, on
generated hostile messages (tests/fuzz_reports.py) and on one carrying fields this verifier
does not know."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import RequestId, TargetReport
from tests import fuzz_reports as fz
from tests.test_wire import full_report


def stripped(report: TargetReport) -> TargetReport:
    """REPORT as the verifier notes it: no files, no bindings (service._ingest)."""
    return dataclasses.replace(
        report,
        processes=tuple(dataclasses.replace(p, files=None) for p in report.processes),
        spans=(),
        request_ids=(),
    )


def fullest() -> TargetReport:
    """tests/test_wire.py's full report, with a request id beside its spans."""
    report = full_report()
    rid = RequestId(report.processes[0].key, "cmpl-a-0-1b2c", "client-7", 1_764_400_000.5)
    return dataclasses.replace(report, request_ids=(rid,))


def test_our_agents_reports_are_stored_byte_for_byte_as_before() -> None:
    """For a report this project's agent encodes (every field set, a manifest's files and
    bindings included), the bytes kept are the stripped report's canonical encoding: the
    same bytes, so the same ledger digests, as before the cut."""
    report = fullest()
    assert report.spans and report.request_ids and any(p.files for p in report.processes)
    msg = wire.report_to_pb(report)
    kept = wire.stored_bytes(msg)
    assert kept == wire.report_to_bytes(stripped(report))
    assert wire.report_from_bytes(kept) == stripped(wire.report_from_pb(msg))


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(msg=fz.target_report("agent-x", "t"))
def test_any_report_the_verifier_accepts_reads_back_as_it_was_judged(msg: pb.TargetReport) -> None:
    try:
        judged = wire.report_from_pb(msg)
    except wire.WireError:
        return  # refused at the door: never stored
    assert wire.report_from_bytes(wire.stored_bytes(msg)) == stripped(judged)


@pytest.mark.parametrize("files", [True, False], ids=["with a manifest", "digest only"])
def test_fields_this_verifier_does_not_know_are_not_kept(files: bool) -> None:
    """An agent (or an attacker with an agent's credentials) adds fields the schema does not
    have, at the top and inside a process: they were never judged, so they are not stored
    (a store holds evidence, not whatever rode along). Both ways a body is cut: a report
    carrying a manifest's files (copied field by field) and one without (copied whole)."""
    report = fullest()
    if not files:
        report = stripped(report)
    assert any(p.files for p in report.processes) == files
    msg = wire.report_to_pb(report)
    smuggled = b"smuggled: never judged"
    tag = (9999 << 3) | 2  # field 9999, length-delimited
    extra = bytes([tag & 0x7F | 0x80, (tag >> 7) & 0x7F | 0x80, tag >> 14, len(smuggled)])
    extra += smuggled
    msg.MergeFromString(extra)
    proc = pb.ProcessReport()
    proc.CopyFrom(msg.processes[0])
    proc.MergeFromString(extra)
    msg.processes[0].CopyFrom(proc)
    assert smuggled in msg.SerializeToString()  # carried by the message as it arrived
    kept = wire.stored_bytes(msg)
    assert smuggled not in kept
    assert wire.report_from_bytes(kept) == stripped(wire.report_from_pb(msg))


@given(n=st.integers(min_value=0, max_value=3))
@settings(max_examples=4, deadline=None, database=None, derandomize=True)
def test_the_message_itself_is_left_as_it_came(n: int) -> None:
    """The cut is made on a copy: the caller's message (still read after storing: its
    bindings) keeps its files, bindings and fields."""
    report = fullest()
    report = dataclasses.replace(report, spans=report.spans[: n + 1])
    msg = wire.report_to_pb(report)
    before = msg.SerializeToString(deterministic=True)
    wire.stored_bytes(msg)
    assert msg.SerializeToString(deterministic=True) == before
