"""The seal's requests check without a server: which of the harness's request ids the window's
processes served (``policy.window.requests_served``), and the ids' checks on the wire
(``wire.request_ids``) and in a harness's file (``client.window.read_request_ids``). The
same check end to end, with a real vLLM, a twin and a real verifier:
``tests/test_window_e2e.py::test_seal_requires_every_request_the_harness_sent_to_be_served_by_the_window``."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.client.window import read_request_ids
from servewitness.errors import UsageError
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
    assert summary == {"sent": 5, "served": 2, "ids_sha256": pw.ids_sha256(ids)}
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
    assert pw.ids_sha256(["b", "a", "a"]) == pw.ids_sha256(["a", "b"])
    assert pw.ids_sha256(["a", "b"]) != pw.ids_sha256(["a", "b", "c"])
    # what `LC_ALL=C sort -u FILE | sha256sum` prints for the harness's file (ids hold no
    # newline: the wire refuses control characters, below)
    assert pw.ids_sha256(["b", "é", "a"]) == hashlib.sha256("a\nb\né\n".encode()).hexdigest()


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
    f.write_text("# sent\n\nreq-1\n  req-2  \nreq-1\n")
    assert read_request_ids(f) == ("req-1", "req-2")
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
    """A real SQLite store: a client id, an external id and an internal id each find their
    binding, an unknown id finds none, across chunk boundaries of the store's lock."""
    import sqlite3

    from servewitness.server import store as store_mod

    st = store_mod.Store(tmp_path / "v.sqlite3")
    try:
        con = sqlite3.connect(tmp_path / "v.sqlite3")
        with con:
            con.executemany(
                "INSERT INTO request_ids (batch, target, internal_id, external_id, client_id, "
                "at_unix) VALUES ('b', 't', ?, ?, ?, 1.0)",
                [(f"cmpl-r{i}-0-ab", f"cmpl-r{i}-0", f"r{i}") for i in range(5)],
            )
            con.executemany(
                "INSERT INTO bindings (batch, target, boot_id, pid, start_ticks, internal_id, "
                "first_step, last_step, steps, tokens, first_unix, last_unix, manifest_first, "
                "manifest_last, runner, hooks_json, finished) VALUES "
                "('b', 't', 'boot', 20, 111, ?, ?, ?, 1, 1, 1.0, 2.0, 'm', 'm', 'R', '{}', 1)",
                [(f"cmpl-r{i}-0-ab", 10 + i, 10 + i) for i in range(5)],
            )
        con.close()
        ids = ["r0", "cmpl-r1-0", "cmpl-r2-0-ab", "r3", "unknown", "r4"]
        whole = st.request_steps(ids)
        monkeypatch.setattr(store_mod, "REQUEST_STEPS_CHUNK", 2)
        assert st.request_steps(ids) == whole
        assert whole["unknown"] == []
        assert whole["r0"] == [("t", "boot", 20, 111, 10)]
        assert whole["cmpl-r1-0"] == [("t", "boot", 20, 111, 11)]
        assert whole["cmpl-r2-0-ab"] == [("t", "boot", 20, 111, 12)]
    finally:
        st.close()
