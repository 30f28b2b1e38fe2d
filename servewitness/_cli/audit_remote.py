"""``verifier audit request|file|run --verifier ADDR --key KEY.pub``: the audit queries asked
of a running verifier over gRPC (the auditor or operator role), every answer checked offline
with the verifier's public key before anything is printed (``servewitness.ledger.answers``).

No trust on first use: ``--key`` is required. A key taken from the first answer would let
whoever answers first (a man in the middle, a verifier impersonated) choose the key its
forgeries are checked with; the public key comes from the operator (``verifier keygen``'s
``.pub``, or the one ``verifier serve`` prints at start), once, out of band.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from servewitness._cli import fmt
from servewitness._cli.common import add_verifier_option, rpc_timeout, tls_from
from servewitness._cli.fmt import text as _t
from servewitness.errors import UsageError

KEY_HELP = (
    "with --verifier: the verifier's public key (PEM); every answer is checked with it offline "
    "(inclusion proofs, signed checkpoint, signed statements) before it is printed. Required: "
    "no key is ever taken from the answer itself (no trust on first use)"
)


def add_remote_options(p: argparse.ArgumentParser) -> None:
    """--verifier (and its TLS options), --key, --limit on an audit query."""
    add_verifier_option(p)
    p.add_argument("--key", metavar="KEY.pub", help=KEY_HELP)
    p.add_argument(
        "--limit",
        type=int,
        default=0,
        metavar="N",
        help="with --verifier: at most N records in the answer (default 50, at most 500); an "
        "answer with more says how many it left out",
    )


def wants_remote(args: argparse.Namespace) -> bool:
    """--verifier given (and not --db): ask a verifier; both or neither is a usage error."""
    if args.db is not None and args.verifier is not None:
        raise UsageError("give either --db (the database) or --verifier (over gRPC), not both")
    if args.db is None and args.verifier is None:
        raise UsageError("give --db DATABASE, or --verifier ADDRESS --key KEY.pub")
    return args.verifier is not None


def run_remote(kind: str, query: str, args: argparse.Namespace) -> int:
    """Ask, check, print: exit 0; 1 when the answer does not verify (nothing printed as if
    good), 2 without --key, 6 nothing matches, 4/10 unreachable or refused."""
    from servewitness.client.address import resolve as resolve_address
    from servewitness.client.api import VerifierClient
    from servewitness.ledger.answers import check_answer
    from servewitness.ledger.keys import key_id, load_public_key

    if args.key is None:
        raise UsageError(
            "an answer over the wire is checked with the verifier's public key: give --key "
            "KEY.pub (no key is taken from the answer: no trust on first use)"
        )
    if args.limit < 0:
        raise UsageError("--limit must be 0 (the default) or more")
    key = load_public_key(Path(args.key))
    address = resolve_address(args.verifier)
    with VerifierClient(address, rpc_timeout(args, 60.0), tls_from(args)) as client:
        reply = client.audit(kind, query, args.limit)
    checked = check_answer(kind, query, reply.bundle, reply.note, key)
    if args.json:
        print(fmt.dumps(checked.records if kind != "run" else checked.records[0]))
    else:
        for record in checked.records:
            _print(kind, record)
    when = fmt.when(checked.at_unix)
    for o in reply.omitted:  # named, never hidden: what they rest on did not fit
        print(
            f"not in this answer: {_t(o.record)} of target {_t(o.target)} matches too, but "
            f"the ledgered content it rests on ({o.bytes} bytes) does not fit in one answer "
            "beside the rest: ask with --db, or `verifier audit export`",
            file=sys.stderr,
        )
    more = (
        f"; {len(checked.records)} of {reply.total} record(s) shown (--limit)"
        if reply.truncated
        else ""
    )
    if reply.omitted:
        more += f"; {len(reply.omitted)} left out for their size (named above)"
    print(
        f"verified offline with key {key_id(key)[:16]}: included in the ledger of "
        f"{checked.size} entries, checkpoint signed {when}, root {checked.root[:16]}{more}",
        file=sys.stderr if args.json else sys.stdout,
    )
    return 0


def _print(kind: str, r: dict[str, Any]) -> None:
    if kind == "file":
        cid = r["container_id"]
        where = f"container {_t(cid, 12)}" if cid else "no container"
        print(f"{_t(r['path'], 0)}  sha256 {_t(r['sha256']) or '-'}")
        print(
            f"  target {_t(r['target'])}  pid {_t(r['pid'])} ({_t(r['role'])}, {where})  "
            f"manifest {_t(r['manifest_digest'], 19)}  seen in {_t(r['reports'])} report(s)  "
            f"runs: {', '.join(_t(x) for x in r['runs']) or 'none'}  served "
            f"{_t(r['requests'])} request(s)"
        )
    elif kind == "request":
        p = r["process"]
        cid = p["container_id"]
        ext = ", ".join(_t(e) for e in r["external_ids"]) or "no external id"
        print(f"request {_t(r['request'])} ({ext})")
        print(f"  target {_t(r['target'])}  pid {_t(p['pid'])} ({_t(p['role']) or '?'}, "
              f"{'container ' + _t(cid, 12) if cid else 'no container'})")  # fmt: skip
        print(f"  steps {_t(r['steps'][0])}..{_t(r['steps'][1])} ({_t(r['scheduled_steps'])} "
              f"scheduled, {_t(r['tokens'])} tokens)  runner {_t(r['runner'])}")  # fmt: skip
        for m in r["manifests"]:
            print(f"  manifest {_t(m)}")
        hooks = ", ".join(f"{_t(k)} {_t(v)}" for k, v in sorted(r["hooks"].items()))
        print(f"  hook fires over its steps: {hooks or 'none declared'}")
        for run in r["runs"]:
            verdict = _t(run["verdict"] or "no verdict yet")
            print(f"  run {_t(run['run'])}: {verdict} at the time")
    else:
        print(
            f"run {_t(r['name'])}  policy {_t(r['policy_digest'])}  from {_t(r['source']) or '-'}"
        )
        for t, v in r["history"]:
            print(f"  {fmt.when(t)}  {_t(v)}")
