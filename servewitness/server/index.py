"""Index tables the audit queries use, derived from the stored content (not in the ledger:
they can be rebuilt from it, ``rebuild``).

* ``paths`` and ``blobs``: each path and each file hash stored once, however many manifests
  list them (content addressing: a thousand containers running the same wheel store each of
  its files' hashes once);
* ``manifest_files``: which manifest lists which path with which hash;
* ``processes``: which process (target, boot, pid, start) ran which manifest, its role, rank,
  container and runner, the first and last report that showed it, and how many requests it
  served with that manifest (at their first step).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servewitness.server.db import Database


@dataclass(frozen=True)
class ProcessSeen:
    boot_id: str
    pid: int
    start_ticks: int
    manifest: str
    role: str
    rank: int | None
    container_id: str | None
    runner: str | None


@dataclass(frozen=True)
class ManifestIndex:
    """The index rows of one manifest, built before the transaction that writes them."""

    paths: list[tuple[str]]
    blobs: list[tuple[str]]
    hashed: list[tuple[str, str, str]]  # (manifest, path, sha256)
    unhashed: list[tuple[str, str]]  # (manifest, path)


def manifest_index(digest: str, files: Sequence[dict[str, Any]]) -> ManifestIndex:
    """The index rows of manifest DIGEST listing FILES (no database needed)."""
    rows = [(str(f["path"]), f.get("sha256")) for f in files if isinstance(f.get("path"), str)]
    hashed = [(p, h) for p, h in rows if isinstance(h, str)]
    return ManifestIndex(
        [(p,) for p, _ in rows],
        [(h,) for _, h in hashed],
        [(digest, p, h) for p, h in hashed],
        [(digest, p) for p, h in rows if not isinstance(h, str)],
    )


def write_manifest_index(db: Database, ix: ManifestIndex) -> None:
    """Write IX (inside the transaction that stores its manifest)."""
    if not ix.paths:
        return
    db.executemany("INSERT INTO paths (path) VALUES (?) ON CONFLICT DO NOTHING", ix.paths)
    db.executemany("INSERT INTO blobs (sha256) VALUES (?) ON CONFLICT DO NOTHING", ix.blobs)
    db.executemany(
        "INSERT INTO manifest_files (manifest, path_id, blob_id) "
        "SELECT ?, p.id, b.id FROM paths p, blobs b WHERE p.path = ? AND b.sha256 = ? "
        "ON CONFLICT DO NOTHING",
        ix.hashed,
    )
    db.executemany(
        "INSERT INTO manifest_files (manifest, path_id, blob_id) "
        "SELECT ?, p.id, NULL FROM paths p WHERE p.path = ? ON CONFLICT DO NOTHING",
        ix.unhashed,
    )


def index_manifest(db: Database, digest: str, files: Sequence[dict[str, Any]]) -> None:
    """Index one newly stored manifest (inside the transaction that stores it)."""
    write_manifest_index(db, manifest_index(digest, files))


_UPSERT_PROCESS = (
    "INSERT INTO processes (target, boot_id, pid, start_ticks, manifest, role, rank, "
    "container_id, runner, first_unix, last_unix, reports) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1) "
    "ON CONFLICT (target, boot_id, pid, start_ticks, manifest) DO UPDATE SET "
    "last_unix = excluded.last_unix, reports = processes.reports + 1, "
    "role = excluded.role, rank = excluded.rank, container_id = excluded.container_id, "
    "runner = COALESCE(excluded.runner, processes.runner)"
)
_COUNT_REQUESTS = (
    "UPDATE processes SET requests = requests + ? WHERE target = ? AND boot_id = ? "
    "AND pid = ? AND start_ticks = ? AND manifest = ?"
)


def process_rows(target: str, at: float, processes: Sequence[ProcessSeen]) -> list[tuple[Any, ...]]:
    """The rows ``write_processes`` upserts (built before the transaction)."""
    return [
        (target, p.boot_id, p.pid, p.start_ticks, p.manifest, p.role, p.rank,
         p.container_id, p.runner, at, at)
        for p in processes
    ]  # fmt: skip


def write_processes(db: Database, rows: Sequence[tuple[Any, ...]]) -> None:
    """Note that each process of ROWS (``process_rows``) ran its manifest in a report."""
    if rows:
        db.executemany(_UPSERT_PROCESS, rows)


def index_processes(db: Database, target: str, at: float, processes: Sequence[ProcessSeen]) -> None:
    """Note that each of PROCESSES ran its manifest in a report received AT."""
    write_processes(db, process_rows(target, at, processes))


def request_counts(target: str, span_tails: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The rows ``write_request_counts`` applies (built before the transaction), from a
    report's span rows without their batch and target (``ledger.bindings.Tails.spans``:
    boot_id, pid, start_ticks first, manifest_first eleventh)."""
    served = Counter((t[0], t[1], t[2], t[10]) for t in span_tails)
    return [(n, target, *k) for k, n in served.items()]


def write_request_counts(db: Database, rows: Sequence[tuple[Any, ...]]) -> None:
    """Count requests as served by their process under the manifest of their first step
    (what `audit file` counts): ROWS from ``request_counts``."""
    if rows:
        db.executemany(_COUNT_REQUESTS, rows)


def needs_rebuild(db: Database) -> bool:
    """Content stored without its index (a database of an older verifier)."""
    has_manifests = db.execute("SELECT 1 FROM manifests LIMIT 1").fetchone() is not None
    has_index = db.execute("SELECT 1 FROM manifest_files LIMIT 1").fetchone() is not None
    has_reports = db.execute("SELECT 1 FROM reports LIMIT 1").fetchone() is not None
    has_procs = db.execute("SELECT 1 FROM processes LIMIT 1").fetchone() is not None
    return (has_manifests and not has_index) or (has_reports and not has_procs)


def rebuild(db: Database) -> int:
    """Derive the index from the stored manifests and reports (inside a transaction). Reports
    that no longer decode are skipped (``verifier audit verify`` names them). The number of
    reports indexed."""
    from servewitness import wire

    for table in ("manifest_files", "processes"):
        db.execute(f"DELETE FROM {table}")  # noqa: S608 - fixed table names
    for digest, files_json in list(db.execute("SELECT digest, files_json FROM manifests")):
        index_manifest(db, digest, json.loads(files_json))
    n = 0
    for target, received, body in list(
        db.execute("SELECT target, received_unix, report FROM reports ORDER BY rowid")
    ):
        try:
            report = wire.report_from_bytes(bytes(body))
        except wire.WireError:
            continue
        index_processes(db, target, float(received), processes_seen(report.processes))
        n += 1
    db.execute(
        "UPDATE processes SET requests = (SELECT COUNT(*) FROM bindings b WHERE "
        "b.manifest_first = processes.manifest AND b.pid = processes.pid AND "
        "b.start_ticks = processes.start_ticks AND b.boot_id = processes.boot_id AND "
        "b.target = processes.target)"
    )
    return n


def processes_seen(processes: Sequence[Any]) -> list[ProcessSeen]:
    """The index rows of a report's processes (those with a manifest)."""
    out = []
    for p in processes:
        if p.manifest_digest:
            runner = p.runner.cls if p.runner is not None else None
            k = p.key
            row = (k.boot_id, k.pid, k.start_ticks, p.manifest_digest, p.role, p.rank)
            out.append(ProcessSeen(*row, p.container_id, runner))
    return out
