"""Gate latency: from the first hook fire in a target to `verifier wait` returning PASS.

Each trial starts a fresh stand-in target: a Python process whose probe has a worker role and
a step-counting worker class (the same wrapper vLLM's worker gets), an agent reporting it at
the given interval, a pre-registered run requiring the hook, and a waiting client. The target
then runs its first productive step (which fires the hook), once the agent's first (cold)
report is acknowledged; the time until `wait_for` returns is the gate latency. Interleaved over
report intervals; ratios against the interval.
"""

from __future__ import annotations

import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
from _stats import print_rows, summary

from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
from servewitness.client.api import VerifierClient
from servewitness.client.gate import wait_for
from servewitness.server.app import ServeConfig, VerifierServer

TARGET = """
import sys, time
import servewitness_probe as p
from servewitness_probe import _vllm
p.start()
_vllm.set_role("worker", rank=0)
class Out:
    total_num_scheduled_tokens = 4
    num_scheduled_tokens = {"r": 4}
class Worker:
    model_runner = None
    @p.hook("h")  # declared here, before any step: hook.fire would declare it at the first
    def execute_model(self, so):  # fire, and a report between the step and it reads "not declared"
        return "output"  # one-phase: a step that returns None stays open for sample_tokens
_vllm._wrap_worker_class(Worker)
w = Worker()
print("up", flush=True)
sys.stdin.readline()
t0 = time.time()
w.execute_model(Out())
print(t0, flush=True)
sys.stdin.read()
"""
POLICY = 'version = 1\n[targets]\nnames = ["{t}"]\n[[hooks]]\nname = "h"\nrole = "worker"\n'
# fake agents report no vLLM files: pinning vLLM would never pass, so say so
POLICY += "[provenance]\nunsafe_allow_unpinned_serving_package = true\n"
TRIALS = 8
RNG = random.Random(1)  # noqa: S311 - a reproducible phase, not a secret
INTERVALS: tuple[float, ...] = (0.25, 0.5, 1.0)


def trial(d: Path, server_addr: str, interval: float, n: int) -> float:
    name = f"t{n}"
    # The stand-in's scheduler output carries only what step counting reads; the request
    # bindings would record an error per step on it, which keeps a run from PASS: off here.
    env = {"VERIFIER_PROBE_DIR": str(d / "probe"), "PATH": "/usr/bin:/bin",
           "VERIFIER_PROBE_BINDINGS": "0"}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", TARGET], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.readline().strip() == "up"
    cfg = AgentConfig(
        server_addr, name, f"a{n}", d / f"spool{n}", interval_s=interval, root_pid=proc.pid
    )
    agent = Agent(cfg)
    th = threading.Thread(target=agent.run, daemon=True)
    with VerifierClient(server_addr) as client:
        client.register_run(name, POLICY.format(t=name), "bench")
        th.start()
        # Steady state first: the agent's first collection is cold (every file hashed and
        # judged: ~1.7 s on the loaded 2-core machine at 1ef8398), and a fire during it waited
        # for the rest of it, which the gate's steady latency does not include.
        deadline = time.monotonic() + 60
        while not agent.sent_digests:  # set once the first report (with its manifest) is acked
            assert time.monotonic() < deadline, "the agent's first report was never acknowledged"
            time.sleep(0.01)
        time.sleep(interval * 2)  # the target is known (PENDING) before the first step
        before = client.status(name)
        assert before.verdict.value == "PENDING", before
        time.sleep(RNG.uniform(0, interval))  # fire at a random phase of the report cycle
        proc.stdin.write("go\n")
        proc.stdin.flush()
        t0 = float(proc.stdout.readline())
        wait_for(client, name, timeout_s=30, poll_s=0.05)
        latency = time.time() - t0
    agent.stop_event.set()
    th.join()
    proc.communicate(timeout=10)
    return latency


def main() -> None:
    global TRIALS, INTERVALS  # trial() and the report read them
    if _smoke.parse(__doc__).smoke:
        _smoke.begin(
            "one trial at the shortest report interval (after the agent's cold first report)",
            ["the longer intervals (the same code, more arms; ~2.5 s of CI each)"],
        )
        TRIALS, INTERVALS = _smoke.ROUNDS, INTERVALS[:1]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        addr = f"unix:{d}/v.sock"
        server = VerifierServer(ServeConfig(addr, d / "db.sqlite3"))
        server.start()
        results: dict[str, list[float]] = {f"interval {i:g} s": [] for i in INTERVALS}
        n = 0
        try:
            for _ in range(TRIALS):
                for interval in INTERVALS:
                    n += 1
                    results[f"interval {interval:g} s"].append(trial(d, addr, interval, n))
        finally:
            server.stop()
    print(
        f"gate latency, first fire -> wait returns PASS, seconds ({TRIALS} trials per arm, "
        "interleaved; client polls every 0.05 s)"
    )
    stats = {k: summary(v) for k, v in results.items()}
    print_rows(stats, fmt="6.3f")
    for interval, (k, s) in zip(INTERVALS, stats.items(), strict=True):
        print(f"  {k}: median latency / report interval = {s['median'] / interval:.2f}")


if __name__ == "__main__":
    main()
