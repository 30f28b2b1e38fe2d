"""Probe cost per engine step, where users run it: batch 1, 8, 64 and 256, for plain decode
steps, mixed steps (a chunked prefill continuing among decodes, plus a new request) and
speculative steps (every request verifying drafts), two-phase as vLLM's V1 runs a step
(``execute_model``, then ``sample_tokens``), with request bindings on; plus declared hooks
firing N times per step (N = 1, 10, 100) and a first-hit hook after its hit.

The probe wraps the concrete worker class's ``execute_model`` and ``sample_tokens`` (see
probe/servewitness_probe/_vllm.py). This benchmark applies the same wrappers to a stand-in worker
whose step does nothing, fed scheduler outputs built from vLLM 0.32's own field lists
(``SchedulerOutput``, ``CachedRequestData``, ``NewRequestData``; checked against the installed vLLM
by tests/test_split_hint.py), so the difference between the arms is exactly the probe's per-step
work. The bindings' per-request work, done by the probe's writer thread off the step, is timed apart
after each timing and added: the budget (2 us per step) is judged on the sum, on the worst row. Arms
are interleaved.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import os
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
from _stats import interleaved_ns, print_rows, summary

N = 20_000
ROUNDS = 15


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
    from servewitness_probe import _hooks

    def noop() -> None:
        return None

    return tuple(_hooks.counting(noop, _hooks.declare(f"h{n}_{i}", "", "api")) for i in range(n))


def plain(n: int) -> tuple[Any, ...]:
    def noop() -> None:
        return None

    return tuple(noop for _ in range(n))


BATCHES = (1, 8, 64, 256)
SHAPES = ("decode", "mixed", "spec")
CHUNK = 64  # tokens of one prefill chunk (mixed steps); a new prompt is two chunks
DRAFTS = 3  # drafts per request (spec steps)
CYCLE = 512  # distinct scheduler outputs per cell, replayed in turn (exactly periodic)
BUDGET_NS = 2000


@dataclass
class CachedRequestData:
    """vLLM 0.32's ``CachedRequestData`` (vllm/v1/core/sched/output.py), every field."""

    req_ids: list[str]
    resumed_req_ids: set[str]
    new_token_ids: list[list[int]]
    all_token_ids: dict[str, list[int]]
    new_block_ids: list[tuple[list[int], ...] | None]
    num_computed_tokens: list[int]
    num_output_tokens: list[int]


@dataclass
class NewRequestData:
    """vLLM 0.32's ``NewRequestData``, every field."""

    req_id: str
    prompt_token_ids: list[int] | None
    mm_features: list[Any]
    sampling_params: Any
    pooling_params: Any
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    lora_request: Any
    prompt_embeds: Any = None
    prompt_is_token_ids: list[bool] | None = None
    prefill_token_ids: list[int] | None = None
    replay_start: int = 0


@dataclass
class SchedulerOutput:
    """vLLM 0.32's ``SchedulerOutput``: its required fields and the optional ones a step of
    these shapes sets (the others keep vLLM's defaults, which the probe does not read)."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict[str, list[int]]
    scheduled_encoder_inputs: dict[str, list[int]]
    finished_req_ids: set[str]
    free_encoder_mm_hashes: list[str]
    preempted_req_ids: set[str] | None = None
    num_invalid_spec_tokens: dict[str, int] | None = None


@dataclass
class ModelRunnerOutput:
    """The fields of vLLM 0.32's ``ModelRunnerOutput`` the probe reads."""

    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]


_IDS: dict[tuple[str, int], str] = {}


def _rid(cell: str, j: int) -> str:
    """Request J's id, shaped like vLLM's internal ids (cmpl-<uuid>-0-<8 chars>), one string
    object per request as in vLLM (its scheduler outputs and runner outputs hold the
    request's own ``request_id`` step after step)."""
    key = cell, j % CYCLE
    rid = _IDS.get(key)
    if rid is None:
        rid = _IDS[key] = f"cmpl-{cell}{j % CYCLE:026x}-0-{j % CYCLE:08x}"
    return rid


