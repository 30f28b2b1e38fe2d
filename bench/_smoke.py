"""The benchmarks' smoke mode (``--smoke``), the one way every script in bench/ has it.

Why: a benchmark that nothing runs rots; an API change that breaks it goes unseen until the
next ``make bench``. CI runs every script's smoke mode (``tests/test_bench_smoke.py``, in
``make test``), and ``make bench-smoke`` runs that same test file by hand: one set of checks
(exit 0, every line marked, the rows parse back, the ratio and noise floor present), not a
second, laxer runner.

What smoke mode is: ROUNDS round, each script's smallest inputs, the same code paths (the
measured function, its baseline, the statistics, the report's formatting). Its numbers are
NOT results: every line a script prints in smoke mode starts with MARK, so none can be
mistaken for (or copied into) BENCHMARKS.md. A script that needs a live vLLM server boots
none in smoke mode: it takes the URL and API server pid of a running one (``--url``,
``--pid``). What a script's smoke does not cover it says, on a ``not covered:`` line.

Stdlib only at import time: bench/gpu's scripts (stdlib only, run on the device) import it
only when ``--smoke`` is given.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

FLAG = "--smoke"
ROUNDS = 1
MARK = "SMOKE| "
BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
# The scripts whose smoke mode needs a running vLLM server (--url and --pid).
LIVE = frozenset(
    {
        "compare_boots.py",
        "hash_scan.py",
        "server_throughput.py",
        "gpu/overhead.py",
        "gpu/validate.py",
    }
)


class _Marked(io.TextIOBase):
    """A text stream that writes MARK at the start of every line to OUT."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.at_start = True

    def write(self, s: str) -> int:
        for piece in s.splitlines(keepends=True):
            if self.at_start:
                self.out.write(MARK)
            self.out.write(piece)
            self.at_start = piece.endswith("\n")
        return len(s)

    def flush(self) -> None:
        self.out.flush()


def requested(argv: Sequence[str] | None = None) -> bool:
    """Whether ``--smoke`` is among ARGV (sys.argv by default)."""
    return FLAG in (sys.argv[1:] if argv is None else argv)


def add_args(parser: argparse.ArgumentParser, live: bool = False) -> None:
    """``--smoke`` on PARSER; for LIVE scripts also ``--url`` and ``--pid`` of a running
    vLLM server (smoke mode only: the full benchmark boots its own, as it is designed)."""
    parser.add_argument(
        FLAG, action="store_true", help="CI's cheap run: one round, smallest inputs, not a result"
    )
    if live:
        parser.add_argument("--url", help="smoke: a running vLLM server's base URL")
        parser.add_argument("--pid", type=int, help="smoke: that server's API server pid")


def parse(doc: str | None, live: bool = False, argv: Sequence[str] | None = None) -> Any:
    """The arguments of a script that has no others than the smoke mode's."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    add_args(parser, live)
    args = parser.parse_args(argv)
    check(parser, args, live)
    return args


def check(parser: argparse.ArgumentParser, args: Any, live: bool) -> None:
    """A live script's smoke needs --url and --pid; outside smoke mode they are refused."""
    if not live:
        return
    given = args.url is not None or args.pid is not None
    if args.smoke and not (args.url and args.pid):
        parser.error("--smoke needs --url and --pid of a running vLLM server (it boots none)")
    if given and not args.smoke:
        parser.error("--url/--pid are for --smoke only: the benchmark boots its own servers")


def begin(covers: str, not_covered: Sequence[str] = ()) -> None:
    """Enter smoke mode: every later line of stdout is MARKed; say what runs and what not."""
    if not isinstance(sys.stdout, _Marked):
        sys.stdout = _Marked(sys.stdout)
    print(f"smoke mode ({Path(sys.argv[0]).name}): {covers}")
    print("these numbers are not results (one round, smallest inputs): never for BENCHMARKS.md")
    for what in not_covered:
        print(f"not covered: {what}")


