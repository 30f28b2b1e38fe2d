"""Probe cost per engine step: the worker's execute_model with and without the probe's wrapper,
with N declared hooks firing in every step (N = 1, 10, 100), and with and without the
request bindings (which requests each step served; ``_bindings``).

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
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
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
        self.finished_req_ids: set[str] = set()


def churn(reqs: int, prompt: int, n: int) -> list[SchedulerOutput]:
    """N steps of REQS requests where, every step, one request finishes and a new one
    arrives with PROMPT prefill tokens (one open and one close per step for the bindings)."""
    out = []
    live = [f"c-{i}" for i in range(reqs - 1)]
    for step in range(n):
        new = f"c-{reqs - 1 + step}"
        so = SchedulerOutput(tokens=0, reqs=0)
        so.num_scheduled_tokens = {**dict.fromkeys(live, 1), new: prompt}
        so.total_num_scheduled_tokens = len(live) + prompt
        so.scheduled_new_reqs = [NewReq(new)]
        so.scheduled_cached_reqs = Cached(list(live))
        so.finished_req_ids = {live.pop(0)}
        live.append(new)
        out.append(so)
    return out


class NewReq:
    def __init__(self, req_id: str) -> None:
        self.req_id = req_id


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


def _wrapped(worker: Any) -> Any:
    from verifier.probe import _vllm

    _vllm._wrap_worker_class(type(worker))
    return worker


def bindings_arms(bare: Any, probed: Any) -> dict[str, dict[str, float]]:
    """The probed step with and without request bindings (``_vllm._bind_step`` switched
    between timings, outside them), interleaved, beside the bare step: a steady decode of 8
    requests, and a step where one of 8 requests finishes and a new one (16 prompt tokens)
    starts. The bindings' per-request work (``_bindings.fold``, done by the probe's writer
    thread) is timed apart, after each bindings timing, per step it folds."""
    import itertools

    from _stats import summary

    from verifier.probe import _bindings, _vllm

    decode = SchedulerOutput(tokens=8, reqs=8)
    steps = churn(8, 16, 4096)
    nxt = itertools.cycle(steps).__next__
    arms: dict[str, tuple[Any, Callable[[], object], str]] = {}
    for what, fn_bare, fn_probed in (
        (
            "8 requests decode",
            lambda: bare.execute_model(decode),
            lambda: probed.execute_model(decode),
        ),
        (
            "1 of 8 replaced per step",
            lambda: bare.execute_model(nxt()),
            lambda: probed.execute_model(nxt()),
        ),
    ):
        fold_key = f"bindings fold per step, {what}"
        arms[f"bare step, {what}"] = (None, fn_bare, "")
        arms[f"probed step, {what}, no bindings"] = (None, fn_probed, "")
        arms[f"probed step, {what}, bindings"] = (_bindings.step, fn_probed, fold_key)
    results: dict[str, list[float]] = {k: [] for k in arms}
    results.update({key: [] for _, _, key in arms.values() if key})
    saved, saved_max = _vllm._bind_step, _bindings.LOG_MAX
    _bindings.LOG_MAX = 1 << 40  # no fold inside the timed steps: it is timed apart
    try:
        for _ in range(ROUNDS):
            for name, (bind, fn, fold_key) in arms.items():
                _vllm._bind_step = bind
                results[name].append(timeit.timeit(fn, number=N) / N * 1e9)
                if fold_key:
                    t0 = time.perf_counter_ns()
                    _bindings.fold()
                    _bindings.flush()
                    results[fold_key].append((time.perf_counter_ns() - t0) / N)
    finally:
        _vllm._bind_step, _bindings.LOG_MAX = saved, saved_max
    return {k: summary(v) for k, v in results.items()}


class SpecRunner:
    """A runner whose live config has (or lacks) a speculative config, like vLLM's."""

    def __init__(self, spec: Any) -> None:
        self.vllm_config = type("Cfg", (), {"speculative_config": spec})()


