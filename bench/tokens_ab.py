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
* ROUNDS rounds (or as many as --budget-s allows), each running the five arms once in a
  seeded random order. Two estimators, fixed in advance, of each arm's tokens/s against A1's,
  each with a bootstrap 95 % interval (rounds resampled whole, so a round's arms stay
  paired): the median of per-round ratios, and the ratio of the arms' fastest-decile phases
  (other processes only ever slow a phase down). The noise floor is the A2/A1 interval's
  half-width (the same method run with no difference at all). Both wall-clock tokens/s and
  tokens per CPU-second of this process (all threads) are reported. Runs saved with --save
  pool with --pool (every ratio is within a round, so rounds of separate boots pool; the
  control's size is calibrated per boot, so a pooled control row mixes sizes).
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
BOOTSTRAP = 2000
FAST_Q = 0.1  # the 0.1 quantile of phase times: the fastest decile of phases


def quantile(xs: list[float], q: float) -> float:
    """The Q-quantile of XS (linear interpolation between order statistics)."""
    ys = sorted(xs)
    pos = q * (len(ys) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)


Estimator = Callable[[list[dict[str, dict[str, float]]], str, str], float]


def paired_median(rounds: list[dict[str, dict[str, float]]], arm: str, metric: str) -> float:
    """Median over rounds of (ARM's tokens/s / A1's tokens/s in the same round)."""
    return statistics.median(r["A1"][metric] / r[arm][metric] for r in rounds)


def fastest_decile(rounds: list[dict[str, dict[str, float]]], arm: str, metric: str) -> float:
    """ARM's tokens/s at its fastest decile of phases over A1's: the other processes on the
    machine only ever slow a phase down, so the fast tail is the least disturbed estimate."""
    return quantile([r["A1"][metric] for r in rounds], FAST_Q) / quantile(
        [r[arm][metric] for r in rounds], FAST_Q
    )


ESTIMATORS: dict[str, Estimator] = {
    "paired median of per-round ratios": paired_median,
    "fastest decile of each arm's phases": fastest_decile,
}


def interval(
    rounds: list[dict[str, dict[str, float]]],
    arm: str,
    metric: str,
    est: Estimator,
    rng: random.Random,
) -> tuple[float, float, float]:
    """EST on ROUNDS, and its bootstrap 95 % percentile interval (rounds resampled whole, so
    the arms of a round stay paired)."""
    boot = sorted(est(rng.choices(rounds, k=len(rounds)), arm, metric) for _ in range(BOOTSTRAP))
    return est(rounds, arm, metric), boot[int(0.025 * BOOTSTRAP)], boot[int(0.975 * BOOTSTRAP) - 1]


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
    """The offline engine, its probe switch, and the phases."""

    def __init__(self, model: Path, llm_kwargs: dict[str, Any]) -> None:
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

    def phase(self, arm: str) -> dict[str, float]:
        """One generate of the fixed batch in ARM: wall s, CPU s, probe steps counted."""
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
        c0, t0 = time.process_time(), time.perf_counter()
        try:
            outs = self.llm.generate(self.prompts, self.params, use_tqdm=False)
        finally:
            _vllm._bind_step = bind
        t1, c1 = time.perf_counter(), time.process_time()
        got = sum(len(o.outputs[0].token_ids) for o in outs)
        if got != self.tokens:
            raise SystemExit(f"phase {arm}: {got} tokens, expected {self.tokens}")
        self.switch.off()
        return {
            "wall": t1 - t0,
            "cpu": c1 - c0,
            "probe_steps": self.counters[self.steps_slot] - steps0,
            "control_calls": self.control_calls - calls0,
            "gc_s": self.gc.seconds - gc0,
            "gc_full": self.gc.collections[2] - full0,
        }


def calibrate(bench: Bench, control_pct: float, warm: int) -> int:
    """Warm every arm up; the control's busy wait per step, CONTROL_PCT of a step's time."""
    bench.control_ns = 0
    for _ in range(warm):
        for arm in ARMS:
            bench.phase(arm)
    base = [bench.phase("A1") for _ in range(5)]
    steps = bench.phase("C")["control_calls"]
    wall = min(p["wall"] for p in base)  # the least disturbed: CONTROL % of a quiet step
    bench.control_ns = int(wall / max(steps, 1) * control_pct / 100 * 1e9)
    return int(steps)


def run_rounds(
    bench: Bench, rounds: int, rng: random.Random, budget_s: float = 0.0
) -> list[dict[str, dict[str, float]]]:
    """ROUNDS rounds of every arm, each round in a random order; with BUDGET_S, also stop
    after the round that ends past it (a loaded machine makes phases slow)."""
    out = []
    end = time.monotonic() + budget_s
    for i in range(rounds):
        order = list(ARMS)
        rng.shuffle(order)
        out.append({arm: bench.phase(arm) for arm in order})
        if (i + 1) % 20 == 0:
            print(f"  ... {i + 1} rounds", flush=True)
        if budget_s and time.monotonic() > end:
            print(f"  time budget of {budget_s:g} s spent after {i + 1} rounds", flush=True)
            break
    return out


def check_switch(results: list[dict[str, dict[str, float]]], steps: int) -> bool:
    """The probe counted every step of the B phases and none of the others."""
    ok = True
    for r in results:
        for arm, p in r.items():
            want = steps if arm in ("B", "D") else 0
            ok &= p["probe_steps"] == want
            ok &= p["control_calls"] == (steps if arm == "C" else 0)
    return ok


def report(
    results: list[dict[str, dict[str, float]]], tokens: int, control_pct: float, seed: int
) -> dict[str, Any]:
    """Per arm, tokens/s by wall clock and per CPU-second; for each estimator, each arm
    against A1 with its bootstrap interval: A2 (the floor), B (the probe), C (the control)."""
    rng = random.Random(seed)  # noqa: S311 - resampling, not secrets
    found: dict[str, Any] = {}
    if all("gc_s" in p for r in results for p in r.values()):  # recorded before: none
        print("\ngarbage collector per phase (ms, median) and full collections (all phases):")
        for a in [a for a in ARMS if all(a in r for r in results)]:
            ms = statistics.median(r[a]["gc_s"] * 1e3 for r in results)
            full = sum(int(r[a]["gc_full"]) for r in results)
            print(f"  {a}  gc {ms:8.3f} ms  full collections {full}")
    for metric, label in (("wall", "tokens/s (wall clock)"), ("cpu", "tokens per CPU-second")):
        # Runs recorded before arm D existed have none: report the arms every round has.
        arms = [a for a in ARMS if all(a in r for r in results)]
        per_arm = {a: [tokens / r[a][metric] for r in results] for a in arms}
        print(f"\n{label}, {len(results)} rounds, per arm:")
        print_rows({a: summary(v) for a, v in per_arm.items()}, fmt="9.1f")
        for name, est in ESTIMATORS.items():
            aa, pb, cc = (interval(results, arm, metric, est, rng) for arm in ("A2", "B", "C"))
            floor = (aa[2] - aa[1]) / 2
            seen = cc[2] < 1.0
            print(f"  estimator: {name}")
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
            }  # fmt: skip
            if "D" in arms:
                nb = interval(results, "D", metric, est, rng)
                print(
                    f"    probe without bindings / no-probe = {nb[0]:.4f}  95 % interval "
                    f"[{nb[1]:.4f}, {nb[2]:.4f}]  ({nb[0] - 1:+.2%})"
                )
                found[f"{metric}/{name}"]["probe_no_bindings"] = nb
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
) -> dict[str, Any]:
    """The whole method on one workload of BENCH's engine: warm-up and calibration, ROUNDS
    rounds of every arm in a seeded random order, the switch check, the report."""
    bench.workload(batch, prompt_len, max_tokens)
    steps = calibrate(bench, control, warm)
    print(
        f"\nphase: {batch} requests x {max_tokens} tokens (prompt {prompt_len}), {steps} steps; "
        f"control busy wait {bench.control_ns} ns per step"
    )
    results = run_rounds(bench, rounds, random.Random(seed), budget_s)  # noqa: S311 - an order
    ok = check_switch(results, steps)
    print(
        f"switch check: probe steps counted in B and D phases only ({steps} per phase, 0 in "
        f"A1, A2, C), control in C only: {ok}"
    )
    found = report(results, bench.tokens, control, seed)
    return {
        "batch": batch, "prompt_len": prompt_len, "max_tokens": max_tokens, "rounds": rounds,
        "rounds_run": len(results), "steps_per_phase": steps, "control_pct": control,
        "control_ns": bench.control_ns,
        "switch_ok": ok, "stats": found, "phases": results,
    }  # fmt: skip


