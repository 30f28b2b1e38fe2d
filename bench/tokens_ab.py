"""Tokens/s with the probe's per-step path on and off, inside ONE offline vLLM boot.

Why: comparing boots (bench/server_throughput.py, bench/compare_boots.py) prices the probe
against boot-to-boot and client noise of 10-165 %, while its per-step cost is a few us
against steps of ms (~0.1 %). Here nothing changes between arms but the probe's wrappers:

* one ``vllm.LLM`` in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: engine core and
  worker here), the probe loaded as the vLLM plugin, as users run it;
* a phase is one ``LLM.generate`` of the same BATCH prompts (fixed token ids, greedy,
  ``ignore_eos``, MAX_TOKENS each, prefix caching off, no detokenization): the same steps of
  the same work every time;
* arms, switched between phases by ``servewitness_probe._switch`` (the probe's wrappers on the
  worker's ``execute_model``/``sample_tokens`` and on any hooked runner method, put back to
  the originals and back again):
    A1, A2  probe hot path off (two copies of the baseline: their difference is the floor)
    B       probe hot path on
    C       off, plus a positive control: a busy wait of CONTROL % of a step's time in every
            ``execute_model`` (it must be seen: proof that the method sees that much)
    D       probe hot path on, its request bindings off (``_vllm._bind_step = None``): B
            against D is what the bindings (their in-step record and the writer thread's
            fold) cost
* ROUNDS rounds (or as many as --budget-s allows) in one of two designs (``--design``):
    sandwich  (the default since session 15) the baseline A1 between every two other
              phases, A1 X A1 Y A1 Z A1 ..., the other arms (``--arms``) once per round in a
              seeded random order, each X phase against the two A1 phases beside it (their
              geometric mean): a drift of the machine's speed cancels to first order. Why: on
              the H200 host one arm's phases spread 60-80 % through regimes of the machine's
              speed that last seconds, so X against its round's A1 at a random distance paid
              that drift (the recorded batch-256 phases: adjacent phases differ by a robust
              sd of 6-7 %, phases four apart by 10-14 %);
    rounds    (the method up to session 9) each round runs every arm once in a seeded
              random order, X against that round's A1.
  Estimators of each arm's tokens/s against its baselines, fixed in advance, each with a
  bootstrap 95 % interval (rounds resampled whole, so a round's arms stay paired): the
  median of per-round ratios; the ratio of the arms' fastest-decile phases (other processes
  only ever slow a phase down); and, where the phases carry the speed reference (below), the
  **speed-adjusted** median (declared before its first device run, session 15): each
  per-round log ratio minus beta times the speed reference's log ratio over the same phases,
  beta the least-squares slope over every round and arm (centred per arm), estimated again in
  every resample. The noise floor is the A2 interval's half-width (the same method run with no
  difference at all). How a run is read (declared before session 17's device runs; up to
  session 15 the plain paired median was the verdict's): the **speed-adjusted paired median
  by wall clock is the verdict's estimator** (in session 15's runs the speed reference
  explained 58-77 % of the per-round variance and its floors were the narrowest); the plain
  paired median and the fastest decile are still printed beside it; an estimator resolves
  1 % in a run only where its own A/A floor is under 1 % and its own control interval lies
  below 1 (the report prints that reading for each). A run without the speed reference
  (``--ref-turns 0``) has no verdict's estimator and resolves nothing by this rule. Both
  wall-clock tokens/s and tokens per CPU-second of this process (all threads) are
  reported. Runs saved with --save pool
  with --pool (every ratio is within a round, so rounds of separate boots pool; the
  control's size is calibrated per boot, so a pooled control row mixes sizes).
* the speed reference (``--ref-turns``, 0: none): a fixed pure-Python loop run before every
  engine step in every arm and timed: a sample of how fast this thread runs at that moment.
  Its seconds are taken out of the phase's (tokens/s is the engine's), and its log ratio
  between phases is the covariate of the speed-adjusted estimator.
* the step timer: every engine step of a phase is timed (``LLM.llm_engine.step``, outside the
  probe, every arm) and kept (``steps_us``), with the time before the first step (adding the
  requests) and after the last; the scheduler's shape of each step (requests, tokens) is kept
  once per workload: what a later analysis of steady-state steps needs.
* the probe's pending request bindings are folded and written at the end of every phase,
  inside its timing (``drain``; a no-op in arms without bindings): its writer thread does it
  every 0.5 s, so a shorter phase left its bindings to the next phase (found in session 15's
  decode run, where the phase after a B phase stalled ~30 ms and the sandwich charged that to
  the probe's own baseline).
* every phase ends with one more engine step, in its arm and inside its timing (the
  **finish step**): vLLM hands a step's finished requests to the NEXT step's scheduler
  output, and ``generate`` returns before that step, so without it a B phase's finishes
  reached the probe only in the next phase, which runs with the probe off: its 256 requests
  stayed open in the probe's table for good, the table grew by a batch per B phase and the
  steady fold path went off (session 15's decode re-run: B's cost grew through the run).
  A server with the probe always on runs that step too (its engine loop steps while finished
  requests are pending). The requests open in the probe's table after each phase are kept
  (``open``) and reported: they must stay at 0.
* the switch is checked on every phase: the probe's step counter advances by the phase's
  steps in B and D phases and by 0 in the others (exit 1 otherwise).

What stays on in every arm: the probe's import hooks and idle background threads (not priced
here; they cost nothing per step). ``--hooks`` also declares the two hooks of the server
benchmarks (the runner's ``execute_model`` and ``sample_tokens``): their wrappers switch too.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
from _stats import print_rows, summary

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / ".cache" / "tiny-llama"
HOOKS = (
    "v1_step=vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model,"
    "v1_sample=vllm.v1.worker.gpu_model_runner:GPUModelRunner.sample_tokens"
)
ARMS = ("A1", "A2", "B", "C", "D")
BASE = "A1"  # the baseline every other arm is compared with
DESIGNS = ("sandwich", "rounds")
BOOTSTRAP = 2000
FAST_Q = 0.1  # the 0.1 quantile of phase times: the fastest decile of phases
METRICS = (("wall", "tokens/s (wall clock)"), ("cpu", "tokens per CPU-second"))

Phase = dict[str, Any]  # one generate of the batch: seconds, counts, its steps
Round = dict[str, Any]  # "rounds": {arm: Phase}; "sandwich": {"seq": [A1, X, A1, Y, ..., A1]}
Digest = dict[str, Any]  # what the estimators need of one round


def quantile(xs: list[float], q: float) -> float:
    """The Q-quantile of XS (linear interpolation between order statistics)."""
    ys = sorted(xs)
    pos = q * (len(ys) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)


def speed_loop(turns: int) -> int:
    """TURNS turns of a fixed pure-Python loop: the speed reference, whose time says how fast
    this thread runs at the moment (the same work every time)."""
    x = 0
    for i in range(turns):
        x ^= i * 7
    return x


def steal_ticks() -> int:
    """The machine's steal time so far (/proc/stat, clock ticks, every CPU); -1 if unknown."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8])
    except (OSError, IndexError, ValueError):
        return -1


