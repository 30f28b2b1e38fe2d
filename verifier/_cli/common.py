"""Options shared by the client subcommands."""

from __future__ import annotations

import argparse
from typing import Any

from verifier.client.address import DEFAULT_ADDRESS, ENV_ADDRESS
from verifier.security.tls import ClientTLS, client_tls


def add_verifier_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--verifier",
        metavar="ADDRESS",
        help=f"verifier address HOST:PORT, unix:PATH or a socket path "
        f"(default: ${ENV_ADDRESS}, else {DEFAULT_ADDRESS})",
    )
    p.add_argument(
        "--tls-ca",
        metavar="PEM",
        help="the CA of the verifier's certificate: connect with TLS (default: $VERIFIER_TLS_CA; "
        "none: INSECURE, warned)",
    )
    p.add_argument(
        "--tls-cert", metavar="PEM", help="client certificate (mTLS; $VERIFIER_TLS_CERT)"
    )
    p.add_argument("--tls-key", metavar="PEM", help="its private key ($VERIFIER_TLS_KEY)")
    p.add_argument(
        "--token", help="bearer token (prefer $VERIFIER_TOKEN: a flag shows in the process list)"
    )


def tls_from(args: argparse.Namespace) -> ClientTLS | None:
    """The client's TLS settings from the options above, else the environment."""
    return client_tls(args.tls_ca, args.tls_cert, args.tls_key, args.token)


def verdict_json(v: Any) -> dict[str, Any]:
    """JSON form of a RunVerdict (verdicts, findings, hook fires next to productive steps)."""
    return {
        "run": v.run,
        "policy_digest": v.policy_digest,
        "verdict": v.verdict.value,
        "evaluated_unix": v.evaluated_unix,
        "findings": [_finding(f) for f in v.findings],
        "targets": [
            {
                "target": t.target,
                "verdict": t.verdict.value,
                "report_unix": t.report_unix,
                "findings": [_finding(f) for f in t.findings],
                "hooks": [
                    {
                        "name": h.name,
                        "pid": h.pid,
                        "role": h.role,
                        "rank": h.rank,
                        "fired": h.fired,
                        "fired_on_productive_steps": h.fired_productive,
                        "fired_on_decode_steps": h.fired_decode,
                        "decode_steps": h.decode_steps,
                        "fired_on_prefill_steps": h.fired_prefill,
                        "prefill_steps": h.prefill_steps,
                        "fired_outside_steps": h.fired_outside,
                        "on": h.on,
                        "productive_steps": h.productive_steps,
                        "total_steps": h.total_steps,
                    }
                    for h in t.hooks
                ],
            }
            for t in v.targets
        ],
    }


def _finding(f: Any) -> dict[str, Any]:
    return {
        "id": f.id,
        "severity": f.severity.value,
        "message": f.message,
        "target": f.target,
        "context": dict(f.context),
    }
