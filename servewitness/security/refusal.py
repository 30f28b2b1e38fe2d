"""Why a connection to the verifier failed: a TLS refusal, or nothing there.

gRPC reports every failed handshake as ``UNAVAILABLE``, and a server that refuses a client's
certificate under TLS 1.3 reaches the client only as "Socket closed": to gRPC a refused
certificate, a plaintext client at a TLS port and a verifier that is down look alike. A
refused credential is a configuration error (exit 10, NOT_AUTHORIZED), not an outage (exit 4),
so on ``UNAVAILABLE`` the client asks again itself: one TLS handshake with the same CA,
certificate and key through Python's ``ssl``, which does see the server's alert.
:func:`tls_refusal` says which side refused and why, or None when no refusal is seen (nothing
listening, a timeout, or a handshake that works: then the outage is something else).
"""

from __future__ import annotations

import socket
import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servewitness.security.tls import ClientTLS

# OpenSSL reasons that are an alert the *server* sent about this client's certificate.
_SERVER_ALERTS = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "it requires a client certificate and got none",
    "TLSV1_ALERT_UNKNOWN_CA": "it does not know the CA that signed this client's certificate",
    "SSLV3_ALERT_BAD_CERTIFICATE": "this client's certificate is bad (another CA, or damaged)",
    "TLSV1_ALERT_DECRYPT_ERROR": "this client's certificate does not verify against its CA",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "this client's certificate has expired",
    "SSLV3_ALERT_CERTIFICATE_REVOKED": "this client's certificate is revoked",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE": "this client's certificate is not for client use",
    "SSLV3_ALERT_HANDSHAKE_FAILURE": "the handshake failed (no common parameters, or no "
    "client certificate)",
    "TLSV1_ALERT_ACCESS_DENIED": "access denied",
}


# What gRPC says when no connection was made (as opposed to a server's own UNAVAILABLE answer,
# e.g. a database that refused a report): only these are asked again.
_CONNECTION_FAILED = ("failed to connect", "socket closed", "handshake", "connection reset")


def connection_failed(details: str) -> bool:
    """Whether an UNAVAILABLE with DETAILS is a connection that failed (not an RPC's answer)."""
    low = details.lower()
    return any(m in low for m in _CONNECTION_FAILED)


def _connect(address: str, timeout_s: float) -> tuple[socket.socket, str]:
    """A connected socket to gRPC target ADDRESS (``unix:PATH`` or ``HOST:PORT``), and the
    host name to check the server's certificate against."""
    if address.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout_s)
        try:
            s.connect(address[len("unix:") :])
        except OSError:
            s.close()
            raise
        return s, "localhost"
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    return socket.create_connection((host, int(port)), timeout=timeout_s), host


def _reason(e: ssl.SSLError) -> str:
    return str(e.reason or e.strerror or e)


def tls_refusal(  # noqa: PLR0911 - one answer per way a handshake ends
    address: str, tls: ClientTLS | None, timeout_s: float = 3.0
) -> str | None:
    """Which side refused the TLS handshake with ADDRESS and why; None when none did."""
    try:
        raw, host = _connect(address, timeout_s)
    except (OSError, ValueError):
        return None  # nothing listening, unreachable, or a timeout: unavailable, not refused
    with raw:
        if tls is None:
            return _plaintext_at_tls(raw, host, address)
        try:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.load_verify_locations(cadata=tls.ca.read_bytes().decode("ascii", "replace"))
            if tls.cert is not None and tls.key is not None:
                ctx.load_cert_chain(tls.cert, tls.key)
        except (OSError, ssl.SSLError, ValueError):
            return None  # the client's own files: gRPC's error says more than we could
        ctx.set_alpn_protocols(["h2"])
        name = tls.server_name or host
        try:
            conn = ctx.wrap_socket(raw, server_hostname=name)
        except ssl.SSLCertVerificationError as e:
            return (
                f"this client refused the verifier's certificate: {e.verify_message} "
                f"(checked against --tls-ca {tls.ca} and the name {name!r})"
            )
        except ssl.SSLError as e:
            return _classify(_reason(e), address)
        except OSError:
            return None
        with conn:
            try:
                # TLS 1.3: the server judges our certificate after the client's last flight.
                # A gRPC server that accepts it speaks first (HTTP/2 SETTINGS); one that
                # refuses it closes the connection, with an alert or (gRPC's) without one.
                first = conn.recv(1)
            except ssl.SSLError as e:
                return _classify(_reason(e), address)
            except OSError:
                return None  # a timeout or a reset: no verdict seen
            if first:
                return None  # the handshake works: the outage is something else
            what = (
                "this client presented no certificate and it requires one"
                if tls.cert is None
                else f"it did not accept the certificate {tls.cert} (not signed by the CA it "
                "trusts, expired, or not for client use)"
            )
            return (
                f"the verifier at {address} refused this client's certificate: {what} "
                "(it closed the connection right after the TLS handshake)"
            )
    return None


def _classify(reason: str, address: str) -> str | None:
    if reason in _SERVER_ALERTS:
        return f"the verifier at {address} refused this client's certificate: " + (
            f"{_SERVER_ALERTS[reason]} ({reason})"
        )
    if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"):
        return (
            f"this client refused the verifier at {address}: it does not speak TLS ({reason}); "
            "a verifier without TLS cannot be authenticated"
        )
    return None  # an EOF or a reset mid-handshake: no verdict on anyone's credentials


def _plaintext_at_tls(raw: socket.socket, host: str, address: str) -> str | None:
    """A client without TLS: does the verifier require it? (A handshake that needs no
    verification succeeds only against a TLS server.)"""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    try:
        with ctx.wrap_socket(raw, server_hostname=host):
            pass
    except (ssl.SSLError, OSError):
        return None  # not a TLS server either: something else is wrong
    return (
        f"the verifier at {address} requires TLS and this client has none (give --tls-ca, "
        "and --tls-cert/--tls-key or --token, or VERIFIER_TLS_CA...)"
    )
