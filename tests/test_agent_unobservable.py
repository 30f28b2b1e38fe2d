"""A PID namespace the agent cannot read: what the agent reports and what the policy makes of it.

A sidecar without SYS_PTRACE, or running as another user than vLLM, sees the vLLM processes in
/proc but may not read them (``exe``, ``environ``, ``maps``, ``root`` need ptrace access; only
``stat``, ``status`` and ``cmdline`` are world-readable). Such a process must not vanish from
the report as if it were not there: the report says which pid /proc refused and what the agent
needs, and the target is unobservable (PENDING), never PASS. Likewise a ``--pid`` the agent
cannot see at all.

The agent's collection code and the policy engine are the real ones throughout. The first
tests fake only the /proc view (root reads everything, so the kernel's refusal cannot be had
for root); :func:`test_a_real_refusal_by_the_kernel` gets the refusal from the kernel itself,
running the agent as ``nobody`` against a process of root's.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servewitness import wire
from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
from servewitness.errors import ProcessAccessDenied
from servewitness.evidence.procfs import ProcessIdentity, ProcFS
from servewitness.model import TargetReport, TargetVerdict, Verdict
from servewitness.policy import TargetSnapshot, load_policy
from tests.helpers import REPO, SOURCE_PATH

POLICY = REPO / "deploy" / "policy.toml"  # the shipped compose policy, as it is
API_SERVER = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
# What the kernel lets anyone read of anyone's process; everything else needs ptrace access.
WORLD_READABLE = ("stat", "status", "cmdline")


def _proc(root: Path, pid: int, ppid: int, cmdline: list[str], exe: str) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    rest = ["S", str(ppid)] + ["0"] * 17 + [str(1000 + pid)] + ["0"] * 30
    (d / "stat").write_bytes(f"{pid} ({Path(cmdline[0]).name}) ".encode() + " ".join(rest).encode())
    (d / "status").write_text(f"Name:\t{Path(cmdline[0]).name}\nNSpid:\t{pid}\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmdline) + b"\0")
    (d / "environ").write_bytes(b"PATH=/usr/bin\0")
    (d / "maps").write_text("")
    (d / "exe").symlink_to(exe)


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """A /proc tree: an init, vLLM's API server and engine core, and an unrelated process."""
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    (root / "sys/kernel/random").mkdir(parents=True)
    (root / "sys/kernel/random/boot_id").write_text("boot-1\n")
    _proc(root, 1, 0, ["/bin/sh", "/entrypoint.sh"], "/bin/sh")
    _proc(root, 100, 1, API_SERVER, "/usr/bin/python3.11")
    _proc(root, 101, 100, ["VLLM::EngineCore"], "/usr/bin/python3.11")
    _proc(root, 200, 1, ["python3", "/srv/other.py"], "/usr/bin/python3.11")
    return root


class RefusingProcFS(ProcFS):
    """The /proc view of a reader without ptrace access to the processes in REFUSE: their
    world-readable files read as usual, everything else (the ``exe`` link first, as
    ``identity`` reads it) is refused with the error the real ProcFS raises on EACCES."""

    def __init__(self, root: Path, refuse: set[int]) -> None:
        super().__init__(root)
        self.refuse = refuse

    def _read(self, pid: int, name: str) -> bytes:
        if pid in self.refuse and name not in WORLD_READABLE:
            raise ProcessAccessDenied(pid, name)
        return super()._read(pid, name)

    def identity(self, pid: int) -> ProcessIdentity:
        if pid in self.refuse:
            for name in WORLD_READABLE:
                self._read(pid, name)
            raise ProcessAccessDenied(pid, "exe")
        return super().identity(pid)


def collect(tmp: Path, procfs: ProcFS, root_pid: int | None = None) -> TargetReport:
    """One report of the real agent over PROCFS, as the verifier decodes it off the wire."""
    cfg = AgentConfig("unix:/nonexistent", "vllm", "test", tmp / "spool", root_pid=root_pid,
                      proc_root=str(procfs.root), docker_socket=None)  # fmt: skip
    agent = Agent(cfg)
    agent.procfs = agent.containers.procfs = procfs
    try:
        report = agent.collect()
    finally:
        agent.channel.close()
    return wire.report_from_bytes(wire.report_to_bytes(report))


