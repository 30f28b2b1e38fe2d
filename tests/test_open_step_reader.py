"""The reader judges only closed steps: counters read while a step is open (counted when it
started, its hooks' fires not all in) wait briefly for the step to end, and if it does not, the
open step is left out of the step counts the policy judges fires against."""

from __future__ import annotations

import struct
import threading
import time
from pathlib import Path

from servewitness_probe import layout as L

from servewitness.evidence import counters as R


def write(path: Path, **slots: int) -> None:
    values = [0] * L.N_SLOTS
    values[L.H_MAGIC], values[L.H_VERSION] = L.MAGIC, L.LAYOUT_VERSION
    for name, v in slots.items():
        values[getattr(L, name)] = v
    path.write_bytes(struct.pack(f"={L.N_SLOTS}Q", *values))


DECODING = {
    "S_STEPS_TOTAL": 10,
    "S_STEPS_PRODUCTIVE": 9,
    "S_STEPS_EMPTY": 1,
    "S_STEPS_DECODE": 8,
    "S_STEPS_PREFILL": 2,
    "S_CURRENT_PHASE": L.PHASE_PRODUCTIVE | L.PHASE_DECODE,
}


def test_a_closed_step_is_counted_as_is(tmp_path: Path) -> None:
    f = tmp_path / "counters"
    write(f, **DECODING)
    s = R.steps_of(R.read_settled(f) or [])
    assert (s.total, s.productive, s.empty, s.decode_steps, s.prefill_steps) == (10, 9, 1, 8, 2)


def test_a_step_left_open_is_not_judged(tmp_path: Path) -> None:
    f = tmp_path / "counters"
    write(f, S_IN_STEP=1, **DECODING)
    t0 = time.monotonic()
    slots = R.read_settled(f)
    assert slots is not None and time.monotonic() - t0 < 1.0  # bounded wait
    s = R.steps_of(slots)
    assert (s.total, s.productive, s.empty, s.decode_steps, s.prefill_steps) == (9, 8, 1, 7, 2)


def test_an_open_empty_step_comes_off_the_empty_steps(tmp_path: Path) -> None:
    f = tmp_path / "counters"
    write(f, S_IN_STEP=1, **{**DECODING, "S_CURRENT_PHASE": 0})
    s = R.steps_of(R.read_settled(f) or [])
    assert (s.total, s.productive, s.empty, s.decode_steps) == (9, 9, 0, 8)


def test_a_step_that_closes_while_the_reader_waits_is_read_closed(tmp_path: Path) -> None:
    """The reader re-reads while the step is open; the step ends (its fire lands, the flag
    drops) and the settled read has the step and its fire."""
    f = tmp_path / "counters"
    write(f, S_IN_STEP=1, **DECODING)

    def close() -> None:
        time.sleep(0.02)
        write(f, **{**DECODING})

    t = threading.Thread(target=close)
    t.start()
    slots = R.read_settled(f)
    t.join()
    assert slots is not None and slots[L.S_IN_STEP] == 0
    assert R.steps_of(slots).decode_steps == 8
