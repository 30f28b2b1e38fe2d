"""Bad input to ``verifier inspect`` gets one clear line and a documented exit code, and so
does a process that exits while it is being read."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import structlog

from servewitness._cli._local import read_local
from servewitness._cli.main import main
from servewitness.evidence.hashing import Hashed, Hasher
from servewitness.evidence.procfs import ProcFS
from tests.helpers import verifier_cli


@pytest.fixture
def sleeper() -> Iterator[int]:
    """A live process that is not Python."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def plain_python() -> Iterator[int]:
    """A live Python process without the probe."""
    proc = _stdin_child()
    try:
        yield proc.pid
    finally:
        proc.communicate(timeout=10)


def _one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stdout == ""
    return lines[0]


def test_pid_that_does_not_exist_exits_4() -> None:
    out = verifier_cli("inspect", "--pid", "999999999")
    assert out.returncode == 4
    assert _one_error_line(out) == "verifier: error: no process with pid 999999999"


def test_pid_that_is_not_python_exits_2(sleeper: int) -> None:
    out = verifier_cli("inspect", "--pid", str(sleeper))
    assert out.returncode == 2
    assert (
        _one_error_line(out)
        == f"verifier: error: pid {sleeper} is not a Python process (/usr/bin/sleep)"
    )


@pytest.mark.parametrize("bad", ["0", "-3"])
def test_non_positive_pid_is_a_usage_error(bad: str) -> None:
    out = verifier_cli("inspect", f"--pid={bad}")
    assert out.returncode == 2
    assert _one_error_line(out) == f"verifier: error: --pid must be a positive integer, got {bad}"


def test_non_numeric_pid_is_a_usage_error() -> None:
    out = verifier_cli("inspect", "--pid", "abc")
    assert out.returncode == 2
    assert "invalid int value: 'abc'" in out.stderr
    assert "Traceback" not in out.stderr


def test_python_process_without_probe_is_reported_as_such(plain_python: int) -> None:
    out = verifier_cli("inspect", "--pid", str(plain_python))
    assert out.returncode == 0, out.stderr
    assert f"pid {plain_python}  unknown" in out.stdout
    assert "PROBE ABSENT" in out.stdout


def test_help_documents_the_exit_codes() -> None:
    out = verifier_cli("--help")
    assert out.returncode == 0
    for line in ("0  success", "2  usage", "4  unavailable", "5  timeout", "10 not authorized"):
        assert line in out.stdout


def _stdin_child() -> subprocess.Popen[str]:
    """A live Python process (no probe) that exits as soon as its stdin is closed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    return proc


def _exited_unreaped(proc: subprocess.Popen[str]) -> None:
    """Close PROC's stdin and wait until it has exited, leaving it a zombie (not reaped)."""
    assert proc.stdin is not None
    proc.stdin.close()
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_inspect_process_exits_mid_scan(
    reaped: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The process exits while its files are being hashed (the hashing hook below makes it
    exit, and waits for that, before the first hash): one error line and exit code 4, not a
    report full of "missing" files. Reaped or still a zombie, it has exited."""
    hash_files = Hasher.hash_files
    calls: list[int] = []
    proc = _stdin_child()
    exit_now = False

    def hooked(self: Hasher, paths: Iterable[str]) -> list[Hashed]:
        calls.append(1)
        if exit_now and len(calls) == 1:
            _exited_unreaped(proc)
            if reaped:
                proc.wait()
        return hash_files(self, paths)

    monkeypatch.setattr(Hasher, "hash_files", hooked)
    try:
        # the control: the same scan of the live process succeeds, and does hash files
        assert main(["inspect", "--pid", str(proc.pid)]) == 0
        assert calls and f"pid {proc.pid}  unknown" in capsys.readouterr().out
        calls.clear()
        exit_now = True
        code = main(["inspect", "--pid", str(proc.pid)])
        out = capsys.readouterr()
        assert calls, "the scan never hashed anything: the process did not exit mid-scan"
        assert proc.poll() is not None  # it did exit during the scan
        assert (code, out.out) == (4, "")
        assert out.err == f"verifier: error: pid {proc.pid} exited while it was being read\n"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def test_tree_child_that_exits_mid_scan_is_left_out_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With --tree, a process under PID that exits mid-scan is not reported as if it ran,
    and not dropped silently: a warning names it. Its parent, still running, is reported."""
    code = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'],"
        " stdin=subprocess.PIPE)\n"
        "print(child.pid, flush=True)\n"
        "sys.stdin.readline()\n"
        "child.stdin.close(); child.wait()\n"
        "print('ended', flush=True)\n"
        "sys.stdin.read()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None and parent.stdin is not None
    child = int(parent.stdout.readline())
    warnings: list[str] = []

    class Log:
        def warning(self, event: str, **kw: object) -> None:
            warnings.append(f"{event}: {kw.get('detail')}")

    monkeypatch.setattr(structlog, "get_logger", lambda *a: Log())
    hash_files = Hasher.hash_files
    end_child = False

    def hooked(self: Hasher, paths: Iterable[str]) -> list[Hashed]:
        paths = list(paths)
        ending = end_child and any(f"/proc/{child}/" in p for p in paths)
        if ending and parent.poll() is None and Path(f"/proc/{child}").exists():
            assert parent.stdin is not None and parent.stdout is not None
            parent.stdin.write("end\n")
            parent.stdin.flush()
            assert parent.stdout.readline().strip() == "ended"  # exited and reaped
        return hash_files(self, paths)

    monkeypatch.setattr(Hasher, "hash_files", hooked)
    procfs = ProcFS()
    try:
        deadline = time.monotonic() + 30
        while len(procfs.descendants(parent.pid)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # the control: both processes are reported while both run
        found = [r.key.pid for _, r in read_local(procfs, parent.pid, tree=True)]
        assert found == [parent.pid, child] and warnings == []
        end_child = True
        found = [r.key.pid for _, r in read_local(procfs, parent.pid, tree=True)]
        assert found == [parent.pid]
        assert warnings == [
            f"process left out: pid {child} (under {parent.pid}) exited while it was being read"
        ]
    finally:
        parent.stdin.close()
        parent.wait(30)
        parent.stdout.close()


def test_logging_set_up_by_an_in_process_cli_run_survives_its_stderr_being_replaced(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """main() configures logging; a later write must go to the stderr of that moment, not to
    the stream that was stderr then (here a capture that is closed and replaced): in CI one
    in-process CLI test broke logging for every test after it ("I/O operation on closed
    file")."""
    import io

    import structlog

    from servewitness import _logging

    old = sys.stderr
    first = io.StringIO()
    sys.stderr = first
    try:
        _logging.configure(0)
        structlog.get_logger("t").warning("one")
        first.close()
        second = io.StringIO()
        sys.stderr = second
        structlog.get_logger("t").warning("two")
    finally:
        sys.stderr = old
        structlog.reset_defaults()
    assert '"event": "two"' in second.getvalue()
