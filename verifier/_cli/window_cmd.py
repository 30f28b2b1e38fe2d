"""``verifier window RUN --out W`` and ``verifier seal RUN --window W --results FILE``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from verifier._cli.common import add_verifier_option, tls_from
from verifier.errors import UsageError

SEAL_DESCRIPTION = """\
Close a measurement window opened by `verifier window`: check that every hook the run's
policy requires kept pace with the steps it is judged on during the window (in every process,
each on its own counts), that no process restarted, that such steps ran at all, and that the
run still PASSes; then write a statement binding the results file's sha256 to that evidence
(--out, default RESULTS.seal.json) and print it. The verdict used rests on reports received
after the seal began. Exit 0: the window held; 1: it did not (the statement says why, and is
written anyway); 5: no fresh report arrived in --timeout seconds."""


def add_parser(sub: Any) -> None:
    w = sub.add_parser(
        "window",
        help="open a measurement window: wait for PASS and save the counts at its start",
        description="Block until RUN PASSes (like `verifier wait`) on reports read after the "
        "command began, then save that verdict, with every hook's fires and step counts, to "
        "--out: the start of a measurement window that `verifier seal` closes. Exit codes as "
        "for wait.",
    )
    w.add_argument("run")
    w.add_argument("--out", required=True, metavar="FILE", help="where to save the window")
    w.add_argument("--timeout", type=float, required=True, help="seconds to wait for PASS")
    add_verifier_option(w)
    w.set_defaults(handler=open_window)
    s = sub.add_parser(
        "seal",
        help="close a measurement window: liveness held? bind the results' sha256 to it",
        description=SEAL_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("run")
    s.add_argument("--window", required=True, metavar="FILE", help="from `verifier window`")
    s.add_argument("--results", required=True, metavar="FILE", help="the measurement's results")
    s.add_argument("--out", metavar="FILE", help="statement path (default RESULTS.seal.json)")
    s.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for fresh evidence")
    add_verifier_option(s)
    s.set_defaults(handler=seal)


def open_window(args: argparse.Namespace) -> int:
    from verifier.client.address import resolve
    from verifier.client.api import VerifierClient
    from verifier.client.gate import wait_for
    from verifier.client.window import save_start

    with VerifierClient(resolve(args.verifier), tls=tls_from(args)) as client:
        verdict = wait_for(client, args.run, args.timeout, fresh=True)
    save_start(Path(args.out), verdict)
    print(f"window on run {args.run} opened ({args.out})")
    return 0


def seal(args: argparse.Namespace) -> int:
    from verifier.client.address import resolve
    from verifier.client.api import VerifierClient
    from verifier.client.window import fresh_status, load_start, statement

    results = Path(args.results)
    if not results.is_file():
        raise UsageError(f"--results {results}: no such file")
    opened, start = load_start(Path(args.window))
    if start.run != args.run:
        raise UsageError(f"{args.window} is a window on run {start.run}, not {args.run}")
    with VerifierClient(resolve(args.verifier), tls=tls_from(args)) as client:
        end = fresh_status(client, args.run, args.timeout)
    body, held = statement(args.run, opened, start, end, results)
    out = Path(args.out) if args.out else results.with_name(results.name + ".seal.json")
    out.write_text(json.dumps(body, indent=2) + "\n")
    for row in body["hooks"].values():
        print(
            f"hook {row['name']} (pid {row['pid']}, {row['role']}): fired {row['fired']} on "
            f"{row['steps']} {row['on']} steps during the window ({row['fired_in_all']} in all, "
            f"{row['total_steps']} steps)"
        )
    for f in body["findings"]:
        print(f"FAIL {f['id']}: {f['message']}", file=sys.stderr)
    verdict = "held" if held else "BROKEN"
    print(f"window {verdict}; results sha256 {body['results']['sha256']}; statement {out}")
    return 0 if held else 1
