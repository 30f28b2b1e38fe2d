"""``verifier audit verify-seal SEAL --key PUB [--results FILE] [--policy FILE]
[--checkpoint OLD.note]``: check a sealed measurement window offline
(``servewitness/ledger/verify_seal.py``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servewitness.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from servewitness.ledger.verify_seal import SealCheck

DESCRIPTION = """\
Check a measurement window's seal (RESULTS.seal.json from `verifier exec` or `verifier seal`)
offline, with the verifier's public key alone: the DSSE signature by --key; the statement's
shape (a measurement-window predicate whose gate decision, window and seal agree, whose
subject is the sealed results file); the seal not dated before its open, its elapsed times
recomputed from the verifier's clocks at each end, and a held seal's evidence showing the
same processes at both ends, each one that runs steps having stepped; the checkpoint note's
signature; the window's and the seal's ledger entries (their hashes, their subjects
recomputed from the statement, their inclusion in the signed checkpoint); with --results,
that the file's bytes are the ones sealed; with --requests (the harness's request ids, one
per line), that the seal checked exactly those ids; with --policy (the pre-registered policy
file, or its sha256:DIGEST), that the window was judged by exactly that policy (without it,
the policy's digest is printed and said to be not checked: a run name alone lets whoever
registers runs judge a window by any policy); with --checkpoint (a note kept
elsewhere), that the seal's checkpoint extends it when the seal carries the proof (else said
to be not checked). It prints how many other windows the verifier's ledger held when this
one was sealed, by outcome, on its run and on the whole ledger: a result chosen from several
attempts says so.

Exit 0: everything verifies AND the window held. 1: it verifies but the window did not hold,
or something does not match (each named). 3: the seal, key, checkpoint, results or requests
file cannot be read (or the requests file is not a list of ids), or the seal is not a seal
document."""


def add_actions(acts: Any) -> None:
    v = acts.add_parser(
        "verify-seal",
        help="check a sealed measurement window offline with the verifier's public key",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    v.add_argument("seal", metavar="SEAL", help="RESULTS.seal.json")
    v.add_argument("--key", required=True, metavar="PUB", help="the verifier's public key")
    v.add_argument("--results", metavar="FILE", help="the results file: its bytes must match")
    v.add_argument(
        "--requests", metavar="FILE", help="the harness's request ids: the seal must cover them"
    )
    v.add_argument(
        "--policy",
        metavar="FILE|sha256:DIGEST",
        help="the pre-registered policy (its file, or its digest): the window must have been "
        "judged by it",
    )
    v.add_argument("--checkpoint", metavar="NOTE", help="a signed checkpoint kept elsewhere")
    v.add_argument("--json", action="store_true", help="the result as JSON")
    v.set_defaults(handler=run_verify_seal)


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot read: {e.strerror or e}") from e


def run_verify_seal(args: argparse.Namespace) -> int:
    from servewitness.ledger.keys import load_public_key
    from servewitness.ledger.verify_seal import Unreadable, check_seal

    data = _read(args.seal, "seal")
    key = load_public_key(Path(args.key))
    old = _read(args.checkpoint, "--checkpoint") if args.checkpoint else None
    results = Path(args.results) if args.results else None
    if results is not None and not results.is_file():
        raise ConfigError(f"--results {results}: no such file")
    requests = None
    if args.requests:
        from servewitness.client.window import read_request_ids

        try:
            requests = read_request_ids(Path(args.requests))
        except UsageError as e:  # a file that is not a list of ids: as unreadable as a seal
            raise ConfigError(e.explain()) from e
    policy = _pinned_policy(args.policy) if args.policy else None
    try:
        r = check_seal(data, key, results, old, requests, policy=policy)
    except Unreadable as e:
        raise ConfigError(f"{args.seal}: {e}") from e
    if args.json:
        print(json.dumps(r.to_json(), indent=2))
    else:
        _print(r)
    return 0 if r.ok else 1


def _pinned_policy(given: str) -> str:
    """The ``sha256:`` digest --policy names: given as such, or of the file's text (the digest
    ``verifier run register`` and ``policy check`` print)."""
    import re

    from servewitness.policy import policy_digest

    if re.fullmatch(r"sha256:[0-9a-f]{64}", given):
        return given
    if given.startswith("sha256:"):
        raise UsageError(f"--policy {given}: not a sha256:<64 hex digits> digest")
    return policy_digest(_read(given, "--policy").decode("utf-8", "surrogateescape"))


def _print(r: SealCheck) -> None:
    """The check as text: what passed, what was not checked, what failed, the window."""
    for c in r.checks:
        print(f"ok   {c}")
    for n in r.not_checked:
        print(f"not checked: {n}")
    for p in r.problems:
        print(f"FAIL {p}", file=sys.stderr)
    for f in r.findings:
        print(f"finding {f.get('id')}: {f.get('message')}")
    if r.other_windows is not None:
        from servewitness.client.window import other_windows_line

        print(other_windows_line(r.other_windows, str(r.run)))
    state = "held" if r.held else "did NOT hold"
    if r.verified:
        print(f"seal verified: window {r.window_id} on run {r.run} {state}")
    else:
        print(f"seal does NOT verify ({len(r.problems)} problem(s)); it says the window {state}")
