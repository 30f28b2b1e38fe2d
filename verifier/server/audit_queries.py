"""Audit queries over the verifier's stored records: which processes loaded a file (by sha256
or path), in which targets and runs; and a run's history. They read a database opened
read-only, so an auditor can run them on a copy without a running verifier.

These scan the stored reports (decoding each) rather than an index: correct at any size,
slow at millions of reports. Indexed request and file bindings are the next step (issue 7).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from verifier import wire
from verifier.errors import Error
from verifier.policy import PolicyError, load_policy
from verifier.server.db import Database

_SHA = re.compile(r"[0-9a-f]{64}")


class NotFound(Error):
    exit_code = 6


class CorruptRecord(Error):
    exit_code = 1


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


def _matches(query: str, row: dict[str, object]) -> bool:
    if _SHA.fullmatch(query):
        return row.get("sha256") == query
    path = str(row.get("path", ""))
    return path == query if query.startswith("/") else path.endswith("/" + query.lstrip("/"))


def find_file(db: Database, query: str) -> list[Sighting]:
    """Every process whose loaded files include QUERY: a sha256, an absolute path, or the
    end of a path (``vllm/v1/sample/sampler.py``)."""
    hits: dict[str, list[dict[str, object]]] = {}
    for digest, files_json in db.execute("SELECT digest, files_json FROM manifests"):
        matched = [r for r in json.loads(files_json) if _matches(query, r)]
        if matched:
            hits[digest] = matched
    if not hits:
        raise NotFound(f"no stored manifest has a file matching {query!r}")
    runs = [
        (name, toml)
        for name, toml in db.execute("SELECT name, policy_toml FROM runs ORDER BY rowid")
    ]
    seen: dict[tuple[str, int, int, str], Sighting] = {}
    for agent_id, seq, target, received, body in db.execute(
        "SELECT agent_id, seq, target, received_unix, report FROM reports ORDER BY received_unix"
    ):
        try:
            report = wire.report_from_bytes(bytes(body))
        except wire.WireError as e:
            raise CorruptRecord(
                f"stored report {seq} of agent {agent_id} cannot be read ({e.explain()}); "
                "`verifier audit verify` says whether it was changed after it was stored"
            ) from e
        for p in report.processes:
            for row in hits.get(p.manifest_digest or "", []):
                key = (target, p.key.pid, p.key.start_ticks, str(row["path"]))
                s = seen.get(key)
                if s is None:
                    sha = row.get("sha256")
                    s = seen[key] = Sighting(
                        str(row["path"]), sha if isinstance(sha, str) else None, target,
                        p.key.pid, p.key.start_ticks, p.role, p.rank, p.container_id,
                        p.manifest_digest or "", received, received,
                        runs=_runs_covering(runs, target, p.container_id),
                    )  # fmt: skip
                s.last_unix = received
                s.reports += 1
    if not seen:
        raise NotFound(f"a manifest lists {query!r}, but no stored report names a process with it")
    return list(seen.values())


def _runs_covering(runs: list[tuple[str, str]], target: str, container: str | None) -> list[str]:
    out = []
    for name, toml in runs:
        try:
            policy = load_policy(toml, f"run {name}")
        except PolicyError:
            continue
        if policy.selects(target, (container,) if container else ()):
            out.append(name)
    return out


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
    return RunSummary(row[0], row[1], row[2], float(row[3]), history)
