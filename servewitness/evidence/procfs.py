"""A narrow view of ``/proc`` with an injectable root, so tests can use captured trees."""

from __future__ import annotations

import os
import posixpath
import time
from dataclasses import dataclass
from pathlib import Path

from servewitness_probe import layout as L

from servewitness.errors import NoSuchProcess, ProcessAccessDenied

# A file (or a mapped library) is "changed after the process started" when its ctime is this
# much after the start: the start is read in clock ticks (10 ms, truncated) after a boot time
# known to the microsecond on a live /proc (``ProcFS.boot_time``); the rest absorbs a small
# step of the wall clock. A change closer to the start than this is not seen.
CHANGED_SLACK_S = 0.05


@dataclass(frozen=True)
class ProcessIdentity:
    """Who a process is: (boot id, pid, start time) plus what it runs."""

    pid: int
    ns_pid: int  # the pid inside the process's own PID namespace
    ppid: int
    start_ticks: int
    start_time: float  # unix seconds
    boot_id: str
    comm: str
    cmdline: tuple[str, ...]
    exe: str


def parse_environ(block: bytes) -> dict[str, str]:
    """``KEY=VALUE`` entries of a NUL-separated environment block (entries without ``=``,
    title bytes or padding, are left out)."""
    env: dict[str, str] = {}
    for item in block.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def environ_overwritten(block: bytes) -> bool:
    """True when an environment block is not as exec wrote it: exec lays the strings end to
    end, each ended by one NUL, so the block neither starts with a NUL nor holds two in a row.
    setproctitle (vLLM's EngineCore and workers) writes the title over the argv+environ area
    and pads it with NULs, but only as far as the strings are still the exec'd ones: a
    variable set before it (``os.environ[k] = v`` moves that string to the heap) ends the
    area, and every string after it stays. Seen on an H200 (vLLM 0.26): 4,519 of 5,757 bytes
    zeroed, 33 variables left, ``PATH`` among them and ``HOME`` not."""
    return block.startswith(b"\0") or b"\0\0" in block


