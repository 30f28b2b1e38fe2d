"""The index tables checked against the ledgered content they are derived from.

The tables ``paths``, ``blobs``, ``manifest_files`` and ``processes`` (kept by
``servewitness.server.index``) are not in the ledger: whoever can write the database can change
a role, a container id, a file's hash or path there without :func:`servewitness.ledger.chain.verify`
noticing, and the audit queries and the signed export answer from them. This module derives
what those tables must hold from the ledgered content (the stored manifests, the stored
reports decoded, the stored request bindings: the rows whose subjects ``chain.verify``
recomputes), the way the verifier wrote them while serving, and names every difference: the
table, the row's key and the field, what the table says and what the ledger says.

* :func:`compare` checks every row of every index table (``verifier audit verify``);
* :func:`check_processes` and :func:`check_manifest_files` check only the rows one audit
  answer uses (``audit file``, ``audit request``, ``audit export``): the derivation of a
  process is one pass over its target's reports, cheaper than the whole database.

The request count of a process (``processes.requests``) is what the live verifier counted
as each batch arrived (a span whose process row did not exist yet counts nowhere) or, in a
database re-indexed at start (``servewitness.server.index.rebuild``), every stored binding; both
derive from the ledger, and either is accepted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from servewitness import wire
from servewitness.ledger import chain
from servewitness.ledger.content_check import (
    Difference,
    IndexDisagrees,
    check_content,
    ledgered_counts,
    require,
)
from servewitness.ledger.content_check import fmt_key as _fmt_key
from servewitness.ledger.interface import Database

__all__ = [
    "Difference", "IndexDisagrees", "check_content", "check_manifest_files", "check_processes",
    "compare", "require",
]  # fmt: skip

PKey = tuple[str, str, int, int, str]  # target, boot_id, pid, start_ticks, manifest
PROCESS_FIELDS = ("role", "rank", "container_id", "runner", "first_unix", "last_unix", "reports")


@dataclass
class _Proc:
    role: str
    rank: int | None
    container_id: str | None
    runner: str | None
    first_unix: float
    last_unix: float
    reports: int = 1
    requests_live: int = 0  # as counted batch by batch while serving
    requests_all: int = 0  # every stored binding (a re-indexed database)
    fields: dict[str, Any] = field(default_factory=dict)

    def values(self) -> tuple[Any, ...]:
        return (self.role, self.rank, self.container_id, self.runner, self.first_unix,
                self.last_unix, self.reports)  # fmt: skip


# Manifests: paths, blobs, manifest_files ------------------------------------------------


def _manifest_files(db: Database, digests: Iterable[str] | None) -> dict[tuple[str, str], Any]:
    """(manifest, path) -> sha256 (None when unhashed) from the stored manifests' JSON."""
    out: dict[tuple[str, str], Any] = {}
    if digests is None:
        rows = db.execute("SELECT digest, files_json FROM manifests").fetchall()
    else:
        rows = []
        for d in sorted(set(digests)):
            rows += db.execute(
                "SELECT digest, files_json FROM manifests WHERE digest = ?", (d,)
            ).fetchall()
    for digest, files_json in rows:
        try:
            files = json.loads(files_json)
        except ValueError:
            continue  # chain.verify names a manifest that no longer reads
        for f in files if isinstance(files, list) else ():
            if isinstance(f, dict) and isinstance(f.get("path"), str):
                # As the index was written (``server/index.write_manifest_index``): a path's
                # first entry with a hash, else the path without one. (A path listed twice is
                # refused at ingest since; a database from before may hold one.)
                key, sha = (str(digest), f["path"]), f.get("sha256")
                if isinstance(sha, str):
                    if not isinstance(out.get(key), str):
                        out[key] = sha
                else:
                    out.setdefault(key, None)
    return out


def _stored_manifest_files(
    db: Database, digests: Iterable[str] | None
) -> tuple[dict[tuple[str, str], Any], list[Difference]]:
    """What ``manifest_files`` says, joined to its paths and blobs, and the rows whose path or
    blob id leads nowhere."""
    sql = (
        "SELECT mf.manifest, mf.path_id, mf.blob_id, p.path, b.sha256 FROM manifest_files mf "
        "LEFT JOIN paths p ON p.id = mf.path_id LEFT JOIN blobs b ON b.id = mf.blob_id"
    )
    if digests is None:
        rows = db.execute(sql).fetchall()
    else:
        rows = []
        for d in sorted(set(digests)):
            rows += db.execute(sql + " WHERE mf.manifest = ?", (d,)).fetchall()
    out: dict[tuple[str, str], Any] = {}
    bad: list[Difference] = []
    for manifest, path_id, blob_id, path, sha in rows:
        if path is None:
            key = _fmt_key([manifest, int(path_id)])
            bad.append(Difference("manifest_files", key, "path_id", int(path_id), None))
            continue
        if blob_id is not None and sha is None:
            key = _fmt_key([manifest, int(path_id)])
            bad.append(Difference("manifest_files", key, "blob_id", int(blob_id), None))
            continue
        out[(str(manifest), str(path))] = sha
    return out, bad