def drain() -> int:
    """Fold and write the probe's pending request bindings now, in this thread, and say how
    many steps were pending (0: nothing to do, as in every arm without bindings). Why: the
    probe's writer thread folds them every 0.5 s, so the bindings of a phase shorter than that
    were folded during the NEXT phase: session 15's decode run (0.33 s phases) showed a
    ~30 ms stall in the baseline phase after every probe phase, which the sandwich then
    counted against the probe's own baseline. Drained inside the timed phase, every phase
    pays for its own bindings."""
    from servewitness_probe import _bindings

    pending = len(_bindings._log)
    if pending or _bindings._buf:
        _bindings.fold()
        _bindings.flush()
    return pending


def open_requests() -> int:
    """Requests open in the probe's bindings table (after ``drain``, every arm): 0 after every
    phase when each phase's finishes reach the probe in its own phase (the finish step)."""
    from servewitness_probe import _bindings

    return len(_bindings._open)


# The rounds, in either design: which phases each arm has, and what each is compared with.


def each_phase(rnd: Round) -> list[tuple[str, Phase]]:
    """Every phase of RND with its arm, in the order they ran (a sandwich's closing baseline,
    which opens the next round, included)."""
    if "seq" in rnd:
        return [(str(p["arm"]), p) for p in rnd["seq"]]
    return list(rnd.items())


def round_arms(rnd: Round) -> list[str]:
    """The arms of RND."""
    return sorted({arm for arm, _ in each_phase(rnd)})


def arm_phases(rnd: Round, arm: str) -> list[Phase]:
    """ARM's phases in RND; a sandwich's baselines once each (its closing one is the next
    round's opening one)."""
    if "seq" not in rnd:
        return [rnd[arm]] if arm in rnd else []
    seq = rnd["seq"]
    if arm == BASE:
        return list(seq[0:-1:2])
    return [p for p in seq[1::2] if p["arm"] == arm]


def pair(rnd: Round, arm: str) -> tuple[Phase, list[Phase]]:
    """ARM's phase in RND and the baseline phases it is compared with: that round's A1
    ("rounds"), or the two A1 phases just before and after it ("sandwich")."""
    if "seq" not in rnd:
        return rnd[arm], [rnd[BASE]]
    seq = rnd["seq"]
    for i in range(1, len(seq) - 1, 2):
        if seq[i]["arm"] == arm:
            return seq[i], [seq[i - 1], seq[i + 1]]
    raise KeyError(arm)


