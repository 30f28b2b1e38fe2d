"""``verifier audit checkpoint`` and ``verifier audit consistency``: the ledger's signed
checkpoints as C2SP notes to keep outside the database, and RFC 9162 consistency proofs
between two of them; and the anchored part of ``audit verify --checkpoint``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servewitness._cli import fmt
from servewitness._cli._audit_db import DB_HELP, open_ro
from servewitness._cli.common import add_verifier_option, rpc_timeout, tls_from
from servewitness.errors import ConfigError, NotFound, UsageError
from servewitness.server.db import read_error

if TYPE_CHECKING:
    from servewitness.ledger.anchor import Anchored, NotAnExtension
    from servewitness.ledger.keys import Ed25519PublicKey
    from servewitness.ledger.note import SignedCheckpoint
    from servewitness.server.db import Database


def add_actions(acts: Any) -> None:
    c = acts.add_parser(
        "checkpoint",
        help="write the latest signed checkpoint (a C2SP signed note) to keep elsewhere",
        description="The latest checkpoint the verifier signed, as a C2SP tlog-checkpoint "
        "signed note (origin, tree size, base64 RFC 6962 root, an Ed25519 signature line): "
        "the format transparency-log witnesses read. Keep it outside the database (a "
        "witness, an auditor, a ticket): `audit verify --db DB --checkpoint FILE --key "
        "KEY.pub` later proves the ledger only grew since. Exit 6 when the verifier has "
        "signed none yet.",
    )
    c.add_argument("--db", help=DB_HELP)
    c.add_argument("--out", metavar="FILE", help="write the note here (default: stdout)")
    add_verifier_option(c)
    c.add_argument("--key", metavar="KEY.pub", help=REMOTE_KEY_HELP)
    fmt.add_json(c, '{"note", "size", "root", "out"}: the note inside, not on stdout alone')
    c.set_defaults(handler=run_checkpoint, product_on_stdout=True)  # the note, without --out
    k = acts.add_parser(
        "consistency",
        help="a consistency proof between two signed checkpoints: produce (--db) or check",
        description="With --db: prove, from the ledger, that the checkpoint --from is a "
        "prefix of --to (default: the latest checkpoint stored), check the proof, and write "
        "it (JSON, --out or stdout). Without --db, with --proof: check a proof written so "
        "against the two notes, offline. Both notes must be signed by --key. Exit 0 "
        "consistent, 1 not (or the ledger no longer has --from's root), 7 a damaged note or "
        "proof, 8 a note signed by another key. With --verifier ADDR instead of --db (the "
        "auditor or operator role, no database access): the verifier proves its ledger now "
        "extends --from, and the answer (a note signed now, the proof, the root at --from's "
        "size) is checked here with --key; --out writes the new note.",
    )
    k.add_argument(
        "--from", dest="old", required=True, metavar="OLD.note", help="the older signed checkpoint"
    )
    k.add_argument(
        "--to", dest="new", metavar="NEW.note", help="the newer one (default: the latest stored)"
    )
    k.add_argument("--key", required=True, help="the verifier's public key (PEM)")
    k.add_argument("--db", help=DB_HELP + " (produce the proof)")
    k.add_argument("--proof", metavar="FILE", help="a proof to check offline (without --db)")
    k.add_argument("--out", metavar="FILE", help="write the proof here (with --db)")
    add_verifier_option(k)
    fmt.add_json(k, '{"consistent", "from", "to", "proof_hashes", "proof", "note", "out"}')
    k.set_defaults(handler=run_consistency, product_on_stdout=True)  # the proof


REMOTE_KEY_HELP = (
    "with --verifier: the verifier's public key (PEM); the note it signs now is checked with "
    "it (required: no key is taken from the answer)"
)


def _source(args: argparse.Namespace) -> str | None:
    """The --verifier address, or None for --db; both or neither is a usage error."""
    if args.db is not None and args.verifier is not None:
        raise UsageError("give either --db (the database) or --verifier (over gRPC), not both")
    if args.db is None and args.verifier is None:
        raise UsageError("give --db DATABASE, or --verifier ADDRESS --key KEY.pub")
    return args.verifier  # type: ignore[no-any-return]


def _client(args: argparse.Namespace) -> Any:
    from servewitness.client.address import resolve
    from servewitness.client.api import VerifierClient

    return VerifierClient(resolve(args.verifier), rpc_timeout(args, 60.0), tls_from(args))


def _read(path: str, what: str) -> bytes:
    from servewitness.ledger.errors import BundleMissing

    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise BundleMissing(f"{path}: no such {what} file") from None
    except OSError as e:
        raise BundleMissing(f"{path}: cannot read the {what}: {e.strerror}") from None


def read_note(path: str, key: Ed25519PublicKey) -> SignedCheckpoint:
    """The checkpoint note at PATH, its signature by KEY verified (exit 7 damaged, 8 another
    key, 3 no such file)."""
    from servewitness.ledger import note

    return note.verify(_read(path, "checkpoint"), key, path)


def anchor(db: Database, old: SignedCheckpoint) -> tuple[Anchored | None, NotAnExtension | None]:
    """Whether DB's ledger extends OLD: (the proof, None) or (None, what broke it)."""
    from servewitness.ledger.anchor import NotAnExtension, check

    try:
        return check(db, old), None
    except NotAnExtension as e:
        return None, e


