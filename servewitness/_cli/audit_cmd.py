"""``verifier audit``: check the verifier's database against its hash-chained ledger, and ask
it which processes loaded a file and what a run's history is (read-only, offline)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import TYPE_CHECKING, Any

from servewitness._cli import audit_anchor_cmd, audit_seal_cmd, fmt
from servewitness._cli._audit_db import DB_HELP, reading
from servewitness._cli._audit_db import open_ro as _open
from servewitness._cli.audit_remote import add_remote_options, run_remote, wants_remote
from servewitness._cli.fmt import text as _t
from servewitness._cli.fmt import when as _when
from servewitness.errors import CheckFailed, ConfigError, DatabaseCorrupt, UsageError
from servewitness.server.db import read_error

if TYPE_CHECKING:
    from collections.abc import Sequence

    from servewitness.ledger import chain
    from servewitness.ledger.anchor import Anchored, NotAnExtension
    from servewitness.ledger.index_check import Difference
    from servewitness.ledger.note import SignedCheckpoint


WIRE_HELP = (
    " Over the wire (--verifier ADDR --key KEY.pub, the auditor or operator role): the "
    "verifier answers with a signed bundle that this command checks offline before printing "
    "(exit 1 when it does not verify)."
)


class LedgerBroken(CheckFailed):
    """The ledger does not match what is stored."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "audit",
        help="audit the verifier's records (the hash-chained ledger)",
        description="Audit what the verifier stored.",
    )
    acts = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    v = acts.add_parser(
        "verify",
        help="check the ledger online (--db), or an exported bundle offline (BUNDLE --key)",
        description="Online (--db): open the verifier's database read-only and walk its "
        "ledger from the first entry: every entry must follow the previous one, match its own "
        "hash, and match the run, manifest, report, verdict or batch of request bindings it "
        "records; every stored row must be in the ledger; every checkpoint the verifier "
        "signed must still be the root of the ledger's first entries (with --key, its "
        "signature too); every row of the index tables the queries and exports answer from "
        "(processes, paths, blobs, manifest_files) must be what the ledgered manifests, "
        "reports and request bindings derive (each difference is printed with its table, "
        "row and field). Prints the number of entries and the head hash. Exit 0 intact, 1 "
        "tampered (the first entry that does not match is named) or corrupt (SQLite's "
        "integrity check fails: pages zeroed, flipped, cut short), 3 no such database, 9 "
        "database unreachable. Offline (BUNDLE --key PUBKEY, no database): check an export's "
        "signatures, the inclusion of every entry in its signed checkpoint, the chain between "
        "consecutive entries, and that every statement's content recomputes its entry. Exit "
        "0 verifies, 7 corrupted or does not verify, 8 signed by another key, 3 no such file "
        "or not a public key. Without --checkpoint, the online check shows only that the "
        "database agrees with itself (whoever can write it can rewrite the chain and delete "
        "its checkpoints) and says so; with --checkpoint OLD.note --key KEY.pub (a signed "
        "checkpoint kept outside the database: `verifier audit checkpoint`), it also proves "
        "the ledger is an append-only extension of OLD: exit 1 when it was rewritten behind "
        "OLD, truncated below OLD's size, or OLD is no longer among its checkpoints; 8 when "
        "OLD was signed by another key; 7 when OLD is damaged.",
    )
    v.add_argument("bundle", nargs="?", metavar="BUNDLE", help="an export to check offline")
    v.add_argument("--db", help=DB_HELP + " (online check)")
    v.add_argument(
        "--key", help="the verifier's public key (PEM): required with BUNDLE, optional with --db"
    )
    v.add_argument(
        "--checkpoint",
        metavar="OLD.note",
        help="with --db and --key: a signed checkpoint note kept outside the database; prove "
        "the ledger now extends it (RFC 9162 consistency proof)",
    )
    v.add_argument("--json", action="store_true", help="machine-readable result")
    v.set_defaults(handler=run_verify)
    audit_anchor_cmd.add_actions(acts)
    audit_seal_cmd.add_actions(acts)
    x = acts.add_parser(
        "export",
        help="write a signed bundle (in-toto statements in DSSE envelopes) for offline audit",
        description="Sign, with the verifier's Ed25519 key, a checkpoint over the whole "
        "ledger and one in-toto Statement v1 (in a DSSE envelope) per exported record: for "
        "each --request, the batches of bindings that hold it (every row, so the ledger "
        "subject recomputes) and the manifests in force, with a runtime-evidence predicate "
        "saying what served it; for each --run, its registration and every verdict as a gate "
        "decision. Every exported entry comes with its inclusion proof; a consistency proof "
        "from the latest checkpoint signed while serving is added when there is one. Check "
        "it anywhere with `verifier audit verify BUNDLE --key KEY.pub`. Exit 6 for an "
        "unknown request or run.",
    )
    x.add_argument("--db", required=True, help=DB_HELP)
    x.add_argument("--key", required=True, help="the verifier's private key (verifier keygen)")
    x.add_argument("--out", required=True, metavar="BUNDLE", help="where to write the bundle")
    x.add_argument(
        "--request",
        action="append",
        default=[],
        metavar="ID",
        help="a request to include (repeatable)",
    )
    x.add_argument(
        "--run", action="append", default=[], metavar="RUN", help="a run to include (repeatable)"
    )
    fmt.add_json(x, '{"bundle", "statements", "entries", "consistency_size"}')
    x.set_defaults(handler=run_export)
    f = acts.add_parser(
        "file",
        help="which processes loaded a file, in which targets and runs",
        description="Every process whose reported files include FILE (a sha256, an absolute "
        "path, or the end of a path such as vllm/v1/sample/sampler.py): target, pid, role, "
        "container, manifest digest, the first and last report that showed it, and the runs "
        "whose policy covers that target. Exit 6 when nothing matches. Exit 1 when an index row it "
        "would answer from disagrees with the ledgered content." + WIRE_HELP,
    )
    f.add_argument("file", metavar="SHA256|PATH", help="a sha256, an absolute path or a path's end")
    f.add_argument(
        "--requests",
        type=int,
        default=0,
        metavar="N",
        help="also list up to N ids of the requests each process served (default: the count)",
    )
    f.add_argument("--db", help=DB_HELP)
    add_remote_options(f)
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
        "covering run's verdict at the time. Exit 6 when no binding matches. Exit 1 when a row it "
        "would answer from disagrees with the ledgered content." + WIRE_HELP,
    )
    q.add_argument("id", metavar="ID", help="a request id (client, API or engine id)")
    q.add_argument("--db", help=DB_HELP)
    add_remote_options(q)
    q.add_argument("--json", action="store_true", help="machine-readable result")
    q.set_defaults(handler=run_request)
    r = acts.add_parser(
        "run",
        help="a run's registration and verdict history",
        description="A run's policy digest, where the policy came from, when it was "
        "registered, and every change of its verdict. Exit 6 for an unknown run." + WIRE_HELP,
    )
    r.add_argument("run", help="the run")
    r.add_argument("--db", help=DB_HELP)
    add_remote_options(r)
    r.add_argument("--json", action="store_true", help="machine-readable result")
    r.set_defaults(handler=run_run)


