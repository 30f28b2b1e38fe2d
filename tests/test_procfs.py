"""``/proc`` parsing over a captured-shape tree (injectable root), no live processes needed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from servewitness.errors import NoSuchProcess
from servewitness.evidence.process import _role_from_title
from servewitness.evidence.procfs import ProcFS


def _proc(root: Path, pid: int, *, ppid: int, comm: str, cmdline: list[str], ticks: int) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    # Fields 3 (state) and 4 (ppid), 5..21, then 22 (start time in ticks), then the rest.
    rest = ["S", str(ppid)] + ["0"] * 17 + [str(ticks)] + ["0"] * 30
    (d / "stat").write_bytes(f"{pid} ({comm}) ".encode() + " ".join(rest).encode())
    (d / "status").write_text(f"Name:\t{comm}\nNSpid:\t{pid}\t{pid % 100}\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmdline) + b"\0")
    (d / "environ").write_bytes(b"A=1\0VERIFIER_PROBE_DIR=/x/y\0")


@pytest.fixture
def tree(tmp_path: Path) -> ProcFS:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    (root / "sys/kernel/random").mkdir(parents=True)
    (root / "sys/kernel/random/boot_id").write_text("boot-1\n")
    _proc(
        root,
        100,
        ppid=1,
        comm="python",
        cmdline=["python", "-m", "vllm.entrypoints.openai.api_server"],
        ticks=500,
    )
    _proc(root, 101, ppid=100, comm="we (ird) name", cmdline=["VLLM::EngineCore"], ticks=600)
    _proc(root, 102, ppid=101, comm="python", cmdline=["VLLM::Worker_TP1"], ticks=700)
    _proc(root, 200, ppid=1, comm="other", cmdline=["other"], ticks=800)
    return ProcFS(root)


def test_identity_survives_parentheses_and_spaces_in_the_command_name(tree: ProcFS) -> None:
    ident = tree.identity(101)
    assert (ident.comm, ident.ppid, ident.start_ticks, ident.ns_pid) == (
        "we (ird) name",
        100,
        600,
        1,
    )
    assert ident.boot_id == "boot-1"
    assert ident.start_time == 1700000000 + 600 / os.sysconf("SC_CLK_TCK")


def test_descendants_are_listed_parents_first(tree: ProcFS) -> None:
    assert tree.descendants(100) == [100, 101, 102]
    assert tree.descendants(102) == [102]


def test_missing_pid_raises_no_such_process(tree: ProcFS) -> None:
    with pytest.raises(NoSuchProcess, match="no process with pid 555"):
        tree.identity(555)


def test_environ_is_parsed(tree: ProcFS) -> None:
    assert tree.environ(100)["VERIFIER_PROBE_DIR"] == "/x/y"


@pytest.mark.parametrize(
    ("pid", "role"),
    [
        (100, ("api_server", None)),
        (101, ("engine_core", None)),
        (102, ("worker", 1)),
        (200, ("unknown", None)),
    ],
)
def test_role_falls_back_to_the_process_title(
    tree: ProcFS, pid: int, role: tuple[str, int | None]
) -> None:
    assert _role_from_title(tree.identity(pid)) == role


def test_probe_dir_survives_setproctitle_zeroing_the_environment(tmp_path: Path) -> None:
    """vLLM's EngineCore/Worker retitle themselves; setproctitle zeroes /proc/<pid>/environ,
    so the probe directory is taken from the nearest ancestor that still shows it."""
    import subprocess
    import sys

    from servewitness.evidence.process import probe_dirs_of

    child = (
        "import setproctitle, sys; setproctitle.setproctitle('VLLM::Test'); "
        "print('up', flush=True); sys.stdin.read()"
    )
    parent = (
        "import subprocess, sys; "
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}], stdin=sys.stdin); p.wait()"
    )
    env = {"PATH": "/usr/bin:/bin", "VERIFIER_PROBE_DIR": str(tmp_path / "probe")}
    proc = subprocess.Popen(
        [sys.executable, "-c", parent], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"up"
        procfs = ProcFS()
        (kid,) = procfs.descendants(proc.pid)[1:]
        assert procfs.environ(kid) == {}  # the environment block really is gone
        assert probe_dirs_of(procfs, kid)[0] == str(tmp_path / "probe")
    finally:
        proc.communicate(b"", timeout=10)
