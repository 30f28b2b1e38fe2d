"""Every value the store can hold prints: times past year 9999, inf, nan, negative; texts with
ANSI escape sequences, bidi overrides, line breaks, 100 kB, empty, bytes that are not UTF-8.

The store is written through the real ingest path (``Store``: what the verifier's service
calls) with hostile values an older verifier accepted, or edited by hand afterwards; then each
printing command runs as a real ``verifier`` subprocess. Each must print or refuse with an exit
code of the documented contract (never a traceback), and no escape sequence a value carries
reaches the terminal raw. The online commands (``target list``, ``run list``, ``status``) read
from a real verifier over real gRPC, fed a hostile target name on the wire.
"""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from unittest import mock

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from servewitness import wire
from servewitness._cli import fmt
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.errors import ExitCode
from servewitness.model import (
    ProcessKey,
    RequestId,
    RequestSpan,
    TargetReport,
    manifest_digest,
)
from servewitness.server.app import ServeConfig, VerifierServer
from servewitness.server.index import processes_seen
from servewitness.server.store import Store, StoredReport
from tests.helpers import agent_stub, not_vllm_policy, verifier_cli
from tests.test_bindings_store import M1
from tests.test_fuzz_parsers import FUZZ
from tests.test_policy_engine import entry, worker

ESC = "\x1b"
ANSI = f"{ESC}]0;owned{chr(7)}{ESC}[2J{ESC}[31mEVIL{ESC}[0m"  # title, clear screen, colour
TEXTS = {
    "ansi": ANSI,
    "bidi and a forged line": "ok\u202e lmth.exe\nrun all: PASS",
    "100 kB": "x" * 100_000,
}
TIMES = [1e308, -math.inf, 253402300800.0]  # NaN: SQLite stores it as NULL, refused
DOCUMENTED = {c.value for c in ExitCode}


def hostile_store(path: Path, when: float, text: str) -> str:
    """A store written through ``Store`` with WHEN as every agent-given time and TEXT in every
    agent-given text (target, agent id, role, path, runner, request ids); the runs and
    verdicts (timed by the store's own clock) get WHEN from that clock, ledgered so (a row
    edited by hand is refused by the answers that use it). The id of the request."""
    internal = f"cmpl-{text}-0-1a2b"
    files = (entry(f"/site/vllm/{text}/sampler.py"), entry("/site/vllm/x.py"))
    digest = manifest_digest(files)
    w = replace(worker(), files=files, manifest_digest=digest, role=f"worker{text}",
                container_id=f"c{text}")  # fmt: skip
    key = ProcessKey("boot", 10, 100)
    s = Store(str(path))
    try:
        with mock.patch("servewitness.server.store.time.time", return_value=when):
            s.register_run(
                f"run{text}", not_vllm_policy("version = 1\n"), "sha256:" + "1" * 64, text
            )
            s.record_verdict(f"run{text}", "PASS", {"n": 1})
        sent = TargetReport(f"a{text}", f"t{text}", 1, "", time.time(), (w,))
        body = wire.report_to_bytes(sent)  # stored as received, WHEN its time of arrival
        span = RequestSpan(w.key, internal, 5, 20, 16, 31, when, when, digest, M1,
                           f"Runner{text}", ((f"h{text}", 16),))  # fmt: skip
        assert s.save_report(
            StoredReport(f"a{text}", 1, f"t{text}", when, body),
            {digest: files},
            processes_seen((w,)),
            (span,),
            (RequestId(key, internal, f"cmpl-{text}-0", when),),
        )
    finally:
        s.close()
    return internal


def assert_printed(out: object, *allowed: int) -> None:
    """OUT (a finished ``verifier``) exited with a documented code (one of ALLOWED when given),
    without a traceback, and wrote no escape character raw."""
    assert isinstance(out, subprocess.CompletedProcess)
    why = f"exit {out.returncode}\nstdout: {out.stdout[-2000:]}\nstderr: {out.stderr[-2000:]}"
    assert out.returncode in (allowed or DOCUMENTED), why
    assert "Traceback" not in out.stderr, why
    assert ESC not in out.stdout and ESC not in out.stderr, why
    assert "\u202e" not in out.stdout and "\u202e" not in out.stderr, why


