"""A plain load generator for an OpenAI-compatible server (stdlib only): N completion
requests, C at a time, then one JSON file of what it measured. The second harness of this
example: anything that writes a results file can run under `verifier exec`.

    python3 load.py --url http://vllm:8000 --model /models/tiny-llama --requests 20 \
        --concurrency 4 --max-tokens 16 --out /results/load.json

Exit code 0 when every request succeeded, 1 otherwise (the results file is written either
way, with the errors in it)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


def one(url: str, model: str, i: int, max_tokens: int, timeout: float) -> dict[str, Any]:
    body = {"model": model, "prompt": f"load request {i}", "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True}  # fmt: skip
    req = urllib.request.Request(  # noqa: S310 - the URL is the operator's
        url.rstrip("/") + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Request-Id": f"load-{i}"},
    )
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310
            answer = json.load(r)
    except (OSError, ValueError) as e:
        return {"request": i, "error": f"{type(e).__name__}: {e}"}
    return {
        "request": i,
        "latency_s": time.perf_counter() - t0,
        "completion_tokens": int(answer.get("usage", {}).get("completion_tokens", 0)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the server, e.g. http://vllm:8000")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--requests", type=int, default=20, help="how many requests (default 20)")
    p.add_argument("--concurrency", type=int, default=4, help="at a time (default 4)")
    p.add_argument("--max-tokens", type=int, default=16, help="per request (default 16)")
    p.add_argument("--timeout", type=float, default=120.0, help="per request, s (default 120)")
    p.add_argument("--out", required=True, type=Path, help="the results file (JSON)")
    a = p.parse_args(argv)
    if a.requests < 1 or a.concurrency < 1 or a.max_tokens < 1:
        p.error("--requests, --concurrency and --max-tokens must be at least 1")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.concurrency) as pool:
        done = list(
            pool.map(lambda i: one(a.url, a.model, i, a.max_tokens, a.timeout), range(a.requests))
        )
    wall = time.perf_counter() - t0
    ok = [r for r in done if "error" not in r]
    latencies = sorted(r["latency_s"] for r in ok)
    tokens = sum(r["completion_tokens"] for r in ok)
    results = {
        "harness": "examples/vllm-bench/load.py",
        "url": a.url,
        "model": a.model,
        "requests": a.requests,
        "concurrency": a.concurrency,
        "completed": len(ok),
        "errors": [r for r in done if "error" in r],
        "duration_s": wall,
        "output_tokens": tokens,
        "output_throughput_tok_s": tokens / wall if wall > 0 else 0.0,
        "latency_median_s": statistics.median(latencies) if latencies else None,
        "latency_max_s": latencies[-1] if latencies else None,
    }
    a.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"load: {len(ok)}/{a.requests} requests, {tokens} output tokens in {wall:.2f} s")
    return 0 if len(ok) == a.requests else 1


if __name__ == "__main__":
    sys.exit(main())
