"""Real containers on a real Docker engine: the images this project builds, the compose stack
of deploy/compose.yaml (verifier, a probed vLLM on the CPU with the tiny model, the agent
sidecar in vLLM's PID namespace, which the holder pidns owns), and the negative controls that
make container evidence worth anything:

(a) an idle container of the same image, with another file bind-mounted where the serving one
    has the original, reported under the serving target: its evidence must not satisfy the run
    (healthy in every other respect, it FAILs on the container binding);
(b) a sidecar outside the serving PID namespace: unobservable, PENDING, never PASS;
(c) the serving container restarted: its sidecar stays and says the old processes exited,
    and the run waits for new evidence from the new processes (PENDING until they run steps
    again), which the same sidecar reports without being restarted.

The images come from scripts/images.sh (cached as `docker save` archives under .cache/images);
the Docker engine from scripts/docker-host.sh. Both are idempotent, so this module can run on a
fresh machine as part of `make test`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
from servewitness.client.window import seal_content
from servewitness.model import Verdict
from servewitness.policy import TargetSnapshot, load_policy
from tests.helpers import PRISTINE_VLLM_CPU, REPO, verifier_cli

# The first test pays for the images (a few minutes on a fresh machine) and a vLLM boot.
pytestmark = [pytest.mark.vllm, pytest.mark.docker, pytest.mark.timeout(1800)]

COMPOSE = REPO / "deploy" / "compose.yaml"
SAMPLER = "/opt/venv/lib/python3.11/site-packages/vllm/v1/sample/sampler.py"


def sh(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(args)} -> {out.returncode}\n{out.stdout}\n{out.stderr}")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def until(what: str, timeout: float, probe: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last: {last!r}")


@dataclass
class Stack:
    project: str
    verifier: str  # host address of the verifier's gRPC port
    vllm_url: str
    env: dict[str, str]
    tmp: Path
    tls: tuple[str, ...] = ()  # --tls-ca/--tls-cert/--tls-key of an operator of the stack's CA

    def compose(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = ["docker", "compose", "-p", self.project, "-f", str(COMPOSE), *args]
        out = subprocess.run(
            cmd, capture_output=True, text=True, env=self.env, timeout=600, check=False
        )
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
        return out

    def container(self, service: str) -> str:
        """SERVICE's container id, asked of Compose: v1 names it PROJECT_SERVICE_1, v2
        PROJECT-SERVICE-1. -a: a stopped one too (v1 lists it anyway, v2 only with -a)."""
        ids = self.compose("ps", "-a", "-q", service).stdout.split()
        assert len(ids) == 1, f"service {service} of {self.project}: containers {ids}"
        return ids[0]

    def name(self, service: str) -> str:
        """SERVICE's container name, as the Docker API gives it (without the leading "/")."""
        out = sh("docker", "inspect", "-f", "{{.Name}}", self.container(service))
        return out.stdout.strip().lstrip("/")

    def status(self, run: str) -> dict[str, Any]:
        out = verifier_cli("status", run, "--json", "--verifier", self.verifier, *self.tls)
        assert out.returncode in (0, 1), out.stderr
        return dict(json.loads(out.stdout)["runs"][0])


