"""The audit queries over gRPC (issue 19, item 6a): a real `verifier serve` over mutual TLS
(certificates from `verifier certs`) on a database stocked with a run, a report and request
bindings (SQLite and a real PostgreSQL). An auditor's `audit file|request|run --verifier
--key` answers what `--db` answers, checked offline first; agent and harness certificates are
PERMISSION_DENIED; an auditor may not register runs or report. Every tampering of an answer
(a statement changed in transit, a proof for another entry, a checkpoint signed by another
key, another query's answer replayed, a note of another size) is refused (exit 1)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from servewitness.client.api import AuditReply, VerifierClient
from servewitness.errors import NotAuthorized
from servewitness.ledger import note
from servewitness.ledger.answers import AnswerRefused, check_answer
from servewitness.ledger.keys import generate, load_private_key, load_public_key
from servewitness.security.tls import ClientTLS
from servewitness.testing.vllm_server import free_port
from tests.helpers import Backend, verifier_cli
from tests.test_bindings_store import stocked
from tests.test_gate_e2e import Daemon
from tests.test_security import certs, client

SHA_A = "a" * 64


@contextmanager
def serving(tmp_path: Path, db: str) -> Iterator[tuple[Path, str, Path]]:
    """A real verifier over mTLS on DB (stocked), its lab CA and its public key."""
    d = certs(tmp_path)
    for who, extra in (("harness", ["--role", "harness"]),):
        assert verifier_cli("certs", "issue", who, "--dir", str(d), *extra).returncode == 0
    key = tmp_path / "signing.key"
    assert verifier_cli("keygen", "--out", str(key)).returncode == 0
    addr = f"127.0.0.1:{free_port()}"
    log = tmp_path / "serve.log"
    serve = Daemon(
        ["serve", "--listen", addr, "--db", db, "--signing-key", str(key),
         "--tls-cert", str(d / "verifier.pem"), "--tls-key", str(d / "verifier.key"),
         "--tls-client-ca", str(d / "ca.pem")], log,
    ).start()  # fmt: skip
    deadline = time.monotonic() + 30
    while "listening" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    try:
        yield d, addr, tmp_path / "signing.key.pub"
    finally:
        serve.stop()


def tls(d: Path, who: str) -> ClientTLS:
    return ClientTLS(d / "ca.pem", d / f"{who}.pem", d / f"{who}.key")


def test_an_auditor_over_mtls_gets_the_db_answer_checked_offline(
    backend: Backend, tmp_path: Path
) -> None:
    """Negative control: an honest verifier answers each query as `--db` does; the CLI says
    it verified the answer."""
    stocked(backend.target)
    with serving(tmp_path, backend.target) as (d, addr, pub):
        got = {}
        for kind, q in (("file", SHA_A), ("run", "all"), ("request", "alpha")):
            out = verifier_cli(
                *client(d, "audit", "audit", kind, q, "--key", str(pub), "--json", addr=addr)
            )
            assert out.returncode == 0, out.stdout + out.stderr
            assert "verified offline" in out.stderr
            got[kind] = json.loads(out.stdout)
        text = verifier_cli(*client(d, "audit", "audit", "file", SHA_A, "--key", str(pub),
                                    addr=addr))  # fmt: skip
        assert text.returncode == 0 and "verified offline with key" in text.stdout, text.stderr
    local = {  # after the verifier stopped: the verdicts it recorded meanwhile included
        kind: json.loads(verifier_cli("audit", kind, q, "--db", backend.target, "--json").stdout)
        for kind, q in (("file", SHA_A), ("run", "all"), ("request", "alpha"))
    }
    assert got["file"] == local["file"]
    assert {k: v for k, v in got["run"].items() if k != "history"} == {
        k: v for k, v in local["run"].items() if k != "history"
    }
    # The answer holds the history as it stood when it was signed; the history keeper may
    # record more (STALE) before the verifier stops: what was answered is its beginning.
    answered = [v for _, v in got["run"]["history"]]
    assert answered and answered == [v for _, v in local["run"]["history"]][: len(answered)]
    (r,) = got["request"]
    (lr,) = local["request"]
    assert (r["request"], r["runner"], r["hooks"], r["manifests"]) == (
        lr["internal_id"], lr["runner"], lr["hooks"], lr["manifests"])  # fmt: skip
    p = r["process"]
    assert (p["pid"], p["role"], p["container_id"]) == (lr["pid"], lr["role"], lr["container_id"])


def test_roles_no_key_limits_and_an_edited_index(tmp_path: Path) -> None:
    db = str(tmp_path / "db.sqlite3")
    stocked(db)
    with serving(tmp_path, db) as (d, addr, pub):
        # Agent and harness certificates: PERMISSION_DENIED (exit 10).
        for who in ("agent-a", "harness"):
            out = verifier_cli(*client(d, who, "audit", "request", "alpha", "--key", str(pub),
                                       addr=addr))  # fmt: skip
            assert out.returncode == 10 and "auditor or operator" in out.stderr, out.stderr
        # An auditor may not register a run, nor report.
        with VerifierClient(addr, tls=tls(d, "audit")) as c:
            with pytest.raises(NotAuthorized):
                c.register_run("x", "version = 1\n", "t")
            from servewitness.api.v1 import verifier_pb2 as pb

            with pytest.raises(grpc.RpcError) as e:
                c.stub.Hello(pb.HelloRequest(agent_id="audit", targets=["a"]), timeout=10)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            # Bounded: above the most one answer holds is refused, saying so.
            with pytest.raises(Exception, match="above the most one answer holds"):
                c.audit("request", "alpha", 100_000)
        # No --key: refused before asking (no trust on first use).
        out = verifier_cli(*client(d, "audit", "audit", "run", "all", addr=addr))
        assert out.returncode == 2 and "no trust on first use" in out.stderr, out.stderr
        # An index row edited under the running verifier: it refuses to answer (exit 1).
        import sqlite3

        c2 = sqlite3.connect(db)
        c2.execute("UPDATE processes SET container_id = ?", ("e" * 64,))
        c2.commit()
        c2.close()
        out = verifier_cli(*client(d, "audit", "audit", "file", SHA_A, "--key", str(pub),
                                   addr=addr))  # fmt: skip
        assert out.returncode == 1 and "container_id" in out.stderr, out.stdout + out.stderr
        assert "e" * 12 not in out.stdout


# Tampered answers: the client's offline check, on answers a real verifier gave -------------


def _tamper_payload(bundle: bytes, kind: str, edit: Any) -> bytes:
    data = json.loads(bundle)
    for s, c in zip(data["statements"], data["contents"], strict=True):
        if c["kind"] == kind:
            payload = json.loads(base64.b64decode(s["payload"]))
            edit(payload)
            s["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    return json.dumps(data).encode()


def _swap_proofs(bundle: bytes) -> bytes:
    data = json.loads(bundle)
    seqs = sorted(data["proofs"])
    assert len(seqs) >= 2
    a, b = seqs[0], seqs[1]
    data["proofs"][a], data["proofs"][b] = data["proofs"][b], data["proofs"][a]
    return json.dumps(data).encode()


def test_a_tampered_answer_is_refused(tmp_path: Path) -> None:
    db = str(tmp_path / "db.sqlite3")
    stocked(db)
    with (
        serving(tmp_path, db) as (d, addr, pub_path),
        VerifierClient(addr, tls=tls(d, "audit")) as c,
    ):
        alpha = c.audit("request", "alpha")
        beta = c.audit("request", "beta")
        files = c.audit("file", SHA_A)
        run = c.audit("run", "all")
        old_note = c.audit_checkpoint()
    pub = load_public_key(pub_path)
    for kind, q, reply in (("request", "alpha", alpha), ("file", SHA_A, files),
                           ("run", "all", run)):  # fmt: skip
        assert check_answer(kind, q, reply.bundle, reply.note, pub).records  # honest

    def refused(kind: str, q: str, bundle: bytes, text: str, says: str) -> None:
        with pytest.raises(AnswerRefused, match=says):
            check_answer(kind, q, bundle, text, pub)

    def other_container(p: dict[str, Any]) -> None:
        for s in p["predicate"]["details"]["sightings"]:
            s["container_id"] = "e" * 64

    def other_role(p: dict[str, Any]) -> None:
        p["predicate"]["details"]["process"]["role"] = "api_server"

    # A statement changed in transit (its signature no longer covers it).
    refused("file", SHA_A, _tamper_payload(files.bundle, "manifest", other_container),
            files.note, "does not verify")  # fmt: skip
    refused("request", "alpha", _tamper_payload(alpha.bundle, "bindings", other_role),
            alpha.note, "does not verify")  # fmt: skip
    # A proof for another entry.
    refused("run", "all", _swap_proofs(run.bundle), run.note, "does not verify")
    # Another key: an answer (bundle and note) signed by a key that is not the verifier's.
    other = generate()
    data = json.loads(run.bundle)
    size = int(json.loads(base64.b64decode(data["checkpoint"]["payload"]))["predicate"]["size"])
    refused("run", "all", run.bundle, note.sign_checkpoint(other, size, b"\0" * 32),
            "note does not verify")  # fmt: skip
    from servewitness.ledger.export import answer
    from servewitness.server.db import open_database

    rodb = open_database(db, read_only=True)
    try:
        forged = answer(rodb, other, "run", "all", 50).bundle
    finally:
        rodb.close()
    from servewitness.ledger.bundle import dump

    refused("run", "all", dump(forged), run.note, "does not verify")
    # Variations: a valid answer to another query replayed for this one; a valid note of
    # another size beside the bundle.
    refused("request", "alpha", beta.bundle, beta.note, "not 'alpha'")
    refused("file", "cpu_model_runner.py", files.bundle, files.note, "answers file")
    assert note.verify(old_note, pub).size >= 1
    grown = note.sign_checkpoint(load_private_key(pub_path.with_suffix("")), 1, b"\1" * 32)
    refused("run", "all", run.bundle, grown, "is not the bundle's")
    assert isinstance(alpha, AuditReply)
