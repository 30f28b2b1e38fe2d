"""Audit queries over the verifier's stored records: which code served a request (by its
client, external or internal id), which processes loaded a file (by sha256 or path) and which
requests they served, and a run's history. They read a database opened read-only, so an
auditor can run them on a copy (SQLite) or a read-only role (PostgreSQL) with no verifier.

Every lookup goes through an index (the tables ``servewitness.server.index`` and
:mod:`servewitness.ledger.bindings` keep): a request by id is a few index probes, a file by hash
or path one probe per table, whatever the number of bindings.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from servewitness import wire
from servewitness.errors import CheckFailed, NotFound
from servewitness.ledger import bindings, completeness, content_check, index_check
from servewitness.ledger.bindings import client_id
from servewitness.ledger.interface import Database
from servewitness.policy import Policy, PolicyError, load_policy
from servewitness.wire import fields as F

_SHA = re.compile(r"[0-9a-f]{64}")


class CorruptRecord(CheckFailed):
    """A stored record that no longer decodes."""


@dataclass
class Sighting:
    """One process that had the file loaded, over the reports that showed it."""

    path: str
    sha256: str | None
    target: str
    pid: int
    start_ticks: int
    role: str
    rank: int | None
    container_id: str | None
    manifest_digest: str
    first_unix: float
    last_unix: float
    reports: int = 0
    runs: list[str] = field(default_factory=list)
    requests: int = 0  # requests that began their steps under this manifest in this process
    request_ids: list[str] = field(default_factory=list)  # a sample of them (internal ids)


def _file_rows(db: Database, query: str) -> list[tuple[str, str, str | None]]:
    """(manifest, path, sha256) of every manifest listing QUERY."""
    base = (
        "SELECT mf.manifest, p.path, b.sha256 FROM manifest_files mf "
        "JOIN paths p ON p.id = mf.path_id LEFT JOIN blobs b ON b.id = mf.blob_id "
    )
    if _SHA.fullmatch(query):
        sql, arg = base + "WHERE b.sha256 = ?", query
    elif query.startswith("/"):
        sql, arg = base + "WHERE p.path = ?", query
    else:
        escaped = query.lstrip("/").replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        sql, arg = base + "WHERE p.path LIKE ? ESCAPE '\\'", "%/" + escaped
    rows = [(str(m), str(p), h) for m, p, h in db.execute(sql, (arg,))]
    if not _SHA.fullmatch(query) and not query.startswith("/"):  # SQLite's LIKE ignores case
        rows = [r for r in rows if r[1].endswith("/" + query.lstrip("/"))]
    return rows


def find_file(
    db: Database, query: str, sample: int = 0, whole: list[str] | None = None
) -> list[Sighting]:
    """Every process whose loaded files include QUERY: a sha256, an absolute path, or the
    end of a path (``vllm/v1/sample/sampler.py``), with the number of requests it served
    meanwhile (checked against the counts its batches' ledger entries commit to) and, with
    SAMPLE, up to that many of their ids (one more query per process). The refs of batches
    stored before counts were ledgered, hashed whole instead, are appended to WHOLE."""
    rows = _file_rows(db, query)
    # The stored manifests that mention QUERY at all (a scan of their ledgered JSON): an
    # index row deleted or re-pointed to hide a file is then a difference, not "not found".
    named = _manifests_naming(db, query)
    _check_used(db, f"audit file {query}", {m for m, _, _ in rows} | named, whole=whole)
    # The answer lists every process that loaded QUERY, or none: a ledgered manifest deleted,
    # or edited to drop the file, would hide one, so every ledgered manifest is checked whole.
    index_check.require(completeness.manifests(db), f"audit file {query}")
    if not rows:
        raise NotFound(f"no stored manifest has a file matching {query!r}")
    runs = _runs(db)
    out: list[Sighting] = []
    sampled: set[str] = set()  # the batches of the ids in the answer: hashed before it
    for manifest, path, sha in rows:
        for target, boot, pid, ticks, role, rank, container, first, last, n, served in db.execute(
            "SELECT target, boot_id, pid, start_ticks, role, rank, container_id, first_unix, "
            "last_unix, reports, requests FROM processes WHERE manifest = ? ORDER BY first_unix",
            (manifest,),
        ):
            got = (
                db.execute(
                    "SELECT internal_id, batch FROM bindings WHERE manifest_first = ? "
                    "AND pid = ? AND start_ticks = ? AND boot_id = ? AND target = ? LIMIT ?",
                    (manifest, pid, ticks, boot, target, sample),
                ).fetchall()
                if sample and served
                else []
            )
            ids = [str(i) for i, _ in got]
            sampled |= {str(b) for _, b in got}
            out.append(
                Sighting(
                    path,
                    sha,
                    target,
                    int(pid),
                    int(ticks),
                    role,
                    None if rank is None else int(rank),
                    container,
                    manifest,
                    float(first),
                    float(last),
                    int(n),
                    _runs_covering(runs, target, container),
                    int(served),
                    sorted(ids),
                )
            )
    if not out:
        raise NotFound(f"a manifest lists {query!r}, but no stored report names a process with it")
    index_check.require(index_check.check_content(db, batches=sampled), f"audit file {query}")
    return out


def _manifests_naming(db: Database, query: str) -> set[str]:
    """Digests of the stored manifests whose JSON contains QUERY (a superset of those
    listing it: the index check then compares them file by file)."""
    escaped = query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return {
        str(d)
        for (d,) in db.execute(
            "SELECT digest FROM manifests WHERE files_json LIKE ? ESCAPE '\\'",
            ("%" + escaped + "%",),
        )
    }


def _check_used(
    db: Database,
    what: str,
    manifests: set[str],
    targets: set[str] | None = None,
    whole: list[str] | None = None,
) -> None:
    """Before answering: the index rows the answer uses (the MANIFESTS' files, the processes
    of every target that ran one of them, or TARGETS) against the ledgered content, and that
    content against its ledger entries; :class:`index_check.IndexDisagrees` (exit 1) names
    the first differences. A value edited in an index table is never answered as if it
    came from the ledger."""
    if targets is None:
        targets = set()
        # The targets whose stored reports name one of MANIFESTS (a scan of their bytes:
        # a process row deleted to hide a sighting is then missing, not "not found"), and
        # those the index says (a row forged for another target is then extra).
        has = (
            "position(convert_to(?, 'UTF8') in report) > 0"
            if db.kind == "postgresql"
            else "instr(report, CAST(? AS BLOB)) > 0"
        )
        for m in sorted(manifests):
            for sql in (
                "SELECT DISTINCT target FROM processes WHERE manifest = ?",
                f"SELECT DISTINCT target FROM reports WHERE {has}",  # noqa: S608 - fixed text
            ):
                targets |= {str(t) for (t,) in db.execute(sql, (m,))}
    differences = index_check.check_manifest_files(db, manifests) if manifests else []
    differences += index_check.check_processes(db, targets, whole)
    index_check.require(differences, what)


def _runs(db: Database) -> list[tuple[str, Policy]]:
    """Every run with its parsed policy (a policy that no longer parses covers nothing), each
    ``runs`` row checked against its ledger entry first: a policy edited to cover another
    set of targets is refused (:class:`index_check.IndexDisagrees`, exit 1), never answered."""
    rows = db.execute("SELECT name, policy_toml FROM runs ORDER BY rowid").fetchall()
    index_check.require(
        index_check.check_content(db, runs=[str(n) for n, _ in rows]), "the runs covering it"
    )
    out = []
    for name, toml in rows:
        try:
            out.append((str(name), load_policy(toml, f"run {name}")))
        except PolicyError:
            continue
    return out


def _runs_covering(runs: list[tuple[str, Policy]], target: str, container: str | None) -> list[str]:
    return [n for n, p in runs if p.selects(target, (container,) if container else ())]


@dataclass(frozen=True)
class RunSummary:
    name: str
    policy_digest: str
    source: str
    created_unix: float
    history: list[tuple[float, str]]  # (when, verdict) each time it changed


def run_summary(db: Database, name: str) -> RunSummary:
    row = db.execute(
        "SELECT name, policy_digest, source, created_unix FROM runs WHERE name = ?", (name,)
    ).fetchone()
    if row is None:
        raise NotFound(f"no run named {name!r} in this database")
    history = [
        (float(t), str(v))
        for t, v in db.execute(
            "SELECT at_unix, verdict FROM verdicts WHERE run = ? ORDER BY rowid", (name,)
        )
    ]
    used = index_check.check_content(db, runs=[name], verdicts=[(name, t) for t, _ in history])
    index_check.require(used, f"audit run {name}")
    return RunSummary(row[0], row[1], row[2], float(row[3]), history)


@dataclass
class Served:
    """One request as the process that ran the model served it, and what was in force."""

    internal_id: str
    external_ids: list[str]
    target: str
    pid: int
    start_ticks: int
    role: str | None
    rank: int | None
    container_id: str | None
    runner: str
    first_step: int
    last_step: int
    steps: int
    tokens: int
    first_unix: float
    last_unix: float
    finished: bool
    manifests: list[str]  # at its first step, then at its last when it changed meanwhile
    manifests_stored: list[bool]
    hooks: dict[str, int]
    not_pristine: list[dict[str, Any]]  # files of that process whose origin is not pristine
    runs: list[dict[str, Any]]  # each run covering the target: its verdict at the time
    # Speculative decoding of the request: drafts, draft_tokens, accepted, emitted, pos
    # (accepted per position). None: speculation off, or not recorded.
    spec: dict[str, Any] | None = None


IdKey = tuple[str, str]  # (internal id, target): an id row's mapping, within its own target


def _internal_ids(db: Database, query: str) -> dict[IdKey, list[str]]:
    """The (internal id, target) pairs the id rows naming QUERY (as the client's id, an
    external id or an internal id) map it to, each with its external ids. An id row is what
    one target's agent reported of its own API server: it names a request of that target's
    engine alone (internal ids are one engine's, not global), so it resolves only to spans
    of that target. An external id's rows are found through its client id (derived from it,
    and indexed), so the external id needs no index of its own. A query too long for a
    report, or shaped like a digest, is looked up in every form an agent stores it in
    (``fields.request_id_forms``): as it is, as a client's, external or internal id with its
    client part bounded (what an agent sends now), and as one whole digest (what an older
    agent sent)."""
    out: dict[IdKey, list[str]] = {}
    for form in F.request_id_forms(query):
        for key, external in _internal_ids_as(db, form).items():
            have = out.setdefault(key, [])
            have.extend(e for e in external if e not in have)
    return out


def _internal_ids_as(db: Database, query: str) -> dict[IdKey, list[str]]:
    out: dict[IdKey, list[str]] = {}
    hits: list[tuple[Any, ...]] = []
    cols = "internal_id, target, external_id, client_id"
    for value in sorted({query, client_id(query)}):
        hits += db.execute(
            f"SELECT {cols} FROM request_ids WHERE client_id = ?",  # noqa: S608 - fixed names
            (value,),
        ).fetchall()
    hits += db.execute(
        f"SELECT {cols} FROM request_ids WHERE internal_id = ?",  # noqa: S608 - fixed names
        (query,),
    ).fetchall()
    for internal, target, external, client in hits:
        if query not in (internal, external, client):
            continue
        ext = out.setdefault((str(internal), str(target)), [])
        if external not in ext:
            ext.append(str(external))
    return out


Steps = tuple[str, str, int, int, int]  # target, boot id, pid, start ticks, first step


def request_steps(
    db: Database, client: str, ledgered: content_check.LedgeredRows | None = None
) -> list[Steps]:
    """Where the request(s) a client sent with ``X-Request-Id: CLIENT`` were served, by the
    stored bindings: (target, boot id, pid, start ticks, first step) of each. Exactly that
    id: not read as an external or internal id as ``find_request`` does, since a harness's
    id shaped like an API id (``cmpl-Z-0``) would then be covered by another request (``Z``),
    whoever sent it. An id row of target T leads to T's spans only. With LEDGERED, only rows
    that their batches' ledger entries cover count (an id row or span inserted behind the
    ledger's back is no evidence): the caller keeps one across ids, each batch hashed once.
    CLIENT is looked up as agents store it (``fields.client_id_forms``)."""
    out: list[Steps] = []
    rows = []
    for value in F.client_id_forms(client):
        rows += db.execute(
            f"SELECT {bindings.ID_COLUMNS} FROM request_ids WHERE client_id = ?",  # noqa: S608
            (value,),
        ).fetchall()
    keys = {(str(r[2]), str(r[1])) for r in rows if ledgered is None or ledgered.has_id(tuple(r))}
    if not keys:
        return out
    cols = bindings.span_select(db) if ledgered is None else ledgered.span_columns
    spans = f"SELECT {cols} FROM bindings WHERE internal_id = ? AND target = ?"  # noqa: S608
    for internal, target in sorted(keys):
        for row in db.execute(spans, (internal, target)):
            if ledgered is None or ledgered.has_span(tuple(row)):
                out.append((str(row[1]), str(row[2]), int(row[3]), int(row[4]), int(row[6])))
    return out


def find_request(db: Database, query: str, whole: list[str] | None = None) -> list[Served]:
    """What served request QUERY: the client's X-Request-Id, the API's external id
    (``cmpl-...``) or the engine's internal id. An id row resolves to the spans of its own
    target only. Records reached through an id row naming QUERY come first (by first step
    time), then the spans whose internal id is QUERY itself that no such row reached: a
    target's spans on another's internal id never come before (nor push out of a limited
    answer) the request its own target mapped. The refs of batches stored before counts were
    ledgered, hashed whole by the check of the targets' processes, are appended to WHOLE."""
    ids = _internal_ids(db, query)
    runs = _runs(db)
    seen: set[tuple[Any, ...]] = set()
    spec = "spec_json" if db.has_column("bindings", "spec_json") else "NULL"
    columns = (
        "target, boot_id, pid, start_ticks, first_step, last_step, steps, tokens, first_unix, "
        f"last_unix, manifest_first, manifest_last, runner, hooks_json, finished, {spec}, batch"
    )  # fixed names (spec: a column name or NULL)
    sql = f"SELECT {columns} FROM bindings WHERE internal_id = ?"  # noqa: S608
    mapped: list[tuple[str, list[str], tuple[Any, ...]]] = []
    for (internal, target), external in ids.items():
        for row in db.execute(sql + " AND target = ?", (internal, target)):
            mapped.append((internal, external, tuple(row)))
    # Spans on the query as an internal id: as it is, and as agents report one too long.
    direct = [
        (q, ids.get((q, str(row[0])), []), tuple(row))
        for q in dict.fromkeys((query, F.bounded_internal_id(query), F.bounded_id(query)))
        for row in db.execute(sql, (q,))
    ]
    mapped.sort(key=lambda m: float(m[2][8]))
    direct.sort(key=lambda m: float(m[2][8]))
    out: list[Served] = []
    batches: set[str] = set()
    for internal, external, row in [*mapped, *direct]:
        # The same record sent twice (an agent killed after spooling a report and before
        # saving its read offsets resends it) is one request served once.
        batches.add(str(row[-1]))
        if row[:-1] in seen:
            continue
        seen.add(row[:-1])
        out.append(_served(db, runs, internal, external, row[:-1]))
    for (internal, target), _ in ids.items():
        batches |= {
            str(b)
            for (b,) in db.execute(
                "SELECT DISTINCT batch FROM request_ids WHERE internal_id = ? AND target = ?",
                (internal, target),
            )
        }
    index_check.require(index_check.check_content(db, batches=batches), f"audit request {query}")
    if out:
        _check_used(db, f"audit request {query}", set(), {s.target for s in out}, whole)
    if not out:
        # "Not found" rests on every row not found: a ledgered id row or span deleted (or a
        # whole batch) would make a served request read as never served.
        index_check.require(completeness.bindings(db), f"audit request {query}")
        known = sorted({i for (i, _), e in ids.items() if e})
        if known:
            raise NotFound(
                f"request {query!r} is the engine's {', '.join(known)}, but no stored binding "
                "of the target that mapped it says which steps served it (not yet reported, "
                "or it never ran)"
            )
        raise NotFound(f"no stored request binding matches {query!r}")
    return out


def _served(
    db: Database, runs: list[tuple[str, Policy]], internal: str, external: list[str],
    row: tuple[Any, ...],
) -> Served:  # fmt: skip
    (target, boot, pid, ticks, s0, s1, n, tok, t0, t1, m0, m1, runner, hooks, fin, spec) = row
    manifests = [m0] if m0 == m1 else [m0, m1]
    stored = [
        db.execute("SELECT 1 FROM manifests WHERE digest = ?", (m,)).fetchone() is not None
        for m in manifests
    ]
    # "Not stored" is true only of a manifest never ledgered (between reports): one with a
    # ledger entry was stored, and its row is gone.
    gone = [m for m, s in zip(manifests, stored, strict=True) if not s and m
            and completeness.manifest_is_ledgered(db, m)]  # fmt: skip
    index_check.require(
        [
            content_check.Difference("manifests", m, "row", None, "a ledgered manifest")
            for m in gone
        ],
        f"the manifest of request {internal}",
    )
    proc = db.execute(
        "SELECT role, rank, container_id FROM processes WHERE target = ? AND boot_id = ? "
        "AND pid = ? AND start_ticks = ? ORDER BY last_unix DESC LIMIT 1",
        (target, boot, pid, ticks),
    ).fetchone()
    role, rank, container = proc if proc is not None else (None, None, None)
    return Served(
        internal, external, target, int(pid), int(ticks), role,
        None if rank is None else int(rank), container, runner, int(s0), int(s1), int(n),
        int(tok), float(t0), float(t1), bool(fin), manifests, stored, json.loads(hooks),
        _not_pristine(db, target, boot, int(pid), int(ticks), float(t1)),
        _verdicts_at(db, runs, target, container, float(t1)),
        None if spec is None else json.loads(spec),
    )  # fmt: skip


def _not_pristine(  # noqa: PLR0917 - a process key and a time
    db: Database, target: str, boot: str, pid: int, ticks: int, at: float
) -> list[dict[str, Any]]:
    """The process's files that are not pristine, from the first report of its target after
    AT (else the last before): what the agent found when it last looked at those steps."""
    for sql in (
        "SELECT agent_id, seq, report FROM reports WHERE target = ? AND received_unix >= ? "
        "ORDER BY received_unix LIMIT 1",
        "SELECT agent_id, seq, report FROM reports WHERE target = ? AND received_unix < ? "
        "ORDER BY received_unix DESC LIMIT 1",
    ):
        got = db.execute(sql, (target, at)).fetchone()
        if got is None:
            continue
        index_check.require(
            index_check.check_content(db, reports=[(str(got[0]), int(got[1]))]),
            f"the report after request steps of pid {pid}",
        )
        report = _decode(str(got[0]), int(got[1]), bytes(got[2]))
        for p in report.processes:
            k = p.key
            if (k.boot_id, k.pid, k.start_ticks) == (boot, pid, ticks) and p.provenance:
                return [
                    {"path": f.path, "origin": f.origin, "reason": f.reason, "sha256": f.sha256}
                    for f in p.provenance.files
                ]
    return []


def _verdicts_at(
    db: Database, runs: list[tuple[str, Policy]], target: str, container: str | None, at: float
) -> list[dict[str, Any]]:
    out = []
    for name in _runs_covering(runs, target, container):
        got = db.execute(
            "SELECT verdict, at_unix FROM verdicts WHERE run = ? AND at_unix <= ? "
            "ORDER BY at_unix DESC LIMIT 1",
            (name, at),
        ).fetchone()
        if got is not None:  # the verdict in force, as its ledger entry says it
            used = index_check.check_content(db, verdicts=[(name, float(got[1]))])
            index_check.require(used, f"the verdict of run {name} at {float(got[1])}")
        out.append(
            {"run": name, "verdict": got[0] if got else None,
             "since_unix": float(got[1]) if got else None}
        )  # fmt: skip
    return out


def _decode(agent_id: str, seq: int, body: bytes) -> Any:
    try:
        return wire.report_from_bytes(body)
    except wire.WireError as e:
        raise CorruptRecord(
            f"stored report {seq} of agent {agent_id} cannot be read ({e.explain()}); "
            "`verifier audit verify` says whether it was changed after it was stored"
        ) from e
