"""What a probed process writes into its journal and bindings file reaches the verifier even
when a string in it is not valid Unicode: a file name's undecodable bytes (Python's
surrogateescape) or a hostile lone surrogate. Protobuf strings must be UTF-8, so such a
string used to make the agent's report impossible to encode; now it is escaped, stays
distinct, and a file the agent cannot then find is a disagreement (never silently dropped)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from servewitness_probe import layout as L

from servewitness import wire
from servewitness.evidence.bindings_reader import BindingsReader
from servewitness.evidence.journal import load_record
from servewitness.evidence.probe_reader import read_probe_dir
from servewitness.evidence.process import read_process
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.report import to_report
from servewitness.model import ProcessKey, ProcessReport, TargetReport
from tests.helpers import probe_env, wait_ready


def _report(p: ProcessReport) -> TargetReport:
    return TargetReport("agent", "target", 1, "nonce", 1.0, (p,))


def test_a_module_loaded_from_an_undecodable_path_is_reported_and_unverifiable(
    tmp_path: Path,
) -> None:
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/mods-\xff"))  # not UTF-8: "\udcff" in Python
    odd.mkdir()
    (odd / "oddmod.py").write_text("X = 1\n")
    ready = tmp_path / "ready"
    code = (
        f"import sys, time; sys.path.insert(0, {str(odd)!r}); import oddmod; "
        "open(sys.argv[1], 'w').write('ok'); time.sleep(600)"
    )
    env = probe_env(tmp_path / "probe", VERIFIER_PROBE_EARLY="1")
    proc = subprocess.Popen([sys.executable, "-c", code, str(ready)], env=env)
    try:
        wait_ready(proc, ready)
        procfs = ProcFS()
        report = to_report(procfs, read_process(procfs, proc.pid))
        back = wire.report_from_bytes(wire.report_to_bytes(_report(report)))
    finally:
        proc.kill()
        proc.wait()
    escaped = str(odd).encode("utf-8", "backslashreplace").decode() + "/oddmod.py"
    (p,) = back.processes
    assert escaped in {f.path for f in p.files or ()}
    assert escaped in {d.path for d in p.disagreements}  # the agent cannot vouch for it


def test_lone_surrogates_in_a_journal_are_escaped_everywhere(tmp_path: Path) -> None:
    records = [
        {"k": "start", "pid": 7, "start_ticks": 1},
        {"k": "runner", "class": "R\ud800", "mro": ["\udfff"], "file": "/a\udc80.py"},
        {"k": "hook", "name": "h\ud800", "target": "m:f", "source": "env", "slot": 64},
        {"k": "file", "path": "/x\udcff.py", "sha256": "a" * 64, "size": 1, "kind": "source"},
        {"k": "vllm_log", "level": "WARNING", "logger": "v", "msg": "\ud83d\ude00 ok \udead"},
    ]
    (tmp_path / L.JOURNAL_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    state = read_probe_dir(tmp_path)
    assert state is not None and state.runner is not None
    assert (state.runner.cls, state.runner.mro, state.runner.file) == (
        "R\\ud800",
        ("\\udfff",),
        "/a\\udc80.py",
    )
    assert [h.name for h in state.hooks] == ["h\\ud800"]
    assert [f.path for f in state.files] == ["/x\\udcff.py"]
    assert state.runner_log[0].message == "\U0001f600 ok \\udead"  # a valid pair stays as it is
    report = ProcessReport(
        key=ProcessKey("boot", 7, 1), ns_pid=7, ppid=1, start_time=0.0, role="worker",
        rank=None, container_id=None, cmdline=(), exe="", probe_present=True,
        runner=state.runner, steps=state.steps, hooks=state.hooks, files=state.files,
        manifest_digest=state.manifest_digest, runner_log=state.runner_log,
    )  # fmt: skip
    assert wire.report_from_bytes(wire.report_to_bytes(_report(report))).processes == (report,)


def test_lone_surrogates_in_request_bindings_are_escaped(tmp_path: Path) -> None:
    req = {"k": "req", "id": "r\ud800", "s0": 1, "s1": 2, "n": 2, "tok": 3, "t0": 1, "t1": 2,
           "f0": 1, "f1": 1, "hooks": {"h\udc00": 1}, "end": "finished"}  # fmt: skip
    ext = {"k": "ext", "id": "r\ud800", "ext": "cmpl-\udfff-0", "t": 5, "xrid": "\udfff"}
    (tmp_path / L.BINDINGS_FILE).write_text(json.dumps(req) + "\n" + json.dumps(ext) + "\n")
    spans, exts = BindingsReader().read(tmp_path)
    assert [(s.internal_id, s.hooks) for s in spans] == [("r\\ud800", {"h\\udc00": 1})]
    assert [(e.external_id, e.x_request_id) for e in exts] == [("cmpl-\\udfff-0", "\\udfff")]


def test_valid_text_is_read_as_it_was_written() -> None:
    line = json.dumps({"k": "file", "path": "/caf\u00e9/\U0001f600.py"}).encode()
    assert load_record(line) == {"k": "file", "path": "/caf\u00e9/\U0001f600.py"}
