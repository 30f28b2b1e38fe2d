"""Transport security over real gRPC with real certificates (`verifier certs`): mutual TLS
binds an agent to the targets its certificate names; roles from client certificates or
bearer tokens decide who registers runs and who reads status; a client without credentials
or with another CA's certificate gets nothing; insecure mode is for local addresses only,
and says so every time."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from servewitness.testing.vllm_server import free_port
from tests.helpers import not_vllm_policy, verifier_cli
from tests.test_gate_e2e import Daemon

POLICY = not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\n')


def certs(tmp_path: Path) -> Path:
    d = tmp_path / "pki"
    steps = [
        ["certs", "init", "--dir", str(d)],
        ["certs", "issue", "verifier", "--dir", str(d), "--ip", "127.0.0.1", "--dns", "localhost"],
        ["certs", "issue", "agent-a", "--dir", str(d), "--target", "a"],
        ["certs", "issue", "ops", "--dir", str(d), "--role", "operator"],
        ["certs", "issue", "audit", "--dir", str(d), "--role", "auditor"],
        ["certs", "issue", "nobody", "--dir", str(d), "--target", "z"],
    ]
    for args in steps:
        out = verifier_cli(*args)
        assert out.returncode == 0, (args, out.stderr)
    other = tmp_path / "other"
    for args in (["certs", "init", "--dir", str(other)],
                 ["certs", "issue", "ops", "--dir", str(other), "--role", "operator"]):  # fmt: skip
        assert verifier_cli(*args).returncode == 0
    return d


def client(d: Path, who: str | None, *args: str, addr: str) -> list[str]:
    base = [*args, "--verifier", addr, "--tls-ca", str(d / "ca.pem")]
    if who is not None:
        base += ["--tls-cert", str(d / f"{who}.pem"), "--tls-key", str(d / f"{who}.key")]
    return base


@contextmanager
def running_tls_verifier(tmp_path: Path) -> Iterator[tuple[Path, str, Path]]:
    """A real verifier over mTLS on loopback, with the lab CA of ``certs`` (also reused by
    tests/test_tls_refusal.py and tests/test_local_identity.py)."""
    d = certs(tmp_path)
    addr = f"127.0.0.1:{free_port()}"
    (tmp_path / "p.toml").write_text(POLICY)
    serve = Daemon(
        ["serve", "--listen", addr, "--db", str(tmp_path / "db.sqlite3"),
         "--report-interval", "0.2", "--tls-cert", str(d / "verifier.pem"),
         "--tls-key", str(d / "verifier.key"), "--tls-client-ca", str(d / "ca.pem")],
        tmp_path / "serve.log",
    ).start()  # fmt: skip
    deadline = time.monotonic() + 30
    while "listening" not in (tmp_path / "serve.log").read_text():
        assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
        time.sleep(0.1)
    try:
        yield d, addr, tmp_path
    finally:
        serve.stop()


@pytest.fixture
def tls_verifier(tmp_path: Path) -> Iterator[tuple[Path, str, Path]]:
    with running_tls_verifier(tmp_path) as v:
        yield v


@contextmanager
def sleeping_process() -> Iterator[int]:
    """A small process for the agents to look at (no vLLM: reports come quickly)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def sleeper() -> Iterator[int]:
    with sleeping_process() as pid:
        yield pid


def agent(d: Path, addr: str, tmp_path: Path, who: tuple[str, str, str], pid: int) -> Daemon:
    cert, target, agent_id = who
    return Daemon(
        ["agent", "--verifier", addr, "--target", target, "--agent-id", agent_id,
         "--pid", str(pid), "--interval", "0.2", "--no-docker",
         "--spool", str(tmp_path / f"spool-{agent_id}-{target}"),
         "--tls-ca", str(d / "ca.pem"), "--tls-cert", str(d / f"{cert}.pem"),
         "--tls-key", str(d / f"{cert}.key")],
        tmp_path / f"agent-{agent_id}-{target}.log",
    ).start()  # fmt: skip