class RunnerOutput:
    """The fields the probe reads from vLLM's ModelRunnerOutput."""

    def __init__(self, sampled: dict[str, list[int]]) -> None:
        self.req_ids = list(sampled)
        self.req_id_to_index = {r: i for i, r in enumerate(self.req_ids)}
        self.sampled_token_ids = [sampled[r] for r in self.req_ids]


def make_two_phase(spec: Any, out: Any) -> Any:
    """A V1-shaped worker: execute_model returns nothing, sample_tokens returns OUT."""

    class Worker:
        model_runner = SpecRunner(spec)

        def execute_model(self, scheduler_output: Any) -> None:
            return None

        def sample_tokens(self, grammar: Any) -> Any:
            return out

    return Worker()


def spec_arms() -> dict[str, dict[str, float]]:
    """One step as V1 runs it (execute_model, then sample_tokens), bare and probed: a decode
    step of 8 requests without speculation, and one where each of the 8 requests verifies 3
    draft tokens (ngram, k = 3) and accepts 2 (3 tokens sampled each). The probed arms run
    with speculation on or off in the live config (``_vllm._spec_on``, set between timings),
    so "spec off" is the field check alone. The spec-on arms run with the per-request log
    (``_spec.BIND``) on, except the one marked "no per-request log"; the writer thread's
    work on that log (``_bindings._fold_spec``) is timed apart, per step. Interleaved."""
    from _stats import summary

    from verifier.probe import _bindings, _spec, _vllm

    ngram = type("Spec", (), {"method": "ngram", "num_speculative_tokens": 3})()
    plain_so = SchedulerOutput(tokens=8, reqs=8)
    spec_so = SchedulerOutput(tokens=32, reqs=8)
    spec_so.scheduled_spec_decode_tokens = {r: [1, 2, 3] for r in spec_so.num_scheduled_tokens}
    plain_out = RunnerOutput({r: [5] for r in plain_so.num_scheduled_tokens})
    spec_out = RunnerOutput({r: [1, 2, 7] for r in spec_so.num_scheduled_tokens})

    def run(w: Any, so: Any) -> Callable[[], object]:
        def one() -> object:
            w.execute_model(so)
            return w.sample_tokens(None)

        return one

    workers = {}
    for name, spec, so, out in (
        ("decode", None, plain_so, plain_out),
        ("spec decode", ngram, spec_so, spec_out),
    ):
        bare, probed = make_two_phase(spec, out), make_two_phase(spec, out)
        _vllm._wrap_worker_class(type(probed))
        run(probed, so)()  # the first step records the runner (and its speculative config)
        workers[name] = (run(bare, so), run(probed, so))
    log = _bindings.spec_step
    drafts = "two-phase probed step, 8 requests x 3 drafts, spec on"
    arms: dict[str, tuple[bool, Any, Callable[[], object]]] = {
        "two-phase bare step, 8 requests decode": (False, None, workers["decode"][0]),
        "two-phase probed step, 8 requests decode, spec off": (False, None, workers["decode"][1]),
        "two-phase bare step, 8 requests x 3 drafts": (False, None, workers["spec decode"][0]),
        drafts: (True, log, workers["spec decode"][1]),
        f"{drafts}, no per-request log": (True, None, workers["spec decode"][1]),
        "two-phase probed step, 8 requests decode, spec on": (True, log, workers["decode"][1]),
    }
    fold_key = "per-request fold per step (writer thread), 8 requests x 3 drafts"
    results: dict[str, list[float]] = {k: [] for k in [*arms, fold_key]}
    saved = _vllm._spec_on, _spec.BIND, _bindings.LOG_MAX
    # The probe's writer thread folds the logs every 0.5 s: it waits on this lock meanwhile,
    # so the fold timed here is the whole of each timing's log. No fold inside the timed
    # steps either (as in bindings_arms), and the steps' own bindings log is dropped after
    # each timing: left to the writer, it would be folded during the timings that follow.
    _bindings.LOG_MAX = 1 << 40
    _bindings._fold_lock.acquire()
    try:
        for _ in range(ROUNDS):
            for name, (on, bind, fn) in arms.items():
                _vllm._spec_on, _spec.BIND = on, bind
                _bindings._spec_log.clear()
                results[name].append(timeit.timeit(fn, number=N) / N * 1e9)
                if name == drafts:
                    t0 = time.perf_counter_ns()
                    _bindings._fold_spec(len(_bindings._spec_log))
                    results[fold_key].append((time.perf_counter_ns() - t0) / N)
                _bindings._spec_log.clear()
                _bindings._spec_open.clear()
                _bindings._log.clear()
    finally:
        _vllm._spec_on, _spec.BIND, _bindings.LOG_MAX = saved
        _bindings._fold_lock.release()
    return {k: summary(v) for k, v in results.items()}


