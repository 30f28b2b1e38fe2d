"""Verifier replicas on one PostgreSQL: reports/s acknowledged by one `verifier serve` and by
two sharing one database (server/follow.py), at the same offered load per verifier, as a
ratio to one.

Method. Each arm starts a fresh database on one throwaway PostgreSQL server (Debian's
package, servewitness/testing/postgres.py; or the databases given by ``--pg-dbs``), N
verifiers (`verifier serve --db URL`, loopback TCP, their defaults) and N load generators
(bench/agents_scale.py's: K simulated agents each, asyncio over grpc.aio in one process,
every agent RATE reports/s with BINDINGS request bindings, waiting for each acknowledgement,
backing off and saying Hello again on any error), generator i reporting to verifier i: K
agents per verifier, as a Service would spread them. A status client calls GetRunStatus
STATUS_RATE times a second, round robin over the verifiers. Arms "1 verifier" and "2
verifiers" alternate over ROUNDS rounds (the order rotated each round); each arm's spread
over rounds is its noise floor, and the ratio is the median of the per-round ratios of
acknowledged reports/s to the 1-verifier arm of the same round.

Checked after each arm, before it counts: every verifier lists every agent's target (what one
knows, the others know: the follower), and every (agent, seq) acknowledged is stored (1..last
acknowledged seq of every agent), whichever verifier acknowledged it.

What it prices on a 2-core machine: the replicas, PostgreSQL and the load generators share
the same two cores, so "2 verifiers" there measures what a second replica costs (following
the other's reports, contention on one database lock), not what it adds on two more cores.

Usage: bench/replicas_scale.py [--agents 500] [--rate 1] [--seconds 10] [--rounds 3]
                               [--bindings 20] [--status-rate 5] [--replicas 1,2]
                               [--pg-dbs URL,URL,...] [--cpus-per-verifier N]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
from agents_scale import RUN, cpu_seconds, generator, pct, status_loop
from load_test import POLICY, free_port, wait_serving

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.server.db import open_database
from servewitness.testing.postgres import PostgresServer

REPO = Path(__file__).resolve().parent.parent


CPUS_PER_VERIFIER = 0  # --cpus-per-verifier: 0, not pinned


def serve(tmp: Path, url: str, i: int) -> tuple[str, subprocess.Popen[bytes]]:
    addr = f"127.0.0.1:{free_port()}"
    log = (tmp / f"serve-{i}.log").open("wb")
    n = CPUS_PER_VERIFIER
    pin = ["taskset", "-c", f"{i * n}-{(i + 1) * n - 1}"] if n else []
    server = subprocess.Popen(
        [*pin, sys.executable, "-m", "servewitness", "serve", "--listen", addr, "--db", url,
         "--signing-key", str(tmp / "ledger.key")],
        stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
    )  # fmt: skip
    wait_serving(addr, server, tmp / f"serve-{i}.log")
    return addr, server


def targets(addr: str) -> set[str]:
    with grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch:
        got = pb_grpc.VerifierServiceStub(ch).ListTargets(pb.ListTargetsRequest(), timeout=60)
    return {t.target for t in got.targets}


def status_round_robin(
    addrs: list[str], stop: threading.Event, lat: list[float], errors: list[str], period: float
) -> None:
    """agents_scale.status_loop over each verifier in turn (one thread each, the period
    multiplied so the total rate is the one asked for)."""
    threads = [
        threading.Thread(target=status_loop, args=(a, stop, lat, errors, period * len(addrs)))
        for a in addrs
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@dataclass(frozen=True)
class Load:
    agents: int  # per verifier
    rate: float  # reports/s per agent
    seconds: float  # measured
    bindings: int  # per report
    status_rate: float  # GetRunStatus calls/s, over all verifiers


def checked(
    addrs: list[str], servers: list[subprocess.Popen[bytes]], url: str, results: list[Any]
) -> tuple[bool, int, int]:
    """After the load: whether every verifier lists every agent's target, how many
    acknowledged (agent, seq) are not stored, the worst exit code of the verifiers."""
    want = {"t-" + a for r in results for a, n in r["last"].items() if n}  # stored: known
    # what one verifier acknowledged, every verifier knows (following: within a poll or two)
    deadline = time.monotonic() + 30
    seen = [targets(a) >= want for a in addrs]
    while not all(seen) and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = [targets(a) >= want for a in addrs]
    codes = []
    for s in servers:
        s.terminate()
        codes.append(s.wait(timeout=60))
    db = open_database(url, read_only=True)
    try:
        stored = {(str(a), int(s)) for a, s in db.execute("SELECT agent_id, seq FROM reports")}
    finally:
        db.close()
    last = {a: n for r in results for a, n in r["last"].items()}
    missing = sum(1 for a, n in last.items() for s in range(1, n + 1) if (a, s) not in stored)
    return all(seen), missing, max(codes)


def start(tmp: Path, url: str, replicas: int, load: Load) -> tuple[list[str], list[Any], Any]:
    """N verifiers on URL, the run registered, and one load generator per verifier, started
    and waiting for the word: (addresses, servers, (generators, their pids, queues))."""
    keygen = [sys.executable, "-m", "servewitness", "keygen", "--out", str(tmp / "ledger.key")]
    subprocess.run(keygen, check=True, capture_output=True, cwd=REPO)
    servers = [serve(tmp, url, i) for i in range(replicas)]
    addrs = [a for a, _ in servers]
    with grpc.insecure_channel(addrs[0]) as ch:
        pb_grpc.VerifierServiceStub(ch).RegisterRun(
            pb.RegisterRunRequest(name=RUN, policy_toml=POLICY, source="bench"), timeout=30
        )
    ctx = mp.get_context("spawn")
    ready, go, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    gens = [
        ctx.Process(
            target=generator,
            args=(a, f"{tmp.name}-v{i}", load.agents, load.rate, load.bindings, ready, go, out),
        )
        for i, a in enumerate(addrs)
    ]
    for g in gens:
        g.start()
    pids = [ready.get(timeout=120) for _ in gens]
    return addrs, [s for _, s in servers], (gens, pids, go, out)


def arm(tmp: Path, url: str, replicas: int, load: Load) -> dict[str, Any]:
    tmp.mkdir()
    addrs, servers, (gens, gen_pids, go, out) = start(tmp, url, replicas, load)
    warm = 3.0 + load.agents * replicas / 100  # every agent's first report is in
    t_win = time.time() + warm
    for _ in gens:
        go.put((t_win, t_win + load.seconds))
    time.sleep(max(0.0, t_win - time.time()))
    cpu0 = [cpu_seconds(s.pid) for s in servers]
    gcpu0, m0 = sum(cpu_seconds(p) for p in gen_pids), time.monotonic()
    stop, slat, serr = threading.Event(), [], []  # type: ignore[var-annotated]
    period = 1 / (load.status_rate or 1)
    st = threading.Thread(target=status_round_robin, args=(addrs, stop, slat, serr, period))
    if load.status_rate > 0:
        st.start()
    time.sleep(max(0.0, t_win + load.seconds - time.time()))
    elapsed = time.monotonic() - m0
    cpus = [(cpu_seconds(s.pid) - c) / elapsed for s, c in zip(servers, cpu0, strict=True)]
    gcpu = (sum(cpu_seconds(p) for p in gen_pids) - gcpu0) / elapsed
    stop.set()
    if st.is_alive():
        st.join()
    results = [out.get(timeout=120) for _ in gens]
    for g in gens:
        g.join(timeout=60)
    all_seen, missing, code = checked(addrs, servers, url, results)
    acked = sum(r["win_acked"] for r in results)
    lat = [x for r in results for x in r["lat"]]
    return {
        "acked_s": acked / elapsed, "per_verifier_s": acked / elapsed / replicas,
        "cpu_per": sum(cpus) * elapsed / acked if acked else float("nan"),
        "cpu": cpus, "gen_cpu": gcpu,
        "refused": sum(r["win_refused"] for r in results),
        "failed": sum(r["win_failed"] for r in results),
        "none_acked": sum(1 for r in results for v in r["last"].values() if not v),
        "rep_p50": pct(lat, 50), "rep_p99": pct(lat, 99), "st_p50": pct(slat, 50),
        "st_p99": pct(slat, 99), "st_n": len(slat), "st_err": len(serr), "missing": missing,
        "all_seen": all_seen, "exit": code,
    }  # fmt: skip


def spread(values: list[float]) -> float:
    return float((max(values) - min(values)) / statistics.median(values))


def say(r: int, n: int, k: int, rate: float, res: dict[str, Any]) -> None:
    cpu = ", ".join(f"{c:.0%}" for c in res["cpu"])
    print(f"  round {r} {n} verifier(s): {k * n} agents offered {k * n * rate:.0f}/s acked "
          f"{res['acked_s']:.1f}/s ({res['per_verifier_s']:.1f}/s per verifier), "
          f"{res['cpu_per'] * 1e3:.3f} ms verifier CPU per report, verifiers' CPU {cpu}, "
          f"generators {res['gen_cpu']:.0%}, Report p50 {res['rep_p50'] * 1e3:.1f} ms p99 "
          f"{res['rep_p99'] * 1e3:.1f} ms, status p50 {res['st_p50'] * 1e3:.1f} ms p99 "
          f"{res['st_p99'] * 1e3:.1f} ms ({res['st_n']} calls, {res['st_err']} errors), "
          f"refused {res['refused']} failed {res['failed']} never acked {res['none_acked']}, "
          f"every target on every verifier {res['all_seen']}, missing {res['missing']}, "
          f"exit {res['exit']}, load average {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip


@contextlib.contextmanager
def databases(given: str | None, count: int) -> Iterator[list[str]]:
    if given:
        urls = given.split(",")
        if len(urls) < count:
            raise SystemExit(f"--pg-dbs: {count} databases needed (one per arm and round)")
        yield urls
        return
    with PostgresServer() as pg:
        yield [pg.createdb(f"replicas{i}") for i in range(count)]


def pin_rest(n: int, verifiers: int) -> str:
    """Pin this process (and so PostgreSQL and the generators it starts) to the CPUs after
    VERIFIERS verifiers' N each; what is pinned where, said."""
    global CPUS_PER_VERIFIER  # noqa: PLW0603 - read by serve(), set once here
    CPUS_PER_VERIFIER = n
    if not n:
        return f"nothing pinned ({os.cpu_count()} CPUs shared)"
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < n * verifiers + 2 or cpus[: n * verifiers] != list(range(n * verifiers)):
        raise SystemExit(
            f"--cpus-per-verifier {n}: CPUs 0..{n * verifiers + 1} needed, have {cpus}"
        )
    rest = cpus[n * verifiers :]
    os.sched_setaffinity(0, rest)
    return (f"verifier i on CPUs {n}i..{n}i+{n - 1}, PostgreSQL, generators and this script on "
            f"CPUs {rest[0]}-{rest[-1]}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--agents", type=int, default=500, help="agents per verifier")
    ap.add_argument("--rate", type=float, default=1.0, help="reports/s per agent")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bindings", type=int, default=20)
    ap.add_argument("--status-rate", type=float, default=5.0, help="GetRunStatus calls/s")
    ap.add_argument("--replicas", default="1,2", help="the arms: verifiers per arm, baseline first")
    ap.add_argument("--pg-dbs", help="fresh PostgreSQL databases to use (one per arm and round)")
    ap.add_argument(
        "--cpus-per-verifier",
        type=int,
        default=0,
        help="pin verifier i to CPUs i*N..(i+1)*N-1, and everything else (PostgreSQL, the "
        "load generators, this script) to the CPUs after them (default 0: nothing pinned)",
    )
    _smoke.add_args(ap)
    args = ap.parse_args()
    if args.smoke:
        _smoke.begin("1 and 2 verifiers, 3 agents each, 1 s, 2 bindings, the checks",
                     ["agents at scale (500 per verifier)", "more than one round"])  # fmt: skip
        args.agents, args.rate, args.seconds, args.rounds, args.bindings = 3, 2.0, 1.0, 1, 2
    arms = [int(n) for n in args.replicas.split(",")]
    pinned = pin_rest(args.cpus_per_verifier, max(arms))
    print(f"{args.agents} agents per verifier x {args.rate:g} reports/s, {args.bindings} "
          f"bindings each, {args.status_rate:g} status calls/s, {args.seconds:g} s measured, "
          f"{args.rounds} rounds, arms {arms} interleaved, baseline {arms[0]} verifier(s), "
          f"one PostgreSQL; {pinned}", flush=True)  # fmt: skip
    results: dict[int, list[dict[str, Any]]] = {n: [] for n in arms}
    load = Load(args.agents, args.rate, args.seconds, args.bindings, args.status_rate)
    with (
        databases(args.pg_dbs, args.rounds * len(arms)) as urls,
        tempfile.TemporaryDirectory(prefix="replicas-scale-") as tmp,
    ):
        fresh = iter(urls)
        for r in range(args.rounds):
            for n in [*arms[r % len(arms) :], *arms[: r % len(arms)]]:
                res = arm(Path(tmp) / f"r{r}-n{n}", next(fresh), n, load)
                results[n].append(res)
                say(r, n, args.agents, args.rate, res)
    print(
        "\n| verifiers | agents | offered /s | acked /s (spread) | acked / 1 verifier | per "
        "verifier /s | verifier CPU ms per report (spread) | status p50 / p99 | refused, "
        "failed, never acked | every target on every verifier | acked but not stored |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    base = results[arms[0]]
    for n in arms:
        rs = results[n]
        ratio = statistics.median(
            r["acked_s"] / b["acked_s"] for r, b in zip(rs, base, strict=True)
        )
        acked = [r["acked_s"] for r in rs]
        cpu = [r["cpu_per"] for r in rs]
        print(f"| {n} | {args.agents * n} | {args.agents * n * args.rate:.0f} | "
              f"{statistics.median(acked):.0f} ({spread(acked):.0%}) | {ratio:.2f}x | "
              f"{statistics.median(acked) / n:.0f} | {statistics.median(cpu) * 1e3:.3f} "
              f"({spread(cpu):.0%}) | {statistics.median(r['st_p50'] for r in rs) * 1e3:.1f} / "
              f"{statistics.median(r['st_p99'] for r in rs) * 1e3:.1f} ms | "
              f"{sum(r['refused'] for r in rs)}, {sum(r['failed'] for r in rs)}, "
              f"{sum(r['none_acked'] for r in rs)} | {all(r['all_seen'] for r in rs)} | "
              f"{sum(r['missing'] for r in rs)} |")  # fmt: skip
    ok = all(r["all_seen"] and not r["missing"] for rs in results.values() for r in rs)
    print(f"\nevery acknowledged report stored and every target on every verifier: {ok}")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