def check_manifest_files(db: Database, digests: Iterable[str] | None = None) -> list[Difference]:
    """The ``manifest_files`` rows of DIGESTS (every manifest: None), through ``paths`` and
    ``blobs``, against the stored manifests. An edited ``paths.path`` or ``blobs.sha256``
    shows as the manifests' rows naming a path or hash that their manifests do not list."""
    digests = None if digests is None else list(digests)
    want = _manifest_files(db, digests)
    have, out = _stored_manifest_files(db, digests)
    if digests is not None:  # the whole database: chain.verify walks every entry instead
        out += check_content(db, manifests=digests)
    # Only the keys that differ (a dict's items compare in C: O(rows), no key formatted).
    differ = set(want.items()) ^ set(have.items())
    for k in sorted({k for k, _ in differ}):
        key = _fmt_key(k)
        if k not in have:
            out.append(Difference("manifest_files", key, "row", None, want[k]))
        elif k not in want:
            out.append(Difference("manifest_files", key, "row", have[k], None))
        elif have[k] != want[k]:
            out.append(Difference("manifest_files", key, "sha256 (blobs)", have[k], want[k]))
    return out


def _check_paths_blobs(db: Database) -> list[Difference]:
    """Every ``paths`` and ``blobs`` row is a path or hash some stored manifest lists, once."""
    want = _manifest_files(db, None)
    paths = {p for _, p in want}
    hashes = {h for h in want.values() if h is not None}
    out = []
    for table, column, values in (("paths", "path", paths), ("blobs", "sha256", hashes)):
        seen: set[str] = set()
        for rid, value in db.execute(f"SELECT id, {column} FROM {table} ORDER BY id"):  # noqa: S608
            if value not in values:
                out.append(Difference(table, f"id {int(rid)}", column, value, None))
            seen.add(str(value))
        out += [Difference(table, json.dumps(v), "row", None, v) for v in sorted(values - seen)]
    return out


# Processes ----------------------------------------------------------------------------------


def _reports(db: Database, targets: list[str] | None) -> list[Any]:
    """(agent_id, seq, target, received_unix, report) of TARGETS' reports (every target: None),
    each target's in storage order."""
    sql = "SELECT agent_id, seq, target, received_unix, report FROM reports"
    if targets is None:
        return db.execute(sql + " ORDER BY rowid").fetchall()
    out: list[Any] = []
    for t in sorted(set(targets)):  # keys differ per target: one after the other is enough
        out += db.execute(sql + " WHERE target = ? ORDER BY rowid", (t,)).fetchall()
    return out


def _derive_processes(
    db: Database, targets: list[str] | None, whole: list[str] | None = None
) -> tuple[dict[PKey, _Proc], list[Difference]]:
    """The ``processes`` rows the stored reports (decoded) and bindings derive, replayed in
    storage order as the verifier indexed them (``servewitness.server.index.index_processes``
    then ``write_request_counts`` per report), and the differences found on the way.

    Every target (``audit verify``): the binding rows counted in SQL (``chain.verify`` checks
    them against their entries). For TARGETS (one answer's check): the reports read are
    checked against their ledger entries (one probe each) and the request counts are the
    ones the ledger entries of the targets' batches commit to
    (:func:`content_check.ledgered_counts`: one probe and one ``binding_batches`` row per
    batch, no binding row read), so a count edited to match deleted, forged or moved rows
    differs from the ledger's. Batches stored before counts were ledgered are hashed whole
    instead; their refs are appended to WHOLE."""
    reports = _reports(db, targets)
    bad: list[Difference] = []
    refs = [chain.report_ref(str(r[0]), int(r[1])) for r in reports]
    if targets is None:
        batches = _batches(db)
    else:
        bad += check_content(db, reports=[(str(r[0]), int(r[1])) for r in reports])
        if bad:  # the replay would read content that is not the ledger's
            return {}, bad
        for t in sorted(set(targets)):
            refs += [
                str(r)
                for (r,) in db.execute("SELECT ref FROM binding_batches WHERE target = ?", (t,))
            ]
        batches, hashed, differ = ledgered_counts(db, refs)
        keep = set(targets)
        batches = {r: [c for c in cs if c[0][0] in keep] for r, cs in batches.items()}
        bad += differ
        if whole is not None:
            whole += hashed
    out: dict[PKey, _Proc] = {}
    for agent_id, seq, target, received, body in reports:
        try:
            report = wire.report_from_bytes(bytes(body))
        except wire.WireError:
            continue  # chain.verify names it (changed), or the verifier never indexed it
        _seen(out, str(target), float(received), report.processes)
        for span_key, n in batches.get(chain.report_ref(str(agent_id), int(seq)), ()):
            if span_key in out:
                out[span_key].requests_live += n
    for spans in batches.values():
        for span_key, n in spans:
            if span_key in out:
                out[span_key].requests_all += n
    return out, bad


