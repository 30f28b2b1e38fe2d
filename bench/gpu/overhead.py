"""One boot of the GPU overhead benchmark (issue 9), run ON the lent H200 by the GPU kit:

    PROBE=1 VERIFIER_HOOKS=... bash .gpu/call2/serve.sh --serve 8000 python3 bench/gpu/overhead.py P1
    VLLM_PLUGINS=none          bash .gpu/call2/serve.sh --serve 8001 python3 bench/gpu/overhead.py N1

serve.sh has started vLLM 0.26.0 with this project's wheel installed beside it. With PROBE=1
the probe is loaded (a vLLM plugin) with the declared hooks, and a verifier and an agent run
next to it as in a deployment (Unix socket, reports every 0.5 s). Without it, ``VLLM_PLUGINS=none``
keeps vLLM from loading any plugin, so the probe never runs. Arms are separate boots,
interleaved by the caller (P N P N ...), so that boot-to-boot noise is measured, not assumed.

Per boot: a warm-up load (WARM_SECONDS, not measured), then vLLM's own Prometheus counters
(``/metrics``) read before and after a measured load of LOAD_SECONDS from the kit's client
(16 concurrent completions of 32 tokens). Printed and appended to $OUT/overhead.jsonl: tokens/s
(completion tokens over the client's wall time), and from vLLM's histograms over the same
window the mean inter-token latency (one decode step per token of a running request: the
per-step latency a user sees) and the mean request latency. Stdlib only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# --smoke --url URL --pid PID (CI, on the CPU): see smoke()
SMOKE = sys.argv[1:2] == ["--smoke"]
LABEL = sys.argv[1] if len(sys.argv) > 1 and not SMOKE else "boot"
URL = os.environ.get("VLLM_URL", "http://127.0.0.1:8000")
API_PID = os.environ.get("VLLM_API_PID", "")
PROBE = os.environ.get("PROBE", "0") == "1"
LOAD_S = os.environ.get("LOAD_SECONDS", "20")
WARM_S = os.environ.get("WARM_SECONDS", "5")
OUT = Path(os.environ.get("OUT", "/tmp/gpu-out"))  # noqa: S108 - $OUT on the device
WORK = Path("/tmp/gpu-overhead") / LABEL  # noqa: S108 - a throwaway device machine
PY = sys.executable
CLIENT = "bench/gpu/kit/client.py"  # the GPU kit's load client, tracked: it travels with the tree
# Histograms whose mean over the window is reported; the first name present wins.
LATENCIES = {
    "itl_ms": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e_ms": ("vllm:e2e_request_latency_seconds",),
    "ttft_ms": ("vllm:time_to_first_token_seconds",),
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN|[+-]Inf)\s*$")


def metrics() -> dict[str, float]:
    """vLLM's counters and histogram sums/counts, summed over label sets."""
    with urllib.request.urlopen(URL + "/metrics", timeout=10) as r:  # noqa: S310 - local URL
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1).startswith("vllm:"):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def load(seconds: str) -> dict[str, object]:
    if SMOKE:
        return smoke_load(float(seconds))
    run = subprocess.run(
        [PY, CLIENT, URL, seconds, "30", "16"],
        check=False, capture_output=True, text=True, timeout=float(seconds) + 120,
    )  # fmt: skip
    try:
        result: dict[str, object] = json.loads(run.stdout)
    except ValueError:
        return {"error": (run.stdout + run.stderr)[-500:]}
    return result


