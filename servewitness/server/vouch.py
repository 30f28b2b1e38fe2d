"""A verifier's word on a report it received, which a writer of its database cannot forge.

A stored report's receipt says who its agent was authenticated as and when it arrived
(``server/follow.py``); the other verifiers on the database (and the other processes of
``serve --processes``) follow the rows and take the receipt's word. The ledger does not make
that word the verifier's: whoever can write the database (its owner, a PostgreSQL
administrator, a backup restored) can add a row with its ledger entry, as a verifier's own
code would, and name any agent in its receipt, and the followers would judge it as that
agent's evidence: a window opened and sealed on a report no agent sent.

So a verifier vouches for each receipt it writes: an HMAC-SHA256 over the row (agent, seq,
target, receipt time, the body's sha256) and the receipt's fields, keyed by a key derived from
its signing key (``--signing-key``, which every verifier on one database shares and the
database does not hold). A follower takes a row as evidence only when the vouch checks under
its own key. A verifier without a signing key vouches for nothing and can check nothing: it
cannot seal windows either, and it follows other rows as before (docs/threat-model.md).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servewitness.ledger.keys import Ed25519PrivateKey

_CONTEXT = b"servewitness receipt vouch v1\x00"


def receipt_key(signing_key: Ed25519PrivateKey | None) -> bytes | None:
    """The key receipts are vouched for with, derived from SIGNING_KEY (None: none)."""
    if signing_key is None:
        return None
    from cryptography.hazmat.primitives import serialization

    raw = signing_key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    return hashlib.sha256(_CONTEXT + raw).digest()


def row_digest(agent_id: str, seq: int, target: str, received_unix: float, body: bytes) -> str:
    """What of a report's row a vouch binds: a receipt copied onto another row does not
    check there."""
    parts = [agent_id, seq, target, received_unix, hashlib.sha256(body).hexdigest()]
    return hashlib.sha256(json.dumps(parts, separators=(",", ":")).encode()).hexdigest()


def vouch(
    key: bytes, row: str, authenticated_as: str | None, lag_s: float, transit_s: float
) -> str:
    """The vouch for a receipt of ROW (``row_digest``) with these fields (as stored, rounded)."""
    text = json.dumps([row, authenticated_as, lag_s, transit_s], separators=(",", ":"))
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def event_vouch(key: bytes, row: tuple[str, float, str, str, str, int]) -> str:
    """The vouch for a target's retirement ROW (target, at, event, by, last agent, last
    seq, as ``target_events`` stores it): a row a writer of the database adds (a forget
    nobody asked for) has none that checks."""
    text = json.dumps(["target_event", *row], separators=(",", ":"))
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def checks(  # noqa: PLR0917 - a receipt's fields, one by one
    key: bytes,
    row: str,
    authenticated_as: str | None,
    lag_s: float,
    transit_s: float,
    given: str | None,
) -> bool:
    """Whether GIVEN is KEY's vouch for that receipt of ROW."""
    if given is None:
        return False
    return hmac.compare_digest(vouch(key, row, authenticated_as, lag_s, transit_s), given)
