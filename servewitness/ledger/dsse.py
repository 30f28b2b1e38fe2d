"""DSSE v1 envelopes (github.com/secure-systems-lab/dsse): sign and verify with Ed25519.

The signature covers ``PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body``
(lengths in ASCII decimal of byte counts), never the base64 text, so re-encoding an envelope
does not change what was signed. An envelope is JSON ``{"payload": b64, "payloadType": str,
"signatures": [{"keyid": str, "sig": b64}]}``.

:func:`verify` accepts an envelope when one of its signatures verifies with the key given;
``keyid`` is a hint only (the spec says to make no security decision on it) and chooses which
error a failure is: :class:`WrongKey` when no signature even claims to be by the key given,
:class:`BundleCorrupt` when one does and does not verify (the payload or signature changed).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature

from servewitness.ledger.errors import BundleCorrupt, WrongKey
from servewitness.ledger.keys import Ed25519PrivateKey, Ed25519PublicKey, key_id


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


def sign(payload: bytes, payload_type: str, key: Ed25519PrivateKey) -> dict[str, Any]:
    """An envelope with one signature by KEY over PAYLOAD."""
    sig = key.sign(pae(payload_type, payload))
    return {
        "payload": b64encode(payload),
        "payloadType": payload_type,
        "signatures": [{"keyid": key_id(key), "sig": b64encode(sig)}],
    }


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