@pytest.mark.parametrize(("when", "name"), list(zip(TIMES, TEXTS, strict=True)))
def test_the_audit_commands_print_hostile_stored_values(
    tmp_path: Path, when: float, name: str
) -> None:
    text = TEXTS[name]
    db = tmp_path / "db.sqlite3"
    request = hostile_store(db, when, text)
    key = tmp_path / "k"
    assert verifier_cli("keygen", "--out", str(key)).returncode == 0

    out = verifier_cli("audit", "request", request, "--db", str(db))
    assert_printed(out, 0)
    assert "runner Runner" in out.stdout and fmt.when(when) in out.stdout, out.stdout
    got = verifier_cli("audit", "request", request, "--db", str(db), "--json")
    assert_printed(got, 0)
    (record,) = json.loads(got.stdout)  # valid JSON, exact: the text as stored
    assert record["runner"] == f"Runner{text}" and record["target"] == f"t{text}"
    assert record["first_unix"] == (when if math.isfinite(when) else fmt.dumps(when)[1:-1])

    out = verifier_cli("audit", "file", "sampler.py", "--db", str(db))
    assert_printed(out, 0)
    got = verifier_cli("audit", "file", "sampler.py", "--db", str(db), "--json")
    assert_printed(got, 0)
    assert json.loads(got.stdout)[0]["path"] == f"/site/vllm/{text}/sampler.py"

    for args in (["audit", "run", f"run{text}"], ["audit", "run", f"run{text}", "--json"]):
        assert_printed(verifier_cli(*args, "--db", str(db)), 0)

    out = verifier_cli("audit", "verify", "--db", str(db))
    assert_printed(out, 0)
    got = verifier_cli("audit", "verify", "--db", str(db), "--json")
    assert_printed(got, 0)
    assert json.loads(got.stdout)["ok"] is True
    bundle = tmp_path / "b.json"
    out = verifier_cli("audit", "export", "--db", str(db), "--key", str(key), "--out",
                       str(bundle), "--request", request)  # fmt: skip
    assert_printed(out, 0, 1)


def test_text_that_is_not_utf8_is_named_not_a_traceback(tmp_path: Path) -> None:
    """A TEXT column holding bytes that are no UTF-8 (a hand edit, a restore from elsewhere)
    cannot be read back as text: the commands say the database is corrupt (exit 1)."""
    db = tmp_path / "db.sqlite3"
    request = hostile_store(db, 1e9, "plain")
    with sqlite3.connect(db) as con:
        con.execute("UPDATE bindings SET runner = CAST(X'ff41edb080' AS TEXT)")
        con.execute("UPDATE runs SET source = CAST(X'c0af' AS TEXT)")
    for args in (["audit", "request", request], ["audit", "run", "runplain", "--json"],
                 ["audit", "verify"]):  # fmt: skip
        out = verifier_cli(*args, "--db", str(db))
        assert_printed(out, 1)
        assert "corrupt" in out.stderr and "UTF-8" in out.stderr, out.stderr


def test_a_value_of_the_wrong_type_is_named_not_a_traceback(tmp_path: Path) -> None:
    """SQLite keeps any value in any column: text where a time, a pid or a JSON object of
    hook counts belongs (a hand edit). Every audit query reading it says the database is
    corrupt, or (where the query checks its rows against the ledger first) that the rows were
    edited: exit 1, never a traceback."""
    db = tmp_path / "db.sqlite3"
    request = hostile_store(db, 1e9, "plain")
    with sqlite3.connect(db) as con:
        con.execute("UPDATE verdicts SET at_unix = 'later'")
        con.execute("UPDATE bindings SET hooks_json = '{not json'")
        con.execute("UPDATE processes SET pid = 'one'")
    for args in (["audit", "run", "runplain"], ["audit", "request", request],
                 ["audit", "file", "sampler.py"]):  # fmt: skip
        out = verifier_cli(*args, "--db", str(db))
        assert_printed(out, 1)
        said = ("not what its column holds", "changed after it was ledgered")
        assert any(w in out.stderr for w in said), out.stderr


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    addr = f"unix:{tmp_path}/v.sock"
    server = VerifierServer(ServeConfig(addr, str(tmp_path / "db.sqlite3"), report_interval_s=0.2))
    server.start()
    try:
        yield addr, tmp_path / "db.sqlite3"
    finally:
        server.stop()


