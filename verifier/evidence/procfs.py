"""A narrow view of ``/proc`` with an injectable root, so tests can use captured trees."""

from __future__ import annotations

import os
import posixpath
import time
from dataclasses import dataclass
from pathlib import Path

from verifier.errors import NoSuchProcess, ProcessAccessDenied, UnavailableError
from verifier.probe import layout as L


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

    def started_at(self, pid: int) -> float | None:
        """When PID started, on this machine's wall clock, to about a clock tick: its age
        (``/proc/uptime`` less its start in ticks since boot) taken from the time now. Finer
        than ``identity().start_time``, whose boot time is in whole seconds; None where the
        tree has no ``uptime`` (a captured one) or the process is gone."""
        try:
            uptime = float((self.root / "uptime").read_text().split()[0])
            ticks = L.start_ticks(self._read(pid, "stat"))
        except (OSError, ValueError, IndexError, UnavailableError):
            return None
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))

    def boot_time(self) -> float:
        for line in (self.root / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
        return 0.0

    def boot_id(self) -> str:
        try:
            return (self.root / "sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            return ""

    def maps(self, pid: int) -> str:
        return self._read(pid, "maps").decode(errors="replace")

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
        env: dict[str, str] = {}
        for item in self._read(pid, "environ").split(b"\0"):
            key, eq, value = item.partition(b"=")
            if eq:
                env[key.decode(errors="replace")] = value.decode(errors="replace")
        return env

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
        if ".." in path.split("/"):
            path = posixpath.normpath("/" + path)
        return self.root / str(pid) / "root" / path.lstrip("/")

    def parents(self) -> dict[int, int]:
        """pid -> ppid for every process in the tree (one scan)."""
        out: dict[int, int] = {}
        for entry in self.root.iterdir():
            if not entry.name.isdigit():
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