def _cached(ids: list[str], computed: list[int], out: list[int]) -> CachedRequestData:
    return CachedRequestData(ids, set(), [], {}, [None] * len(ids), computed, out)


def _new(rid: str) -> NewRequestData:
    prompt = list(range(2 * CHUNK))
    return NewRequestData(rid, prompt, [], None, None, ([0],), 0, None)


def _output(ids: list[str], counts: dict[str, int]) -> SchedulerOutput:
    return SchedulerOutput([], _cached(ids, [100] * len(ids), [10] * len(ids)), counts,
                           sum(counts.values()), {}, {}, set(), [])  # fmt: skip


def cell_steps(shape: str, batch: int) -> list[tuple[SchedulerOutput, ModelRunnerOutput]]:
    """CYCLE steps of SHAPE at BATCH requests, each with its runner output, as vLLM's V1
    scheduler and model runner make them. decode: BATCH continuing requests, one token each.
    spec: BATCH continuing requests, each verifying DRAFTS drafts (1 + DRAFTS tokens) and
    sampling 1 to 1 + DRAFTS tokens. mixed: BATCH - 2 decoding, one continuing a chunked
    prefill (its second chunk of CHUNK tokens, no output yet), one new (its first chunk of
    a 2 x CHUNK prompt); every step the chunked one starts decoding, the new one continues,
    one decoding request finishes (announced in the next step) and a new one comes
    (at BATCH 1: one request continuing a chunked prefill, step after step)."""
    cell = f"{shape[0]}{batch:03d}"
    out = []
    for t in range(CYCLE):
        if shape == "mixed" and batch > 1:
            dec = [_rid(cell, j) for j in range(t - batch + 1, t - 1)]  # admitted earlier
            chunked, new = _rid(cell, t - 1), _rid(cell, t)
            counts = {**dict.fromkeys(dec, 1), chunked: CHUNK, new: CHUNK}
            so = _output([*dec, chunked], counts)
            so.scheduled_cached_reqs.num_computed_tokens[-1] = CHUNK
            so.scheduled_cached_reqs.num_output_tokens[-1] = 0
            so.scheduled_new_reqs = [_new(new)]
            so.finished_req_ids = {_rid(cell, t - batch)}
            sampled = {**{r: [7] for r in dec}, new: [], chunked: [7]}
        elif shape == "mixed":
            rid = _rid(cell, 0)
            so = _output([rid], {rid: CHUNK})
            so.scheduled_cached_reqs.num_output_tokens[0] = 0
            sampled = {rid: []}
        else:
            ids = [_rid(cell, j) for j in range(batch)]
            k = 1 + (DRAFTS if shape == "spec" else 0)
            so = _output(ids, dict.fromkeys(ids, k))
            if shape == "spec":
                so.scheduled_spec_decode_tokens = {r: [5, 6, 7] for r in ids}
            sampled = {r: [7] * (1 + (i + t) % k) for i, r in enumerate(ids)}
        ro = ModelRunnerOutput(list(sampled), {r: i for i, r in enumerate(sampled)},
                               list(sampled.values()))  # fmt: skip
        out.append((so, ro))
    return out


class SpecConfig:
    method = "ngram"
    num_speculative_tokens = DRAFTS


class VllmConfig:
    def __init__(self, spec: Any) -> None:
        self.speculative_config = spec


class TwoPhaseRunner:
    def __init__(self, spec: Any) -> None:
        self.vllm_config = VllmConfig(spec)


def two_phase_worker(spec: Any) -> Any:
    """A V1-shaped worker (a class of its own): ``execute_model`` returns None, and
    ``sample_tokens`` the step's runner output (handed to it here: the stand-in samples
    nothing)."""

    class Worker:
        model_runner = TwoPhaseRunner(spec)

        def execute_model(self, scheduler_output: Any) -> None:
            return None

        def sample_tokens(self, grammar_output: Any) -> Any:
            return grammar_output

    return Worker()


