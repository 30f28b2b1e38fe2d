"""Request bindings in the store, on SQLite and on a real PostgreSQL server: stored as one
ledger-covered batch per report, found by the client's id, the external id or the internal
id, linked to the manifest, runner, hooks and verdict in force; edited, deleted, moved or
smuggled rows are caught by the ledger walk; unknown ids are exit 6."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from servewitness import wire
from servewitness.errors import NotFound
from servewitness.ledger.bindings import client_id
from servewitness.ledger.queries import find_file, find_request
from servewitness.model import ProcessKey, RequestId, RequestSpan, RequestSpec, TargetReport
from servewitness.server.db import open_database
from servewitness.server.index import processes_seen
from servewitness.server.store import Store, StoredReport
from tests.helpers import Backend, not_vllm_policy, verifier_cli
from tests.test_policy_engine import worker

M1, M2 = "sha256:" + "3" * 64, "sha256:" + "4" * 64
API = ProcessKey("boot", 10, 100)


SPEC = RequestSpec(drafts=9, draft_tokens=24, accepted_tokens=13, accepted_per_position=(7, 4, 2),
                   emitted_tokens=30)  # fmt: skip


def spans_for(
    w_key: ProcessKey, T: float, spec: RequestSpec | None = SPEC
) -> tuple[RequestSpan, ...]:
    return (
        RequestSpan(w_key, "cmpl-alpha-0-1a2b", 5, 20, 16, 31, T + 0.5, T + 1.0, M1, M1,
                    "vllm.v1.worker.cpu_model_runner.CPUModelRunner", (("h", 16),), spec=spec),
        RequestSpan(w_key, "cmpl-beta-0-3c4d", 18, 40, 23, 30, T + 0.9, T + 1.5, M1, M2,
                    "vllm.v1.worker.cpu_model_runner.CPUModelRunner", (("h", 0),)),
    )  # fmt: skip


def ids_for(t: float) -> tuple[RequestId, ...]:
    return (
        RequestId(API, "cmpl-alpha-0-1a2b", "cmpl-alpha-0", t + 0.4),
        RequestId(API, "cmpl-beta-0-3c4d", "cmpl-beta-0", t + 0.8),
    )


def stocked(target: str, spec: RequestSpec | None = SPEC) -> ProcessKey:
    """A run, a report with a worker and its manifest, and a batch of two bindings (the first
    with speculation counts SPEC)."""
    w = replace(worker(), manifest_digest=M1, container_id="c" * 64)
    assert w.files
    s = Store(target)
    T = time.time()  # the verdict is recorded now; the requests are served just after
    try:
        s.register_run(
            "all",
            not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\n'),
            "sha256:" + "1" * 64,
            "t",
        )
        s.record_verdict("all", "PASS", {"n": 1})
        assert s.verdict_history("all")[0][0] < T + 1.0
        body = wire.report_to_bytes(TargetReport("a", "serving", 1, "", T + 2, (w,)))
        stored = s.save_report(
            StoredReport("a", 1, "serving", T + 2, body),
            {M1: w.files},
            processes_seen((w,)),
            spans_for(w.key, T, spec),
            ids_for(T),
        )
        assert stored
        again = s.save_report(  # a retransmitted report: stored once, its batch too
            StoredReport("a", 1, "serving", T + 3, body), {}, processes_seen((w,)),
            spans_for(w.key, T, spec), ids_for(T),
        )  # fmt: skip
        assert not again
        v = s.verify_ledger()
        assert v.ok, v
    finally:
        s.close()
    return w.key


def test_client_ids_are_read_out_of_the_api_ids() -> None:
    assert client_id("cmpl-alpha-0") == "alpha"
    assert client_id("cmpl-req-7-0") == "req-7"
    assert client_id("chatcmpl-req-7") == "req-7"
    assert client_id("plain") == "plain"


def test_a_request_is_found_by_any_of_its_ids(backend: Backend) -> None:
    key = stocked(backend.target)
    db = open_database(backend.target, read_only=True)
    try:
        for query in ("alpha", "cmpl-alpha-0", "cmpl-alpha-0-1a2b"):
            (got,) = find_request(db, query)
            assert got.internal_id == "cmpl-alpha-0-1a2b" and got.external_ids == ["cmpl-alpha-0"]
            assert (got.pid, got.start_ticks, got.role) == (key.pid, key.start_ticks, "worker")
            assert got.runner.endswith("CPUModelRunner") and got.hooks == {"h": 16}
            assert got.manifests == [M1] and got.manifests_stored == [True]
            assert got.container_id == "c" * 64 and (got.steps, got.tokens) == (16, 31)
            assert [(r["run"], r["verdict"]) for r in got.runs] == [("all", "PASS")]
            assert got.spec == {"drafts": 9, "draft_tokens": 24, "accepted": 13, "emitted": 30,
                                "pos": [7, 4, 2]}  # fmt: skip
        (beta,) = find_request(db, "beta")
        assert beta.manifests == [M1, M2] and beta.manifests_stored == [True, False]
        assert beta.spec is None  # speculation not recorded for it
        with pytest.raises(NotFound):
            find_request(db, "gamma")  # negative control: never sent
    finally:
        db.close()


def test_a_file_lookup_names_the_requests_its_process_served(backend: Backend) -> None:
    stocked(backend.target)
    w = worker()
    assert w.files
    db = open_database(backend.target, read_only=True)
    try:
        assert all(h.request_ids == [] for h in find_file(db, w.files[0].path))  # counts only
        hits = find_file(db, w.files[0].path, sample=10)
        assert hits and all(h.requests == 2 for h in hits), hits
        assert hits[0].request_ids == ["cmpl-alpha-0-1a2b", "cmpl-beta-0-3c4d"]
        sha = w.files[0].sha256
        assert sha and find_file(db, sha)[0].path == w.files[0].path
        suffix = "/".join(w.files[0].path.split("/")[-2:])
        assert find_file(db, suffix)[0].path == w.files[0].path
        with pytest.raises(NotFound):
            find_file(db, suffix.upper())  # paths are case-sensitive, whatever LIKE does
    finally:
        db.close()


BINDING_TAMPERING = [
    ("edit a binding", "UPDATE bindings SET tokens = 1 WHERE internal_id = 'cmpl-beta-0-3c4d'",
     "the stored bindings was changed"),
    ("delete a binding", "DELETE FROM bindings WHERE internal_id = 'cmpl-alpha-0-1a2b'",
     "the stored bindings was changed"),
    ("re-point an id", "UPDATE request_ids SET external_id = 'cmpl-mallory-0'",
     "the stored bindings was changed"),
    ("smuggle a binding", "INSERT INTO bindings SELECT * FROM bindings WHERE internal_id = "
     "'cmpl-alpha-0-1a2b'", "the stored bindings was changed"),
    ("delete the batch", "DELETE FROM binding_batches", "the stored bindings was changed"),
    ("edit speculation counts", "UPDATE bindings SET spec_json = REPLACE(spec_json, "
     "'\"accepted\":13', '\"accepted\":23')", "the stored bindings was changed"),
    ("drop speculation counts", "UPDATE bindings SET spec_json = NULL",
     "the stored bindings was changed"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "sql", "says"), BINDING_TAMPERING, ids=[c[0] for c in BINDING_TAMPERING]
)
def test_tampered_bindings_are_caught(backend: Backend, name: str, sql: str, says: str) -> None:
    stocked(backend.target)
    if "SELECT *" in sql and "postgres" in backend.target:
        sql = sql.replace("SELECT *", "SELECT nextval('bindings_rowid_seq'), batch, target, "
                          "boot_id, pid, start_ticks, internal_id, first_step, last_step, steps, "
                          "tokens, first_unix, last_unix, manifest_first, manifest_last, runner, "
                          "hooks_json, finished, spec_json")  # fmt: skip
    backend.sql(sql)
    v = backend.check()
    assert not v.ok and says in (v.problem or ""), v


def test_audit_request_cli(backend: Backend) -> None:
    stocked(backend.target)
    out = verifier_cli("audit", "request", "alpha", "--db", backend.target, "--json")
    assert out.returncode == 0, out.stderr
    (got,) = json.loads(out.stdout)
    assert got["internal_id"] == "cmpl-alpha-0-1a2b" and got["hooks"] == {"h": 16}
    assert got["spec"]["accepted"] == 13
    out = verifier_cli("audit", "request", "alpha", "--db", backend.target)
    assert out.returncode == 0, out.stderr
    assert (
        "speculation: 9 draft(s), 24 draft tokens, 13 accepted (54%; per position [7, 4, 2]), "
        "30 tokens emitted" in out.stdout
    ), out.stdout
    out = verifier_cli("audit", "request", "beta", "--db", backend.target)
    assert out.returncode == 0 and "CPUModelRunner" in out.stdout and M2 in out.stdout
    assert "speculation" not in out.stdout
    assert "not stored: between reports" in out.stdout
    out = verifier_cli("audit", "request", "gamma", "--db", backend.target)
    assert out.returncode == 6 and "no stored request binding" in out.stderr, out.stderr
    backend.sql(("UPDATE reports SET report = ?", (b"\xff\xff",)))
    out = verifier_cli("audit", "request", "alpha", "--db", backend.target)
    assert out.returncode == 1 and "audit verify" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_an_older_database_gets_its_index_rebuilt(backend: Backend) -> None:
    stocked(backend.target)
    backend.sql("DELETE FROM manifest_files", "DELETE FROM processes")
    s = Store(backend.target)
    try:
        assert s.reindexed == 1 and s.verify_ledger().ok
    finally:
        s.close()
    db = open_database(backend.target, read_only=True)
    try:
        assert find_request(db, "alpha")[0].role == "worker"
    finally:
        db.close()


def test_a_binding_resent_in_a_later_batch_is_one_request(backend: Backend) -> None:
    """An agent killed after spooling a report and before saving its read offsets sends the
    same bindings again with its next report: stored twice (both in the ledger), answered once."""
    key = stocked(backend.target)
    s = Store(backend.target)
    try:
        t = time.time()
        body = wire.report_to_bytes(TargetReport("a", "serving", 2, "", t, ()))
        (alpha, _) = spans_for(key, t)
        original = find_request_via(backend.target, "alpha")
        assert s.save_report(
            StoredReport("a", 2, "serving", t, body),
            {},
            (),
            (replace(alpha, first_unix=original.first_unix, last_unix=original.last_unix),),
            (),
        )
        assert s.verify_ledger().ok
    finally:
        s.close()
    db = open_database(backend.target, read_only=True)
    try:
        assert len(find_request(db, "alpha")) == 1
    finally:
        db.close()


def find_request_via(target: str, query: str) -> RequestSpan:
    db = open_database(target, read_only=True)
    try:
        (got,) = find_request(db, query)
    finally:
        db.close()
    key = ProcessKey("", got.pid, got.start_ticks)
    return RequestSpan(key, got.internal_id, got.first_step, got.last_step, got.steps, got.tokens,
                       got.first_unix, got.last_unix, got.manifests[0], got.manifests[-1],
                       got.runner)  # fmt: skip


def test_a_database_from_before_speculation_counts_keeps_its_digests_and_is_upgraded(
    backend: Backend,
) -> None:
    """A database made before ``bindings.spec_json`` existed: read-only audits read it as it
    is, the ledger walk still passes (a NULL trailing column is not part of a row's digest),
    and the verifier adds the column on open, after which new bindings carry their counts."""
    key = stocked(backend.target, spec=None)
    backend.sql("ALTER TABLE bindings DROP COLUMN spec_json")
    assert backend.check().ok
    db = open_database(backend.target, read_only=True)
    try:
        assert not db.has_column("bindings", "spec_json")
        (alpha,) = find_request(db, "alpha")
        assert alpha.spec is None and alpha.hooks == {"h": 16}
    finally:
        db.close()
    s = Store(backend.target)
    try:
        assert s.columns_added == ["bindings.spec_json"]
        assert s.verify_ledger().ok
        t = time.time()
        body = wire.report_to_bytes(TargetReport("a", "serving", 2, "", t, ()))
        spec = replace(spans_for(key, t)[0], internal_id="cmpl-gamma-0-5e6f")
        assert s.save_report(StoredReport("a", 2, "serving", t, body), {}, (), (spec,), ())
        assert s.verify_ledger().ok
    finally:
        s.close()
    again = Store(backend.target)
    again.close()
    assert again.columns_added == []  # once
    db = open_database(backend.target, read_only=True)
    try:
        (gamma,) = find_request(db, "cmpl-gamma-0-5e6f")
    finally:
        db.close()
    assert gamma.spec == {"drafts": 9, "draft_tokens": 24, "accepted": 13, "emitted": 30,
                          "pos": [7, 4, 2]}  # fmt: skip
    backend.sql("UPDATE bindings SET spec_json = NULL")  # negative control: now it counts
    assert not backend.check().ok
