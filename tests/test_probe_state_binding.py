"""Whose probe state is this? Forged state directories next to real processes.

Anyone who can write to the probe dir (another container sharing ``/dev/shm``, root anywhere
on the host) can create a directory under a process's name. Each test here builds such a
directory for a real Python process, probed or not, and reads the process the way the agent
does (``read_process``, ``to_report``, a policy; one test through a real verifier and agent
over gRPC). A directory is the process's state only when the kernel shows the process holding
its files (``servewitness.evidence.binding``); anything else is refused and said
(``evidence.probe_state.unbound``), and the process is reported without a probe.

The forged state is good enough to PASS the policy below when taken for the process's own
(the first test checks that too, on the forged directory read on its own).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from servewitness_probe import layout as L

from servewitness.errors import ProcessAccessDenied
from servewitness.evidence.probe_reader import read_probe_dir
from servewitness.evidence.process import read_process
from servewitness.evidence.procfs import ProcessIdentity, ProcFS
from servewitness.evidence.report import to_report
from servewitness.model import EVIDENCE_PROBE_UNBOUND, ProcessReport, TargetVerdict, Verdict
from servewitness.policy import TargetSnapshot, load_policy
from tests.helpers import not_vllm_policy, probe_env, state_name

WORKER_TITLE = "VLLM::Worker_TP0"  # what vLLM's setproctitle shows: the process is a worker
POLICY = not_vllm_policy(
    textwrap.dedent(
        """\
        version = 1
        [evidence]
        require_probe = ["worker"]
        [[hooks]]
        name = "h"
        role = "worker"
        """
    )
)
UNBOUND = "evidence.probe_state.unbound"


def _unbound(report: ProcessReport) -> tuple[str, ...]:
    """The refused state directories a report names (its evidence problems of that kind)."""
    return tuple(x.detail for x in report.evidence_problems if x.id == EVIDENCE_PROBE_UNBOUND)


@contextmanager
def python(
    probe: Path,
    code: str = "",
    *,
    title: str = WORKER_TITLE,
    probed: bool = False,
    after: str = "",
    **env: str,
) -> Iterator[subprocess.Popen[str]]:
    """A real Python process named TITLE (argv[0], as a vLLM worker's title reads) with its
    probe dir at PROBE: it runs CODE (after starting the probe if PROBED), prints READY, runs
    AFTER and waits for stdin to close."""
    start = "import servewitness_probe as p; p.start()\n" if probed else ""
    script = start + textwrap.dedent(code) + "\nprint('READY', flush=True)\n"
    script += textwrap.dedent(after) + "\nimport sys\nsys.stdin.read()\n"
    proc = subprocess.Popen(
        [title, "-c", script],
        executable=sys.executable,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=probe_env(probe, **env),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "READY":
            proc.kill()
            raise AssertionError(f"not ready: {line!r} {proc.communicate(timeout=30)[1]}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.communicate(timeout=30)


def forge(d: Path, ident: ProcessIdentity, steps: int = 100, journal: bool = True) -> None:
    """A clean state for IDENT in D, as a probe would write it: a start record naming the
    process, a worker role, a hook ``h`` that fired on every one of STEPS productive steps."""
    d.mkdir(parents=True, exist_ok=True)
    if journal:
        records = [
            {"k": "start", "pid": ident.ns_pid, "start_ticks": ident.start_ticks,
             "mode": "early", "shared": True},
            {"k": "role", "role": "worker", "rank": 0},
            {"k": "hook", "name": "h", "target": "m:f", "source": "env", "slot": L.hook_slot(0)},
            {"k": "hook_loaded", "name": "h"},
            {"k": "hook_wrapped", "name": "h", "owner": None, "how": "function"},
        ]  # fmt: skip
        (d / L.JOURNAL_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    slots = [0] * L.N_SLOTS
    slots[L.H_MAGIC], slots[L.H_VERSION], slots[L.H_NSLOTS] = L.MAGIC, L.LAYOUT_VERSION, L.N_SLOTS
    slots[L.H_PID], slots[L.H_HOOKS_USED] = ident.ns_pid, 1
    for s in (L.S_STEPS_TOTAL, L.S_STEPS_PRODUCTIVE, L.S_STEPS_DECODE):
        slots[s] = steps
    base = L.hook_slot(0)
    for k in (L.HK_FIRES, L.HK_FIRES_PRODUCTIVE, L.HK_FIRES_DECODE, L.HK_LAST_STEP):
        slots[base + k] = steps
    slots[base + L.HK_FIRST_STEP] = 1
    (d / L.COUNTERS_FILE).write_bytes(struct.pack(f"={L.N_SLOTS}Q", *slots))


def names(ident: ProcessIdentity) -> list[str]:
    """The two names a reader looks for: the probe's, and an older probe's."""
    return [state_name(ident.pid), L.legacy_dir_name(ident.ns_pid, ident.start_ticks)]


def verdict(*reports: ProcessReport) -> TargetVerdict:
    now = time.time()
    return load_policy(POLICY).evaluate_target(TargetSnapshot("t", reports, now), now)


def ids(v: TargetVerdict) -> set[str]:
    return {f.id for f in v.findings}


def test_a_forged_state_for_an_unprobed_process_is_refused_and_fails_the_verdict(
    tmp_path: Path,
) -> None:
    """The attack of the issue: a process with no probe, and a clean state under its name.
    Before: the reader reported the forged directory as the process's probe (a PASS for a
    process that runs nothing of the probe). Now: refused, and the verdict says why."""
    probe, procfs = tmp_path / "probe", ProcFS()
    with python(probe) as proc:
        ident = procfs.identity(proc.pid)
        both = names(ident)
        for name in both:
            forge(probe / name, ident)
        # What the forged state would be worth if taken for the process's: a PASS.
        forged = read_probe_dir(probe / both[0])
        assert forged is not None and forged.steps.productive == 100
        ev = read_process(procfs, proc.pid)
        report = to_report(procfs, ev)
    assert ev.probe is None and ev.role == "worker"
    assert [u.split(": ", 1)[1] for u in ev.unbound] == [
        "the process does not hold its journal.jsonl open"
    ] * 2
    assert sorted(Path(u.split(": ", 1)[0]).name for u in ev.unbound) == sorted(both)
    assert ev.note is not None and "is not its own" in ev.note
    assert ev.as_dict()["probe"]["unbound"] == list(ev.unbound)
    assert (report.probe_present, _unbound(report)) == (False, ev.unbound)
    v = verdict(report)
    assert v.verdict == Verdict.FAIL
    assert {UNBOUND, "evidence.probe_absent"} <= ids(v)
    (f,) = [f for f in v.findings if f.id == UNBOUND]
    assert f.context["problems"] == list(ev.unbound) and f.context["pid"] == proc.pid
    assert both[0] in f.message


def test_negative_control_a_probed_process_reads_as_its_own_and_passes(tmp_path: Path) -> None:
    probe, procfs = tmp_path / "probe", ProcFS()
    code = "from servewitness_probe import hook\nfor _ in range(3): hook.fire('h')\n"
    with python(probe, code, probed=True) as proc:
        ev = read_process(procfs, proc.pid)
        report = to_report(procfs, ev)
        name = state_name(proc.pid)
    assert ev.probe is not None and ev.unbound == () and ev.note is None
    assert Path(ev.probe.directory).name == name
    assert ev.probe.bindings_file == frozenset() and ev.probe.journal_file is not None
    assert (report.probe_present, _unbound(report)) == (True, ())
    assert UNBOUND not in ids(verdict(report))


def test_a_probed_process_keeps_its_own_state_when_a_forged_one_comes_first(
    tmp_path: Path,
) -> None:
    """A process running an older probe (its state under ``<pid>-<ticks>``, made here by
    renaming a real probe's directory: the process still holds the same files) and a forged
    directory under the new name, which the reader tries first: the process's own is read."""
    probe, procfs = tmp_path / "probe", ProcFS()
    code = "from servewitness_probe import hook\nfor _ in range(7): hook.fire('h')\n"
    with python(probe, code, probed=True) as proc:
        ident = procfs.identity(proc.pid)
        new, legacy = names(ident)
        (probe / new).rename(probe / legacy)
        forge(probe / new, ident, steps=1000)
        ev = read_process(procfs, proc.pid)
    assert ev.probe is not None and Path(ev.probe.directory).name == legacy
    assert [h.fired for h in ev.probe.hooks if h.name == "h"] == [7]
    assert ev.probe.steps.total == 0  # its own counts, not the forged 1000
    assert ev.unbound == ()


def _replace_state(probe: Path, name: str, build: str) -> Path:
    """Swap the directory NAME for a new one (built by the caller in BUILD), as an attacker
    who can write to the probe dir would: the process's own goes, the other takes its name."""
    real = probe / name
    aside = probe / "aside"
    real.rename(aside)
    (probe / build).rename(real)
    return aside


def test_a_hard_link_to_the_real_counters_beside_a_forged_journal_is_refused(
    tmp_path: Path,
) -> None:
    """The counters are the process's real ones (mapped by it), the journal is not: refused."""
    probe, procfs = tmp_path / "probe", ProcFS()
    with python(probe, probed=True) as proc:
        ident = procfs.identity(proc.pid)
        name = names(ident)[0]
        forge(probe / "forged", ident, journal=True)
        (probe / "forged" / L.COUNTERS_FILE).unlink()
        os.link(probe / name / L.COUNTERS_FILE, probe / "forged" / L.COUNTERS_FILE)
        _replace_state(probe, name, "forged")
        ev = read_process(procfs, proc.pid)
    assert ev.probe is None
    (why,) = ev.unbound
    assert why.endswith(f"{name}: the process does not hold its journal.jsonl open")


def test_symbolic_links_to_the_real_files_are_refused(tmp_path: Path) -> None:
    """Variation: symlinks instead of hard links. To the real counters beside a forged
    journal: refused for the journal; to the real journal too: refused as a symlink (the probe
    creates regular files only)."""
    probe, procfs = tmp_path / "probe", ProcFS()
    with python(probe, probed=True) as proc:
        ident = procfs.identity(proc.pid)
        name = names(ident)[0]
        forge(probe / "forged", ident)
        (probe / "forged" / L.COUNTERS_FILE).unlink()
        aside = probe / "aside"
        (probe / "forged" / L.COUNTERS_FILE).symlink_to(aside / L.COUNTERS_FILE)
        _replace_state(probe, name, "forged")
        first = read_process(procfs, proc.pid).unbound
        (probe / name / L.JOURNAL_FILE).unlink()
        (probe / name / L.JOURNAL_FILE).symlink_to(aside / L.JOURNAL_FILE)
        second = read_process(procfs, proc.pid).unbound
    assert [w.split(": ", 1)[1] for w in first] == [
        "the process does not hold its journal.jsonl open"
    ]
    assert [w.split(": ", 1)[1] for w in second] == [
        "its journal.jsonl is a symbolic link (the probe creates regular files only)"
    ]


def test_the_real_journal_and_counters_with_forged_bindings_are_refused(tmp_path: Path) -> None:
    """Variation not in the plan: hard links to all of the process's real files (that is its
    real evidence, and is read as such) plus a forged ``bindings.jsonl`` (request bindings the
    process never wrote): refused as a whole."""
    probe, procfs = tmp_path / "probe", ProcFS()
    with python(probe, probed=True, VERIFIER_PROBE_BINDINGS="0") as proc:
        ident = procfs.identity(proc.pid)
        name = names(ident)[0]
        (probe / "forged").mkdir()
        for f in (L.JOURNAL_FILE, L.COUNTERS_FILE):
            os.link(probe / name / f, probe / "forged" / f)
        _replace_state(probe, name, "forged")
        linked = read_process(procfs, proc.pid)
        rec = {"k": "req", "id": "x", "s0": 1, "s1": 1, "n": 1, "tok": 1, "t0": 1, "t1": 1,
               "f0": 0, "f1": 0, "hooks": {}, "end": "finished"}  # fmt: skip
        (probe / name / L.BINDINGS_FILE).write_text(json.dumps(rec) + "\n")
        forged = read_process(procfs, proc.pid)
    assert linked.probe is not None and linked.unbound == ()  # its own files, under links
    assert forged.probe is None
    (why,) = forged.unbound
    assert why.endswith("the process does not hold its bindings.jsonl open")


FORKER = """
import ctypes, os, sys
libc = ctypes.PyDLL(None)  # PyDLL: the GIL stays held across the call, so the child has it
r, w = os.pipe()
pid = libc.fork()  # a fork outside Python's fork handlers: the probe's do not run in the child
if pid == 0:
    os.close(w)
    os.read(r, 1)
    os._exit(0)
"""


def test_a_child_that_inherited_its_parents_files_is_not_given_its_parents_state(
    tmp_path: Path,
) -> None:
    """A child forked where the probe's fork handlers did not run (a C library's fork) still
    maps its parent's counters and holds its parent's journal. A directory under the child's
    name linking the parent's files: refused, the journal was started by another process."""
    probe, procfs = tmp_path / "probe", ProcFS()
    with python(probe, FORKER, probed=True, after="print(pid, flush=True)") as proc:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        try:
            parent_dir = probe / state_name(proc.pid)
            forged = probe / state_name(child)
            forged.mkdir()
            for f in (L.JOURNAL_FILE, L.COUNTERS_FILE):
                os.link(parent_dir / f, forged / f)
            ev = read_process(procfs, child)
            parent = read_process(procfs, proc.pid)
        finally:
            os.kill(child, signal.SIGKILL)
    assert parent.probe is not None  # the parent's own, bound
    assert ev.probe is None
    (why,) = ev.unbound
    assert f"was started by pid {proc.pid} at tick" in why
    assert f"not by this process (pid {child} at tick" in why


def test_a_child_forked_by_python_holds_none_of_its_parents_files(tmp_path: Path) -> None:
    """Negative control of the above: os.fork runs the probe's handlers; the child closes the
    parent's journal and has its own state."""
    code = """
        import os
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w); os.read(r, 1); os._exit(0)
    """
    probe, procfs = tmp_path / "probe", ProcFS()
    with python(probe, code, probed=True, after="print(pid, flush=True)") as proc:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        time.sleep(0.2)
        parent_journal = os.stat(probe / state_name(proc.pid) / L.JOURNAL_FILE)
        held = procfs.open_files(child, frozenset({L.JOURNAL_FILE}))
        ev = read_process(procfs, child)
    assert (parent_journal.st_dev, parent_journal.st_ino) not in held
    assert ev.probe is not None and ev.probe.mode == "fork" and ev.unbound == ()


PRIVATE = """
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))  # counters (32 KiB) cannot be made
"""


def test_private_counters_are_said_and_a_counters_file_beside_them_is_not_read(
    tmp_path: Path,
) -> None:
    """A probe that could not create shared state maps nothing: its journal is its own (held
    open) and says ``shared: false``; a ``counters`` file planted beside it is not its counts."""
    probe, procfs = tmp_path / "probe", ProcFS()
    with python(probe, PRIVATE + "import servewitness_probe as p; p.start()\n") as proc:
        ident = procfs.identity(proc.pid)
        d = probe / state_name(proc.pid)
        planted = tmp_path / "planted"
        forge(planted, ident, steps=500, journal=False)
        os.replace(planted / L.COUNTERS_FILE, d / L.COUNTERS_FILE)
        ev = read_process(procfs, proc.pid)
        report = to_report(procfs, ev)
    assert ev.probe is not None and ev.probe.shared is False and ev.unbound == ()
    assert ev.probe.steps.total == 0  # not the planted 500
    assert any("counters are private" in n for n in ev.notes)
    assert any("cannot create shared state" in e for e in report.probe_errors)
    # counts the agent cannot read: the liveness evidence is incomplete, never PASS
    assert report.probe_present and "evidence.probe_errors.judged" in ids(verdict(report))


class NoPtraceProcFS(ProcFS):
    """A reader that /proc shows PID's stat, status, cmdline, environ and exe, but not what it
    maps or holds (root reads everything, so the refusal is made here)."""

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid

    def maps(self, pid: int) -> str:
        if pid == self.pid:
            raise ProcessAccessDenied(pid, "maps")
        return super().maps(pid)

    def open_files(self, pid: int, names: frozenset[str]) -> frozenset[tuple[int, int]]:
        if pid == self.pid:
            raise ProcessAccessDenied(pid, "fd")
        return super().open_files(pid, names)


def test_a_binding_that_cannot_be_checked_is_unobservable_never_probed(tmp_path: Path) -> None:
    """State found, but /proc will not show what the process holds: not read on the strength
    of its name; the agent reports the process as refused (unobservable, PENDING)."""
    from servewitness.agent.config import AgentConfig
    from servewitness.agent.runner import Agent

    probe = tmp_path / "probe"
    with python(probe, probed=True, title="vllm-worker") as proc:
        procfs = NoPtraceProcFS(proc.pid)
        with pytest.raises(ProcessAccessDenied, match="maps"):
            read_process(procfs, proc.pid)
        cfg = AgentConfig("unix:/nonexistent", "t", "a", tmp_path / "spool", root_pid=proc.pid,
                          docker_socket=None)  # fmt: skip
        agent = Agent(cfg)
        agent.procfs = agent.containers.procfs = procfs
        try:
            report = agent.collect()
        finally:
            agent.channel.close()
    assert report.processes == ()
    (why,) = report.unobservable
    assert f"pid {proc.pid} (--pid) but /proc refused" in why and "maps" in why
    now = time.time()
    snap = TargetSnapshot("t", (), now, unobservable=report.unobservable)
    assert load_policy(POLICY).evaluate_target(snap, now).verdict == Verdict.PENDING


def test_the_gate_fails_over_grpc_when_state_is_planted(tmp_path: Path) -> None:
    """End to end: a real agent reports the unprobed worker with the forged state beside it to
    a real verifier over gRPC; the run's status is FAIL and names the refused directory."""
    from servewitness.agent.config import AgentConfig
    from servewitness.agent.runner import Agent
    from servewitness.client.api import VerifierClient
    from servewitness.server.app import ServeConfig, VerifierServer

    probe, procfs = tmp_path / "probe", ProcFS()
    addr = f"unix:{tmp_path}/v.sock"
    server = VerifierServer(ServeConfig(addr, str(tmp_path / "db.sqlite3")))
    server.start()
    try:
        with python(probe) as proc:
            ident = procfs.identity(proc.pid)
            name = names(ident)[0]
            forge(probe / name, ident)
            agent = Agent(AgentConfig(addr, "t", "agent-u", tmp_path / "spool", interval_s=0.1,
                                      root_pid=proc.pid, docker_socket=None))  # fmt: skip
            try:
                agent.step()
            finally:
                agent.channel.close()
        with VerifierClient(addr) as client:
            client.register_run("r", POLICY, "p.toml")
            status = client.status("r")
    finally:
        server.stop()
    assert status.verdict == Verdict.FAIL
    (t,) = status.targets
    (f,) = [f for f in t.findings if f.id == UNBOUND]
    assert name in f.message and "does not hold its journal.jsonl open" in f.message


def test_planted_state_gets_any_python_process_reported(tmp_path: Path) -> None:
    """The agent reports vLLM processes (a probe, or vLLM in the command line). A Python
    process that is neither but has state planted under its name is reported too: refused
    evidence is said, not dropped with the process (control: without it, not reported)."""
    from servewitness.agent.discover import discover

    probe, procfs = tmp_path / "probe", ProcFS()
    with python(probe, title="python3") as proc:
        assert discover(procfs, proc.pid) == []
        forge(probe / state_name(proc.pid), procfs.identity(proc.pid))
        (ev,) = discover(procfs, proc.pid)
    assert ev.probe is None and len(ev.unbound) == 1
