"""The agent's full cold manifest against the fastest tool computing the same digest, as
whole processes (issue 21, target 4: <= 1.2x).

The file list is what a live vLLM worker tree loaded: every file on disk its probes recorded
with a sha256, and every native library mapped (the agent hashes both). Arms, each a new
process, interleaved in every round, and their ratio taken per round (pair):
  openssl  `xargs -0 -P<cores> -n 64 openssl dgst -sha256` over the list: OpenSSL's sha256
           (SHA extensions), one process per core: the baseline
  cold     a fresh `python` that imports the agent, makes an `Agent` and calls `collect()`
           once: discovery, journals, every file hashed, every RECORD parsed, every pyc
           compiled and compared, everything judged (interpreter start and imports counted),
           with an empty state directory: a first-ever start
  restart  the same with the state directory of an agent that judged these files before
           (the common case: the agent restarts, vLLM runs on): every file is still read
           and hashed, but each pyc's compile verdict is found by content
           (servewitness/evidence/verdicts.py) and each process's static judgement by the
           process and what it loaded (servewitness/evidence/judgements.py)
  rejudge  the restart with the judgement store off (compile verdicts kept): every file
           classified again, as every restart did before the store; restart / rejudge is
           what the store buys
  floor    what any agent in Python pays before it judges anything: a fresh `python` that
           imports the agent (its transport included) and hashes the same list with
           hashlib on as many threads as the agent's hasher (no journals, no judgement);
           floor / openssl is how close to the target a Python agent can come
  cold @C, restart @C  (with --against TREE) the same two with the agent of TREE, checked
           out at commit C (its restart with a state directory of its own): what a change
           bought, priced in the same run
Every agent arm loads its own modules compiled (a private PYTHONPYCACHEPREFIX, filled by the
warm-up run, PYTHONDONTWRITEBYTECODE ignored), as an agent installed from its wheel does; before
this, a shell that set PYTHONDONTWRITEBYTECODE (CI's, this machine's) had every arm compile
the agent's ~60 modules on every start (~0.2 s of CPU).
Page cache warm for both arms (the comparison is CPU work), then, where this process may
(root), with the caches dropped before every arm (`echo 3 > /proc/sys/vm/drop_caches`: the
reads, the interpreter's own imports and openssl's binary come from disk).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
from _stats import print_rows, summary

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 5
DROPPED_ROUNDS = 3
DROP = Path("/proc/sys/vm/drop_caches")

# The cold arm: what a freshly started agent computes for its first report.
# argv: the target's pid, the agent's state directory (its spool: where a previous agent
# kept its compile verdicts and judgements) or "-": a new empty one (a first-ever start), and
# "judgements" or "no-judgements" (the judgement store on or off)
COLD = """
import dataclasses, sys, tempfile
from pathlib import Path
from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
# (an --against tree older than the judgement store has no such option)
has = {f.name for f in dataclasses.fields(AgentConfig)}
store = {"judgement_cache": sys.argv[3] == "judgements"} if "judgement_cache" in has else {}
with tempfile.TemporaryDirectory() as tmp:
    state = Path(sys.argv[2]) if sys.argv[2] != "-" else Path(tmp)
    config = AgentConfig("127.0.0.1:9", "bench", "bench", state, root_pid=int(sys.argv[1]),
                         docker_socket=None, **store)
    agent = Agent(config)
    report = agent.collect()
    agent.channel.close()
files = sum(len(p.files or ()) for p in report.processes)
import servewitness
print(len(report.processes), files, servewitness.__file__, flush=True)
"""

# The floor arm: argv: the file list (NUL-separated); the agent's imports, then its hashing
# alone (as servewitness.evidence.hashing.Hasher reads: 1 MiB at a time, one thread per core)
FLOOR = """
import hashlib, os, sys, threading
from servewitness.agent.runner import Agent  # noqa: F401  (what the agent imports)
paths = [p for p in open(sys.argv[1], "rb").read().split(b"\\0") if p]
take = iter(paths)
lock = threading.Lock()
def work():
    while True:
        with lock:
            path = next(take, None)
        if path is None:
            return
        h = hashlib.sha256()
        fd = os.open(path, os.O_RDONLY)
        try:
            while chunk := os.read(fd, 1 << 20):
                h.update(chunk)
        finally:
            os.close(fd)
        h.hexdigest()
threads = [threading.Thread(target=work) for _ in range(max(2, os.cpu_count() or 2))]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""