def run_file(args: argparse.Namespace) -> int:
    from servewitness.ledger.queries import find_file

    if wants_remote(args):
        return run_remote("file", args.file, args)
    db = _open(args.db)
    whole: list[str] = []
    with reading(db):
        found = find_file(db, args.file, max(0, args.requests), whole)
    if args.json:
        print(fmt.dumps([dataclasses.asdict(s) for s in found]))
        _say_whole(whole, sys.stderr)
        return 0
    for s in found:
        where = f"container {_t(s.container_id, 12)}" if s.container_id else "no container"
        rank = f" rank {_t(s.rank)}" if s.rank is not None else ""
        print(f"{_t(s.path, 0)}  sha256 {_t(s.sha256) or '-'}")
        print(
            f"  target {_t(s.target)}  pid {_t(s.pid)} ({_t(s.role)}{rank}, {where})  manifest "
            f"{_t(s.manifest_digest, 19)}  seen in {_t(s.reports)} report(s) "
            f"{_when(s.first_unix)} .. {_when(s.last_unix)}  runs: "
            f"{', '.join(_t(r) for r in s.runs) or 'none'}"
        )
        if s.requests:
            ids = f": {', '.join(_t(i) for i in s.request_ids)}" if s.request_ids else ""
            # Checked against the counts the ledger entries of its batches commit to (or,
            # for batches stored before those, their rows hashed whole): docs/audit.md.
            print(f"  served {s.requests} request(s){ids} (count checked against the ledger)")
    _say_whole(whole, sys.stdout)
    return 0


