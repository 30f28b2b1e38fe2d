"""``verifier exec RUN --results FILE -- CMD ARGS...``: a benchmark inside a measurement window
the verifier opens and seals: open (the verifier waits for PASS on fresh evidence) -> run CMD
(it inherits stdin/stdout/stderr; SIGINT and SIGTERM are forwarded to it) -> hash FILE -> seal
-> write the signed seal to FILE.seal.json (or --out)."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from servewitness._cli.common import add_verifier_option, positive_seconds, rpc_timeout, tls_from
from servewitness._cli.fmt import add_json, dumps
from servewitness._cli.window_cmd import KEY_HELP, REQUESTS_HELP
from servewitness.errors import Error, UsageError

DESCRIPTION = """\
Run CMD inside a measurement window on RUN that the verifier opens and seals itself:

  1. open: the verifier waits up to --timeout for every target to report after the call and
     for RUN to PASS on that evidence, and records the window in its ledger;
  2. CMD runs (stdio inherited; SIGINT/SIGTERM forwarded to it) and writes --results;
  3. seal: the results file is hashed, the verifier judges liveness over the window from its
     own stored reports, ledgers and signs the seal; it is written to RESULTS.seal.json (or
     --out), also when the window broke or CMD failed. With --requests, CMD also writes the
     request ids it sent (one per line), and each must have been served by the window's
     processes after it opened: a request something else served (a twin, a proxy, a
     redirected port) breaks the window.

Each answer is checked before it is used: the window opened must be on RUN (else CMD never
runs), and the seal handed back must, by its signed content, name that window (its ledger
entry as opened), RUN, the results file's sha256, size and name and the --requests ids, and
say held exactly when the answer does (the outcome printed is the content's). A seal that
does not is never written. With --key (the verifier's public key, else $VERIFIER_SEAL_KEY)
its signature is checked too; without it, it is not, and the output says so.

Exit codes: CMD's own code when it is not 0 (the seal is still attempted, written and its
outcome printed); else 0 when the window held and 1 when it broke (or --results, or the
--requests file asked for, was not written). When the window cannot open CMD never runs: 1
(RUN FAILs), 4 (verifier unreachable), 5 (no PASS on fresh evidence within --timeout), 7
(the verifier answered with a window on another run), 10 (not authorized: the harness or
operator role is needed); 3 when --key cannot be read. When the seal handed back is refused
(CMD's own code first, if not 0; nothing is written): 7 (not the seal asked for, or its
signature does not verify), 8 (signed by another key than --key). Each of open and seal
takes at most --timeout + 1 s for the answer, an unreachable or busy verifier called again
within it. Check the seal offline with `verifier audit verify-seal`."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "exec",
        usage="verifier exec [-h] RUN --results FILE [--requests FILE] [--out SEAL] [--key PUB] "
        "[--timeout S] [--verifier ADDRESS] [TLS options] -- CMD [ARGS...]",
        help="run a benchmark command inside a verifier-sealed measurement window",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", help="the run whose window CMD runs in")
    p.add_argument("--results", required=True, metavar="FILE", help="what CMD writes")
    p.add_argument("--out", metavar="SEAL", help="seal path (default RESULTS.seal.json)")
    p.add_argument(
        "--requests",
        metavar="FILE",
        help=REQUESTS_HELP + "; CMD writes it (not written: exit 1, the seal says unchecked)",
    )
    p.add_argument("--key", metavar="PUB", help=KEY_HELP)
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=120.0,
        help="seconds the verifier waits for PASS at open, and for fresh evidence at the seal",
    )
    add_json(
        p,
        "the outcome as one JSON object, the last line on stdout after CMD's own output: "
        '{"window_id", "run", "exit_code", "held", "results_written", "seal", "content", '
        '"signature"} (the window notice goes to stderr)',
    )
    add_verifier_option(p)
    p.set_defaults(handler=run, takes_command=True, command_argv=[])  # `-- CMD ARGS...`: main


def _run_child(argv: list[str]) -> int:
    """Run ARGV with SIGINT and SIGTERM forwarded; its exit code (128+N for signal N)."""
    try:
        child = subprocess.Popen(argv)
    except OSError as e:
        print(f"verifier exec: cannot run {argv[0]}: {e}", file=sys.stderr)
        return 127

    def forward(signum: int, _frame: FrameType | None) -> None:
        child.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = child.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 128 - code if code < 0 else code


def run(args: argparse.Namespace) -> int:
    from servewitness import wire
    from servewitness._cli.window_cmd import print_seal, say_signature
    from servewitness.client.address import resolve
    from servewitness.client.api import VerifierClient
    from servewitness.client.window import (
        Expected,
        open_window,
        read_request_ids,
        seal,
        seal_key,
        seal_path,
        seal_window,
    )

    argv = list(args.command_argv)
    if not argv:
        raise UsageError("no command: verifier exec RUN --results FILE -- CMD ARGS...")
    results = Path(args.results)
    out = Path(args.out) if args.out else None
    key = seal_key(args.key)  # unreadable: exit 3 before anything runs
    with VerifierClient(resolve(args.verifier), rpc_timeout(args), tls_from(args)) as client:
        opened = open_window(client, args.run, args.timeout)  # CMD never runs if this fails
        notice = sys.stderr if args.json else sys.stdout
        print(f"verifier exec: window {opened.window_id} on run {args.run} opened", file=notice)
        notice.flush()
        code = _run_child(argv)
        print(f"verifier exec: {argv[0]} exited {code}", file=sys.stderr, flush=True)
        requests = Path(args.requests) if args.requests else None
        unchecked = requests is not None and not requests.is_file()
        if unchecked:
            print(
                f"verifier exec: {requests} was not written: the requests are not checked",
                file=sys.stderr,
            )
        ids: tuple[str, ...] = ()
        if requests is not None and not unchecked:
            try:
                ids = read_request_ids(requests)
            except UsageError as e:  # sealed all the same, unchecked, and not a pass
                unchecked = True
                print(
                    f"verifier exec: {e.explain()}: the requests are not checked", file=sys.stderr
                )
        expected = Expected.of(opened)
        try:
            if results.is_file():
                checked, path = seal(
                    client, opened.window_id, args.run, results, args.timeout, out, ids,
                    expected=expected, key=key,
                )  # fmt: skip
            else:
                # Sealed all the same (the window is closed in the ledger, held or not), over
                # the empty string's digest: there are no results to bind.
                print(f"verifier exec: {results} was not written", file=sys.stderr)
                import hashlib

                empty = hashlib.sha256(b"").hexdigest()
                sealing = wire.WindowSealing(
                    opened.window_id, args.run, empty, 0, results.name, args.timeout, ids
                )
                path = seal_path(results, out)
                checked = seal_window(client, sealing, expected, key, path)
        except Error as e:
            print(f"verifier exec: the seal failed: {e.explain()}", file=sys.stderr)
            return code or e.exit_code
    if args.json:
        sys.stdout.write(
            dumps({
                "window_id": opened.window_id, "run": args.run, "exit_code": code,
                "held": checked.held, "results_written": results.is_file(), "seal": str(path),
                "content": checked.content, "signature": checked.signature_json(),
            }, indent=None) + "\n"
        )  # fmt: skip
        if checked.key_id is None:
            say_signature(checked)
    else:
        print_seal(checked, path)
    if code:
        return code
    return 0 if checked.held and results.is_file() and not unchecked else 1