def seconds(p: Phase, metric: str) -> float:
    """The phase's METRIC seconds (wall or cpu) less the speed reference's: the engine's."""
    return float(p[metric]) - float(p.get("ref_s", 0.0))


def geomean(xs: list[float]) -> float:
    """The geometric mean of XS (one value: itself, exactly)."""
    if len(xs) == 1:
        return xs[0]
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def digest(rnd: Round, arms: list[str]) -> Digest:
    """What the estimators need of RND: per metric, each arm's tokens/s over its baselines'
    (``ratio``) and each arm's phase seconds (``secs``); where every phase ran the speed
    reference, its log ratio over the same phases (``speed``: baselines' over the arm's, as
    the tokens/s ratio is)."""
    ratio: dict[str, dict[str, float]] = {}
    secs: dict[str, dict[str, list[float]]] = {}
    for metric, _ in METRICS:
        ratio[metric] = {}
        for a in arms:
            if a == BASE:
                continue
            x, refs = pair(rnd, a)
            ratio[metric][a] = geomean([seconds(r, metric) for r in refs]) / seconds(x, metric)
        secs[metric] = {a: [seconds(p, metric) for p in arm_phases(rnd, a)] for a in arms}
    speed: dict[str, float] | None = None
    if all(float(p.get("ref_s", 0.0)) > 0 for _, p in each_phase(rnd)):
        speed = {}
        for a in ratio["wall"]:
            x, refs = pair(rnd, a)
            speed[a] = statistics.fmean(math.log(r["ref_s"]) for r in refs) - math.log(x["ref_s"])
    return {"ratio": ratio, "secs": secs, "speed": speed}


Estimator = Callable[[list[Digest], str, str], float]


def paired_median(ds: list[Digest], arm: str, metric: str) -> float:
    """Median over rounds of (ARM's tokens/s / its baselines' tokens/s in the same round)."""
    return statistics.median(float(d["ratio"][metric][arm]) for d in ds)


def fastest_decile(ds: list[Digest], arm: str, metric: str) -> float:
    """ARM's tokens/s at its fastest decile of phases over A1's: the other processes on the
    machine only ever slow a phase down, so the fast tail is the least disturbed estimate."""
    base = [s for d in ds for s in d["secs"][metric][BASE]]
    return quantile(base, FAST_Q) / quantile(
        [s for d in ds for s in d["secs"][metric][arm]], FAST_Q
    )


def speed_fit(ds: list[Digest], metric: str) -> tuple[float, float]:
    """Least-squares slope beta of the rounds' log tokens/s ratios on the speed reference's
    log ratios, every arm centred on its own means, and the share of their variance it
    explains (R squared)."""
    sxy = sxx = syy = 0.0
    for a in ds[0]["speed"]:
        xs = [d["speed"][a] for d in ds]
        ys = [math.log(d["ratio"][metric][a]) for d in ds]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        sxy += sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
        sxx += sum((x - mx) ** 2 for x in xs)
        syy += sum((y - my) ** 2 for y in ys)
    beta = sxy / sxx if sxx > 0 else 0.0
    return beta, (sxy * sxy / (sxx * syy) if sxx > 0 and syy > 0 else 0.0)


def speed_adjusted(ds: list[Digest], arm: str, metric: str) -> float:
    """The paired median of the ratios with the speed reference's drift taken out: each
    round's ratio times exp(-beta x the reference's log ratio), beta fitted on DS (so again
    in every bootstrap resample)."""
    beta = speed_fit(ds, metric)[0]
    return statistics.median(
        float(d["ratio"][metric][arm]) * math.exp(-beta * d["speed"][arm]) for d in ds
    )


ESTIMATORS: dict[str, Estimator] = {
    "paired median of per-round ratios": paired_median,
    "fastest decile of each arm's phases": fastest_decile,
}
SPEED_ESTIMATOR = ("speed-adjusted paired median", speed_adjusted)
# The verdict's estimator (wall clock), declared before session 17's device runs; up to
# session 15 it was the plain paired median, which is still printed beside it.
VERDICT = SPEED_ESTIMATOR[0]


def resolves(floor: float, control_seen: bool) -> bool:
    """The reading rule, fixed before session 15's runs: an estimator resolves 1 % in a run
    only where its own A/A floor is under 1 % and its own control interval lies below 1."""
    return floor < 0.01 and control_seen