def complete(url: str, n: int = 2) -> None:
    for i in range(n):
        body = {"model": "/models/tiny-llama", "prompt": f"container {i}", "max_tokens": 5,
                "temperature": 0.0, "ignore_eos": True}  # fmt: skip
        req = urllib.request.Request(  # noqa: S310 - a local URL
            url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as r:  # noqa: S310 - a local URL
            assert r.status == 200


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:  # noqa: S310
            return bool(r.status == 200)
    except OSError:
        return False


def ids(status: dict[str, Any]) -> set[str]:
    return {f["id"] for t in status["targets"] for f in t["findings"] if f["severity"] != "info"}


def ns_pid(serving_container: str) -> int:
    """The pid, in its PID namespace, of SERVING_CONTAINER's main process (vLLM's API server):
    the last field of the NSpid line of its host pid's status."""
    host = sh("docker", "inspect", "-f", "{{.State.Pid}}", serving_container).stdout.strip()
    status = Path(f"/proc/{host}/status").read_text()
    (line,) = [x for x in status.splitlines() if x.startswith("NSpid:")]
    return int(line.split()[-1])


def worker_file(agent_container: str, serving_container: str, path: str) -> tuple[str | None, str]:
    """(sha256 of PATH as loaded by the worker, container id) through a sidecar's inspect of
    the serving container's process tree."""
    pid = str(ns_pid(serving_container))
    out = sh("docker", "exec", agent_container, "verifier", "inspect", "--pid", pid, "--tree",
             "--json", timeout=300)  # fmt: skip
    procs = json.loads(out.stdout)["processes"]
    (worker,) = [p for p in procs if p["role"] == "worker"]
    rep = worker["report"]
    shas = [f.get("sha256") for f in rep["files"] if f["path"] == path]
    return (shas[0] if shas else None), rep["container_id"]


PATCH_LINE = "\n# patched in the idle container only\n"


def start_idle(s: Stack) -> None:
    """Start (a)'s idle container: the serving image with sampler.py replaced by a patched
    copy (bind-mounted), on the stack's network, labelled for clean-up. Started with the
    stack (a boot takes most of a core for about a minute: two side by side take little more
    than one); the test waits for it to answer and gives it its sidecar."""
    original = sh("docker", "run", "--rm", "--entrypoint", "cat", "verifier-vllm:local",
                  SAMPLER).stdout  # fmt: skip
    patched = s.tmp / "sampler.py"
    patched.write_text(original + PATCH_LINE)
    sh("docker", "run", "-d", "--name", f"{s.project}-idle",
       "--label", f"verifier.test={s.project}", "--network", f"{s.project}_default",
       "--shm-size", "1g", "-v", f"{patched}:{SAMPLER}:ro",
       "-e", "VERIFIER_HOOKS=step=vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model",
       "verifier-vllm:local", "--model", "/models/tiny-llama", "--enforce-eager",
       "--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory-bytes", "64M",
       "--port", "8000")  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, docker_images: None) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("containers")
    vport, hport = free_port(), free_port()
    env = {**os.environ, "VERIFIER_PORT": str(vport), "VLLM_PUBLISH": f"127.0.0.1:{hport}"}
    s = Stack(f"vt{uuid.uuid4().hex[:8]}", f"127.0.0.1:{vport}", f"http://127.0.0.1:{hport}",
              env, tmp)  # fmt: skip
    try:
        s.compose("up", "-d")  # returns once vLLM's container started, before it is healthy
        start_idle(s)  # (a)'s idle container boots now, beside the stack's vLLM
        # The stack runs mutual TLS from its one-shot `certs` service: issue this test an
        # operator and the extra "blind" agent from the same CA (its key is in pki-ca only).
        pki = tmp / "pki"
        pki.mkdir()
        s.compose("run", "--rm", "-v", f"{pki}:/out", "--entrypoint", "sh", "certs", "-ec",
                  "verifier certs issue operator --dir /pki/ca --role operator --force; "
                  "verifier certs issue agent-blind --dir /pki/ca --target blind --force; "
                  "cp /pki/ca/ca.pem /pki/ca/operator.pem /pki/ca/operator.key "
                  "/pki/ca/agent-blind.pem /pki/ca/agent-blind.key /out/")  # fmt: skip
        s.tls = ("--tls-ca", str(pki / "ca.pem"), "--tls-cert", str(pki / "operator.pem"),
                 "--tls-key", str(pki / "operator.key"))  # fmt: skip
        until("vLLM in its container to answer /health", 600, lambda: healthy(s.vllm_url))
        yield s
    finally:
        extra = sh("docker", "ps", "-aq", "--filter", f"label=verifier.test={s.project}",
                   check=False).stdout.split()  # fmt: skip
        if extra:
            sh("docker", "rm", "-f", *extra, check=False)
        logs = s.compose("logs", "--no-color", "--tail", "200", check=False)
        (tmp / "compose.log").write_text(logs.stdout + logs.stderr)
        s.compose("down", "-v", "--remove-orphans", check=False)