# smoke mode's stand-in target (as agent_collect.py's): a probed Python process without
# site-packages that imported a few standard library modules
STAND_IN = """
import sys
import servewitness_probe as p
p.start()
import decimal, email.mime.text, json  # noqa: E401
print("up", flush=True)
sys.stdin.read()
"""


def loaded_files(pid: int) -> tuple[list[str], int, int]:
    """The distinct files on disk the tree of PID loaded (probe records with a sha256) or
    maps (native libraries): what the cold manifest hashes. Also how many of each."""
    from servewitness.agent.config import AgentConfig
    from servewitness.agent.runner import Agent

    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(io.StringIO()):
        # (stderr: the agent's warning that its verifier address is insecure; it sends nothing)
        config = AgentConfig(
            "127.0.0.1:9", "bench", "bench", Path(tmp), root_pid=pid, docker_socket=None
        )
        agent = Agent(config)
        report = agent.collect()
        agent.channel.close()
    recorded = {
        f.path
        for p in report.processes
        for f in p.files or ()
        if f.sha256 and os.path.isfile(f.path)
    }
    native = {m.path for p in report.processes for m in p.native_mappings if os.path.isfile(m.path)}
    return sorted(recorded | native), len(recorded), len(native - recorded)


def drop_caches() -> bool:
    """Drop the page cache (root only); whether it was dropped."""
    try:
        os.sync()
        DROP.write_text("3\n")
    except OSError:
        return False
    return True


def arms(pid: int, listing: Path, against: Path | None) -> dict[str, Callable[[], None]]:
    cores = str(os.cpu_count() or 2)

    def openssl() -> None:
        with listing.open("rb") as fh:
            subprocess.run(
                ["xargs", "-0", f"-P{cores}", "-n", "64", "openssl", "dgst", "-sha256"],
                stdin=fh, stdout=subprocess.DEVNULL, check=True,
            )  # fmt: skip

    pycache = listing.parent / "pycache"
    env = dict(
        os.environ,
        PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'probe'}",
        PYTHONPYCACHEPREFIX=str(pycache),
    )
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    def floor() -> None:
        subprocess.run(
            [sys.executable, "-c", FLOOR, str(listing)], env=env, cwd=listing.parent, check=True
        )

    def cold(tree: Path, state: Path | None = None, judgements: bool = True) -> Callable[[], None]:
        env = dict(
            os.environ,
            PYTHONPATH=f"{tree}{os.pathsep}{tree / 'probe'}",
            PYTHONPYCACHEPREFIX=str(pycache),  # the agent's modules compiled once, at warm-up
        )
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        store = "judgements" if judgements else "no-judgements"
        argv = [sys.executable, "-c", COLD, str(pid), str(state or "-"), store]

        def run() -> None:
            # Run from the listing's folder: `python -c` puts its working directory first on
            # sys.path, so from a checkout's root every arm imported that checkout's agent,
            # whatever PYTHONPATH named (an --against arm measured this tree, not its own).
            out = subprocess.run(
                argv, env=env, cwd=listing.parent, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, check=True, text=True,
            ).stdout  # fmt: skip
            ran = Path(out.split()[-1]).resolve()
            if not ran.is_relative_to(tree.resolve()):
                raise RuntimeError(f"the arm of {tree} ran the agent of {ran}")

        return run

    # "restart": the state directory of an agent that already judged these files (its first
    # run, at warm-up, fills it); "rejudge" shares it with its judgement store off
    # run, at warm-up, fills it); every later run finds its compile verdicts there
    state = listing.parent / "state"
    state.mkdir()
    out = {
        "openssl": openssl,
        "cold": cold(REPO),
        "restart": cold(REPO, state),
        "rejudge": cold(REPO, state, judgements=False),
        "floor": floor,
    }
    if against is not None:
        other = commit(against)
        out[f"cold @{other}"] = cold(against)
        # its own state directory: the store's format and its judging code are that tree's
        (listing.parent / "state-against").mkdir()
        out[f"restart @{other}"] = cold(against, listing.parent / "state-against")
    return out


def timed(fn: Callable[[], None], drop: bool) -> tuple[float, float]:
    """Wall seconds of FN, and the CPU seconds (user + system) of the processes it waited for
    (theirs and their children's: openssl under xargs, the agent's compile helpers)."""
    if drop:
        drop_caches()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


Results = dict[str, list[float]]


def paired(fns: dict[str, Callable[[], None]], rounds: int, drop: bool) -> tuple[Results, Results]:
    """ROUNDS rounds, the arms alternating which goes first: wall and CPU seconds per arm and
    round."""
    wall: Results = {k: [] for k in fns}
    cpu: Results = {k: [] for k in fns}
    names = list(fns)
    for i in range(rounds):
        for name in names if i % 2 == 0 else reversed(names):
            w, c = timed(fns[name], drop)
            wall[name].append(w)
            cpu[name].append(c)
    return wall, cpu