def interval(
    ds: list[Digest], arm: str, metric: str, est: Estimator, rng: random.Random
) -> tuple[float, float, float]:
    """EST on the rounds DS, and its bootstrap 95 % percentile interval (rounds resampled
    whole, so the arms of a round stay paired)."""
    boot = sorted(est(rng.choices(ds, k=len(ds)), arm, metric) for _ in range(BOOTSTRAP))
    return est(ds, arm, metric), boot[int(0.025 * BOOTSTRAP)], boot[int(0.975 * BOOTSTRAP) - 1]


class GcClock:
    """Time this process spends in the garbage collector, and its collections by generation
    (``gc.callbacks``): an arm that allocates more makes collections more frequent, a cost
    the per-step microbenchmark cannot see."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._t0 = 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._t0
        self.collections[int(info["generation"])] += 1


class Bench:
    """The offline engine, its probe switch, the step timer, and the phases."""

    def __init__(self, model: Path, llm_kwargs: dict[str, Any], ref_turns: int = 0) -> None:
        from servewitness_probe import _core
        from servewitness_probe import layout as L
        from servewitness_probe._switch import Switch
        from vllm import LLM

        self.llm = LLM(str(model), **llm_kwargs)
        self.prompts: list[Any] = []
        self.params: Any = None
        self.tokens = 0
        core = self.llm.llm_engine.engine_core.engine_core  # InprocClient -> EngineCore
        wrapper = core.model_executor.driver_worker
        self.worker = getattr(wrapper, "worker", wrapper)
        self.switch = Switch.of([self.worker, self.worker.model_runner])
        if not any(t.name == "execute_model" for t in self.switch.targets):
            raise SystemExit("the probe's step wrapper is not on the worker: is the probe on?")
        self.counters = _core.COUNTERS
        self.steps_slot = L.S_STEPS_TOTAL
        step = next(t for t in self.switch.targets if t.name == "execute_model")
        self.exec_owner, self.exec_orig = step.owner, step.original
        self.control_ns = 0
        self.control_calls = 0
        self.gc = GcClock()
        self.ref_turns = ref_turns
        self.ref_ns = 0
        self.step_ns: list[int] = []
        self.first_step_ns = 0
        self.last_step_ns = 0
        self.shapes: list[list[int]] | None = None
        self.schedule: list[list[int]] = []
        self._time_steps(core)

    def _time_steps(self, core: Any) -> None:
        """Every arm: the speed reference, then the engine step, each timed (outside the
        probe: ``LLM`` calls ``llm_engine.step()`` once per step); the scheduler's shape of
        each step (requests, tokens) while ``shapes`` is a list."""
        engine, bench = self.llm.llm_engine, self
        step, schedule = engine.step, core.scheduler.schedule

        def timed_step() -> Any:
            t0 = time.perf_counter_ns()
            if bench.ref_turns:
                speed_loop(bench.ref_turns)
            t1 = time.perf_counter_ns()
            out = step()
            t2 = time.perf_counter_ns()
            bench.ref_ns += t1 - t0
            bench.step_ns.append(t2 - t1)
            if not bench.first_step_ns:
                bench.first_step_ns = t0
            bench.last_step_ns = t2
            return out

        def shaped_schedule(*args: Any, **kwargs: Any) -> Any:
            so = schedule(*args, **kwargs)
            if bench.shapes is not None:
                reqs = len(getattr(so, "num_scheduled_tokens", ()) or ())
                bench.shapes.append([reqs, int(getattr(so, "total_num_scheduled_tokens", 0))])
            return so

        engine.step = timed_step
        core.scheduler.schedule = shaped_schedule

    def workload(self, batch: int, prompt_len: int, max_tokens: int) -> None:
        """Every later phase: BATCH requests of PROMPT_LEN fixed token ids (distinct per
        request: no shared prefix to skip), MAX_TOKENS greedy tokens each, no detokenizing."""
        from vllm import SamplingParams

        self.params = SamplingParams(
            max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False
        )
        self.prompts = [
            {"prompt_token_ids": [1 + (7 * i + j) % 1900 for j in range(prompt_len)]}
            for i in range(batch)
        ]
        self.tokens = batch * max_tokens

    def install_control(self) -> None:
        """Probe off, and a busy wait of control_ns in every execute_model call."""
        orig, bench = self.exec_orig, self

        def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
            bench.control_calls += 1
            end = time.perf_counter_ns() + bench.control_ns
            while time.perf_counter_ns() < end:
                pass
            return orig(self, *args, **kwargs)

        self.switch.off()
        setattr(self.exec_owner, "execute_model", execute_model)  # noqa: B010 - on purpose

    def phase(self, arm: str) -> Phase:
        """One generate of the fixed batch in ARM: wall s, CPU s, probe steps counted, the
        speed reference's seconds, each engine step's us, the time around the steps."""
        from servewitness_probe import _vllm

        bind = _vllm._bind_step
        if arm in ("B", "D"):
            self.switch.on()
            if arm == "D":  # the probe on, its request bindings off (what they cost)
                _vllm._bind_step = None
        elif arm == "C":
            self.install_control()
        else:
            self.switch.off()
        steps0, calls0 = self.counters[self.steps_slot], self.control_calls
        gc0, full0 = self.gc.seconds, self.gc.collections[2]
        self.step_ns, self.ref_ns, self.first_step_ns = [], 0, 0
        steal0 = steal_ticks()
        c0, t0 = time.process_time(), time.perf_counter_ns()
        try:
            outs = self.llm.generate(self.prompts, self.params, use_tqdm=False)
            # The finish step: the finishes of this phase's requests reach the worker (and
            # the probe, in B and D) in this arm, not in the next phase's first step.
            self.llm.llm_engine.step()
        finally:
            _vllm._bind_step = bind
        td = time.perf_counter_ns()
        drained = drain()
        t1, c1 = time.perf_counter_ns(), time.process_time()
        steal1 = steal_ticks()
        still_open = open_requests()
        got = sum(len(o.outputs[0].token_ids) for o in outs)
        if got != self.tokens:
            raise SystemExit(f"phase {arm}: {got} tokens, expected {self.tokens}")
        self.switch.off()
        return {
            "arm": arm,
            "wall": (t1 - t0) / 1e9,
            "cpu": c1 - c0,
            "probe_steps": self.counters[self.steps_slot] - steps0,
            "control_calls": self.control_calls - calls0,
            "gc_s": self.gc.seconds - gc0,
            "gc_full": self.gc.collections[2] - full0,
            "ref_s": self.ref_ns / 1e9,
            "pre_s": (self.first_step_ns - t0) / 1e9,
            "post_s": (t1 - self.last_step_ns) / 1e9,
            "steal": steal1 - steal0 if min(steal0, steal1) >= 0 else -1,
            "drain_s": (t1 - td) / 1e9,
            "drained": drained,
            "open": still_open,
            "steps_us": [round(ns / 1000) for ns in self.step_ns],
        }


def calibrate(bench: Bench, control_pct: float, warm: int, arms: list[str]) -> int:
    """Warm every arm up; the scheduler's shape of a baseline phase; the control's busy wait
    per step, CONTROL_PCT of a step's time."""
    bench.control_ns = 0
    for _ in range(warm):
        for arm in [BASE, *arms]:
            bench.phase(arm)
    bench.shapes = []  # one baseline phase's steps, as the scheduler shaped them
    base = [bench.phase(BASE)]
    bench.schedule, bench.shapes = bench.shapes or [], None
    base += [bench.phase(BASE) for _ in range(4)]
    steps = bench.phase("C")["control_calls"]
    wall = min(seconds(p, "wall") for p in base)  # the least disturbed: CONTROL % of a quiet step
    bench.control_ns = int(wall / max(steps, 1) * control_pct / 100 * 1e9)
    return int(steps)


