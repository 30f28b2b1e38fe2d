"""Load and back-pressure: many simulated agents with request-binding streams against one
`verifier serve` process, each arm bounded in time, and at the end a check that nothing the
agents saw acknowledged was lost or stored twice.

The verifier runs as its own process (real gRPC on loopback TCP, SQLite database, its default
``--max-concurrent-rpcs``). K simulated agents are threads spread over PROCS load-generator
processes (one GIL each). Every agent behaves as ``verifier agent`` does: Hello for a nonce;
once a second it numbers a new report (3 processes, the worker's 500-file manifest sent in full
only until acknowledged, BINDINGS request bindings: a span and a client-id mapping each) and
appends it to its spool, then sends the spool in order; on any error (RESOURCE_EXHAUSTED from
the verifier's back-pressure included) it forgets the nonce and backs off exponentially from
0.5 s, keeping every unacknowledged report. A separate client asks for the run's status 5x/s
(the gate's view while loaded) and the verifier's VmRSS (/proc/PID/status) and CPU are
sampled.

An arm: a fresh verifier and database, K agents start, WARM seconds (first reports, manifests),
then SECONDS measured. The arms (K = 5, 20, 100, 300 by default; the first is the low-load
baseline; --unlimited adds the largest K against a verifier without the RPC limit) run in
ROUNDS interleaved rounds, so the spread of an arm over rounds is its noise floor and each
ratio is against the baseline of the same round. Reported per arm: reports and bindings
acknowledged per second (against offered), Report and status RPC latency p50/p99, how often
the verifier answered RESOURCE_EXHAUSTED, its CPU and memory.

After each arm the verifier is stopped (SIGTERM), then every (agent, seq) an agent saw acknowledged
must be in the database's ``reports`` table, every binding of those reports in ``bindings`` exactly
once, and ``verifier audit verify --db`` must pass.

Usage: bench/load_test.py [--agents 5,20,100,300] [--seconds 12] [--rounds 2] [--bindings 20]
                          [--unlimited]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import multiprocessing as mp
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.model import (
    FileEntry,
    HookEvidence,
    ProcessKey,
    ProcessReport,
    RequestId,
    RequestSpan,
    RunnerEvidence,
    StepEvidence,
    TargetReport,
    manifest_digest,
)  # fmt: skip

RUN = "load"
POLICY = 'version = 1\n[[hooks]]\nname = "h"\nrole = "worker"\n'
# fake agents report no vLLM files: pinning vLLM would never pass, so say so
POLICY += "[provenance]\nunsafe_allow_unpinned_serving_package = true\n"
FILES = tuple(
    FileEntry(f"/site/pkg/mod{i}.py", f"{i:064x}", 1000, "source", f"pkg.mod{i}", "load")
    for i in range(500)
)
DIGEST = manifest_digest(FILES)
INTERVAL_S = 1.0
MAX_BACKOFF_S = 8.0
RUNNER = "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
EXE = str(Path(sys.executable).parent / "verifier")


def procs(n: int, steps: int, full: bool) -> tuple[ProcessReport, ...]:
    out = []
    for rank, role in enumerate(("api_server", "engine_core", "worker")):
        w = role == "worker"
        out.append(ProcessReport(
            key=ProcessKey("boot", 1000 * n + rank + 1, 5), ns_pid=rank + 1, ppid=1, start_time=1.0,
            role=role, rank=0 if w else None, container_id=None, cmdline=("python",),
            exe="/usr/bin/python3", probe_present=True,
            runner=RunnerEvidence("R", "/r.py", "0" * 64, ("R",)) if w else None,
            steps=StepEvidence(steps if w else 0, steps if w else 0, 0, 4 * steps, steps, 1, 1),
            hooks=(HookEvidence("h", "m:C.f", True, True, "m.C", "method", None, "m.C",
                                steps if w else 0, steps if w else 0, 1, steps),),
            manifest_digest=DIGEST if w else None, files=FILES if w and full else None,
        ))  # fmt: skip
    return tuple(out)


def internal_id(agent: str, seq: int, j: int) -> str:
    return f"cmpl-{agent}-{seq}-{j}"


def report(agent: str, n: int, seq: int, bindings: int, full: bool) -> TargetReport:
    now = time.time()
    ps = procs(n, 16 * seq, full)
    api, worker = ps[0].key, ps[2].key
    spans, ids = [], []
    for j in range(bindings):
        iid = internal_id(agent, seq, j)
        step = 16 * (seq - 1) + j % 16
        spans.append(RequestSpan(worker, iid, step, step + 8, 8, 40, now - 0.5, now, DIGEST,
                                 DIGEST, RUNNER, (("h", 8),)))  # fmt: skip
        ids.append(RequestId(api, iid, iid.rsplit("-", 1)[0] + f"x{j}", now - 0.5))
    return TargetReport(agent, "t-" + agent, seq, "", now, ps, collected_unix=now,
                        spans=tuple(spans), request_ids=tuple(ids))  # fmt: skip


@dataclasses.dataclass
class Tally:
    """What one load-generator process saw; merged by the parent."""

    acked: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # agent -> seqs
    pending: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # spooled at end
    win_reports: int = 0  # acknowledged inside the measured window
    win_bindings: int = 0
    win_busy: int = 0  # RESOURCE_EXHAUSTED inside the window (Hello or Report)
    win_errors: int = 0  # any other error inside the window
    busy: int = 0  # RESOURCE_EXHAUSTED over the whole arm
    errors: int = 0
    latencies: list[float] = dataclasses.field(default_factory=list)  # Report RPC, window


class Agents:
    def __init__(self, addr: str, tag: str, bindings: int, t_win: float, t_end: float) -> None:
        self.addr, self.tag, self.bindings = addr, tag, bindings
        self.t_win, self.t_end = t_win, t_end
        self.tally = Tally()
        self.lock = threading.Lock()

    def run(self, n: int) -> None:  # noqa: PLR0915 - the agent's loop, in one place
        agent = f"{self.tag}-a{n}"
        spool: collections.deque[TargetReport] = collections.deque()
        acked: list[int] = []
        nonce: str | None = None
        seq, backoff, manifest_acked = 0, 0.5, False
        nxt = time.time() + (n % 10) / 10  # spread agents over the second
        with grpc.insecure_channel(self.addr, options=list(wire.GRPC_OPTIONS)) as ch:
            stub = pb_grpc.VerifierServiceStub(ch)
            while True:
                wait = nxt - time.time()
                if time.time() + max(wait, 0.0) >= self.t_end:
                    break
                time.sleep(max(0.0, wait))
                seq += 1
                spool.append(report(agent, n, seq, self.bindings, not manifest_acked))
                try:
                    while spool:
                        if nonce is None:
                            nonce = stub.Hello(
                                pb.HelloRequest(agent_id=agent, targets=["t-" + agent]),
                                timeout=10,
                                metadata=wire.agent_metadata(agent, ["t-" + agent]),
                            ).nonce
                        rep = dataclasses.replace(spool[0], nonce=nonce)
                        t0 = time.monotonic()
                        resp = stub.Report(pb.ReportRequest(report=wire.report_to_pb(rep)),
                                           timeout=10,
                                           metadata=wire.agent_metadata(agent, ["t-" + agent]))  # fmt: skip
                        dt, done = time.monotonic() - t0, time.time()
                        nonce = resp.nonce
                        if not resp.accepted:  # the verifier lacks the manifest: send it
                            spool[0] = report(agent, n, rep.seq, self.bindings, True)
                            continue
                        spool.popleft()
                        acked.append(rep.seq)
                        manifest_acked = manifest_acked or rep.processes[2].files is not None
                        if self.t_win <= done < self.t_end:
                            with self.lock:
                                self.tally.win_reports += 1
                                self.tally.win_bindings += len(rep.spans)
                                self.tally.latencies.append(dt)
                    backoff = 0.5
                    nxt += INTERVAL_S
                except grpc.RpcError as e:
                    nonce = None  # as the agent: re-Hello after any failure
                    busy = e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    inside = self.t_win <= time.time() < self.t_end
                    with self.lock:
                        if busy:
                            self.tally.busy += 1
                            self.tally.win_busy += inside
                        else:
                            self.tally.errors += 1
                            self.tally.win_errors += inside
                    nxt = time.time() + backoff
                    backoff = min(2 * backoff, MAX_BACKOFF_S)
        with self.lock:
            self.tally.acked[agent] = acked
            self.tally.pending[agent] = [r.seq for r in spool]


def generator(  # noqa: PLR0917 - a multiprocessing target
    addr: str, tag: str, first: int, count: int, bindings: int,
              ready: Any, go: Any, out: Any) -> None:  # fmt: skip
    """One load-generator process: COUNT agent threads, numbered from FIRST."""
    ready.put(os.getpid())
    t_win, t_end = go.get()
    agents = Agents(addr, tag, bindings, t_win, t_end)
    threads = [threading.Thread(target=agents.run, args=(first + i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(dataclasses.asdict(agents.tally))


def vm_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def arm(  # noqa: PLR0912, PLR0917
    addr: str, pid: int, k: int, tag: str, seconds: float, bindings: int,
        nprocs: int, warm_s: float = 3.0) -> dict[str, Any]:  # fmt: skip
    ctx = mp.get_context("spawn")  # no fork of a process that holds gRPC channels
    ready, go, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    nprocs = min(nprocs, k)
    share = [k // nprocs + (i < k % nprocs) for i in range(nprocs)]
    workers = [
        ctx.Process(target=generator, args=(addr, tag, sum(share[:i]), share[i], bindings,
                                            ready, go, out))
        for i in range(nprocs)
    ]  # fmt: skip
    for w in workers:
        w.start()
    for _ in workers:
        ready.get(timeout=120)
    warm = warm_s + k / 50  # every agent's first reports (full manifests) go in first
    t_go = time.time()
    t_win, t_end = t_go + warm, t_go + warm + seconds
    for _ in workers:
        go.put((t_win, t_end))
    time.sleep(max(0.0, t_win - time.time()))
    cpu0, m0, rss = cpu_seconds(pid), time.monotonic(), [vm_rss_mib(pid)]
    status_lat: list[float] = []
    status_busy = status_err = 0
    with grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch:
        stub = pb_grpc.VerifierServiceStub(ch)
        while time.time() < t_end:
            s0 = time.monotonic()
            try:
                stub.GetRunStatus(pb.GetRunStatusRequest(name=RUN), timeout=30)
                status_lat.append(time.monotonic() - s0)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    status_busy += 1
                else:
                    status_err += 1
            rss.append(vm_rss_mib(pid))
            time.sleep(max(0.0, min(0.2 - (time.monotonic() - s0), t_end - time.time())))
    cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - m0)
    tallies = [out.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(timeout=30)
    merged: dict[str, Any] = {"acked": {}, "pending": {}, "latencies": []}
    for t in tallies:
        for key, v in t.items():
            if isinstance(v, dict):
                merged[key].update(v)
            elif isinstance(v, list):
                merged[key].extend(v)
            else:
                merged[key] = merged.get(key, 0) + v
    lat = merged["latencies"]
    return {
        "k": k, "tag": tag, "offered": k / INTERVAL_S,
        "reports_s": merged["win_reports"] / seconds,
        "bindings_s": merged["win_bindings"] / seconds,
        "busy": merged["win_busy"], "busy_all": merged["busy"],
        "errors": merged["win_errors"], "errors_all": merged["errors"],
        "report_p50": pct(lat, 50), "report_p99": pct(lat, 99),
        "status_p50": pct(status_lat, 50), "status_p99": pct(status_lat, 99),
        "status_busy": status_busy, "status_err": status_err,
        "cpu": cpu, "rss_end": rss[-1], "rss_peak": max(rss),
        "acked": merged["acked"], "pending": merged["pending"],
    }  # fmt: skip


def free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_serving(addr: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with grpc.insecure_channel(addr) as ch:
                check = health_pb2_grpc.HealthStub(ch).Check  # type: ignore[attr-defined]
                check(health_pb2.HealthCheckRequest(service=""), timeout=1)
            return
        except grpc.RpcError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"verifier did not start:\n{log.read_text()}") from None
            time.sleep(0.1)


def consistency(db: str, arms: list[dict[str, Any]], bindings: int) -> dict[str, Any]:
    """Every acknowledged (agent, seq) stored once; every binding of those stored once."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        stored = collections.Counter(
            (str(a), int(s)) for a, s in conn.execute("SELECT agent_id, seq FROM reports")
        )
        ids = collections.Counter(
            str(r[0]) for r in conn.execute("SELECT internal_id FROM bindings")
        )
        mapped = conn.execute("SELECT COUNT(*) FROM request_ids").fetchone()[0]
    acked = {(a, s) for r in arms for a, seqs in r["acked"].items() for s in seqs}
    pending = {(a, s) for r in arms for a, seqs in r["pending"].items() for s in seqs}
    missing = acked - set(stored)
    twice = [k for k, c in stored.items() if c > 1] + [k for k, c in ids.items() if c > 1]
    want = {internal_id(a, s, j) for a, s in acked for j in range(bindings)}
    lost_bindings = want - set(ids)
    # stored but never seen acknowledged: only a report still in an agent's spool at the end
    # (its acknowledgement was lost, e.g. a timeout after commit) may be; the agent would
    # resend it and get it acknowledged as a duplicate
    unexplained = set(stored) - acked - pending
    audit = subprocess.run([EXE, "audit", "verify", "--db", db, "--json"],
                           check=False, capture_output=True, text=True, timeout=600)  # fmt: skip
    verified = audit.returncode == 0 and json.loads(audit.stdout).get("ok") is True
    return {
        "acked": len(acked), "stored": sum(stored.values()), "missing": len(missing),
        "twice": len(twice), "bindings_acked": len(want), "bindings_stored": sum(ids.values()),
        "bindings_lost": len(lost_bindings), "request_ids": mapped,
        "stored_not_acked": len(set(stored) - acked), "unexplained": len(unexplained),
        "spooled_at_end": len(pending), "audit_ok": verified,
        "audit": audit.stdout.strip()[:300] + audit.stderr.strip()[:300],
    }  # fmt: skip


