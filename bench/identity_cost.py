"""What recording and judging each file's identity costs (issue 18, classes 2 and 4).

Probe: every ``load`` record now carries the file's identity from a ``stat`` right after the
read. Arms, interleaved over ROUNDS rounds, each importing N fresh small modules (removed from
``sys.modules`` before every round) through the probe's wrapped loader:
  pyc, no identity      imports from bytecode, the probe's record without the stat
  pyc, identity         the same, with it (what ships)
  source, no identity   imports from source (no pyc), without the stat
  source, identity      the same, with it
  record, no identity   the probe's work for one read alone (``_on_read``: hash, record,
                        journal write), without the stat
  record, identity      the same, with it
  stat                  one os.stat of a module file (the floor of the extra work)
ns per import (or per record); the difference between the arms of a pair is the stat's cost.

Agent: on a live process (a Python child that imported torch, or the standard library's
heavier modules when torch is absent), interleaved over ROUNDS rounds:
  cross-check, without  ``cross_check`` of every manifest file, hash cache warm, the new rule
                        (``changed_after``) replaced by one that says nothing
  cross-check, with     the same with the rule, the process's generated dirs and a fresh
                        memory of vouched files (what ships: the worst case, nothing vouched)
  native, without       ``native_mappings`` as before (no start time, no memory)
  native, with          with the start time, the generated dirs and the memory
ms per call.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
from _imports import import_all, modules
from _stats import interleaved, print_rows, summary

N = 200  # modules per round
ROUNDS = 31
AGENT_ROUNDS = 21


def probe_arms(tmp: Path) -> None:
    os.environ["VERIFIER_PROBE_DIR"] = str(tmp / "probe")
    sys.dont_write_bytecode = True  # the source arm must stay source
    from servewitness_probe import _core, _files, _imports

    _core.state("bench")
    _imports.install()  # the wrapped loader; no sweeper thread (no concurrent hashing)
    real_stat = _files.identity
    pyc = modules(tmp, "pycmod", True, N)
    src = modules(tmp, "srcmod", False, N)
    one = str(tmp / "srcmod" / "srcmod_0.py")

    def without(run: Callable[[], float]) -> Callable[[], float]:
        def arm() -> float:
            _files.identity = lambda path: None
            try:
                return run()
            finally:
                _files.identity = real_stat

        return arm

    data = Path(one).read_bytes()

    def record_ns() -> float:
        t0 = time.perf_counter_ns()
        for _ in range(N):
            _imports._on_read("srcmod_0", None, one, data)
        return (time.perf_counter_ns() - t0) / N

    def stat_ns() -> float:
        t0 = time.perf_counter_ns()
        for _ in range(N):
            os.stat(one)
        return (time.perf_counter_ns() - t0) / N

    arms: dict[str, Callable[[], float]] = {
        "pyc, no identity": without(import_all(pyc)),
        "pyc, identity": import_all(pyc),
        "source, no identity": without(import_all(src)),
        "source, identity": import_all(src),
        "record, no identity": without(record_ns),
        "record, identity": record_ns,
        "stat": stat_ns,
    }
    s = interleaved(arms, ROUNDS)
    print(f"probe: {ROUNDS} interleaved rounds x {N} imports, ns per import")
    print_rows(s)
    for kind in ("pyc", "source", "record"):
        a, b = s[f"{kind}, no identity"]["median"], s[f"{kind}, identity"]["median"]
        print(f"  {kind}: identity adds {b - a:+.0f} ns ({(b - a) / a:+.1%})")


CHILD = """
import sys
try:
    if SMOKE:
        raise ImportError("smoke: the standard library's modules, not torch's seconds")
    import torch  # noqa: F401  (hundreds of files, dozens of native libraries)
except ImportError:
    import asyncio, decimal, email.mime.text, http.client, json, sqlite3, ssl, xml.dom.minidom
    import unittest, logging.handlers, multiprocessing  # noqa: E401
print("up", flush=True)
sys.stdin.read()
"""


def agent_arms(tmp: Path) -> None:
    from servewitness.evidence import judge as J
    from servewitness.evidence.hashing import Hasher
    from servewitness.evidence.native import NativeMemory, native_mappings
    from servewitness.evidence.process import read_process
    from servewitness.evidence.procfs import ProcFS
    from servewitness.model import ProcessKey

    env = dict(os.environ, VERIFIER_PROBE_DIR=str(tmp / "agent-probe"), VERIFIER_PROBE_EARLY="1")
    child = f"SMOKE = {SMOKE}\n" + CHILD
    proc = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        time.sleep(2.5)  # the sweeper's passes: every file hashed and recorded
        procfs = ProcFS()
        ev = read_process(procfs, proc.pid)
        assert ev.probe is not None
        files, start = ev.probe.files, ev.identity.start_time
        gen = J.generated_dirs(procfs, proc.pid)
        key = ProcessKey(ev.identity.boot_id, proc.pid, ev.identity.start_ticks)
        hasher, memory = Hasher(), NativeMemory()
        real_rule = J.changed_after

        def cross_without() -> object:
            J.changed_after = lambda *a, **k: None
            try:
                return J.cross_check(procfs, proc.pid, files, hasher, start_time=start)
            finally:
                J.changed_after = real_rule

        def cross_with() -> object:
            g = J.generated_dirs(procfs, proc.pid)
            return J.cross_check(
                procfs, proc.pid, files, hasher, start_time=start, generated=g, vouched=set()
            )

        def native_without() -> object:
            return native_mappings(procfs, proc.pid, hasher)

        def native_with() -> object:
            got = native_mappings(procfs, proc.pid, hasher, start_time=start, generated=gen)
            return memory.check(key, got)

        arms = {
            "cross-check, without": cross_without,
            "cross-check, with": cross_with,
            "native, without": native_without,
            "native, with": native_with,
        }
        for arm in arms.values():
            arm()  # warm: the hash cache
        results: dict[str, list[float]] = {k: [] for k in arms}
        for _ in range(AGENT_ROUNDS):
            for name, arm in arms.items():
                t0 = time.perf_counter()
                arm()
                results[name].append((time.perf_counter() - t0) * 1e3)
        maps = len(native_without())  # type: ignore[arg-type]
        print(f"agent: {len(files)} manifest files, {maps} native mappings, "
              f"{AGENT_ROUNDS} interleaved rounds, ms per call")  # fmt: skip
        s = {k: summary(v) for k, v in results.items()}
        print_rows(s, fmt="7.3f")
        for what in ("cross-check", "native"):
            a, b = s[f"{what}, without"]["median"], s[f"{what}, with"]["median"]
            print(f"  {what}: {b - a:+.3f} ms per call ({(b - a) / a:+.1%})")
    finally:
        proc.communicate(timeout=30)


SMOKE = False


def main() -> None:
    global N, ROUNDS, AGENT_ROUNDS, SMOKE  # the arms read them
    if _smoke.parse(__doc__).smoke:
        _smoke.begin(
            "every arm, 10 modules per import round, the agent's on a child that imports "
            "the standard library's heavier modules",
            ["the agent arms on a process that imported torch (the full run's, if installed)"],
        )
        N, ROUNDS, AGENT_ROUNDS, SMOKE = 10, _smoke.ROUNDS, _smoke.ROUNDS, True
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        agent_arms(tmp)  # first: the probe arms below start a probe in this process
        probe_arms(tmp)


if __name__ == "__main__":
    main()