def _say_whole(whole: list[str], out: Any) -> None:
    """Say how many batches the count checks hashed whole (stored before per-process counts
    were ledgered): checked, at O(their rows), not skipped."""
    if whole:
        print(
            f"note: {len(whole)} batch(es) of bindings were stored before per-process request "
            "counts were in their ledger entries (an older verifier wrote them); their rows were "
            "hashed whole to check the counts",
            file=out,
        )


def run_request(args: argparse.Namespace) -> int:
    from servewitness.ledger.queries import find_request

    if wants_remote(args):
        return run_remote("request", args.id, args)
    db = _open(args.db)
    whole: list[str] = []
    with reading(db):
        found = find_request(db, args.id, whole)
    if args.json:
        print(fmt.dumps([dataclasses.asdict(s) for s in found]))
        _say_whole(whole, sys.stderr)
        return 0
    for s in found:
        where = f"container {_t(s.container_id, 12)}" if s.container_id else "no container"
        rank = f" rank {_t(s.rank)}" if s.rank is not None else ""
        ext = ", ".join(_t(e) for e in s.external_ids) or "no external id recorded"
        print(f"request {_t(s.internal_id)} ({ext})")
        print(f"  target {_t(s.target)}  pid {_t(s.pid)} ({_t(s.role) or '?'}{rank}, {where})")
        print(
            f"  steps {_t(s.first_step)}..{_t(s.last_step)} ({_t(s.steps)} scheduled, "
            f"{_t(s.tokens)} tokens) {_when(s.first_unix)} .. {_when(s.last_unix)}"
            + ("" if s.finished else "  (still open when its process exited)")
        )
        print(f"  runner {_t(s.runner) or '?'}")
        for m, stored in zip(s.manifests, s.manifests_stored, strict=True):
            print(f"  manifest {_t(m)}" + ("" if stored else "  (not stored: between reports)"))
        hooks = ", ".join(f"{_t(k)} {_t(v)}" for k, v in sorted(s.hooks.items()))
        print(f"  hook fires over its steps: {hooks or 'none declared'}")
        if s.spec is not None:
            print(f"  speculation: {_speculation(s.spec)}")
        if s.not_pristine:
            print(f"  files not pristine: {len(s.not_pristine)}")
            for f in s.not_pristine[:20]:
                origin, path = _t(f.get("origin")), _t(f.get("path"), 0)
                print(f"    {origin:<9} {path}  ({_t(f.get('reason'))})")
        else:
            print("  files not pristine: none")
        for r in s.runs:
            verdict = _t(r.get("verdict") or "no verdict yet")
            print(f"  run {_t(r.get('run'))}: {verdict} at the time")
    _say_whole(whole, sys.stdout)
    return 0


def _speculation(sp: dict[str, Any]) -> str:
    """A request's speculative decoding counts (stored JSON: any value may be any type)."""
    accepted, drafted = sp.get("accepted"), sp.get("draft_tokens")
    numbers = all(type(x) in (int, float) for x in (accepted, drafted))
    rate = "-"
    if numbers and drafted:
        ratio = accepted / drafted
        rate = f"{ratio:.0%}" if math.isfinite(ratio) else _t(ratio)
    return (
        f"{_t(sp.get('drafts'))} draft(s), {_t(drafted)} draft tokens, {_t(accepted)} accepted "
        f"({rate}; per position {_t(sp.get('pos') or [])}), {_t(sp.get('emitted'))} tokens emitted"
    )