def _stepper(worker: Any, steps: list[tuple[Any, Any]]) -> Callable[[], object]:
    nxt = itertools.cycle(steps).__next__
    execute, sample = worker.execute_model, worker.sample_tokens

    def one() -> object:
        so, ro = nxt()
        execute(so)
        return sample(ro)

    return one


def _reset_bindings() -> None:
    """Close what the previous cell left open (its requests are not this cell's), so each
    cell's timings start from its own requests only; drop the records (written apart)."""
    from servewitness_probe import _bindings

    _bindings._log.clear()
    _bindings._spec_log.clear()
    if _bindings._open:
        _bindings._close(list(_bindings._open), "open", None)
    _bindings._spec_open.clear()
    _bindings._buf.clear()
    split = sys.modules.get("servewitness_probe._split")  # absent before the split's hint
    if split is not None:
        split._irregular.clear()


def _fold_all() -> None:
    """The writer thread's fold (its lock held by the caller)."""
    from servewitness_probe import _bindings

    _bindings._fold_all()


def grid_arms(rounds: int, n: int) -> dict[str, dict[str, float]]:
    """Every cell (shape x batch), two-phase, bindings on: the bare stand-in and the probed one
    (the probe's wrappers on a class of its own), interleaved, and after each probed timing
    the writer thread's fold of what those steps logged (per step). The writer's lock is held
    throughout: it folds only when timed here."""
    from servewitness_probe import _bindings, _spec, _vllm

    cells = {}
    for shape in SHAPES:
        for batch in BATCHES:
            spec = SpecConfig() if shape == "spec" else None
            steps = cell_steps(shape, batch)
            bare, probed = two_phase_worker(spec), two_phase_worker(spec)
            _vllm._wrap_worker_class(type(probed))
            cells[shape, batch] = (shape == "spec", _stepper(bare, steps), _stepper(probed, steps))
    arms = ("bare", "probed", "fold", "in-step", "total")
    keys = [f"{what} {s} {b}" for s, b in cells for what in arms]
    results: dict[str, list[float]] = {k: [] for k in keys}
    k0 = getattr(_spec, "K", 0)  # absent before uniform steps: set, unread there
    saved = _vllm._spec_on, _spec.BIND, _vllm._bind_step, _bindings.LOG_MAX, k0
    _bindings.LOG_MAX = 1 << 40
    _vllm._bind_step, _spec.BIND = _bindings.step, _bindings.spec_step
    _bindings._fold_lock.acquire()
    try:
        for _ in range(rounds):
            for (shape, batch), (on, bare, probed) in cells.items():
                _reset_bindings()
                # the live config's speculation, as the runner's record sets it (once per
                # runner class: the cells share one)
                _vllm._spec_on, _spec.K = on, DRAFTS if on else 0
                probed()  # the first step records the runner (and its speculative config)
                _fold_all()
                tag = f"{shape} {batch}"
                results[f"bare {tag}"].append(timeit.timeit(bare, number=n) / n * 1e9)
                results[f"probed {tag}"].append(timeit.timeit(probed, number=n) / n * 1e9)
                t0 = time.perf_counter_ns()
                _fold_all()
                results[f"fold {tag}"].append((time.perf_counter_ns() - t0) / n)
                # the round's own difference (bare and probed timed back to back)
                diff = results[f"probed {tag}"][-1] - results[f"bare {tag}"][-1]
                results[f"in-step {tag}"].append(diff)
                results[f"total {tag}"].append(diff + results[f"fold {tag}"][-1])
        _reset_bindings()
    finally:
        _vllm._spec_on, _spec.BIND, _vllm._bind_step, _bindings.LOG_MAX, _spec.K = saved
        _bindings._fold_lock.release()
    return {k: summary(v) for k, v in results.items()}