def _seen(out: dict[PKey, _Proc], target: str, at: float, processes: Sequence[Any]) -> None:
    """What ``index_processes`` does with one report's PROCESSES received AT."""
    for p in processes:
        if not p.manifest_digest:
            continue
        k = p.key
        key: PKey = (target, k.boot_id, k.pid, k.start_ticks, p.manifest_digest)
        runner = p.runner.cls if p.runner is not None else None
        got = out.get(key)
        if got is None:
            out[key] = _Proc(p.role, p.rank, p.container_id, runner, at, at)
        else:
            got.role, got.rank, got.container_id = p.role, p.rank, p.container_id
            got.runner = runner if runner is not None else got.runner
            got.last_unix = at
            got.reports += 1


def _batches(db: Database) -> dict[str, list[tuple[PKey, int]]]:
    """Each stored batch's spans counted per process and manifest of their first step (what
    ``write_request_counts`` counts), in SQL: O(the binding rows) inside the database, none
    of them decoded here."""
    cols = "target, boot_id, pid, start_ticks, manifest_first"
    rows = db.execute(
        f"SELECT batch, {cols}, COUNT(*) FROM bindings GROUP BY batch, {cols}"  # noqa: S608
    ).fetchall()
    out: dict[str, list[tuple[PKey, int]]] = {}
    for batch, target, boot, pid, ticks, manifest, n in rows:
        key: PKey = (str(target), str(boot), int(pid), int(ticks), str(manifest))
        out.setdefault(str(batch), []).append((key, int(n)))
    return out


def _stored_processes(db: Database, targets: list[str] | None) -> dict[PKey, tuple[Any, ...]]:
    sql = (
        "SELECT target, boot_id, pid, start_ticks, manifest, role, rank, container_id, runner, "
        "first_unix, last_unix, reports, requests FROM processes"
    )
    rows: list[Any] = []
    if targets is None:
        rows = db.execute(sql).fetchall()
    else:
        for t in sorted(set(targets)):
            rows += db.execute(sql + " WHERE target = ?", (t,)).fetchall()
    out: dict[PKey, tuple[Any, ...]] = {}
    for t, boot, pid, ticks, m, role, rank, cid, runner, first, last, n, req in rows:
        key: PKey = (str(t), str(boot), int(pid), int(ticks), str(m))
        out[key] = (role, None if rank is None else int(rank), cid, runner, float(first),
                    float(last), int(n), int(req))  # fmt: skip
    return out


def _rows_agree(
    db: Database, have: dict[PKey, tuple[Any, ...]], want: dict[PKey, _Proc]
) -> list[Difference]:
    """The binding rows stored for each process WANT derives, counted by the whole key the
    ledgered counts are derived on (target, boot, pid, start, manifest): O(the process's
    bindings), found through the index ``bindings_by_manifest`` (manifest, pid, start). Each
    must be the count the ledgered batches commit to (``requests_all``). A row deleted,
    forged or moved to another process, with or without the ``processes`` count edited to
    match, differs here or in ``requests``; another target's rows on the same (manifest, pid,
    start), or rows under another boot id, are another process's and never counted here."""
    out = []
    for k in sorted(set(have) & set(want), key=lambda k: tuple(map(str, k))):
        target, boot, pid, ticks, manifest = k
        n = int(
            db.execute(
                "SELECT COUNT(*) FROM bindings WHERE manifest_first = ? AND pid = ? "
                "AND start_ticks = ? AND target = ? AND boot_id = ?",
                (manifest, pid, ticks, target, boot),
            ).fetchone()[0]
        )
        if n != want[k].requests_all:
            out.append(Difference("bindings", _fmt_key(k), "rows", n, want[k].requests_all))
    return out


def check_processes(
    db: Database, targets: Iterable[str] | None = None, whole: list[str] | None = None
) -> list[Difference]:
    """The ``processes`` rows of TARGETS (every target: None) against what the stored reports
    and bindings of those targets derive: a row edited (each field), deleted or forged. For
    TARGETS, the request counts are the ledgered batches' and the binding rows stored per
    process are counted against them; the refs of batches stored before counts were
    ledgered, hashed whole for want of them, are appended to WHOLE."""
    targets = None if targets is None else list(targets)
    have = _stored_processes(db, targets)
    want, out = _derive_processes(db, targets, whole)
    if out:
        return out
    if targets is not None:
        out += _rows_agree(db, have, want)
    for k in sorted(set(want) | set(have), key=lambda k: tuple(map(str, k))):
        key = _fmt_key(k)
        if k not in have:
            out.append(Difference("processes", key, "row", None, list(want[k].values())))
            continue
        if k not in want:
            out.append(Difference("processes", key, "row", list(have[k]), None))
            continue
        w, h = want[k], have[k]
        for name, stored, derived in zip(PROCESS_FIELDS, h, w.values(), strict=False):
            if stored != derived:
                out.append(Difference("processes", key, name, stored, derived))
        if h[7] not in (w.requests_live, w.requests_all):
            out.append(Difference("processes", key, "requests", h[7], w.requests_live))
    return out


def compare(db: Database) -> list[Difference]:
    """Every index table against the ledgered content: the differences (none: they agree)."""
    return _check_paths_blobs(db) + check_manifest_files(db) + check_processes(db)
