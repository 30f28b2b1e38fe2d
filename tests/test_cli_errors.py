"""Bad input to ``verifier inspect`` gets one clear line and a documented exit code."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

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
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
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
    for line in ("0  success", "2  usage", "4  unavailable", "5  timeout"):
        assert line in out.stdout
