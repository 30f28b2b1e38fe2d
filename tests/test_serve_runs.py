"""`verifier serve --run NAME=POLICY`: runs registered at start (how a Kubernetes ConfigMap or
a compose file hands the verifier its pre-registered policy), over the real CLI and gRPC."""

from __future__ import annotations

import time
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


def test_a_changed_policy_under_a_registered_name_refuses_to_start(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(POLICY)
    (tmp_path / "q.toml").write_text(POLICY.replace("step", "other"))
    daemon = serve(tmp_path, f"demo={tmp_path / 'p.toml'}")
    wait_for_socket(tmp_path, daemon)
    daemon.stop()
    (tmp_path / "v.sock").unlink(missing_ok=True)
    out = verifier_cli(
        "serve", "--listen", f"unix:{tmp_path}/v.sock", "--db", str(tmp_path / "db.sqlite3"),
        "--run", f"demo={tmp_path / 'q.toml'}",
    )  # fmt: skip
    assert out.returncode != 0 and "a changed policy needs a new run name" in out.stderr
    assert not (tmp_path / "v.sock").exists()  # it never listened


def test_bad_run_arguments_are_clear_errors(tmp_path: Path) -> None:
    db = ["--listen", f"unix:{tmp_path}/v.sock", "--db", str(tmp_path / "db.sqlite3")]
    out = verifier_cli("serve", *db, "--run", "no-equals-sign")
    assert out.returncode == 2 and "expected NAME=POLICY_FILE" in out.stderr
    out = verifier_cli("serve", *db, "--run", f"x={tmp_path / 'missing.toml'}")
    assert out.returncode != 0 and "cannot read the policy" in out.stderr
    (tmp_path / "bad.toml").write_text("version = 1\n[[hooks]]\nnmae = 'x'\n")
    out = verifier_cli("serve", *db, "--run", f"x={tmp_path / 'bad.toml'}")
    assert out.returncode != 0 and "nmae" in out.stderr
