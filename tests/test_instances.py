"""Per-pod targets: the replicas of one Deployment report as instances ``vllm/<pod>`` of one
family (the agent's ``--instance``), a policy's ``[targets] replicas_of`` covers every instance
and ``min_targets`` counts them, and one credential for the family speaks for all of them (the
replicas share one Secret); a credential for one instance speaks for that one only.

The end-to-end test runs a real verifier over mutual TLS and real agents with certificates from
`verifier certs`, watching the probed fake worker of tests/test_faults.py."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from servewitness import instances
from servewitness.model import ProcessReport
from servewitness.policy import PolicyError, TargetSnapshot, load_policy
from servewitness.testing.vllm_server import free_port
from tests.helpers import verifier_cli
from tests.test_faults import FakeWorker, policy, worker
from tests.test_gate_e2e import Daemon
from tests.test_policy_engine import worker as engine_worker
from tests.test_security import client

__all__ = ["worker"]  # the fixture, used by name


# --- names ------------------------------------------------------------------------------------


def test_a_family_credential_covers_its_instances_and_nothing_else() -> None:
    assert instances.covered({"vllm"}, "vllm") and instances.covered({"vllm"}, "vllm/pod-a")
    # a name whose part after the first / is no instance name is a plain name, as it was
    assert not instances.covered({"vllm"}, "vllm/pod-a/x")
    assert not instances.is_instance("</script>") and instances.family("a/<b>") == "a/<b>"
    for other in ("vllmx/pod-a", "vllm-evil", "vll/m", "/vllm", "other/vllm"):
        assert not instances.covered({"vllm"}, other), other
    # a credential for one instance: that instance only, not its family nor a sibling
    assert instances.covered({"vllm/pod-a"}, "vllm/pod-a")
    assert not instances.covered({"vllm/pod-a"}, "vllm/pod-b")
    assert not instances.covered({"vllm/pod-a"}, "vllm")
    assert instances.family("vllm/pod-a") == "vllm" and instances.family("vllm") == "vllm"


@pytest.mark.parametrize(
    "target,name",
    [("vllm/a", "b"), ("vllm", ""), ("vllm", "-a"), ("vllm", "a/b"), ("vllm", "a" * 254),
     ("vllm", "pod a"), ("vllm", "a\n")],
)  # fmt: skip
def test_instance_names_are_pod_names_or_container_ids(target: str, name: str) -> None:
    with pytest.raises(ValueError):
        instances.instance_of(target, name)


def test_an_instance_name_from_the_downward_api_is_accepted() -> None:
    assert instances.instance_of("vllm", "vllm-7d9c5b8f6-x2x9q") == "vllm/vllm-7d9c5b8f6-x2x9q"
    assert instances.instance_of("vllm", "a" * 253) == "vllm/" + "a" * 253


def test_the_agent_refuses_a_bad_instance_name() -> None:
    out = verifier_cli("agent", "--verifier", "unix:/nonexistent", "--target", "vllm",
                       "--instance", "pod a", "--no-docker")  # fmt: skip
    assert out.returncode == 2 and "--instance" in out.stderr, out.stderr
    out = verifier_cli("agent", "--verifier", "unix:/nonexistent", "--target", "vllm/a",
                       "--instance", "b", "--no-docker")  # fmt: skip
    assert out.returncode == 2 and "already names an instance" in out.stderr, out.stderr


# --- policies ---------------------------------------------------------------------------------

REPLICAS = policy().replace(
    "[evidence]", '[targets]\nreplicas_of = ["vllm"]\nmin_targets = 2\n[evidence]'
)


def test_replicas_of_selects_every_instance_of_the_family_and_nothing_else() -> None:
    p = load_policy(REPLICAS)
    assert p.selection.replicas_of == ("vllm",) and p.selection.min_targets == 2
    for selected in ("vllm/pod-a", "vllm/b"):
        assert p.selects(selected, ())
    for other in ("vllm", "vllmx/a", "other/pod-a", "other"):
        assert not p.selects(other, ()), other
    both = load_policy(REPLICAS.replace('replicas_of = ["vllm"]',
                                        'names = ["solo"]\nreplicas_of = ["vllm"]'))  # fmt: skip
    assert both.selects("solo", ()) and both.selects("vllm/a", ()) and not both.selects("vllm", ())


def test_instances_count_only_where_the_policy_asks_for_them() -> None:
    """A policy without [targets] covers every target that reports, but not instances: a
    credential for one family could otherwise report vllm/1, vllm/2, ... and meet
    min_targets on its own, where before it could report one target."""
    p = load_policy(policy())
    assert p.selects("vllm", ()) and p.selects("other", ())
    assert not p.selects("vllm/1", ()) and not p.selects("vllm/2", ())
    named = load_policy(
        policy().replace("[evidence]", '[targets]\nnames = ["a", "b"]\nmin_targets = 2\n[evidence]')
    )
    assert not named.selects("a/1", ()) and not named.selects("a/2", ())


@pytest.mark.parametrize(
    "targets,error",
    [('replicas_of = ["vllm/a"]', "without '/'"), ("replicas_of = []", "must not be empty"),
     ('replicas_of = [" "]', "must not be empty"),
     ('names = ["a"]\nmin_targets = 2', "names lists only 1"),
     ('replicas_of = ["vllm"]\n[targets.containers]\nother = "vllm"', "do not list")],
)  # fmt: skip
def test_bad_replicas_of_is_refused_with_the_key(targets: str, error: str) -> None:
    with pytest.raises(PolicyError, match="targets") as e:
        load_policy(policy().replace("[evidence]", f"[targets]\n{targets}\n[evidence]"))
    assert error in str(e.value), str(e.value)


def _proc(container: str) -> ProcessReport:
    return replace(engine_worker(), container_id=container)


def test_a_familys_container_binding_holds_each_instance() -> None:
    """[targets.containers] vllm = ... binds every vllm/<pod>: an instance whose processes run
    in another container FAILs on the binding (a name binding without a Docker API: PENDING)."""
    bound = load_policy(REPLICAS.replace(
        "[evidence]", '[targets.containers]\nvllm = "aaaaaaaaaaaa"\n[evidence]', 1))  # fmt: skip
    here = TargetSnapshot("vllm/pod-a", (_proc("a" * 64),), time.time())
    there = TargetSnapshot("vllm/pod-b", (_proc("b" * 64),), time.time())
    ids = {t: {f.id for f in bound.evaluate_target(s, s.received_unix).findings}
           for t, s in (("a", here), ("b", there))}  # fmt: skip
    assert "evidence.container_mismatch" in ids["b"], ids
    assert "evidence.container_mismatch" not in ids["a"], ids


# --- end to end: a real verifier over mutual TLS, real agents ---------------------------------


def pki(tmp: Path) -> Path:
    d = tmp / "pki"
    for args in (["certs", "init", "--dir", str(d)],
                 ["certs", "issue", "verifier", "--dir", str(d), "--ip", "127.0.0.1"],
                 ["certs", "issue", "agent-vllm", "--dir", str(d), "--target", "vllm"],
                 ["certs", "issue", "agent-pod", "--dir", str(d), "--target", "vllm/pod-a"],
                 ["certs", "issue", "ops", "--dir", str(d), "--role", "operator"]):  # fmt: skip
        out = verifier_cli(*args)
        assert out.returncode == 0, (args, out.stderr)
    return d


def run_agent(d: Path, addr: str, tmp: Path, who: tuple[str, str, str], pid: int) -> Daemon:
    """An agent with certificate CERT reporting as TARGET --instance INSTANCE (WHO)."""
    cert, target, instance = who
    return Daemon(
        ["-v", "agent", "--verifier", addr, "--target", target, "--instance", instance,
         "--agent-id", cert, "--pid", str(pid), "--interval", "0.2", "--no-docker",
         "--spool", str(tmp / f"spool-{cert}-{instance}"), "--tls-ca", str(d / "ca.pem"),
         "--tls-cert", str(d / f"{cert}.pem"), "--tls-key", str(d / f"{cert}.key")],
        tmp / f"agent-{cert}-{instance}.log",
    ).start()  # fmt: skip


def status(d: Path, addr: str) -> dict[str, Any]:
    out = verifier_cli(*client(d, "ops", "status", "r", "--json", addr=addr))
    assert out.returncode in (0, 1), out.stderr
    run: dict[str, Any] = json.loads(out.stdout)["runs"][0]
    return run


def until(what: str, timeout_s: float, probe: Any) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_two_replicas_report_as_two_instances_and_the_run_needs_both(
    worker: FakeWorker, tmp_path: Path
) -> None:
    d = pki(tmp_path)
    addr = f"127.0.0.1:{free_port()}"
    (tmp_path / "p.toml").write_text(REPLICAS)
    serve = Daemon(
        ["serve", "--listen", addr, "--db", str(tmp_path / "db.sqlite3"), "--report-interval",
         "0.2", "--run", f"r={tmp_path / 'p.toml'}", "--tls-cert", str(d / "verifier.pem"),
         "--tls-key", str(d / "verifier.key"), "--tls-client-ca", str(d / "ca.pem")],
        tmp_path / "serve.log",
    ).start()  # fmt: skip
    agents: list[Daemon] = []
    try:
        until("the verifier", 30, lambda: "listening" in (tmp_path / "serve.log").read_text())
        # one replica: PENDING, one of the two instances the run needs
        agents.append(run_agent(d, addr, tmp_path, ("agent-vllm", "vllm", "pod-a"), worker.pid))
        st = until("pod-a's evidence", 60, lambda: (s := status(d, addr))["targets"] and s)
        assert [t["target"] for t in st["targets"]] == ["vllm/pod-a"]
        assert st["verdict"] == "PENDING", st
        (short,) = [f for f in st["findings"] if f["id"] == "evidence.no_report"]
        assert "fewer than the 2 it needs" in short["message"], short
        # the second replica, same credential (one Secret for the Deployment): both judged
        agents.append(run_agent(d, addr, tmp_path, ("agent-vllm", "vllm", "pod-b"), worker.pid))
        st = until("a PASS on both instances", 60,
                   lambda: (s := status(d, addr))["verdict"] == "PASS" and s)  # fmt: skip
        assert sorted(t["target"] for t in st["targets"]) == ["vllm/pod-a", "vllm/pod-b"]
        assert all(t["verdict"] == "PASS" for t in st["targets"])
        # a credential for one instance may not speak for another, nor for another family
        for who in (("agent-pod", "vllm", "pod-b"), ("agent-vllm", "vllmx", "pod-a")):
            agents.append(run_agent(d, addr, tmp_path, who, worker.pid))
        logs = [tmp_path / "agent-agent-pod-pod-b.log", tmp_path / "agent-agent-vllm-pod-a.log"]
        until("both refusals", 60, lambda: all(
            "may not report for target(s)" in p.read_text() for p in logs))  # fmt: skip
        assert "vllm/pod-b" in logs[0].read_text() and "vllmx/pod-a" in logs[1].read_text()
        # ... while the one it names is accepted, as agent agent-pod/pod-a
        agents.append(run_agent(d, addr, tmp_path, ("agent-pod", "vllm", "pod-a"), worker.pid))
        until("agent-pod/pod-a's report", 60, lambda: any(
            t["agent_id"] == "agent-pod/pod-a" for t in targets(d, addr)))  # fmt: skip
        assert {t["target"] for t in targets(d, addr)} == {"vllm/pod-a", "vllm/pod-b"}
    finally:
        for a in agents:
            if a.proc is not None:
                a.stop()
        serve.stop()


def targets(d: Path, addr: str) -> list[dict[str, Any]]:
    out = verifier_cli(*client(d, "ops", "target", "list", "--json", addr=addr))
    assert out.returncode == 0, out.stderr
    got: list[dict[str, Any]] = json.loads(out.stdout)["targets"]
    return got


# --- one agent, several serving containers in its PID namespace -------------------------------

CID_A, CID_B = "a1" * 32, "b2" * 32


def _vllm(root: Path, pid: int, cgroup: str) -> None:
    """One readable vLLM API server (no probe) as pid PID of the /proc at ROOT, in CGROUP."""
    if not (root / "stat").exists():
        root.mkdir(parents=True)
        (root / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
        (root / "self").mkdir()
        (root / "self" / "cgroup").write_text("0::/\n")
    d = root / str(pid)
    d.mkdir()
    rest = ["S", "1"] + ["0"] * 17 + [str(1000 + pid)] + ["0"] * 30
    (d / "stat").write_bytes(f"{pid} (python3) ".encode() + " ".join(rest).encode())
    (d / "status").write_text(f"Name:\tpython3\nNSpid:\t{pid}\n")
    (d / "cmdline").write_bytes(b"python3\0-m\0vllm.entrypoints.openai.api_server\0")
    (d / "environ").write_bytes(b"PATH=/usr/bin\0")
    (d / "maps").write_text("")
    (d / "cgroup").write_text(cgroup)
    (d / "exe").symlink_to("/usr/bin/python3.11")


def _agent(proc: Path, tmp: Path, per_container: bool) -> Any:
    from servewitness.agent.config import AgentConfig
    from servewitness.agent.runner import Agent

    return Agent(AgentConfig("unix:/nonexistent", "vllm", "agent-vllm", tmp / "spool",
                             proc_root=str(proc), docker_socket=None,
                             per_container=per_container))  # fmt: skip


def test_one_agent_reports_each_serving_container_as_its_own_instance(tmp_path: Path) -> None:
    """Two serving containers and a server on the host in one PID namespace (a compose
    service scaled to two under one holder): with --instance-per-container each container is
    the instance vllm/<12-hex id>, judged on its own processes; the host's stays target vllm,
    which replicas_of does not select. Without it the three are one target, mixed."""
    proc = tmp_path / "proc"
    _vllm(proc, 100, f"12:pids:/docker/{CID_A}\n")
    _vllm(proc, 200, f"12:pids:/docker/{CID_B}\n")
    _vllm(proc, 300, "0::/\n")
    agent = _agent(proc, tmp_path, per_container=True)
    try:
        reports = agent.collect_all()
        got = {r.target: [p.key.pid for p in r.processes] for r in reports}
        assert got == {"vllm": [300], f"vllm/{CID_A[:12]}": [100], f"vllm/{CID_B[:12]}": [200]}
        assert all(not r.mixed_roots for r in reports)
        assert len({r.seq for r in reports}) == 3  # one agent, one sequence
        p = load_policy(REPLICAS)
        assert sorted(r.target for r in reports if p.selects(r.target, ())) == [
            f"vllm/{CID_A[:12]}", f"vllm/{CID_B[:12]}"]  # fmt: skip
        # container B's server exits: its instance is told so once, then no longer reported
        shutil.rmtree(proc / "200")
        after = {r.target: r for r in agent.collect_all()}
        gone = after[f"vllm/{CID_B[:12]}"]
        assert gone.processes == () and [k.pid for k in gone.gone] == [200]
        assert "pid 200 exited" in gone.unobservable[0], gone.unobservable
        assert sorted(r.target for r in agent.collect_all()) == ["vllm", f"vllm/{CID_A[:12]}"]
    finally:
        agent.channel.close()
    plain = _agent(proc, tmp_path / "plain", per_container=False)
    try:
        _vllm(proc, 200, f"12:pids:/docker/{CID_B}\n")
        (one,) = plain.collect_all()
        assert one.target == "vllm" and sorted(p.key.pid for p in one.processes) == [100, 200, 300]
        assert len(one.mixed_roots) == 3  # three servers under one name: never PASS
    finally:
        plain.channel.close()


def test_instance_and_instance_per_container_are_one_or_the_other() -> None:
    both = ("--instance", "pod-a", "--instance-per-container")
    out = verifier_cli("agent", "--verifier", "unix:/x", "--target", "vllm", *both, "--no-docker")
    assert out.returncode == 2 and "one or the other" in out.stderr, out.stderr
