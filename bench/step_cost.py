"""Probe cost per engine step: the worker's execute_model with and without the probe's wrapper.

The probe wraps the concrete worker class's ``execute_model`` (see verifier/probe/_vllm.py).
This benchmark applies the same wrapper to a stand-in worker whose step does nothing, so the
difference between the arms is exactly the probe's per-step work (counting steps, tokens and
requests in shared memory). Arms are interleaved over ROUNDS rounds.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import interleaved_ns, print_rows

N = 100_000
ROUNDS = 15


class SchedulerOutput:
    """The two fields the probe reads from vLLM's SchedulerOutput."""

    def __init__(self, tokens: int, reqs: int) -> None:
        self.total_num_scheduled_tokens = tokens
        self.num_scheduled_tokens = {f"req-{i}": tokens // max(reqs, 1) for i in range(reqs)}


class Runner:
    pass


def make_worker() -> Any:
    class Worker:
        model_runner = Runner()

        def execute_model(self, scheduler_output: Any) -> None:
            return None

    return Worker()


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        os.environ["VERIFIER_PROBE_DIR"] = d
        import verifier.probe as p
        from verifier.probe import _vllm

        p.start("bench")
        bare = make_worker()
        probed = make_worker()
        _vllm._wrap_worker_class(type(probed))
        decode = SchedulerOutput(tokens=8, reqs=8)
        empty = SchedulerOutput(tokens=0, reqs=0)
        arms = {
            "bare step": lambda: bare.execute_model(decode),
            "probed step": lambda: probed.execute_model(decode),
            "probed empty": lambda: probed.execute_model(empty),
        }
        s = interleaved_ns(arms, ROUNDS, N)
        print(f"probe cost per engine step: {ROUNDS} interleaved rounds x {N} steps, ns per step")
        print_rows(s)
        extra = s["probed step"]["median"] - s["bare step"]["median"]
        print(f"  probe overhead per productive step = {extra:.0f} ns (budget 2000 ns)")


if __name__ == "__main__":
    main()
