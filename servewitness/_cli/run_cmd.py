"""``verifier run register NAME --policy FILE`` and ``verifier run list``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from servewitness._cli.common import add_verifier_option, rpc_timeout, tls_from
from servewitness._cli.fmt import add_json, dumps, result, when
from servewitness._cli.fmt import text as _t
from servewitness.client.address import resolve
from servewitness.errors import ConfigError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="pre-register runs and list them")
    runs = p.add_subparsers(dest="run_command", metavar="ACTION", required=True)
    reg = runs.add_parser(
        "register",
        help="pre-register a run with its policy",
        description="Store NAME with the policy file and its digest. The same policy again is a "
        "no-op; a different policy under an existing name is refused (use a new name).",
    )
    reg.add_argument("name", help="the run's name (letters, digits, . _ -)")
    reg.add_argument("--policy", type=Path, required=True, help="policy file (TOML)")
    add_json(reg, '{"run", "policy_digest"} of the registered run')
    add_verifier_option(reg)
    reg.set_defaults(handler=register)
    ls = runs.add_parser(
        "list",
        help="list registered runs with their current verdict",
        description="One line per run: name, verdict, policy digest, when it was registered, "
        "and its unsafe policy settings if any; 'no runs registered' when there is none. "
        '--json: {"runs": [...]} (an empty list when there is none).',
    )
    ls.add_argument("--json", action="store_true", help="print the runs as JSON")
    add_verifier_option(ls)
    ls.set_defaults(handler=list_runs)


def register(args: argparse.Namespace) -> int:
    from servewitness.client.api import VerifierClient
    from servewitness.policy import load_policy

    try:
        text = args.policy.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read policy {args.policy}: {e.strerror}") from e
    load_policy(text, str(args.policy))  # fail fast, with file and line, before any RPC
    with VerifierClient(resolve(args.verifier), rpc_timeout(args), tls_from(args)) as client:
        run = client.register_run(args.name, text, str(args.policy))
    doc = {"run": run.name, "policy_digest": run.policy_digest}
    result(args, doc, [f"registered run {_t(run.name)} with policy {_t(run.policy_digest)}"])
    return 0


def list_runs(args: argparse.Namespace) -> int:
    from servewitness.client.api import VerifierClient

    with VerifierClient(resolve(args.verifier), rpc_timeout(args), tls_from(args)) as client:
        runs = client.list_runs()
    if args.json:
        doc = [
            {"name": r.name, "verdict": r.verdict.value, "policy_digest": r.policy_digest,
             "created_unix": r.created_unix, "unsafe_flags": list(r.unsafe_flags)}
            for r in runs
        ]  # fmt: skip
        sys.stdout.write(dumps({"runs": doc}) + "\n")
        return 0
    if not runs:
        sys.stdout.write("no runs registered\n")
    for r in runs:
        flags = "; ".join(_t(f) for f in r.unsafe_flags)
        unsafe = f"  UNSAFE: {flags}" if flags else ""
        sys.stdout.write(
            f"{_t(r.name)}  {r.verdict.value}  {_t(r.policy_digest[:19])}  registered "
            f"{when(r.created_unix)}{unsafe}\n"
        )
    return 0