def anchor_json(
    old: SignedCheckpoint, anchored: Anchored | None, problem: NotAnExtension | None
) -> dict[str, Any]:
    from servewitness.ledger.anchor import proof_json

    out: dict[str, Any] = {"origin": old.origin, "size": old.size, "root": old.root_hex}
    if anchored is not None:
        a = anchored
        out["consistency"] = proof_json(a.old_size, a.old_root, a.size, a.root, a.proof)
    if problem is not None:
        out["problem"], out["kind"] = str(problem), problem.kind
    return out


def _write(out: str | None, text: str, what: str) -> None:
    if out is None:
        sys.stdout.write(text)
        return
    path = Path(out)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write the {what}: {e.strerror}") from e


def run_checkpoint(args: argparse.Namespace) -> int:
    from servewitness.ledger import checkpoints

    if _source(args) is not None:
        return _remote_checkpoint(args)
    db = open_ro(args.db)
    try:
        latest = checkpoints.latest_note(db) if db.has_table("checkpoints") else None
    except db.errors as e:
        raise read_error(db.name, e) from e
    finally:
        db.close()
    if latest is None or latest.note is None:
        raise NotFound(
            f"{args.db}: no signed checkpoint note yet (`verifier serve` signs one at start, "
            "periodically and at shutdown)"
        )
    _checkpoint_out(args, latest.note, latest.size, latest.root)
    return 0


def _checkpoint_out(args: argparse.Namespace, text: str, size: int, root: str) -> None:
    """The note TEXT to --out (or stdout), the summary; with --json one object for both."""
    if args.json:
        if args.out is not None:
            _write(args.out, text, "checkpoint")
        doc = {"note": text, "size": size, "root": root, "out": args.out}
        sys.stdout.write(fmt.dumps(doc) + "\n")
        return
    _write(args.out, text, "checkpoint")
    if args.out is not None:
        print(f"{args.out}: checkpoint of {size} entries, root {root}")


def _remote_checkpoint(args: argparse.Namespace) -> int:
    """The ledger's head signed now by the verifier at --verifier, checked with --key."""
    from servewitness.ledger import note
    from servewitness.ledger.keys import load_public_key

    if args.key is None:
        raise UsageError("over the wire the note is checked with --key KEY.pub (required)")
    key = load_public_key(Path(args.key))
    with _client(args) as client:
        text = client.audit_checkpoint()
    signed = note.verify(text, key, f"{args.verifier}: checkpoint")
    _checkpoint_out(args, signed.note, signed.size, signed.root_hex)
    return 0


def _remote_consistency(args: argparse.Namespace, old: SignedCheckpoint, key: Any) -> int:
    """Ask the verifier to prove its ledger extends OLD; check the answer here with KEY: the
    new note's signature, OLD's root at OLD's size (a rewrite shows here), the proof."""
    from servewitness.ledger import anchor as A
    from servewitness.ledger import merkle, note

    if args.new is not None or args.proof is not None:
        raise UsageError("--verifier proves against the ledger now: no --to or --proof")
    with _client(args) as client:
        text, proof, old_root = client.audit_consistency(old.size)
    new = note.verify(text, key, f"{args.verifier}: checkpoint")
    if old_root != old.root:
        raise A.NotAnExtension(
            "rewritten",
            f"the verifier's ledger no longer has {args.old}'s root at {old.size} entries: "
            "its first entries were rewritten (or it is not the verifier that signed it)",
        )
    if not merkle.verify_consistency(old.size, new.size, old.root, new.root, proof):
        raise A.NotAnExtension(
            "inconsistent",
            f"the verifier's ledger of {new.size} entries does not extend {args.old} "
            f"({old.size}): its consistency proof does not verify",
        )
    if args.out is not None:
        _write(args.out, new.note, "checkpoint")
    doc = {
        "consistent": True, "from": old.size, "to": new.size, "proof_hashes": len(proof),
        "note": new.note, "out": args.out,
    }  # fmt: skip
    fmt.result(args, doc, [
        f"consistent: {old.size} entries -> {new.size} (the verifier's ledger now, signed), "
        f"proof of {len(proof)} hash(es) checked with the key given"
        + (f"; the new note: {args.out}" if args.out else "")
    ])  # fmt: skip
    return 0


