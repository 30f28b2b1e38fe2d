"""The index tables (processes, paths, blobs, manifest_files) against the ledgered content, on
SQLite and a real PostgreSQL (issue 19, item 6a): they are outside the ledger, yet `audit file`,
`audit request` and the signed export answer from them. An attacker with the database edits
a role, a container id, a file's hash or path, deletes a row or forges a process that never
reported; `audit verify --db` names the table, the row and the field (exit 1), and the queries
and the export refuse to answer from the edited row (exit 1) instead of presenting it, or
signing it, as ledger-backed. Without the check (before this change) every case below verified
clean and the queries answered with the edited value."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from servewitness.ledger import index_check
from servewitness.ledger.export import export
from servewitness.ledger.keys import generate
from servewitness.ledger.queries import find_file, find_request
from servewitness.server.db import open_database
from servewitness.server.store import Store
from tests.helpers import Backend, verifier_cli
from tests.test_bindings_store import M1, stocked

SHA_A = "a" * 64  # the worker's first file (tests.test_policy_engine.entry)
SAMPLER = "vllm/v1/worker/cpu_model_runner.py"
PROC = "UPDATE processes SET {} WHERE role = 'worker'"
FORGED = (
    "INSERT INTO processes (target, boot_id, pid, start_ticks, manifest, role, rank, "
    "container_id, runner, first_unix, last_unix, reports, requests) "
    "VALUES ('serving', 'boot-1', 4242, 99, ?, 'worker', 1, ?, 'x.Runner', 1.0, 2.0, 1, 0)",
    (M1, "d" * 64),
)

Statement = str | tuple[str, Sequence[Any]]
# name, statements, what `audit verify` names (table, field), which answers must refuse
CASES: list[tuple[str, list[Statement], tuple[str, str], tuple[str, ...]]] = [
    ("edit a role", [PROC.format("role = 'api_server'")], ("processes", "role"),
     ("file", "request", "export")),
    ("edit a container id", [PROC.format("container_id = '" + "e" * 64 + "'")],
     ("processes", "container_id"), ("file", "request", "export")),
    ("edit a rank", [PROC.format("rank = 7")], ("processes", "rank"),
     ("file", "request", "export")),
    ("edit a runner", [PROC.format("runner = 'evil.Runner'")], ("processes", "runner"),
     ("file", "request", "export")),
    ("edit a request count", [PROC.format("requests = 99")], ("processes", "requests"),
     ("file", "request", "export")),
    ("edit a file hash", [("UPDATE blobs SET sha256 = ? WHERE sha256 = ?", ("f" * 64, SHA_A))],
     ("blobs", "sha256"), ("file",)),
    ("edit a path", [("UPDATE paths SET path = '/elsewhere/cpu_model_runner.py' "
                      "WHERE path LIKE ?", ("%" + SAMPLER,))], ("paths", "path"), ("file",)),
    ("delete a process", ["DELETE FROM processes"], ("processes", "row"), ("request",)),
    ("delete a file row", [("DELETE FROM manifest_files WHERE blob_id = "
                            "(SELECT id FROM blobs WHERE sha256 = ?)", ("b" * 64,))],
     ("manifest_files", "row"), ("file",)),
    ("forge a process that never reported", [FORGED], ("processes", "row"),
     ("file", "request", "export")),
    # Variations: no value edited, only a reference moved to another real row.
    ("re-point a file to another real hash", [(
        "UPDATE manifest_files SET blob_id = (SELECT id FROM blobs WHERE sha256 = ?) "
        "WHERE blob_id = (SELECT id FROM blobs WHERE sha256 = ?)", ("b" * 64, SHA_A))],
     ("manifest_files", "sha256 (blobs)"), ("file",)),
    ("move a process's first sighting earlier", [PROC.format("first_unix = first_unix - 3600")],
     ("processes", "first_unix"), ("file", "request", "export")),
]  # fmt: skip


def _answers(target: str) -> dict[str, str | None]:
    """Each answer's refusal (None: it answered)."""
    out: dict[str, str | None] = {}
    db = open_database(target, read_only=True)
    try:
        for name, call in (
            ("file", lambda: find_file(db, SHA_A)),
            ("request", lambda: find_request(db, "alpha")),
            ("export", lambda: export(db, generate(), ["alpha"], ["all"])),
        ):
            try:
                call()
                out[name] = None
            except index_check.IndexDisagrees as e:
                out[name] = str(e)
    finally:
        db.close()
    return out