def run_run(args: argparse.Namespace) -> int:
    from servewitness.ledger.queries import run_summary

    if wants_remote(args):
        return run_remote("run", args.run, args)
    db = _open(args.db)
    with reading(db):
        s = run_summary(db, args.run)
    if args.json:
        print(fmt.dumps(dataclasses.asdict(s)))
        return 0
    print(f"run {_t(s.name)}  policy {_t(s.policy_digest)}  from {_t(s.source) or '-'}")
    print(f"  registered {_when(s.created_unix)}; {len(s.history)} verdict change(s)")
    for t, v in s.history:
        print(f"  {_when(t)}  {_t(v)}")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from servewitness.ledger.bundle import dump
    from servewitness.ledger.export import export
    from servewitness.ledger.keys import load_private_key

    key = load_private_key(Path(args.key))
    db = _open(args.db)
    with reading(db):
        bundle = export(db, key, args.request, args.run)
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.write_bytes(dump(bundle))
        tmp.replace(out)
    except OSError as e:
        raise ConfigError(f"{out}: cannot write the bundle: {e.strerror}") from e
    consistency = bundle["consistency"]["size"] if "consistency" in bundle else None
    doc = {
        "bundle": str(out), "statements": len(bundle["statements"]),
        "entries": len(bundle["entries"]), "consistency_size": consistency,
    }  # fmt: skip
    line = (
        f"{out}: {len(bundle['statements'])} statement(s) over {len(bundle['entries'])} "
        "ledger entries, checkpoint signed"
        + (f", consistent with checkpoint size {consistency}" if consistency is not None else "")
    )
    fmt.result(args, doc, [line])
    return 0


def run_verify(args: argparse.Namespace) -> int:
    if args.bundle is not None:
        if args.checkpoint is not None:
            raise UsageError("--checkpoint checks a database (--db), not a bundle")
        if args.db is not None:
            raise UsageError("give either BUNDLE (offline) or --db (online), not both")
        if args.key is None:
            raise UsageError("an offline check needs the verifier's public key: --key KEY.pub")
        return run_offline_verify(args.bundle, args.key, args.json)
    if args.db is None:
        raise UsageError("give --db (check the database online) or BUNDLE --key (offline)")
    return _verify_online(args)