def start_stack() -> list[subprocess.Popen[bytes]]:
    """The verifier and an agent next to the server, as deployed (PROBE=1 only)."""
    WORK.mkdir(parents=True, exist_ok=True)
    sock = f"unix:{WORK}/v.sock"
    log = (WORK / "stack.log").open("ab")
    verifier = [PY, "-m", "servewitness", "serve", "--listen", sock, "--db", str(WORK / "db")]
    procs = [subprocess.Popen(verifier, stdout=log, stderr=subprocess.STDOUT)]
    deadline = time.monotonic() + 60
    while not (WORK / "v.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    agent = [PY, "-m", "servewitness", "agent", "--verifier", sock, "--target", "h200", "--pid",
             API_PID, "--interval", "0.5", "--spool", str(WORK / "spool"), "--no-docker"]  # fmt: skip
    procs.append(subprocess.Popen(agent, stdout=log, stderr=subprocess.STDOUT))
    return procs


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    row: dict[str, object] = {"label": LABEL, "probe": PROBE}
    procs = start_stack() if PROBE else []
    try:
        row["warm"] = {k: v for k, v in load(WARM_S).items() if k in ("ok", "err", "seconds")}
        m0 = metrics()
        client = load(LOAD_S)
        m1 = metrics()
        seconds = client.get("seconds")
        tokens = client.get("completion_tokens")
        row.update(
            requests=client.get("ok"),
            errors=client.get("err"),
            seconds=seconds,
            completion_tokens=tokens,
        )
        if isinstance(seconds, float | int) and isinstance(tokens, int) and seconds > 0:
            row["tokens_per_s"] = round(tokens / seconds, 1)
        for key, names in LATENCIES.items():
            for name in names:
                n = m1.get(name + "_count", 0.0) - m0.get(name + "_count", 0.0)
                if n > 0:
                    total = m1.get(name + "_sum", 0.0) - m0.get(name + "_sum", 0.0)
                    row[key] = round(1000 * total / n, 4)
                    row[key + "_n"] = int(n)
                    row[key + "_metric"] = name
                    break
        gen = "vllm:generation_tokens_total"
        row["vllm_generation_tokens"] = m1.get(gen, 0.0) - m0.get(gen, 0.0)
        if "error" in client:
            row["client_error"] = client["error"]
    except Exception as e:  # noqa: BLE001 - the row must come back whatever failed
        row["error"] = f"{type(e).__name__}: {e}"
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    with (OUT / "overhead.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    print("OVERHEAD " + json.dumps(row), flush=True)
    return 0


def smoke_load(seconds: float) -> dict[str, object]:
    """Smoke mode's load, the kit's client (not in this checkout) stood in for: one client
    sending 16-token completions for SECONDS; the client's summary fields main() reads."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import _smoke

    server = _smoke.Attached(URL, int(API_PID))
    ok = tokens = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        out = server.complete("the kernel graph tensor", max_tokens=16)
        ok, tokens = ok + 1, tokens + int(out["usage"]["completion_tokens"])
    return {
        "ok": ok,
        "err": 0,
        "seconds": round(time.monotonic() - t0, 2),
        "completion_tokens": tokens,
    }


def smoke() -> int:
    """--smoke --url URL --pid PID: one boot's row from a running (CPU) server, 1 s loads."""
    global URL, API_PID, LOAD_S, WARM_S, OUT, PROBE  # noqa: PLW0603 - main() reads them
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import tempfile

    import _smoke

    args = _smoke.parse(__doc__, live=True)
    _smoke.begin(
        "one boot's row (vLLM's /metrics before and after a load, the latency means, the "
        "row's arithmetic) from a running CPU server, 1 s loads",
        [
            "the GPU, and the kit's client (bench/gpu/kit/client.py): a one-client loop sends the load",
            "PROBE=1's verifier and agent next to the server (the row is the PROBE=0 arm's)",
        ],
    )
    URL, API_PID, LOAD_S, WARM_S, PROBE = args.url, str(args.pid), "1", "0.5", False
    with tempfile.TemporaryDirectory() as tmp:
        OUT = Path(tmp)
        main()
        row = json.loads((OUT / "overhead.jsonl").read_text())
    return 1 if "error" in row else 0


if __name__ == "__main__":
    sys.exit(smoke() if SMOKE else main())
