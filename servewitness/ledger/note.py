"""The ledger's checkpoints as C2SP signed notes, the format transparency-log witnesses read.

A checkpoint (c2sp.org/tlog-checkpoint) is the note text::

    <origin>\\n<tree size, ASCII decimal>\\n<base64 of the RFC 6962 root hash>\\n

signed as a c2sp.org/signed-note: the text, a blank line, then one signature line per key,
``"\\u2014 " + key name + " " + base64(key ID || Ed25519 signature over the text)`` where the key
ID is the first four bytes of ``sha256(key name || 0x0A || 0x01 || 32-byte public key)``. The
verifier signs with its ledger key under the name :func:`origin` of that key, which is also
the origin line, so a note names the log it pins and who signed it; the Go reference
implementation (golang.org/x/mod/sumdb/note) and witness tools read these notes as they are.

:func:`verify` follows the spec: signatures by other keys are ignored; a note with none by
the key given is :class:`WrongKey` (exit 8); a note that claims the key (its name and key
ID) and does not verify, or that is not a well-formed checkpoint, is :class:`BundleCorrupt`
(exit 7).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

from servewitness.ledger.errors import BundleCorrupt, WrongKey
from servewitness.ledger.keys import Ed25519PrivateKey, Ed25519PublicKey, key_id, raw_public

ED25519 = 0x01  # the signed-note signature type of Ed25519
DASH = "\u2014"  # em dash: every signature line starts with it and a space
MAX_SIGNATURES = 100  # a note with more lines than this is refused (the spec: at least 16)
MAX_NOTE_BYTES = 1 << 20


def origin(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """The verifier's log name for KEY: its origin line and its key name in signatures. A
    schema-less name (the spec's recommendation) without spaces or '+', unique per key."""
    return f"vllm-verifier.ledger/{key_id(key)[:16]}"


def key_hash(name: str, pub: Ed25519PublicKey) -> bytes:
    """The 4-byte key ID of PUB signing as NAME."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([ED25519]) + raw_public(pub)).digest()[:4]


def verifier_key(name: str, pub: Ed25519PublicKey) -> str:
    """PUB as a Go ``note`` verifier key (``name+hex key ID+base64(0x01 || key)``): what a
    witness or ``note.NewVerifier`` is configured with."""
    raw = base64.b64encode(bytes([ED25519]) + raw_public(pub)).decode()
    return f"{name}+{key_hash(name, pub).hex()}+{raw}"


def checkpoint_text(origin_line: str, size: int, root: bytes) -> str:
    """The tlog-checkpoint note text (three lines, no extension lines)."""
    if not origin_line or any(c.isspace() or c == "+" for c in origin_line):
        raise ValueError(f"origin {origin_line!r} is empty or has a space or '+'")
    if size < 0 or len(root) != 32:
        raise ValueError("a checkpoint needs a size >= 0 and a 32-byte root")
    return f"{origin_line}\n{size}\n{base64.b64encode(root).decode()}\n"


def sign(text: str, key: Ed25519PrivateKey, name: str | None = None) -> str:
    """TEXT signed by KEY as a signed note (under NAME, default :func:`origin` of KEY)."""
    name = origin(key) if name is None else name
    if not text.endswith("\n"):
        raise ValueError("a note's text ends in a newline")
    sig = key_hash(name, key.public_key()) + key.sign(text.encode())
    return f"{text}\n{DASH} {name} {base64.b64encode(sig).decode()}\n"


def sign_checkpoint(key: Ed25519PrivateKey, size: int, root: bytes) -> str:
    return sign(checkpoint_text(origin(key), size, root), key)


@dataclass(frozen=True)
class Signature:
    name: str
    key_id: bytes  # 4 bytes
    sig: bytes


@dataclass(frozen=True)
class Note:
    text: str
    signatures: tuple[Signature, ...]


@dataclass(frozen=True)
class SignedCheckpoint:
    """A checkpoint whose signature by the key given verified."""

    origin: str
    size: int
    root: bytes
    note: str  # the whole signed note, as read

    @property
    def root_hex(self) -> str:
        return self.root.hex()


def parse(data: bytes | str, where: str = "checkpoint") -> Note:
    """A signed note's text and signature lines (no signature checked)."""
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > MAX_NOTE_BYTES:
        raise BundleCorrupt(f"over {MAX_NOTE_BYTES} bytes: not a signed note", where)
    try:
        s = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BundleCorrupt("not UTF-8: not a signed note", where) from None
    if any(ord(c) < 0x20 and c != "\n" for c in s):
        raise BundleCorrupt("a control character: not a signed note", where)
    if not s.endswith("\n"):
        raise BundleCorrupt("does not end in a newline: not a signed note", where)
    cut = s.rfind("\n\n")
    if cut < 0:
        raise BundleCorrupt("no blank line before the signatures: not a signed note", where)
    text, lines = s[: cut + 1], s[cut + 2 :].splitlines()
    if not lines:
        raise BundleCorrupt("no signature lines", where)
    if len(lines) > MAX_SIGNATURES:
        raise BundleCorrupt(f"over {MAX_SIGNATURES} signature lines", where)
    sigs = []
    for i, line in enumerate(lines, 1):
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != DASH or not parts[1] or "+" in parts[1]:
            raise BundleCorrupt(f"signature line {i} is not '{DASH} NAME SIGNATURE'", where)
        try:
            blob = base64.b64decode(parts[2], validate=True)
        except (binascii.Error, ValueError):
            raise BundleCorrupt(f"signature line {i}: not base64", where) from None
        if len(blob) < 5:
            raise BundleCorrupt(f"signature line {i}: too short", where)
        sigs.append(Signature(parts[1], blob[:4], blob[4:]))
    return Note(text, tuple(sigs))


def _body(text: str, where: str) -> tuple[str, int, bytes]:
    lines = text.split("\n")[:-1]  # the text ends in a newline
    if len(lines) < 3 or any(not line for line in lines):
        raise BundleCorrupt("not a checkpoint: fewer than three lines, or an empty one", where)
    size_s, root_s = lines[1], lines[2]
    if not size_s.isascii() or not size_s.isdigit() or (size_s != "0" and size_s[0] == "0"):
        raise BundleCorrupt(f"tree size {size_s!r} is not a decimal number", where)
    try:
        root = base64.b64decode(root_s, validate=True)
    except (binascii.Error, ValueError):
        root = b""
    if len(root) != 32:
        raise BundleCorrupt("the root hash is not the base64 of 32 bytes", where)
    return lines[0], int(size_s), root


def verify(data: bytes | str, pub: Ed25519PublicKey, where: str = "checkpoint") -> SignedCheckpoint:
    """The checkpoint in DATA, once every signature line by PUB verifies (there must be one).
    Signatures by other keys are ignored, as the spec says."""
    n = parse(data, where)
    origin_line, size, root = _body(n.text, where)
    # The key ID hashes the key name with the key, so a line is PUB's exactly when its ID is
    # the hash of its own name with PUB (whatever the name: a log's may differ from its origin).
    mine = [s for s in n.signatures if s.key_id == key_hash(s.name, pub)]
    if not mine:
        names = ", ".join(f"{s.name} ({s.key_id.hex()})" for s in n.signatures)
        raise WrongKey(
            f"signed by {names}, not by the key given (verifier {key_id(pub)[:16]}, "
            f"{origin(pub)} ({key_hash(origin(pub), pub).hex()}))",
            where,
        )
    from cryptography.exceptions import InvalidSignature

    for s in mine:
        try:
            pub.verify(s.sig, n.text.encode())
        except InvalidSignature:
            raise BundleCorrupt(
                "its signature by the key given does not verify: the note was altered", where
            ) from None
    text = data if isinstance(data, str) else data.decode()
    return SignedCheckpoint(origin_line, size, root, text)