def ms(x: float) -> str:
    return f"{x * 1e3:.0f} ms" if x >= 0.1 else f"{x * 1e3:.1f} ms"


def serve(tmp: Path, limit: int | None) -> tuple[str, subprocess.Popen[bytes], Path, str]:
    """A fresh verifier on a fresh database: (address, process, log, database)."""
    tmp.mkdir()
    db, log = str(tmp / "verifier.sqlite3"), tmp / "serve.log"
    addr = f"127.0.0.1:{free_port()}"
    cmd = [EXE, "serve", "--listen", addr, "--db", db]
    if limit is not None:
        cmd += ["--max-concurrent-rpcs", str(limit)]
    with log.open("wb") as f:
        server = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    wait_serving(addr, server, log)
    with grpc.insecure_channel(addr) as ch:
        pb_grpc.VerifierServiceStub(ch).RegisterRun(
            pb.RegisterRunRequest(name=RUN, policy_toml=POLICY, source="bench"), timeout=30
        )
    return addr, server, log, db


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", default="5,20,100,300", help="comma-separated; first = baseline")
    ap.add_argument("--seconds", type=float, default=12.0, help="measured seconds per arm")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bindings", type=int, default=20, help="request bindings per report")
    ap.add_argument("--procs", type=int, default=2, help="load-generator processes")
    ap.add_argument("--max-concurrent-rpcs", type=int, default=None,
                    help="passed to verifier serve (default: its own default)")  # fmt: skip
    ap.add_argument("--unlimited", action="store_true",
                    help="one more arm: the most agents against a verifier without the limit")  # fmt: skip
    _smoke.add_args(ap)
    args = ap.parse_args()
    warm_s = 3.0  # before each arm's window (plus a second per 50 agents): first reports
    if args.smoke:
        _smoke.begin("two arms (2 and 4 agents), 1 s each after 0.5 s of warm-up, 2 bindings "
                     "per report, one load-generator process, the consistency and audit check",
                     ["--unlimited (the same arm against another --max-concurrent-rpcs)"])  # fmt: skip
        args.agents, args.seconds, args.rounds = "2,4", 1.0, _smoke.ROUNDS
        args.bindings, args.procs = 2, 1
        warm_s = 0.5
    levels = [int(x) for x in args.agents.split(",")]
    arms: list[tuple[str, int, int | None]] = [
        (str(k), k, args.max_concurrent_rpcs) for k in levels
    ]
    if args.unlimited:
        arms.append((f"{levels[-1]} (no limit)", levels[-1], 1_000_000))
    print(f"{args.bindings} bindings per report, 1 report/s per agent, {args.seconds:g} s "
          f"measured per arm, {args.rounds} rounds interleaved, {args.procs} load-generator "
          f"processes, a fresh verifier per arm, --max-concurrent-rpcs "
          f"{args.max_concurrent_rpcs or 'default'}", flush=True)  # fmt: skip
    results: list[dict[str, Any]] = []
    ok = True
    with tempfile.TemporaryDirectory(prefix="load-test-", dir=os.environ.get("TMPDIR")) as tmp:
        for r in range(args.rounds):
            for n, (label, k, limit) in enumerate(arms):
                addr, server, log, db = serve(Path(tmp) / f"r{r}a{n}", limit)
                try:
                    res = arm(addr, server.pid, k, f"r{r}k{k}", args.seconds, args.bindings,
                              args.procs, warm_s)  # fmt: skip
                finally:
                    server.terminate()
                    code = server.wait(timeout=60)
                res["label"], res["round"] = label, r
                res["check"] = check = consistency(db, [res], args.bindings)
                good = (code == 0 and check["missing"] == 0 and check["twice"] == 0
                        and check["bindings_lost"] == 0 and check["unexplained"] == 0
                        and check["audit_ok"])  # fmt: skip
                ok = ok and good
                results.append(res)
                print(f"  round {r} {label:>14}: acked {res['reports_s']:7.1f}/s "
                      f"(offered {res['offered']:.0f}), bindings {res['bindings_s']:8.0f}/s, "
                      f"busy {res['busy']} (all {res['busy_all']}), errors {res['errors']} "
                      f"(all {res['errors_all']}), "
                      f"Report p50 {ms(res['report_p50'])} p99 {ms(res['report_p99'])}, "
                      f"status p50 {ms(res['status_p50'])} p99 {ms(res['status_p99'])} "
                      f"(busy {res['status_busy']}, err {res['status_err']}), "
                      f"CPU {res['cpu']:.0%}, RSS {res['rss_end']:.0f} MiB "
                      f"(peak {res['rss_peak']:.0f}); acked {check['acked']} stored "
                      f"{check['stored']} missing {check['missing']} twice {check['twice']} "
                      f"bindings {check['bindings_stored']}/{check['bindings_acked']} "
                      f"spooled at end {check['spooled_at_end']} audit "
                      f"{'ok' if check['audit_ok'] else 'FAILED'} exit {code}", flush=True)  # fmt: skip
                if not good:
                    print(json.dumps(check), log.read_text()[-3000:])
    report_table(results, [a[0] for a in arms])
    total = {key: sum(r["check"][key] for r in results)
             for key in ("acked", "missing", "twice", "bindings_acked", "bindings_lost")}  # fmt: skip
    print(f"\nover all arms: {json.dumps(total)}")
    print("nothing acknowledged lost, nothing stored twice, every ledger verifies:", ok)
    if not ok:
        raise SystemExit(1)


