"""DSSE v1 envelopes (github.com/secure-systems-lab/dsse): signed with the verifier's Ed25519
key here; read and verified by ``servewitness.wire.dsse`` (re-exported), the one
implementation the offline checks and the gate client share.
"""

from __future__ import annotations

from typing import Any

from servewitness.ledger.keys import Ed25519PrivateKey
from servewitness.wire.dsse import Verified, b64decode, b64encode, key_id, pae, verify

__all__ = ["Verified", "b64decode", "b64encode", "pae", "sign", "verify"]


def sign(payload: bytes, payload_type: str, key: Ed25519PrivateKey) -> dict[str, Any]:
    """An envelope with one signature by KEY over PAYLOAD."""
    sig = key.sign(pae(payload_type, payload))
    return {
        "payload": b64encode(payload),
        "payloadType": payload_type,
        "signatures": [{"keyid": key_id(key), "sig": b64encode(sig)}],
    }
