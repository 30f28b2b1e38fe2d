"""``verifier keygen``: the Ed25519 key the verifier signs checkpoints and attestations with."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from servewitness._cli.fmt import add_json, result


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "keygen",
        help="make the Ed25519 key pair that signs audit exports",
        description="Write a new Ed25519 private key to PATH (PKCS#8 PEM, unencrypted, mode "
        "0600) and its public key to PATH.pub (SubjectPublicKeyInfo PEM), and print the key "
        "id (sha256 of the raw public key). Give PATH.pub to whoever verifies exports "
        "(verifier audit verify BUNDLE --key PATH.pub). Refuses to overwrite either file "
        "(exit 2) unless --force.",
    )
    p.add_argument("--out", type=Path, required=True, metavar="PATH", help="private key file")
    p.add_argument("--force", action="store_true", help="overwrite existing key files")
    add_json(p, '{"private_key", "public_key", "key_id"}')
    p.set_defaults(handler=run_keygen)


def run_keygen(args: argparse.Namespace) -> int:
    from servewitness.ledger import keys

    key = keys.generate()
    pub = keys.save_keypair(key, args.out, force=args.force)
    doc = {"private_key": str(args.out), "public_key": str(pub), "key_id": keys.key_id(key)}
    lines = [f"private key {args.out}", f"public key  {pub}", f"key id      {doc['key_id']}"]
    result(args, doc, lines)
    return 0