def inspect_tree(pid: int) -> dict[str, Any]:
    """``verifier inspect --pid PID --tree --json``'s document. In smoke mode (after begin())
    it is read in this process without the file judgement (``provenance``, ``drift``,
    ``native``...: the judgement hashes and compiles every loaded file, about 10 s of CPU on
    the tiny server's tree, and no benchmark reads it): the same per-process dicts
    (``ProcessEvidence.as_dict``) that inspect's JSON starts from, in about a second."""
    if not isinstance(sys.stdout, _Marked):
        out = subprocess.run(
            [sys.executable, "-m", "servewitness", "inspect", "--pid", str(pid), "--tree", "--json"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        doc: dict[str, Any] = json.loads(out.stdout)
        return doc
    from servewitness.evidence.process import read_tree
    from servewitness.evidence.procfs import ProcFS

    return {"processes": [ev.as_dict() for ev in read_tree(ProcFS(), pid)]}


def skipped(what: str, why: str) -> None:
    """Say that WHAT did not run in smoke mode, and why."""
    print(f"skipped in smoke mode: {what} ({why})")


class Attached:
    """A running vLLM server this process did not start (never stopped by it): the part of
    ``servewitness.testing.vllm_server.VllmServer`` the benchmarks use (pid, base_url,
    complete)."""

    def __init__(self, url: str, pid: int) -> None:
        self.base_url = url.rstrip("/")
        self.pid = pid
        with urllib.request.urlopen(self.base_url + "/v1/models", timeout=10) as r:  # noqa: S310 - the caller's server
            self.model = str(json.loads(r.read())["data"][0]["id"])

    def complete(self, prompt: str, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
        """One greedy /v1/completions request, as VllmServer.complete sends it."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0.0, "ignore_eos": True, **extra}  # fmt: skip
        req = urllib.request.Request(  # noqa: S310 - the caller's server
            self.base_url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as r:  # noqa: S310
            out: dict[str, Any] = json.loads(r.read())
        return out


def loaded_tiny_server(run: Callable[[int], None]) -> None:
    """A full run's live target: boot the tiny server (VllmServer), serve 4 requests, give the
    probes' sweepers 2 s to record what was loaded, call RUN with its API server pid, stop it."""
    from servewitness.testing.vllm_server import VllmServer

    with VllmServer(REPO / ".cache" / "tiny-llama", scratch_parent=REPO / ".scratch") as server:
        for i in range(4):
            server.complete(f"bench {i}", max_tokens=8)
        time.sleep(2)  # the probes' sweepers have recorded everything
        run(server.pid)


def stand_in(script: str, run: Callable[[int], None]) -> None:
    """Smoke's live target where a tiny server would be too slow: a probed Python process
    running SCRIPT (stdlib only, run with ``-S``; it prints ``up`` once loaded and exits when
    its stdin closes), its probe files in a temporary directory; RUN gets its pid after the
    probe's sweeper had 1.5 s to record what was loaded."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(
            os.environ,
            VERIFIER_PROBE_DIR=f"{tmp}/probe",
            PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'probe'}",
        )
        child = subprocess.Popen([sys.executable, "-S", "-c", script], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "up"
            time.sleep(1.5)  # the probe's sweeper has recorded everything
            run(child.pid)
        finally:
            child.communicate(timeout=30)


def scripts() -> list[str]:
    """Every benchmark script, relative to bench/ (helpers start with an underscore)."""
    found = [*BENCH.glob("*.py"), *BENCH.glob("gpu/*.py")]
    return sorted(str(p.relative_to(BENCH)) for p in found if not p.name.startswith("_"))


def command(
    script: str, url: str | None = None, pid: int | None = None, extra: Sequence[str] = ()
) -> list[str]:
    """The command line of SCRIPT's smoke mode (LIVE ones against URL and PID), EXTRA added."""
    cmd = [sys.executable, str(BENCH / script), FLAG, *extra]
    if script in LIVE:
        if url is None or pid is None:
            raise ValueError(f"{script}'s smoke needs a running vLLM server (url and pid)")
        cmd += ["--url", url, "--pid", str(pid)]
    return cmd
