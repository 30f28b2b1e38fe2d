"""The agent's age clock: how long ago it read a report's evidence, on a clock no one can step.

A report's age cannot be a difference of two wall-clock readings. The agent host's wall clock
stepped (by NTP, an administrator, a VM resumed from a snapshot) between reading the evidence
and sending it makes that difference wrong by the step: a report that waited in the spool while
the clock ran ahead, sent after it was stepped back, looks as if it had not waited at all. So
the agent stamps each collect on ``CLOCK_BOOTTIME`` and sends the age it measures there
(``TargetReport.evidence_age_s``). That clock cannot be set; unlike ``CLOCK_MONOTONIC``
(``time.monotonic`` on Linux) it keeps counting while the host is suspended, so a report
spooled before a night asleep is a night old when the host wakes; and it is the kernel's, not
the process's, so a report spooled by one life of the agent is aged right by the next. A time
namespace (a container restored by CRIU) sets it ahead or behind for the processes in it:
each reading is taken less that offset, so it is the host's clock in any of them.

Its origin is the boot. Each reading carries the kernel's boot id, and two readings of
different boots give no age: a report spooled before its host rebooted has none
(``evidence_age_unknown``: never fresh). Where ``CLOCK_BOOTTIME`` or the boot id cannot be read
(not Linux), ``time.monotonic`` and an id of this process instead: ages are then known within
one life of the agent only, and a report a restarted agent finds in its spool has none.

What it may miss: time a hypervisor kept the whole virtual machine paused (a snapshot restored
later) is not time the guest kernel ran, and its clocks may not count it. The guest's wall
clock, once corrected, does: the verifier takes the larger of this age and the wall-clock span
(``TargetReport.collect_s``), so each clock covers the other's way of undercounting.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

_BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")  # the running kernel's, in any container
_TIMENS_OFFSETS = Path("/proc/self/timens_offsets")
_BOOTTIME_ID = "7"  # CLOCK_BOOTTIME's number, as an older kernel may name it there


def _read() -> float:
    """Seconds on the age clock: the host's ``CLOCK_BOOTTIME`` where it exists, whatever time
    namespace this process runs in."""
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME) - _namespace_offset()
    return time.monotonic()


@functools.cache
def _namespace_offset() -> float:
    """How far this process's time namespace sets ``CLOCK_BOOTTIME`` ahead of the host's
    (``/proc/self/timens_offsets``, Linux 5.6+; 0 where there is none). A container restored
    by CRIU runs in one, its clocks going on from the checkpoint: two lives of the agent in
    namespaces of different offsets would read the boot clock apart by their difference, and
    a report spooled by one be aged wrong by the other. Less its offset, every reading is the
    host's. (The file shows the namespace a process's children get, which is its own unless
    it unshared one itself: the agent never does.)"""
    try:
        text = _TIMENS_OFFSETS.read_text()
    except OSError:
        return 0.0
    for line in text.splitlines():
        clock, *offset = line.split()
        if clock in ("boottime", _BOOTTIME_ID) and len(offset) == 2:
            try:
                return int(offset[0]) + int(offset[1]) / 1e9
            except ValueError:
                return 0.0
    return 0.0


@functools.cache
def _boot() -> str:
    """What the age clock's origin is: the kernel's boot id, or, where the clock is not
    ``CLOCK_BOOTTIME`` or the id cannot be read, an id of this process alone."""
    if _BOOTTIME is not None:
        try:
            boot = _BOOT_ID.read_text().strip()
        except OSError:
            boot = ""
        if boot:
            return boot
    return f"process-{os.getpid()}-{os.urandom(8).hex()}"


@dataclass(frozen=True)
class BootInstant:
    """One reading of the age clock: S seconds on it, in the boot (or process) BOOT names."""

    boot: str
    s: float

    @classmethod
    def now(cls) -> BootInstant:
        return cls(_boot(), _read())

    def age_s(self, now: BootInstant | None = None) -> float | None:
        """Seconds from this reading to NOW (default: now); None where no age is known: a
        reading of another boot (a reboot between them) or one later than NOW (not one
        clock: the agent moved to another time namespace)."""
        now = BootInstant.now() if now is None else now
        if not self.boot or self.boot != now.boot or now.s < self.s:
            return None
        return now.s - self.s

    def to_json(self) -> str:
        return json.dumps({"boot": self.boot, "s": self.s})

    @classmethod
    def from_json(cls, text: str) -> BootInstant | None:
        """The reading TEXT holds (``to_json``), or None if it holds none."""
        try:
            doc = json.loads(text)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        boot, s = doc.get("boot"), doc.get("s")
        if not isinstance(boot, str) or not boot or not isinstance(s, (int, float)):
            return None
        if isinstance(s, bool) or not math.isfinite(s) or s < 0:
            return None
        return cls(boot, float(s))
