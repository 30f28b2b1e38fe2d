"""Options shared by the client subcommands."""

from __future__ import annotations

import argparse
import math
import os

from servewitness.client.address import DEFAULT_ADDRESS, ENV_ADDRESS
from servewitness.client.deadline import DEFAULT_RPC_TIMEOUT_S
from servewitness.errors import ConfigError
from servewitness.security.tls import ClientTLS, client_tls

ENV_RPC_TIMEOUT = "VERIFIER_RPC_TIMEOUT"


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
    p.add_argument(
        "--rpc-timeout",
        type=positive_seconds,
        metavar="S",
        help=f"seconds each call to the verifier may take (default: ${ENV_RPC_TIMEOUT}, else "
        f"{DEFAULT_RPC_TIMEOUT_S:g}; audit calls 60); a command given --timeout also ends its "
        "calls when that time is up",
    )


def positive_seconds(value: str) -> float:
    """An argparse type: a finite number of seconds above zero."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {value}")
    return seconds


def rpc_timeout(args: argparse.Namespace, default: float = DEFAULT_RPC_TIMEOUT_S) -> float:
    """Each call's deadline: --rpc-timeout, else $VERIFIER_RPC_TIMEOUT, else DEFAULT."""
    if getattr(args, "rpc_timeout", None) is not None:
        return float(args.rpc_timeout)
    env = os.environ.get(ENV_RPC_TIMEOUT)
    if env is None or not env.strip():
        return default
    try:
        return positive_seconds(env)
    except argparse.ArgumentTypeError as e:
        raise ConfigError(f"${ENV_RPC_TIMEOUT}: {e}") from None


def tls_from(args: argparse.Namespace) -> ClientTLS | None:
    """The client's TLS settings from the options above, else the environment."""
    return client_tls(args.tls_ca, args.tls_cert, args.tls_key, args.token)
