"""The cyclic garbage collector paused while the agent collects.

A collect builds tens of thousands of short-lived containers (a journal's records, a big
file's syntax tree for the code chains, the judgement's sets and maps) beside the long-lived
ones it keeps (the journals read, the kept judgements). Every 700 allocations the collector
looks at the young ones, and every few of those at everything: on a restart against the tiny
server, about 0.13-0.17 s of CPU of 2.4 s (``bench/cold_manifest.py``), in 291 runs (two of
them full) that found no garbage at all (``gc.callbacks``: 0 objects collected; what a
collect drops is freed by its reference count). Paused for the collect and
resumed after it, the collector finds whatever cycle a collect left at its next run; memory
held meanwhile is bounded by one collect's allocation.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """The collector off for the block, and back as it was after it (also when the block
    raises; left off when it was off: one paused block inside another, or a caller that
    turned it off)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
