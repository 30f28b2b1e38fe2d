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

Bytecode (issue 18): every pyc a process ran is compiled from its source and compared. Over
the same processes' manifests, interleaved with the arms above (its cache emptied in "cold",
so a cold agent compiles everything):
  pyc headers      per pyc a 16-byte read of it and a stat of its source: the old default,
                   which compiled only pycs whose timestamps were suspicious (the baseline)
  compile only     compile() of each source of a pyc once (the processes share them), nothing
                   else: the floor
  bytecode cold    judge_bytecode with an empty cache: every pyc read, hashed, its source
                   read, compiled and compared (the processes share one cache, as the agent)
  bytecode cached  the same again, nothing changed: what a rejudge costs
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
from _stats import print_rows, summary

from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
from servewitness.evidence import bytecode
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.pycfile import CompileCache, read_head
from servewitness.model import FileEntry, TargetReport

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


Manifest = tuple[int, tuple[FileEntry, ...]]  # a process's pid and the files it ran


def manifests(report: TargetReport) -> list[Manifest]:
    """Each process's pid and the files it ran (a pyc its loader rejected did not)."""
    return [
        (p.key.pid, tuple(f for f in p.files or () if f.at != "rejected")) for p in report.processes
    ]


def judge_all(ran: list[Manifest], cache: CompileCache) -> None:
    """judge_bytecode over every process, one cache for all (as the agent)."""
    procfs = ProcFS()
    for pid, files in ran:

        def to_host(path: str, pid: int = pid) -> Path:
            return procfs.in_root(pid, path)

        bytecode.judge_bytecode(files, to_host, cache=cache)


def bytecode_arms(report: TargetReport) -> tuple[dict[str, Callable[[], object]], int, int]:
    """The bytecode arms over REPORT's processes, the pycs judged in all and the distinct
    sources compiled."""
    procfs = ProcFS()
    ran = manifests(report)
    pycs = [
        (procfs.in_root(pid, f.path), procfs.in_root(pid, src), src)
        for pid, files in ran
        for f in files
        if f.kind == "bytecode" and f.at == "load"
        and (src := _source(f.path)) is not None
    ]  # fmt: skip
    # One host path per source as the processes see it: the processes share those files.
    sources = sorted({src: str(host) for _, host, src in pycs}.values())

    def judge(cache: CompileCache) -> None:
        judge_all(ran, cache)

    def headers() -> None:
        for pyc, src, _ in pycs:
            try:
                read_head(pyc)
                os.stat(src)
            except OSError:
                pass

    def compile_only() -> None:
        for src in sources:
            with contextlib.suppress(OSError, SyntaxError, ValueError):
                compile(Path(src).read_bytes(), src, "exec", dont_inherit=True)

    warm = CompileCache()
    judge(warm)
    arms: dict[str, Callable[[], object]] = {
        "pyc headers": headers,
        "compile only": compile_only,
        "bytecode cold": lambda: judge(CompileCache()),
        "bytecode cached": lambda: judge(warm),
    }
    return arms, len(pycs), len(sources)


def _source(pyc: str) -> str | None:
    head, name = os.path.split(pyc)
    if os.path.basename(head) != "__pycache__":
        return None
    return os.path.join(os.path.dirname(head), name.partition(".")[0] + ".py")


def cache_bytes(report: TargetReport) -> tuple[int, int]:
    """Entries and bytes a compile cache holds once it judged REPORT."""
    cache = CompileCache()
    judge_all(manifests(report), cache)
    return len(cache), cache.footprint()