def run_rounds(  # noqa: PLR0917 - the method's knobs, all named by the callers
    bench: Bench,
    rounds: int,
    rng: random.Random,
    budget_s: float = 0.0,
    design: str = "sandwich",
    arms: tuple[str, ...] = ARMS[1:],
    on_round: Callable[[int, Round], None] | None = None,
) -> list[Round]:
    """ROUNDS rounds of every arm in DESIGN, each round's arms in a random order; with
    BUDGET_S, also stop after the round that ends past it (a loaded machine makes phases
    slow). ON_ROUND sees each round as it ends (a run cut short keeps what it saw)."""
    out: list[Round] = []
    end = time.monotonic() + budget_s
    opening: Phase | None = None
    for i in range(rounds):
        rnd: Round
        if design == "rounds":
            order = [BASE, *arms]
            rng.shuffle(order)
            rnd = {arm: bench.phase(arm) for arm in order}
        else:
            order = list(arms)
            rng.shuffle(order)
            seq = [opening if opening is not None else bench.phase(BASE)]
            for arm in order:
                seq += [bench.phase(arm), bench.phase(BASE)]
            opening = seq[-1]
            rnd = {"seq": seq}
        out.append(rnd)
        if on_round is not None:
            on_round(i, rnd)
        if (i + 1) % 20 == 0:
            print(f"  ... {i + 1} rounds", flush=True)
        if budget_s and time.monotonic() > end:
            print(f"  time budget of {budget_s:g} s spent after {i + 1} rounds", flush=True)
            break
    return out


