"""What one agent report costs against the real tiny server: the sidecar's CPU budget.

The tiny CPU server is booted and serves a few requests; then, while it idles, the agent's
``collect()`` (every probed process of the tree: journals, counters, native mappings, the
runner file, and the judgement of every loaded file) is timed in these arms, interleaved,
ROUNDS times each:
  sha256sum   one `sha256sum` over the same processes' loaded files (the baseline: what a
              shell script checking hashes would spend, once)
  cold        a fresh agent: every file hashed, every RECORD parsed, everything judged
  rejudge     a warm agent whose manifest changed: cross-check from the hash cache, origins,
              shadowing, bytecode and fileless judged again (RECORD index kept)
  recheck     a warm agent at its periodic full check (every recheck_s, 5 s by default):
              cross-check from the hash cache, the manifest-only judgement reused
  report      a warm agent between full checks (what most reports cost)
The sidecar's average CPU at the default 0.5 s interval is (9 x report + recheck) / 5 s.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import print_rows, summary

from verifier.agent.runner import Agent, AgentConfig
from verifier.testing.vllm_server import VllmServer

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 5
INTERVAL_S = 0.5
RECHECK_S = 5.0


def agent(pid: int, spool: Path, recheck_s: float) -> Agent:
    return Agent(
        AgentConfig("127.0.0.1:9", "bench", "bench", spool, root_pid=pid, recheck_s=recheck_s)
    )


def timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


def main() -> None:
    with VllmServer(REPO / ".cache" / "tiny-llama", scratch_parent=REPO / ".scratch") as server, \
            tempfile.TemporaryDirectory() as tmp:  # fmt: skip
        for i in range(4):
            server.complete(f"bench {i}", max_tokens=8)
        time.sleep(2)  # the probes' sweepers have recorded everything
        spool = Path(tmp)
        warm_report = agent(server.pid, spool / "a", 3600.0)  # never due: reuses judgements
        warm_recheck = agent(server.pid, spool / "b", 0.0)  # always due: cross-check
        warm_rejudge = agent(server.pid, spool / "c", 0.0)
        for a in (warm_report, warm_recheck, warm_rejudge):
            report = a.collect()  # warm them up
        files = sorted({f.path for p in report.processes for f in p.files or () if f.sha256})
        listing = spool / "files.lst"
        listing.write_text("\0".join(files))

        def sha256sum() -> None:
            subprocess.run(f"xargs -0 sha256sum < {listing} > /dev/null", shell=True, check=True)  # noqa: S602

        def cold() -> None:
            a = agent(server.pid, spool / f"cold-{time.monotonic_ns()}", 0.0)
            a.collect()
            a.channel.close()

        def rejudge() -> None:
            for key, (digest, at, judged) in list(warm_rejudge._checked.items()):
                # as if the manifest had changed: the manifest-only part is judged again
                warm_rejudge._checked[key] = (digest, at, replace(judged, static_key=None))
            warm_rejudge.collect()

        arms = {
            "sha256sum": sha256sum,
            "cold": cold,
            "rejudge": rejudge,
            "recheck": warm_recheck.collect,
            "report": warm_report.collect,
        }
        results: dict[str, list[float]] = {k: [] for k in arms}
        for _ in range(ROUNDS):
            for name, fn in arms.items():
                results[name].append(timed(fn))
        procs = len(report.processes)
        print(
            f"agent collect() over the tiny server's {procs} processes, {len(files)} distinct "
            f"loaded files; {ROUNDS} interleaved rounds, seconds"
        )
        stats = {k: summary(v) for k, v in results.items()}
        print_rows(stats, fmt="6.3f")
        base = stats["sha256sum"]["median"]
        for k in ("cold", "rejudge", "recheck", "report"):
            print(f"  {k} / sha256sum = {stats[k]['median'] / base:.3f}")
        per_window = (RECHECK_S / INTERVAL_S - 1) * stats["report"]["median"] + stats["recheck"][
            "median"
        ]
        print(
            f"  sidecar CPU at {INTERVAL_S} s reports, recheck every {RECHECK_S} s: {per_window / RECHECK_S:.1%} of one core"
        )


if __name__ == "__main__":
    main()
