"""Where the verifier listens and where clients find it: ``HOST:PORT``, ``unix:PATH`` or a path."""

from __future__ import annotations

import os

from servewitness.errors import UsageError

ENV_ADDRESS = "VERIFIER_ADDRESS"
DEFAULT_ADDRESS = "127.0.0.1:50551"


def normalize(address: str) -> str:
    """gRPC target string for ADDRESS; a bare path means a Unix socket."""
    address = address.strip()
    if not address:
        raise UsageError("empty verifier address")
    if address.startswith("unix:"):
        return address
    if address.startswith("/") or address.startswith("./"):
        return "unix:" + os.path.abspath(address)
    host, sep, port = address.rpartition(":")
    if (
        not sep
        or not host
        or not (port.isascii() and port.isdigit())
        or not 0 <= int(port) <= 65535
    ):
        raise UsageError(f"verifier address {address!r}: expected HOST:PORT, unix:PATH or a path")
    return address


def resolve(flag: str | None) -> str:
    """The address from --verifier, else VERIFIER_ADDRESS, else the default."""
    return normalize(flag or os.environ.get(ENV_ADDRESS) or DEFAULT_ADDRESS)
