"""What a certificate says its holder may do (URI SANs), read without importing the X.509
machinery until a certificate is actually read (a verifier without TLS never needs it)."""

from __future__ import annotations

from dataclasses import dataclass

TARGET_URI = "verifier:target:"
ROLE_URI = "verifier:role:"
ROLES = ("operator", "harness", "auditor")


@dataclass(frozen=True)
class Identity:
    """What a peer's certificate says it is."""

    name: str  # common name (an agent's id)
    targets: frozenset[str]
    roles: frozenset[str]


def identity_of(pem: bytes) -> Identity:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(pem)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    name = str(cns[0].value) if cns else ""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    targets = frozenset(u[len(TARGET_URI) :] for u in uris if u.startswith(TARGET_URI))
    roles = frozenset(u[len(ROLE_URI) :] for u in uris if u.startswith(ROLE_URI))
    return Identity(name, targets, roles & set(ROLES))
