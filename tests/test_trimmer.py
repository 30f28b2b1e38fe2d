"""The verifier's heap trimmer (``server/memory.Trimmer``) in a real process on glibc.

The race CI met: the history keeper's trim ran while a large report was still in use (nothing
to give back), the report was freed a moment later, and the freed memory never moved the
resident size, so the trimmer (which trimmed only when the size moved) never trimmed again:
+68 MiB that stayed. Each case runs in its own interpreter, so the heap is the test's alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from servewitness.server import memory

pytestmark = pytest.mark.skipif(
    not memory.Trimmer().available, reason="glibc only: elsewhere the trimmer does nothing"
)

MIB = 1024 * 1024

# 80,000 buffers of 1,000 bytes: above pymalloc's 512-byte limit and below the mmap
# threshold, so they live in glibc's heap; a small buffer allocated after them keeps the heap's
# top in use, so free() cannot give the memory back by itself: only malloc_trim can.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    from servewitness.server import memory
    memory.fix_mmap_threshold()
    t = memory.Trimmer(threshold=16 * 1024 * 1024)
    before = memory.rss_bytes()
    held = [bytes(1000) for _ in range(80_000)]
    pin = [bytes(1000) for _ in range(16)]
    t.maybe_trim()  # the beat that falls while the memory is in use
    peak = memory.rss_bytes()
    del held
    freed = memory.rss_bytes()
    beats = []
    for _ in range(int(sys.argv[1])):
        beats.append(t.maybe_trim())
    print(json.dumps({"before": before, "peak": peak, "freed": freed,
                      "after": memory.rss_bytes(), "beats": beats, "trims": t.trims}))
    """
)


def run(script: str, beats: int) -> dict[str, Any]:
    cmd = [sys.executable, "-c", script, str(beats)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    got: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])  # after the debug logs
    return got


def test_memory_freed_after_a_trim_at_its_peak_is_given_back_on_a_later_beat() -> None:
    got = run(SCRIPT, beats=3)
    before, peak, freed, after = (int(got[k]) for k in ("before", "peak", "freed", "after"))
    assert peak - before > 60 * MIB, got  # the buffers were resident
    # The attack's precondition: freeing them alone did not move the resident size.
    assert freed - before > 60 * MIB, got
    assert after - before < 16 * MIB, got  # a follow-up trim gave it back
    beats = got["beats"]
    assert isinstance(beats, list) and beats[0] > 60 * MIB, got  # on the very next beat


def test_memory_still_in_use_is_not_trimmed_on_every_beat() -> None:
    """Negative control for the follow-up's cost: a heap that stays above its low-water mark
    because the memory is really in use is trimmed with doubling waits, not on every beat."""
    got = run(SCRIPT.replace("del held\n", ""), beats=40)
    assert got["after"] - got["before"] > 60 * MIB, got  # still held: nothing to give back
    # Waits of 1, 2, 4, 8, 16 beats (then 32) fit in 40 beats: 1 at the peak and 5 after.
    assert got["trims"] <= 7, got
    assert sum(got["beats"]) < 4 * MIB, got
