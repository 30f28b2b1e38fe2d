"""A refused TLS handshake is exit 10 (NOT_AUTHORIZED) and says which side refused and why;
exit 4 (UNAVAILABLE) stays for a verifier that is not there. Real gRPC, real certificates
from `verifier certs`, the real CLI and a real agent.

gRPC reports all of these as UNAVAILABLE ("Socket closed" when the server refuses a client
certificate under TLS 1.3), so without the client asking again they were all exit 4."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servewitness.testing.vllm_server import free_port
from tests.helpers import agent_stub, verifier_cli
from tests.test_gate_e2e import Daemon
from tests.test_security import agent, certs, client, running_tls_verifier, sleeping_process


@pytest.fixture
def tls_verifier(tmp_path: Path) -> Iterator[tuple[Path, str, Path]]:
    with running_tls_verifier(tmp_path) as v:
        yield v


@pytest.fixture
def sleeper() -> Iterator[int]:
    with sleeping_process() as pid:
        yield pid


def test_a_client_certificate_the_verifier_refuses_is_exit_10_saying_so(
    tls_verifier: tuple[Path, str, Path],
) -> None:
    d, addr, tmp = tls_verifier
    # Negative control: the right certificate reads (no run yet: exit 2/6, never 4 or 10).
    out = verifier_cli(*client(d, "audit", "run", "list", addr=addr))
    assert out.returncode == 0, out.stderr
    # No certificate where one is required.
    out = verifier_cli(*client(d, None, "run", "list", addr=addr))
    assert out.returncode == 10, out.stderr
    assert "refused this client's certificate" in out.stderr
    assert "presented no certificate" in out.stderr, out.stderr
    # A certificate from another CA (same name, same role: only the signature differs).
    other = tmp / "other"
    out = verifier_cli("run", "list", "--verifier", addr, "--tls-ca", str(d / "ca.pem"),
                       "--tls-cert", str(other / "ops.pem"),
                       "--tls-key", str(other / "ops.key"))  # fmt: skip
    assert out.returncode == 10, out.stderr
    assert f"did not accept the certificate {other / 'ops.pem'}" in out.stderr, out.stderr


def test_a_verifier_certificate_the_client_refuses_is_exit_10_saying_so(
    tls_verifier: tuple[Path, str, Path],
) -> None:
    d, addr, tmp = tls_verifier
    other = tmp / "other"
    # The client trusts another CA: the verifier's certificate (a man in the middle's, as far
    # as this client can tell) fails verification on the client's side.
    out = verifier_cli("run", "list", "--verifier", addr, "--tls-ca", str(other / "ca.pem"),
                       "--tls-cert", str(d / "ops.pem"),
                       "--tls-key", str(d / "ops.key"))  # fmt: skip
    assert out.returncode == 10, out.stderr
    assert "this client refused the verifier's certificate" in out.stderr, out.stderr
    # Variation: a plaintext client at the TLS port is told the verifier requires TLS.
    out = verifier_cli("run", "list", "--verifier", addr)
    assert out.returncode == 10, out.stderr
    assert "requires TLS and this client has none" in out.stderr, out.stderr


def test_a_tls_client_at_a_plaintext_verifier_refuses_it(tmp_path: Path) -> None:
    d = certs(tmp_path)
    addr = f"127.0.0.1:{free_port()}"
    serve = Daemon(["serve", "--listen", addr, "--db", str(tmp_path / "db.sqlite3")],
                   tmp_path / "serve.log").start()  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "listening" not in (tmp_path / "serve.log").read_text():
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.1)
        out = verifier_cli(*client(d, "ops", "run", "list", addr=addr))
        assert out.returncode == 10, out.stderr
        assert "does not speak TLS" in out.stderr, out.stderr
    finally:
        serve.stop()


def test_nothing_listening_or_a_listener_that_hangs_up_stays_exit_4(tmp_path: Path) -> None:
    d = certs(tmp_path)
    # Negative control: nothing listening is unreachable, not a refusal.
    out = verifier_cli(*client(d, "ops", "run", "list", addr=f"127.0.0.1:{free_port()}"))
    assert out.returncode == 4, out.stderr
    # Variation: something accepts and hangs up at once (a crashing verifier, a proxy with
    # no backend): no one judged a credential, so still exit 4.
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    port = lsock.getsockname()[1]
    stop = threading.Event()

    def hang_up() -> None:
        lsock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except OSError:
                continue
            conn.close()

    t = threading.Thread(target=hang_up, daemon=True)
    t.start()
    try:
        out = verifier_cli(*client(d, "ops", "run", "list", addr=f"127.0.0.1:{port}"))
        assert out.returncode == 4, out.stderr
        out = verifier_cli("run", "list", "--verifier", f"127.0.0.1:{port}")
        assert out.returncode == 4, out.stderr
    finally:
        stop.set()
        t.join()
        lsock.close()


def test_an_agent_whose_certificate_is_refused_at_start_exits_10_saying_so(
    tls_verifier: tuple[Path, str, Path],
    sleeper: int,
) -> None:
    d, addr, tmp = tls_verifier
    other = tmp / "other"
    (d / "foreign.pem").write_bytes((other / "ops.pem").read_bytes())
    (d / "foreign.key").write_bytes((other / "ops.key").read_bytes())
    a = agent(d, addr, tmp, ("foreign", "a", "agent-a"), sleeper)
    log = tmp / "agent-agent-a-a.log"
    assert a.proc is not None
    try:
        # Never accepted: a misconfiguration, so the agent says so and exits 10 (after it was
        # accepted once, a refusal keeps its evidence spooled and it retries).
        code = a.proc.wait(timeout=60)
    finally:
        if a.proc is not None and a.proc.poll() is None:
            a.stop()
    text = log.read_text()
    assert code == 10, text
    assert "not_authorized" in text and "refused this client's certificate" in text, text
    assert "verifier: error:" in text and "its evidence stays spooled" in text, text


def test_a_pass_over_mutual_tls_names_the_agent_and_a_foreign_target_is_refused(
    tmp_path: Path,
) -> None:
    """Evidence reported over mTLS by an agent whose certificate names its target PASSes, and
    the verdict says who sent it; the same agent reporting for another target is refused."""
    import grpc

    from servewitness import wire
    from servewitness.api.v1 import verifier_pb2 as pb
    from servewitness.client.api import VerifierClient
    from servewitness.model import TargetReport
    from servewitness.security.tls import ClientTLS, ServerTLS
    from servewitness.server.app import ServeConfig, VerifierServer
    from tests.helpers import PRISTINE_VLLM_CPU
    from tests.test_policy_engine import CPU, worker

    d = certs(tmp_path)
    assert (
        verifier_cli("certs", "issue", "agent-1", "--dir", str(d), "--target", "t").returncode == 0
    )
    policy = (  # strong: the live CPU runner, pristine vLLM; a healthy worker reports
        'version = 1\n[evidence]\nrequire_probe = ["worker"]\n'
        f'[runner]\nexpect_class = "{CPU}"\n' + PRISTINE_VLLM_CPU
    )
    tls = ServerTLS(d / "verifier.pem", d / "verifier.key", d / "ca.pem")
    server = VerifierServer(ServeConfig("127.0.0.1:0", tmp_path / "db.sqlite3", tls=tls))
    server.start()
    addr = f"127.0.0.1:{server.port}"
    try:
        agent_tls = ClientTLS(d / "ca.pem", d / "agent-1.pem", d / "agent-1.key")
        proc = worker()
        with agent_tls.channel(addr, wire.GRPC_OPTIONS) as ch:
            stub = agent_stub(ch)
            for target, seq in (("t", 1), ("z", 2)):
                try:
                    nonce = stub.Hello(pb.HelloRequest(agent_id="agent-1", targets=[target])).nonce
                    rep = TargetReport("agent-1", target, seq, nonce, time.time(), (proc,))
                    stub.Report(pb.ReportRequest(report=wire.report_to_pb(rep)))
                    assert target == "t", "a report for a target the certificate does not name"
                except grpc.RpcError as e:
                    assert target == "z" and e.code() == grpc.StatusCode.PERMISSION_DENIED, e
        ops = ClientTLS(d / "ca.pem", d / "ops.pem", d / "ops.key")
        with VerifierClient(addr, tls=ops) as c:
            c.register_run("r", policy, "test")
            v = c.status("r")
    finally:
        server.stop()
    assert v.verdict.value == "PASS", [f.id for t in v.targets for f in t.findings]
    assert [t.target for t in v.targets] == ["t"]
    who = [f.context for t in v.targets for f in t.findings if f.id == "evidence.authenticated"]
    assert who == [{"authenticated_as": "agent agent-1"}], who