def judge(report: TargetReport) -> TargetVerdict:
    now = time.time()
    snap = TargetSnapshot(report.target, report.processes, now, (), 0.0, report.containers,
                          report.unobservable)  # fmt: skip
    return load_policy(POLICY.read_text(), str(POLICY)).evaluate_target(snap, now)


def unobservable(v: TargetVerdict) -> list[str]:
    return [f.message for f in v.findings if f.id == "evidence.unobservable"]


def test_vllm_processes_proc_refuses_are_named_with_what_the_agent_needs(
    tmp_path: Path, proc: Path
) -> None:
    report = collect(tmp_path, RefusingProcFS(proc, {100, 101, 200}))
    assert report.processes == ()
    # One reason per vLLM process /proc refused; the unrelated one (200) is not noise in it.
    assert len(report.unobservable) == 2, report.unobservable
    for pid, why in zip((100, 101), report.unobservable, strict=True):
        assert why.startswith(f"pid {pid} looks like vLLM but /proc refused to show it")
        assert f"cannot read exe of pid {pid}: permission denied" in why
        assert "SYS_PTRACE" in why and "root" in why and "PID namespace" in why
    v = judge(report)
    assert v.verdict == Verdict.PENDING
    msgs = unobservable(v)
    assert len(msgs) == 2 and all("is not fully observable" in m for m in msgs)
    assert "pid 100 looks like vLLM" in msgs[0] and "SYS_PTRACE" in msgs[0]


def test_negative_control_the_same_processes_readable_are_reported_not_refused(
    tmp_path: Path, proc: Path
) -> None:
    """The reasons above come from the refusal, not from the tree: readable, the same two
    processes are in the report (no probe: FAIL on require_probe), and nothing is unobservable."""
    report = collect(tmp_path, ProcFS(proc))
    assert report.unobservable == ()
    assert {p.key.pid for p in report.processes} == {100, 101}
    assert not any(p.probe_present for p in report.processes)
    v = judge(report)
    assert v.verdict == Verdict.FAIL and "evidence.probe_absent" in {f.id for f in v.findings}
    assert unobservable(v) == []


def test_only_the_refused_process_is_noted_when_others_are_readable(
    tmp_path: Path, proc: Path
) -> None:
    report = collect(tmp_path, RefusingProcFS(proc, {101}))
    assert [p.key.pid for p in report.processes] == [100]
    (why,) = report.unobservable
    assert why.startswith("pid 101 looks like vLLM but /proc refused")
    # The readable process is healthy enough to be judged; the refused one still blocks PASS.
    assert judge(report).verdict != Verdict.PASS


def test_the_pid_given_with_pid_is_noted_whatever_its_command_line(
    tmp_path: Path, proc: Path
) -> None:
    """``--pid 1`` on an entrypoint script: asked for, refused, said so."""
    report = collect(tmp_path, RefusingProcFS(proc, {1}), root_pid=1)
    (why,) = report.unobservable
    assert why.startswith("pid 1 (--pid) but /proc refused to show it")
    assert "SYS_PTRACE" in why
    # Its readable children are judged too (no probe: FAIL); the refusal is there beside it.
    v = judge(report)
    assert v.verdict == Verdict.FAIL and [p.key.pid for p in report.processes] == [100, 101]
    assert any(m.endswith(why) for m in unobservable(v))
    # Control: scanning instead, pid 1 is not vLLM-like, so its refusal is not a reason...
    report = collect(tmp_path, RefusingProcFS(proc, {1, 100, 101}))
    assert not any(w.startswith("pid 1 ") for w in report.unobservable)


def test_a_scan_that_sees_no_vllm_process_says_which_namespace_to_share(
    tmp_path: Path, proc: Path
) -> None:
    report = collect(tmp_path, RefusingProcFS(proc, {1, 200}))  # 100, 101 readable but...
    assert {p.key.pid for p in report.processes} == {100, 101}  # ...found: nothing to say
    assert report.unobservable == ()
    for pid in (100, 101):
        shutil.rmtree(proc / str(pid))
    (why,) = collect(tmp_path, ProcFS(proc)).unobservable
    assert why.startswith("no vLLM process is visible in the agent's PID namespace (2 processes")
    assert "shareProcessNamespace: true" in why and "pid: service:" in why


