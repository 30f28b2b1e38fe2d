"""``verifier status [RUN]`` and ``verifier wait RUN --timeout S``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from verifier import wire
from verifier._cli.common import add_verifier_option, positive_seconds, rpc_timeout, tls_from
from verifier._cli.fmt import text
from verifier.errors import Error
from verifier.model import RunVerdict


def add_parser(sub: Any) -> None:
    st = sub.add_parser(
        "status",
        help="show a run's verdict, per target, with findings",
        description="One line per target and finding; with --json the verdicts, findings and, "
        "for every hook, its fired count next to the productive steps. Without RUN, every run. "
        "Exit code: 0 PASS, 1 FAIL, 0 for PENDING/STALE too (status reports; wait gates).",
    )
    st.add_argument("run", nargs="?")
    st.add_argument("--json", action="store_true")
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
        "credential (10) ends the wait at once.",
    )
    w.add_argument("run")
    w.add_argument(
        "--timeout", type=positive_seconds, required=True, help="seconds, the whole wait"
    )
    add_verifier_option(w)
    w.set_defaults(handler=wait)


def render(v: RunVerdict) -> str:
    unsafe = [text(f.context.get("flag")) for f in v.findings if f.id == "policy.unsafe"]
    named = f"  UNSAFE: {'; '.join(unsafe)}" if unsafe else ""  # never only in the findings
    lines = [f"run {text(v.run)}: {v.verdict.value}  (policy {text(v.policy_digest, 19)}){named}"]
    for f in v.findings:
        lines.append(f"  {f.severity.value:<7} {text(f.id)}: {text(f.message, 0)}")
    for t in v.targets:
        lines.append(f"  target {text(t.target)}: {t.verdict.value}")
        for h in t.hooks:
            rank = f" rank {h.rank}" if h.rank is not None else ""
            lines.append(
                f"    hook {text(h.name)} ({text(h.role)}{rank}, pid {h.pid}): fired "
                f"{h.fired_productive} on "
                f"{h.productive_steps} productive steps, {h.fired_decode} on {h.decode_steps} "
                f"decode steps, {h.fired_outside} outside steps ({h.fired} in all, "
                f"{h.total_steps} steps; judged on {h.on})"
            )
        for f in t.findings:
            lines.append(f"    {f.severity.value:<7} {text(f.id)}: {text(f.message, 0)}")
            if f.id == "provenance.origins":
                for x in f.context.get("files") or ():
                    dist = f" [{text(x.get('distribution'))}]" if x.get("distribution") else ""
                    lines.append(
                        f"      {text(x.get('origin', '?')):<9} {text(x.get('path'), 0)}{dist}: "
                        f"{text(x.get('reason'), 0)}"
                    )
    return "\n".join(lines) + "\n"


def status(args: argparse.Namespace) -> int:
    from verifier.client.address import resolve
    from verifier.client.api import VerifierClient

    with VerifierClient(resolve(args.verifier), rpc_timeout(args), tls_from(args)) as client:
        names = [args.run] if args.run else [r.name for r in client.list_runs()]
        verdicts = [client.status(n) for n in names]
    if args.json:
        json.dump({"runs": [wire.run_verdict_to_json(v) for v in verdicts]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("".join(render(v) for v in verdicts) or "no runs registered\n")
    return 1 if any(v.verdict.value == "FAIL" for v in verdicts) else 0


def wait(args: argparse.Namespace) -> int:
    from verifier.client.address import resolve
    from verifier.client.api import VerifierClient
    from verifier.client.gate import wait_for

    tty = sys.stderr.isatty()
    last: list[str] = []

    def show(line: str) -> None:
        if tty and line not in last:
            sys.stderr.write(f"\r{line}   ")
            sys.stderr.flush()
            last[:] = [line]

    def progress(v: RunVerdict) -> None:
        show(f"{v.run}: {v.verdict.value}")

    def retry(_e: Error) -> None:
        show(f"{args.run}: verifier unreachable, calling again until --timeout")

    with VerifierClient(resolve(args.verifier), rpc_timeout(args), tls_from(args)) as client:
        try:
            verdict = wait_for(client, args.run, args.timeout, on_progress=progress, on_retry=retry)
        finally:
            if tty and last:
                sys.stderr.write("\n")
    sys.stdout.write(render(verdict))
    return 0
