"""Whose probe state is this? A state directory is a process's only when the kernel says so.

A state directory's name (``probe.layout.process_dir_name``) is a claim anyone can make:
whoever can write to the probe dir (another container sharing ``/dev/shm``, another user of a
world-writable dir) can create a directory under a process's name with a clean journal and
counters, and a reader going by name alone would report that evidence for the process (a
process with no probe would PASS). So the reader accepts a directory as process P's state only
when P really holds its files, as ``/proc/P`` shows them:

* ``counters`` is mapped by P (``/proc/P/maps``: same device and inode): the probe keeps it
  mapped (MAP_SHARED) for its whole life;
* ``journal.jsonl`` is open in P (``/proc/P/fd/*``: same device and inode), and its first
  ``start`` record names P (its pid in its own namespace and its start time): a forked child
  may still map its parent's counters, and a process forked outside Python's fork handlers
  may still hold its parent's journal;
* ``bindings.jsonl``, when there is one, is open in P;
* none of them is a symbolic link (the probe creates regular files only).

Each file is checked as opened (``fstat`` of the descriptor the bytes are read from), so a
directory swapped between the check and the read is not read. A hard link to P's real
``counters`` beside a forged journal is refused for the journal; links to all of P's real files
are P's real evidence. A probe whose counters are private (it could not create shared state:
its ``start`` record says ``shared: false``) has nothing mapped: its journal is bound, and its
counts are unknown, never read from a ``counters`` file.

What P holds is read lazily (only when a candidate directory exists) and read again once when
a file is not found in it (a ``bindings.jsonl`` the probe created after the first reading).
The probe journals the descriptor numbers it holds its journal and bindings file as: a hint
that saves looking at every descriptor (one ``stat`` of ``/proc/P/fd/N``), checked like the
rest, since the journal is anyone's word.
Reading ``maps`` and ``fd`` needs ptrace access to P, as ``exe`` and ``environ`` do: without it
``ProcessAccessDenied`` propagates and the process is reported as unobservable, never as
probed on the strength of a name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servewitness_probe import layout as L

from servewitness.evidence.procfs import ProcFS, mapped_files

FileId = tuple[int, int]  # (st_dev, st_ino)

_HELD_OPEN = frozenset({L.JOURNAL_FILE, L.BINDINGS_FILE})


class Unbound(Exception):
    """A state directory found under a process's name that is not the process's own."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass
class Holder:
    """Process PID (NS_PID in its own PID namespace, started at START_TICKS) as the judge of
    which files are its own. What it holds is read from /proc when first needed and read again
    once when a file is not among it (a file the process created after the first reading)."""

    procfs: ProcFS
    pid: int
    ns_pid: int
    start_ticks: int
    _maps: str | None = field(default=None, repr=False)
    _open: frozenset[FileId] | None = field(default=None, repr=False)
    _fresh: bool = field(default=False, repr=False)

    def _mapped(self, fid: FileId) -> bool:
        if self._maps is None:
            self._maps = self.procfs.maps(self.pid)
        if fid in mapped_files(self._maps, fid[1]):
            return True
        if self._fresh:
            return False
        self._fresh = True
        self._maps, self._open = self.procfs.maps(self.pid), None
        return fid in mapped_files(self._maps, fid[1])

    def _held_open(self, fid: FileId, hint: object) -> bool:
        """Whether the process holds FID open. HINT: the descriptor number the probe says it
        holds it as (from the journal: anyone's word, so only a hint): one ``stat`` of that
        descriptor settles it when it is right; else every descriptor is looked at."""
        if (
            isinstance(hint, int)
            and not isinstance(hint, bool)
            and 0 <= hint < 1 << 31
            and self.procfs.open_file(self.pid, hint) == fid
        ):
            return True
        if self._open is None:
            self._open = self.procfs.open_files(self.pid, _HELD_OPEN)
        if fid in self._open:
            return True
        if self._fresh:
            return False
        self._fresh = True
        self._maps, self._open = None, self.procfs.open_files(self.pid, _HELD_OPEN)
        return fid in self._open

    def check_journal(self, fid: FileId, start: dict[str, Any]) -> None:
        """Raise Unbound unless the journal FID (as opened) is open in the process and its
        START record names the process."""
        if not self._held_open(fid, start.get("fd")):
            raise Unbound(f"the process does not hold its {L.JOURNAL_FILE} open")
        pid, ticks = start.get("pid"), start.get("start_ticks")
        if (pid, ticks) != (self.ns_pid, self.start_ticks):
            raise Unbound(
                f"its {L.JOURNAL_FILE} was started by pid {pid!r} at tick {ticks!r}, not by "
                f"this process (pid {self.ns_pid} at tick {self.start_ticks})"
            )

    def check_counters(self, fid: FileId) -> None:
        """Raise Unbound unless the counters file FID (as opened) is mapped by the process."""
        if not self._mapped(fid):
            raise Unbound(f"the process does not map its {L.COUNTERS_FILE}")

    def check_bindings(self, fid: FileId, hint: object = None) -> None:
        """Raise Unbound unless the bindings file FID is open in the process (HINT: the
        descriptor the probe journaled for it)."""
        if not self._held_open(fid, hint):
            raise Unbound(f"the process does not hold its {L.BINDINGS_FILE} open")


def symlink(name: str) -> Unbound:
    """The refusal of a state file that is a symbolic link."""
    return Unbound(f"its {name} is a symbolic link (the probe creates regular files only)")