CPU_LLM = {
    "enforce_eager": True, "dtype": "float32", "max_model_len": 256,
    "kv_cache_memory_bytes": 64 << 20, "enable_prefix_caching": False, "seed": 0,
}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
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
            "one offline boot of the tiny model, 3 rounds of 2 requests x 4 tokens, every arm, "
            "the switch check on every phase, the statistics",
            ["a floor or a ratio worth reading (3 short rounds)"],
        )
        args.batch, args.max_tokens, args.rounds, args.warm = 2, 4, 3, 1
    (REPO / ".scratch").mkdir(exist_ok=True)
    scratch = setup_env(HOOKS if args.hooks else "")
    try:
        t0 = time.monotonic()
        bench = Bench(args.model, {**CPU_LLM, "max_num_seqs": args.batch})
        print(
            f"commit {commit()}; boot {time.monotonic() - t0:.0f} s; "
            f"switched: {bench.switch.labels()}"
        )
        got = measure(
            bench, args.batch, args.prompt_len, args.max_tokens, args.rounds, args.warm,
            args.control, args.seed, args.budget_s,
        )  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the probe's files, vLLM's caches
    if args.save:
        got["commit"] = commit()
        with args.save.open("a") as f:
            f.write(json.dumps(got, default=str) + "\n")
    return 0 if got["switch_ok"] else 1


def pool(files: list[Path], seed: int) -> int:
    """The report of the rounds of every saved run in FILES together (runs of the same
    workload: each round's ratios are within the round, so rounds of separate boots pool)."""
    runs = [json.loads(line) for p in files for line in p.read_text().splitlines() if line]
    shapes = {(r["batch"], r["prompt_len"], r["max_tokens"], r["control_pct"]) for r in runs}
    if len(shapes) != 1:
        raise SystemExit(f"runs of different workloads cannot pool: {sorted(shapes)}")
    rounds = [rd for r in runs for rd in r["phases"]]
    commits = sorted({str(r.get("commit")) for r in runs})
    print(f"pooled: {len(runs)} runs, {len(rounds)} rounds, commits {commits}")
    for i, r in enumerate(runs):
        print(
            f"  run {i + 1}: {len(r['phases'])} rounds, {r['steps_per_phase']} steps per phase, "
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
