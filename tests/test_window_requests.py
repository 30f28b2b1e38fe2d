"""The seal's requests check without a server: which of the harness's request ids the window's
processes served (``policy.window.requests_served``), and the ids' checks on the wire
(``wire.request_ids``) and in a harness's file (``client.window.read_request_ids``). The
same check end to end, with a real vLLM, a twin and a real verifier:
``tests/test_window_e2e.py::test_seal_requires_every_request_the_harness_sent_to_be_served_by_the_window``."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.client.window import read_request_ids
from servewitness.errors import UsageError
from servewitness.model import request_ids_sha256
from servewitness.policy import window as pw
from servewitness.wire import limits as L

WORKER = ("t", "boot", 20, 111)
OTHER = ("t", "boot", 30, 222)  # a process of the same target the window does not judge


def test_an_id_counts_only_when_a_window_process_served_it_after_the_open() -> None:
    at_open = {WORKER: 100}
    where = {
        "in": [(*WORKER, 101)],
        "early": [(*WORKER, 100)],  # its first step is the open's last: before the window
        "elsewhere": [(*OTHER, 500)],
        "both": [(*WORKER, 90), (*OTHER, 500), (*WORKER, 150)],  # one binding is enough
    }
    ids = ["in", "early", "elsewhere", "both", "nowhere"]
    summary, found = pw.requests_served(ids, where, at_open)
    assert summary == {"sent": 5, "served": 2, "ids_sha256": request_ids_sha256(ids)}
    assert found is not None and found.id == pw.WINDOW_REQUESTS_UNSERVED
    assert found.context == {
        "sent": 5, "unserved": 3, "unbound": 1, "outside": 1, "before_open": 1,
        "ids": ["nowhere", "elsewhere", "early"],
    }  # fmt: skip
    assert "3 of the 5 requests the harness sent were not served" in found.message


def test_all_served_is_no_finding_and_an_unrecorded_open_count_bounds_nothing() -> None:
    summary, found = pw.requests_served(["a"], {"a": [(*WORKER, 1)]}, {WORKER: None})
    assert found is None and summary["served"] == 1
    _, found = pw.requests_served(["a"], {"a": [(*WORKER, 1)]}, {WORKER: 1})
    assert found is not None and found.context["before_open"] == 1


def test_the_ids_digest_ignores_order_and_repeats_but_not_content() -> None:
    assert request_ids_sha256(["b", "a", "a"]) == request_ids_sha256(["a", "b"])
    assert request_ids_sha256(["a", "b"]) != request_ids_sha256(["a", "b", "c"])
    # what `LC_ALL=C sort -u FILE | sha256sum` prints for the harness's file (ids hold no
    # newline: the wire refuses control characters, below)
    assert request_ids_sha256(["b", "é", "a"]) == hashlib.sha256("a\nb\né\n".encode()).hexdigest()


def test_ids_on_the_wire_are_bounded_distinct_and_printable() -> None:
    msg = pb.SealWindowRequest(window_id="w", run="r", results_sha256="0" * 64,
                               results_name="x", timeout_s=1.0)  # fmt: skip
    msg.request_ids.extend(["b", "a", "b"])
    assert wire.seal_window_request_from_pb(msg).request_ids == ("b", "a")
    for bad, why in [("", "required"), ("a\nb", "control"), (" a", "blanks"),
                     ("x" * (L.ID_BYTES.value + 1), "id_bytes")]:  # fmt: skip
        del msg.request_ids[:]
        msg.request_ids.append(bad)
        with pytest.raises(wire.WireError, match=why):
            wire.seal_window_request_from_pb(msg)
    del msg.request_ids[:]
    msg.request_ids.extend(str(i) for i in range(L.REQUEST_IDS_PER_SEAL.value + 1))
    with pytest.raises(wire.WireError, match="request_ids_per_seal"):
        wire.seal_window_request_from_pb(msg)


def test_a_harness_file_skips_blanks_and_comments_and_refuses_the_rest(tmp_path: Path) -> None:
    f = tmp_path / "ids.txt"
    f.write_text("req-1\n\n#req-2\nreq-1\r\n")  # an X-Request-Id may begin with #
    assert read_request_ids(f) == ("req-1", "#req-2")
    f.write_text("req-1\n  req-2  \n")  # not silently trimmed into another id
    with pytest.raises(UsageError, match=r"\[1\].*blanks"):
        read_request_ids(f)
    f.write_text("\n \n")  # asked to check requests, nothing is no check
    with pytest.raises(UsageError, match="holds no request id"):
        read_request_ids(f)
    with pytest.raises(UsageError, match=r"--requests .*absent"):
        read_request_ids(tmp_path / "absent")
    f.write_bytes(b"req-1\n\xff\n")
    with pytest.raises(UsageError, match="not UTF-8"):
        read_request_ids(f)
    f.write_text("ok\nnot an\x07id\n")
    with pytest.raises(UsageError, match=r"\[1\].*control"):
        read_request_ids(f)
    f.write_text("".join(f"{i}\n" for i in range(L.REQUEST_IDS_PER_SEAL.value + 1)))
    with pytest.raises(UsageError, match="request_ids_per_seal"):
        read_request_ids(f)


def test_the_store_reads_ids_in_chunks_with_the_same_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real SQLite store: a client's id finds its binding, an unknown id finds none, and an
    API or engine id is not read as the client id inside it; the same across chunk
    boundaries of the store's lock. The rows are a ledgered batch, as a report stores them
    (rows no ledger entry covers count for nothing: tests/test_audit_attacks.py)."""
    from servewitness.model import ProcessKey, RequestId, RequestSpan, TargetReport
    from servewitness.server import store as store_mod

    st = store_mod.Store(tmp_path / "v.sqlite3")
    try:
        w, api = ProcessKey("boot", 20, 111), ProcessKey("boot", 10, 100)
        spans = [
            RequestSpan(w, f"cmpl-r{i}-0-ab", 10 + i, 10 + i, 1, 1, 1.0, 2.0, "m", "m", "R")
            for i in range(5)
        ]
        rids = [RequestId(api, f"cmpl-r{i}-0-ab", f"cmpl-r{i}-0", 1.0) for i in range(5)]
        body = wire.report_to_bytes(TargetReport("ag", "t", 1, "", 1.0, ()))
        assert st.save_report(store_mod.StoredReport("ag", 1, "t", 1.0, body), {}, (), spans, rids)
        ids = ["r0", "r1", "cmpl-r2-0", "cmpl-r2-0-ab", "r3", "unknown", "r4"]
        whole = st.request_steps(ids)
        monkeypatch.setattr(store_mod, "REQUEST_STEPS_CHUNK", 2)
        assert st.request_steps(ids) == whole
        assert whole["unknown"] == []
        assert whole["r0"] == [("t", "boot", 20, 111, 10)]
        assert whole["r4"] == [("t", "boot", 20, 111, 14)]
        # The harness's X-Request-Id exactly: request r2's API id (cmpl-r2-0) or engine id
        # is not r2, so a harness id shaped like one is not covered by request r2.
        assert whole["cmpl-r2-0"] == [] and whole["cmpl-r2-0-ab"] == []
    finally:
        st.close()