def check_switch(results: list[Round], steps: int) -> bool:
    """The probe counted every step of the B and D phases and none of the others; the
    control ran in C phases only."""
    ok = True
    for r in results:
        for arm, p in each_phase(r):
            want = steps if arm in ("B", "D") else 0
            ok &= p["probe_steps"] == want
            ok &= p["control_calls"] == (steps if arm == "C" else 0)
    return ok


def report_steps(results: list[Round], arms: list[str]) -> None:
    """Where a phase's time goes (phases with the step timer): its engine steps, the time
    before the first (adding the requests) and after the last, the speed reference."""
    if not all(p.get("steps_us") for r in results for _, p in each_phase(r)):
        return  # recorded before the step timer (or a vLLM whose LLM does not step it)
    print("\nengine steps per phase (median over phases): steps, ms per step, the largest")
    print("step, ms outside steps (the bindings drained at the end included), speed reference")
    print("ms per phase, steal ticks per phase (-1: unknown), the most requests left open in the")
    print("probe's table after a phase (0: every phase's finishes reached the probe in it):")
    for a in arms:
        ps = [p for r in results for p in arm_phases(r, a)]
        per = statistics.median(sum(p["steps_us"]) / 1e3 / len(p["steps_us"]) for p in ps)
        out = statistics.median((p["pre_s"] + p["post_s"]) * 1e3 for p in ps)
        big = statistics.median(max(p["steps_us"]) for p in ps) / 1e3
        drain = (
            f"{statistics.median(p['drain_s'] * 1e3 for p in ps):.2f}"
            if all("drain_s" in p for p in ps)
            else "not recorded"
        )
        opened = (
            f"{max(int(p['open']) for p in ps)}" if all("open" in p for p in ps) else "not recorded"
        )
        print(
            f"  {a}  steps {statistics.median(len(p['steps_us']) for p in ps):g}  "
            f"{per:.3f} ms/step  largest {big:.2f} ms  "
            f"outside {out:.2f} ms (drain {drain})  "
            f"reference {statistics.median(p['ref_s'] * 1e3 for p in ps):.2f} ms  "
            f"steal {statistics.median(p['steal'] for p in ps):g}  "
            f"open after the phase, most {opened}"
        )


def report(results: list[Round], tokens: int, control_pct: float, seed: int) -> dict[str, Any]:
    """Per arm, tokens/s by wall clock and per CPU-second; for each estimator, each arm
    against its baselines with its bootstrap interval: A2 (the floor), B (the probe), C (the
    control), D (the probe without bindings)."""
    rng = random.Random(seed)  # noqa: S311 - resampling, not secrets
    found: dict[str, Any] = {}
    # Runs recorded before arm D existed have none: report the arms every round has.
    common = set.intersection(*(set(round_arms(r)) for r in results))
    arms = [a for a in ARMS if a in common]
    ds = [digest(r, arms) for r in results]
    if all("gc_s" in p for r in results for _, p in each_phase(r)):  # recorded before: none
        print("\ngarbage collector per phase (ms, median) and full collections (all phases):")
        for a in arms:
            ps = [p for r in results for p in arm_phases(r, a)]
            ms = statistics.median(p["gc_s"] * 1e3 for p in ps)
            full = sum(int(p["gc_full"]) for p in ps)
            print(f"  {a}  gc {ms:8.3f} ms  full collections {full}")
    report_steps(results, arms)
    estimators = dict(ESTIMATORS)
    if all(d["speed"] is not None for d in ds):
        estimators[SPEED_ESTIMATOR[0]] = SPEED_ESTIMATOR[1]
    for metric, label in METRICS:
        per_arm = {a: [tokens / s for d in ds for s in d["secs"][metric][a]] for a in arms}
        print(f"\n{label}, {len(results)} rounds, per arm:")
        print_rows({a: summary(v) for a, v in per_arm.items()}, fmt="9.1f")
        for name, est in estimators.items():
            aa, pb, cc = (interval(ds, arm, metric, est, rng) for arm in ("A2", "B", "C"))
            floor = (aa[2] - aa[1]) / 2
            seen = cc[2] < 1.0
            mark = " (the verdict's estimator)" if name == VERDICT else ""
            print(f"  estimator: {name}{mark}")
            if est is speed_adjusted:
                beta, r2 = speed_fit(ds, metric)
                print(
                    f"    speed reference: beta {beta:.3f}, "
                    f"explains {r2:.1%} of the ratios' variance"
                )
                found[f"{metric}/speed_fit"] = {"beta": beta, "r2": r2}
            print(
                f"    A/A (off / off) = {aa[0]:.4f}  95 % interval [{aa[1]:.4f}, {aa[2]:.4f}]"
                f"  A/A floor ±{floor * 100:.2f} %"
            )
            print(
                f"    probe / no-probe = {pb[0]:.4f}  95 % interval [{pb[1]:.4f}, {pb[2]:.4f}]"
                f"  ({pb[0] - 1:+.2%})"
            )
            print(
                f"    control (+{control_pct:g} % of a step, busy) / no-probe = {cc[0]:.4f}  "
                f"95 % interval [{cc[1]:.4f}, {cc[2]:.4f}]  ({cc[0] - 1:+.2%}; seen: {seen})"
            )
            found[f"{metric}/{name}"] = {
                "aa": aa, "floor": floor, "probe": pb, "control": cc, "control_seen": seen,
                "resolves_1pct": resolves(floor, seen),
            }  # fmt: skip
            if "D" in arms:
                nb = interval(ds, "D", metric, est, rng)
                print(
                    f"    probe without bindings / no-probe = {nb[0]:.4f}  95 % interval "
                    f"[{nb[1]:.4f}, {nb[2]:.4f}]  ({nb[0] - 1:+.2%})"
                )
                found[f"{metric}/{name}"]["probe_no_bindings"] = nb
            print(
                f"    reading: resolves 1 %: {resolves(floor, seen)} (A/A floor under 1 %: "
                f"{floor < 0.01}; control interval below 1: {seen})"
            )
    verdict: dict[str, Any] | None = found.get(f"wall/{VERDICT}")
    found["verdict"] = {"estimator": VERDICT, "metric": "wall", **(verdict or {})}
    if verdict is None:
        print(
            f"\nverdict: no {VERDICT} (the phases carry no speed reference): "
            "this run resolves nothing by the rule"
        )
    else:
        vp = verdict["probe"]
        print(
            f"\nverdict ({VERDICT}, wall clock): A/A floor ±{verdict['floor'] * 100:.2f} %, "
            f"control seen: {verdict['control_seen']}, resolves 1 %: "
            f"{verdict['resolves_1pct']}; probe / no-probe = {vp[0]:.4f} "
            f"[{vp[1]:.4f}, {vp[2]:.4f}]"
        )
    return found


