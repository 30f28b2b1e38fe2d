"""``verifier window RUN --out W`` and ``verifier seal RUN --window W --results FILE``: the
two-step form of a measurement window the verifier opens and seals itself (``verifier exec``
is the one-step form). The window file holds only the window's id, run and the verifier's
address: it is not trust-bearing (the evidence is in the verifier's ledger)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servewitness._cli.common import add_verifier_option, positive_seconds, rpc_timeout, tls_from
from servewitness._cli.fmt import dumps
from servewitness.errors import UsageError

if TYPE_CHECKING:
    from servewitness.client.window import CheckedSeal, Expected

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
digest. Without it the seal says the requests were not checked.

The seal handed back is checked before it is written: its signed content must name the window
of --window, its run, the results file's sha256, size and name and the --requests ids, close
the window entry `verifier window` saved, and say held exactly when the answer does (the
outcome printed is the content's). With --key (the verifier's public key, else
$VERIFIER_SEAL_KEY) its signature is checked too; without it, it is not, and the output says
so (`verifier audit verify-seal` checks it, with the ledger proofs, offline).

Exit 0: the window held; 1: it did not (the seal says why, and is written anyway); 2: no such
window, another run's, already sealed, or a --requests file that is missing, too large or
holds a line that is not a request id; 3: --key cannot be read; 7: the seal handed back is
not the one asked for (another window, run, results or request ids; its content and the
answer disagree on held; or its signature does not verify: nothing is written); 8: it is
signed by another key than --key (nothing is written)."""

KEY_HELP = (
    "the verifier's public key (verifier keygen's KEY.pub; default: $VERIFIER_SEAL_KEY): "
    "the seal's signature is checked before it is written; none: not checked, and said so"
)


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
        "again until --timeout; the command takes at most --timeout + 1 s for the answer); 7: "
        "the verifier answered with a window on another run (nothing is saved).",
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
    s.add_argument("--key", metavar="PUB", help=KEY_HELP)
    s.add_argument(
        "--timeout",
        type=positive_seconds,
        default=30.0,
        help="seconds the verifier waits for fresh evidence",
    )
    s.add_argument(
        "--json",
        action="store_true",
        help="print the seal's content, path, whether it held and whether its signature was "
        "checked",
    )
    add_verifier_option(s)
    s.set_defaults(handler=seal)


def open_window(args: argparse.Namespace) -> int:
    from servewitness.client.address import resolve
    from servewitness.client.api import VerifierClient
    from servewitness.client.window import open_window as open_checked
    from servewitness.client.window import save_window

    address = resolve(args.verifier)
    with VerifierClient(address, rpc_timeout(args), tls_from(args)) as client:
        opened = open_checked(client, args.run, args.timeout)
    save_window(Path(args.out), address, opened)
    if args.json:
        print(dumps({**dataclasses.asdict(opened), "file": args.out}))
        return 0
    print(
        f"window {opened.window_id} on run {args.run} opened (ledger entry {opened.ledger_seq}; "
        f"{args.out})"
    )
    return 0


def print_seal(checked: CheckedSeal, path: Path) -> None:
    """The seal's lines (``describe``), whether its signature was checked, the outcome."""
    from servewitness.client.window import describe

    content = checked.content
    for line in describe(content):
        print(line, file=sys.stderr if line.startswith("FAIL ") else sys.stdout)
    flags = content.get("unsafe_flags") or []
    if flags:
        print(f"under unsafe policy settings: {', '.join(flags)}")
    say_signature(checked)
    print(
        f"window {'held' if checked.held else 'BROKEN'}; results sha256 "
        f"{content['results']['sha256']}; signed seal {path} (check it: verifier audit "
        f"verify-seal {path} --key KEY.pub)"
    )


def say_signature(checked: CheckedSeal) -> None:
    """Whether the seal's signature was checked: a line on stdout, or a warning on stderr
    when it was not (also beside --json, whose object says it too)."""
    if checked.key_id is not None:
        print(checked.signature())
    else:
        print(f"verifier: warning: {checked.signature()}", file=sys.stderr)


def expected_of(w: dict[str, Any]) -> Expected:
    """What a window file says OpenWindow answered (a file without it: nothing)."""
    from servewitness.client.window import Expected

    seq, h, digest = w.get("ledger_seq"), w.get("ledger_hash"), w.get("policy_digest")
    entry = (seq, h) if type(seq) is int and isinstance(h, str) else None
    return Expected(entry, digest if isinstance(digest, str) else None)


def seal(args: argparse.Namespace) -> int:
    from servewitness.client.address import resolve
    from servewitness.client.api import VerifierClient
    from servewitness.client.window import load_window, read_request_ids, seal_key
    from servewitness.client.window import seal as seal_window

    results = Path(args.results)
    if not results.is_file():
        raise UsageError(f"--results {results}: no such file")
    request_ids = read_request_ids(Path(args.requests)) if args.requests else ()
    key = seal_key(args.key)
    w = load_window(Path(args.window))
    if w["run"] != args.run:
        raise UsageError(f"{args.window} is a window on run {w['run']}, not {args.run}")
    address = resolve(args.verifier or w["verifier"])
    out = Path(args.out) if args.out else None
    with VerifierClient(address, rpc_timeout(args), tls_from(args)) as client:
        checked, path = seal_window(
            client, w["window_id"], args.run, results, args.timeout, out, request_ids,
            expected=expected_of(w), key=key,
        )  # fmt: skip
    if args.json:
        print(dumps({"held": checked.held, "seal": str(path), "content": checked.content,
                     "signature": checked.signature_json()}))  # fmt: skip
        if checked.key_id is None:
            say_signature(checked)
    else:
        print_seal(checked, path)
    return 0 if checked.held else 1
