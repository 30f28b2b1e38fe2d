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

# What one statement adds to a bundle beyond its content and predicate: the DSSE envelope's
# signature and key id, the statement's subject, the inclusion proof (64 bytes a level).
_STATEMENT_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class Omitted:
    """A record that matches but is not in the answer: what it rests on would not fit."""

    target: str
    record: str  # a request's internal id, a sighting's "pid N"
    bytes: int


_Pending = tuple[str, str, dict[str, Any], str, Any]  # kind, ref, content, type, predicate


class _Export:
    def __init__(self, db: Database, budget: int | None = None) -> None:
        self.db = db
        self.attestations: list[B.Attestation] = []
        self.seqs: set[int] = set()
        self.done: set[tuple[str, str]] = set()
        # An answer over the wire is one message: records whose content would take it over
        # BUDGET bytes are left out and named (``omitted``), so one record's fat content (a
        # batch another target padded to its report limit) never holds the others out.
        self.budget = budget
        self.used = 0
        self.omitted: list[Omitted] = []
        self.shown = 0  # records carried

    def _fits(
        self, target: str, record: str, pending: list[_Pending], extra: dict[str, Any] | None = None
    ) -> bool:
        """Add PENDING (one record's statements) when they, and EXTRA (content it adds to a
        statement made later), fit the budget; else name the record in ``omitted`` and add
        nothing."""
        new = [p for p in pending if (p[0], p[1]) not in self.done]
        cost = sum(
            len(json.dumps(c)) + len(json.dumps(pred, default=str)) * 4 // 3 + _STATEMENT_BYTES
            for _, _, c, _, pred in new
        ) + (len(json.dumps(extra)) + _STATEMENT_BYTES if extra else 0)
        if self.budget is not None and self.used + cost > self.budget:
            self.omitted.append(Omitted(target, record, cost))
            return False
        self.used += cost
        for kind, ref, c, ptype, pred in new:
            self.add(kind, ref, c, ptype, pred)
        return True

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

    def _batch(self, ref: str) -> dict[str, Any]:
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
        return content

    def _manifest(self, digest: str) -> _Pending | None:
        row = self.db.execute(
            "SELECT files_json FROM manifests WHERE digest = ?", (digest,)
        ).fetchone()
        if row is None:
            return None  # between reports: never stored, nothing to prove
        content = B.content("manifest", digest=digest, files_json=row[0])
        pred = st.runtime_evidence(
            target="", collected_unix=0.0, details={"manifest": digest, "files": None}
        )
        return ("manifest", digest, content, st.RUNTIME_EVIDENCE, pred)

    def request(self, query: str, limit: int | None = None) -> int:
        """Statements for what served QUERY (the first LIMIT records that fit the budget; the
        others that did not fit in ``omitted``); how many there are."""
        found = queries.find_request(self.db, query)
        for s in found:
            if limit is not None and self.shown >= limit:
                break
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
            pending: list[_Pending] = []
            for table in ("bindings", "request_ids"):
                for (ref,) in self.db.execute(
                    f"SELECT DISTINCT batch FROM {table} WHERE internal_id = ? AND target = ?",  # noqa: S608
                    (s.internal_id, s.target),
                ).fetchall():
                    if ("bindings", str(ref)) not in self.done:
                        content = self._batch(str(ref))
                        pending.append(("bindings", str(ref), content, st.RUNTIME_EVIDENCE, pred))
            pending += [m for m in map(self._manifest, s.manifests) if m is not None]
            self.shown += self._fits(s.target, s.internal_id, pending)
        return len(found)

    def file(self, query: str, limit: int) -> int:
        """Statements for the first LIMIT processes that loaded QUERY: each manifest listing it
        (its sightings as the predicate) and the last report that showed each process (that
        report's bytes, so the process's role, rank and container are the ledger's). How
        many sightings there are."""
        found = queries.find_file(self.db, query)
        # Each sighting's report first, within the budget: a sighting whose report (or
        # manifest) would take the answer over it is left out and named.
        shown: list[queries.Sighting] = []
        for s in found:
            if len(shown) >= limit:
                break
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
            pending: list[_Pending] = [("report", chain.report_ref(agent_id, int(seq)), content,
                                        st.RUNTIME_EVIDENCE, pred)]  # fmt: skip
            # Its manifest's statement is made below, once, with every sighting it backs: its
            # size counts here, with the first sighting that needs it.
            extra = None
            if all(m.manifest_digest != s.manifest_digest for m in shown):
                row = self.db.execute(
                    "SELECT files_json FROM manifests WHERE digest = ?", (s.manifest_digest,)
                ).fetchone()
                extra = B.content("manifest", digest=s.manifest_digest, files_json=row[0])
            if self._fits(s.target, f"pid {s.pid}", pending, extra):
                shown.append(s)
        self.shown = len(shown)
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
    budget: int | None = None,
) -> Answer:
    """One audit query's answer (``verifier audit ... --verifier``): the first LIMIT records
    of KIND (``ANSWER_KINDS``) matching QUERY as a signed bundle, less those whose content
    would take it over BUDGET bytes (None: no bound; a run's answer is never cut), which are
    named instead. TREE: the ledger's tree as the verifier keeps it (None: built from the
    whole ledger)."""
    vid = key_id(key)
    ex = _Export(db, budget)
    if kind == "request":
        total = ex.request(query, limit)
    elif kind == "file":
        total = ex.file(query, limit)
    elif kind == "run":
        total = ex.run(query, vid, limit)
        ex.shown = min(total, limit)
    else:
        raise ValueError(f"unknown audit query {kind!r}")
    return Answer(_sign(db, key, ex, vid, tree), total, ex.shown, ex.omitted)


@dataclasses.dataclass(frozen=True)
class Answer:
    """An audit answer: the signed BUNDLE, how many records match (TOTAL), how many the
    bundle carries (SHOWN) and those left out for their size (OMITTED)."""

    bundle: dict[str, Any]
    total: int
    shown: int
    omitted: list[Omitted]


def latest_checkpoint_size(db: Database, size: int) -> int | None:
    row = db.execute("SELECT MAX(size) FROM checkpoints WHERE size <= ?", (size,)).fetchone()
    return int(row[0]) if row is not None and row[0] is not None else None