def _offline_consistency(
    args: argparse.Namespace, old: SignedCheckpoint, new: SignedCheckpoint | None
) -> int:
    """Check a proof written by ``--db`` against the two notes, offline."""
    from servewitness.ledger import anchor as A
    from servewitness.ledger import merkle
    from servewitness.ledger.errors import BundleCorrupt

    if args.proof is None or new is None:
        raise UsageError(
            "give --db (produce a proof), --verifier (ask for one), or --proof FILE and --to "
            "NEW.note"
        )
    f_size, f_root, t_size, t_root, hashes = A.read_proof(_read(args.proof, "proof"), args.proof)
    if (f_size, f_root, t_size, t_root) != (old.size, old.root, new.size, new.root):
        raise BundleCorrupt("the proof is for other checkpoints than --from/--to", args.proof)
    if not merkle.verify_consistency(old.size, new.size, old.root, new.root, hashes):
        raise A.NotAnExtension(
            "inconsistent",
            f"{args.new} ({new.size} entries) does not extend {args.old} ({old.size}): "
            "the proof does not verify",
        )
    doc = {"consistent": True, "from": old.size, "to": new.size, "proof_hashes": len(hashes)}
    fmt.result(args, doc, [
        f"consistent: {old.size} entries -> {new.size}, proof of {len(hashes)} hash(es)"
    ])  # fmt: skip
    return 0


def run_consistency(args: argparse.Namespace) -> int:
    from servewitness.ledger import anchor as A
    from servewitness.ledger import checkpoints, merkle, note
    from servewitness.ledger.keys import load_public_key

    key = load_public_key(Path(args.key))
    old = read_note(args.old, key)
    if args.verifier is not None:
        if args.db is not None:
            raise UsageError("give either --db or --verifier, not both")
        return _remote_consistency(args, old, key)
    new = read_note(args.new, key) if args.new is not None else None
    if args.db is None:
        return _offline_consistency(args, old, new)
    if args.proof is not None:
        raise UsageError("--proof checks offline: give it without --db")
    db = open_ro(args.db)
    try:
        with db.snapshot():
            tree = A.ledger_tree(db)
            A.check(db, old, tree)
            if new is None:
                latest = checkpoints.latest_note(db)
                if latest is None or latest.note is None:
                    raise NotFound(f"{db.name}: no signed checkpoint note to prove --from against")
                new = note.verify(latest.note, key, f"{db.name}: latest checkpoint")
            A.check(db, new, tree)
    except db.errors as e:
        raise read_error(db.name, e) from e
    finally:
        db.close()
    if new.size < old.size:
        raise UsageError(f"--to ({new.size} entries) is older than --from ({old.size})")
    proof = tuple(tree.consistency_proof(old.size, new.size))
    if not merkle.verify_consistency(old.size, new.size, old.root, new.root, proof):
        raise A.NotAnExtension("inconsistent", "the consistency proof does not verify")
    _proof_out(args, A.proof_json(old.size, old.root, new.size, new.root, proof))
    return 0


def _proof_out(args: argparse.Namespace, doc: dict[str, Any]) -> None:
    """The proof DOC to --out (or stdout), the summary; with --json one object for both."""
    size, to, n = doc["from"]["size"], doc["to"]["size"], len(doc["proof"])
    if args.json:
        if args.out is not None:
            _write(args.out, json.dumps(doc, indent=2) + "\n", "proof")
        summary = {"consistent": True, "from": size, "to": to, "proof_hashes": n}
        fmt.result(args, {**summary, "proof": doc, "out": args.out}, [])
        return
    _write(args.out, json.dumps(doc, indent=2) + "\n", "proof")
    if args.out is not None:
        print(f"{args.out}: consistent, {size} entries -> {to}, {n} hash(es)")
