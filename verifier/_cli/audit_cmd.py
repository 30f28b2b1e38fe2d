"""``verifier audit``: check the verifier's database against its hash-chained ledger, and ask
it which processes loaded a file and what a run's history is (read-only, offline)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any

from verifier.errors import ConfigError, Error
from verifier.server.db import Database, open_database


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
        description="Open the verifier's database read-only and walk its ledger from "
        "the first entry: every entry must follow the previous one, match its own hash, and "
        "match the run, manifest, report or verdict it records; every stored row must be in "
        "the ledger. Prints the number of entries and the head hash (record it elsewhere to "
        "pin the chain). Exit 0 intact, 1 tampered (the first entry that does not match is "
        "named), 3 no such database.",
    )
    v.add_argument("--db", required=True, help=DB_HELP)
    v.add_argument("--json", action="store_true", help="machine-readable result")
    v.set_defaults(handler=run_verify)
    f = acts.add_parser(
        "file",
        help="which processes loaded a file, in which targets and runs",
        description="Every process whose reported files include FILE (a sha256, an absolute "
        "path, or the end of a path such as vllm/v1/sample/sampler.py): target, pid, role, "
        "container, manifest digest, the first and last report that showed it, and the runs "
        "whose policy covers that target. Exit 6 when nothing matches.",
    )
    f.add_argument("file", metavar="SHA256|PATH")
    f.add_argument("--db", required=True, help=DB_HELP)
    f.add_argument("--json", action="store_true", help="machine-readable result")
    f.set_defaults(handler=run_file)
    q = acts.add_parser(
        "request",
        help="which code served a request: runner, manifest digest, hooks, files, verdict",
        description="What served request ID (the client's X-Request-Id, the API's external "
        "id such as cmpl-ID-0 or chatcmpl-ID, or the engine's internal id): the target, "
        "process and container, the steps it was scheduled in, the live runner, the manifest "
        "digest at its first and last step (both when files were loaded meanwhile), each "
        "hook's fires over those steps, the process's files that are not pristine, and each "
        "covering run's verdict at the time. Exit 6 when no binding matches.",
    )
    q.add_argument("id", metavar="ID")
    q.add_argument("--db", required=True, help=DB_HELP)
    q.add_argument("--json", action="store_true", help="machine-readable result")
    q.set_defaults(handler=run_request)
    r = acts.add_parser(
        "run",
        help="a run's registration and verdict history",
        description="A run's policy digest, where the policy came from, when it was "
        "registered, and every change of its verdict. Exit 6 for an unknown run.",
    )
    r.add_argument("run")
    r.add_argument("--db", required=True, help=DB_HELP)
    r.add_argument("--json", action="store_true", help="machine-readable result")
    r.set_defaults(handler=run_run)


DB_HELP = "the verifier's database: an SQLite file or a postgresql:// URL"


def _open(target: str) -> Database:
    """TARGET read-only; a clear error for a missing, foreign or unreachable database."""
    db = open_database(target, read_only=True)
    try:
        if not db.has_table("reports"):
            raise ConfigError(f"{db.name}: not a verifier database")
    except db.errors as e:
        db.close()
        raise ConfigError(f"{db.name}: cannot read the database: {e}") from e
    except ConfigError:
        db.close()
        raise
    return db


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def run_file(args: argparse.Namespace) -> int:
    from verifier.server.audit_queries import find_file

    db = _open(args.db)
    try:
        found = find_file(db, args.file)
    except db.errors as e:
        raise ConfigError(f"{db.name}: cannot read the database: {e}") from e
    finally:
        db.close()
    if args.json:
        print(json.dumps([dataclasses.asdict(s) for s in found], indent=2))
        return 0
    for s in found:
        where = f"container {s.container_id[:12]}" if s.container_id else "no container"
        rank = f" rank {s.rank}" if s.rank is not None else ""
        print(f"{s.path}  sha256 {s.sha256 or '-'}")
        print(
            f"  target {s.target}  pid {s.pid} ({s.role}{rank}, {where})  manifest "
            f"{s.manifest_digest[:19]}  seen in {s.reports} report(s) {_when(s.first_unix)} .. "
            f"{_when(s.last_unix)}  runs: {', '.join(s.runs) or 'none'}"
        )
        if s.requests:
            print(f"  served {s.requests} request(s): {', '.join(s.request_ids)}")
    return 0


def run_request(args: argparse.Namespace) -> int:
    from verifier.server.audit_queries import find_request

    db = _open(args.db)
    try:
        found = find_request(db, args.id)
    except db.errors as e:
        raise ConfigError(f"{db.name}: cannot read the database: {e}") from e
    finally:
        db.close()
    if args.json:
        print(json.dumps([dataclasses.asdict(s) for s in found], indent=2))
        return 0
    for s in found:
        where = f"container {s.container_id[:12]}" if s.container_id else "no container"
        rank = f" rank {s.rank}" if s.rank is not None else ""
        ext = ", ".join(s.external_ids) or "no external id recorded"
        print(f"request {s.internal_id} ({ext})")
        print(f"  target {s.target}  pid {s.pid} ({s.role or '?'}{rank}, {where})")
        print(
            f"  steps {s.first_step}..{s.last_step} ({s.steps} scheduled, {s.tokens} tokens) "
            f"{_when(s.first_unix)} .. {_when(s.last_unix)}"
            + ("" if s.finished else "  (still open when its process exited)")
        )
        print(f"  runner {s.runner or '?'}")
        for m, stored in zip(s.manifests, s.manifests_stored, strict=True):
            print(f"  manifest {m}" + ("" if stored else "  (not stored: between reports)"))
        hooks = ", ".join(f"{k} {v}" for k, v in sorted(s.hooks.items())) or "none declared"
        print(f"  hook fires over its steps: {hooks}")
        if s.not_pristine:
            print(f"  files not pristine: {len(s.not_pristine)}")
            for f in s.not_pristine[:20]:
                print(f"    {f['origin']:<9} {f['path']}  ({f['reason']})")
        else:
            print("  files not pristine: none")
        for r in s.runs:
            print(f"  run {r['run']}: {r['verdict'] or 'no verdict yet'} at the time")
    return 0


def run_run(args: argparse.Namespace) -> int:
    from verifier.server.audit_queries import run_summary

    db = _open(args.db)
    try:
        s = run_summary(db, args.run)
    except db.errors as e:
        raise ConfigError(f"{db.name}: cannot read the database: {e}") from e
    finally:
        db.close()
    if args.json:
        print(json.dumps(dataclasses.asdict(s), indent=2))
        return 0
    print(f"run {s.name}  policy {s.policy_digest}  from {s.source or '-'}")
    print(f"  registered {_when(s.created_unix)}; {len(s.history)} verdict change(s)")
    for t, v in s.history:
        print(f"  {_when(t)}  {v}")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from verifier.server import ledger

    db = _open(args.db)
    path = db.name
    try:
        if not db.has_table("ledger"):
            raise ConfigError(
                f"{path}: not a verifier database with a ledger (a database of an older "
                "verifier gets one, covering every stored row, when `verifier serve` next "
                "opens it)"
            )
        result = ledger.verify(db)
    except db.errors as e:
        raise ConfigError(f"{path}: cannot read the database: {e}") from e
    finally:
        db.close()
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
