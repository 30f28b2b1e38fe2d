"""How many agents one verifier process sustains on this machine at one report per second each.

`verifier serve` runs as its own process; K simulated agents (threads in this process) each
say Hello, send one full report (3 processes, a 5,000-file worker manifest shared by all
agents, as identical wheels would be), then a digest-only report every second with advancing
step and hook counts. Measurement starts once every agent's first report is acknowledged
(steady state); the load generator shares the machine's two cores with the verifier. A separate client asks for the run's status 5 times a second (verdict
latency). Each K runs for DURATION seconds; reported: offered and acknowledged reports/s,
Report RPC latency, verdict (GetRunStatus) latency, and the verifier's CPU use.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke

from verifier import wire
from verifier.api.v1 import verifier_pb2 as pb
from verifier.api.v1 import verifier_pb2_grpc as pb_grpc
from verifier.client.api import VerifierClient
from verifier.model import (
    FileEntry,
    HookEvidence,
    ProcessKey,
    ProcessReport,
    RunnerEvidence,
    StepEvidence,
    TargetReport,
    merkle_root,
)  # fmt: skip

DURATION = 10.0
LEVELS: tuple[int, ...] = (25, 50, 100, 200)
POLICY = 'version = 1\n[[hooks]]\nname = "h"\nrole = "worker"\n'
# fake agents report no vLLM files: pinning vLLM would never pass, so say so
POLICY += "[provenance]\nunsafe_allow_unpinned_serving_package = true\n"
FILES = tuple(
    FileEntry(f"/site/pkg/mod{i}.py", f"{i:064x}", 1000, "source", f"pkg.mod{i}", "load")
    for i in range(5000)
)
DIGEST = merkle_root((f.path, f.sha256 or "") for f in FILES)


def procs(n: int, steps: int, full: bool) -> tuple[ProcessReport, ...]:
    out = []
    for rank, role in enumerate(("api_server", "engine_core", "worker")):
        is_worker = role == "worker"
        out.append(ProcessReport(
            key=ProcessKey("boot", 1000 * n + rank + 1, 5), ns_pid=rank + 1, ppid=1, start_time=1.0,
            role=role, rank=0 if is_worker else None, container_id=None, cmdline=("python",),
            exe="/usr/bin/python3", probe_present=True,
            runner=RunnerEvidence("R", "/r.py", "0" * 64, ("R",)) if is_worker else None,
            steps=StepEvidence(steps if is_worker else 0, steps if is_worker else 0, 0, 4 * steps, steps, 1, 1),
            hooks=(HookEvidence("h", "m:C.f", True, True, "m.C", "method", None, "m.C",
                                steps if is_worker else 0, steps if is_worker else 0, 1, steps),),
            manifest_digest=DIGEST, files=FILES if full else None,
        ))  # fmt: skip
    return tuple(out)


class Load:
    def __init__(self, addr: str, k: int) -> None:
        self.addr, self.k = addr, k
        self.latencies: list[float] = []
        self.acked = 0
        self.errors = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def agent(self, n: int) -> None:
        with grpc.insecure_channel(self.addr, options=list(wire.GRPC_OPTIONS)) as ch:
            stub = pb_grpc.VerifierServiceStub(ch)
            md = wire.agent_metadata(f"a{n}", [f"t{n}"])
            nonce = stub.Hello(
                pb.HelloRequest(agent_id=f"a{n}", targets=[f"t{n}"]), metadata=md
            ).nonce
            seq, nxt = 0, time.monotonic() + (n % 10) / 10  # spread agents over the second
            while not self.stop.is_set():
                time.sleep(max(0.0, nxt - time.monotonic()))
                nxt += 1.0
                seq += 1
                rep = TargetReport(
                    f"a{n}", f"t{n}", seq, nonce, time.time(), procs(n, seq, seq == 1)
                )
                t0 = time.monotonic()
                try:
                    resp = stub.Report(
                        pb.ReportRequest(report=wire.report_to_pb(rep)), timeout=10, metadata=md
                    )
                except grpc.RpcError:
                    with self.lock:
                        self.errors += 1
                    continue
                dt = time.monotonic() - t0
                nonce = resp.nonce
                with self.lock:
                    if resp.accepted:
                        self.acked += 1
                    self.latencies.append(dt)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else float("nan")


def level(addr: str, server_pid: int, k: int) -> None:
    load = Load(addr, k)
    threads = [
        threading.Thread(target=load.agent, args=(n + k * 1000,), daemon=True) for n in range(k)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while load.acked < k and time.monotonic() < deadline:  # every first (full) report is in
        time.sleep(0.2)
    time.sleep(1.0)
    with load.lock:
        load.latencies.clear()
        acked0 = load.acked
    cpu0, t0 = cpu_seconds(server_pid), time.monotonic()
    status_lat: list[float] = []
    with VerifierClient(addr, timeout_s=30) as client:
        while time.monotonic() - t0 < DURATION:
            s0 = time.monotonic()
            client.status("scale")
            status_lat.append(time.monotonic() - s0)
            time.sleep(0.2)
    elapsed = time.monotonic() - t0
    cpu = (cpu_seconds(server_pid) - cpu0) / elapsed
    load.stop.set()
    for t in threads:
        t.join()
    with load.lock:
        acked = (load.acked - acked0) / elapsed
        lat = list(load.latencies)
    print(
        f"  {k:>4} agents: offered {k:>4}/s  acked {acked:6.1f}/s  errors {load.errors}  "
        f"Report p50 {pct(lat, 50) * 1e3:6.1f} ms p99 {pct(lat, 99) * 1e3:7.1f} ms  "
        f"status p50 {pct(status_lat, 50) * 1e3:6.1f} ms p99 {pct(status_lat, 99) * 1e3:7.1f} ms  "
        f"verifier CPU {cpu:.0%}",
        flush=True,
    )


def main() -> None:
    global DURATION, LEVELS  # level() reads DURATION
    if _smoke.parse(__doc__).smoke:
        _smoke.begin(
            "one level, 3 agents, 1 s", ["more than one level (the same code, more agents)"]
        )
        DURATION, LEVELS = 1.0, (3,)
    with tempfile.TemporaryDirectory() as tmp:
        addr = f"unix:{tmp}/v.sock"
        exe = str(Path(sys.executable).parent / "verifier")
        server = subprocess.Popen([exe, "serve", "--listen", addr, "--db", f"{tmp}/db.sqlite3"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            while not Path(f"{tmp}/v.sock").exists():
                time.sleep(0.1)
            with VerifierClient(addr) as client:
                client.register_run("scale", POLICY, "bench")
            print(f"agents at 1 report/s each, {DURATION:g} s per level, one verifier process")
            for k in LEVELS:
                level(addr, server.pid, k)
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