def test_roles_and_agent_bindings_over_mutual_tls(
    tls_verifier: tuple[Path, str, Path], sleeper: int
) -> None:
    d, addr, tmp = tls_verifier
    policy = str(tmp / "p.toml")
    # An auditor reads but may not register; an operator registers.
    out = verifier_cli(*client(d, "audit", "run", "register", "r", "--policy", policy, addr=addr))
    assert out.returncode == 10 and "needs the role operator" in out.stderr, out.stderr
    out = verifier_cli(*client(d, "ops", "run", "register", "r", "--policy", policy, addr=addr))
    assert out.returncode == 0, out.stderr
    # No client certificate, or one from another CA: the handshake fails, and that is a
    # refusal (exit 10), not an outage (tests/test_tls_refusal.py has every side of it).
    out = verifier_cli(*client(d, None, "status", "r", addr=addr))
    assert out.returncode == 10, out.stderr
    other = tmp / "other"
    foreign = [*client(d, None, "status", "r", addr=addr), "--tls-cert",
               str(other / "ops.pem"), "--tls-key", str(other / "ops.key")]  # fmt: skip
    assert verifier_cli(*foreign).returncode == 10

    good = agent(d, addr, tmp, ("agent-a", "a", "agent-a"), sleeper)
    wrong_target = agent(d, addr, tmp, ("agent-a", "b", "agent-a"), sleeper)
    wrong_id = agent(d, addr, tmp, ("agent-a", "a", "someone-else"), sleeper)
    try:
        deadline = time.monotonic() + 90
        while True:
            out = verifier_cli(*client(d, "audit", "status", "r", addr=addr))
            if "target a" in out.stdout:
                break
            assert time.monotonic() < deadline, out.stdout + out.stderr
            time.sleep(0.3)
        assert out.returncode != 10, out.stderr  # the auditor may read
        deadline = time.monotonic() + 60  # until both refused agents have tried
        while not all(
            "not_authorized" in (tmp / f"agent-{n}.log").read_text()
            for n in ("agent-a-b", "someone-else-a")
        ):
            assert time.monotonic() < deadline
            time.sleep(0.3)
        out = verifier_cli(*client(d, "audit", "status", "r", "--json", addr=addr))
        assert '"target": "b"' not in out.stdout, out.stdout
    finally:
        for a in (good, wrong_target, wrong_id):
            a.stop()
    b_log = (tmp / "agent-agent-a-b.log").read_text()
    assert "not_authorized" in b_log and "may not report for target(s) b" in b_log, b_log
    id_log = (tmp / "agent-someone-else-a.log").read_text()
    assert "may not report as agent 'someone-else'" in id_log, id_log


def test_bearer_tokens_carry_roles_and_unknown_tokens_are_refused(tmp_path: Path) -> None:
    d = certs(tmp_path)
    harness = verifier_cli("certs", "token", "--name", "ci", "--role", "harness")
    assert harness.returncode == 0
    token = harness.stdout.split()[1]
    (tmp_path / "tokens.toml").write_text(harness.stdout.split("\n", 2)[2])
    assert token not in (tmp_path / "tokens.toml").read_text()  # only its digest is kept
    addr = f"127.0.0.1:{free_port()}"
    (tmp_path / "p.toml").write_text(POLICY)
    serve = Daemon(
        ["serve", "--listen", addr, "--db", str(tmp_path / "db.sqlite3"), "--run",
         f"r={tmp_path / 'p.toml'}", "--tls-cert", str(d / "verifier.pem"), "--tls-key",
         str(d / "verifier.key"), "--tokens", str(tmp_path / "tokens.toml")],
        tmp_path / "serve.log",
    ).start()  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "listening" not in (tmp_path / "serve.log").read_text():
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.1)
        base = ["--verifier", addr, "--tls-ca", str(d / "ca.pem")]
        out = verifier_cli("status", "r", *base, f"--token={token}")
        assert out.returncode in (0, 1), out.stderr  # read: allowed (PENDING is exit 1)
        assert "run r" in out.stdout or "r" in out.stdout
        out = verifier_cli("run", "register", "x", "--policy", str(tmp_path / "p.toml"), *base,
                           f"--token={token}")  # fmt: skip
        assert out.returncode == 10 and "needs the role operator" in out.stderr, out.stderr
        out = verifier_cli("status", "r", *base, "--token", "forged")
        assert out.returncode == 10 and "unknown token" in out.stderr, out.stderr
        out = verifier_cli("status", "r", *base)  # TLS, no credentials at all
        assert out.returncode == 10, out.stderr
    finally:
        serve.stop()


def test_insecure_mode_is_local_only_unless_named_and_warns_every_time(tmp_path: Path) -> None:
    out = verifier_cli("serve", "--listen", f"0.0.0.0:{free_port()}", "--db",
                       str(tmp_path / "db.sqlite3"))  # fmt: skip
    assert out.returncode == 3 and "refusing to serve" in out.stderr, out.stderr
    sock = tmp_path / "v.sock"
    serve = Daemon(["serve", "--listen", f"unix:{sock}", "--db", str(tmp_path / "db2.sqlite3")],
                   tmp_path / "serve.log").start()  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.1)
        assert "INSECURE mode: serving" in (tmp_path / "serve.log").read_text()
        out = verifier_cli("run", "list", "--verifier", f"unix:{sock}")
        assert out.returncode == 0 and "INSECURE mode: connecting" in out.stderr, out.stderr
    finally:
        serve.stop()
    out = verifier_cli("status", "r", "--verifier", "unix:/nonexistent", "--token", "t")
    assert out.returncode == 2 and "need --tls-ca" in out.stderr, out.stderr
