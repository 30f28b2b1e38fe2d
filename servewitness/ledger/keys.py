"""The verifier's Ed25519 signing key: generate, save, load, and name it.

The private key is stored as unencrypted PKCS#8 PEM, mode 0600; the public key as
SubjectPublicKeyInfo PEM. Loading names what is wrong: no file (:class:`KeyFileMissing`), not
a PEM key or the other half of the pair (:class:`NotAKey`), a key of another algorithm
(:class:`NotEd25519`). A key's id is the hex sha256 of its 32 raw public bytes.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from servewitness.ledger.errors import KeyExists, KeyNotWritten, NotAKey, NotEd25519
from servewitness.wire.dsse import key_id, load_public_key, public_path, raw_public, read_key_file

__all__ = [  # the public half (loading, ids) is ``wire/dsse``'s, re-exported
    "Ed25519PrivateKey",
    "Ed25519PublicKey",
    "generate",
    "key_id",
    "load_or_generate",
    "load_private_key",
    "load_public_key",
    "public_path",
    "raw_public",
    "save_keypair",
]


def generate() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _write(path: Path, data: bytes, mode: int, force: bool) -> None:
    """DATA to PATH with MODE from the start (never readable by others, even for a moment);
    an existing file is replaced atomically with FORCE, refused without."""
    if not force:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            raise KeyExists(f"{path} exists; use --force to overwrite it") from None
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def save_keypair(key: Ed25519PrivateKey, path: Path, *, force: bool = False) -> Path:
    """Private key to PATH (0600), public key to PATH.pub (0644). Refuses to overwrite either
    unless FORCE (checked for both before anything is written). The public key's path."""
    pub = public_path(path)
    if not force:
        for p in (path, pub):
            if p.exists() or p.is_symlink():
                raise KeyExists(f"{p} exists; use --force to overwrite it")
    for p, data, mode in (
        (path, private_pem(key), 0o600),
        (pub, public_pem(key.public_key()), 0o644),
    ):
        try:
            _write(p, data, mode, force)
        except OSError as e:
            raise KeyNotWritten(f"{p}: cannot write the key file: {e.strerror}") from None
    return pub


def load_private_key(path: Path) -> Ed25519PrivateKey:
    data = read_key_file(path)
    if b"-----BEGIN PUBLIC KEY-----" in data:
        raise NotAKey(f"{path}: a public key; signing needs the private key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise NotAKey(f"{path}: an encrypted private key (not supported)") from None
    except (ValueError, UnsupportedAlgorithm):
        raise NotAKey(f"{path}: not a PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise NotEd25519(f"{path}: a {type(key).__name__} key, not Ed25519")
    return key


def load_or_generate(path: Path) -> tuple[Ed25519PrivateKey, bool]:
    """The private key at PATH, generated and saved there (with PATH.pub) when there is none:
    (key, whether it was generated now). An existing key is never overwritten: a public half
    without its private key is refused, since a new key beside it would silently replace the
    identity auditors hold (:class:`KeyExists`, exit 2, would be wrong here: it is
    configuration)."""
    if path.exists() or path.is_symlink():
        return load_private_key(path), False
    pub = public_path(path)
    if pub.exists() or pub.is_symlink():
        raise NotAKey(
            f"{pub} exists without its private key {path}: restore the key, or move the "
            "public key away to start a new ledger key (auditors holding it must be told)"
        )
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise KeyNotWritten(
            f"{path.parent}: cannot create the key's directory: {e.strerror}"
        ) from None
    key = generate()
    try:
        save_keypair(key, path)
    except KeyExists:  # another verifier made it meanwhile: use that one
        return load_private_key(path), False
    return key, True