def commit() -> str:
    import subprocess

    out = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout.strip() or "unknown"


def setup_env(hooks: str = "") -> Path:
    """In-process engine core, the probe on (as a plugin), its files in a scratch dir."""
    scratch = Path(tempfile.mkdtemp(prefix="tokens-ab-", dir=REPO / ".scratch"))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VERIFIER_PROBE_DIR"] = str(scratch / "probe")
    for key in ("VLLM_PLUGINS", "VERIFIER_PROBE_DISABLE", "VERIFIER_HOOKS"):
        os.environ.pop(key, None)
    if hooks:
        os.environ["VERIFIER_HOOKS"] = hooks
    for key in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"):
        os.environ[key] = str(scratch / key.lower())
    return scratch


def measure(  # noqa: PLR0917 - the method's knobs, all named by the callers
    bench: Bench,
    batch: int,
    prompt_len: int,
    max_tokens: int,
    rounds: int,
    warm: int,
    control: float,
    seed: int,
    budget_s: float = 0.0,
    design: str = "sandwich",
    arms: tuple[str, ...] = ARMS[1:],
    on_round: Callable[[int, Round], None] | None = None,
) -> dict[str, Any]:
    """The whole method on one workload of BENCH's engine: warm-up and calibration, ROUNDS
    rounds of every arm in DESIGN in a seeded random order, the switch check, the report."""
    if design not in DESIGNS or BASE in arms or not {"A2", "B", "C"} <= set(arms):
        raise SystemExit(f"design {design!r}, arms {arms}: A2, B and C are needed, A1 is the base")
    bench.workload(batch, prompt_len, max_tokens)
    steps = calibrate(bench, control, warm, list(arms))
    print(
        f"\nphase: {batch} requests x {max_tokens} tokens (prompt {prompt_len}), {steps} steps; "
        f"control busy wait {bench.control_ns} ns per step; design {design}, arms "
        f"{BASE} {' '.join(arms)}; speed reference {bench.ref_turns} turns per step"
    )
    order = random.Random(seed)  # noqa: S311 - an order, not a secret
    results = run_rounds(bench, rounds, order, budget_s, design, arms, on_round)
    ok = check_switch(results, steps)
    print(
        f"switch check: probe steps counted in B and D phases only ({steps} per phase, 0 in "
        f"A1, A2, C), control in C only: {ok}"
    )
    found = report(results, bench.tokens, control, seed)
    return {
        "batch": batch, "prompt_len": prompt_len, "max_tokens": max_tokens, "rounds": rounds,
        "rounds_run": len(results), "steps_per_phase": steps, "control_pct": control,
        "control_ns": bench.control_ns, "design": design, "arms": [BASE, *arms],
        "ref_turns": bench.ref_turns, "schedule": bench.schedule,
        "switch_ok": ok, "stats": found, "phases": results,
    }  # fmt: skip


