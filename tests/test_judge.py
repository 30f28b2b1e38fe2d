"""The agent's judgement under hostile conditions: permission errors and processes that exit
mid-scan give findings or clear outcomes, never a crash and never a silent skip."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
from servewitness.evidence.hashing import Hasher
from servewitness.evidence.judge import cross_check
from servewitness.evidence.process import read_process
from servewitness.evidence.procfs import ProcFS
from servewitness.model import FileEntry
from tests.helpers import probe_env, swept, system_libz, wait_ready

NOBODY = 65534


def test_permission_denied_is_a_disagreement_with_its_reason() -> None:
    """As an unprivileged agent, a file the process loaded but the agent may not read is a
    disagreement saying "permission denied" (the file is not skipped)."""
    with tempfile.TemporaryDirectory(prefix="verifier-perm-") as d:
        _permission_case(Path(d))


def _permission_case(tmp_path: Path) -> None:
    secret = tmp_path / "secret.py"
    secret.write_text("X = 1\n")
    secret.chmod(0o600)  # root's; the child below is nobody
    tmp_path.chmod(0o755)
    readable = tmp_path / "open.py"
    readable.write_text("Y = 2\n")
    # A captured /proc whose process root is "/": paths resolve as on this machine.
    proc_root = tmp_path / "proc"
    (proc_root / "4242").mkdir(parents=True)
    (proc_root / "4242" / "root").symlink_to("/")
    files = tuple(
        FileEntry(str(p), hashlib.sha256(p.read_bytes()).hexdigest(), 6, "source", None, "load")
        for p in (secret, readable)
    )
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, judge, report through the pipe
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            got, _ = cross_check(ProcFS(proc_root), 4242, files, Hasher(), start_time=0.0)
            os.write(w, json.dumps([[d.path, d.reason, d.sha256_agent] for d in got]).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    assert json.loads(data) == [[str(secret), "permission denied", None]]


def test_process_exiting_mid_scan_is_reported_gone_not_as_disagreements(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = "import sys, time, json; open(sys.argv[1], 'w').write('ok'); time.sleep(600)"
    env = probe_env(tmp_path / "probe", VERIFIER_PROBE_EARLY="1")
    proc = subprocess.Popen([sys.executable, "-c", code, str(ready)], env=env)
    try:
        wait_ready(proc, ready)
        swept(tmp_path / "probe", proc.pid)
        procfs = ProcFS()
        ev = read_process(procfs, proc.pid)  # discovered while it ran ...
        assert ev.probe is not None and ev.probe.files
    finally:
        proc.send_signal(signal.SIGKILL)  # ... and gone before its files are judged
        proc.wait()
    agent = Agent(AgentConfig("127.0.0.1:9", "t", "a", tmp_path / "spool", root_pid=os.getpid()))
    try:
        assert agent.judged.report(ev) is None  # not a report full of "missing" files
    finally:
        agent.channel.close()


def test_stale_pyc_rewritten_by_its_loader_is_not_drift(tmp_path: Path) -> None:
    """The interpreter reads a stale pyc, rejects it, compiles the source and writes a new pyc
    over it (in a writable container layer this happens to every bind-mounted or patched
    module). The rejected pyc never ran, so its new bytes are not a file modified after load."""
    import py_compile

    from servewitness.evidence.judge import judge
    from servewitness.model import DRIFT_MODIFIED_AFTER_LOAD

    src = tmp_path / "mods" / "rewritten.py"
    src.parent.mkdir()
    src.write_text("X = 1\n")
    compiled = py_compile.compile(str(src))
    assert compiled is not None
    pyc = Path(compiled)
    os.utime(pyc, (1, 1))  # older than anything below
    time.sleep(0.05)
    src.write_text("X = 2  # changed, another size\n")
    ready = tmp_path / "ready"
    code = (
        "import sys, time, rewritten; assert rewritten.X == 2; "
        "open(sys.argv[1], 'w').write('ok'); time.sleep(600)"
    )
    env = probe_env(tmp_path / "probe", VERIFIER_PROBE_EARLY="1", PYTHONPATH=str(src.parent))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # set on this machine; containers write pycs
    proc = subprocess.Popen([sys.executable, "-c", code, str(ready)], env=env)
    try:
        wait_ready(proc, ready)
        time.sleep(1.0)
        procfs = ProcFS()
        ev = read_process(procfs, proc.pid)
        assert ev.probe is not None
        entries = [f for f in ev.probe.files if f.path == str(pyc)]
        assert entries and entries[0].at == "rejected"  # the loader read it and rejected it
        hashed = ev.probe.hashed_at.get(str(pyc), 0.0)
        assert pyc.stat().st_ctime_ns > int(hashed * 1e9)  # and rewrote it since
        files = tuple(
            FileEntry(f.path, f.sha256, f.size, f.kind, f.module, f.at) for f in ev.probe.files
        )
        got = judge(procfs, proc.pid, ev.probe, files, Hasher(), start_time=0.0)
        assert not [d for d in got.drift if d.path == str(pyc)], got.drift
        assert not [d for d in got.disagreements if d.path == str(pyc)], got.disagreements
        assert DRIFT_MODIFIED_AFTER_LOAD not in {d.id for d in got.drift}
    finally:
        proc.kill()
        proc.wait()


def test_native_libraries_of_a_live_process_are_judged_against_their_record(
    tmp_path: Path,
) -> None:
    """A real process maps three copies of a library from a distribution's package folder:
    one as its RECORD lists it, one whose RECORD row has other bytes, one its RECORD does not
    list. The judgement classes each by the mapped inode; a malformed RECORD row is drift."""
    from servewitness.evidence.judge import judge
    from servewitness.model import DRIFT_RECORD_UNREADABLE, Origin

    site = tmp_path / "site"
    (site / "natty").mkdir(parents=True)
    data = system_libz().read_bytes()
    for name in ("libok.so", "libbad.so", "libnew.so"):
        (site / "natty" / name).write_bytes(data)

    def row(rel: str, content: bytes) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).decode().rstrip("=")
        return f"{rel},sha256={digest},{len(content)}"

    info = site / "natty-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: natty\nVersion: 1.0\n")
    rows = [row("natty/libok.so", data), row("natty/libbad.so", data + b"published")]
    rows += ["natty/broken.py,sha256=!!!,3", "natty-1.0.dist-info/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    ready = tmp_path / "ready"
    code = (
        "import ctypes, sys, time\n"
        "for name in ('libok.so', 'libbad.so', 'libnew.so'):\n"
        "    ctypes.CDLL(sys.argv[2] + '/natty/' + name)\n"
        "open(sys.argv[1], 'w').write('ok'); time.sleep(600)\n"
    )
    env = probe_env(tmp_path / "probe", VERIFIER_PROBE_EARLY="1")
    proc = subprocess.Popen([sys.executable, "-c", code, str(ready), str(site)], env=env)
    try:
        wait_ready(proc, ready)
        procfs = ProcFS()
        ev = read_process(procfs, proc.pid)
        assert ev.probe is not None
        files = tuple(
            FileEntry(f.path, f.sha256, f.size, f.kind, f.module, f.at) for f in ev.probe.files
        )
        hasher = Hasher()
        blind = judge(procfs, proc.pid, ev.probe, files, hasher, start_time=0.0, native=())
        got = judge(procfs, proc.pid, ev.probe, files, hasher, start_time=0.0, reuse=blind)
    finally:
        proc.kill()
        proc.wait()
    assert blind.provenance is not None and got.provenance is not None
    # the control: without the native mappings nothing of natty was loaded
    assert "natty" not in {d for d, _, _ in blind.provenance.distributions}
    by_path = {f.path: f for f in got.provenance.files}
    bad, new = by_path[str(site / "natty/libbad.so")], by_path[str(site / "natty/libnew.so")]
    assert (bad.origin, bad.distribution, bad.record_path) == (
        Origin.PATCHED,
        "natty",
        "natty/libbad.so",
    )
    assert bad.sha256 == hashlib.sha256(data).hexdigest() != bad.expected_sha256
    assert (new.origin, new.distribution) == (Origin.ADDED, "natty")
    assert str(site / "natty/libok.so") not in by_path  # pristine: counted, not listed
    assert ("natty", "1.0", 3) in got.provenance.distributions
    faults = [d for d in got.drift if d.id == DRIFT_RECORD_UNREADABLE]
    assert [d.path for d in faults] == [str(info / "RECORD")]
