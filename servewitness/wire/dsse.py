"""DSSE v1 envelopes (github.com/secure-systems-lab/dsse), read and verified with the
verifier's Ed25519 public key (loaded from its file here too): the one implementation the
verifier's offline checks (``ledger/``: bundles, checkpoints, ``verify-seal``) and the gate
client (``client/window.check_seal``) share. It lives in ``wire`` because both may import it
(docs/architecture.md); signing and the private key, which only the verifier holds, are
``ledger/dsse.sign`` and ``ledger/keys``.

The signature covers ``PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body``
(lengths in ASCII decimal of byte counts), never the base64 text, so re-encoding an envelope
does not change what was signed. An envelope is JSON ``{"payload": b64, "payloadType": str,
"signatures": [{"keyid": str, "sig": b64}]}``.

:func:`verify` accepts an envelope when one of its signatures verifies with the key given;
``keyid`` is a hint only (the spec says to make no security decision on it) and chooses which
error a failure is: :class:`WrongKey` (exit 8) when no signature even claims to be by the key
given, :class:`BundleCorrupt` (exit 7) when one does and does not verify (the payload or
signature changed). ``cryptography`` is imported when a key is used, not with the module (the
CLI's start).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servewitness.errors import BundleCorrupt, ConfigError, WrongKey

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )


class KeyFileMissing(ConfigError):
    """No file at the path given for a key."""


class NotAKey(ConfigError):
    """The file is not a PEM key (or not the half that was asked for)."""


class NotEd25519(ConfigError):
    """A key, but not an Ed25519 one."""


def read_key_file(path: Path) -> bytes:
    """PATH's bytes; :class:`KeyFileMissing` or :class:`NotAKey` (exit 3) saying why not."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise KeyFileMissing(f"{path}: no such key file") from None
    except IsADirectoryError:
        raise NotAKey(f"{path}: a directory, not a key file") from None
    except OSError as e:
        raise KeyFileMissing(f"{path}: cannot read the key file: {e.strerror}") from None


def public_path(path: Path) -> Path:
    """Where the public half of the private key at PATH is kept (``KEY.pub``)."""
    return path.with_name(path.name + ".pub")


def load_public_key(path: Path) -> Ed25519PublicKey:
    """The public key at PATH. A private key is refused (:class:`NotAKey`): whoever verifies
    should never hold it; its public half is PATH.pub next to it."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    data = read_key_file(path)
    if b"PRIVATE KEY-----" in data:
        raise NotAKey(
            f"{path}: a private key; verify with the public key ({public_path(path).name})"
        )
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise NotAKey(f"{path}: not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise NotEd25519(f"{path}: a {type(key).__name__} key, not Ed25519")
    return key


def pae(payload_type: str, payload: bytes) -> bytes:
    """Pre-authentication encoding, DSSE v1."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64decode(text: str) -> bytes:
    """Standard or URL-safe base64, padded or not (the spec allows either); anything else
    raises ValueError."""
    s = text.strip().replace("-", "+").replace("_", "/")
    s += "=" * (-len(s) % 4)
    try:
        return base64.b64decode(s, validate=True)
    except binascii.Error as e:
        raise ValueError(f"not base64: {e}") from None


def raw_public(key: Ed25519PublicKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """Hex sha256 of the raw public key (64 hex digits; the first 16 name it to a person)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return hashlib.sha256(raw_public(pub)).hexdigest()


@dataclass(frozen=True)
class Verified:
    payload: bytes
    payload_type: str
    keyid: str


def _field(env: Mapping[str, Any], name: str, where: str) -> Any:
    if name not in env:
        raise BundleCorrupt(f"the envelope has no {name!r}", where)
    return env[name]


def verify(env: object, key: Ed25519PublicKey, where: str = "envelope") -> Verified:
    """The payload of envelope ENV (parsed JSON) once a signature by KEY verifies over it.

    Raises :class:`BundleCorrupt` for a malformed envelope or a signature that claims KEY's id
    and does not verify; :class:`WrongKey` when the signatures are by another key."""
    from cryptography.exceptions import InvalidSignature

    if not isinstance(env, Mapping):
        raise BundleCorrupt("the envelope is not a JSON object", where)
    payload_b64 = _field(env, "payload", where)
    payload_type = _field(env, "payloadType", where)
    sigs = _field(env, "signatures", where)
    if not isinstance(payload_b64, str) or not isinstance(payload_type, str):
        raise BundleCorrupt("payload and payloadType must be strings", where)
    if not isinstance(sigs, list) or not sigs:
        raise BundleCorrupt("the envelope has no signatures", where)
    try:
        payload = b64decode(payload_b64)
    except ValueError as e:
        raise BundleCorrupt(f"payload: {e}", where) from None
    try:
        message = pae(payload_type, payload)
    except UnicodeEncodeError:  # a lone surrogate ("\\ud800" in the JSON): not text
        raise BundleCorrupt("payloadType is not valid Unicode", where) from None
    mine = key_id(key)
    claimed: list[str] = []
    for i, s in enumerate(sigs):
        at = f"{where}.signatures[{i}]"
        if not isinstance(s, Mapping) or not isinstance(s.get("sig"), str):
            raise BundleCorrupt("a signature must be an object with a base64 'sig'", at)
        kid = s.get("keyid", "")
        if not isinstance(kid, str):
            raise BundleCorrupt("keyid must be a string", at)
        try:
            sig = b64decode(s["sig"])
        except ValueError as e:
            raise BundleCorrupt(f"sig: {e}", at) from None
        try:
            key.verify(sig, message)
        except InvalidSignature:
            claimed.append(kid)
            continue
        return Verified(payload, payload_type, mine)
    if mine in claimed or "" in claimed:
        raise BundleCorrupt(
            f"the signature by key {mine[:16]} does not verify: the payload or the "
            "signature was changed",
            where,
        )
    others = ", ".join(sorted({k[:16] for k in claimed}))
    raise WrongKey(f"signed by key {others}, not by the key given ({mine[:16]})", where)
