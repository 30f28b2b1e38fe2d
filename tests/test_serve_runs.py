"""`verifier serve --run NAME=POLICY`: runs registered at start (how a Kubernetes ConfigMap or
a compose file hands the verifier its pre-registered policy), over the real CLI and gRPC."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from contextlib import closing
from pathlib import Path

from tests.helpers import not_vllm_policy, verifier_cli
from tests.test_gate_e2e import Daemon

POLICY = not_vllm_policy('version = 1\n[[hooks]]\nname = "step"\n')


def serve(d: Path, *runs: str) -> Daemon:
    args = ["serve", "--listen", f"unix:{d}/v.sock", "--db", str(d / "db.sqlite3")]
    for r in runs:
        args += ["--run", r]
    return Daemon(args, d / "serve.log").start()


def wait_for_socket(d: Path, daemon: Daemon) -> None:
    deadline = time.monotonic() + 30
    while not (d / "v.sock").exists():
        assert daemon.proc is not None and daemon.proc.poll() is None, (d / "serve.log").read_text()
        assert time.monotonic() < deadline, (d / "serve.log").read_text()
        time.sleep(0.1)


def test_runs_given_at_start_are_registered_and_survive_a_restart(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(POLICY)
    for _ in range(2):  # the same policy again on restart is a no-op
        daemon = serve(tmp_path, f"demo={tmp_path / 'p.toml'}")
        try:
            wait_for_socket(tmp_path, daemon)
            out = verifier_cli("run", "list", "--verifier", f"unix:{tmp_path}/v.sock")
            assert out.returncode == 0, out.stderr
            assert "demo" in out.stdout and "PENDING" in out.stdout  # no evidence yet
        finally:
            daemon.stop()
            (tmp_path / "v.sock").unlink(missing_ok=True)


def test_a_changed_policy_under_a_registered_name_derives_a_new_run_and_does_not_crash_loop(
    tmp_path: Path,
) -> None:
    """Issue 19: a changed policy for run `demo` (a ConfigMap edited under a restarting
    verifier) used to refuse to start, so the verifier crash-looped. Now it starts; `demo`
    keeps its pinned policy and stays queryable; the new policy is run `demo@<12 hex of its
    digest>`, whose ledgered source says which run it changed and from what; restarting again
    with it is a no-op (no third run), and the ledger verifies."""
    (tmp_path / "p.toml").write_text(POLICY)
    (tmp_path / "q.toml").write_text(POLICY.replace("step", "other"))
    addr = f"unix:{tmp_path}/v.sock"
    daemon = serve(tmp_path, f"demo={tmp_path / 'p.toml'}")
    wait_for_socket(tmp_path, daemon)
    daemon.stop()
    (tmp_path / "v.sock").unlink(missing_ok=True)
    q_digest = "sha256:" + hashlib.sha256(POLICY.replace("step", "other").encode()).hexdigest()
    derived = f"demo@{q_digest[7:19]}"
    for _ in range(2):  # the same changed policy on every restart: one derived run
        daemon = serve(tmp_path, f"demo={tmp_path / 'q.toml'}")
        try:
            wait_for_socket(tmp_path, daemon)
            out = verifier_cli("run", "list", "--verifier", addr)
            assert out.returncode == 0, out.stderr
            names = sorted(ln.split()[0] for ln in out.stdout.splitlines())
            assert names == ["demo", derived], out.stdout
            assert verifier_cli("status", "demo", "--verifier", addr).returncode != 2
        finally:
            daemon.stop()
            (tmp_path / "v.sock").unlink(missing_ok=True)
    db = str(tmp_path / "db.sqlite3")
    with closing(sqlite3.connect(db)) as con:
        rows = dict(con.execute("SELECT name, policy_digest FROM runs").fetchall())
        (source,) = con.execute("SELECT source FROM runs WHERE name = ?", (derived,)).fetchone()
    assert rows["demo"] != q_digest and rows[derived] == q_digest
    assert "run demo keeps " + rows["demo"] in source, source
    out = verifier_cli("audit", "verify", "--db", db)
    assert out.returncode == 0, out.stderr


def test_bad_run_arguments_are_clear_errors(tmp_path: Path) -> None:
    db = ["--listen", f"unix:{tmp_path}/v.sock", "--db", str(tmp_path / "db.sqlite3")]
    out = verifier_cli("serve", *db, "--run", "no-equals-sign")
    assert out.returncode == 2 and "expected NAME=POLICY_FILE" in out.stderr
    out = verifier_cli("serve", *db, "--run", f"x={tmp_path / 'missing.toml'}")
    assert out.returncode != 0 and "cannot read the policy" in out.stderr
    (tmp_path / "bad.toml").write_text("version = 1\n[[hooks]]\nnmae = 'x'\n")
    out = verifier_cli("serve", *db, "--run", f"x={tmp_path / 'bad.toml'}")
    assert out.returncode != 0 and "nmae" in out.stderr
