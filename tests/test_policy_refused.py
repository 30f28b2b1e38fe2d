"""Weak policies at the verifier's API (issue 19, item 3): RegisterRun over real gRPC refuses
one with ``invalid policy:`` naming the unsafe key (the client's exit 3), and a weak policy
stored before the verifier refused such policies is, after a real restart on the same SQLite
database, a FAIL verdict with a ``policy.refused`` finding naming the key: never gRPC INTERNAL,
never an ``evaluate_failed`` loop."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.client.api import VerifierClient
from servewitness.errors import ConfigError, ExitCode
from servewitness.model import Verdict
from servewitness.policy import findings as F
from servewitness.policy import policy_digest
from servewitness.policy.strength import NO_LIVENESS, UNPINNED_SERVING, ZERO_FIRES
from servewitness.server.store import Store
from tests.helpers import PRISTINE_VLLM_CPU, verifier_cli, weak_policy
from tests.test_gate_e2e import Daemon

FORBID_ONLY = 'version = 1\n[[forbid]]\nmodule = "no_such_module"\n'
ZERO_HOOK = 'version = 1\n[[hooks]]\nname = "h"\nmin_fires_per_productive_step = 0\n'
STRONG = 'version = 1\n[[hooks]]\nname = "h"\n' + PRISTINE_VLLM_CPU  # no unsafe key


def _serve(d: Path) -> Daemon:
    daemon = Daemon(
        ["serve", "--listen", f"unix:{d}/v.sock", "--db", str(d / "db.sqlite3"),
         "--report-interval", "0.2"],
        d / "serve.log",
    ).start()  # fmt: skip
    deadline = time.monotonic() + 30
    while not (d / "v.sock").exists():
        assert daemon.proc is not None and daemon.proc.poll() is None, (d / "serve.log").read_text()
        assert time.monotonic() < deadline, (d / "serve.log").read_text()
        time.sleep(0.1)
    return daemon


def _stop(d: Path, daemon: Daemon) -> None:
    daemon.stop()
    (d / "v.sock").unlink(missing_ok=True)


@pytest.fixture
def verifier(tmp_path: Path) -> Iterator[str]:
    daemon = _serve(tmp_path)
    try:
        yield f"unix:{tmp_path}/v.sock"
    finally:
        _stop(tmp_path, daemon)


def _register_raw(addr: str, name: str, text: str) -> tuple[grpc.StatusCode, str]:
    """RegisterRun straight on the wire: no client-side load, so the server's check answers."""
    with grpc.insecure_channel(addr) as ch:
        stub = pb_grpc.VerifierServiceStub(ch)
        try:
            stub.RegisterRun(pb.RegisterRunRequest(name=name, policy_toml=text, source="w.toml"))
        except grpc.RpcError as e:
            return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def test_register_run_refuses_a_weak_policy_over_grpc_naming_the_key(
    verifier: str, tmp_path: Path
) -> None:
    code, why = _register_raw(verifier, "weak", FORBID_ONLY)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert why.startswith("invalid policy: w.toml: weak policy refused: "), why
    assert "[evidence] unsafe_allow_no_liveness = true" in why
    assert "[provenance] unsafe_allow_unpinned_serving_package = true" in why
    # the client library turns it into a configuration error: exit 3
    with (
        VerifierClient(verifier) as client,
        pytest.raises(ConfigError, match="unsafe_allow_no_liveness = true") as e,
    ):
        client.register_run("weak", FORBID_ONLY, "w.toml")
    assert e.value.exit_code == ExitCode.CONFIG and int(e.value.exit_code) == 3
    # the CLI: exit 3, the key on stderr
    (tmp_path / "w.toml").write_text(FORBID_ONLY)
    out = verifier_cli("run", "register", "weak", "--policy", str(tmp_path / "w.toml"),
                       "--verifier", verifier)  # fmt: skip
    assert out.returncode == 3, out.stderr
    assert "unsafe_allow_no_liveness = true" in out.stderr
    # variation: a hook that needs no fire names only its own key
    code, why = _register_raw(verifier, "zero", ZERO_HOOK + PRISTINE_VLLM_CPU)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "[evidence] unsafe_allow_zero_fires = true" in why
    assert "unsafe_allow_no_liveness" not in why and "unpinned" not in why
    # controls: nothing of it was stored; the same policy saying its keys registers
    listed = verifier_cli("run", "list", "--verifier", verifier)
    assert listed.returncode == 0 and "weak" not in listed.stdout and "zero" not in listed.stdout
    assert _register_raw(verifier, "weak", weak_policy(FORBID_ONLY))[0] == grpc.StatusCode.OK


