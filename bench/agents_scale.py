"""Verifier throughput: how many reports/s one `verifier serve` acknowledges from K agents with
binding streams, what each acknowledged report costs its CPU, and the status p99 meanwhile.

Method. Every arm runs a fresh `verifier serve` (SQLite, loopback TCP, its defaults) on a fresh
database, from a source tree given by ``--src LABEL=PATH`` (several: the code before and after a
change, measured in the same run; the first is the baseline of the ratios), ROUNDS rounds with
the arms interleaved, so each arm's spread over rounds is its noise floor.

Load: K agents (asyncio coroutines over grpc.aio in ONE load-generator process, so it costs
little and its CPU is measured, not hidden) each say Hello and then, RATE times a second, send
a report (3 processes, the worker's 500-file manifest by digest, sent in full once when the
verifier asks; BINDINGS request bindings: a span and a client-id mapping each). Each agent's
request is built once and only its seq, nonce, times and binding ids change per report
(serialized by upb in C). An agent waits for its acknowledgement before its next report, and
at least the pace the acknowledgement asks while the verifier is busy (``next_report_in_s``,
bounded at 30 s as the agent's longest backoff), as `verifier agent` does; on any error it
counts a refusal (RESOURCE_EXHAUSTED) or a failure, backs off (0.2 s doubling to 4 s) and
goes on, saying Hello again after a failure (after a refusal too in an arm named by
``--hello-after-busy``: agents before 2026-12-04 did): an agent never dies, and an agent that
got nothing acknowledged is counted as such, never as capacity.

Measured (after every agent's first report was acknowledged, or 60 s): acknowledged
reports/s; the verifier's CPU-seconds per acknowledged report (/proc/PID/stat), so that its
capacity on two dedicated cores is stated next to the rate reached on two cores shared with the
load generator (2 / cpu_per_report, an upper bound: one process's Python holds the GIL); the
load generator's own CPU; Report latency; GetRunStatus p50/p99 from a separate client (a thread
of the parent process, 5 calls/s). After the arm (SIGTERM), every (agent, seq) acknowledged
must be in the database: 1..last acknowledged seq of every agent.

Usage: bench/agents_scale.py [--agents 500] [--rate 2] [--seconds 10] [--rounds 3]
                             [--bindings 20] [--status-rate 5] [--src base=/path/to/tree --src new=.]

``--status-rate 0`` leaves the status client out: the CPU per acknowledged report is then the
agents' calls' alone (with it, answered status calls are in it too, and an arm that refuses
them looks cheaper).

``--floor`` adds the arm "gRPC floor": the same load, in the same run, on a gRPC server that
only parses each request and acknowledges it (the verifier's gRPC options, 8 workers): what
any Python servicer of these calls pays, the fastest honest baseline for the verifier's CPU
per report. ``--processes-of LABEL=N`` serves arm LABEL from ``verifier serve --processes N``
(its CPU is every process's), with ``--connections C`` TCP connections for the agents (one
connection lands on one process; a fleet's agents each have their own).
``--verifier-cpus LIST`` pins the verifier (``taskset -c``); pin this script elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import multiprocessing as mp
import os
import random
import shlex
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
from _stats import summary
from load_test import POLICY, free_port, report, wait_serving

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc

RUN = "load"
REPO = Path(__file__).resolve().parent.parent
VERIFIER_CPUS: list[str] = []  # --verifier-cpus: taskset -c LIST before the verifier's command
SERVICE = "/verifier.api.v1.VerifierService/"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


class Agent:
    """One simulated agent: its request built once, re-stamped per report."""

    def __init__(self, n: int, tag: str, bindings: int) -> None:
        self.id, self.n = f"{tag}-a{n}", n
        self.md = wire.agent_metadata(self.id, ["t-" + self.id])
        self.full = pb.ReportRequest(
            report=wire.report_to_pb(report(self.id, n, 1, bindings, True))
        )
        self.req = pb.ReportRequest(
            report=wire.report_to_pb(report(self.id, n, 1, bindings, False))
        )
        self.acked = 0  # last acknowledged seq

    def stamp(self, req: pb.ReportRequest, seq: int, nonce: str) -> bytes:
        r, now = req.report, time.time()
        r.seq, r.nonce, r.sent_unix, r.collected_unix = seq, nonce, now, now
        w = r.processes[2].steps
        w.productive = w.total = 16 * seq
        for j, (s, i) in enumerate(zip(r.spans, r.request_ids, strict=True)):
            s.internal_id = i.internal_id = f"cmpl-{self.id}-{seq}-{j}"
            s.first_step, s.last_step = 16 * (seq - 1) + j % 16, 16 * (seq - 1) + j % 16 + 8
            s.first_unix, s.last_unix, i.unix = now - 0.5, now, now - 0.5
            i.external_id = f"x-{self.id}-{seq}-{j}"
        return req.SerializeToString()


async def agents_main(addr: str, tag: str, k: int, rate: float, bindings: int,  # noqa: PLR0917, PLR0915
                      t_win: float, t_end: float, out: Any, hello_busy: bool = False,
                      connections: int = 1) -> None:  # fmt: skip
    counts = {"acked": 0, "refused": 0, "failed": 0, "win_acked": 0, "win_refused": 0,
              "win_failed": 0, "first": 0}  # fmt: skip
    lat: list[float] = []
    agents = [Agent(n, tag, bindings) for n in range(k)]
    # CONNECTIONS channels, each with a TCP connection of its own (a fleet's agents each
    # have theirs; the kernel spreads them over a verifier's --processes)
    opts = [*wire.GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    chans = [grpc.aio.insecure_channel(addr, options=opts) for _ in range(connections)]
    hellos = [ch.unary_unary(SERVICE + "Hello", request_serializer=pb.HelloRequest.SerializeToString,
                             response_deserializer=pb.HelloResponse.FromString) for ch in chans]  # fmt: skip
    sends: list[Any] = [ch.unary_unary(SERVICE + "Report", request_serializer=None,
                                       response_deserializer=pb.ReportResponse.FromString)
                        for ch in chans]  # fmt: skip
    try:

        async def run(a: Agent) -> None:
            hello, send = hellos[a.n % connections], sends[a.n % connections]
            nonce: str | None = None
            seq, backoff, full = 1, 0.2, False
            nxt = time.time() + (a.n % 100) / 100 / rate  # spread over the interval
            while True:
                await asyncio.sleep(max(0.0, nxt - time.time()))
                if time.time() >= t_end:
                    return
                inside = t_win <= time.time()
                try:
                    if nonce is None:
                        h = await hello(pb.HelloRequest(agent_id=a.id, targets=["t-" + a.id]),
                                        metadata=a.md, timeout=30)  # fmt: skip
                        nonce = h.nonce
                    body = a.stamp(a.full if full else a.req, seq, nonce)
                    t0 = time.monotonic()
                    resp = await send(body, metadata=a.md, timeout=30)
                    dt = time.monotonic() - t0
                except grpc.aio.AioRpcError as e:
                    key = "refused" if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else "failed"
                    counts[key] += 1
                    counts["win_" + key] += inside
                    if key == "failed" or hello_busy:  # busy: the nonce holds (as the agent)
                        nonce = None
                    nxt = time.time() + backoff
                    backoff = min(2 * backoff, 4.0)
                    continue
                nonce = resp.nonce
                if not resp.accepted:  # the verifier asks for the manifest: send it in full
                    full = True
                    continue
                full, backoff = False, 0.2
                counts["acked"] += 1
                counts["first"] += a.acked == 0
                a.acked = seq
                if t_win <= time.time() < t_end:
                    counts["win_acked"] += 1
                    lat.append(dt)
                seq += 1
                nxt += 1.0 / rate
                nxt = max(nxt, time.time() - 1.0 / rate)  # behind: no burst to catch up
                pace = min(getattr(resp, "next_report_in_s", 0.0), 30.0)  # as the agent obeys
                nxt = max(nxt, time.time() + pace * random.uniform(0.9, 1.1))  # noqa: S311

        await asyncio.gather(*(run(a) for a in agents))
    finally:
        for ch in chans:
            await ch.close()
    out.put({**counts, "lat": lat, "last": {a.id: a.acked for a in agents}})


def generator(addr: str, tag: str, k: int, rate: float, bindings: int,  # noqa: PLR0917
              ready: Any, go: Any, out: Any, hello_busy: bool = False,
              connections: int = 1) -> None:  # fmt: skip
    ready.put(os.getpid())
    t_win, t_end = go.get()
    asyncio.run(agents_main(addr, tag, k, rate, bindings, t_win, t_end, out, hello_busy,
                            connections))  # fmt: skip


def status_loop(addr: str, stop: threading.Event, lat: list[float], errors: list[str],
                period: float = 0.2) -> None:  # fmt: skip
    with grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch:
        stub = pb_grpc.VerifierServiceStub(ch)
        while not stop.is_set():
            s0 = time.monotonic()
            try:
                stub.GetRunStatus(pb.GetRunStatusRequest(name=RUN), timeout=30)
                lat.append(time.monotonic() - s0)
            except grpc.RpcError as e:
                errors.append(str(e.code()))
            stop.wait(max(0.0, period - (time.monotonic() - s0)))


FLOOR = "gRPC floor"  # --floor's arm: the same load on a servicer that only parses and acks


def echo(addr: str) -> None:
    """The floor's server: what any Python gRPC servicer of these calls pays (gRPC's sync
    server with the verifier's options and 8 workers, each request parsed, an answer
    serialized), and nothing the verifier does. Serves until SIGTERM."""
    from concurrent import futures

    from grpc_health.v1 import health, health_pb2_grpc

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # for sigwait (earlier: it dies)

    def unary(fn: Any, req: Any, resp: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
        )

    methods = {
        "Hello": unary(lambda r, c: pb.HelloResponse(nonce="0" * 32), pb.HelloRequest,
                       pb.HelloResponse),
        "Report": unary(lambda r, c: pb.ReportResponse(accepted=True, seq=r.report.seq,
                                                       nonce="0" * 32),
                        pb.ReportRequest, pb.ReportResponse),
        "RegisterRun": unary(lambda r, c: pb.RegisterRunResponse(), pb.RegisterRunRequest,
                             pb.RegisterRunResponse),
        "GetRunStatus": unary(lambda r, c: pb.GetRunStatusResponse(), pb.GetRunStatusRequest,
                              pb.GetRunStatusResponse),
    }  # fmt: skip
    server = grpc.server(futures.ThreadPoolExecutor(8),
                         options=[*wire.GRPC_OPTIONS, *wire.EXCLUSIVE_PORT])  # fmt: skip
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("verifier.api.v1.VerifierService", methods)]
    )
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    server.add_insecure_port(addr)
    server.start()
    signal.sigwait({signal.SIGTERM})
    server.stop(1).wait()


def serve(
    tmp: Path, src: Path, processes: int = 1, extra: Sequence[str] = ()
) -> tuple[str, subprocess.Popen[bytes], str]:
    tmp.mkdir()
    db, addr = str(tmp / "verifier.sqlite3"), f"127.0.0.1:{free_port()}"
    path = os.pathsep.join(
        filter(None, [str(src), str(src / "probe"), os.environ.get("PYTHONPATH")])
    )
    env = {**os.environ, "PYTHONPATH": path}  # the tree first; what was there (site dirs) after
    log = (tmp / "serve.log").open("wb")
    more = ["--processes", str(processes)] if processes > 1 else []
    cmd = [sys.executable, "-m", "servewitness", "serve", "--listen", addr, "--db", db, *more,
           *extra]  # fmt: skip
    if src == Path(FLOOR):
        cmd, env = [sys.executable, __file__, "--echo", addr], {**os.environ}
    server = subprocess.Popen([*VERIFIER_CPUS, *cmd], stdout=log, stderr=subprocess.STDOUT,
                              env=env, cwd=REPO if src == Path(FLOOR) else src)  # fmt: skip
    wait_serving(addr, server, tmp / "serve.log")
    with grpc.insecure_channel(addr) as ch:
        pb_grpc.VerifierServiceStub(ch).RegisterRun(
            pb.RegisterRunRequest(name=RUN, policy_toml=POLICY, source="bench"), timeout=30
        )
    return addr, server, db


def arm(src: Path, tmp: Path, k: int, rate: float, seconds: float, bindings: int,  # noqa: PLR0917
        status_rate: float = 5.0, hello_busy: bool = False, processes: int = 1,
        connections: int = 1, extra: Sequence[str] = ()) -> dict[str, Any]:  # fmt: skip
    addr, server, db = serve(tmp, src, processes, extra)
    ctx = mp.get_context("spawn")
    ready, go, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    gen = ctx.Process(target=generator, args=(addr, tmp.name, k, rate, bindings, ready, go, out,
                                              hello_busy, connections))  # fmt: skip
    gen.start()
    gen_pid = ready.get(timeout=120)
    warm = 3.0 + k / 100  # every agent's first report (one full manifest) is in
    t_win = time.time() + warm
    go.put((t_win, t_win + seconds))
    time.sleep(max(0.0, t_win - time.time()))
    pids = [server.pid, *children(server.pid)]  # --processes: the others are its children
    # and, unless the arm says --no-writer-process, one store writer process (counted: its CPU
    # is the verifier's)
    writer = processes > 1 and "--no-writer-process" not in extra and src != Path(FLOOR)
    if len(pids) != processes + writer:
        raise SystemExit(f"{len(pids)} verifier processes, {processes} (+{writer:d}) asked for")
    cpu0, gcpu0, m0 = sum(map(cpu_seconds, pids)), cpu_seconds(gen_pid), time.monotonic()
    stop, slat, serr = threading.Event(), [], []  # type: ignore[var-annotated]
    st = threading.Thread(target=status_loop, args=(addr, stop, slat, serr, 1 / (status_rate or 1)))
    if status_rate > 0:  # 0: the agents' reports alone (their CPU per report, unmixed)
        st.start()
    time.sleep(max(0.0, t_win + seconds - time.time()))
    elapsed = time.monotonic() - m0
    cpu, gcpu = sum(map(cpu_seconds, pids)) - cpu0, cpu_seconds(gen_pid) - gcpu0
    stop.set()
    if st.is_alive():
        st.join()
    res = out.get(timeout=120)
    gen.join(timeout=60)
    server.terminate()
    code = server.wait(timeout=60)
    missing = 0  # the floor stores nothing: nothing to check
    if src != Path(FLOOR):
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            stored = set(conn.execute("SELECT agent_id, seq FROM reports").fetchall())
        missing = sum(1 for a, last in res["last"].items() for s in range(1, last + 1)
                      if (a, s) not in stored)  # fmt: skip
    acked = res["win_acked"]
    return {
        "acked_s": acked / elapsed, "cpu_per": cpu / acked if acked else float("nan"),
        "cpu": cpu / elapsed, "gen_cpu": gcpu / elapsed, "refused": res["win_refused"],
        "failed": res["win_failed"], "none_acked": sum(1 for v in res["last"].values() if not v),
        "rep_p50": pct(res["lat"], 50), "rep_p99": pct(res["lat"], 99),
        "st_p50": pct(slat, 50), "st_p99": pct(slat, 99), "st_n": len(slat), "st_err": len(serr),
        "missing": missing, "acked_total": sum(res["last"].values()), "exit": code,
    }  # fmt: skip


def row(
    label: str, k: int, rate: float, rs: list[dict[str, Any]], base: list[dict[str, Any]]
) -> str:
    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in rs))

    def spread(key: str) -> float:  # NaN when the median is 0 (CPU below one clock tick)
        return summary([float(r[key]) for r in rs])["spread"]

    def over(a: float, b: float) -> float:
        return a / b if b else float("nan")

    pairs = list(zip(rs, base, strict=True))
    ratio = statistics.median(over(r["acked_s"], b["acked_s"]) for r, b in pairs)
    cratio = statistics.median(over(r["cpu_per"], b["cpu_per"]) for r, b in pairs)
    cpu_ms = med("cpu_per") * 1e3
    return (f"| {label} | {k} | {k * rate:.0f} | {med('acked_s'):.0f} ({spread('acked_s'):.0%}) | "
            f"{ratio:.2f}x | {cpu_ms:.3f} ({spread('cpu_per'):.0%}) | {cratio:.2f}x | "
            f"{over(2, med('cpu_per')):.0f} | {med('cpu'):.0%} | {med('gen_cpu'):.0%} | "
            f"{med('rep_p50') * 1e3:.1f} / {med('rep_p99') * 1e3:.1f} ms | "
            f"{med('st_p50') * 1e3:.1f} / {med('st_p99') * 1e3:.1f} ms ({spread('st_p99'):.0%}) | "
            f"{sum(r['refused'] for r in rs)}, {sum(r['failed'] for r in rs)}, "
            f"{sum(r['none_acked'] for r in rs)} | {sum(r['missing'] for r in rs)} |")  # fmt: skip


@contextlib.contextmanager
def held(lock: str | None) -> Iterator[None]:
    """LOCK flocked (None: nothing held)."""
    if lock is None:
        yield
        return
    with Path(lock).open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def say(r: int, label: str, offered: float, k: int, res: dict[str, Any]) -> None:
    print(f"  round {r} {label}: {k} agents: offered {offered:.0f}/s acked "
          f"{res['acked_s']:.1f}/s, verifier {res['cpu_per'] * 1e3:.3f} ms CPU per report "
          f"({res['cpu']:.0%} CPU), generator {res['gen_cpu']:.0%} CPU, Report p50 "
          f"{res['rep_p50'] * 1e3:.1f} ms p99 {res['rep_p99'] * 1e3:.1f} ms, status "
          f"p50 {res['st_p50'] * 1e3:.1f} ms p99 {res['st_p99'] * 1e3:.1f} ms "
          f"({res['st_n']} calls, {res['st_err']} errors), refused {res['refused']} "
          f"failed {res['failed']} agents with nothing acked {res['none_acked']}, "
          f"acked {res['acked_total']} missing {res['missing']} exit {res['exit']}, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--echo":
        echo(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--agents", type=int, default=500)
    ap.add_argument("--rate", type=float, default=2.0, help="reports/s per agent")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bindings", type=int, default=20)
    ap.add_argument("--status-rate", type=float, default=5.0,
                    help="GetRunStatus calls/s from a separate client (0: none)")  # fmt: skip
    ap.add_argument("--src", action="append", default=[], help="LABEL=PATH of a source tree")
    ap.add_argument("--lock", help="a file to flock for each round (a machine shared with others)")
    ap.add_argument(
        "--processes-of",
        action="append",
        default=[],
        metavar="LABEL=N",
        help="the arm LABEL's verifier serves from N processes (--processes N)",
    )
    ap.add_argument(
        "--serve-args-of",
        action="append",
        default=[],
        metavar="LABEL=ARGS",
        help="more arguments for the arm LABEL's `verifier serve` (shell words), e.g. "
        "'2 each=--no-writer-process'",
    )
    ap.add_argument(
        "--floor",
        action="store_true",
        help=f"an arm '{FLOOR}': the same load on a gRPC server that only parses and "
        "acknowledges (what any Python servicer pays; stores nothing)",
    )
    ap.add_argument(
        "--connections",
        type=int,
        default=1,
        help="TCP connections the agents share (default 1; --processes needs more)",
    )
    ap.add_argument(
        "--verifier-cpus",
        metavar="LIST",
        help="run the verifier under taskset -c LIST (pin this script elsewhere)",
    )
    ap.add_argument("--hello-after-busy", action="append", default=[], metavar="LABEL",
                    help="the arm LABEL's agents say Hello again after a busy refusal (agents "
                         "before 2026-12-04 did; they now keep their nonce)")  # fmt: skip
    _smoke.add_args(ap)
    args = ap.parse_args()
    if args.smoke:
        _smoke.begin("this tree on one process and on two (--processes 2, 2 connections), "
                     "the gRPC floor, 3 agents, 1 s, 2 bindings, the durability check",
                     ["several source trees (the same code per arm)"])  # fmt: skip
        args.agents, args.rate, args.seconds, args.rounds, args.bindings = 3, 2.0, 1.0, 1, 2
        args.src = [f"this tree={REPO}", f"2 processes={REPO}"]
        args.processes_of, args.connections, args.floor = ["2 processes=2"], 2, True
    srcs = [(s.split("=", 1)[0], Path(s.split("=", 1)[1]).resolve()) for s in args.src] or [
        ("this tree", REPO)
    ]
    if args.floor:
        srcs.append((FLOOR, Path(FLOOR)))
    print(f"{args.agents} agents x {args.rate:g} reports/s, {args.bindings} bindings each, "
          f"{args.status_rate:g} status calls/s, "
          f"{args.seconds:g} s measured, {args.rounds} rounds, arms interleaved, baseline "
          f"{srcs[0][0]}", flush=True)  # fmt: skip
    results: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in srcs}
    procs = {v.split("=", 1)[0]: int(v.split("=", 1)[1]) for v in args.processes_of}
    extras = {v.split("=", 1)[0]: shlex.split(v.split("=", 1)[1]) for v in args.serve_args_of}
    if args.verifier_cpus:
        VERIFIER_CPUS[:] = ["taskset", "-c", args.verifier_cpus]
    with tempfile.TemporaryDirectory(prefix="agents-scale-") as tmp:
        for r in range(args.rounds):
            with held(args.lock):
                order = [*srcs[r % len(srcs) :], *srcs[: r % len(srcs)]]  # rotated per round
                for label, src in order:
                    res = arm(src, Path(tmp) / f"r{r}-{label}", args.agents, args.rate,
                              args.seconds, args.bindings, args.status_rate,
                              label in args.hello_after_busy, procs.get(label, 1),
                              args.connections, extras.get(label, ()))  # fmt: skip
                    results[label].append(res)
                    say(r, label, args.agents * args.rate, args.agents, res)
    print(
        "\n| arm | agents | offered /s | acked /s (spread) | acked / baseline | verifier CPU ms "
        "per report (spread) | CPU per report / baseline | capacity on 2 cores (2 / CPU per "
        "report) | verifier CPU | generator CPU | Report p50 / p99 | status p50 / p99 "
        "(spread of p99) | refused, failed, agents never acked | acked but not stored |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    base = results[srcs[0][0]]
    for label, _ in srcs:
        print(row(label, args.agents, args.rate, results[label], base))
    lost = sum(r["missing"] for rs in results.values() for r in rs)
    print(f"\nevery acknowledged report stored: {lost == 0}")
    if lost:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