def report(title: str, both: tuple[Results, Results]) -> None:
    results, cpu = both
    print(f"{title}: CPU seconds (user + system, the arm's processes)")
    print_rows({k: summary(v) for k, v in cpu.items()}, fmt="6.3f")
    for arm in ("cold", "restart", "rejudge", "floor"):
        ratio(cpu, arm, "openssl", "", "CPU")
    ratio(cpu, "restart", "floor", " (the agent's own work over the floor)", "CPU")
    ratio(cpu, "restart", "rejudge", " (what the judgement store buys)", "CPU")
    for k in [k for k in cpu if "@" in k]:
        ratio(cpu, k.split(" @")[0], k, " (this tree against the other, the same arm)", "CPU")
    print(f"{title}: wall seconds")
    print_rows({k: summary(v) for k, v in results.items()}, fmt="6.3f")
    others = [k for k in results if "@" in k]
    for arm, base in [
        ("cold", "openssl"),
        ("restart", "openssl"),
        ("rejudge", "openssl"),
        ("floor", "openssl"),
        *[(k, "openssl") for k in others],
    ]:
        ratio(results, arm, base, " (target <= 1.2)" if "@" not in arm else "")
    ratio(results, "restart", "rejudge", "")
    for k in [k for k in results if "@" in k]:
        ratio(results, k.split(" @")[0], k, "")


def ratio(results: Results, arm: str, base: str, note: str, what: str = "wall") -> None:
    """ARM / BASE per pair (the same round): a row (median, min, max, spread), then the pairs."""
    ratios = [a / b for a, b in zip(results[arm], results[base], strict=True)]
    print_rows({f"{arm} / {base}, {what}": summary(ratios)}, fmt="6.3f")
    print(f"    per pair: {', '.join(f'{x:.2f}' for x in ratios)}{note}")


def measure(pid: int, rounds: int, dropped_rounds: int, against: Path | None = None) -> None:
    files, recorded, native = loaded_files(pid)
    size = sum(os.path.getsize(f) for f in files)
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "files.lst"
        listing.write_bytes(b"\0".join(os.fsencode(f) for f in files))
        fns = arms(pid, listing, against)
        for fn in fns.values():
            fn()  # warm the page cache (and check that both run)
        print(
            f"{len(files)} files ({recorded} recorded by the probes, {native} more mapped "
            f"native), {size / 1e6:.0f} MB; {os.cpu_count()} cores; commit {commit()}"
        )
        if rounds:
            report(f"page cache warm, {rounds} paired rounds", paired(fns, rounds, False))
        if dropped_rounds and drop_caches():
            title = f"page cache dropped before every arm, {dropped_rounds} paired rounds"
            report(title, paired(fns, dropped_rounds, True))
        elif dropped_rounds:
            print("page cache dropped: skipped (cannot write /proc/sys/vm/drop_caches)")


def commit(tree: Path = REPO) -> str:
    """TREE's commit (short), "+dirty" when tracked files differ from it."""
    out = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    dirty = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    return out.stdout.strip() + ("+dirty" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="paired rounds, cache warm")
    parser.add_argument(
        "--dropped-rounds", type=int, default=DROPPED_ROUNDS, help="paired rounds, cache dropped"
    )
    parser.add_argument(
        "--against",
        type=Path,
        help="another checkout (a git worktree of an earlier commit): its first start and its "
        "restart are two more arms, to price a change in the same run",
    )
    _smoke.add_args(parser)
    args = parser.parse_args()
    if args.smoke:
        smoke()
        return
    _smoke.loaded_tiny_server(
        lambda pid: measure(pid, args.rounds, args.dropped_rounds, args.against)
    )


def smoke() -> None:
    """Every arm, one round, cache warm, on a stand-in probed process (STAND_IN)."""
    _smoke.begin(
        "every arm (a fresh agent process, empty and kept state, parallel openssl), one paired round, page cache "
        "warm, on a probed Python process (no site-packages) that imported a few standard "
        "library modules",
        [
            "vLLM's tree (three processes, 6,500 files, RECORDs of ~180 distributions: a cold "
            "agent costs seconds of CPU on it)",
            "the rounds with the page cache dropped (they would slow every other test)",
        ],
    )
    _smoke.stand_in(STAND_IN, lambda pid: measure(pid, _smoke.ROUNDS, 0))


if __name__ == "__main__":
    main()
