"""Probe cost per engine step: the worker's execute_model with and without the probe's wrapper,
and with N declared hooks firing in every step (N = 1, 10, 100).

The probe wraps the concrete worker class's ``execute_model`` (see verifier/probe/_vllm.py).
This benchmark applies the same wrapper to a stand-in worker whose step does nothing (or
only calls N hooked functions, each wrapped the way VERIFIER_HOOKS wraps a target), so the
difference between the arms is exactly the probe's per-step work (counting steps, tokens by
phase and requests in shared memory; each fire's counters). Arms are interleaved.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import interleaved_ns, print_rows

N = 20_000
ROUNDS = 15


class Cached:
    def __init__(self, req_ids: list[str]) -> None:
        self.req_ids = req_ids


class SchedulerOutput:
    """The fields the probe reads from vLLM's SchedulerOutput: a decode step of REQS
    continuing requests, one token each (the common step)."""

    def __init__(self, tokens: int, reqs: int) -> None:
        self.total_num_scheduled_tokens = tokens
        self.num_scheduled_tokens = {f"req-{i}": tokens // max(reqs, 1) for i in range(reqs)}
        self.scheduled_new_reqs: list[Any] = []
        self.scheduled_cached_reqs = Cached(list(self.num_scheduled_tokens))
        self.scheduled_spec_decode_tokens: dict[str, list[int]] = {}


class Runner:
    pass


def make_worker(calls: tuple[Any, ...] = ()) -> Any:
    class Worker:
        model_runner = Runner()

        def execute_model(self, scheduler_output: Any) -> None:
            for fn in calls:
                fn()

    return Worker()


def hooked(n: int) -> tuple[Any, ...]:
    """N functions, each wrapped as a declared hook (a counting wrapper) fires."""
    from verifier.probe import _hooks

    def noop() -> None:
        return None

    return tuple(_hooks.counting(noop, _hooks.declare(f"h{n}_{i}", "", "api")) for i in range(n))


def plain(n: int) -> tuple[Any, ...]:
    def noop() -> None:
        return None

    return tuple(noop for _ in range(n))


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
        arms: dict[str, Callable[[], object]] = {
            "bare step": lambda: bare.execute_model(decode),
            "probed step": lambda: probed.execute_model(decode),
            "probed empty": lambda: probed.execute_model(empty),
        }
        for n in (1, 10, 100):
            b, w = make_worker(plain(n)), make_worker(hooked(n))
            _vllm._wrap_worker_class(type(w))
            arms[f"bare step, {n} plain calls"] = functools.partial(b.execute_model, decode)
            arms[f"probed step, {n} hooks fire"] = functools.partial(w.execute_model, decode)
        # a first-hit hook after its first call: the original function is back in place
        from verifier.probe import _firsthit, _hooks

        class Target:
            def step(self) -> None:
                return None

        _firsthit.install(Target, "step", _hooks.declare("first_hit", "", "api"), "first_hit")
        hit, plain_t = Target(), type("Plain", (), {"step": lambda self: None})()
        hit.step()  # its first call: fires once and steps aside
        arms["plain call"] = plain_t.step
        arms["first-hit hooked call, after its hit"] = hit.step
        s = interleaved_ns(arms, ROUNDS, N)
        print(f"probe cost per engine step: {ROUNDS} interleaved rounds x {N} steps, ns per step")
        print_rows(s)
        extra = s["probed step"]["median"] - s["bare step"]["median"]
        print(f"  probe overhead per productive step = {extra:.0f} ns (budget 2000 ns)")
        for n in (1, 10, 100):
            cost = (
                s[f"probed step, {n} hooks fire"]["median"]
                - s[f"bare step, {n} plain calls"]["median"]
            )
            print(
                f"  with {n} hooks firing once per step: +{cost:.0f} ns per step ({cost / n:.0f} ns per hook)"
            )


if __name__ == "__main__":
    main()
