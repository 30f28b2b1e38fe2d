"""``verifier window RUN --out W`` and ``verifier seal RUN --window W --results FILE``: the
two-step form of a measurement window the verifier opens and seals itself (``verifier exec``
is the one-step form). The window file holds only the window's id, run and the verifier's
address: it is not trust-bearing (the evidence is in the verifier's ledger)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from servewitness._cli.common import add_verifier_option, positive_seconds, rpc_timeout, tls_from
from servewitness._cli.fmt import dumps
from servewitness.errors import UsageError

SEAL_DESCRIPTION = """\
Close a measurement window opened by `verifier window`. The verifier waits for every target to
report after the seal began, then judges the window from the reports it stored: every hook the
run's policy requires kept pace with the steps it is judged on during the window (in every
process, each on its own counts), no process restarted, such steps ran at all, and the run
still PASSes. It records the seal in its ledger (also when the window broke), signs it with
its key and returns the seal, written to --out (default RESULTS.seal.json): an in-toto
statement binding the results file's sha256 to that evidence, with the signed checkpoint and
inclusion proofs `verifier audit verify-seal` checks offline. With --requests (the X-Request-Id
values the harness sent during the window, one per line), every one must have been served by the
window's processes after it opened, by their request bindings: a request something else served
(a twin outside the reported tree, a proxy, a redirected port) breaks the window
(window.requests_unserved); the seal records how many were sent and served and the ids'
digest. Without it the seal says the requests were not checked. Exit 0: the window held; 1:
it did not (the seal says why, and is written anyway); 2: no such window, another run's,
already sealed, or a --requests file that is missing, too large or holds a line that is not
a request id."""


REQUESTS_HELP = (
    "the X-Request-Id values of the requests the harness sent during the window and got "
    "answers for, one per line: each must have been served by the window's processes"
)


def add_parser(sub: Any) -> None:
    w = sub.add_parser(
        "window",
        help="open a measurement window (the verifier waits for PASS on fresh evidence)",
        description="Ask the verifier to open a measurement window on RUN: it waits up to "
        "--timeout for every target to report after the call arrived and for RUN to PASS on "
        "that evidence, records the window (and the evidence per process it rests on) in its "
        "ledger and returns its id, saved to --out with the verifier's address. The file is "
        "not trust-bearing: `verifier seal` names the window by it. Exit 1: RUN FAILs; 5: no "
        "PASS on fresh evidence within --timeout; 4: the verifier is unreachable (it is called "
        "again until --timeout; the command takes at most --timeout + 1 s for the answer).",
    )
    w.add_argument("run", help="the run to open a window on")
    w.add_argument("--out", required=True, metavar="FILE", help="where to save the window id")
    w.add_argument(
        "--timeout", type=positive_seconds, required=True, help="seconds to wait for PASS"
    )
    w.add_argument("--json", action="store_true", help="print the opened window as JSON")
    add_verifier_option(w)
    w.set_defaults(handler=open_window)
    s = sub.add_parser(
        "seal",
        help="close a measurement window: the verifier signs whether liveness held",
        description=SEAL_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("run", help="the run the window is on")
    s.add_argument("--window", required=True, metavar="FILE", help="from `verifier window`")
    s.add_argument("--results", required=True, metavar="FILE", help="the measurement's results")
    s.add_argument("--out", metavar="FILE", help="seal path (default RESULTS.seal.json)")
    s.add_argument("--requests", metavar="FILE", help=REQUESTS_HELP)
    s.add_argument(
        "--timeout",
        type=positive_seconds,
        default=30.0,
        help="seconds the verifier waits for fresh evidence",
    )
    s.add_argument(
        "--json", action="store_true", help="print the seal's content, path and whether it held"
    )
    add_verifier_option(s)
    s.set_defaults(handler=seal)


def open_window(args: argparse.Namespace) -> int:
    from servewitness.client.address import resolve
    from servewitness.client.api import VerifierClient
    from servewitness.client.window import save_window

    address = resolve(args.verifier)
    with VerifierClient(address, rpc_timeout(args), tls_from(args)) as client:
        opened = client.open_window(args.run, args.timeout)
    save_window(Path(args.out), address, opened)
    if args.json:
        print(dumps({**dataclasses.asdict(opened), "file": args.out}))
        return 0
    print(
        f"window {opened.window_id} on run {args.run} opened (ledger entry {opened.ledger_seq}; "
        f"{args.out})"
    )
    return 0


def print_seal(content: dict[str, Any], path: Path, held: bool) -> None:
    from servewitness.client.window import describe

    for line in describe(content):
        print(line, file=sys.stderr if line.startswith("FAIL ") else sys.stdout)
    flags = content.get("unsafe_flags") or []
    if flags:
        print(f"under unsafe policy settings: {', '.join(flags)}")
    print(
        f"window {'held' if held else 'BROKEN'}; results sha256 {content['results']['sha256']}; "
        f"signed seal {path} (check it: verifier audit verify-seal {path} --key KEY.pub)"
    )


def seal(args: argparse.Namespace) -> int:
    from servewitness.client.address import resolve
    from servewitness.client.api import VerifierClient
    from servewitness.client.window import load_window, read_request_ids
    from servewitness.client.window import seal as seal_window

    results = Path(args.results)
    if not results.is_file():
        raise UsageError(f"--results {results}: no such file")
    request_ids = read_request_ids(Path(args.requests)) if args.requests else ()
    w = load_window(Path(args.window))
    if w["run"] != args.run:
        raise UsageError(f"{args.window} is a window on run {w['run']}, not {args.run}")
    address = resolve(args.verifier or w["verifier"])
    out = Path(args.out) if args.out else None
    with VerifierClient(address, rpc_timeout(args), tls_from(args)) as client:
        sealed, content, path = seal_window(
            client, w["window_id"], args.run, results, args.timeout, out, request_ids
        )
    if args.json:
        print(dumps({"held": sealed.held, "seal": str(path), "content": content}))
    else:
        print_seal(content, path, sealed.held)
    return 0 if sealed.held else 1
