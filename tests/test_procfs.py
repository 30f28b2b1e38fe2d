"""``/proc`` parsing over a captured-shape tree (injectable root), no live processes needed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def retitled_child(child: str, env: dict[str, str]) -> Iterator[int]:
    """A parent Python with ENV that starts a child running CHILD (which retitles itself and
    prints "up" when ready); yields the child's pid, ends both on leaving."""
    parent = (
        "import subprocess, sys; "
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}], stdin=sys.stdin); p.wait()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", parent], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"up"
        (kid,) = ProcFS().descendants(proc.pid)[1:]
        yield kid
    finally:
        proc.communicate(b"", timeout=10)


def test_probe_dir_survives_setproctitle_zeroing_the_environment(tmp_path: Path) -> None:
    """vLLM's EngineCore/Worker retitle themselves; setproctitle zeroes /proc/<pid>/environ,
    so the probe directory is taken from the nearest ancestor that still shows it."""
    from servewitness.evidence.process import probe_dirs_of

    child = (
        "import setproctitle, sys; setproctitle.setproctitle('VLLM::Test'); "
        "print('up', flush=True); sys.stdin.read()"
    )
    env = {"PATH": "/usr/bin:/bin", "VERIFIER_PROBE_DIR": str(tmp_path / "probe")}
    with retitled_child(child, env) as kid:
        procfs = ProcFS()
        assert procfs.environ(kid) == {}  # the environment block really is gone
        assert probe_dirs_of(procfs, kid)[0] == str(tmp_path / "probe")


