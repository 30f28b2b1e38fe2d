"""The verifier over real gRPC (a unix socket in tmp_path), fed by hand-made and real agents.

Hostile or broken input gets a gRPC status with a reason and is never stored; nothing here can
produce a PASS without evidence.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from servewitness import wire
from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.client.api import VerifierClient
from servewitness.errors import ConfigError, UnavailableError, UsageError
from servewitness.model import (
    FileEntry,
    ProcessKey,
    ProcessReport,
    TargetReport,
    Verdict,
    manifest_digest,
)
from servewitness.server.app import ServeConfig, VerifierServer
from tests.helpers import Backend, agent_stub, not_vllm_policy, probe_env

SHA = "ab" * 32
POLICY = not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\nrole = "worker"\n')


@pytest.fixture
def served(backend: Backend, tmp_path: Path) -> Iterator[tuple[VerifierServer, str]]:
    """A real verifier over real gRPC, on SQLite and on PostgreSQL (the same tests)."""
    addr = f"unix:{tmp_path}/v.sock"
    server = VerifierServer(ServeConfig(addr, backend.target, report_interval_s=0.2))
    server.start()
    try:
        yield server, addr
    finally:
        server.stop()


@pytest.fixture
def stub(served: tuple[VerifierServer, str]) -> Iterator[pb_grpc.VerifierServiceStub]:
    with grpc.insecure_channel(served[1], options=list(wire.GRPC_OPTIONS)) as ch:
        yield agent_stub(ch)


def process(files: tuple[FileEntry, ...] | None, digest: str | None = None) -> ProcessReport:
    entries = files or ()
    return ProcessReport(
        key=ProcessKey("boot", 10, 20), ns_pid=10, ppid=1, start_time=1.0, role="worker",
        rank=0, container_id=None, cmdline=("python",), exe="/usr/bin/python3",
        probe_present=True,
        manifest_digest=digest or manifest_digest(entries),
        files=files,
    )  # fmt: skip


def report(nonce: str, seq: int = 1, proc: ProcessReport | None = None) -> pb.ReportRequest:
    files = (FileEntry("/a.py", SHA, 3, "source", "a", "load"),)
    rep = TargetReport("agent-1", "t", seq, nonce, time.time(), (proc or process(files),))
    return pb.ReportRequest(report=wire.report_to_pb(rep))


def hello(stub: pb_grpc.VerifierServiceStub) -> str:
    return str(stub.Hello(pb.HelloRequest(agent_id="agent-1", targets=["t"])).nonce)


def code_of(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        call()  # type: ignore[operator]
    return e.value.code(), e.value.details() or ""


def test_health_service_says_serving(served: tuple[VerifierServer, str]) -> None:
    with grpc.insecure_channel(served[1]) as ch:
        check = health_pb2_grpc.HealthStub(ch).Check  # type: ignore[attr-defined]  # stub lacks it
        resp = check(health_pb2.HealthCheckRequest(service=""))
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_report_without_hello_or_with_a_wrong_nonce_is_refused(
    stub: pb_grpc.VerifierServiceStub,
) -> None:
    assert code_of(lambda: stub.Report(report("guess")))[0] == grpc.StatusCode.FAILED_PRECONDITION
    hello(stub)
    code, why = code_of(lambda: stub.Report(report("0" * 32)))
    assert (code, "nonce mismatch" in why) == (grpc.StatusCode.FAILED_PRECONDITION, True)


def test_malformed_report_is_rejected_with_the_field_named(
    stub: pb_grpc.VerifierServiceStub,
) -> None:
    nonce = hello(stub)
    req = report(nonce)
    req.report.target = ""
    md = wire.agent_metadata("agent-1", ["t"])  # authorized for t; the body names none
    code, why = code_of(lambda: stub.Report(req, metadata=md))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "target" in why


def test_manifest_whose_digest_does_not_match_its_files_is_rejected(
    stub: pb_grpc.VerifierServiceStub,
) -> None:
    nonce = hello(stub)
    files = (FileEntry("/a.py", SHA, 3, "source", "a", "load"),)
    forged = process(files, digest="sha256:" + "1" * 64)
    code, why = code_of(lambda: stub.Report(report(nonce, proc=forged)))
    assert (code, "does not match its files" in why) == (grpc.StatusCode.INVALID_ARGUMENT, True)


def test_oversized_message_is_refused_by_the_transport(stub: pb_grpc.VerifierServiceStub) -> None:
    nonce = hello(stub)
    req = report(nonce)
    req.report.processes[0].cmdline.append("x" * (wire.MAX_MESSAGE_BYTES + 1))
    assert code_of(lambda: stub.Report(req))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_each_sequence_number_is_stored_once(
    served: tuple[VerifierServer, str], stub: pb_grpc.VerifierServiceStub
) -> None:
    nonce = hello(stub)
    first = stub.Report(report(nonce, seq=1))
    again = stub.Report(report(first.nonce, seq=1))
    assert (first.accepted, again.accepted) == (True, True)
    assert served[0].store.count_reports() == 1


def test_digest_only_manifest_the_verifier_lacks_is_asked_for(
    stub: pb_grpc.VerifierServiceStub,
) -> None:
    nonce = hello(stub)
    unknown = process(None, digest="sha256:" + "2" * 64)
    resp = stub.Report(report(nonce, proc=unknown))
    assert (resp.accepted, list(resp.need_manifests)) == (False, ["sha256:" + "2" * 64])


def test_run_with_no_report_is_pending_never_pass(served: tuple[VerifierServer, str]) -> None:
    with VerifierClient(served[1]) as client:
        client.register_run("r", POLICY, "p.toml")
        verdict = client.status("r")
    assert verdict.verdict == Verdict.PENDING
    # the policy accepts an unpinned serving package (these fake processes carry no vLLM),
    # and says so (policy.unsafe); nothing else
    assert [f.id for f in verdict.findings] == ["evidence.no_report", "policy.unsafe"]


def test_unknown_run_and_bad_policy_are_usage_and_config_errors(
    served: tuple[VerifierServer, str],
) -> None:
    with VerifierClient(served[1]) as client:
        with pytest.raises(UsageError, match="no run named 'nope'"):
            client.status("nope")
        with pytest.raises(Exception, match=r"p\.toml:2: .*colour"):
            client.register_run(
                "bad", POLICY.replace("[[hooks]]", "colour = 1\n[[hooks]]"), "p.toml"
            )
        # A policy error through the API is exit 3 too, whatever the loader's message says
        # (this one does not contain the word "policy"; it used to come back as exit 2).
        with pytest.raises(ConfigError, match=r"empty\.toml: version: required key is missing"):
            client.register_run("empty", "", "empty.toml")
        with pytest.raises(UsageError, match=r"invalid get_run_status\.name: required"):
            client.status("")


def test_unreachable_verifier_is_unavailable(tmp_path: Path) -> None:
    with (
        VerifierClient(f"unix:{tmp_path}/none.sock", timeout_s=1) as client,
        pytest.raises(UnavailableError, match="unreachable"),
    ):
        client.status("r")


def test_agent_spools_while_the_verifier_is_away_then_delivers_each_report_once(
    tmp_path: Path,
) -> None:
    code = (
        "import servewitness_probe as p, sys; p.start(); print('up', flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=probe_env(tmp_path / "probe"),
    )  # fmt: skip
    assert child.stdout is not None and child.stdout.readline().strip() == "up"
    addr = f"unix:{tmp_path}/v.sock"
    agent = Agent(
        AgentConfig(addr, "t", "agent-x", tmp_path / "spool", interval_s=0.1, root_pid=child.pid)
    )
    try:
        for _ in range(3):
            with pytest.raises(grpc.RpcError):
                agent.step()
        assert len(agent.spool) == 3
        server = VerifierServer(ServeConfig(addr, tmp_path / "db.sqlite3"))
        server.start()
        try:
            agent.nonce = None
            deadline = time.monotonic() + 20
            while len(agent.spool):  # the channel retries on its own reconnect backoff
                assert time.monotonic() < deadline
                try:
                    agent.drain()
                except grpc.RpcError:
                    time.sleep(0.2)
            assert server.store.count_reports() == 3
            agent.step()
            assert server.store.count_reports() == 4
            assert server.store.last_seq("agent-x") == 4
            child.communicate(timeout=10)  # the target process exits
            agent.step()
            (latest,) = server.store.latest_reports()
            gone = wire.report_from_bytes(latest.report).gone
            assert [k.pid for k in gone] == [child.pid]
        finally:
            server.stop()
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
        agent.channel.close()


def test_status_json_never_calls_a_target_without_processes_pass(
    served: tuple[VerifierServer, str], stub: pb_grpc.VerifierServiceStub
) -> None:
    nonce = hello(stub)
    empty = TargetReport("agent-1", "t", 1, nonce, time.time(), ())
    assert stub.Report(pb.ReportRequest(report=wire.report_to_pb(empty))).accepted
    with VerifierClient(served[1]) as client:
        client.register_run("r2", POLICY, "p.toml")
        verdict = client.status("r2")
    assert verdict.verdict == Verdict.PENDING


def test_agent_restarted_with_a_fresh_spool_is_not_mistaken_for_duplicates(
    served: tuple[VerifierServer, str], tmp_path: Path
) -> None:
    server, addr = served

    def agent(spool: str) -> Agent:
        return Agent(
            AgentConfig(addr, "t", "same-id", tmp_path / spool, interval_s=0.1, root_pid=1)
        )

    first = agent("spool-a")
    for _ in range(3):
        first.step()
    first.channel.close()
    assert server.store.last_seq("same-id") == 3
    second = agent("spool-b")  # same agent id, its spool lost
    second.step()
    second.step()
    second.channel.close()
    assert server.store.count_reports() == 5
    assert server.store.last_seq("same-id") == 5


def test_runner_file_changed_after_load_is_a_disagreement_between_probe_and_agent(
    tmp_path: Path,
) -> None:
    from servewitness.policy import TargetSnapshot, load_policy

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "fakerunner.py").write_text(
        "class Runner:\n    def execute_model(self, so):\n        pass\n"
    )
    code = (
        "import sys, fakerunner, servewitness_probe as p\n"
        "from servewitness_probe import _vllm\n"
        "p.start()\n"
        "class Worker:\n    model_runner = fakerunner.Runner()\n"
        "_vllm.record_runner(Worker())\n"
        "print('up', flush=True); sys.stdin.read()\n"
    )
    env = probe_env(tmp_path / "probe", PYTHONPATH=str(mods))
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        agent = Agent(
            AgentConfig("unix:/nonexistent", "t", "a", tmp_path / "spool", root_pid=child.pid)
        )
        first = agent.collect()
        (before,) = first.processes
        # dated from when reading began, which precedes the send
        assert first.collected_unix is not None and first.collected_unix <= first.sent_unix
        (mods / "fakerunner.py").write_text(
            "class Runner:\n    def execute_model(self, so):\n        1/0\n"
        )
        (after,) = agent.collect().processes
        agent.channel.close()
    finally:
        child.communicate(timeout=10)
    assert before.runner is not None and before.runner.cls == "fakerunner.Runner"
    assert before.runner_file_sha256_now == before.runner.sha256
    assert after.runner is not None and after.runner_file_sha256_now != after.runner.sha256
    pol = load_policy(not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\n'))
    verdict = pol.evaluate_target(TargetSnapshot("t", (after,), time.time()), time.time())
    assert "evidence.disagreement" in [f.id for f in verdict.findings]
    assert verdict.verdict == Verdict.FAIL


def test_tampered_probe_record_and_a_vanished_file_are_disagreements(tmp_path: Path) -> None:
    """The probe's own record is never the only evidence: the agent re-hashes every file."""
    from servewitness.policy import TargetSnapshot, load_policy

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "honest.py").write_text("X = 1\n")
    (mods / "doomed.py").write_text("Y = 2\n")
    code = (
        "import sys, servewitness_probe as p\n"
        "p.start()\n"
        "import honest, doomed\n"
        "print('up', flush=True); sys.stdin.read()\n"
    )
    env = probe_env(tmp_path / "probe", PYTHONPATH=str(mods), PYTHONDONTWRITEBYTECODE="1")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        agent = Agent(
            AgentConfig(
                "unix:/nonexistent", "t", "a", tmp_path / "spool", root_pid=child.pid, recheck_s=0
            )
        )
        (clean,) = agent.collect().processes
        (journal,) = (tmp_path / "probe").glob("*/journal.jsonl")
        forged = "0" * 64
        honest_sha = hashlib.sha256(b"X = 1\n").hexdigest()
        journal.write_text(journal.read_text().replace(honest_sha, forged))  # tamper the record
        (mods / "doomed.py").unlink()  # a loaded file that vanished from the process's view
        (tampered,) = agent.collect().processes
        agent.channel.close()
    finally:
        child.communicate(timeout=10)
    assert clean.disagreements == ()
    found = {
        Path(d.path).name: (d.sha256_in_process, d.sha256_agent, d.reason)
        for d in tampered.disagreements
    }
    # The record still names the identity of the file it hashed (unchanged since): the hash,
    # not the file, is what changed.
    unchanged = (
        "other bytes than the probe recorded, in the very file it hashed (the same device, "
        "inode, size, mtime and ctime as it recorded with its hash)"
    )
    assert found == {
        "honest.py": (forged, honest_sha, unchanged),
        "doomed.py": (hashlib.sha256(b"Y = 2\n").hexdigest(), None, "missing"),
    }
    pol = load_policy(not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\n'))
    verdict = pol.evaluate_target(TargetSnapshot("t", (tampered,), time.time()), time.time())
    assert verdict.verdict == Verdict.FAIL
    (f,) = [f for f in verdict.findings if f.id == "evidence.disagreement"]
    assert f.context["count"] == 2
