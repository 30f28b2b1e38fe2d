"""The probe's shared counters (``counters``), read from outside: the slots, read between two
steps where possible, and the step counts they hold.

A reader maps or reads the file at any time without the probe's cooperation; given a
``binding.Holder``, only a file the process really maps is read (see ``binding``).
"""

from __future__ import annotations

import errno
import os
import struct
import time
from pathlib import Path

from servewitness_probe import layout as L

from servewitness.evidence.binding import Holder, symlink
from servewitness.evidence.regular import open_regular, read_regular
from servewitness.model import StepEvidence


def read_counters(path: Path) -> list[int] | None:
    """The counter slots, or None if the file is missing or not (yet) a probe's."""
    try:
        data = read_regular(path, L.SLOT_BYTES * L.N_SLOTS)
    except OSError:
        return None
    return _slots(data)


def _slots(data: bytes) -> list[int] | None:
    n = len(data) // L.SLOT_BYTES
    if n < L.HOOK_BASE:
        return None
    slots = list(struct.unpack(f"={n}Q", data[: n * L.SLOT_BYTES]))
    if slots[L.H_MAGIC] != L.MAGIC or slots[L.H_VERSION] != L.LAYOUT_VERSION:
        return None
    return slots


SETTLE_TRIES = 40  # re-reads while a step is open (execute_model .. sample_tokens) ...
SETTLE_PAUSE_S = 0.0025  # ... at this pause: at most about 0.1 s per read


def read_settled(path: Path, holder: Holder | None = None) -> list[int] | None:
    """The counter slots read between two steps where possible. A step is counted when it
    starts and its hooks fire as it runs (the sampler's in ``sample_tokens``, its second
    phase), so a read inside a step sees the step without all of its fires: a hook that fires
    on every step would look one fire short, and a gate could FAIL on it. While the probe
    marks a step open, read again, briefly; if it stays open (a long step, or a process
    stopped inside one), ``steps_of`` leaves the open step out of the judged counts.
    HOLDER: read only a file that process maps (else ``Unbound``), and only the file checked."""
    try:
        fd = open_regular(path, nofollow=True)
    except OSError as e:
        if holder is not None and e.errno == errno.ELOOP:
            raise symlink(L.COUNTERS_FILE) from e
        return None
    try:
        if holder is not None:
            st = os.fstat(fd)
            holder.check_counters((st.st_dev, st.st_ino))
        size = L.SLOT_BYTES * L.N_SLOTS
        slots = _slots(os.pread(fd, size, 0))
        for _ in range(SETTLE_TRIES):
            if slots is None or not slots[L.S_IN_STEP]:
                return slots
            time.sleep(SETTLE_PAUSE_S)
            slots = _slots(os.pread(fd, size, 0))
        return slots
    except OSError:
        return None
    finally:
        os.close(fd)


def steps_of(slots: list[int]) -> StepEvidence:
    """The step counts of SLOTS, without the step still open in them (if any): its counts
    are taken when it starts, its fires are not all in yet. (The graph mode and speculation
    come from the journal: ``read_probe_dir`` adds them.)"""
    open_ = 1 if slots[L.S_IN_STEP] else 0
    phase = slots[L.S_CURRENT_PHASE] if open_ else 0
    productive = 1 if phase & L.PHASE_PRODUCTIVE else 0
    return StepEvidence(
        total=max(0, slots[L.S_STEPS_TOTAL] - open_),
        productive=max(0, slots[L.S_STEPS_PRODUCTIVE] - productive),
        empty=max(0, slots[L.S_STEPS_EMPTY] - (open_ - productive)),
        tokens_scheduled=slots[L.S_TOKENS_SCHEDULED],
        requests_scheduled=slots[L.S_REQUESTS_SCHEDULED],
        requests_max=slots[L.S_REQUESTS_MAX],
        last_step_unix_ns=slots[L.S_LAST_STEP_UNIX_NS],
        prefill_steps=max(0, slots[L.S_STEPS_PREFILL] - (1 if phase & L.PHASE_PREFILL else 0)),
        decode_steps=max(0, slots[L.S_STEPS_DECODE] - (1 if phase & L.PHASE_DECODE else 0)),
        prefill_tokens=slots[L.S_TOKENS_PREFILL],
        decode_tokens=slots[L.S_TOKENS_DECODE],
        dummy_steps=slots[L.S_STEPS_DUMMY],
        raised=slots[L.S_STEPS_RAISED],
    )