def report_table(results: list[dict[str, Any]], labels: list[str]) -> None:
    """Medians over rounds; spread = (max - min) / median; ratios against the first arm of
    the same round (the low-load baseline)."""
    by_round: dict[int, dict[str, dict[str, Any]]] = collections.defaultdict(dict)
    for r in results:
        by_round[r["round"]][r["label"]] = r
    base = labels[0]

    def med(label: str, key: str) -> tuple[float, float]:
        vals = [rr[label][key] for rr in by_round.values() if label in rr]
        m = statistics.median(vals)
        return m, (max(vals) - min(vals)) / m if m else float("nan")

    def ratio(label: str, key: str) -> float:
        return float(statistics.median(rr[label][key] / rr[base][key] for rr in by_round.values()))

    print("\n| agents | offered /s | acked /s (spread) | acked / offered | bindings /s | "
          "Report p50 / p99 | status p50 / p99 (spread of p50) | status p50 / baseline | "
          "RESOURCE_EXHAUSTED (window, whole arm) | other errors | verifier CPU | "
          "VmRSS end (peak) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label in labels:
        rr = [x[label] for x in by_round.values()]
        k = rr[0]["k"]
        acked, spread = med(label, "reports_s")
        sp50, sspread = med(label, "status_p50")
        print(f"| {label} | {k / INTERVAL_S:.0f} | {acked:.1f} ({spread:.0%}) | "
              f"{acked / (k / INTERVAL_S):.2f} | {med(label, 'bindings_s')[0]:,.0f} | "
              f"{ms(med(label, 'report_p50')[0])} / {ms(med(label, 'report_p99')[0])} | "
              f"{ms(sp50)} / {ms(med(label, 'status_p99')[0])} ({sspread:.0%}) | "
              f"{ratio(label, 'status_p50'):.1f}x | "
              f"{sum(x['busy'] for x in rr)}, {sum(x['busy_all'] for x in rr)} | "
              f"{sum(x['errors_all'] + x['status_err'] for x in rr)} | "
              f"{med(label, 'cpu')[0]:.0%} | {med(label, 'rss_end')[0]:.0f} "
              f"({max(x['rss_peak'] for x in rr):.0f}) MiB |")  # fmt: skip


if __name__ == "__main__":
    main()