def run_offline_verify(bundle_path: str, key_path: str, as_json: bool) -> int:
    """Verify the bundle at BUNDLE_PATH with the public key at KEY_PATH; print what was checked
    (JSON with AS_JSON, also on failure). 0 when it verifies; raises :class:`BundleCorrupt`
    (exit 7), :class:`WrongKey` (8), or a key or file error (3)."""
    from pathlib import Path

    from servewitness.ledger.errors import BundleCorrupt, BundleMissing, WrongKey
    from servewitness.ledger.keys import load_public_key
    from servewitness.ledger.statement import rfc3339
    from servewitness.ledger.verify_bundle import check_bundle

    key = load_public_key(Path(key_path))
    path = Path(bundle_path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BundleMissing(f"{path}: no such bundle file") from None
    except OSError as e:
        raise BundleMissing(f"{path}: cannot read the bundle: {e.strerror}") from None
    r = check_bundle(data, key)
    if as_json:
        print(json.dumps(r.to_json(), indent=2))
    else:
        for line in r.checks:
            print(f"ok    {line}")
        if r.ok:
            print(
                f"bundle verifies: ledger of {r.size} entries at {rfc3339(r.at_unix)} "
                f"(verifier {r.verifier_id}), root {r.root}, head {r.head}"
            )
    sys.stdout.flush()
    if r.ok:
        return 0
    problem, location = r.problem or "does not verify", r.location or ""
    if r.exit_code == WrongKey.exit_code:
        raise WrongKey(problem, f"{path}: {location}" if location else str(path))
    raise BundleCorrupt(problem, f"{path}: {location}" if location else str(path))


def _verify_online(args: argparse.Namespace) -> int:
    from pathlib import Path

    from servewitness.ledger import chain, checkpoints, index_check

    key = None
    if args.key is not None:
        from servewitness.ledger.keys import load_public_key

        key = load_public_key(Path(args.key))
    old = None
    if args.checkpoint is not None:
        if key is None:
            raise UsageError("--checkpoint needs the verifier's public key: --key KEY.pub")
        old = audit_anchor_cmd.read_note(args.checkpoint, key)  # exit 7 / 8 before the db
    db = _open(args.db)
    path = db.name
    anchored, anchor_problem = None, None
    try:
        if not db.has_table("ledger"):
            raise ConfigError(
                f"{path}: not a verifier database with a ledger (a database of an older "
                "verifier gets one, covering every stored row, when `verifier serve` next "
                "opens it)"
            )
        integrity = db.quick_check()  # pages the ledger walk never reads are checked too
        if integrity != "ok":
            raise DatabaseCorrupt(f"{path}: the database is corrupt: {' '.join(integrity.split())}")
        with db.snapshot():
            result = chain.verify(db)
            held, cp_problem = checkpoints.check(db, key)
            if old is not None:
                anchored, anchor_problem = audit_anchor_cmd.anchor(db, old)
            differences = index_check.compare(db)
    except db.errors as e:
        raise read_error(path, e) from e
    finally:
        db.close()
    index_problem = (
        f"{len(differences)} index row(s) disagree with the ledgered content, first: "
        f"{differences[0]}"
        if differences
        else None
    )
    problem = (
        result.problem
        or (str(anchor_problem) if anchor_problem else None)
        or cp_problem
        or index_problem
    )
    _print_online(
        args.json, path, result,
        held=held, problem=problem, old=old, anchored=anchored, anchor_problem=anchor_problem,
        differences=differences,
    )  # fmt: skip
    if anchor_problem is not None and result.problem is None:
        raise anchor_problem  # its own message: rewritten, truncated, checkpoint dropped
    if problem is not None:
        raise LedgerBroken(f"{path}: {problem} ({result.entries} entries verified)")
    return 0


def _print_online(
    as_json: bool,
    path: str,
    result: chain.Verification,
    *,
    held: int,
    problem: str | None,
    old: SignedCheckpoint | None,
    anchored: Anchored | None,
    anchor_problem: NotAnExtension | None,
    differences: Sequence[Difference],
) -> None:
    """What ``audit verify --db`` found: JSON, or the lines saying how far it reaches (and
    every index row that disagrees with the ledgered content)."""
    for d in () if as_json else differences:
        print(f"index differs: {d}")
    if as_json:
        out = {
            "ok": problem is None,
            "entries": result.entries,
            "head": result.head,
            "problem": problem,
            "seq": result.seq,
            "checkpoints": held,
            "scope": "internal" if old is None else "anchored",
            "index": [d.to_json() for d in differences],
        }
        if old is not None:
            out["anchor"] = audit_anchor_cmd.anchor_json(old, anchored, anchor_problem)
        print(json.dumps(out, indent=2))
        return
    if problem is not None:
        return
    cps = f", {held} signed checkpoint(s) hold" if held else ""
    print(f"{path}: ledger intact, {result.entries} entries, head {result.head}{cps}")
    print("  index tables (processes, paths, blobs, manifest files) match the ledgered content")
    if anchored is None:
        print(
            "  internal consistency only: the database agrees with itself, which a rewrite of "
            "the chain that also deletes its checkpoints keeps true; give --checkpoint "
            "OLD.note --key KEY.pub (a checkpoint kept outside it) to show it only grew"
        )
    else:
        print(
            f"  append-only since the checkpoint kept outside ({anchored.old_size} entries -> "
            f"{anchored.size}): consistency proof of {len(anchored.proof)} hash(es) verifies"
        )