def test_a_target_named_with_escape_sequences_is_listed_escaped(
    served: tuple[str, Path], tmp_path: Path
) -> None:
    """An agent names its target with ANSI escape sequences over real gRPC (the attack: the
    operator's terminal obeys them); `target list`, `run list` and `status` print it escaped;
    JSON keeps it exact."""
    addr, _ = served
    target = f"t{ANSI}\nFAKE PASS"
    policy = tmp_path / "p.toml"
    policy.write_text(not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\n'))
    assert verifier_cli("run", "register", f"r{ANSI}", "--policy", str(policy),
                        "--verifier", addr).returncode == 0  # fmt: skip
    with grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch:
        stub = agent_stub(ch)  # the agent's metadata (percent-encoded) is what the ingress reads
        # Accepted at ingest (a name is any text within id_bytes): printing must make it safe.
        nonce = stub.Hello(pb.HelloRequest(agent_id=f"a{ANSI}", targets=[target])).nonce
        w = worker()
        w = replace(w, manifest_digest=manifest_digest(w.files or ()))
        rep = TargetReport(f"a{ANSI}", target, 1, nonce, time.time(), (w,))
        stub.Report(pb.ReportRequest(report=wire.report_to_pb(rep)))
    out = verifier_cli("target", "list", "--verifier", addr)
    assert_printed(out, 0)
    assert r"t\x1b]0;owned\x07\x1b[2J" in out.stdout and "FAKE PASS" in out.stdout, out.stdout
    assert len(out.stdout.splitlines()) == 1, out.stdout  # the forged line stays on its own
    assert_printed(verifier_cli("run", "list", "--verifier", addr), 0)
    out = verifier_cli("status", "--verifier", addr)
    assert_printed(out, 0, 1)
    assert r"run r\x1b]0;owned" in out.stdout, out.stdout
    got = verifier_cli("status", "--verifier", addr, "--json")
    assert_printed(got, 0, 1)
    assert json.loads(got.stdout)["runs"][0]["run"] == f"r{ANSI}"


def test_inspect_of_a_process_with_escapes_in_its_command_line_prints_them_escaped(
    tmp_path: Path,
) -> None:
    """A local process whose arguments carry ANSI escapes: `inspect` shows its evidence,
    escaped (the stream every command writes through escapes what a call site did not)."""

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", ANSI])
    try:
        time.sleep(0.3)
        out = verifier_cli("inspect", "--pid", str(p.pid))
        assert_printed(out, 0)  # the short form cuts the command line (where: the path's length)
        assert "cmdline" in out.stdout, out.stdout
        out = verifier_cli("inspect", "--pid", str(p.pid), "-v")  # -v: all of it
        assert_printed(out, 0)
        assert "EVIL" in out.stdout and r"\x1b[2J" in out.stdout, out.stdout
    finally:
        p.kill()
        p.wait()


HOSTILE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.text(max_size=300),
    st.none(),
)


@FUZZ
@given(value=HOSTILE)
def test_every_value_formats_without_raising(value: object) -> None:
    """fmt's three views of any value: a time, a terminal text, a JSON text. None raises; the
    terminal text holds no control character, line break or surrogate and is bounded; the
    JSON is valid and, for a text, exact."""
    shown = fmt.when(value)
    assert shown and shown.isprintable()
    t = fmt.text(value)
    assert t.isprintable() and len(t) <= fmt.LIMIT * 10 + 40, t
    data = json.loads(fmt.dumps({"v": value}))
    if isinstance(value, str):
        assert data["v"] == value
    elif isinstance(value, float) and not math.isfinite(value):
        assert data["v"] in ("NaN", "Infinity", "-Infinity")


def test_times_in_range_read_as_dates_and_the_rest_as_numbers_with_a_note() -> None:
    assert fmt.when(0) == "1970-01-01T00:00:00Z"
    assert fmt.when(-1.0) == "1969-12-31T23:59:59Z"
    assert fmt.when(253402300799.5) == "9999-12-31T23:59:59Z"
    assert fmt.when(253402300800.0) == "253402300800.0 (not a representable time)"
    assert fmt.when(math.nan) == "nan (not a representable time)"
    assert fmt.when(10**5000).startswith("~2**16609 ")
    assert fmt.text("a" * 250) == "a" * 200 + "…[50 more characters]"
    assert fmt.text(ANSI).startswith(r"\x1b]0;owned\x07")


def _escaped_char_by_char(s: str, keep: frozenset[str]) -> str:
    """The reference: every character judged on its own (what TerminalSafe.write must equal)."""
    return "".join(fmt._escape(c) if c not in keep and fmt._unsafe(c) else c for c in s)


class _Sink:
    def __init__(self) -> None:
        self.got: list[str] = []

    def write(self, s: str) -> int:
        self.got.append(s)
        return len(s)


_CHARS = st.one_of(
    st.sampled_from("\n\t\r \x1b\x00\u202e\u2028\u00a0"),  # kept, escaped, printable
    st.characters(exclude_categories=()),  # any code point, lone surrogates included
)


@given(st.text(alphabet=_CHARS, max_size=200), st.booleans())
def test_terminal_safe_escapes_as_the_per_character_rule_on_any_text(s: str, keep_cr: bool) -> None:
    """Its fast path (one check in C over the text without its kept characters) changes
    nothing: the output is the per-character rule's on any text, lone surrogates included."""
    sink = _Sink()
    fmt.TerminalSafe(sink, keep_cr=keep_cr).write(s)  # type: ignore[arg-type]
    assert sink.got == [_escaped_char_by_char(s, fmt._KEEP | {"\r"} if keep_cr else fmt._KEEP)]


def test_an_escape_sequence_after_many_printable_lines_is_escaped() -> None:
    """A long multi-line JSON text (the fast path's case) with ESC, a bidi override and a bare
    carriage return on its last line: each is escaped, every line break and tab kept."""
    lines = ['  "a": "b",\t'] * 10_000 + ['  "x": "\x1b[2J\u202e\r"']
    sink = _Sink()
    fmt.TerminalSafe(sink).write("\n".join(lines))  # type: ignore[arg-type]
    (out,) = sink.got
    assert out.endswith('  "x": "\\x1b[2J\\u202e\\x0d"')
    assert out.count("\n") == 10_000 and out.count("\t") == 10_000
