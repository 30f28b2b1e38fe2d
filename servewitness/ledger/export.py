"""``verifier audit export``: a signed bundle (``servewitness.ledger.bundle``) of what the ledger
says about some requests and runs, verifiable offline with the verifier's public key.

For each request: the batch of bindings that holds its span (every row of the batch, so its
ledger subject recomputes), the batch that mapped its external id, and the manifests in force,
each with a runtime-evidence statement summarising what served it. For each run: its
registration (the policy) and every recorded verdict as a gate decision. Always: a checkpoint
over the whole ledger, signed now, with an inclusion proof for every exported entry, and a
consistency proof from the latest checkpoint the verifier signed while serving, if any.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

from servewitness.errors import NotFound
from servewitness.ledger import bindings, chain, content_check, merkle, queries
from servewitness.ledger import bundle as B
from servewitness.ledger import statement as st
from servewitness.ledger.dsse import b64encode
from servewitness.ledger.interface import Database
from servewitness.ledger.keys import Ed25519PrivateKey, key_id


class _Export:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.attestations: list[B.Attestation] = []
        self.seqs: set[int] = set()
        self.done: set[tuple[str, str]] = set()

    def entry(self, kind: str, ref: str) -> int | None:
        row = self.db.execute(
            "SELECT seq FROM ledger WHERE kind = ? AND ref = ?", (kind, ref)
        ).fetchone()
        return None if row is None else int(row[0])

    def add(self, kind: str, ref: str, content: dict[str, Any], ptype: str, pred: Any) -> None:
        if (kind, ref) in self.done:
            return
        seq = self.entry(kind, ref)
        if seq is None:
            raise NotFound(f"the {kind} {ref} has no ledger entry")
        self.done.add((kind, ref))
        self.seqs.add(seq)
        self.attestations.append(B.Attestation(seq, content, ptype, pred))

    def batch(self, ref: str, predicate: dict[str, Any]) -> None:
        head = self.db.execute(
            f"SELECT target, received_unix, {bindings.batch_columns(self.db)} "  # noqa: S608
            "FROM binding_batches WHERE ref = ?",
            (ref,),
        ).fetchone()
        if head is None:
            raise NotFound(f"no stored batch of bindings {ref}")
        agent_id, seq = json.loads(ref)
        spans = self.db.execute(
            f"SELECT {bindings.span_select(self.db)} FROM bindings WHERE batch = ? "  # noqa: S608
            "ORDER BY rowid",
            (ref,),
        ).fetchall()
        ids = self.db.execute(
            f"SELECT {bindings.ID_COLUMNS} FROM request_ids WHERE batch = ? ORDER BY rowid",  # noqa: S608
            (ref,),
        ).fetchall()
        content = B.content(
            "bindings", agent_id=agent_id, seq=seq, target=head[0], received=float(head[1]),
            spans_b64=b64encode(_lines(spans)), ids_b64=b64encode(_lines(ids)),
        )  # fmt: skip
        if head[4] is not None:  # stored since per-process counts were ledgered
            content["fields"]["counts_json"] = str(head[4])
        self.add("bindings", ref, content, st.RUNTIME_EVIDENCE, predicate)

    def manifest(self, digest: str) -> None:
        row = self.db.execute(
            "SELECT files_json FROM manifests WHERE digest = ?", (digest,)
        ).fetchone()
        if row is None:
            return  # between reports: never stored, nothing to prove
        content = B.content("manifest", digest=digest, files_json=row[0])
        pred = st.runtime_evidence(
            target="", collected_unix=0.0, details={"manifest": digest, "files": None}
        )
        self.add("manifest", digest, content, st.RUNTIME_EVIDENCE, pred)

    def request(self, query: str, limit: int | None = None) -> int:
        """Statements for what served QUERY (the first LIMIT records); how many there are."""
        found = queries.find_request(self.db, query)
        for s in found[:limit]:
            summary = {
                "request": s.internal_id, "external_ids": s.external_ids, "runner": s.runner,
                "manifests": s.manifests, "hooks": s.hooks, "steps": [s.first_step, s.last_step],
                "scheduled_steps": s.steps, "tokens": s.tokens, "finished": s.finished,
                "process": {"pid": s.pid, "start_ticks": s.start_ticks, "role": s.role,
                            "rank": s.rank, "container_id": s.container_id},
                "not_pristine": s.not_pristine, "runs": s.runs,
            }  # fmt: skip
            pred = st.runtime_evidence(target=s.target, collected_unix=s.last_unix, details=summary)
            # The batches of its own target only: an id row or span another target reported
            # on the same internal id is that target's engine's, never this record's.
            for table in ("bindings", "request_ids"):
                for (ref,) in self.db.execute(
                    f"SELECT DISTINCT batch FROM {table} WHERE internal_id = ? AND target = ?",  # noqa: S608
                    (s.internal_id, s.target),
                ).fetchall():
                    self.batch(str(ref), pred)
            for m in s.manifests:
                self.manifest(m)
        return len(found)

    def file(self, query: str, limit: int) -> int:
        """Statements for the first LIMIT processes that loaded QUERY: each manifest listing it
        (its sightings as the predicate) and the last report that showed each process (that
        report's bytes, so the process's role, rank and container are the ledger's). How
        many sightings there are."""
        found = queries.find_file(self.db, query)
        shown = found[:limit]
        by_manifest: dict[str, list[dict[str, Any]]] = {}
        for s in shown:
            by_manifest.setdefault(s.manifest_digest, []).append(dataclasses.asdict(s))
        for digest, sightings in by_manifest.items():
            row = self.db.execute(
                "SELECT files_json FROM manifests WHERE digest = ?", (digest,)
            ).fetchone()
            content = B.content("manifest", digest=digest, files_json=row[0])
            pred = st.runtime_evidence(
                target="", collected_unix=0.0,
                details={"query": query, "manifest": digest, "sightings": sightings},
            )  # fmt: skip
            self.add("manifest", digest, content, st.RUNTIME_EVIDENCE, pred)
        for s in shown:
            got = self.db.execute(
                "SELECT agent_id, seq, target, received_unix, report, receipt_json FROM reports "
                "WHERE target = ? AND received_unix = ? ORDER BY rowid LIMIT 1",
                (s.target, s.last_unix),
            ).fetchone()
            if got is None:
                raise NotFound(f"no stored report of {s.target} at {s.last_unix}")
            agent_id, seq, target, received, body, receipt = got
            content = B.content(
                "report", agent_id=agent_id, seq=int(seq), target=target,
                received=float(received), body_b64=b64encode(bytes(body)),
                **({} if receipt is None else {"receipt_json": receipt}),
            )  # fmt: skip
            pred = st.runtime_evidence(
                target=s.target, collected_unix=s.last_unix,
                details={"query": query, "pid": s.pid, "start_ticks": s.start_ticks},
            )  # fmt: skip
            self.add("report", chain.report_ref(agent_id, int(seq)), content,
                     st.RUNTIME_EVIDENCE, pred)  # fmt: skip
        return len(found)

    def run(self, name: str, verifier_id: str, limit: int | None = None) -> int:
        """Statements for run NAME's registration and its first LIMIT verdicts; how many
        verdicts it has."""
        row = self.db.execute(
            "SELECT name, policy_toml, policy_digest, source, created_unix FROM runs "
            "WHERE name = ?",
            (name,),
        ).fetchone()
        if row is None:
            raise NotFound(f"no run named {name!r} in this database")
        name, policy, digest, source, created = row
        content = B.content(
            "run", name=name, policy=policy, digest=digest, source=source, created=float(created)
        )
        pred = {"run": name, "policy_digest": digest, "source": source, "created_unix": created}
        self.add("run", name, content, "https://verifier.dev/run-registration/v1", pred)
        verdicts = self.db.execute(
            "SELECT at_unix, verdict, detail_json FROM verdicts WHERE run = ? ORDER BY rowid",
            (name,),
        ).fetchall()
        used = content_check.check_content(
            self.db, runs=[name], verdicts=[(name, float(at)) for at, _, _ in verdicts[:limit]]
        )
        content_check.require(used, f"audit run {name}")  # never signs an edited row
        for at, verdict, detail in verdicts[:limit]:
            ref = chain.verdict_ref(name, at)
            findings = json.loads(detail).get("run", [])
            pred = st.gate_decision(
                verifier_id=verifier_id, time_verified=float(at),
                policy_digest=str(digest).removeprefix("sha256:"), run=name, result=verdict,
                findings=[{"id": f} for f in findings],
            )  # fmt: skip
            content = B.content(
                "verdict", run=name, at=float(at), verdict=verdict, detail_json=detail
            )
            self.add("verdict", ref, content, st.GATE_DECISION, pred)
        return len(verdicts)


def _lines(rows: Sequence[Any]) -> bytes:
    """The rows as ``bindings.rows_sha256`` digests them."""
    return bindings.rows_bytes(rows)


def export(
    db: Database,
    key: Ed25519PrivateKey,
    requests: Sequence[str] = (),
    runs: Sequence[str] = (),
    verifier_id: str | None = None,
) -> dict[str, Any]:
    """The bundle for REQUESTS and RUNS (both may be empty: then only the signed checkpoint)."""
    vid = verifier_id or key_id(key)
    ex = _Export(db)
    for r in requests:
        ex.request(r)
    for name in runs:
        ex.run(name, vid)
    return _sign(db, key, ex, vid)


def _sign(
    db: Database, key: Ed25519PrivateKey, ex: _Export, vid: str, tree: merkle.Proofs | None = None
) -> dict[str, Any]:
    """The bundle of EX's statements over the whole ledger (TREE: its tree, as the verifier
    keeps it; None: built from the ledger), signed now."""
    tree = B.tree_from_db(db) if tree is None else tree
    if tree.size == 0:
        raise NotFound("the ledger is empty: nothing to export")
    since = latest_checkpoint_size(db, tree.size)
    entries = B.entries_from_db(db, {*ex.seqs, tree.size})
    return B.build_bundle(
        entries, tree, key, ex.attestations, at_unix=time.time(), verifier_id=vid, since=since
    )


ANSWER_KINDS = ("request", "file", "run")


def answer(
    db: Database,
    key: Ed25519PrivateKey,
    kind: str,
    query: str,
    limit: int,
    *,
    tree: merkle.Proofs | None = None,
) -> tuple[dict[str, Any], int]:
    """One audit query's answer as a signed bundle (``verifier audit ... --verifier``): the
    first LIMIT records of KIND (``ANSWER_KINDS``) matching QUERY, and how many match.
    TREE: the ledger's tree as the verifier keeps it (None: built from the whole ledger)."""
    vid = key_id(key)
    ex = _Export(db)
    if kind == "request":
        total = ex.request(query, limit)
    elif kind == "file":
        total = ex.file(query, limit)
    elif kind == "run":
        total = ex.run(query, vid, limit)
    else:
        raise ValueError(f"unknown audit query {kind!r}")
    return _sign(db, key, ex, vid, tree), total


def latest_checkpoint_size(db: Database, size: int) -> int | None:
    row = db.execute("SELECT MAX(size) FROM checkpoints WHERE size <= ?", (size,)).fetchone()
    return int(row[0]) if row is not None and row[0] is not None else None
