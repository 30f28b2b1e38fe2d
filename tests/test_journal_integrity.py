"""Lies by omission (issue 18, class 6): a probed process that edits its own journal (the probe
writes it from inside the workload, so the workload can) to drop a forbidden module from the
evidence. Every record carries ``seq`` (its place) and the probe counts the records it wrote in
shared memory (``S_JOURNAL_RECORDS``); the agent remembers what it read. Each attack below is
built on a real probed process, and each must keep the gate from PASS with
``evidence.journal.edited`` (and, once the agent had read it, the dropped module stays in the
evidence). What is *not* caught is tested too, as the documented limit."""

from __future__ import annotations

import dataclasses
import json
import mmap
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from servewitness_probe import layout as L

from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
from servewitness.evidence.probe_reader import read_probe_dir
from servewitness.evidence.process import read_process
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.report import to_report
from servewitness.model import (
    EVIDENCE_JOURNAL_EDITED,
    EVIDENCE_PROBE_UNBOUND,
    ProcessReport,
    Verdict,
)
from servewitness.policy import TargetSnapshot, load_policy
from tests.helpers import probe_env, weak_policy

FORBID = weak_policy('version = 1\n[[forbid]]\nmodule = "forbidden_mod"\n')


class Child:
    """A probed Python process that imported ``honest_mod`` and ``forbidden_mod`` and waits."""

    def __init__(self, tmp: Path, extra: str = "") -> None:
        mods = tmp / "mods"
        mods.mkdir()
        (mods / "honest_mod.py").write_text("X = 1\n")
        (mods / "forbidden_mod.py").write_text("SECRET = 'runs unseen'\n")
        code = (
            "import sys, servewitness_probe as p\n"
            "p.start()\n"
            "import honest_mod, forbidden_mod\n"
            f"{extra}"
            "print('up', flush=True); sys.stdin.read()\n"
        )
        env = probe_env(tmp / "probe", PYTHONPATH=str(mods), PYTHONDONTWRITEBYTECODE="1")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "up"
        (self.dir,) = (tmp / "probe").glob("*-*")
        self.journal = self.dir / L.JOURNAL_FILE
        self._wait_for("forbidden_mod.py")

    def _wait_for(self, name: str) -> None:
        """Until NAME is in the journal and the journal stopped growing (the sweeper's first
        passes are done), so that an edit is not followed by a record of the probe's own."""
        deadline = time.monotonic() + 30
        size, quiet_since = -1, time.monotonic()
        while True:
            text = self.journal.read_text()
            if len(text) != size:
                size, quiet_since = len(text), time.monotonic()
            if name in text and time.monotonic() - quiet_since > 2.5:
                return
            assert time.monotonic() < deadline, text[-2000:]
            time.sleep(0.1)

    def lines(self) -> list[str]:
        return self.journal.read_text().splitlines(keepends=True)

    def rewrite(self, lines: list[str]) -> None:
        """Rewrite the journal in place (same inode, as `open('w')` does)."""
        with self.journal.open("w") as f:
            f.writelines(lines)

    def set_written(self, n: int) -> None:
        """Set the probe's count of records written, in its shared counters."""
        with (self.dir / L.COUNTERS_FILE).open("r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            m[L.S_JOURNAL_RECORDS * 8 : L.S_JOURNAL_RECORDS * 8 + 8] = struct.pack("=Q", n)

    def report(self) -> ProcessReport:
        procfs = ProcFS()
        return to_report(procfs, read_process(procfs, self.proc.pid))

    def stop(self) -> None:
        self.proc.communicate(timeout=10)


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Child]:
    c = Child(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def _forbidden_line(lines: list[str]) -> int:
    return next(i for i, x in enumerate(lines) if '"forbidden_mod"' in x and '"file"' in x)


def _renumbered(lines: list[str]) -> list[str]:
    out = []
    for i, line in enumerate(lines):
        rec = json.loads(line)
        rec["seq"] = i
        out.append(json.dumps(rec, separators=(",", ":")) + "\n")
    return out


def _verdict(report: ProcessReport, policy: str = FORBID) -> tuple[Verdict, list[str]]:
    """The policy's verdict on REPORT, judged as the worker of a target (a plain Python
    process has no vLLM role, and helpers and unknown roles are not judged)."""
    report = dataclasses.replace(report, role="worker")
    snap = TargetSnapshot("t", (report,), time.time())
    v = load_policy(policy).evaluate_target(snap, time.time())
    return v.verdict, [f.id for f in v.findings]


def _edited(report: ProcessReport) -> list[str]:
    return [x.detail for x in report.evidence_problems if x.id == EVIDENCE_JOURNAL_EDITED]


def test_an_honest_journal_has_no_problem_and_the_forbidden_module_fails(child: Child) -> None:
    """The negative control: nothing edited, nothing said; the forbid rule sees the module."""
    report = child.report()
    assert report.evidence_problems == ()
    verdict, ids = _verdict(report)
    assert (verdict, "provenance.file.forbidden" in ids) == (Verdict.FAIL, True)


def test_a_deleted_file_record_is_an_edited_journal(child: Child) -> None:
    """The attack: the forbidden module's record deleted. The manifest no longer names it (the
    forbid rule alone would PASS); the gap in seq keeps the gate from PASS."""
    lines = child.lines()
    del lines[_forbidden_line(lines)]
    child.rewrite(lines)
    report = child.report()
    assert "forbidden_mod" not in {f.module for f in report.files or ()}  # the lie works...
    assert any("carries seq" in x for x in _edited(report))  # ... and is seen
    verdict, ids = _verdict(report)
    assert (verdict, EVIDENCE_JOURNAL_EDITED in ids) == (Verdict.FAIL, True)


def test_a_deleted_and_renumbered_record_disagrees_with_the_probes_count(child: Child) -> None:
    lines = child.lines()
    del lines[_forbidden_line(lines)]
    child.rewrite(_renumbered(lines))
    (why,) = _edited(child.report())  # the numbering looks whole; the probe's count does not
    assert "records at its end were deleted or cut off" in why


def test_a_journal_cut_short_is_an_edited_journal(child: Child) -> None:
    lines = child.lines()
    child.rewrite(lines[:-2])
    assert any("deleted or cut off" in x for x in _edited(child.report()))


def test_a_record_appended_by_something_else_is_an_edited_journal(child: Child) -> None:
    """A forged record with the next seq (a module the process never loaded, say): the probe
    never counted it."""
    lines = child.lines()
    forged = {"k": "file", "path": "/x/alibi.py", "sha256": "a" * 64, "size": 1, "kind": "source",
              "module": "alibi", "at": "load", "seq": len(lines)}  # fmt: skip
    with child.journal.open("a") as f:
        f.write(json.dumps(forged) + "\n")
    assert any("added by something else" in x for x in _edited(child.report()))


def test_a_journal_replaced_by_a_new_file_is_not_the_processs_evidence(child: Child) -> None:
    """Variation: a new file renamed over the journal (another inode). The probe keeps writing
    into the old, unlinked one; the process does not hold the new one, so it is not its
    evidence at all (``evidence.probe_state.unbound``, the state is refused)."""
    lines = child.lines()
    del lines[_forbidden_line(lines)]
    tmp = child.journal.with_name("new")
    tmp.write_text("".join(_renumbered(lines)))
    tmp.replace(child.journal)
    report = child.report()
    assert not report.probe_present
    unbound = [x.detail for x in report.evidence_problems if x.id == EVIDENCE_PROBE_UNBOUND]
    assert any("does not hold its journal.jsonl open" in x for x in unbound)
    verdict, ids = _verdict(report)
    assert (verdict, "evidence.probe_state.unbound" in ids) == (Verdict.FAIL, True)


def test_a_consistent_rewrite_after_the_agent_read_it_is_seen_and_the_record_kept(
    child: Child, tmp_path: Path
) -> None:
    """The strongest edit: the record deleted, the rest renumbered and the probe's count set to
    match, so the journal alone looks whole. The agent had read it before: what it read stays
    read (the forbidden module stays in its evidence) and the rewrite is a finding."""
    config = AgentConfig("unix:/", "t", "a", tmp_path / "spool", root_pid=child.proc.pid)
    agent = Agent(config)
    try:
        (before,) = agent.collect().processes
        assert before.evidence_problems == ()
        lines = child.lines()
        del lines[_forbidden_line(lines)]
        child.rewrite(_renumbered(lines))
        child.set_written(len(lines))
        one_shot = child.report()  # a reader that never saw it before cannot tell
        (after,) = agent.collect().processes
        (again,) = agent.collect().processes  # remembered for the process's life
    finally:
        agent.channel.close()
    assert _edited(one_shot) == [] and "forbidden_mod" not in {
        f.module for f in one_shot.files or ()
    }
    for report in (after, again):
        (why,) = _edited(report)
        assert "after the agent had read" in why
        assert "forbidden_mod" in {f.module for f in report.files or ()}
        verdict, ids = _verdict(report)
        assert verdict == Verdict.FAIL
        assert {EVIDENCE_JOURNAL_EDITED, "provenance.file.forbidden"} <= set(ids)


def test_a_busy_honest_probe_is_never_read_as_edited(tmp_path: Path) -> None:
    """Negative control under load: eight threads import modules and fire records while the
    journal is read over and over (a record counted but not yet written, or written while the
    counters are read, must not look like an edit)."""
    mods = tmp_path / "many"
    mods.mkdir()
    for i in range(400):
        (mods / f"m{i}.py").write_text(f"V = {i}\n")
    extra = (
        "import threading, importlib, time\n"
        "from servewitness_probe import _core\n"
        f"sys.path.insert(0, {str(mods)!r})\n"
        "def work(k):\n"
        "    for i in range(k, 400, 8):\n"
        "        importlib.import_module(f'm{i}'); _core.state().emit({'k': 'note', 'i': i})\n"
        "        time.sleep(0.002)\n"
        "for k in range(8): threading.Thread(target=work, args=(k,), daemon=True).start()\n"
    )
    c = Child(tmp_path, extra)
    try:
        seen = 0
        deadline = time.monotonic() + 30
        while seen < 60 and time.monotonic() < deadline:
            state = read_probe_dir(c.dir)
            assert state is not None
            assert state.journal_problems == ()
            seen += 1
        assert seen >= 60
    finally:
        c.stop()