# smoke mode's stand-in target: a probed Python process (without site-packages, whose ~700
# distributions a cold agent would index: -S, the probe started by hand) that imported a few
# standard library modules, not vLLM's tree of 6,500 files
STAND_IN = """
import sys
import servewitness_probe as p
p.start()
import decimal, email.mime.text, json  # noqa: E401
print("up", flush=True)
sys.stdin.read()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds")
    _smoke.add_args(parser)
    args = parser.parse_args()
    if args.smoke:
        smoke()
        return
    _smoke.loaded_tiny_server(lambda pid: measure(pid, args.rounds))


def smoke() -> None:
    """Every arm, one round, on a stand-in probed process (STAND_IN)."""
    _smoke.begin(
        "every arm, one round, on a probed Python process (no site-packages) that imported a "
        "few standard library modules",
        [
            "vLLM's tree (three processes, 6,500 files: one cold collect alone costs ~5 s of "
            "CPU, and the benchmark collects four times cold), so its roles and runner file, "
            "and the index of installed distributions (the stand-in has no site-packages)"
        ],
    )
    _smoke.stand_in(STAND_IN, lambda pid: measure(pid, _smoke.ROUNDS))


def measure(pid: int, rounds: int) -> None:
    """Every arm over the process tree of PID, ROUNDS interleaved rounds; the report."""
    with tempfile.TemporaryDirectory() as tmp:
        spool = Path(tmp)
        warm_report = agent(pid, spool / "a", 3600.0)  # never due: reuses judgements
        warm_recheck = agent(pid, spool / "b", 0.0)  # always due: cross-check
        warm_rejudge = agent(pid, spool / "c", 0.0)
        for a in (warm_report, warm_recheck, warm_rejudge):
            report = a.collect()  # warm them up
        # the files on disk (not `-c` code, not zip members): what sha256sum can read
        files = sorted(
            {
                f.path
                for p in report.processes
                for f in p.files or ()
                if f.sha256 and os.path.isfile(f.path)
            }
        )
        listing = spool / "files.lst"
        listing.write_text("\0".join(files))

        def sha256sum() -> None:
            subprocess.run(f"xargs -0 sha256sum -- < {listing} > /dev/null", shell=True, check=True)  # noqa: S602

        def cold() -> None:
            bytecode.SHARED_CACHE.clear()  # a fresh agent process: nothing compiled yet
            a = agent(pid, spool / f"cold-{time.monotonic_ns()}", 0.0)
            a.collect()
            a.channel.close()

        def rejudge() -> None:
            for key, (digest, at, judged) in list(warm_rejudge.judged._checked.items()):
                # as if the manifest had changed: the manifest-only part is judged again
                warm_rejudge.judged._checked[key] = (digest, at, replace(judged, static_key=None))
            warm_rejudge.collect()

        pyc_arms, n_pycs, n_sources = bytecode_arms(report)
        arms = {
            "sha256sum": sha256sum,
            "cold": cold,
            "rejudge": rejudge,
            "recheck": warm_recheck.collect,
            "report": warm_report.collect,
            **pyc_arms,
        }
        results: dict[str, list[float]] = {k: [] for k in arms}
        for _ in range(rounds):
            for name, fn in arms.items():
                results[name].append(timed(fn))
        procs = len(report.processes)
        print(
            f"agent collect() over the tiny server's {procs} processes, {len(files)} distinct "
            f"loaded files; {rounds} interleaved rounds, seconds"
        )
        stats = {k: summary(v) for k, v in results.items()}
        print_rows(stats, fmt="6.3f")
        base = stats["sha256sum"]["median"]
        for k in ("cold", "rejudge", "recheck", "report"):
            print(f"  {k} / sha256sum = {stats[k]['median'] / base:.3f}")
        print(f"  bytecode: {n_pycs} loaded pycs in all processes, {n_sources} distinct")
        for k in pyc_arms:
            per = stats[k]["median"] / max(n_pycs, 1) * 1e6
            once = stats[k]["median"] / max(n_sources, 1) * 1e6
            print(f"  {k}: {per:.1f} us per loaded pyc, {once:.1f} us per distinct one")
        head = stats["pyc headers"]["median"]
        for k in ("bytecode cold", "bytecode cached"):
            print(f"  {k} / pyc headers = {stats[k]['median'] / head:.2f}")
        entries, held = cache_bytes(report)
        print(f"  compile cache after one judgement: {entries} entries, {held / 1e6:.1f} MB")
        per_window = (RECHECK_S / INTERVAL_S - 1) * stats["report"]["median"] + stats["recheck"][
            "median"
        ]
        print(
            f"  sidecar CPU at {INTERVAL_S} s reports, recheck every {RECHECK_S} s: {per_window / RECHECK_S:.1%} of one core"
        )


if __name__ == "__main__":
    main()