def test_an_honest_database_verifies_and_answers(backend: Backend) -> None:
    """Negative control: nothing differs, every answer is given, the CLI says the index was
    checked."""
    stocked(backend.target)
    assert set(_answers(backend.target).values()) == {None}
    out = verifier_cli("audit", "verify", "--db", backend.target)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "index tables (processes, paths, blobs, manifest files) match" in out.stdout
    out = verifier_cli("audit", "file", SAMPLER, "--db", backend.target, "--json")
    assert out.returncode == 0, out.stderr
    (got,) = json.loads(out.stdout)
    assert (got["role"], got["container_id"]) == ("worker", "c" * 64)


@pytest.mark.parametrize(("name", "sql", "named", "refused"), CASES, ids=[c[0] for c in CASES])
def test_an_edited_index_is_named_and_never_answered_from(
    backend: Backend,
    name: str,
    sql: list[Statement],
    named: tuple[str, str],
    refused: tuple[str, ...],
) -> None:
    stocked(backend.target)
    backend.sql(*sql)
    assert backend.check().ok  # the ledger walk alone sees nothing: the hole this closes

    out = verifier_cli("audit", "verify", "--db", backend.target, "--json")
    assert out.returncode == 1, out.stdout + out.stderr
    got = json.loads(out.stdout)
    assert not got["ok"] and got["index"], got
    assert (named[0], named[1]) in {(d["table"], d["field"]) for d in got["index"]}, got["index"]

    answers = _answers(backend.target)
    for what in refused:
        assert answers[what] is not None, (what, answers)
        assert "disagree with the ledgered content" in str(answers[what])


def test_the_cli_refuses_an_answer_and_writes_no_bundle(backend: Backend, tmp_path: Path) -> None:
    """The same through the CLI: `audit file` and `audit export` exit 1 naming the row; no
    bundle is written, so nothing edited is ever signed."""
    stocked(backend.target)
    backend.sql(PROC.format("container_id = '" + "e" * 64 + "'"))
    out = verifier_cli("audit", "file", SHA_A, "--db", backend.target)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "processes" in out.stderr and "container_id" in out.stderr and "e" * 12 not in out.stdout
    key = tmp_path / "v.key"
    assert verifier_cli("keygen", "--out", str(key)).returncode == 0
    bundle = tmp_path / "b.json"
    out = verifier_cli(
        "audit", "export", "--db", backend.target, "--key", str(key), "--out", str(bundle),
        "--request", "alpha",
    )  # fmt: skip
    assert out.returncode == 1 and not bundle.exists(), out.stdout + out.stderr
    assert "container_id" in out.stderr
    out = verifier_cli("audit", "verify", "--db", backend.target)
    assert out.returncode == 1
    assert "index differs: processes" in out.stdout and "container_id" in out.stdout


def test_a_report_edited_behind_the_ledger_is_not_answered_from(backend: Backend) -> None:
    """The content the targeted check derives from is itself checked against its ledger entry:
    a report whose bytes were replaced (with the index edited to match) is refused by the
    query, and the ledger walk names it."""
    stocked(backend.target)
    db = open_database(backend.target)
    try:
        (body,) = db.execute("SELECT report FROM reports").fetchone()
        db.execute("UPDATE reports SET report = ?", (bytes(body).replace(b"worker", b"wOrker"),))
    finally:
        db.close()
    backend.sql(PROC.format("role = 'wOrker'"))
    assert not backend.check().ok
    db = open_database(backend.target, read_only=True)
    try:
        with pytest.raises(index_check.IndexDisagrees, match="reports"):
            find_file(db, SHA_A)
    finally:
        db.close()


def test_a_read_only_snapshot_sees_one_state_while_the_verifier_writes(backend: Backend) -> None:
    """What `verifier audit file|request|run|export|verify --db` read inside: the index check
    compares tables read at different moments, so outside one snapshot a report the live
    verifier stored in between was a false "index disagrees" (test_gate_e2e hit it in CI)."""
    writer = Store(backend.target)
    reader = open_database(backend.target, read_only=True)
    count = "SELECT COUNT(*) FROM runs"
    try:
        writer.register_run("a", "version = 1\n", "sha256:" + "1" * 64, "a.toml")
        with reader.snapshot():
            before = reader.execute(count).fetchone()[0]
            writer.register_run("b", "version = 1\n", "sha256:" + "2" * 64, "b.toml")
            assert reader.execute(count).fetchone()[0] == before == 1
        assert reader.execute(count).fetchone()[0] == 2
    finally:
        reader.close()
        writer.close()