def test_compile_caches_of_a_retitled_process_come_from_the_environment_it_inherited() -> None:
    """A process that retitles itself (vLLM's EngineCore and Workers) and then loads a kernel
    it wrote into its $HOME cache after it started (Triton's, on a GPU): the agent takes the
    cache directories from the parent's environment, which the child inherited, so the kernel
    is generated code and not a library "rewritten in place". The control: the same bytes
    written after the start outside every cache directory are still flagged. Everything lives
    outside /tmp (the default temporary directory is generated whatever the environment)."""
    import shutil
    import uuid

    from servewitness.evidence import places
    from servewitness.evidence.hashing import Hasher
    from servewitness.evidence.judge import generated_dirs
    from servewitness.evidence.native import native_mappings
    from tests.helpers import REPO

    top = REPO / ".scratch" / f"retitled-{uuid.uuid4().hex[:8]}"
    home, elsewhere = top / "home", top / "elsewhere"
    cache = home / ".triton" / "cache"
    for d in (cache, elsewhere, top / "tmp"):
        d.mkdir(parents=True)
    from tests.test_native import LIBZ

    if not LIBZ.exists():
        pytest.skip(f"{LIBZ} is not on this machine (any small shared library would do)")
    lib = str(LIBZ.resolve())
    child = (
        "import ctypes, os, shutil, sys, time, setproctitle\n"
        "setproctitle.setproctitle('VLLM::EngineCore')\n"
        "time.sleep(0.3)\n"  # written well after the start, as a kernel compiled at warm-up
        f"for d in (os.path.expanduser('~/.triton/cache'), {str(elsewhere)!r}):\n"
        f"    ctypes.CDLL(shutil.copy({lib!r}, os.path.join(d, 'kernel.so')))\n"
        "print('up', flush=True); sys.stdin.read()\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(top / "tmp")}
    try:
        with retitled_child(child, env) as kid:
            procfs = ProcFS()
            # The retitled block holds no environment: read as it is, $HOME's caches are unknown.
            assert "HOME" not in procfs.environ(kid)
            assert str(cache) not in places.generated_dirs(procfs.environ(kid))
            gen = generated_dirs(procfs, kid)
            assert str(home / ".cache" / "vllm") in gen and str(cache) in gen
            assert str(top / "tmp") in gen and "/tmp" not in gen  # its TMPDIR, not the default
            ident = procfs.identity(kid)
            states = {
                m.path: m.state
                for m in native_mappings(
                    procfs, kid, Hasher(), start_time=ident.start_time, generated=gen
                )
                if m.path.endswith("kernel.so")
            }
            assert states == {
                str(cache / "kernel.so"): "same",
                str(elsewhere / "kernel.so"): "changed",
            }
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_variable_set_before_the_title_leaves_part_of_the_block_and_it_is_not_believed() -> None:
    """Seen on an H200 (vLLM 0.26's EngineCore): a process that sets an inherited variable
    before it retitles itself (``os.environ[k] = v`` moves that string to the heap) keeps
    every variable after it in ``/proc/<pid>/environ``; setproctitle pads only the strings
    before it. The tail here holds ``PATH`` but not ``HOME``: believed, it would make the
    process's ``$HOME`` caches unknown. The caches still come from the parent's block."""
    from servewitness.evidence.judge import generated_dirs, started_environment

    child = (
        "import os, sys, setproctitle; os.environ['VLLM_SET_EARLY'] = 'changed'; "
        "setproctitle.setproctitle('VLLM::EngineCore'); print('up', flush=True); "
        "sys.stdin.read()"
    )
    home = "/nonexistent/home-of-the-test"
    # The order of the block: HOME before the variable set early, PATH after it.
    env = {"HOME": home, "VLLM_SET_EARLY": "1", "PATH": "/usr/bin:/bin", "LAST": "tail"}
    with retitled_child(child, env) as kid:
        procfs = ProcFS()
        left = procfs.environ(kid)  # what the block shows: the tail, the title's padding before
        assert left.get("PATH") == "/usr/bin:/bin" and left.get("LAST") == "tail"
        assert "HOME" not in left
        assert procfs.environ_as_started(kid) is None
        assert started_environment(procfs, kid)["HOME"] == home
        assert f"{home}/.cache/vllm" in generated_dirs(procfs, kid)


@pytest.mark.parametrize(
    ("block", "overwritten"),
    [
        (b"PATH=/bin\0HOME=/root\0", False),
        (b"", False),  # env -i: nothing, but nothing written over either
        (b"\0" * 64, True),  # all padding
        (b"\0\0\0PATH=/bin\0LAST=x\0", True),  # padding, then the strings after the break
        (b"VLLM::EngineCore\0\0\0PATH=/bin\0", True),  # a title that ran into the block
        (b"PATH=/bin\0\0HOME=/root\0", True),  # an empty string inside: not exec's layout
    ],
)
def test_environ_overwritten(block: bytes, overwritten: bool) -> None:
    from servewitness.evidence.procfs import environ_overwritten

    assert environ_overwritten(block) is overwritten


def test_a_retitled_process_s_environment_is_not_taken_from_outside_its_pid_namespace(
    tmp_path: Path,
) -> None:
    """A retitled process's environment stands in from the nearest ancestor in its own PID
    namespace only: a container's first process is given its environment by the runtime, and
    its parent on the host (the runtime's shim) runs with the host's, whose caches are not the
    container's."""
    from servewitness.evidence.judge import started_environment

    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")

    def proc(pid: int, ppid: int, ns: int, environ: bytes) -> None:
        _proc(root, pid, ppid=ppid, comm="python", cmdline=["VLLM::EngineCore"], ticks=pid)
        (root / str(pid) / "environ").write_bytes(environ)
        (root / str(pid) / "ns").mkdir()
        os.symlink(f"pid:[{ns}]", root / str(pid) / "ns" / "pid")

    proc(10, 1, 4026531836, b"PATH=/usr/bin\0HOME=/host-root\0")  # the shim, on the host
    proc(20, 10, 4026532000, b"\0" * 64)  # the container's first process, retitled
    proc(21, 20, 4026532000, b"\0" * 64)  # its worker, retitled
    proc(30, 10, 4026532111, b"PATH=/bin\0HOME=/home/c\0")  # another container's API server
    proc(31, 30, 4026532111, b"\0" * 64)  # its engine, retitled
    proc(32, 30, 4026532111, b"\0" * 8 + b"PATH=/left\0")  # retitled, a tail left
    procfs = ProcFS(root)
    assert started_environment(procfs, 32) == {"PATH": "/bin", "HOME": "/home/c"}
    assert started_environment(procfs, 21) == {}  # the host's HOME is not the container's
    assert started_environment(procfs, 31) == {"PATH": "/bin", "HOME": "/home/c"}
    assert started_environment(procfs, 30) == {"PATH": "/bin", "HOME": "/home/c"}
