"""A small certificate authority for a lab (``verifier certs``): a CA, a server certificate
for the verifier, and client certificates that carry what their holder may do.

Identity is in the certificate, checked by the verifier on every call:

* an **agent** certificate's common name is the agent id, and one URI SAN
  ``verifier:target:NAME`` per target it may report for;
* a **client** certificate carries URI SANs ``verifier:role:ROLE`` (operator, harness,
  auditor);
* the **server** certificate names the verifier's DNS names and IP addresses.

Keys are ECDSA P-256, PEM, private keys 0600. For production, issue the same SANs from an
existing PKI (docs/security.md); nothing here is special beyond them.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from servewitness.errors import ConfigError, UsageError
from servewitness.security.roles import ROLE_URI, ROLES, TARGET_URI, Identity, identity_of

__all__ = ["ROLES", "Identity", "Issued", "identity_of", "init_ca", "issue"]


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


def _write(path: Path, data: bytes, private: bool, force: bool) -> None:
    if path.exists() and not force:
        raise UsageError(f"{path} exists (use --force to replace it)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write: {e.strerror}") from e


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def init_ca(
    directory: Path, name: str = "verifier lab CA", days: int = 3650, force: bool = False
) -> Issued:
    """A new CA: DIRECTORY/ca.pem and DIRECTORY/ca.key."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    out = Issued(directory / "ca.pem", directory / "ca.key")
    _write(out.key, _key_pem(key), private=True, force=force)
    _write(out.cert, cert.public_bytes(serialization.Encoding.PEM), private=False, force=force)
    return out


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    except FileNotFoundError as e:
        raise ConfigError(f"{e.filename}: no CA here (run `verifier certs init` first)") from e
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{directory}: ca.pem / ca.key are not a CA and its key: {e}") from e
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{directory}/ca.key: not an EC key")
    return cert, key


def issue(
    directory: Path,
    name: str,
    *,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    targets: Sequence[str] = (),
    roles: Sequence[str] = (),
    days: int = 365,
    force: bool = False,
) -> Issued:
    """DIRECTORY/NAME.pem and NAME.key, signed by the CA in DIRECTORY. DNS/IPS make it a
    server certificate; TARGETS an agent's, ROLES a client's."""
    for r in roles:
        if r not in ROLES:
            raise UsageError(f"unknown role {r!r}: one of {', '.join(ROLES)}")
    if not (dns or ips or targets or roles):
        raise UsageError("a certificate needs --dns/--ip (server), --target (agent) or --role")
    ca_cert, ca_key = _load_ca(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    try:
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    except ValueError as e:
        raise UsageError(f"--ip: {e}") from e
    sans += [x509.UniformResourceIdentifier(TARGET_URI + t) for t in targets]
    sans += [x509.UniformResourceIdentifier(ROLE_URI + r) for r in roles]
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if (dns or ips) else []
    if targets or roles:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    out = Issued(directory / f"{safe}.pem", directory / f"{safe}.key")
    _write(out.key, _key_pem(key), private=True, force=force)
    _write(out.cert, cert.public_bytes(serialization.Encoding.PEM), private=False, force=force)
    return out
