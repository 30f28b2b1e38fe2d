"""The agent's readiness means something: its health service ``verifier.agent.Delivery`` says
SERVING only while its last report was acknowledged by the verifier and showed a vLLM process,
and NOT_SERVING before that, while the verifier is unreachable, and when no process is visible;
the overall service ("") stays SERVING throughout (liveness: the agent runs). A Kubernetes
readinessProbe asks the first, a livenessProbe the second (deploy/k8s/production).

Real processes throughout: `verifier serve` and `verifier agent` as subprocesses over real gRPC
(Unix sockets), the probed fake worker of tests/test_faults.py as the target, the verifier
killed with SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import READY_SERVICE, Agent
from servewitness.model import Verdict
from servewitness.policy import TargetSnapshot, load_policy
from tests.test_faults import FakeWorker, agent, log_events, policy, serve, wait_until, worker

__all__ = ["worker"]  # the fixture, used by name

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def health(addr: str, service: str) -> int | None:
    """What the agent's health service at ADDR says of SERVICE (None: no answer)."""
    try:
        with grpc.insecure_channel(addr) as ch:
            check = health_pb2_grpc.HealthStub(ch).Check  # type: ignore[attr-defined]
            status: int = check(health_pb2.HealthCheckRequest(service=service), timeout=2).status
            return status
    except grpc.RpcError:
        return None


def says(addr: str, service: str, status: int) -> bool:
    return health(addr, service) == status


def test_ready_only_while_reports_are_acknowledged(worker: FakeWorker, tmp_path: Path) -> None:
    verifier = f"unix:{tmp_path}/v.sock"
    hz = f"unix:{tmp_path}/health.sock"
    log = tmp_path / "agent.log"
    a = agent(tmp_path, verifier, worker.pid, "agent.log", "--health", hz)
    server = None
    try:
        # nothing listens where the verifier should be: alive, not ready
        wait_until("the agent to fail a delivery", lambda: bool(
            log_events(log, "verifier_unreachable")), 30, log)  # fmt: skip
        assert health(hz, "") == SERVING
        assert health(hz, READY_SERVICE) == NOT_SERVING
        # the verifier comes up: the spooled reports are acknowledged, and the agent is ready
        server = serve(tmp_path, str(tmp_path / "db.sqlite3"), verifier)
        wait_until("readiness", lambda: says(hz, READY_SERVICE, SERVING), 30, log)
        assert log_events(log, "ready")
        # the verifier dies: not ready again, still alive
        server.stop(signal.SIGKILL)
        server = None
        wait_until("unreadiness", lambda: says(hz, READY_SERVICE, NOT_SERVING), 30, log)
        assert health(hz, "") == SERVING
        (last,) = log_events(log, "not_ready")[-1:]
        assert "UNAVAILABLE" in last["reason"], last
    finally:
        a.stop()
        if server is not None:
            server.stop(signal.SIGKILL)


def test_not_ready_when_no_process_is_visible(tmp_path: Path) -> None:
    """Negative control: the verifier acknowledges every report, but the process the agent
    was pointed at is gone: reports arrive and say so, and the agent is not ready."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    verifier = f"unix:{tmp_path}/v.sock"
    hz = f"unix:{tmp_path}/health.sock"
    log = tmp_path / "agent.log"
    server = serve(tmp_path, str(tmp_path / "db.sqlite3"), verifier)
    a = agent(tmp_path, verifier, gone.pid, "agent.log", "--health", hz)
    try:
        wait_until("an acknowledged report", lambda: bool(
            list((tmp_path / "spool").glob("seq"))) and not list(
            (tmp_path / "spool").glob("*.pb")) and health(hz, "") == SERVING, 30, log)  # fmt: skip
        assert health(hz, READY_SERVICE) == NOT_SERVING
    finally:
        a.stop()
        server.stop(signal.SIGKILL)


def test_a_served_process_that_exits_is_said_to_have_exited_until_one_is_back(
    worker: FakeWorker, tmp_path: Path
) -> None:
    """The agent stays when vLLM exits (compose's pidns, a pod's pause container): its reports
    then carry no process, and say that the ones it reported before exited (not that it is in
    the wrong PID namespace) for as long as none is back; the target is PENDING, never PASS."""
    a = Agent(AgentConfig("unix:/nonexistent", "t", "a", tmp_path / "spool", root_pid=worker.pid,
                          docker_socket=None))  # fmt: skip
    try:
        first = a.collect()
        assert [p.key.pid for p in first.processes] == [worker.pid]
        assert first.unobservable == ()
        worker.proc.kill()
        worker.proc.wait(timeout=30)
        for _ in range(2):  # the first report after the exit, and the next
            report = a.collect()
            assert report.processes == ()
            (why,) = report.unobservable
            assert f"(pid {worker.pid}) exited; vLLM stopped or is restarting" in why, why
        assert report.gone == () and first.gone == ()
        v = load_policy(policy()).evaluate_target(
            TargetSnapshot("t", report.processes, time.time(), unobservable=report.unobservable),
            now=time.time(),
        )
        assert v.verdict == Verdict.PENDING, v
        assert "evidence.unobservable" in {f.id for f in v.findings}
    finally:
        a.channel.close()