def test_compose_stack_passes_the_gate_for_a_live_hook(stack: Stack) -> None:
    complete(stack.vllm_url)
    out = verifier_cli(
        "wait", "vllm", "--json", "--timeout", "180", "--verifier", stack.verifier, *stack.tls
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # The verdict the gate opened on, not a later status call: the agent re-hashes every
    # loaded file every few seconds, and on two busy cores a collect can take long enough
    # for the evidence to pass freshness_s (STALE) between the two calls, as it should.
    st = json.loads(out.stdout)
    assert st["verdict"] == "PASS"
    (hook,) = [h for t in st["targets"] for h in t["hooks"] if h["name"] == "step"]
    assert hook["fired_on_decode_steps"] == hook["decode_steps"] > 0
    # The evidence is the serving container's: its id, and the worker's bytes as it loaded them.
    serving = sh("docker", "inspect", "-f", "{{.Id}}", stack.container("vllm")).stdout.strip()
    sha, cid = worker_file(stack.container("agent"), stack.container("vllm"), SAMPLER)
    assert cid == serving
    disk = sh("docker", "exec", stack.container("vllm"), "sha256sum", SAMPLER).stdout.split()[0]
    assert sha == disk


def test_agent_names_containers_through_the_docker_api_and_says_when_it_cannot(
    stack: Stack, tmp_path: Path
) -> None:
    """An agent on the host (real /proc, real Docker socket) sees the serving container's
    processes: with the socket it names the container; without one it says why, and a policy
    binding by label is then PENDING, never PASS."""
    pid = int(sh("docker", "inspect", "-f", "{{.State.Pid}}", stack.container("vllm")).stdout)
    serving = sh("docker", "inspect", "-f", "{{.Id}}", stack.container("vllm")).stdout.strip()
    policy = load_policy((REPO / "deploy" / "policy.toml").read_text())
    for sock in ("/var/run/docker.sock", str(tmp_path / "no-docker.sock")):
        cfg = AgentConfig("unix:/nonexistent", "vllm", "t", tmp_path / "spool", root_pid=pid,
                          docker_socket=sock)  # fmt: skip
        agent = Agent(cfg)
        try:
            report = agent.collect()
        finally:
            agent.channel.close()
        (info,) = report.containers
        assert info.id == serving and {p.container_id for p in report.processes} == {serving}
        snap = TargetSnapshot("vllm", report.processes, time.time(), (serving,), 0.0,
                              report.containers, report.unobservable)  # fmt: skip
        found = {f.id for f in policy.evaluate_target(snap, time.time()).findings}
        if sock == "/var/run/docker.sock":
            assert info.name == stack.name("vllm") and info.docker_error is None
            assert info.label("com.docker.compose.service") == "vllm"
            assert info.image == "verifier-vllm:local" and (info.image_id or "").startswith("sha")
            assert "evidence.container_unknown" not in found
        else:
            assert info.name is None and "no-docker.sock" in (info.docker_error or "")
            assert "evidence.container_unknown" in found


def test_evidence_from_an_idle_container_does_not_satisfy_the_run(stack: Stack) -> None:
    """(a) Same image, another bind-mounted sampler.py, healthy and stepping: its sidecar
    reports under the serving target while the real sidecar is stopped. FAIL, on the binding
    (and on the patched file)."""
    patched = stack.tmp / "sampler.py"
    original = sh("docker", "exec", stack.container("vllm"), "cat", SAMPLER).stdout
    assert patched.read_text() == original + PATCH_LINE  # the serving container's bytes, patched
    idle, idle_agent = f"{stack.project}-idle", f"{stack.project}-idle-agent"
    label = f"verifier.test={stack.project}"
    network = f"{stack.project}_default"
    until(
        "the idle container's vLLM to answer",
        600,
        lambda: (
            sh(
                "docker",
                "exec",
                idle,
                "python3",
                "-c",
                "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health')",
                check=False,
            ).returncode
            == 0
        ),
    )
    sh(
        "docker",
        "exec",
        idle,
        "python3",
        "-c",
        (
            "import json, urllib.request\n"
            "for i in range(2):\n"
            "    urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:8000/v1/completions',"
            " data=json.dumps({'model': '/models/tiny-llama', 'prompt': 'idle', 'max_tokens': 5,"
            " 'ignore_eos': True}).encode(), headers={'Content-Type': 'application/json'}))\n"
        ),
    )
    sh("docker", "stop", stack.container("agent"))
    try:
        sh("docker", "run", "-d", "--name", idle_agent, "--label", label, "--network", network,
           f"--pid=container:{idle}", "--user", "root", "--cap-drop", "ALL",
           "--cap-add", "SYS_PTRACE",
           "-v", "/var/run/docker.sock:/var/run/docker.sock:ro",
           "-v", f"{stack.project}_tls-agent:/tls:ro", "verifier:local", "agent",
           "--verifier", "verifier:50551", "--target", "vllm", "--interval", "1",
           "--agent-id", "agent-vllm", "--tls-ca", "/tls/ca.pem",
           "--tls-cert", "/tls/agent-vllm.pem", "--tls-key", "/tls/agent-vllm.key",
           "--spool", "/tmp/spool")  # fmt: skip
        idle_id = sh("docker", "inspect", "-f", "{{.Id}}", idle).stdout.strip()

        def failed_on_the_binding() -> dict[str, Any] | None:
            st = stack.status("vllm")
            bad = [f for t in st["targets"] for f in t["findings"]
                   if f["id"] == "evidence.container_mismatch"]  # fmt: skip
            return st if st["verdict"] == "FAIL" and bad else None

        st = until("the idle container's evidence to be judged", 180, failed_on_the_binding)
        # Two things are wrong with it and nothing else (the hook fired on every decode step
        # over there): where it came from, and its patched sampler, which the shipped
        # policy's pristine vLLM catches on its own (an undeclared patch of vllm-cpu).
        found = [f for t in st["targets"] for f in t["findings"]]
        errors = {f["id"] for f in found if f["severity"] == "error"}
        assert errors == {"evidence.container_mismatch", "provenance.patch.undeclared"}, found
        patch = [f for f in found if f["id"] == "provenance.patch.undeclared"]
        assert all(SAMPLER in json.dumps(f["context"]) for f in patch), patch
        (hook,) = [h for t in st["targets"] for h in t["hooks"] if h["name"] == "step"]
        assert hook["fired_on_decode_steps"] == hook["decode_steps"] > 0, hook
        ctx = [f["context"] for t in st["targets"] for f in t["findings"]
               if f["id"] == "evidence.container_mismatch"]  # fmt: skip
        assert {c["container_id"] for c in ctx} == {idle_id}
        # And its bytes are not the serving container's bytes.
        idle_sha, cid = worker_file(idle_agent, idle, SAMPLER)
        assert cid == idle_id
        assert idle_sha == hashlib.sha256(patched.read_bytes()).hexdigest()
        assert idle_sha != hashlib.sha256(original.encode()).hexdigest()
    finally:
        sh("docker", "rm", "-f", idle_agent, idle, check=False)
        sh("docker", "start", stack.container("agent"))
    complete(stack.vllm_url)
    # `wait` would stop at the idle sidecar's FAIL until the serving sidecar reports again.
    until("the serving sidecar's evidence to pass again", 180,
          lambda: stack.status("vllm")["verdict"] == "PASS")  # fmt: skip


def test_sidecar_outside_the_serving_pid_namespace_is_unobservable(stack: Stack) -> None:
    """(b) An agent without pid: container:<serving> sees no vLLM process: PENDING with the
    reason, never PASS."""
    (stack.tmp / "blind.toml").write_text(
        'version = 1\n[targets]\nnames = ["blind"]\n[[hooks]]\nname = "step"\n' + PRISTINE_VLLM_CPU
    )
    out = verifier_cli("run", "register", "blind", "--policy", str(stack.tmp / "blind.toml"),
                       "--verifier", stack.verifier, *stack.tls)  # fmt: skip
    assert out.returncode == 0, out.stderr
    name = f"{stack.project}-blind"
    sh("docker", "run", "-d", "--name", name, "--label", f"verifier.test={stack.project}",
       "--network", f"{stack.project}_default", "--user", "root", "--cap-add", "SYS_PTRACE",
       "-v", f"{stack.tmp / 'pki'}:/tls:ro", "verifier:local",
       "agent", "--verifier", "verifier:50551", "--target", "blind", "--interval", "1",
       "--agent-id", "agent-blind", "--tls-ca", "/tls/ca.pem",
       "--tls-cert", "/tls/agent-blind.pem", "--tls-key", "/tls/agent-blind.key",
       "--spool", "/tmp/spool")  # fmt: skip
    try:
        seen: list[str] = []

        def reported() -> dict[str, Any] | None:
            st = stack.status("blind")
            seen.append(st["verdict"])
            return st if st["targets"] else None

        st = until("the blind sidecar's first report", 120, reported)
        for _ in range(5):  # and it stays that way
            time.sleep(1)
            st = stack.status("blind")
            seen.append(st["verdict"])
        assert "PASS" not in seen
        assert st["verdict"] == "PENDING" and "evidence.unobservable" in ids(st)
        (why,) = [f["message"] for t in st["targets"] for f in t["findings"]
                  if f["id"] == "evidence.unobservable"]  # fmt: skip
        assert "PID namespace" in why and "pid: service:" in why
    finally:
        sh("docker", "rm", "-f", name, check=False)


def test_restarted_serving_container_needs_new_evidence(stack: Stack) -> None:
    """(c) The serving container stops and starts again: its sidecar stays (the PID namespace
    is pidns's, not vLLM's) and says the processes it reported exited, the gate closes, and
    once vLLM is back the sidecar reports the new processes by itself; the gate stays closed
    until they have run steps."""
    complete(stack.vllm_url)
    out = verifier_cli("wait", "vllm", "--timeout", "180", "--verifier", stack.verifier, *stack.tls)
    assert out.returncode == 0, out.stdout + out.stderr
    agent = stack.container("agent")

    def agent_life() -> tuple[str, str, str]:
        out = sh("docker", "inspect", "-f",
                 "{{.State.Running}} {{.State.StartedAt}} {{.RestartCount}}", agent)  # fmt: skip
        running, started, restarts = out.stdout.split()
        return running, started, restarts

    life = agent_life()
    assert life[0] == "true", life
    # stop + start rather than `docker restart`: the evidence must not care which
    sh("docker", "stop", stack.container("vllm"), timeout=300)

    def says_exited() -> dict[str, Any] | None:
        st = stack.status("vllm")
        why = [f["message"] for t in st["targets"] for f in t["findings"]
               if f["id"] == "evidence.unobservable"]  # fmt: skip
        return st if any("exited; vLLM stopped or is restarting" in w for w in why) else None

    st = until("the sidecar to say vLLM's processes exited", 120, says_exited)
    assert st["verdict"] == "PENDING", st
    gate = verifier_cli("wait", "vllm", "--timeout", "3", "--verifier", stack.verifier, *stack.tls)
    assert gate.returncode == 5  # closed: timed out, neither PASS nor FAIL
    sh("docker", "start", stack.container("vllm"), timeout=300)
    until("vLLM to come back", 600, lambda: healthy(stack.vllm_url))

    def fresh() -> dict[str, Any] | None:
        st = stack.status("vllm")
        return st if st["verdict"] not in ("STALE", "FAIL") and not says_exited() else None

    st = until("evidence from the new processes", 180, fresh)
    assert st["verdict"] == "PENDING", st  # no steps yet in the new processes: not a PASS
    assert "liveness.steps.insufficient" in ids(st) or "evidence.role_missing" in ids(st), st
    complete(stack.vllm_url)
    out = verifier_cli(
        "wait", "vllm", "--json", "--timeout", "180", "--verifier", stack.verifier, *stack.tls
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert Verdict.PASS.value == json.loads(out.stdout)["verdict"]  # what the gate opened on
    # the same sidecar all along: never restarted, never recreated
    assert agent_life() == life, (agent_life(), life)


# OCI labels: every image this project builds says what it was built from ----------------------
OCI = "org.opencontainers.image."


def oci_labels() -> dict[str, str]:
    """The OCI labels scripts/images.sh gives (its revision: HEAD, -dirty when tracked files
    differ), by their OCI_<NAME> (org.opencontainers.image.<name>), for the images a test
    builds itself."""
    rev = sh("git", "-C", str(REPO), "rev-parse", "HEAD").stdout.strip()
    dirty = sh("git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no").stdout
    source = sh("git", "-C", str(REPO), "config", "--get", "remote.origin.url", check=False)
    return {
        "OCI_SOURCE": source.stdout.strip() or "unknown",
        "OCI_REVISION": rev + ("-dirty" if dirty.strip() else ""),
        "OCI_CREATED": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def test_every_image_says_what_it_was_built_from(docker_images: None) -> None:
    """The images scripts/images.sh builds carry OCI source, revision and created labels; the
    two it rebuilds on every run (verifier, verifier-vllm) name this checkout's commit and
    origin, the cached bases the commit they were built at (perhaps by another checkout of
    the same engine), and the verifier image runs as its own user."""
    want = oci_labels()
    for image in ("verifier:local", "verifier-vllm:local", "verifier-vllm-cpu-base:local",
                  "verifier-os-base:local"):  # fmt: skip
        out = sh("docker", "image", "inspect", "-f", "{{json .Config.Labels}}", image)
        labels = json.loads(out.stdout) or {}
        assert {OCI + k for k in ("source", "revision", "created")} <= set(labels), (image, labels)
        assert labels[OCI + "source"], (image, labels)
        rev = labels[OCI + "revision"]
        assert len(rev.removesuffix("-dirty")) == 40 and int(rev[:40], 16) >= 0, (image, rev)
        assert time.strptime(labels[OCI + "created"], "%Y-%m-%dT%H:%M:%SZ"), (image, labels)
        if image in ("verifier:local", "verifier-vllm:local"):  # rebuilt by every run: ours
            assert rev == want["OCI_REVISION"], (image, rev, want)
            assert labels[OCI + "source"] == want["OCI_SOURCE"], (image, labels)
        # (a cached base keeps the labels of the checkout that built it, which may be another)
    user = sh("docker", "image", "inspect", "-f", "{{.Config.User}}", "verifier:local")
    assert user.stdout.strip() == "10001:10001"
    whoami = sh("docker", "run", "--rm", "--entrypoint", "id", "verifier:local", "-u")
    assert whoami.stdout.strip() == "10001"


# examples/vllm-bench on this module's stack (no vLLM boot of its own): the bench image is
# built from examples/vllm-bench/Dockerfile on the stand-in vLLM image, offline.
BENCH = REPO / "examples" / "vllm-bench"


@pytest.fixture(scope="module")
def bench_image(docker_images: None) -> str:
    """verifier-bench:local, its wheels from scripts/images.sh's wheelhouse over loopback,
    labelled as scripts/images.sh labels its images."""
    port = free_port()
    built = oci_labels()
    wheels = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory",
         str(REPO / ".cache" / "wheelhouse"), str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        until("the wheel server", 30, lambda: healthy_url(f"http://127.0.0.1:{port}/"))
        out = subprocess.run(
            ["docker", "build", "--network", "host", "-f", str(BENCH / "Dockerfile"),
             "--build-arg", "VLLM_IMAGE=verifier-vllm-cpu-base:local",
             "--build-arg", f"WHEELS=http://127.0.0.1:{port}/", "-t", "verifier-bench:local",
             *(a for k, v in built.items()
               for a in ("--label", f"{OCI}{k.removeprefix('OCI_').lower()}={v}")),
             str(REPO)],
            capture_output=True, text=True, timeout=1200, check=False,
            env={**os.environ, "DOCKER_BUILDKIT": "0"},
        )  # fmt: skip
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        fmt = f'{{{{index .Config.Labels "{OCI}revision"}}}}'
        rev = sh("docker", "image", "inspect", "-f", fmt, "verifier-bench:local")
        assert rev.stdout.strip() == built["OCI_REVISION"], rev.stdout
    finally:
        wheels.terminate()
        wheels.wait(timeout=30)
    return "verifier-bench:local"


def healthy_url(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - a local URL
            return bool(r.status == 200)
    except OSError:
        return False


def bench_compose(
    stack: Stack, results: Path, *args: str, run: str = "bench"
) -> subprocess.CompletedProcess[str]:
    """`docker compose` with the example's file over the stack's (its README's command)."""
    cmd = ["docker", "compose", "-p", stack.project, "-f", str(COMPOSE),
           "-f", str(BENCH / "compose.yaml"), *args]  # fmt: skip
    env = {**stack.env, "BENCH_RESULTS": str(results), "BENCH_RUN": run}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)


def signing_key(stack: Stack) -> Path:
    """The verifier's public ledger key, out of its container (beside its database)."""
    key = stack.tmp / "verifier.pub"
    out = stack.compose("exec", "-T", "verifier", "cat",
                        "/var/lib/verifier/verifier.sqlite3.signing.key.pub")  # fmt: skip
    key.write_text(out.stdout)
    return key


def test_example_gates_vllm_bench_serve_and_a_load_script_and_the_seals_verify(
    stack: Stack, bench_image: str
) -> None:
    """examples/vllm-bench as its README runs it: bench-setup registers run "bench"; `verifier
    exec` in the bench container opens a window, runs vLLM's own `vllm bench serve` against
    the probed container, and the verifier seals it (held, the step hook fired on every decode
    step of the window); the load script is gated the same way; both seals verify offline
    with the verifier's public key and the results files."""
    results = stack.tmp / "bench-results"
    results.mkdir()
    setup = bench_compose(stack, results, "run", "--rm", "--no-deps", "-T", "bench-setup")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    again = bench_compose(stack, results, "run", "--rm", "--no-deps", "-T", "bench-setup")
    assert again.returncode == 0, again.stdout + again.stderr  # the same policy: a no-op
    complete(stack.vllm_url)  # min_steps: the run PASSes only once steps ran
    key = signing_key(stack)
    for service, name in (("bench", "vllm-bench.json"), ("load", "load.json")):
        out = bench_compose(stack, results, "run", "--rm", "--no-deps", "-T",
                            "-e", "HF_HUB_OFFLINE=1", service)  # fmt: skip
        log = out.stdout + out.stderr
        assert out.returncode == 0, log
        assert "verifier exec: window " in log and "on run bench opened" in log, log
        measured = json.loads((results / name).read_text())
        assert measured["completed"] == 20, measured
        seal = results / f"{name}.seal.json"
        content = seal_content(seal.read_text())
        assert content["run"] == "bench" and content["held"] is True, content["findings"]
        (step,) = [h for h in content["hooks"].values() if h["name"] == "step"]
        assert step["fired"] == step["steps"] > 0, step
        check = verifier_cli("audit", "verify-seal", str(seal), "--key", str(key),
                             "--results", str(results / name))  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr
    assert "Serving Benchmark Result" in log or "load: 20/20" in log


def test_example_bench_never_starts_when_its_run_cannot_pass(
    stack: Stack, bench_image: str
) -> None:
    """Negative control: run bench-dead (the example's policy plus a hook the probe was never
    told about) FAILs, so `verifier exec` refuses to open the window: exit 1, the reason on
    stderr, the bench never runs (no results) and no seal is written."""
    text = (BENCH / "policy.toml").read_text() + '\n[[hooks]]\nname = "never"\n'
    (stack.tmp / "bench-dead.toml").write_text(text)
    out = verifier_cli("run", "register", "bench-dead", "--policy",
                       str(stack.tmp / "bench-dead.toml"), "--verifier", stack.verifier,
                       *stack.tls)  # fmt: skip
    assert out.returncode == 0, out.stderr
    complete(stack.vllm_url)
    results = stack.tmp / "bench-dead-results"
    results.mkdir()
    for service in ("bench", "load"):
        run = bench_compose(stack, results, "run", "--rm", "--no-deps", "-T", service,
                            run="bench-dead")  # fmt: skip
        log = run.stdout + run.stderr
        assert run.returncode == 1, log
        assert "liveness.hook.not_declared: hook never is not declared" in log, log
        assert "opened" not in log, log
    assert sorted(p.name for p in results.iterdir()) == []


def test_a_scaled_service_is_one_instance_per_container_and_the_run_needs_each(
    stack: Stack,
) -> None:
    """Compose scales vllm to two containers in the one PID namespace pidns holds; the
    sidecar, with --instance-per-container, reports each as the instance vllm/<12-hex id>.
    Run "replicas" (the stack's policy with [targets] replicas_of = ["vllm"], min_targets =
    2, its label binding holding each instance) PASSes on both, each judged on its own
    container's processes. Negative control: scaled back to one, the removed replica's
    instance is not silently dropped: the run leaves PASS."""
    policy = (REPO / "deploy" / "policy.toml").read_text()
    policy = policy.replace('names = ["vllm"]', 'replicas_of = ["vllm"]')
    policy = policy.replace("min_targets = 1", "min_targets = 2")
    assert 'replicas_of = ["vllm"]' in policy and "min_targets = 2" in policy
    (stack.tmp / "replicas.toml").write_text(policy)
    out = verifier_cli("run", "register", "replicas", "--policy", str(stack.tmp / "replicas.toml"),
                       "--verifier", stack.verifier, *stack.tls)  # fmt: skip
    assert out.returncode == 0, out.stderr
    # the sidecar with one more flag, and vLLM's next replica on a port of its own
    import yaml

    agent_cmd = yaml.safe_load(COMPOSE.read_text())["services"]["agent"]["command"]
    override = stack.tmp / "per-container.yaml"
    command = [*agent_cmd, "--instance-per-container"]
    override.write_text(yaml.safe_dump({"services": {"agent": {"command": command}}}))
    env = {**stack.env, "VLLM_PUBLISH": "127.0.0.1:"}  # 127.0.0.1::8000: any free host port

    def compose(*args: str) -> str:
        cmd = ["docker", "compose", "-p", stack.project, "-f", str(COMPOSE), "-f", str(override),
               *args]  # fmt: skip
        got = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
        assert got.returncode == 0, f"{' '.join(cmd)}\n{got.stdout}\n{got.stderr}"
        return got.stdout

    compose("up", "-d", "--no-deps", "agent")
    compose("up", "-d", "--no-deps", "--no-recreate", "--scale", "vllm=2", "vllm")
    cids = compose("ps", "-q", "vllm").split()
    assert len(cids) == 2, cids
    urls = []
    for cid in cids:
        port = sh("docker", "port", cid, "8000").stdout.split()[0].rsplit(":", 1)[1]
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        until(f"vLLM at {url} to answer /health", 600, functools.partial(healthy, url))
        complete(url)
    want = sorted(f"vllm/{cid[:12]}" for cid in cids)

    def passing() -> dict[str, Any] | None:
        st = stack.status("replicas")
        return st if st["verdict"] == "PASS" else None

    # PASS: each instance one server (two trees under one name would be evidence.target.mixed,
    # an ERROR), named for the container Compose started it in
    st = until("run replicas to PASS on both containers", 300, passing)
    assert sorted(t["target"] for t in st["targets"]) == want, st

    compose("up", "-d", "--no-deps", "--no-recreate", "--scale", "vllm=1", "vllm")
    (kept,) = compose("ps", "-q", "vllm").split()
    (removed,) = [c for c in cids if c != kept]

    def removed_left_pass() -> dict[str, Any] | None:
        # The removed replica's own verdict, not the run's alone: on two busy cores a collect
        # during the scale-down can outlast freshness_s, and the run is then STALE for the
        # kept replica's sake while the removed one's last report is still fresh (CI saw it).
        s = stack.status("replicas")
        gone = [t for t in s["targets"] if t["target"] == f"vllm/{removed[:12]}"]
        assert gone, s  # listed until it expires: not silently dropped
        return s if gone[0]["verdict"] != "PASS" else None

    st = until("the removed replica to leave PASS", 120, removed_left_pass)
    assert st["verdict"] != "PASS", st
