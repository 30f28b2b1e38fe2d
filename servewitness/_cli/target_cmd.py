"""``verifier target list`` and ``verifier target forget NAME``: the targets the verifier knows,
and retiring one (a server that is gone for good, a name reported by mistake)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from servewitness._cli.common import add_verifier_option, rpc_timeout, tls_from
from servewitness._cli.fmt import add_json, dumps, result, text
from servewitness._cli.fmt import when as _when
from servewitness.client.address import resolve


def add_parser(sub: Any) -> None:
    p = sub.add_parser("target", help="list the targets the verifier knows, or retire one")
    targets = p.add_subparsers(dest="target_command", metavar="ACTION", required=True)
    ls = targets.add_parser(
        "list",
        help="every target: last report, age, agent, authenticated as, state",
        description="Every target the verifier knows, with when its latest report arrived, "
        "its age on the verifier's boot clock ('?' when stored before the verifier restarted), "
        "the agent that sent it, how that agent was authenticated and its state: live (within "
        "the smallest freshness_s of the registered runs), stale, or expired (silent past "
        "--target-expiry: in no run's verdict). Needs a reader role. 'no targets reported' "
        'when there is none; --json: {"targets": [...]}.',
    )
    ls.add_argument("--json", action="store_true", help="print the targets as JSON")
    add_verifier_option(ls)
    ls.set_defaults(handler=list_targets)
    forget = targets.add_parser(
        "forget",
        help="retire a target: no run's verdict counts its evidence after this",
        description="Retire target NAME: it leaves every run's verdict and the ledger records "
        "who retired it; if it reports again it comes back as a new target. Needs the "
        "operator role; an unknown NAME exits 2.",
    )
    forget.add_argument("name", help="the target to retire")
    add_json(forget, '{"target", "state", "last_report_unix"} of the retired target')
    add_verifier_option(forget)
    forget.set_defaults(handler=forget_target)


def list_targets(args: argparse.Namespace) -> int:
    from servewitness.client.api import VerifierClient

    with VerifierClient(resolve(args.verifier), rpc_timeout(args), tls_from(args)) as client:
        targets = client.list_targets()
    if args.json:
        doc = [
            {"target": t.target, "state": t.state, "last_report_unix": t.last_report_unix,
             "age_s": t.age_s, "agent_id": t.agent_id, "authenticated_as": t.authenticated_as}
            for t in targets
        ]  # fmt: skip
        sys.stdout.write(dumps({"targets": doc}) + "\n")
        return 0
    if not targets:
        sys.stdout.write("no targets reported\n")
    for t in targets:
        age = "?" if t.age_s is None else f"{t.age_s:.1f}s"
        sys.stdout.write(
            f"{text(t.target)}  {text(t.state)}  last report {_when(t.last_report_unix)}  "
            f"age {age}  agent {text(t.agent_id)}  authenticated as "
            f"{text(t.authenticated_as) or 'nobody'}\n"
        )
    return 0


def forget_target(args: argparse.Namespace) -> int:
    from servewitness.client.api import VerifierClient

    with VerifierClient(resolve(args.verifier), rpc_timeout(args), tls_from(args)) as client:
        t = client.forget_target(args.name)
    doc = {"target": t.target, "state": t.state, "last_report_unix": t.last_report_unix}
    line = (
        f"forgot target {text(t.target)} (was {text(t.state)}, last report "
        f"{_when(t.last_report_unix)})"
    )
    result(args, doc, [line])
    return 0
