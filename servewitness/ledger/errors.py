"""What can go wrong with keys and bundles. Each derives from the base error of its exit code
(``servewitness.errors``): 3 a key or bundle file that is missing or not an Ed25519 key, 2 a key
file that would be overwritten; a damaged bundle is ``BundleCorrupt`` (7), one signed by
another key ``WrongKey`` (8)."""

from __future__ import annotations

from servewitness.errors import BundleCorrupt, ConfigError, UsageError, WrongKey

# a key file's errors, shared with whoever loads a public key (the gate client too)
from servewitness.wire.dsse import KeyFileMissing, NotAKey, NotEd25519

__all__ = [
    "BundleCorrupt",
    "BundleMissing",
    "KeyExists",
    "KeyFileMissing",
    "KeyNotWritten",
    "NotAKey",
    "NotEd25519",
    "WrongKey",
]


class KeyExists(UsageError):
    """keygen would overwrite a key; --force to do it."""


class KeyNotWritten(ConfigError):
    """The key file cannot be written (no such directory, permission denied)."""


class BundleMissing(ConfigError):
    """No bundle file at the path given."""
