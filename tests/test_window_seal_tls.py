"""Measurement windows over mutual TLS (issue 19, item 1): the harness role opens and seals,
an auditor or an agent's identity may not; the evidence a seal rests on is authenticated by
the agent's certificate, and the seal verifies offline. A real `verifier serve` over mTLS
with certificates from `verifier certs`, a real agent and a probed child that steps."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from servewitness.testing.vllm_server import free_port
from tests.helpers import verifier_cli
from tests.test_faults import policy
from tests.test_gate_e2e import Daemon
from tests.test_security import certs
from tests.test_window_seal import Stepper, in_thread, payload, stepper  # noqa: F401 - fixture


def test_windows_over_mutual_tls_harness_may_auditor_and_agent_may_not(
    tmp_path: Path,
    stepper: Stepper,  # noqa: F811 - the fixture imported above
) -> None:
    d = certs(tmp_path)
    out = verifier_cli("certs", "issue", "bench", "--dir", str(d), "--role", "harness")
    assert out.returncode == 0, out.stderr
    addr = f"127.0.0.1:{free_port()}"
    db = tmp_path / "db.sqlite3"
    serve = Daemon(
        ["serve", "--listen", addr, "--db", str(db), "--report-interval", "0.2",
         "--tls-cert", str(d / "verifier.pem"), "--tls-key", str(d / "verifier.key"),
         "--tls-client-ca", str(d / "ca.pem")],
        tmp_path / "serve.log",
    ).start()  # fmt: skip
    agent = None

    def as_(who: str, *args: str, cmd: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        return verifier_cli(*args, "--verifier", addr, "--tls-ca", str(d / "ca.pem"),
                            "--tls-cert", str(d / f"{who}.pem"),
                            "--tls-key", str(d / f"{who}.key"), *cmd)  # fmt: skip

    try:
        deadline = time.monotonic() + 30
        while "listening" not in (tmp_path / "serve.log").read_text():
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.1)
        agent = Daemon(
            ["agent", "--verifier", addr, "--target", "a", "--agent-id", "agent-a",
             "--pid", str(stepper.pid), "--interval", "0.2", "--no-docker",
             "--spool", str(tmp_path / "spool"), "--tls-ca", str(d / "ca.pem"),
             "--tls-cert", str(d / "agent-a.pem"), "--tls-key", str(d / "agent-a.key")],
            tmp_path / "agent.log",
        ).start()  # fmt: skip
        (tmp_path / "p.toml").write_text(policy(30.0))
        bad = policy(30.0).replace("fakerunner.Runner", "elsewhere.Runner")
        (tmp_path / "bad.toml").write_text(bad)
        for run, pol in (("r", "p.toml"), ("bad", "bad.toml")):
            out = as_("ops", "run", "register", run, "--policy", str(tmp_path / pol))
            assert out.returncode == 0, out.stderr
        w = tmp_path / "w.json"
        # An auditor reads, but does not measure; an agent's certificate names no role.
        for who in ("audit", "agent-a"):
            out = as_(who, "window", "r", "--out", str(w), "--timeout", "30")
            assert out.returncode == 10, (who, out.stderr)
            assert "needs the role harness or operator" in out.stderr, out.stderr
        assert not w.exists()
        # A run that FAILs on fresh evidence: refused at once, naming the finding (exit 1).
        out = as_("bench", "window", "bad", "--out", str(w), "--timeout", "30")
        assert out.returncode == 1 and "window refused: run bad is FAIL" in out.stderr, out.stderr
        # The harness measures: the worker steps while the command runs.
        results, go, done = tmp_path / "res.json", tmp_path / "go", tmp_path / "done"

        def step_when_running() -> None:
            deadline = time.monotonic() + 60
            while not go.exists():
                assert time.monotonic() < deadline
                time.sleep(0.05)
            stepper.do("step", 5)
            time.sleep(0.5)
            done.touch()

        t, _ = in_thread(step_when_running)
        script = f"touch {go}; while [ ! -e {done} ]; do sleep 0.05; done; echo 1 > {results}"
        out = as_("bench", "exec", "r", "--results", str(results), "--timeout", "30",
                  cmd=("--", "sh", "-c", script))  # fmt: skip
        t.join()
        assert out.returncode == 0, out.stdout + out.stderr
        seal = tmp_path / "res.json.seal.json"
        _, stmt = payload(seal)
        ev = stmt["predicate"]["seal"]["evidence"]
        assert {e["authenticated_as"] for e in ev} == {"agent agent-a"}, ev
        # An auditor may not seal either (it would need the window id, which it can read).
        wid = stmt["predicate"]["window"]["window_id"]
        w.write_text(json.dumps({"window": 3, "window_id": wid, "run": "r", "verifier": addr}))
        out = as_("audit", "seal", "r", "--window", str(w), "--results", str(results))
        assert out.returncode == 10, out.stderr
    finally:
        if agent is not None:
            agent.stop()
        serve.stop()
    key = Path(str(db) + ".signing.key.pub")
    out = verifier_cli("audit", "verify-seal", str(seal), "--key", str(key), "--results",
                       str(results), "--json")  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["held"] is True
