"""Tokens/s with the probe's per-step path on and off inside ONE offline vLLM boot, on the
lent H200 (issue 21, target 3), run there by the GPU kit:

    bash .gpu/call2/serve.sh python3 bench/gpu/tokens_ab_gpu.py LABEL [BATCH ...]

The method is bench/tokens_ab.py's (imported from the checkout: stdlib, vLLM and the
project's wheel, whose probe loads as the vLLM plugin): one ``vllm.LLM`` in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), phases of one ``generate`` of the same fixed batch,
arms A1, A2 (probe off), B (probe on), C (off + a busy wait of CONTROL % of a step), D (probe
on, bindings off), ROUNDS rounds in seeded random orders (by default the "sandwich" design: A1
between every two other phases, each phase against the two beside it), the A2 interval as
the floor, the switch checked on every phase; the speed reference and the step timer in every
phase. Here one boot measures every BATCH in turn (default 8 64 256). Results are printed and
appended, one JSON line per batch with every phase, to $OUT/tokens_ab.jsonl; every round, as
it ends, to $OUT/rounds.jsonl (what a run cut short by its time limit keeps).

Environment: ENFORCE_EAGER (default 0: torch.compile and CUDA graphs, vLLM's default),
ROUNDS (40), PROMPT_LEN (32), MAX_TOKENS (64), CONTROL (1.0), WARM (2), HOOKS=1 (declare
step and sample hooks on both runners' methods: their wrappers switch too), MODEL (the kit's
model), GPU_MEM (0.2), BUDGET_S (per batch: stop rounds once spent; 0: none), DEADLINE
(unix seconds; 0: none; each batch's rounds then stop RESERVE_S, default 60, before it,
whatever BUDGET_S says, so a slow boot costs rounds, not the report), MAX_BATCHED_TOKENS (0:
vLLM's default; e.g. 512 with PROMPT_LEN 128 at batch 256 makes the first ~64 steps of every
phase chunked prefills mixed with decodes: the mixed load), DESIGN
(sandwich; or rounds, the method up to session 9), ARMS (the arms besides A1: "A2 B C D";
A2, B and C are required), REF_TURNS (the speed reference's turns per engine step: 2000; 0:
none).

(Named ``tokens_ab_gpu`` rather than ``tokens_ab``: mypy checks bench/ as one namespace, where
two modules may not share a name.)

``--smoke`` (CI, on the CPU): no engine; the report of the recorded H200 lines (RECORDED)
through the same statistics code, and the engine arguments the device run would use.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))
import tokens_ab as ab  # noqa: E402 - bench/tokens_ab.py, found through the path above

SMOKE = sys.argv[1:2] == ["--smoke"]
RECORDED = BENCH.parent / "docs" / "gpu-evidence" / "tokens-ab" / "tokens_ab.jsonl"
HOOKS = (
    "v2_step=vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model,"
    "v2_sample=vllm.v1.worker.gpu.model_runner:GPUModelRunner.sample_tokens,"
    "v1_step=vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model,"
    "v1_sample=vllm.v1.worker.gpu_model_runner:GPUModelRunner.sample_tokens"
)


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


def llm_kwargs(max_batch: int) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "enforce_eager": os.environ.get("ENFORCE_EAGER", "0") == "1",
        "max_model_len": 256,
        "gpu_memory_utilization": float(os.environ.get("GPU_MEM", "0.2")),
        "enable_prefix_caching": False,
        "max_num_seqs": max_batch,
        "seed": 0,
    }
    chunk = env_int("MAX_BATCHED_TOKENS", 0)
    if chunk:  # mixed load: each phase's prompts prefill in chunks beside running decodes
        kwargs["max_num_batched_tokens"] = chunk
    return kwargs


def smoke() -> int:
    import _smoke

    _smoke.begin(
        f"the report of the recorded H200 lines ({RECORDED.relative_to(_smoke.REPO)}) through "
        "bench/tokens_ab.py's statistics, and the engine arguments of a device run",
        ["the engine on the GPU (bench/tokens_ab.py's smoke runs the same phases on the CPU)"],
    )
    print(f"engine arguments: {json.dumps(llm_kwargs(256), sort_keys=True)}")
    for line in RECORDED.read_text().splitlines():
        rec = json.loads(line)
        print(f"\n{rec['label']}: batch {rec['batch']}, {rec['steps_per_phase']} steps per phase")
        ab.report(rec["phases"], rec["batch"] * rec["max_tokens"], rec["control_pct"], 21)
    return 0


def main() -> int:
    label = sys.argv[1] if len(sys.argv) > 1 else "run"
    batches = [int(b) for b in sys.argv[2:]] or [8, 64, 256]
    out = Path(os.environ.get("OUT", "/tmp/gpu-out"))  # noqa: S108 - $OUT on the device
    out.mkdir(parents=True, exist_ok=True)
    model = Path(os.environ.get("MODEL", ".gpu/call2/model")).resolve()
    (ab.REPO / ".scratch").mkdir(exist_ok=True)
    ab.setup_env(HOOKS if os.environ.get("HOOKS") == "1" else "")  # a throwaway machine
    kwargs = llm_kwargs(max(batches))
    t0 = time.monotonic()
    bench = ab.Bench(model, kwargs, env_int("REF_TURNS", 2000))
    boot_s = time.monotonic() - t0
    print(f"{label}: boot {boot_s:.0f} s, {kwargs}; switched: {bench.switch.labels()}")
    runner = type(bench.worker.model_runner)
    ok = True
    for i, batch in enumerate(batches):

        def keep(n: int, rnd: ab.Round, batch: int = batch) -> None:
            with (out / "rounds.jsonl").open("a") as f:
                f.write(json.dumps({"label": label, "batch": batch, "round": n, **rnd}) + "\n")

        budget = float(os.environ.get("BUDGET_S", "0"))
        deadline = float(os.environ.get("DEADLINE", "0"))
        if deadline:  # rounds end RESERVE_S before it (calibration, the last round, the report)
            left = deadline - time.time() - float(os.environ.get("RESERVE_S", "60"))
            budget = max(min(budget, left) if budget else left, 1.0)
            print(f"{label}: batch {batch}: {budget:.0f} s of rounds (BUDGET_S, DEADLINE)")
        got = ab.measure(
            bench, batch, env_int("PROMPT_LEN", 32), env_int("MAX_TOKENS", 64),
            env_int("ROUNDS", 40), env_int("WARM", 2),
            float(os.environ.get("CONTROL", "1.0")), 21 + i,
            budget, os.environ.get("DESIGN", "sandwich"),
            tuple(os.environ.get("ARMS", "A2 B C D").split()), keep,
        )  # fmt: skip
        ok &= bool(got["switch_ok"])
        rec = {
            "label": label, "boot_s": boot_s, "llm": kwargs, "switched": bench.switch.labels(),
            "runner": f"{runner.__module__}.{runner.__qualname__}",
            "hooks": os.environ.get("VERIFIER_HOOKS", ""), **got,
        }  # fmt: skip
        with (out / "tokens_ab.jsonl").open("a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
        sys.stdout.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    code = smoke() if SMOKE else main()
    sys.stdout.flush()
    os._exit(code)  # the in-process engine's threads would hold the exit