def smoke_mode() -> None:
    """--smoke: every arm, 200 steps each (bindings_arms and spec_arms read N and ROUNDS)."""
    global N, ROUNDS
    if _smoke.parse(__doc__).smoke:
        _smoke.begin("every arm (bindings, speculation, N hooks, first-hit), 200 steps each")
        N, ROUNDS = 200, _smoke.ROUNDS


def main() -> None:  # noqa: PLR0915 - every arm and every line of the report, in one place
    smoke_mode()
    with tempfile.TemporaryDirectory() as d:
        os.environ["VERIFIER_PROBE_DIR"] = d
        import verifier.probe as p
        from verifier.probe import _vllm

        p.start("bench")
        from verifier.probe import _hooks

        for i in range(4):  # declared hooks: each new request notes their fire counts
            _hooks.declare(f"declared_{i}", "", "api")
        bindings = bindings_arms(make_worker(), _wrapped(make_worker()))
        spec = spec_arms()
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

        first = _hooks.declare("first_hit", "", "api")
        _firsthit.install(Target, "step", _hooks._fire, first, "first_hit")
        hit, plain_t = Target(), type("Plain", (), {"step": lambda self: None})()
        hit.step()  # its first call: fires once and steps aside
        arms["plain call"] = plain_t.step
        arms["first-hit hooked call, after its hit"] = hit.step
        s = interleaved_ns(arms, ROUNDS, N)
        s.update(bindings)
        s.update(spec)
        print(f"probe cost per engine step: {ROUNDS} interleaved rounds x {N} steps, ns per step")
        print_rows(s)
        extra = s["probed step"]["median"] - s["bare step"]["median"]
        print(f"  probe overhead per productive step = {extra:.0f} ns (budget 2000 ns)")
        for what in ("8 requests decode", "1 of 8 replaced per step"):
            off = s[f"probed step, {what}, no bindings"]["median"]
            on = s[f"probed step, {what}, bindings"]["median"]
            fold = s[f"bindings fold per step, {what}"]["median"]
            base = s[f"bare step, {what}"]["median"]
            print(
                f"  request bindings, {what}: +{on - off:.0f} ns in the step "
                f"(probe overhead {off - base:.0f} ns without, {on - base:.0f} ns with: "
                f"{(on - base) / (off - base):.2f}x), +{fold:.0f} ns per step in the writer thread"
            )
        base = s["two-phase bare step, 8 requests decode"]["median"]
        off = s["two-phase probed step, 8 requests decode, spec off"]["median"]
        on_plain = s["two-phase probed step, 8 requests decode, spec on"]["median"]
        base_spec = s["two-phase bare step, 8 requests x 3 drafts"]["median"]
        on = s["two-phase probed step, 8 requests x 3 drafts, spec on"]["median"]
        print(
            f"  speculation: probe overhead per two-phase step {off - base:.0f} ns with "
            f"speculation off, {on_plain - base:.0f} ns on (a step without drafts), "
            f"{on - base_spec:.0f} ns on with 8 x 3 drafts "
            f"({(on - base_spec) / (off - base):.2f}x the spec-off overhead)"
        )
        no_log = s["two-phase probed step, 8 requests x 3 drafts, spec on, no per-request log"]
        fold = s["per-request fold per step (writer thread), 8 requests x 3 drafts"]["median"]
        print(
            f"  per-request speculation counts: +{on - no_log['median']:.0f} ns in the step "
            f"(the log), +{fold:.0f} ns per step in the writer thread"
        )
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
