"""Libraries changed in place while mapped (issue 18, class 4): a shared library loaded with
``ctypes.CDLL`` and overwritten in place (the same inode, as ``cp`` does) reads the same
through the mapping and through its path, so the path comparison says ``same``. Whatever ran
before the write (its constructors, anything it patched in the process) ran unseen. The agent
flags it (state ``changed``, ``provenance.native.changed_in_place``, an ERROR) when the mapped
inode's ctime is after the process started, and when the mapped bytes differ from the first
it saw (``NativeMemory``, per process and mapping, forgotten when the process goes).

Each attack is built on a real probed process that maps its own copy of a system library."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
from servewitness.evidence.native import NativeMemory
from servewitness.evidence.process import read_process
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.report import to_report
from servewitness.model import NativeMapping, ProcessKey, ProcessReport, Verdict
from servewitness.policy import TargetSnapshot, load_policy
from tests.helpers import not_vllm_policy, probe_env, system_libz

CHANGED = "provenance.native.changed_in_place"


class Mapper:
    """A probed Python process that maps LIB (``ctypes.CDLL``) and waits. CREATE: the process
    writes LIB itself, from SOURCE, after it started (a compile cache's output)."""

    def __init__(self, tmp: Path, lib: Path, create_from: Path | None = None) -> None:
        self.lib = lib
        scratch = tmp / "scratch"
        scratch.mkdir(exist_ok=True)
        make = ""
        if create_from is not None:
            make = f"import shutil; shutil.copyfile({str(create_from)!r}, {str(lib)!r})\n"
        code = (
            "import ctypes, sys, time, servewitness_probe as p\n"
            "p.start()\n"
            f"{make}"
            f"ctypes.CDLL({str(lib)!r})\n"
            "time.sleep(0.2)\n"  # a process that runs a while before anything is rewritten
            "print('up', flush=True); sys.stdin.read()\n"
        )
        env = probe_env(tmp / "probe", TMPDIR=str(scratch))
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "up"
        self.agent = Agent(AgentConfig("unix:/", "t", "a", tmp / "spool", root_pid=self.proc.pid))

    def collect(self) -> ProcessReport:
        """The agent's report of the process (it remembers what it saw between calls)."""
        (p,) = self.agent.collect().processes
        return p

    def once(self) -> ProcessReport:
        """A one-shot report (``verifier inspect``): no memory of an earlier look."""
        procfs = ProcFS()
        return to_report(procfs, read_process(procfs, self.proc.pid))

    def mapping(self, report: ProcessReport) -> NativeMapping:
        (m,) = [m for m in report.native_mappings if m.path == str(self.lib)]
        return m

    def stop(self) -> None:
        self.agent.channel.close()
        self.proc.communicate(timeout=10)


@pytest.fixture
def mappers() -> Iterator[list[Mapper]]:
    made: list[Mapper] = []
    yield made
    for m in made:
        m.stop()


def copy_of_libz(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    lib = where / "libcopy.so"
    shutil.copyfile(system_libz().resolve(), lib)
    return lib


def patched(lib: Path) -> bytes:
    """LIB's bytes with its last 64 changed (the same size: an attacker's build of it)."""
    data = lib.read_bytes()
    return data[:-64] + bytes(b ^ 0x5A for b in data[-64:])


def cp_over(lib: Path, data: bytes, tmp: Path) -> None:
    """Overwrite LIB in place with DATA the way `cp` does (O_TRUNC on the same inode)."""
    src = tmp / "src.so"
    src.write_bytes(data)
    ino = lib.stat().st_ino
    subprocess.run(["cp", str(src), str(lib)], check=True)
    assert lib.stat().st_ino == ino  # the same inode: the mapping sees the new bytes


def verdict(report: ProcessReport) -> tuple[Verdict, list[str]]:
    report = dataclasses.replace(report, role="worker")
    v = load_policy(not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\n')).evaluate_target(
        TargetSnapshot("t", (report,), time.time()), time.time()
    )
    return v.verdict, [f.id for f in v.findings]


def test_an_untouched_library_stays_same(tmp_path: Path, mappers: list[Mapper]) -> None:
    """The negative control: copied before the process started, never written again."""
    m = Mapper(tmp_path, copy_of_libz(tmp_path / "libs"))
    mappers.append(m)
    assert (m.mapping(m.collect()).state, m.mapping(m.collect()).state) == ("same", "same")
    report = m.once()
    assert [n.path for n in report.native_mappings if n.state != "same"] == []
    assert CHANGED not in verdict(report)[1]


def test_a_library_overwritten_in_place_before_the_agent_looked_is_changed(
    tmp_path: Path, mappers: list[Mapper]
) -> None:
    """The attack, seen at first sight: the library is overwritten in place (``cp``) after
    the process mapped it, before any agent looked. Both the mapping and the path read the
    new bytes (the path comparison says ``same``); the inode's ctime, after the process
    started, says it was rewritten."""
    lib = copy_of_libz(tmp_path / "libs")
    m = Mapper(tmp_path, lib)
    mappers.append(m)
    new = patched(lib)
    cp_over(lib, new, tmp_path)
    got = m.mapping(m.once())
    assert got.sha256 == hashlib.sha256(new).hexdigest()  # the new bytes, through the mapping
    assert got.state == "changed" and "ctime" in (got.detail or ""), got
    v, ids = verdict(m.once())
    assert (v, CHANGED in ids) == (Verdict.FAIL, True)


def test_truncated_and_rewritten_with_its_mtime_put_back_is_changed(
    tmp_path: Path, mappers: list[Mapper]
) -> None:
    """Variation: truncated and written again (not ``cp``), the same size, and its mtime set
    back: inode, size and mtime all say nothing happened; the ctime does not."""
    lib = copy_of_libz(tmp_path / "libs")
    m = Mapper(tmp_path, lib)
    mappers.append(m)
    st = lib.stat()
    new = patched(lib)
    with lib.open("r+b") as f:
        f.truncate(0)
        f.write(new)
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = lib.stat()
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
    got = m.mapping(m.once())
    assert got.state == "changed" and got.sha256 == hashlib.sha256(new).hexdigest()


def test_a_library_overwritten_after_the_agent_saw_it_is_changed(
    tmp_path: Path, mappers: list[Mapper]
) -> None:
    """The attack, seen by the agent's memory: the library is one the process wrote itself
    after it started, under its temporary directory (as Triton's launchers and torch
    inductor's kernels are), where a ctime after the start says nothing. The agent saw its
    bytes; they are overwritten in place; its next look sees other bytes than the first. A
    one-shot look after the write cannot tell (the documented limit)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    lib = scratch / "libgen.so"
    m = Mapper(tmp_path, lib, create_from=system_libz().resolve())
    mappers.append(m)
    first = m.mapping(m.collect())
    assert first.state == "same", first  # created after the start: no false alarm
    cp_over(lib, patched(lib), tmp_path)
    assert m.mapping(m.once()).state == "same"  # no memory, and the ctime is not judged here
    again = m.mapping(m.collect())
    assert again.state == "changed" and "first read" in (again.detail or ""), again
    assert first.sha256 and first.sha256[:12] in (again.detail or "")
    assert m.mapping(m.collect()).state == "changed"  # sticky: the first bytes are kept
    v, ids = verdict(m.collect())
    assert (v, CHANGED in ids) == (Verdict.FAIL, True)


def test_a_library_overwritten_and_put_back_is_still_changed(
    tmp_path: Path, mappers: list[Mapper]
) -> None:
    """Variation: overwritten in place with the attacker's bytes and then with the original
    ones again, between two looks of the agent. The bytes are the ones it first saw, so its
    memory says nothing; the ctime still does."""
    lib = copy_of_libz(tmp_path / "libs")
    m = Mapper(tmp_path, lib)
    mappers.append(m)
    original = lib.read_bytes()
    assert m.mapping(m.collect()).state == "same"
    cp_over(lib, patched(lib), tmp_path)
    cp_over(lib, original, tmp_path)
    got = m.mapping(m.collect())
    assert got.sha256 == hashlib.sha256(original).hexdigest()
    assert got.state == "changed" and "ctime" in (got.detail or ""), got


def test_a_library_the_process_wrote_itself_after_it_started_is_not_flagged(
    tmp_path: Path, mappers: list[Mapper]
) -> None:
    """Control: a compile cache's output under the process's temporary directory, written
    after the process started and then mapped (Triton, torch inductor): same."""
    lib = tmp_path / "scratch" / "libkernel.so"
    m = Mapper(tmp_path, lib, create_from=system_libz().resolve())
    mappers.append(m)
    assert lib.stat().st_ctime > m.agent.procfs.identity(m.proc.pid).start_time
    assert m.mapping(m.collect()).state == "same"
    assert CHANGED not in verdict(m.once())[1]


def test_the_memory_is_bounded_and_forgets_processes_that_are_gone() -> None:
    class Small(NativeMemory):
        MAX_PROCESSES = 2
        MAX_MAPPINGS = 1

    mem = Small()

    def maps(sha: str) -> tuple[NativeMapping, ...]:
        return (
            NativeMapping("/a.so", sha, 1, "same", None, "08:01", 1),
            NativeMapping("/b.so", sha, 1, "same", None, "08:01", 2),
        )

    one, two, three = (ProcessKey("b", pid, 1) for pid in (1, 2, 3))
    assert [m.state for m in mem.check(one, maps("a" * 64))] == ["same", "same"]
    # only the first mapping is remembered (MAX_MAPPINGS): the second is not judged by memory
    assert [m.state for m in mem.check(one, maps("b" * 64))] == ["changed", "same"]
    mem.check(two, maps("a" * 64))
    mem.check(three, maps("a" * 64))  # the oldest process is forgotten
    assert len(mem) == 2
    assert [m.state for m in mem.check(one, maps("c" * 64))] == ["same", "same"]  # anew
    mem.forget({three})
    assert len(mem) == 1
    # a pid reused (another start) is another process
    assert mem.check(ProcessKey("b", 3, 2), maps("d" * 64))[0].state == "same"
    unreadable = NativeMapping("/c.so", None, -1, "unreadable", "why", "08:01", 3)
    assert mem.check(three, (unreadable,)) == (unreadable,)
    # a mapping no longer mapped is forgotten: its inode number, freed, may name another file
    four = ProcessKey("b", 4, 1)
    mem.check(four, maps("a" * 64)[:1])
    other = NativeMapping("/other.so", "e" * 64, 1, "same", None, "08:01", 9)
    mem.check(four, (other,))
    assert mem.check(four, (dataclasses.replace(other, sha256="9" * 64),))[0].state == "changed"
    assert mem.check(four, maps("f" * 64)[:1])[0].state == "same"
    # ... but not when maps itself could not be read (no inode to go by)
    mem.check(four, (NativeMapping("/proc/4/maps", None, -1, "unreadable", "gone"),))
    assert mem.check(four, maps("0" * 64)[:1])[0].state == "changed"