def test_a_weak_policy_stored_before_is_refused_after_a_restart(tmp_path: Path) -> None:
    """An earlier verifier accepted these runs and stored them; this one, restarted on the
    same database, answers each with FAIL and ``policy.refused`` naming the key(s). Before:
    status was gRPC INTERNAL and the evaluation loop logged ``evaluate_failed`` forever."""
    addr = f"unix:{tmp_path}/v.sock"
    first = _serve(tmp_path)
    try:
        (tmp_path / "ok.toml").write_text(STRONG)
        out = verifier_cli("run", "register", "ok", "--policy", str(tmp_path / "ok.toml"),
                           "--verifier", addr)  # fmt: skip
        assert out.returncode == 0, out.stderr
    finally:
        _stop(tmp_path, first)
    # What RegisterRun stored before this verifier's rules refused weak policies: the text as
    # given. Three of them: forbid-only, a hook that needs no fire (variation), and a policy
    # that no longer parses at all (variation: a database written by another version).
    stored = {
        "old": FORBID_ONLY,
        "zero": ZERO_HOOK + PRISTINE_VLLM_CPU,
        "alien": "version = 1\n[[hooks]]\nname = 3\n",
    }
    s = Store(tmp_path / "db.sqlite3")
    try:
        for name, text in stored.items():
            s.register_run(name, text, policy_digest(text), f"{name}.toml")
    finally:
        s.close()
    second = _serve(tmp_path)
    try:
        t0 = time.monotonic()
        status = verifier_cli("status", "old", "--verifier", addr)
        assert status.returncode == 1, status.stdout + status.stderr  # FAIL, not an error
        assert "run old: FAIL" in status.stdout
        assert f"error   {F.POLICY_REFUSED}: run old's stored policy is refused" in status.stdout
        assert "evidence.unsafe_allow_no_liveness = true" in status.stdout
        with VerifierClient(addr) as client:
            v = client.status("old")
            assert (v.verdict, [f.id for f in v.findings]) == (Verdict.FAIL, [F.POLICY_REFUSED])
            assert v.findings[0].context["unsafe_keys"] == [NO_LIVENESS, UNPINNED_SERVING]
            zero = client.status("zero")
            assert zero.verdict == Verdict.FAIL
            assert zero.findings[0].context["unsafe_keys"] == [ZERO_FIRES]
            alien = client.status("alien")
            assert alien.verdict == Verdict.FAIL
            assert alien.findings[0].context["unsafe_keys"] == []
            assert "hooks[1].name" in alien.findings[0].message
            # control: the strong run is judged as ever (no evidence: PENDING)
            ok = client.status("ok")
            assert ok.verdict == Verdict.PENDING
            assert [f.id for f in ok.findings] == ["evidence.no_report"]
        # the gate stops at once on it (FAIL, exit 1) rather than waiting out its timeout
        waited = verifier_cli("wait", "old", "--timeout", "60", "--verifier", addr)
        assert waited.returncode == 1, waited.stdout + waited.stderr
        assert f"run old FAILED: {F.POLICY_REFUSED}: " in waited.stderr
        assert time.monotonic() - t0 < 30
        # listing every run and every run's status works; JSON carries the keys
        listed = verifier_cli("run", "list", "--verifier", addr)
        assert listed.returncode == 0, listed.stderr
        every = verifier_cli("status", "--json", "--verifier", addr)
        runs = {r["run"]: r for r in json.loads(every.stdout)["runs"]}
        assert {n: r["verdict"] for n, r in runs.items()} == {
            "ok": "PENDING", "old": "FAIL", "zero": "FAIL", "alien": "FAIL"
        }  # fmt: skip
        time.sleep(1.0)  # a few passes of the evaluation loop (--report-interval 0.2)
    finally:
        _stop(tmp_path, second)
    log = (tmp_path / "serve.log").read_text()
    assert "evaluate_failed" not in log and "INTERNAL" not in log, log[-3000:]
