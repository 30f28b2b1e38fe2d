"""``verifier audit``: check the verifier's database against its hash-chained ledger."""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path
from typing import Any

from verifier.errors import ConfigError, Error


class LedgerBroken(Error):
    exit_code = 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "audit",
        help="audit the verifier's records (the hash-chained ledger)",
        description="Audit what the verifier stored.",
    )
    acts = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    v = acts.add_parser(
        "verify",
        help="walk the ledger against the stored rows; name the first that does not match",
        description="Open the verifier's SQLite database read-only and walk its ledger from "
        "the first entry: every entry must follow the previous one, match its own hash, and "
        "match the run, manifest, report or verdict it records; every stored row must be in "
        "the ledger. Prints the number of entries and the head hash (record it elsewhere to "
        "pin the chain). Exit 0 intact, 1 tampered (the first entry that does not match is "
        "named), 3 no such database.",
    )
    v.add_argument("--db", type=Path, required=True, help="the verifier's SQLite database")
    v.add_argument("--json", action="store_true", help="machine-readable result")
    v.set_defaults(handler=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    from verifier.server import ledger

    path: Path = args.db
    if not path.is_file():
        raise ConfigError(f"{path}: no such database file")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'ledger'").fetchone():
                raise ConfigError(
                    f"{path}: not a verifier database with a ledger (a database of an older "
                    "verifier gets one, covering every stored row, when `verifier serve` next "
                    "opens it)"
                )
            result = ledger.verify(db)
        finally:
            db.close()
    except sqlite3.Error as e:
        raise ConfigError(f"{path}: cannot read the database: {e}") from e
    if args.json:
        out = {
            "ok": result.ok,
            "entries": result.entries,
            "head": result.head,
            "problem": result.problem,
            "seq": result.seq,
        }
        print(json.dumps(out, indent=2))
    elif result.ok:
        print(f"{path}: ledger intact, {result.entries} entries, head {result.head}")
    if not result.ok:
        raise LedgerBroken(f"{path}: {result.problem} ({result.entries} entries verified)")
    return 0
