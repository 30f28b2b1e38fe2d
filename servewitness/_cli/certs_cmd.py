"""``verifier certs``: a small CA and certificates for a lab, and bearer tokens."""

from __future__ import annotations

import argparse
import secrets
from pathlib import Path
from typing import Any

from servewitness._cli.fmt import add_json, result


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "certs",
        help="a lab CA, certificates for the verifier, agents and clients, and tokens",
        description="Make a small certificate authority and the certificates mutual TLS "
        "needs: the verifier's (--dns/--ip), an agent's (its id and the targets it may "
        "report for: --target), a client's (--role operator|harness|auditor). For production "
        "issue the same subject alternative names from your own PKI (docs/security.md).",
    )
    acts = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    i = acts.add_parser("init", help="create DIR/ca.pem and DIR/ca.key")
    i.add_argument("--dir", type=Path, required=True, help="where the CA files go")
    i.add_argument("--days", type=int, default=3650, help="validity (default 3650)")
    i.add_argument("--force", action="store_true", help="replace an existing CA")
    add_json(i, '{"cert", "key"}')
    i.set_defaults(handler=run_init)
    s = acts.add_parser(
        "issue",
        help="issue DIR/NAME.pem and DIR/NAME.key from the CA in DIR",
        description="NAME is the certificate's common name: an agent's must be its --agent-id.",
    )
    s.add_argument("name", metavar="NAME", help="the common name (an agent's: its --agent-id)")
    s.add_argument("--dir", type=Path, required=True, help="the CA's directory; output too")
    s.add_argument("--dns", action="append", default=[], help="server: a DNS name (repeatable)")
    s.add_argument("--ip", action="append", default=[], help="server: an IP address")
    s.add_argument("--target", action="append", default=[], help="agent: a target it reports")
    s.add_argument("--role", action="append", default=[], help="client: operator|harness|auditor")
    s.add_argument("--days", type=int, default=365, help="validity (default 365)")
    s.add_argument("--force", action="store_true", help="replace existing files")
    add_json(s, '{"name", "cert", "key"}')
    s.set_defaults(handler=run_issue)
    t = acts.add_parser(
        "token",
        help="make a bearer token; print it and the [[token]] entry for serve --tokens",
        description="Prints the token (give it to its holder, e.g. as $VERIFIER_TOKEN) and the "
        "TOML entry to append to the file `verifier serve --tokens` reads (it holds only the "
        "token's sha256).",
    )
    t.add_argument("--name", required=True, help="who holds the token (shown in logs)")
    t.add_argument("--role", choices=("operator", "harness", "auditor"), help="the role it grants")
    t.add_argument("--target", action="append", default=[], help="an agent's target")
    add_json(t, '{"token", "name", "role", "targets", "sha256"}: the entry\'s fields')
    t.set_defaults(handler=run_token, product_on_stdout=True)  # the token


def run_init(args: argparse.Namespace) -> int:
    from servewitness.security.certs import init_ca

    out = init_ca(args.dir, days=args.days, force=args.force)
    result(args, {"cert": str(out.cert), "key": str(out.key)}, [
        f"CA: {out.cert} (key {out.key}, mode 0600)"
    ])  # fmt: skip
    return 0


def run_issue(args: argparse.Namespace) -> int:
    from servewitness.security.certs import issue

    out = issue(
        args.dir, args.name, dns=args.dns, ips=args.ip, targets=args.target, roles=args.role,
        days=args.days, force=args.force,
    )  # fmt: skip
    doc = {"name": args.name, "cert": str(out.cert), "key": str(out.key)}
    result(args, doc, [f"{args.name}: {out.cert} (key {out.key}, mode 0600)"])
    return 0


def run_token(args: argparse.Namespace) -> int:
    from servewitness.errors import UsageError
    from servewitness.security.auth import token_digest

    if not args.role and not args.target:
        raise UsageError("a token needs --role or --target (an agent's)")
    # A fixed prefix: a token that began with "-" would read as an option on a command line.
    token = "vt_" + secrets.token_urlsafe(32)
    lines = [f"token: {token}", "", "[[token]]", f'name = "{args.name}"']
    if args.role:
        lines.append(f'role = "{args.role}"')
    if args.target:
        lines.append("targets = [" + ", ".join(f'"{t}"' for t in args.target) + "]")
    lines.append(f'sha256 = "{token_digest(token)}"')
    doc = {
        "token": token, "name": args.name, "role": args.role, "targets": list(args.target),
        "sha256": token_digest(token),
    }  # fmt: skip
    result(args, doc, lines)
    return 0
