"""Tokens/s of the tiny vLLM server with and without the probe, interleaved boots.

Arms:
  probe     the plugin loads (default) with one declared hook on the live runner's step
  no-probe  VLLM_PLUGINS=none: vLLM loads no general plugin at all, so no probe code runs

Boots alternate (probe, no-probe, probe, ...), BOOTS per arm. In each boot, after a warm-up,
WINDOWS windows of CONCURRENCY parallel clients sending greedy completions of MAX_TOKENS
tokens for WINDOW_S seconds each. Every boot's result is its median window; the noise floor
is the spread of boot results within an arm. Each arm's evidence is checked: the probe arm
must show steps and hook fires in the worker, the no-probe arm must show no probe.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import print_rows, summary

from verifier.testing.server import VllmServer

REPO = Path(__file__).resolve().parents[1]
V1_STEP = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model"
MAX_TOKENS = 128
CONCURRENCY = 4


def window(server: VllmServer, seconds: float) -> float:
    """Completion tokens per second over one window of CONCURRENCY clients."""
    tokens = [0] * CONCURRENCY
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            out = server.complete(f"client {i} request {n} the engine", max_tokens=MAX_TOKENS)
            tokens[i] += int(out["usage"]["completion_tokens"])
            n += 1

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(tokens) / (time.monotonic() - t0)


def worker_evidence(server: VllmServer) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "verifier", "inspect", "--pid", str(server.pid), "--tree", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    procs = json.loads(out.stdout)["processes"]
    probed = [p for p in procs if p["probe"]["present"]]
    worker = next((p for p in probed if p["role"] == "worker"), None)
    return {"probed_processes": len(probed), "worker": worker}


def boot(arm: str, model: Path, windows: int, window_s: float) -> dict[str, Any]:
    env = {"VERIFIER_HOOKS": f"v1_step={V1_STEP}"} if arm == "probe" else {"VLLM_PLUGINS": "none"}
    with VllmServer(model, env=env, scratch_parent=REPO / ".scratch") as server:
        window(server, 3.0)  # warm-up
        rates = [window(server, window_s) for _ in range(windows)]
        ev = worker_evidence(server)
    if arm == "probe":
        w = ev["worker"]
        assert w is not None and w["steps"]["productive"] > 0, "probe arm: no steps recorded"
        fired = next(h for h in w["hooks"] if h["name"] == "v1_step")["fired_on_productive_steps"]
        assert fired == w["steps"]["productive"], "probe arm: hook did not fire on every step"
    else:
        assert ev["probed_processes"] == 0, "no-probe arm: a probe was loaded"
    return {"arm": arm, "tokens_per_s": statistics.median(rates), "windows": rates}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--boots", type=int, default=3, help="boots per arm")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--model", type=Path, default=REPO / ".cache" / "tiny-llama")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    results: list[dict[str, Any]] = []
    for i in range(args.boots):
        for arm in ("probe", "no-probe") if i % 2 == 0 else ("no-probe", "probe"):
            r = boot(arm, args.model, args.windows, args.window_s)
            print(
                f"  boot {len(results) + 1}: {arm:<8} {r['tokens_per_s']:7.1f} tok/s "
                f"windows {[round(x, 1) for x in r['windows']]}",
                flush=True,
            )
            results.append(r)
    by_arm = {
        a: summary([r["tokens_per_s"] for r in results if r["arm"] == a])
        for a in ("probe", "no-probe")
    }
    print(
        f"tokens/s, {args.boots} boots per arm (interleaved), {CONCURRENCY} clients, "
        f"{MAX_TOKENS} tokens per request"
    )
    print_rows(by_arm)
    ratio = by_arm["probe"]["median"] / by_arm["no-probe"]["median"]
    floor = max(by_arm["probe"]["spread"], by_arm["no-probe"]["spread"])
    print(f"  probe / no-probe = {ratio:.3f}  (noise floor: boot-to-boot spread up to {floor:.1%})")
    if args.json:
        args.json.write_text(
            json.dumps({"boots": results, "summary": by_arm, "ratio": ratio}, indent=2)
        )


if __name__ == "__main__":
    main()