def test_a_pid_the_agent_cannot_see_is_unobservable_with_the_namespace_hint(
    tmp_path: Path,
) -> None:
    """The real /proc: no process can have pid_max as its pid."""
    gone = int(Path("/proc/sys/kernel/pid_max").read_text())
    report = collect(tmp_path, ProcFS("/proc"), root_pid=gone)
    (why,) = report.unobservable
    assert why.startswith(f"pid {gone} (--pid) is not visible to the agent")
    assert "PID namespace the agent does not share" in why
    assert "shareProcessNamespace: true" in why and "--pid container:" in why
    v = judge(report)
    assert v.verdict == Verdict.PENDING
    assert any(f"pid {gone} (--pid) is not visible" in m for m in unobservable(v))
    # Control: a pid it does see, a plain process with no vLLM under it (not the test's own
    # process: under the suite, a session vLLM server runs as its child), is not "not visible".
    plain = subprocess.Popen(["sleep", "60"])
    try:
        (why,) = collect(tmp_path, ProcFS("/proc"), root_pid=plain.pid).unobservable
    finally:
        plain.kill()
        plain.wait()
    assert why == f"no vLLM process under pid {plain.pid} (--pid)"


# The agent, run as `nobody`, over the real /proc: one report of PID's tree, as wire bytes.
_AGENT = """
import os, sys, tempfile
from pathlib import Path
from servewitness import wire
from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
pid = int(sys.argv[1])
try:
    os.readlink(f"/proc/{pid}/exe")
except PermissionError:
    pass
else:
    if os.geteuid() != 0:
        print("NO-REFUSAL"); sys.exit(0)
cfg = AgentConfig("unix:/nonexistent", "vllm", "t", Path(tempfile.mkdtemp()), root_pid=pid,
                  docker_socket=None)
agent = Agent(cfg)
sys.stdout.write(wire.report_to_bytes(agent.collect()).hex())
agent.channel.close()
"""


def _agent_as(user: list[str], pid: int) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": SOURCE_PATH,
           "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp"}  # fmt: skip
    out = subprocess.run([*user, sys.executable, "-c", _AGENT, str(pid)], capture_output=True,
                         text=True, timeout=120, cwd="/", env=env, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


# A parent (no "vllm" in its own command line) and its child whose command line names vLLM.
_PARENT = "import os, subprocess, sys; subprocess.run([sys.executable, '-c', " \
    "'import time; time.sleep(120)', os.environ['CHILD_ARG']])"  # fmt: skip


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and (d / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(
                pid
            ):
                out.append(int(d.name))
        except (OSError, IndexError):
            continue
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to own the target and drop to nobody")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_a_real_refusal_by_the_kernel() -> None:
    """Processes of root's, read by the agent running as ``nobody`` (no ptrace access to them):
    the kernel refuses their ``exe``, and the report names both, the ``--pid`` and its child
    whose command line names vLLM. Control: the same agent code as root reads them and reports
    the vLLM one."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT],
        env={**os.environ, "CHILD_ARG": "vllm.entrypoints.openai.api_server"},
        start_new_session=True,
    )
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    try:
        deadline = time.monotonic() + 30
        while not (kids := _children(parent.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        (child,) = kids
        out = _agent_as(nobody, parent.pid)
        if out == "NO-REFUSAL":
            pytest.skip("this kernel lets nobody read another user's /proc/<pid>/exe")
        report = wire.report_from_bytes(bytes.fromhex(out))
        assert report.processes == ()
        first, second = report.unobservable
        assert first.startswith(f"pid {parent.pid} (--pid) but /proc refused to show it")
        assert second.startswith(f"pid {child} looks like vLLM but /proc refused to show it")
        assert f"cannot read exe of pid {child}: permission denied" in second
        assert "SYS_PTRACE" in second and "root" in second
        v = judge(report)
        assert v.verdict == Verdict.PENDING
        assert any(f"pid {child} looks like vLLM" in m for m in unobservable(v))
        # Control: root may read them; the vLLM one is reported (no probe), nothing refused.
        seen = wire.report_from_bytes(bytes.fromhex(_agent_as([], parent.pid)))
        assert seen.unobservable == ()
        assert [p.key.pid for p in seen.processes] == [child]
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