def test_an_id_too_long_to_report_is_reported_by_its_digest() -> None:
    from servewitness.wire import fields as F

    # the bound is what a database indexes (MAX_INDEXED_BYTES of UTF-8), below a text's limit
    assert F.MAX_INDEXED_BYTES < F.MAX_TEXT
    assert F.bounded_id("r" * F.MAX_INDEXED_BYTES) == "r" * F.MAX_INDEXED_BYTES
    for long in ("r" * (F.MAX_INDEXED_BYTES + 1), "r" * (F.MAX_TEXT + 1)):
        assert F.bounded_id(long) == "sha256:" + hashlib.sha256(long.encode()).hexdigest()


def test_the_agent_never_spools_a_report_its_own_decoder_refuses(tmp_path: Path) -> None:
    """A report whose bindings the verifier's checks refuse (a span id over the text limit,
    however it got there) is spooled without them, saying so; the rest is kept. A spooled
    file that does not decode is set aside, kept, not left at the head of the queue."""
    from servewitness.agent.spool import Spool, spoolable
    from servewitness.model import ProcessKey, RequestSpan, TargetReport
    from servewitness.wire import fields as F

    key = ProcessKey("boot", 20, 111)
    span = RequestSpan(key, "x" * (F.MAX_TEXT + 1), 1, 2, 2, 2, 1.0, 2.0, "", "", "R")
    report = TargetReport("a", "t", 7, "0" * 32, 1.0, (), spans=(span,))
    with pytest.raises(wire.WireError):
        wire.report_from_bytes(wire.report_to_bytes(report))
    kept = wire.report_from_bytes(spoolable(report))
    assert (kept.seq, kept.spans, kept.request_ids) == (7, (), ())
    assert "1 request bindings and 0 request ids left out of report 7" in kept.unobservable[-1]
    spool = Spool(tmp_path / "s", 1 << 20)
    spool.put(3, b"\xff not a report")
    assert spool.set_aside(3).read_bytes() == b"\xff not a report"
    assert spool.pending() == []


def test_a_spooled_report_that_does_not_decode_is_set_aside_and_the_rest_delivered(
    tmp_path: Path,
) -> None:
    """A real verifier and a real agent's drain: the spool's head does not decode (written by
    an older agent, or damaged); it is set aside, kept, and the report behind it delivered,
    where before the agent retried the head forever and its target went stale."""
    from servewitness.agent.config import AgentConfig
    from servewitness.agent.runner import Agent
    from servewitness.model import TargetReport
    from tests.helpers import running_verifier

    addr = f"unix:{tmp_path}/v.sock"
    with running_verifier(addr, tmp_path / "db.sqlite3") as server:
        config = AgentConfig(addr, "t", "a", tmp_path / "spool", docker_socket=None)
        agent = Agent(config)
        try:
            agent.spool.put(1, b"\xff not a report")
            agent.hello()
            later = TargetReport("a", "t", 2, agent.nonce or "", time.time(), ())
            agent.spool.put(2, wire.report_to_bytes(later))
            agent.drain()
        finally:
            agent.channel.close()
        assert agent.spool.pending() == []  # the head set aside, the next one acknowledged
        assert (tmp_path / "spool" / "1.pb.unreadable").read_bytes() == b"\xff not a report"
        assert [t.snapshot.target for t in server.service.evaluator.targets()] == ["t"]
