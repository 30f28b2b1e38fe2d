"""Native mappings of a real process: hashed as mapped, and drift on disk becomes a finding."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servewitness.evidence.hashing import Hasher
from servewitness.evidence.native import native_mappings
from servewitness.evidence.procfs import ProcFS
from servewitness.model import NativeMapping, ProcessKey, ProcessReport, Verdict
from servewitness.policy import TargetSnapshot, load_policy
from tests.helpers import not_vllm_policy

LIBZ = Path("/usr/lib/x86_64-linux-gnu/libz.so.1")


@pytest.fixture
def mapped(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A Python process that has dlopen()ed its own copy of a shared library."""
    if not LIBZ.exists():
        pytest.skip(f"{LIBZ} is not on this machine (any small shared library would do)")
    lib = tmp_path / "libcopy.so"
    shutil.copyfile(LIBZ.resolve(), lib)
    code = (
        f"import ctypes, sys; ctypes.CDLL({str(lib)!r}); print('up', flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    try:
        yield proc.pid, lib
    finally:
        proc.communicate(timeout=10)


def _ours(pid: int, lib: Path) -> NativeMapping:
    (m,) = [m for m in native_mappings(ProcFS(), pid, Hasher()) if m.path == str(lib)]
    return m


def _verdict(m: NativeMapping) -> tuple[Verdict, list[str]]:
    proc = ProcessReport(
        key=ProcessKey("b", 1, 1), ns_pid=1, ppid=0, start_time=1.0, role="worker", rank=0,
        container_id=None, cmdline=(), exe="", probe_present=True, native_mappings=(m,),
    )  # fmt: skip
    v = load_policy(not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\n')).evaluate_target(
        TargetSnapshot("t", (proc,), time.time()), time.time()
    )
    return v.verdict, [f.id for f in v.findings]


def test_mapped_library_is_hashed_as_mapped_and_reads_same(mapped: tuple[int, Path]) -> None:
    pid, lib = mapped
    m = _ours(pid, lib)
    assert (m.state, m.sha256) == ("same", hashlib.sha256(lib.read_bytes()).hexdigest())
    assert "provenance.native.replaced" not in _verdict(m)[1]


def test_library_replaced_on_disk_under_a_live_mapping_is_a_finding(
    mapped: tuple[int, Path],
) -> None:
    pid, lib = mapped
    original = hashlib.sha256(lib.read_bytes()).hexdigest()
    other = lib.with_name("other.so")
    other.write_bytes(lib.read_bytes() + b"patched")
    os.replace(other, lib)  # the path now names another inode; the old one stays mapped
    m = _ours(pid, lib)
    assert (m.state, m.sha256) == ("replaced", original)
    verdict, found = _verdict(m)
    assert (verdict, "provenance.native.replaced" in found) == (Verdict.FAIL, True)


def test_library_deleted_under_a_live_mapping_is_a_finding(mapped: tuple[int, Path]) -> None:
    pid, lib = mapped
    original = hashlib.sha256(lib.read_bytes()).hexdigest()
    lib.unlink()
    m = _ours(pid, lib)
    assert (m.state, m.sha256) == ("deleted", original)  # still hashed: map_files keeps the inode
    verdict, found = _verdict(m)
    assert (verdict, "provenance.native.deleted" in found) == (Verdict.FAIL, True)


MEMFD_LOADER = """
import ctypes, os, sys
data = open(sys.argv[1], "rb").read()
fd = os.memfd_create(sys.argv[2])
os.write(fd, data)
lib = ctypes.CDLL(f"/proc/self/fd/{fd}")
assert lib.zlibVersion  # its code runs: no file on any disk holds it
CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)
cb = CB(lambda x: x + 1)  # a libffi closure: code written to memory, no ELF file
assert cb(1) == 2
print("up", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("name", ["payload", "libffi"])
def test_a_library_dlopened_from_memory_is_a_finding(tmp_path: Path, name: str) -> None:
    """Attack (a red-team helper's): copy a shared library into a memfd and dlopen it through
    /proc/self/fd: its code runs, and no file on any disk holds it. Before, memfd mappings were
    skipped as JIT code and the process PASSed with no native library to say so. Now a memfd
    mapping whose file is an ELF object is ``memory`` (ERROR), whatever the memfd is called
    (a JIT's or libffi's name too); a libffi closure in the same process (code in memory, no
    ELF file) is not reported."""
    if not LIBZ.exists():
        pytest.skip(f"{LIBZ} is not on this machine (any small shared library would do)")
    proc = subprocess.Popen(
        [sys.executable, "-c", MEMFD_LOADER, str(LIBZ.resolve()), name],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        got = native_mappings(ProcFS(), proc.pid, Hasher())
    finally:
        proc.communicate(timeout=10)
    loaded = [m for m in got if m.state == "memory"]
    assert [m.path for m in loaded] == [f"/memfd:{name}"], [(m.path, m.state) for m in got]
    assert loaded[0].sha256 == hashlib.sha256(LIBZ.read_bytes()).hexdigest()
    assert [m for m in got if m.path.startswith("/memfd:") and m.state != "memory"] == []
    verdict, ids = _verdict(loaded[0])
    assert verdict == Verdict.FAIL and "provenance.native.from_memory" in ids, ids


def _fake_proc(tmp_path: Path, pid: int, maps: str) -> ProcFS:
    """A /proc with PID's maps and root but no map_files: what a sidecar with SYS_PTRACE and
    without CAP_CHECKPOINT_RESTORE gets (opening map_files is refused)."""
    d = tmp_path / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "maps").write_text(maps)
    (d / "root").symlink_to("/")
    return ProcFS(tmp_path / "proc")


def test_map_files_refused_falls_back_to_the_path_only_when_it_is_the_mapped_inode(
    mapped: tuple[int, Path], tmp_path: Path
) -> None:
    pid, lib = mapped
    maps = Path(f"/proc/{pid}/maps").read_text()
    (m,) = [m for m in native_mappings(_fake_proc(tmp_path, pid, maps), pid, Hasher())
            if m.path == str(lib)]  # fmt: skip
    assert (m.state, m.sha256) == ("same", hashlib.sha256(lib.read_bytes()).hexdigest())
    # The same maps with another inode number: the path is not provably the mapped file.
    st = lib.stat()
    forged = maps.replace(f" {st.st_ino} ", f" {st.st_ino + 1} ")
    (m,) = [m for m in native_mappings(_fake_proc(tmp_path / "b", pid, forged), pid, Hasher())
            if m.path == str(lib)]  # fmt: skip
    assert (m.state, m.sha256) == ("unreadable", None)


def test_unreadable_maps_is_a_finding_not_no_native_code(
    mapped: tuple[int, Path], tmp_path: Path
) -> None:
    """Maps that cannot be read say nothing about the native code: one ``unreadable`` entry
    for the maps file, which the policy reports (provenance.native.unreadable)."""
    pid, _ = mapped
    d = tmp_path / "proc" / str(pid)
    (d / "maps").mkdir(parents=True)  # reading it fails (as root, chmod would not)
    (d / "root").symlink_to("/")
    (m,) = native_mappings(ProcFS(tmp_path / "proc"), pid, Hasher())
    assert (m.path, m.sha256, m.state) == (str(d / "maps"), None, "unreadable")
    assert m.error is not None and m.error.startswith(f"cannot read {d / 'maps'}: ")
    assert "provenance.native.unreadable" in _verdict(m)[1]
    # and the process's real maps (the control) list its libraries, all readable
    real = native_mappings(ProcFS(), pid, Hasher())
    assert len(real) > 1 and {n.state for n in real} == {"same"}
