"""Tokens/s of the tiny vLLM server with and without the probe, interleaved boots.

Arms:
  probe     the plugin loads (default) with one declared hook on the live runner's step
  no-probe  VLLM_PLUGINS=none: vLLM loads no general plugin at all, so no probe code runs

Boots alternate (probe, no-probe, probe, ...), BOOTS per arm. In each boot, after a warm-up,
WINDOWS windows of CONCURRENCY parallel clients sending greedy completions of MAX_TOKENS
tokens for WINDOW_S seconds each. Every boot's result is its median window; the noise floor
is the spread of boot results within an arm. Each arm's evidence is checked: the probe arm
must show steps and hook fires in the worker, the no-probe arm must show no probe.

--speculative: both arms run ngram speculative decoding (SPEC_CONFIG, prefix caching off, as
tests/test_spec_live.py serves it) on repetitive prompts the ngram drafter finds matches in.
Each boot must also show that it speculated: the probe arm's worker evidence says speculation
on with drafts, and vLLM's /metrics counts drafts in both arms. The acceptance rate (accepted
/ drafted tokens, from /metrics over the measured windows) is reported per boot.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
from _stats import print_rows, summary

from servewitness.testing.vllm_server import VllmServer

REPO = Path(__file__).resolve().parents[1]
V1_STEP = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model"
MAX_TOKENS = 128
CONCURRENCY = 4
# --speculative: the configuration and prompts of tests/test_spec_live.py (repetitive text, so
# the ngram drafter finds matches and greedy decoding accepts some of its drafts)
SPEC_CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}
SPEC_ARGS = ("--no-enable-prefix-caching", "--speculative-config", json.dumps(SPEC_CONFIG))
SPEC_PROMPTS = (
    "one two three one two three one two three one two",
    "the cat sat on the mat, the cat sat on the mat, the cat",
    "a b c d a b c d a b c d a b",
    "red green blue red green blue red green",
)


Server = VllmServer | _smoke.Attached


def window(server: Server, seconds: float, speculative: bool = False) -> float:
    """Completion tokens per second over one window of CONCURRENCY clients."""
    tokens = [0] * CONCURRENCY
    stop = time.monotonic() + seconds

    def prompt(i: int, n: int) -> str:
        if speculative:
            return SPEC_PROMPTS[(i + n) % len(SPEC_PROMPTS)]
        return f"client {i} request {n} the engine"

    def client(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            out = server.complete(prompt(i, n), max_tokens=MAX_TOKENS)
            tokens[i] += int(out["usage"]["completion_tokens"])
            n += 1

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(tokens) / (time.monotonic() - t0)


def worker_evidence(server: Server) -> dict[str, Any]:
    procs = _smoke.inspect_tree(server.pid)["processes"]  # verifier inspect --tree --json
    probed = [p for p in procs if p["probe"]["present"]]
    worker = next((p for p in probed if p["role"] == "worker"), None)
    return {"probed_processes": len(probed), "worker": worker}


_SAMPLE = re.compile(r"^(?P<name>vllm:spec_decode_\w+_total)(?:\{[^}]*\})? (?P<v>\S+)")


def spec_counters(server: Server) -> dict[str, int]:
    """vLLM's own speculative-decoding counters from /metrics (summed over labels; the
    per-position counter is left out): drafts, draft tokens, accepted tokens."""
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=10) as r:  # noqa: S310
        text = r.read().decode()
    out = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
    names = {
        "vllm:spec_decode_num_drafts_total": "drafts",
        "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens",
    }
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is not None and m.group("name") in names:
            out[names[m.group("name")]] += int(float(m.group("v")))
    return out


def settled_spec_counters(server: Server, timeout_s: float = 10.0) -> dict[str, int]:
    """The counters once two reads 0.5 s apart agree (/metrics may lag the last output)."""
    prev = spec_counters(server)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        cur = spec_counters(server)
        if cur == prev:
            break
        prev = cur
    return prev


def boot(
    arm: str, model: Path, windows: int, window_s: float, speculative: bool = False
) -> dict[str, Any]:
    env = {"VERIFIER_HOOKS": f"v1_step={V1_STEP}"} if arm == "probe" else {"VLLM_PLUGINS": "none"}
    extra = SPEC_ARGS if speculative else ()
    with VllmServer(model, env=env, extra_args=extra, scratch_parent=REPO / ".scratch") as server:
        return measure(server, arm, windows, window_s, speculative)


def measure(  # noqa: PLR0917
    server: Server,
    arm: str,
    windows: int,
    window_s: float,
    speculative: bool = False,
    warm_s: float = 3.0,
    check_arm: bool = True,
) -> dict[str, Any]:
    """One boot's result: WINDOWS windows after a warm-up, and the arm's evidence checked
    (CHECK_ARM false: not checked, for smoke mode's stand-in no-probe rows)."""
    spec: dict[str, Any] = {}
    window(server, warm_s, speculative)  # warm-up
    before = settled_spec_counters(server) if speculative else {}
    rates = [window(server, window_s, speculative) for _ in range(windows)]
    if speculative:
        after = settled_spec_counters(server)
        spec = {k: after[k] - before[k] for k in after}
        spec["total_drafts"] = after["drafts"]
    if arm != "probe" and not check_arm:
        return {
            "arm": arm,
            "tokens_per_s": statistics.median(rates),
            "windows": rates,
            "spec": spec,
        }
    ev = worker_evidence(server)
    if arm == "probe":
        w = ev["worker"]
        assert w is not None and w["steps"]["productive"] > 0, "probe arm: no steps recorded"
        fired = next(h for h in w["hooks"] if h["name"] == "v1_step")["fired_on_productive_steps"]
        assert fired == w["steps"]["productive"], "probe arm: hook did not fire on every step"
        if speculative:
            sp = w["steps"]["speculation"]
            assert sp is not None and sp["on"] is True, f"probe arm: speculation not on: {sp}"
            assert sp["drafts"] > 0, f"probe arm: the probe counted no drafts: {sp}"
            spec["probe_drafts"] = sp["drafts"]
    elif check_arm:
        assert ev["probed_processes"] == 0, "no-probe arm: a probe was loaded"
    if speculative:
        assert spec["drafts"] > 0, f"{arm} arm: vLLM counted no drafts in the windows: {spec}"
        spec["acceptance_rate"] = spec["accepted_tokens"] / spec["draft_tokens"]
        spec["mean_acceptance_length"] = 1 + spec["accepted_tokens"] / spec["drafts"]
    return {"arm": arm, "tokens_per_s": statistics.median(rates), "windows": rates, "spec": spec}


def print_boot(r: dict[str, Any], n: int) -> None:
    sp = r["spec"]
    acc = (
        f" acceptance {sp['acceptance_rate']:.1%} (mean length "
        f"{sp['mean_acceptance_length']:.2f}, {sp['drafts']} drafts)"
        if sp
        else ""
    )
    print(
        f"  boot {n}: {r['arm']:<8} {r['tokens_per_s']:7.1f} tok/s "
        f"windows {[round(x, 1) for x in r['windows']]}{acc}",
        flush=True,
    )


def smoke(url: str, pid: int) -> list[dict[str, Any]]:
    """Smoke mode: two measurements per arm of the one running server (probed), short
    windows of short requests; returns them as main's boots."""
    global MAX_TOKENS  # noqa: PLW0603 - window() reads it; smoke mode only
    _smoke.begin(
        "the windows, the probe arm's evidence checks, the statistics (ratio, noise floor) "
        "over 2 short measurements per arm of one running server",
        [
            "booting and interleaved boots (a running server is given)",
            "the no-probe arm (VLLM_PLUGINS=none, and its check that no probe loaded): its "
            "rows are the same probed server measured again, so the ratio is no overhead figure",
            "--speculative's draft checks (the given server does not speculate)",
            "verifier inspect's file judgement (its JSON is read in-process without it)",
        ],
    )
    MAX_TOKENS = 16
    server = _smoke.Attached(url, pid)
    print(f"vLLM's speculative-decoding counters (/metrics): {spec_counters(server)}")
    results: list[dict[str, Any]] = []
    for _ in range(2):  # the fewest with a spread: the noise floor
        for arm in ("probe", "no-probe"):
            r = measure(server, arm, 1, 0.5, warm_s=0.2, check_arm=False)
            results.append(r)
            print_boot(r, len(results))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--boots", type=int, default=3, help="boots per arm")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--model", type=Path, default=REPO / ".cache" / "tiny-llama")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument(
        "--speculative",
        action="store_true",
        help="both arms with ngram speculative decoding (k = 3) on repetitive prompts",
    )
    _smoke.add_args(ap, live=True)
    args = ap.parse_args()
    _smoke.check(ap, args, live=True)
    if args.smoke and args.speculative:
        ap.error("--smoke --speculative: the given server does not speculate (see --smoke)")
    results: list[dict[str, Any]] = []
    if args.smoke:
        results = smoke(args.url, args.pid)
        args.boots = 2
    for i in range(0 if args.smoke else args.boots):
        for arm in ("probe", "no-probe") if i % 2 == 0 else ("no-probe", "probe"):
            r = boot(arm, args.model, args.windows, args.window_s, args.speculative)
            print_boot(r, len(results) + 1)
            results.append(r)
    by_arm = {
        a: summary([r["tokens_per_s"] for r in results if r["arm"] == a])
        for a in ("probe", "no-probe")
    }
    mode = f", ngram speculation {json.dumps(SPEC_CONFIG)}" if args.speculative else ""
    print(
        f"tokens/s, {args.boots} boots per arm (interleaved), {CONCURRENCY} clients, "
        f"{MAX_TOKENS} tokens per request{mode}"
    )
    print_rows(by_arm)
    ratio = by_arm["probe"]["median"] / by_arm["no-probe"]["median"]
    floor = max(by_arm["probe"]["spread"], by_arm["no-probe"]["spread"])
    print(f"  probe / no-probe = {ratio:.3f}  (noise floor: boot-to-boot spread up to {floor:.1%})")
    if args.speculative:
        print("draft acceptance rate (vLLM's /metrics, measured windows), per boot")
        for a in ("probe", "no-probe"):
            rates = [r["spec"]["acceptance_rate"] for r in results if r["arm"] == a]
            print(
                f"  {a:<8}  median {statistics.median(rates):.1%}  "
                f"boots {', '.join(f'{x:.1%}' for x in rates)}"
            )
    if args.json:
        args.json.write_text(
            json.dumps({"boots": results, "summary": by_arm, "ratio": ratio}, indent=2)
        )


if __name__ == "__main__":
    main()
