"""A port the verifier or an agent listens on is its own: a second process binding it fails,
with a configuration error, instead of sharing it.

gRPC sets ``SO_REUSEPORT`` on the sockets it listens on unless told otherwise, and Linux then
lets any later socket of the same user that sets it too bind the same port, splitting new
connections between the two at random. A second ``verifier serve`` started on the port of the
first (another database, an old build, a test left running) took half of the agents' reports
into its own store without a word, and a second agent's health port answered the probes meant
for the first. Real processes: ``verifier serve`` and ``verifier agent`` subprocesses, and the
attacks the option exists for (a gRPC server asking for the port, a raw socket setting
``SO_REUSEPORT`` itself), with the control that shows the sharing is real without the option.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers import VENV_BIN

CLI = [str(VENV_BIN / "verifier")] if (VENV_BIN / "verifier").exists() else [
    sys.executable, "-m", "servewitness"]  # fmt: skip
CONFIG_EXIT = 3  # errors.ExitCode.CONFIG


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int, avoid: int = 0) -> int:
    """The first of N consecutive ports free now (and none of them AVOID): `serve --processes`
    serves process I's metrics on the --metrics-listen port plus I, and tests run side by side
    (a free first port alone let another test's port be the second)."""
    while True:
        first = free_port()
        if avoid in range(first, first + n) or first + n > 65535:
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + n):
                    s = held.enter_context(contextlib.closing(socket.socket()))
                    s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return first


def serving(addr: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60  # only so that a hung test fails
    while True:
        try:
            with grpc.insecure_channel(addr) as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                stub.Check(health_pb2.HealthCheckRequest(), timeout=1)  # type: ignore[attr-defined]
            return
        except grpc.RpcError:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{addr} never served:\n{log.read_text()}")
            time.sleep(0.05)


@contextlib.contextmanager
def running(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as f:
        proc = subprocess.Popen([*CLI, *args], stdout=f, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def second(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, check=False)


def reuseport_socket_binds(port: int) -> bool:
    """Whether a plain socket that sets SO_REUSEPORT itself can bind 127.0.0.1:PORT."""
    with contextlib.closing(socket.socket()) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def grpc_server_binds(port: int) -> bool:
    """Whether a gRPC server with gRPC's defaults (SO_REUSEPORT on) gets 127.0.0.1:PORT."""
    server = grpc.server(futures.ThreadPoolExecutor(1))
    try:
        try:
            return server.add_insecure_port(f"127.0.0.1:{port}") == port
        except RuntimeError:
            return False
    finally:
        server.stop(None)


def test_control_without_the_option_two_grpc_servers_share_a_port() -> None:
    """The sharing the option prevents, shown real: gRPC's defaults let a second server bind."""
    first = grpc.server(futures.ThreadPoolExecutor(1))
    port = first.add_insecure_port("127.0.0.1:0")
    first.start()
    try:
        assert grpc_server_binds(port)
        assert reuseport_socket_binds(port)
    finally:
        first.stop(None)


def test_a_second_verifier_on_the_port_of_the_first_is_refused(tmp_path: Path) -> None:
    port, health = free_port(), free_port()
    addr = f"127.0.0.1:{port}"
    log = tmp_path / "first.log"
    first = ["serve", "--listen", addr, "--db", str(tmp_path / "a.sqlite3"),
             "--health-listen", f"127.0.0.1:{health}"]  # fmt: skip
    with running(first, log) as proc:
        serving(addr, proc, log)
        serving(f"127.0.0.1:{health}", proc, log)
        # the same port, another database: a configuration error, not half the fleet
        got = second(["serve", "--listen", addr, "--db", str(tmp_path / "b.sqlite3")])
        assert got.returncode == CONFIG_EXIT, got.stderr
        assert f"cannot listen on {addr}" in got.stderr
        # its own port, the first one's health port: refused too
        other = free_port()
        db = str(tmp_path / "c.sqlite3")
        got = second(["serve", "--listen", f"127.0.0.1:{other}", "--db", db,
                      "--health-listen", f"127.0.0.1:{health}"])  # fmt: skip
        assert got.returncode == CONFIG_EXIT, got.stderr
        assert f"--health-listen 127.0.0.1:{health}: cannot listen" in got.stderr
        # processes that ask for the port sharing themselves get neither port
        for p in (port, health):
            assert not grpc_server_binds(p)
            assert not reuseport_socket_binds(p)
        assert proc.poll() is None  # the first verifier serves on
        serving(addr, proc, log)


def test_a_second_agent_on_the_health_port_of_the_first_is_refused(tmp_path: Path) -> None:
    health = free_port()
    nobody = f"unix:{tmp_path}/nobody.sock"  # no verifier: the agent backs off and keeps going
    target = subprocess.Popen(["sleep", "600"])
    try:
        args = ["agent", "--verifier", nobody, "--target", "t", "--pid", str(target.pid),
                "--no-docker", "--health", f"127.0.0.1:{health}"]  # fmt: skip
        log = tmp_path / "agent.log"
        with running([*args, "--spool", str(tmp_path / "s1")], log) as proc:
            serving(f"127.0.0.1:{health}", proc, log)
            got = second([*args, "--spool", str(tmp_path / "s2"), "--agent-id", "other"])
            assert got.returncode == CONFIG_EXIT, got.stderr
            assert f"--health 127.0.0.1:{health}: cannot listen" in got.stderr
            assert not grpc_server_binds(health)
            assert proc.poll() is None
    finally:
        target.kill()
        target.wait()