CPU_LLM = {
    "enforce_eager": True, "dtype": "float32", "max_model_len": 256,
    "kv_cache_memory_bytes": 64 << 20, "enable_prefix_caching": False, "seed": 0,
}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n")[0],
        epilog=(
            f"The verdict's estimator is the {VERDICT} by wall clock (it needs the speed "
            "reference, --ref-turns > 0); the plain paired median and the fastest decile are "
            "printed beside it. An estimator resolves 1 % only where its own A/A floor is "
            "under 1 % and its own control interval lies below 1."
        ),
    )
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warm", type=int, default=2, help="warm-up rounds of every arm")
    parser.add_argument("--control", type=float, default=1.0, help="control: %% of a step")
    parser.add_argument("--hooks", action="store_true", help="declare step and sample hooks")
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--budget-s", type=float, default=0.0, help="stop rounds after this")
    parser.add_argument("--design", choices=DESIGNS, default="sandwich")
    parser.add_argument("--arms", default=" ".join(ARMS[1:]), help="the arms besides A1")
    parser.add_argument(
        "--ref-turns",
        type=int,
        default=2000,
        help="speed reference loop per step (0: none, and no verdict's estimator)",
    )
    parser.add_argument("--save", type=Path, help="append the run (every phase) as a JSON line")
    parser.add_argument(
        "--pool", type=Path, nargs="+", help="no engine: the report of saved runs' rounds pooled"
    )
    _smoke.add_args(parser)
    args = parser.parse_args(argv)
    if args.pool:
        return pool(args.pool, args.seed)
    if args.smoke:
        _smoke.begin(
            "one offline boot of the tiny model, 3 sandwich rounds of 2 requests x 4 tokens, "
            "every arm, the speed reference and the step timer, the switch check on every "
            "phase, the statistics",
            ["a floor or a ratio worth reading (3 short rounds)", "the design 'rounds'"],
        )
        args.batch, args.max_tokens, args.rounds, args.warm = 2, 4, 3, 1
    (REPO / ".scratch").mkdir(exist_ok=True)
    scratch = setup_env(HOOKS if args.hooks else "")
    try:
        t0 = time.monotonic()
        bench = Bench(args.model, {**CPU_LLM, "max_num_seqs": args.batch}, args.ref_turns)
        print(
            f"commit {commit()}; boot {time.monotonic() - t0:.0f} s; "
            f"switched: {bench.switch.labels()}"
        )
        got = measure(
            bench, args.batch, args.prompt_len, args.max_tokens, args.rounds, args.warm,
            args.control, args.seed, args.budget_s, args.design, tuple(args.arms.split()),
        )  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the probe's files, vLLM's caches
    if args.save:
        got["commit"] = commit()
        with args.save.open("a") as f:
            f.write(json.dumps(got, default=str) + "\n")
    return 0 if got["switch_ok"] else 1


def read_text(path: Path) -> str:
    """PATH's text; gunzipped where its name ends in .gz (the evidence kept in git)."""
    if path.suffix == ".gz":
        import gzip

        return gzip.decompress(path.read_bytes()).decode()
    return path.read_text()


def pool(files: list[Path], seed: int) -> int:
    """The report of the rounds of every saved run in FILES together (runs of the same
    workload: each round's ratios are within the round, so rounds of separate boots and of
    either design pool; the arms every round has are reported)."""
    runs = [json.loads(line) for p in files for line in read_text(p).splitlines() if line]
    shapes = {(r["batch"], r["prompt_len"], r["max_tokens"], r["control_pct"]) for r in runs}
    if len(shapes) != 1:
        raise SystemExit(f"runs of different workloads cannot pool: {sorted(shapes)}")
    rounds = [rd for r in runs for rd in r["phases"]]
    commits = sorted({str(r.get("commit")) for r in runs})
    print(f"pooled: {len(runs)} runs, {len(rounds)} rounds, commits {commits}")
    for i, r in enumerate(runs):
        print(
            f"  run {i + 1}: {len(r['phases'])} rounds ({r.get('design', 'rounds')}), "
            f"{r['steps_per_phase']} steps per phase, "
            f"control busy wait {r['control_ns']} ns per step"
        )
    print(f"switch check of every run: {all(r['switch_ok'] for r in runs)}")
    r0 = runs[0]
    report(rounds, r0["batch"] * r0["max_tokens"], r0["control_pct"], seed)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # the in-process engine's threads would hold the exit