class ProcFS:
    """Reads one ``/proc``-shaped tree (default the real one)."""

    def __init__(self, root: str | os.PathLike[str] = "/proc") -> None:
        self.root = Path(root)

    def _read(self, pid: int, name: str) -> bytes:
        try:
            return (self.root / str(pid) / name).read_bytes()
        except FileNotFoundError as e:
            raise NoSuchProcess(pid) from e
        except PermissionError as e:
            raise ProcessAccessDenied(pid, name) from e
        except ProcessLookupError as e:
            raise NoSuchProcess(pid) from e

    def exists(self, pid: int) -> bool:
        return (self.root / str(pid) / "stat").exists()

    def identity(self, pid: int) -> ProcessIdentity:
        stat = self._read(pid, "stat")
        fields = L.stat_fields(stat)
        comm = stat[stat.index(b"(") + 1 : stat.rindex(b")")].decode(errors="replace")
        status = self._read(pid, "status").decode(errors="replace")
        ns_pid = pid
        for line in status.split("\n"):  # not splitlines(): comm may hold "\r", "\x85"
            if line.startswith("NSpid:"):
                ns_pid = int(line.split()[-1])
        cmdline = tuple(
            a.decode(errors="replace") for a in self._read(pid, "cmdline").split(b"\0") if a
        )
        try:
            exe = os.readlink(self.root / str(pid) / "exe")
        except FileNotFoundError:
            exe = ""
        except PermissionError as e:
            raise ProcessAccessDenied(pid, "exe") from e
        except OSError:
            exe = ""
        ticks = int(fields[19])
        return ProcessIdentity(
            pid=pid,
            ns_pid=ns_pid,
            ppid=int(fields[1]),
            start_ticks=ticks,
            start_time=self.boot_time() + ticks / os.sysconf("SC_CLK_TCK"),
            boot_id=self.boot_id(),
            comm=comm,
            cmdline=cmdline,
            exe=exe,
        )

    def boot_time(self) -> float:
        """When the machine booted, unix seconds. ``/proc/stat`` says it in whole seconds
        (truncated), which would put a process's start up to a second early, and a file
        changed in that second after the start (``provenance.file.changed_after_start``).
        Where the tree's btime is this clock's boot time to the second (the live ``/proc``),
        the clocks give it to the microsecond: real time less time since boot, both now, as
        the kernel computes btime itself. A captured tree keeps its own btime."""
        btime = 0.0
        for line in (self.root / "stat").read_text().splitlines():
            if line.startswith("btime "):
                btime = float(line.split()[1])
                break
        precise = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        return precise if btime and 0.0 <= precise - btime < 1.0 + 1e-3 else btime

    def boot_id(self) -> str:
        try:
            return (self.root / "sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            return ""

    def maps(self, pid: int) -> str:
        return self._read(pid, "maps").decode(errors="replace")

    def pid_ns(self, pid: int) -> int | None:
        """The inode of PID's PID namespace (``/proc/<pid>/ns/pid``); None where the tree has
        no such link (a captured tree) or it reads as something else."""
        try:
            link = os.readlink(self.root / str(pid) / "ns" / "pid")
        except PermissionError as e:
            raise ProcessAccessDenied(pid, "ns/pid") from e
        except OSError:
            return None
        try:
            return L.ns_inode(link)
        except ValueError:
            return None

    def mapped_files(self, pid: int) -> frozenset[tuple[int, int]]:
        """(device, inode) of every file PID has mapped, as ``/proc/<pid>/maps`` shows them
        (what the kernel holds, whatever the files' names are now)."""
        return mapped_files(self.maps(pid))

    def open_file(self, pid: int, fd: int) -> tuple[int, int] | None:
        """(device, inode) of the file PID holds as descriptor FD; None when it holds none."""
        try:
            st = os.stat(self.root / str(pid) / "fd" / str(fd))
        except PermissionError as e:
            raise ProcessAccessDenied(pid, "fd") from e
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def open_files(self, pid: int, names: frozenset[str]) -> frozenset[tuple[int, int]]:
        """(device, inode) of the files PID holds open whose name (the last part of the fd's
        link) is in NAMES: ``stat`` through ``/proc/<pid>/fd/N`` gives the very file the fd
        refers to, renamed or not. A deleted file's link ends in `` (deleted)``: left out."""
        fds = self.root / str(pid) / "fd"
        try:
            entries = os.listdir(fds)
        except (FileNotFoundError, ProcessLookupError) as e:
            raise NoSuchProcess(pid) from e
        except PermissionError as e:
            raise ProcessAccessDenied(pid, "fd") from e
        out: set[tuple[int, int]] = set()
        for fd in entries:
            try:
                if os.readlink(fds / fd).rpartition("/")[2] not in names:
                    continue
                st = os.stat(fds / fd)
            except OSError:
                continue  # closed meanwhile
            out.add((st.st_dev, st.st_ino))
        return frozenset(out)

    def cgroup(self, pid: int) -> str:
        return self._read(pid, "cgroup").decode(errors="replace")

    def mountinfo(self, pid: int) -> str:
        return self._read(pid, "mountinfo").decode(errors="replace")

    def executable_mappings(self, pid: int) -> list[str]:
        """Distinct file-backed executable mappings (paths, in first-seen order)."""
        seen: dict[str, None] = {}
        for line in self.maps(pid).split("\n"):  # not splitlines(): see native.py
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and "x" in parts[1] and parts[5].startswith("/"):
                seen.setdefault(parts[5], None)
        return list(seen)

    def argv(self, pid: int) -> list[bytes]:
        """The process's command line as bytes, one word each (``/proc/<pid>/cmdline`` split
        at NUL; empty words kept, the final terminator dropped). A process may rewrite it
        (setproctitle): it is what the process shows now."""
        words = self._read(pid, "cmdline").split(b"\0")
        return words[:-1] if words and words[-1] == b"" else words

    def environ(self, pid: int) -> dict[str, str]:
        return parse_environ(self._read(pid, "environ"))

    def environ_as_started(self, pid: int) -> dict[str, str] | None:
        """PID's environment block as exec wrote it, or None where something wrote over it
        (``environ_overwritten``): then it is not the environment the process started with."""
        block = self._read(pid, "environ")
        return None if environ_overwritten(block) else parse_environ(block)

    def is_python(self, pid: int) -> bool:
        """True if the process runs a CPython interpreter (by executable or mapped libpython)."""
        ident = self.identity(pid)
        if "python" in os.path.basename(ident.exe):
            return True
        try:
            return "libpython" in self.maps(pid)
        except ProcessAccessDenied:
            return False

    def in_root(self, pid: int, path: str) -> Path:
        """PATH as the process sees it (through its root: the container's view). PATH comes
        from the process itself: a ".." above its root stays at the root, as it does for the
        process, instead of climbing out of ``/proc/<pid>/root`` (paths without ".." are kept
        as they are: normalizing "a/link/.." would change what a symlink means)."""
        return Path(self.in_root_str(pid, path))

    def in_root_str(self, pid: int, path: str) -> str:
        """``str(in_root(pid, path))`` without building a Path (the hot loops: tens of
        thousands of files per cold collect)."""
        if ".." in path.split("/"):
            path = posixpath.normpath("/" + path)
        out = f"{self.root}/{pid}/root/{path.lstrip('/')}"
        if "//" in out or "/./" in out or out.endswith(("/", "/.")):
            return str(self.root / str(pid) / "root" / path.lstrip("/"))  # as a Path spells it
        return out

    def parents(self) -> dict[int, int]:
        """pid -> ppid for every process in the tree (one scan)."""
        out: dict[int, int] = {}
        for entry in self.root.iterdir():
            if not (entry.name.isascii() and entry.name.isdigit()):
                continue
            try:
                out[int(entry.name)] = int(L.stat_fields((entry / "stat").read_bytes())[1])
            except (OSError, ValueError, IndexError):
                continue
        return out

    def descendants(self, pid: int) -> list[int]:
        """PID and everything under it, parents before children, siblings by pid."""
        kids: dict[int, list[int]] = {}
        for child, parent in sorted(self.parents().items()):
            kids.setdefault(parent, []).append(child)
        out = [pid]
        i = 0
        while i < len(out):
            out.extend(kids.get(out[i], []))
            i += 1
        return out


def mapped_files(maps: str, inode: int | None = None) -> frozenset[tuple[int, int]]:
    """(device, inode) of the file-backed mappings in MAPS (a ``/proc/<pid>/maps`` text), all
    of them or only those of INODE. Lines split on ``\n`` only (not ``splitlines()``: see
    native.py); a line of another shape is skipped. Looking for one inode, only the lines that
    contain its number are parsed (a few of thousands)."""
    out: set[tuple[int, int]] = set()
    if inode is None:
        lines = maps.split("\n")
    else:
        lines, needle, at = [], f" {inode} ", maps.find(f" {inode} ")
        while at >= 0:
            start = maps.rfind("\n", 0, at) + 1
            end = maps.find("\n", at)
            lines.append(maps[start : end if end >= 0 else len(maps)])
            at = maps.find(needle, end) if end >= 0 else -1
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            continue
        major, colon, minor = parts[3].partition(":")
        try:
            ino = int(parts[4])
            if colon and ino > 0 and inode in (None, ino):
                out.add((os.makedev(int(major, 16), int(minor, 16)), ino))
        except (ValueError, OverflowError):
            continue
    return frozenset(out)
