"""One arm of the GPU validation (issue 9), run ON the lent H200 by the GPU kit's serve.sh:

    VERIFIER_HOOKS=... bash .gpu/call2/serve.sh --serve 8000 python3 bench/gpu/validate.py LABEL

serve.sh has started vLLM 0.26.0 (this project's wheel installed beside it, so the probe loads
as a vLLM plugin in every process) and exported VLLM_URL and VLLM_API_PID. This script then
runs the verifier and an agent next to it (Unix socket: local insecure mode), registers runs
that expect the V1 runner's step hook, the V2 runner's step hook, the model's Python forward,
and its device-side counter to fire on every productive step, drives load with the kit's
client, waits, and keeps `verifier status --json` of every run, `verifier inspect --tree
--json`, the client's summary and the logs, in one archive $OUT/LABEL.tar.gz ($OUT returns at
most 8 files). A one-line JSON summary goes to stdout. Stdlib only (the device has no network).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

# --smoke --url URL --pid PID (CI, on the CPU): see smoke()
SMOKE = sys.argv[1:2] == ["--smoke"]
LABEL = sys.argv[1] if len(sys.argv) > 1 and not SMOKE else "arm"
LOAD_S = os.environ.get("LOAD_SECONDS", "15")
WORK = Path("/tmp/gpu") / LABEL  # noqa: S108 - a throwaway device machine
OUT = Path(os.environ.get("OUT", "/tmp/gpu-out"))  # noqa: S108 - $OUT on the device
PY = sys.executable
URL = os.environ.get("VLLM_URL", "http://127.0.0.1:8000")
API_PID = os.environ.get("VLLM_API_PID", "")
V1 = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
V2 = "vllm.v1.worker.gpu.model_runner.GPUModelRunner"


def policy(hook: str, runner: str | None = None, count: str = "python") -> str:
    text = (
        "version = 1\n[evidence]\nfreshness_s = 30.0\nmin_steps = 1\n"
        'require_probe = ["api_server", "engine_core"]\n'
    )
    if runner:
        text += f'[runner]\nexpect_class = "{runner}"\n'
    text += f'[[hooks]]\nname = "{hook}"\nmin_fires_per_productive_step = 1.0\n'
    text += f'count = "{count}"\n' if count != "python" else ""
    # liveness is what this validation measures; vLLM's files are not pinned (say so)
    text += "[provenance]\nunsafe_allow_unpinned_serving_package = true\n"
    # ALLOW_DRIFT (comma-separated drift ids, e.g. provenance.pth.unclaimed for the device
    # image's own sandbox .pth files): reported as WARNING instead of ERROR, in the policy text
    allow = [d for d in os.environ.get("ALLOW_DRIFT", "").split(",") if d]
    text += f"allow = {json.dumps(allow)}\n" if allow else ""
    return text + claims()


def claims() -> str:
    """A ``[[claims]]`` entry for each file CLAIM_FILES names (comma-separated globs, e.g. the
    device image's virtualenv ``_virtualenv.py`` and its sandbox ``.pth`` files), with the
    sha256 of its bytes now: what an operator vouches for (docs/policy.md, "Drift your claims
    account for"), narrower than ALLOW_DRIFT."""
    import glob
    import hashlib

    out = ""
    for pattern in filter(None, os.environ.get("CLAIM_FILES", "").split(",")):
        for path in sorted(glob.glob(pattern)):
            digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            out += f'[[claims]]\npath = "{path}"\nsha256 = "{digest}"\n'
    return out


RUNS = {
    "v1": policy("v1_step", V1),
    "v2": policy("v2_step", V2),
    "fwd": policy("fwd"),  # the model's forward, counted in Python
    "fwd_dev": policy("fwd_dev"),  # the same hook with a device counter, counted in Python
    "fwd_device": policy("fwd_dev", count="device"),  # ... and counted on the device
}
if os.environ.get("RANK0_RUN") == "1":  # TP 2: tests/data/rank0_plugin fires it on rank 0 only
    RUNS["rank0"] = policy("rank0_only")
if os.environ.get("SPEC_RUNS") == "1":  # speculation: the drafter that runs, and the one that
    # does not (EAGLE-3 on V2: the V2 speculator's propose; V1's EagleProposer is the dead path)
    RUNS["spec_live"] = policy("v2_propose").replace(
        "min_fires_per_productive_step = 1.0\n",
        'min_fires_per_productive_step = 1.0\non = "decode"\n',
    )
    RUNS["spec_dead"] = policy("v1_propose")
WAIT_RUN = os.environ.get("WAIT_RUN", "v2")  # the run expected to pass in this arm
DELTA_HOOKS = ("v1_step", "v2_step", "fwd", "fwd_dev", "rank0_only", "v2_propose", "v1_propose")


def spec_metrics() -> dict[str, float] | str:
    """vLLM's own speculative-decoding counters (``/metrics``), summed over label sets, to
    reconcile with the probe's (``steps.speculation`` in inspect)."""
    try:
        with urllib.request.urlopen(URL + "/metrics", timeout=10) as r:  # noqa: S310 - local
            text = r.read().decode()
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:spec_decode") and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            key = name.split("{")[0]
            if "per_pos" in key and "position=" in name:
                key += "[" + name.split('position="')[1].split('"')[0] + "]"
            try:
                out[key] = out.get(key, 0.0) + float(value)
            except ValueError:
                continue
    return out


def step_deltas(before: str, after: str) -> list[dict[str, object]]:
    """Per probed process that ran steps: what the load added to its step counts, and to each
    hook's Python fires and device count (two `inspect --json` outputs)."""
    try:
        b = {p["pid"]: p for p in json.loads(before)["processes"]}
        a = json.loads(after)["processes"]
    except (ValueError, KeyError, TypeError):
        return []
    out: list[dict[str, object]] = []
    for p in a:
        q, steps = b.get(p.get("pid")), p.get("steps") or {}
        if not q or not steps.get("total"):
            continue
        qsteps = q.get("steps") or {}
        row: dict[str, object] = {"pid": p.get("pid"), "role": p.get("role"), "rank": p.get("rank")}
        for k in ("total", "productive", "decode", "prefill", "empty", "dummy"):
            if isinstance(steps.get(k), int) and isinstance(qsteps.get(k), int):
                row[f"d_steps_{k}"] = steps[k] - qsteps[k]
        qh = {h["name"]: h for h in q.get("hooks", [])}
        for h in p.get("hooks", []):
            if h.get("name") not in DELTA_HOOKS or h["name"] not in qh:
                continue
            row[f"d_{h['name']}_fired"] = h.get("fired", 0) - qh[h["name"]].get("fired", 0)
            dev, qdev = h.get("device_fired"), qh[h["name"]].get("device_fired")
            qdev = 0 if qdev is None else qdev  # no counter yet: it is made at the first call
            if isinstance(dev, int) and isinstance(qdev, int):
                row[f"d_{h['name']}_device"] = dev - qdev
                row[f"{h['name']}_device_base"] = h.get("device_base")
                row[f"{h['name']}_device_base_step"] = h.get("device_base_step")
        out.append(row)
    return out


def request_spec(inspect_out: str) -> list[dict[str, object]]:
    """Per process with speculation on: its finished requests' speculation shares (the
    ``"spec"`` of each ``"req"`` record in its bindings.jsonl) summed, beside the process's
    totals (``steps.speculation``): issue 11's per-request counts, which must add up."""
    rows: list[dict[str, object]] = []
    for p in json.loads(inspect_out)["processes"]:
        sp = (p.get("steps") or {}).get("speculation") or {}
        state_dir = (p.get("probe") or {}).get("state_dir")
        if not sp.get("on"):
            continue
        # The directory the verifier read this process's probe state from (its name carries
        # the boot id and PID namespace: session 5 looked under the old <pid>-<ticks> name,
        # found nothing and reported 0 requests). No bindings file is an error, not zero.
        if not state_dir:
            raise FileNotFoundError(f"pid {p['pid']}: no probe state directory in inspect")
        path = Path(state_dir) / "bindings.jsonl"
        if not path.exists():
            raise FileNotFoundError(f"pid {p['pid']}: {path} is missing")
        sums = {"requests": 0, "without_spec": 0, "drafts": 0, "draft_tokens": 0,
                "accepted": 0, "emitted": 0}  # fmt: skip
        pos: list[int] = []
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("k") != "req":
                continue
            sums["requests"] += 1
            share = rec.get("spec")
            if share is None:
                sums["without_spec"] += 1
                continue
            for k in ("drafts", "draft_tokens", "accepted", "emitted"):
                sums[k] += share[k]
            for i, n in enumerate(share["pos"]):
                pos[i : i + 1] = [(pos[i] if i < len(pos) else 0) + n]
        totals = {k: sp.get(k) for k in ("drafts", "draft_tokens", "accepted_tokens",
                                         "emitted_tokens", "accepted_per_position")}  # fmt: skip
        rows.append({"pid": p["pid"], "role": p.get("role"), "rank": p.get("rank"),
                     "request_sums": {**sums, "accepted_per_position": pos},
                     "process_totals": totals})  # fmt: skip
    return rows


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "servewitness", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def keep(name: str, text: str) -> None:
    (WORK / name).write_text(text)


def main() -> int:  # noqa: PLR0912, PLR0915 - one arm, step by step, all outputs kept
    WORK.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    summary: dict[str, object] = {"label": LABEL, "api_pid": API_PID}
    sock = f"unix:{WORK}/v.sock"
    procs = []
    try:
        # The probe's own evidence first: it needs neither gRPC nor the verifier.
        first = cli("inspect", "--pid", API_PID, "--tree", "--json")
        keep("inspect_before_load.json", first.stdout + first.stderr)
        summary["inspect_before_load_exit"] = first.returncode
        with (WORK / "serve.log").open("w") as log:
            procs.append(
                subprocess.Popen(
                    [
                        PY,
                        "-m",
                        "servewitness",
                        "serve",
                        "--listen",
                        sock,
                        "--db",
                        str(WORK / "db.sqlite3"),
                        "--report-interval",
                        "0.5",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + 60
        while not (WORK / "v.sock").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("verifier did not start: " + (WORK / "serve.log").read_text())
            time.sleep(0.2)
        for name, text in RUNS.items():
            (WORK / f"{name}.toml").write_text(text)
            r = cli("run", "register", name, "--policy", str(WORK / f"{name}.toml"),
                    "--verifier", sock)  # fmt: skip
            summary[f"register_{name}"] = r.returncode
        with (WORK / "agent.log").open("w") as log:
            procs.append(
                subprocess.Popen(
                    [
                        PY,
                        "-m",
                        "servewitness",
                        "-v",
                        "agent",
                        "--verifier",
                        sock,
                        "--target",
                        "h200",
                        "--pid",
                        API_PID,
                        "--interval",
                        "0.5",
                        "--spool",
                        str(WORK / "spool"),
                        "--no-docker",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        pending = cli("status", WAIT_RUN, "--verifier", sock, "--json")
        keep("status_before_load.json", pending.stdout + pending.stderr)
        t0 = time.time()
        client = subprocess.run(
            [PY, "bench/gpu/kit/client.py", URL, LOAD_S, "30", "16"],
            check=False, capture_output=True, text=True, timeout=float(LOAD_S) + 120,
        )  # fmt: skip
        summary["load_s"] = round(time.time() - t0, 1)
        keep("client.json", client.stdout + client.stderr)
        try:
            summary["client"] = json.loads(client.stdout)
        except ValueError:
            summary["client"] = client.stdout[-500:]
        # Right after the load: the counts the load added, per process (the device counter is
        # read after each step, so the landed value may trail by one step)
        mid = cli("inspect", "--pid", API_PID, "--tree", "--json")
        keep("inspect_after_load.json", mid.stdout + mid.stderr)
        summary["deltas"] = step_deltas(first.stdout, mid.stdout)
        summary["vllm_spec_metrics"] = spec_metrics()
        wait = cli("wait", WAIT_RUN, "--timeout", "60", "--verifier", sock, timeout=90)
        summary[f"wait_{WAIT_RUN}_exit"] = wait.returncode
        keep(f"wait_{WAIT_RUN}.txt", wait.stdout + wait.stderr)
        time.sleep(2)  # one more report after the last request
        for name in RUNS:
            st = cli("status", name, "--verifier", sock, "--json")
            keep(f"status_{name}.json", st.stdout + st.stderr)
            try:
                run = json.loads(st.stdout)["runs"][0]
                summary[f"{name}_verdict"] = run.get("verdict")
                found = [f for t in run.get("targets", []) for f in t.get("findings", [])]
                summary[f"{name}_findings"] = sorted({f["id"] for f in found})
                summary[f"{name}_liveness_by_rank"] = sorted(
                    [f["id"], (f.get("context") or {}).get("rank")]
                    for f in found
                    if str(f.get("id", "")).startswith("liveness.hook")
                )
            except (ValueError, KeyError, IndexError):
                summary[f"{name}_verdict"] = f"exit {st.returncode}: {st.stderr[-300:]}"
        ins = cli("inspect", "--pid", API_PID, "--tree", "--json")
        keep("inspect.json", ins.stdout + ins.stderr)
        try:
            procs_ev = json.loads(ins.stdout)["processes"]
            summary["processes"] = [
                {
                    "pid": p.get("pid"),
                    "role": p.get("role"),
                    "rank": p.get("rank"),
                    "runner": (p.get("runner") or {}).get("class"),
                    "runner_log": (p.get("runner") or {}).get("log"),
                    "engine": p.get("engine"),
                    "manifest": p.get("manifest"),
                    "steps": p.get("steps"),
                    "hooks": {
                        h["name"]: {
                            k: h.get(k)
                            for k in (
                                "status",
                                "fired",
                                "fired_on_decode_steps",
                                "fired_outside_steps",
                                "device_fired",
                                "device_base",
                                "device_base_step",
                                "module_loaded",
                            )
                        }
                        for h in p.get("hooks", [])
                    },
                }
                for p in procs_ev
                if (p.get("probe") or {}).get("present")
            ]
        except (ValueError, KeyError, TypeError) as e:
            summary["inspect_error"] = f"{type(e).__name__}: {e}; {ins.stderr[-300:]}"
        try:
            summary["per_request_spec"] = request_spec(ins.stdout)
        except (OSError, ValueError, KeyError, TypeError) as e:
            summary["per_request_spec"] = f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - the summary and the files must come back
        summary["error"] = f"{type(e).__name__}: {e}"
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        server_log = os.environ.get("VLLM_SERVER_LOG")
        if server_log and Path(server_log).exists():
            (WORK / "vllm_server.log").write_text(Path(server_log).read_text()[-200_000:])
        keep("summary.json", json.dumps(summary, indent=1, default=str))
        with tarfile.open(OUT / f"{LABEL}.tar.gz", "w:gz") as tar:
            for f in sorted(WORK.iterdir()):
                if f.is_file() and f.suffix in (".json", ".log", ".toml", ".txt"):
                    tar.add(f, arcname=f"{LABEL}/{f.name}")
    print("SUMMARY " + json.dumps(summary, default=str), flush=True)
    return 0


def smoke() -> int:
    """--smoke --url URL --pid PID: what of an arm runs without the GPU, on a running CPU
    server: every run's policy through the verifier's loader, the step deltas of a small load
    from two inspections, the per-request speculation sums and vLLM's speculation counters."""
    global URL  # noqa: PLW0603 - spec_metrics() reads it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import _smoke

    from servewitness.policy import load_policy

    args = _smoke.parse(__doc__, live=True)
    _smoke.begin(
        "the policies, step deltas, per-request speculation sums and vLLM's speculation "
        "counters of one running CPU server under 4 completions",
        [
            "the GPU (V2 runner, CUDA graphs, device counters, tensor parallelism)",
            "the verifier and agent, the runs' registration and verdicts, `verifier wait`",
            "the kit's client (bench/gpu/kit/client.py) and the archive",
            "verifier inspect's file judgement (its JSON is read in-process without it)",
        ],
    )
    URL = args.url
    for name, text in RUNS.items():
        policy = load_policy(text, f"{name}.toml")
        print(f"policy {name}: {len(policy.rules)} rules")
    before = json.dumps(_smoke.inspect_tree(args.pid))
    server = _smoke.Attached(args.url, args.pid)
    for i in range(4):
        server.complete(f"validate {i}", max_tokens=8)
    after = json.dumps(_smoke.inspect_tree(args.pid))
    deltas = step_deltas(before, after)
    print(f"deltas: {json.dumps(deltas)}")
    print(f"per_request_spec: {json.dumps(request_spec(after))}")
    print(f"vllm_spec_metrics: {json.dumps(spec_metrics())}")
    return 0 if any(d.get("d_steps_productive") for d in deltas) else 1


if __name__ == "__main__":
    sys.exit(smoke() if SMOKE else main())
