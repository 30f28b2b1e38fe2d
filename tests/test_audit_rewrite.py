"""The audit service signs nothing over a rewritten ledger. Every note and answer it returns is
a fresh signature over the ledger as stored, so a database rewritten behind the running
verifier (a run's policy edited and every hash re-chained: the chain verifies on its own)
would otherwise be signed for any auditor who asks, laundering the rewrite that the stored
checkpoints show. Real verifier, real gRPC; the negative control checks the checkpoint and
consistency answers of the honest ledger offline."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.client.api import VerifierClient
from servewitness.ledger import keys, merkle, note
from servewitness.server.app import ServeConfig, VerifierServer
from servewitness.server.db import open_database
from tests.helpers import rechain, verifier_cli
from tests.test_faults import policy


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, VerifierServer]]:
    addr, db = f"unix:{tmp_path}/v.sock", tmp_path / "db.sqlite3"
    server = VerifierServer(ServeConfig(addr, db, checkpoint_interval_s=0.5))
    server.start()
    try:
        with VerifierClient(addr) as c:
            for i in range(3):
                c.register_run(f"r{i}", policy(30.0 + i), "p.toml")
        yield addr, db, server
    finally:
        server.stop()


def signed_size(db: Path) -> int:
    conn = open_database(str(db), read_only=True)
    try:
        row = conn.execute("SELECT MAX(size) FROM checkpoints WHERE note IS NOT NULL").fetchone()
    finally:
        conn.close()
    return int(row[0] or 0)


def test_nothing_is_signed_over_a_ledger_rewritten_behind_the_verifier(
    served: tuple[str, Path, VerifierServer],
) -> None:
    addr, db, server = served
    pub = keys.load_public_key(keys.public_path(server.key_path))
    deadline = time.monotonic() + 30
    while signed_size(db) < 3:  # the verifier signs its first checkpoint unasked
        assert time.monotonic() < deadline, "no checkpoint signed"
        time.sleep(0.2)
    with grpc.insecure_channel(addr) as ch:
        stub = pb_grpc.AuditServiceStub(ch)
        # Honest: the note verifies, and the consistency proof from size 1 holds against it.
        now = note.verify(stub.AuditCheckpoint(pb.AuditCheckpointRequest()).note, pub)
        cons = stub.AuditConsistency(pb.AuditConsistencyRequest(old_size=1))
        head = note.verify(cons.note, pub)
        assert head.size >= now.size >= 3
        assert merkle.verify_consistency(1, head.size, cons.old_root, head.root, cons.proof)
        assert stub.AuditRun(pb.AuditRunRequest(query="r0")).answer.bundle

        conn = open_database(str(db))
        try:
            conn.execute("UPDATE runs SET policy_toml = ? WHERE name = 'r1'", ("# forged",))
            rechain(conn)  # the chain verifies again on its own
        finally:
            conn.close()

        calls: dict[str, tuple[Callable[..., Any], Any]] = {
            "checkpoint": (stub.AuditCheckpoint, pb.AuditCheckpointRequest()),
            "consistency": (stub.AuditConsistency, pb.AuditConsistencyRequest(old_size=1)),
            "run": (stub.AuditRun, pb.AuditRunRequest(query="r0")),
        }
        for name, (call, request) in calls.items():
            with pytest.raises(grpc.RpcError) as e:
                call(request)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, name
            assert "rewritten" in (e.value.details() or ""), (name, e.value.details())


def test_an_auditor_checks_over_the_wire_that_the_ledger_extends_a_note_kept_elsewhere(
    served: tuple[str, Path, VerifierServer], tmp_path: Path
) -> None:
    """`audit checkpoint --verifier` gives a note to keep outside; later `audit consistency
    --from OLD --verifier` proves the ledger only grew since, checked here with the key alone
    (no database access). A note of another history at the same size (signed with the same
    key: a fork shown to this auditor) and a ledger rewritten behind the verifier fail."""
    addr, db, server = served
    pub = str(keys.public_path(server.key_path))
    old = tmp_path / "old.note"
    out = verifier_cli("audit", "checkpoint", "--verifier", addr, "--key", pub, "--out", str(old))
    assert out.returncode == 0, out.stderr
    assert note.verify(old.read_text(), keys.load_public_key(Path(pub))).size >= 3
    with VerifierClient(addr) as c:
        c.register_run("later", policy(40.0), "p.toml")  # the ledger grows
    out = verifier_cli("audit", "consistency", "--from", str(old), "--key", pub, "--verifier", addr)
    assert out.returncode == 0 and "consistent:" in out.stdout, out.stdout + out.stderr

    signed = note.verify(old.read_text(), keys.load_public_key(Path(pub)))
    forked = tmp_path / "fork.note"  # same key, same size, another root
    priv = keys.load_private_key(server.key_path)
    forked.write_text(note.sign_checkpoint(priv, signed.size, b"\x01" * 32))
    out = verifier_cli("audit", "consistency", "--from", str(forked), "--key", pub,
                       "--verifier", addr)  # fmt: skip
    assert out.returncode == 1 and "rewritten" in out.stderr, out.stdout + out.stderr

    conn = open_database(str(db))
    try:
        conn.execute("UPDATE runs SET policy_toml = ? WHERE name = 'r1'", ("# forged",))
        rechain(conn)
    finally:
        conn.close()
    out = verifier_cli("audit", "consistency", "--from", str(old), "--key", pub, "--verifier", addr)
    assert out.returncode != 0 and "rewritten" in out.stderr, out.stdout + out.stderr
