"""TLS credentials for the verifier (server) and its clients (agents, CLI, harnesses).

Insecure mode (no TLS, no authentication) is for local demos: a verifier listens without TLS
only on a Unix socket or a loopback address, unless ``--insecure`` says otherwise out loud;
a process that serves or connects insecurely warns once (the first time), through the
logger: a JSON log line where logs are JSON, never a plain line among them.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from servewitness.errors import ConfigError, UsageError

ENV_CA, ENV_CERT, ENV_KEY, ENV_TOKEN = (
    "VERIFIER_TLS_CA",
    "VERIFIER_TLS_CERT",
    "VERIFIER_TLS_KEY",
    "VERIFIER_TOKEN",
)


def _read(path: Path | str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot read: {e.strerror}") from e


def is_local(address: str) -> bool:
    """A Unix socket or a loopback HOST:PORT."""
    if address.startswith("unix:"):
        return True
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_warned: list[str] = []  # what this process warned about: one warning per process


def warn_insecure(what: str) -> None:
    """Warn, once per process, that WHAT (``serving on ADDRESS``, ``connecting to ADDRESS``)
    runs without TLS or authentication: through structlog where the entry point configured
    it (the CLI), else as one line on stderr (a library caller's process: structlog's own
    default would print on stdout)."""
    if _warned:
        return
    _warned.append(what)
    import structlog

    event = f"INSECURE mode: {what} without TLS or authentication"
    note = "for local demos only; see docs/security.md"
    if structlog.is_configured():
        structlog.get_logger("servewitness.security").warning(event, note=note)
    else:
        print(f"verifier: warning: {event} ({note})", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ServerTLS:
    cert: Path
    key: Path
    client_ca: Path | None = None  # given: every client must present a certificate it signed

    def credentials(self) -> grpc.ServerCredentials:
        pair = (_read(self.key, "--tls-key"), _read(self.cert, "--tls-cert"))
        if self.client_ca is None:
            return grpc.ssl_server_credentials([pair])
        ca = _read(self.client_ca, "--tls-client-ca")
        return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=True)


@dataclass(frozen=True)
class ClientTLS:
    """How a client reaches a TLS verifier: the CA that signed the server's certificate, and
    optionally its own certificate and key (mTLS) and a bearer token."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None
    token: str | None = None
    server_name: str | None = None  # override the name checked in the server's certificate

    def channel(self, address: str, options: Sequence[tuple[str, object]]) -> grpc.Channel:
        if (self.cert is None) != (self.key is None):
            raise UsageError("--tls-cert and --tls-key go together")
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "--tls-ca"),
            private_key=_read(self.key, "--tls-key") if self.key else None,
            certificate_chain=_read(self.cert, "--tls-cert") if self.cert else None,
        )
        if self.token:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(self.token)
            )
        opts = list(options)
        if self.server_name:
            opts.append(("grpc.ssl_target_name_override", self.server_name))
        return grpc.secure_channel(address, creds, options=opts)


def client_tls(
    ca: str | None, cert: str | None, key: str | None, token: str | None
) -> ClientTLS | None:
    """From flags, else the environment (VERIFIER_TLS_CA, _CERT, _KEY, VERIFIER_TOKEN); None:
    insecure."""
    ca = ca or os.environ.get(ENV_CA)
    cert = cert or os.environ.get(ENV_CERT)
    key = key or os.environ.get(ENV_KEY)
    token = token or os.environ.get(ENV_TOKEN)
    if ca is None:
        if cert or key or token:
            raise UsageError("--tls-cert, --tls-key and --token need --tls-ca (TLS)")
        return None
    return ClientTLS(Path(ca), Path(cert) if cert else None, Path(key) if key else None, token)


def client_channel(
    address: str, tls: ClientTLS | None, options: Sequence[tuple[str, object]]
) -> grpc.Channel:
    if tls is None:
        warn_insecure(f"connecting to {address}")
        return grpc.insecure_channel(address, options=list(options))
    return tls.channel(address, options)
