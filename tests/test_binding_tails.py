"""A report's bindings made the store's rows straight from the message
(``server.binding_rows.tails_from_pb``, what ``VerifierService.Report`` stores) against the rows of
the converted objects (``tails_of(report_from_pb(...))``, what it stored before): the same rows,
so the same ledger digests and request counts, and the same refusal, naming the same field,
for the fullest report the wire carries, generated hostile messages, one broken field at a
time and a time over the limit read under ``relaxed``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.ledger import bindings
from servewitness.model import RequestId, RequestSpec
from servewitness.server import binding_rows, index
from servewitness.server.store import Store, StoredReport
from servewitness.wire import fields as F
from servewitness.wire import limits as L
from servewitness.wire import reports as R
from tests import fuzz_reports as fz
from tests.test_stored_bytes import fullest


def both(msg: pb.TargetReport) -> tuple[object, object]:
    """(rows from the message, rows from the objects), or the WireError's text for each."""
    try:
        fast: object = binding_rows.tails_from_pb(msg)
    except wire.WireError as e:
        fast = str(e)
    try:
        report = wire.report_from_pb(msg)
        slow: object = bindings.tails_of(report.spans, report.request_ids)
    except wire.WireError as e:
        slow = str(e)
    return fast, slow


def test_the_fullest_report_gives_the_same_rows_digests_and_counts() -> None:
    report = fullest()
    spec = RequestSpec(2, 6, 4, (3, 1, 0), 6)
    report = dataclasses.replace(
        report, spans=(*report.spans, dataclasses.replace(report.spans[0], spec=spec))
    )
    msg = wire.report_to_pb(report)
    fast, slow = both(msg)
    assert isinstance(fast, bindings.Tails) and fast == slow
    assert fast.spans[-1][-1] is not None  # the spec's span: the checked path's row
    a = bindings.prepare_tails("ref", "t", fast, 5.0)
    b = bindings.prepare_batch("ref", "t", report.spans, report.request_ids, 5.0)
    assert a == b
    assert index.request_counts("t", fast.spans) == index.request_counts(
        "t", bindings.tails_of(report.spans, ()).spans
    )


@settings(max_examples=200, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(msg=fz.target_report("agent-x", "t"))
def test_any_message_gives_the_rows_or_the_refusal_of_the_objects(msg: pb.TargetReport) -> None:
    """Generated reports, most of them with broken bindings: where the converted report is
    refused for its bindings, the rows are refused with the same words; where it is not, the
    rows are the objects' rows. (A refusal elsewhere in the report is not the rows': the
    servicer converts the report first.)"""
    try:
        report = wire.report_from_pb(msg, bindings=False)
    except wire.WireError:
        return
    fast, slow = both(msg)
    assert fast == slow, (fast, slow, report.target)


def _span_msg() -> pb.TargetReport:
    """The fullest report with no speculation counts: every binding of it takes the fast
    path (checked), so a broken field below is the fast path's to refuse."""
    msg = wire.report_to_pb(fullest())
    for s in msg.spans:
        s.ClearField("spec")
    assert all(R.span_fields(s) is not None for s in msg.spans)
    assert all(R.request_id_fields(r) is not None for r in msg.request_ids)
    return msg


BREAKS: dict[str, Callable[[pb.TargetReport], None]] = {
    "first_step": lambda m: setattr(m.spans[0], "first_step", -1),
    "last_step before first": lambda m: setattr(m.spans[0], "last_step", m.spans[0].first_step - 1),
    "steps": lambda m: setattr(m.spans[0], "steps", -1),
    "tokens": lambda m: setattr(m.spans[0], "tokens", -1),
    "internal_id empty": lambda m: setattr(m.spans[0], "internal_id", ""),
    "internal_id long": lambda m: setattr(m.spans[0], "internal_id", "x" * (F.MAX_TEXT + 1)),
    "first_unix nan": lambda m: setattr(m.spans[0], "first_unix", float("nan")),
    "last_unix inf": lambda m: setattr(m.spans[0], "last_unix", float("inf")),
    "manifest_first long": lambda m: setattr(m.spans[0], "manifest_first", "m" * (F.MAX_TEXT + 1)),
    "runner long": lambda m: setattr(m.spans[0], "runner", "r" * (F.MAX_TEXT + 1)),
    "hook negative": lambda m: m.spans[0].hooks.__setitem__("h", -1),
    "hook name long": lambda m: m.spans[0].hooks.__setitem__("h" * (F.MAX_TEXT + 1), 1),
    "pid": lambda m: setattr(m.spans[0].process, "pid", 0),
    "start_ticks": lambda m: setattr(m.spans[0].process, "start_ticks", -1),
    "id internal empty": lambda m: setattr(m.request_ids[0], "internal_id", ""),
    "id external long": lambda m: setattr(m.request_ids[0], "external_id", "e" * (F.MAX_TEXT + 1)),
    "id unix negative": lambda m: setattr(m.request_ids[0], "unix", -1.0),
    "id pid": lambda m: setattr(m.request_ids[0].process, "pid", -3),
    "too many": lambda m: m.request_ids.extend(
        [m.request_ids[0]] * (L.BINDINGS_PER_REPORT.value + 1)
    ),
}


@pytest.mark.parametrize("case", BREAKS)
def test_one_broken_field_is_refused_as_the_objects_refuse_it(case: str) -> None:
    msg = _span_msg()
    assert msg.spans and msg.request_ids
    BREAKS[case](msg)
    fast, slow = both(msg)
    assert isinstance(slow, str), f"{case}: the checked path accepts it"
    assert fast == slow


def test_a_time_over_the_limit_is_read_under_relaxed_as_the_objects_read_it() -> None:
    msg = _span_msg()
    msg.spans[0].last_unix = float(F.MAX_UNIX_TIME + 1)
    with F.relaxed():
        fast, slow = both(msg)
    assert isinstance(fast, bindings.Tails) and fast == slow
    assert fast.spans[0][9] == float(F.MAX_UNIX_TIME + 1)


def test_a_report_stored_from_tails_is_the_report_stored_from_objects(tmp_path: Path) -> None:
    """The store's rows, batch digests and the ledger entry they make are the same whichever
    way the bindings came: two stores, one report each way, the same ledger subjects."""
    report = fullest()
    rid = RequestId(report.processes[0].key, "cmpl-b-1", "cmpl-b", 1_764_400_001.0)
    report = dataclasses.replace(report, request_ids=(*report.request_ids, rid))
    msg = wire.report_to_pb(report)
    subjects = []
    for way, path in (("tails", tmp_path / "a.sqlite3"), ("objects", tmp_path / "b.sqlite3")):
        s = Store(path)
        rep = StoredReport(report.agent_id, report.seq, report.target, 100.0, b"body")
        if way == "tails":
            assert s.save_report(rep, {}, tails=binding_rows.tails_from_pb(msg)) is not None
        else:
            assert s.save_report(rep, {}, (), report.spans, report.request_ids) is not None
        subjects.append(
            s.read(
                lambda db: db.execute(
                    "SELECT kind, ref, subject FROM ledger ORDER BY seq"
                ).fetchall()
            )
        )
    assert subjects[0] == subjects[1] and any(k == "bindings" for k, _, _ in subjects[0])
