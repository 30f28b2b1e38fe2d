"""``verifier status [RUN]`` and ``verifier wait RUN --timeout S``."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from servewitness import wire
from servewitness._cli import verdict_text
from servewitness._cli.common import add_verifier_option, positive_seconds, rpc_timeout, tls_from
from servewitness._cli.fmt import dumps, text
from servewitness.errors import Error
from servewitness.model import RunVerdict

JSON_HELP = "print the verdicts as JSON (every finding and file, as stored)"


def add_parser(sub: Any) -> None:
    st = sub.add_parser(
        "status",
        help="show a run's verdict, per target, with findings",
        description="One line per target and finding; with --json the verdicts, findings and, "
        "for every hook, its fired count next to the productive steps. Without RUN, every run. "
        "Exit code: 0 PASS, 1 FAIL, 0 for PENDING/STALE too (status reports; wait gates). "
        "Text output shows this tool's own loaded files (the probe, its .pth files) as one "
        "'self' line per process (a copy that is not as installed is listed on its own), a file "
        "list another process already showed as a count, and a warning said of several "
        "processes once; -v lists every file and finding, --json keeps everything.",
    )
    st.add_argument("run", nargs="?", help="the run (default: every registered run)")
    st.add_argument("--json", action="store_true", help=JSON_HELP)
    add_verifier_option(st)
    st.set_defaults(handler=status)
    w = sub.add_parser(
        "wait",
        help="block until a run PASSes (0) or FAILs (1); 5 on timeout, 4 if unreachable",
        description="The measurement gate: poll RUN until it is PASS (exit 0) or FAIL (exit 1). "
        "It returns within --timeout whatever the verifier does: every call ends when that time "
        "is up, and a verifier that is unreachable, hung, restarting or busy is called again "
        "(backoff up to 1 s) until then. Exit 5 when --timeout passes with the run still "
        "undecided, 4 when the verifier could not be reached at the end (the message says "
        "whether it ever answered and for how long it had not); an unknown run (2) or a refused "
        "credential (10) ends the wait at once. On a terminal, stderr shows one progress "
        "line (elapsed time, --timeout, the verdict and why); the result is printed short "
        "(-v: every finding and file; --json: the verdict as JSON; -q: nothing).",
    )
    w.add_argument("run", help="the run to wait for")
    w.add_argument("--json", action="store_true", help=JSON_HELP)
    w.add_argument(
        "--timeout", type=positive_seconds, required=True, help="seconds, the whole wait"
    )
    add_verifier_option(w)
    w.set_defaults(handler=wait)


def render(v: RunVerdict) -> str:
    """V as ``verifier status`` prints it by default (kept for callers of this name)."""
    return verdict_text.render(v, verdict_text.NORMAL)


def status(args: argparse.Namespace) -> int:
    from servewitness.client.address import resolve
    from servewitness.client.api import VerifierClient

    with VerifierClient(resolve(args.verifier), rpc_timeout(args), tls_from(args)) as client:
        names = [args.run] if args.run else [r.name for r in client.list_runs()]
        verdicts = [client.status(n) for n in names]
    if args.json:
        sys.stdout.write(dumps({"runs": [wire.run_verdict_to_json(v) for v in verdicts]}) + "\n")
    else:
        level = verdict_text.detail(args.verbose, verdict_text.NORMAL)
        out = "".join(verdict_text.render(v, level) for v in verdicts)
        sys.stdout.write(out or "no runs registered\n")
    return 1 if any(v.verdict.value == "FAIL" for v in verdicts) else 0


class Progress:
    """``wait``'s one progress line on a terminal's stderr, redrawn in place: elapsed time,
    the timeout, the verdict and its reason. Nothing on a stderr that is not a terminal (a log
    file gets no carriage returns) or under -q. :meth:`end` moves past it, so what follows (the
    result, an error) starts on a line of its own."""

    def __init__(self, run: str, timeout_s: float, on: bool) -> None:
        self.run, self.timeout_s, self.on = run, timeout_s, on
        self.t0 = time.monotonic()
        self.width = 0  # of the line drawn last: a shorter one blanks what is left of it

    def show(self, state: str) -> None:
        if not self.on:
            return
        elapsed = time.monotonic() - self.t0
        line = f"{text(self.run, 40)}: {elapsed:.0f}s of {self.timeout_s:g}s  {state}"
        line = line[: _columns() - 1]
        sys.stderr.write("\r" + line.ljust(self.width))
        sys.stderr.flush()
        self.width = len(line)

    def end(self) -> None:
        if self.on and self.width:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.width = 0


def _columns() -> int:
    import shutil

    return max(40, shutil.get_terminal_size((100, 24)).columns)


def wait(args: argparse.Namespace) -> int:
    from servewitness.client.address import resolve
    from servewitness.client.api import VerifierClient
    from servewitness.client.gate import GateFailed, wait_for

    line = Progress(args.run, args.timeout, sys.stderr.isatty() and not args.quiet)

    def progress(v: RunVerdict) -> None:
        line.show(f"{v.verdict.value}: {verdict_text.reason(v)}")

    def retry(_e: Error) -> None:
        line.show("verifier unreachable, calling again until --timeout")

    level = verdict_text.detail(args.verbose, verdict_text.BRIEF)
    with VerifierClient(resolve(args.verifier), rpc_timeout(args), tls_from(args)) as client:
        try:
            verdict = wait_for(client, args.run, args.timeout, on_progress=progress, on_retry=retry)
        except GateFailed as e:
            line.end()
            if e.verdict is not None:  # the FAIL's evidence on stdout, its error on stderr
                _print_verdict(e.verdict, args.json, level)
            raise
        finally:
            line.end()
    _print_verdict(verdict, args.json, level)
    return 0


def _print_verdict(v: RunVerdict, as_json: bool, level: int) -> None:
    if as_json:
        sys.stdout.write(dumps(wire.run_verdict_to_json(v)) + "\n")
    else:
        sys.stdout.write(verdict_text.render(v, level))