def print_grid(g: dict[str, dict[str, float]]) -> None:
    """One row per cell: bare and probed step (ns, medians), the probe's cost in the step
    (median of the rounds' paired differences), the writer thread's fold per step, their
    sum with its noise floor (the paired sums' max - min, in ns), and the same from each
    arm's fastest round (min probed - min bare + min fold: the cost without the other
    processes' interference, which only ever adds)."""
    print("probe cost per two-phase engine step, bindings on (ns per step; in step = probed - "
          "bare, paired per round; writer = fold per step, off the step; floor = max - min "
          "of the rounds' paired totals; min = from each arm's fastest round)")  # fmt: skip
    worst: tuple[float, str] = (float("-inf"), "")
    worst_min: tuple[float, str] = (float("-inf"), "")
    for shape in SHAPES:
        for batch in BATCHES:
            tag = f"{shape} {batch}"
            b, p, f = g[f"bare {tag}"], g[f"probed {tag}"], g[f"fold {tag}"]
            ins, tot = g[f"in-step {tag}"], g[f"total {tag}"]
            low = p["min"] - b["min"] + f["min"]
            worst = max(worst, (tot["median"], tag))
            worst_min = max(worst_min, (low, tag))
            print(
                f"  {shape:<6} batch {batch:>3}: bare {b['median']:6.1f}  probed "
                f"{p['median']:8.1f}  in step {ins['median']:+8.1f}  writer {f['median']:+8.1f}  "
                f"total {tot['median']:+8.1f} (floor {tot['max'] - tot['min']:.0f} ns, "
                f"spread {tot['spread']:.1%})  min {low:+8.1f}"
            )
    for what, (ns, tag) in (("median", worst), ("min", worst_min)):
        verdict = "MEETS" if ns <= BUDGET_NS else "OVER"
        print(f"  worst row ({what}): {tag}, {ns:+.0f} ns per step (in step and writer): "
              f"budget {BUDGET_NS} ns per step at every batch and shape: {verdict}")  # fmt: skip


def smoke_mode() -> None:
    """--smoke: every arm and cell, 200 steps each, one round; else --steps and --rounds."""
    global N, ROUNDS
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    _smoke.add_args(parser)
    parser.add_argument("--steps", type=int, default=N, help="steps per timing")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds")
    args = parser.parse_args()
    N, ROUNDS = args.steps, args.rounds
    if args.smoke:
        _smoke.begin("every arm and every cell (shape x batch, hooks, first-hit), 200 steps each")
        N, ROUNDS = 200, _smoke.ROUNDS


def main() -> None:
    smoke_mode()
    with tempfile.TemporaryDirectory() as d:
        os.environ["VERIFIER_PROBE_DIR"] = d
        import servewitness_probe as p
        from servewitness_probe import _vllm

        p.start("bench")
        from servewitness_probe import _firsthit, _hooks

        for i in range(4):  # declared hooks: each new request notes their fire counts
            _hooks.declare(f"declared_{i}", "", "api")
        with contextlib.suppress(ImportError):  # loaded in every vLLM process: the probe
            import numpy  # noqa: F401 - counts uniform runs with it there
        grid = grid_arms(ROUNDS, N)
        decode = cell_steps("decode", 8)[0][0]
        arms: dict[str, Callable[[], object]] = {}
        for n in (1, 10, 100):
            b, w = make_worker(plain(n)), make_worker(hooked(n))
            _vllm._wrap_worker_class(type(w))
            arms[f"bare step, {n} plain calls"] = functools.partial(b.execute_model, decode)
            arms[f"probed step, {n} hooks fire"] = functools.partial(w.execute_model, decode)

        class Target:  # a first-hit hook after its first call: the original is back in place
            def step(self) -> None:
                return None

        first = _hooks.declare("first_hit", "", "api")
        _firsthit.install(Target, "step", _hooks._fire, first, "first_hit")
        hit, plain_t = Target(), type("Plain", (), {"step": lambda self: None})()
        hit.step()  # its first call: fires once and steps aside
        arms["plain call"] = plain_t.step
        arms["first-hit hooked call, after its hit"] = hit.step
        s = interleaved_ns(arms, ROUNDS, N)
        print_grid(grid)
        print(
            f"hooks: {ROUNDS} interleaved rounds x {N} steps, ns per step (one-phase, 8 requests)"
        )
        print_rows(s)
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
