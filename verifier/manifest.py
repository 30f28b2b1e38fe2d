"""Manifest digests: a Merkle root over the sorted (path, sha256) entries of loaded files.

Leaves are ``sha256(0x00 || path || 0x00 || sha256-hex)``, inner nodes
``sha256(0x01 || left || right)``; an odd node is carried up unchanged; the empty manifest's
root is ``sha256(b"")``. Stdlib only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def _leaf(path: str, sha256_hex: str) -> bytes:
    return hashlib.sha256(b"\x00" + path.encode() + b"\x00" + sha256_hex.encode()).digest()


def merkle_root(entries: Iterable[tuple[str, str]]) -> str:
    """``sha256:<hex>`` root over ENTRIES (path, sha256 hex), order-independent."""
    level = [_leaf(p, h) for p, h in sorted(set(entries))]
    if not level:
        return "sha256:" + hashlib.sha256(b"").hexdigest()
    while len(level) > 1:
        nxt = [
            hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest()
            for i in range(0, len(level) - 1, 2)
        ]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return "sha256:" + level[0].hex()
