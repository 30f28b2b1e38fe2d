"""What can go wrong with keys and bundles; each error carries its exit code (README "Exit
codes"): 7 a bundle that is damaged or does not verify, 8 signed by another key, 3 a key file
that is missing or not an Ed25519 key, 2 a key file that would be overwritten."""

from __future__ import annotations

from verifier.errors import ConfigError, Error, UsageError


class KeyFileMissing(ConfigError):
    """exit 3: no file at the path given for a key."""

    exit_code = 3


class NotAKey(ConfigError):
    """exit 3: the file is not a PEM key (or not the half that was asked for)."""

    exit_code = 3


class NotEd25519(ConfigError):
    """exit 3: a key, but not an Ed25519 one."""

    exit_code = 3


class KeyExists(UsageError):
    """exit 2: keygen would overwrite a key; --force to do it."""

    exit_code = 2


class KeyNotWritten(ConfigError):
    """exit 3: the key file cannot be written (no such directory, permission denied)."""

    exit_code = 3


class BundleMissing(ConfigError):
    """exit 3: no bundle file at the path given."""

    exit_code = 3


class BundleCorrupt(Error):
    """exit 7: the bundle is damaged, incomplete, or a check over it fails."""

    exit_code = 7

    def __init__(self, problem: str, location: str = "") -> None:
        super().__init__(f"{location}: {problem}" if location else problem)
        self.problem = problem
        self.location = location


class WrongKey(Error):
    """exit 8: the signatures are not by the key given (made by another key)."""

    exit_code = 8

    def __init__(self, problem: str, location: str = "") -> None:
        super().__init__(f"{location}: {problem}" if location else problem)
        self.problem = problem
        self.location = location
