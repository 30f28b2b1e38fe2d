"""Verifier-side measurement windows and the signed seal (issue 19, item 1).

The verifier opens a window only on a PASS resting on evidence every target reported after
the call arrived (its own clock), ledgers it, judges the window at the seal from the reports
it stored, ledgers the seal (held or not), signs it and returns what an offline check needs;
`verifier audit verify-seal` checks it with the public key alone. Every test runs a real
verifier over real gRPC, a real agent process (or reports a real agent builds) and a real
probed child process that steps on command, with or without its hook firing.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.client.api import VerifierClient
from servewitness.client.window import sha256_file
from servewitness.errors import TimeoutError_, UsageError
from servewitness.ledger import dsse, keys, note
from servewitness.ledger import statement as st
from servewitness.model import TargetReport
from servewitness.server.app import ServeConfig, VerifierServer
from servewitness.server.store import Store
from tests.helpers import agent_stub, probe_env, state_dir, verifier_cli
from tests.test_faults import policy, probe_report
from tests.test_gate_e2e import Daemon

# The worker's code is in a file, as vLLM's is (code from no file is provenance.code.patched);
# with `skip` set its steps count but do not reach the runner, so the hook does not fire.
STEPPING_RUNNER = """\
class Runner:
    def execute_model(self, so):
        return None


class Worker:
    rank = 0
    local_rank = 0
    skip = False

    def __init__(self):
        self.model_runner = Runner()

    def execute_model(self, so):
        if self.skip:
            return None
        return self.model_runner.execute_model(so)
"""
# A probed worker that steps on command: "step N" runs N steps that fire the hook, "idle N"
# runs N steps that do not (the hook stopped firing), each answered "ok".
STEPPER = """\
import sys, servewitness_probe as p
p.start()
PRELUDE
from servewitness_probe import _vllm
import fakerunner

class SchedulerOutput:
    total_num_scheduled_tokens = 1
    num_scheduled_tokens = {"r": 1}

w = fakerunner.Worker()
_vllm._worker_initialised(w)
for _ in range(3):
    w.execute_model(SchedulerOutput())
print("up", flush=True)
for line in sys.stdin:
    cmd, n = line.split()
    w.skip = cmd == "idle"
    for _ in range(int(n)):
        w.execute_model(SchedulerOutput())
    print("ok", flush=True)
"""


@dataclass
class Stepper:
    proc: subprocess.Popen[str]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def do(self, cmd: str, n: int) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{cmd} {n}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"


def start_stepper(tmp: Path, name: str = "w", prelude: str = "") -> Stepper:
    """A probed stepping worker; PRELUDE runs right after its probe starts."""
    mods = tmp / f"mods-{name}"
    mods.mkdir()
    (mods / "fakerunner.py").write_text(STEPPING_RUNNER)
    env = probe_env(tmp / f"probe-{name}", PYTHONPATH=str(mods), VERIFIER_PROBE_BINDINGS="0",
                    VERIFIER_HOOKS="h=fakerunner:Runner.execute_model")  # fmt: skip
    script = STEPPER.replace("PRELUDE", prelude)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    assert state_dir(tmp / f"probe-{name}", proc.pid).is_dir()
    return Stepper(proc)


def stop_stepper(s: Stepper) -> None:
    s.proc.kill()
    s.proc.communicate(timeout=10)


@pytest.fixture
def stepper(tmp_path: Path) -> Iterator[Stepper]:
    s = start_stepper(tmp_path)
    try:
        yield s
    finally:
        stop_stepper(s)


@dataclass
class V:
    server: VerifierServer
    addr: str
    db: Path
    pub: Path
    tmp: Path


def start(tmp: Path) -> VerifierServer:
    cfg = ServeConfig(f"unix:{tmp}/v.sock", tmp / "db.sqlite3", report_interval_s=0.1)
    server = VerifierServer(cfg)
    server.start()
    return server


@pytest.fixture
def verifier(tmp_path: Path) -> Iterator[V]:
    server = start(tmp_path)
    try:
        with VerifierClient(f"unix:{tmp_path}/v.sock") as c:
            c.register_run("r", policy(30.0), "p.toml")
            c.register_run("other", policy(29.0), "p2.toml")
        yield V(server, f"unix:{tmp_path}/v.sock", tmp_path / "db.sqlite3",
                keys.public_path(server.key_path), tmp_path)  # fmt: skip
    finally:
        server.stop()


def agent(tmp: Path, addr: str, pid: int, name: str = "a") -> Daemon:
    return Daemon(["agent", "--verifier", addr, "--target", "t", "--agent-id", f"agent-{name}",
                   "--pid", str(pid), "--interval", "0.1", "--spool", str(tmp / f"spool-{name}"),
                   "--no-docker"], tmp / f"agent-{name}.log").start()  # fmt: skip


@pytest.fixture
def reporting(verifier: V, stepper: Stepper) -> Iterator[Daemon]:
    a = agent(verifier.tmp, verifier.addr, stepper.pid)
    try:
        yield a
    finally:
        if a.proc is not None:
            a.stop()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return verifier_cli(*args)


def verify_seal(v: V, seal: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    out = cli("audit", "verify-seal", str(seal), "--key", str(v.pub), "--json", *extra)
    try:
        return out.returncode, json.loads(out.stdout)
    except ValueError:
        return out.returncode, {"stderr": out.stderr}


def open_and_seal(v: V, stepper: Stepper, results: Path, cmd: str = "step") -> Path:
    """`verifier window`, N steps, the results, `verifier seal`: the seal's path."""
    w = v.tmp / "w.json"
    out = cli("window", "r", "--out", str(w), "--timeout", "30", "--verifier", v.addr)
    assert out.returncode == 0, out.stderr
    stepper.do(cmd, 6)
    results.write_text('{"tokens_per_s": 123.4}\n')
    out = cli("seal", "r", "--window", str(w), "--results", str(results), "--timeout", "30")
    assert out.returncode == (0 if cmd == "step" else 1), out.stdout + out.stderr
    return results.with_name(results.name + ".seal.json")


def payload(seal: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    doc = json.loads(seal.read_text())
    return doc, json.loads(base64.b64decode(doc["envelope"]["payload"]))


def rewrite(seal: Path, doc: dict[str, Any], stmt: dict[str, Any], to: Path) -> Path:
    """DOC with its payload replaced by STMT, the signature left as it was (a typed seal)."""
    doc = json.loads(json.dumps(doc))
    doc["envelope"]["payload"] = base64.b64encode(st.encode(stmt)).decode()
    to.write_text(json.dumps(doc))
    return to


# the honest window, and what an attacker does to its seal ------------------------------------
def test_a_held_window_is_sealed_signed_ledgered_and_every_edit_of_the_seal_is_caught(
    verifier: V, stepper: Stepper, reporting: Daemon
) -> None:
    v = verifier
    results = v.tmp / "results.json"
    seal = open_and_seal(v, stepper, results)
    code, r = verify_seal(v, seal, "--results", str(results))
    assert code == 0, r
    assert r["held"] is True and r["verified"] is True and r["problems"] == []
    doc, stmt = payload(seal)
    pred = stmt["predicate"]
    assert stmt["predicateType"] == st.MEASUREMENT_WINDOW
    assert stmt["subject"] == [st.subject("results.json", sha256_file(results)[0])]
    assert pred["verificationResult"] == "PASS" and pred["verifier"]["id"] == r["keyid"]
    (row,) = pred["seal"]["hooks"].values()
    assert (row["fired"], row["steps"]) == (6, 6), row
    ev = pred["seal"]["evidence"][0]
    assert ev["agent_id"] == "agent-a" and ev["authenticated_as"].startswith("unix:uid=")
    assert ev["ledger_seq"] < pred["ledger"]["range"][1]
    # Both ends are in the ledger, which still verifies.
    store = Store(v.db)
    try:
        kinds = store._query("SELECT kind FROM ledger WHERE kind IN ('window', 'seal')")
        assert sorted(k for (k,) in kinds) == ["seal", "window"]
        assert store.verify_ledger().ok
    finally:
        store.close()

    def fails(path: Path, *why: str, extra: tuple[str, ...] = ()) -> None:
        code, r = verify_seal(v, path, *extra)
        assert code == 1, r
        text = " ".join(r["problems"])
        assert all(w in text for w in why), r["problems"]

    # A typed seal: the results digest, the held flag, a hook's fires, each edited.
    s1 = json.loads(json.dumps(stmt))
    s1["subject"][0]["digest"]["sha256"] = "0" * 64
    s1["predicate"]["seal"]["results"]["sha256"] = "0" * 64
    fails(rewrite(seal, doc, s1, v.tmp / "a.json"), "signature does not verify")
    s2 = json.loads(json.dumps(stmt))
    s2["predicate"]["seal"]["held"] = False
    fails(rewrite(seal, doc, s2, v.tmp / "b.json"), "signature does not verify")
    s3 = json.loads(json.dumps(stmt))
    next(iter(s3["predicate"]["seal"]["hooks"].values()))["fired"] += 100
    fails(rewrite(seal, doc, s3, v.tmp / "c.json"), "signature does not verify")
    # The same edit re-signed by the attacker's own key: named as another key's.
    other = keys.generate()
    forged = json.loads(json.dumps(doc))
    forged["envelope"] = dsse.sign(st.encode(s3), st.PAYLOAD_TYPE, other)
    (v.tmp / "d.json").write_text(json.dumps(forged))
    fails(v.tmp / "d.json", "not signed by the key given", keys.key_id(other)[:16])
    # The results changed after sealing.
    results.write_text('{"tokens_per_s": 999.9}\n')
    fails(seal, "results changed after sealing", extra=("--results", str(results)))
    # An inclusion proof for another entry; a checkpoint note re-signed by another key.
    swapped = json.loads(json.dumps(doc))
    swapped["proofs"] = {"open": doc["proofs"]["seal"], "seal": doc["proofs"]["open"]}
    (v.tmp / "e.json").write_text(json.dumps(swapped))
    fails(v.tmp / "e.json", "is not in the checkpoint's tree")
    resigned = json.loads(json.dumps(doc))
    text = note.parse(doc["checkpoint"]).text
    resigned["checkpoint"] = note.sign(text, other)
    (v.tmp / "f.json").write_text(json.dumps(resigned))
    fails(v.tmp / "f.json", "the checkpoint note")
    # An entry whose subject the statement no longer recomputes (another window's entry).
    moved = json.loads(json.dumps(doc))
    moved["entries"]["open"]["subject"] = "1" * 64
    (v.tmp / "g.json").write_text(json.dumps(moved))
    fails(v.tmp / "g.json", "fields do not match its hash")
    # Not a seal at all: exit 3.
    (v.tmp / "h.json").write_text("not json")
    assert verify_seal(v, v.tmp / "h.json")[0] == 3
    # The stored seal edited in the database (held flipped, findings emptied): the ledger's
    # seal entry no longer matches it.
    store = Store(v.db)
    try:
        store._tx([("UPDATE seals SET content_json = replace(content_json, '\"held\":true', "
                    "'\"held\":false')", ())])  # fmt: skip
        check = store.verify_ledger()
        assert not check.ok and "the stored seal was changed" in str(check.problem), check
    finally:
        store.close()


def test_a_held_seal_names_the_probe_errors_of_each_process_it_rests_on(verifier: V) -> None:
    """A probe error outside what the policy judges (log capture) leaves the window held, and
    the seal still names it, with its count: a held seal never hides what the evidence may
    lack. (One in what the policy judges keeps the run from PASS: no held seal at all.)"""
    v = verifier
    err = "TypeError: a log record the probe could not read"
    prelude = f"from servewitness_probe import _core\n_core.report_error('vllm_log', {err!r})\n"
    s = start_stepper(v.tmp, "e", prelude)
    a = agent(v.tmp, v.addr, s.pid)
    try:
        results = v.tmp / "results.json"
        seal = open_and_seal(v, s, results)
        code, r = verify_seal(v, seal, "--results", str(results))
        assert code == 0 and r["held"] is True, r
        (ev,) = payload(seal)[1]["predicate"]["seal"]["evidence"]
        assert ev["probe_errors"] == [f"[vllm_log] {err}"] and ev["probe_error_count"] == 1
    finally:
        a.stop()
        stop_stepper(s)


def test_the_window_file_is_not_trust_bearing(
    verifier: V, stepper: Stepper, reporting: Daemon
) -> None:
    """The old attack: roll the counts back in the window file so a lagging hook 'kept pace'.
    The file now holds an id only; the counts at open are the verifier's, in its ledger. A
    window file written with counts (the old format) is refused; extra fields are ignored;
    another id is an unknown window."""
    v = verifier
    w = v.tmp / "w.json"
    assert (
        cli("window", "r", "--out", str(w), "--timeout", "30", "--verifier", v.addr).returncode == 0
    )
    stepper.do("idle", 6)  # the hook stopped firing during the window
    data = json.loads(w.read_text())
    data["verdict"] = {"targets": [{"hooks": [{"name": "h", "fired": 0, "productive_steps": 0}]}]}
    w.write_text(json.dumps(data))
    results = v.tmp / "r.json"
    results.write_text("{}")
    out = cli("seal", "r", "--window", str(w), "--results", str(results), "--timeout", "30")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "window.hook_lagged" in out.stderr and "BROKEN" in out.stdout
    old = v.tmp / "old.json"
    old.write_text(json.dumps({"window": 2, "opened_unix": 0, "verdict": {}}))
    out = cli("seal", "r", "--window", str(old), "--results", str(results))
    assert out.returncode == 3 and "older verifier" in out.stderr
    data["window_id"] = "0" * 32
    w.write_text(json.dumps(data))
    out = cli("seal", "r", "--window", str(w), "--results", str(results), "--timeout", "5")
    assert out.returncode == 2 and "no window" in out.stderr, out.stderr


def test_a_hook_that_stops_firing_is_sealed_broken_signed_and_verify_seal_exits_1(
    verifier: V, stepper: Stepper, reporting: Daemon
) -> None:
    v = verifier
    results = v.tmp / "results.json"
    seal = open_and_seal(v, stepper, results, cmd="idle")
    code, r = verify_seal(v, seal, "--results", str(results))
    assert code == 1 and r["verified"] is True and r["held"] is False, r
    # The hook lagged during the window (and, over its life, the run now FAILs as well).
    assert "window.hook_lagged" in {f["id"] for f in r["findings"]}, r["findings"]
    _, stmt = payload(seal)
    assert stmt["predicate"]["verificationResult"] == "FAIL"


def test_opening_on_a_stale_pass_is_refused(verifier: V, stepper: Stepper) -> None:
    """The agent is dead: the run still PASSes on its last report (freshness 30 s), but no
    report arrives after the call, so no window opens (exit 5, and nothing is ledgered)."""
    v = verifier
    a = agent(v.tmp, v.addr, stepper.pid)
    with VerifierClient(v.addr) as c:
        deadline = time.monotonic() + 30
        while c.status("r").verdict.value != "PASS":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        a.stop()
        assert c.status("r").verdict.value == "PASS"  # the stale PASS
        with pytest.raises(TimeoutError_, match=r"timed out .* reported after the call"):
            c.open_window("r", 1.5)
    out = cli("exec", "r", "--results", str(v.tmp / "x"), "--timeout", "1", "--verifier",
              v.addr, "--", "touch", str(v.tmp / "ran"))  # fmt: skip
    assert out.returncode == 5 and not (v.tmp / "ran").exists(), out.stderr
    store = Store(v.db)
    try:
        assert store._query("SELECT COUNT(*) FROM windows")[0][0] == 0
    finally:
        store.close()


def send(addr: str, rep: TargetReport, agent_id: str = "hand") -> None:
    with grpc.insecure_channel(addr) as ch:
        stub = agent_stub(ch)
        hello = stub.Hello(pb.HelloRequest(agent_id=agent_id, targets=[rep.target]))
        now = time.time()
        r = TargetReport(agent_id, rep.target, hello.last_seq + 1, hello.nonce, now,
                         rep.processes, collected_unix=now - 0.01)  # fmt: skip
        assert stub.Report(pb.ReportRequest(report=wire.report_to_pb(r))).accepted


def in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def body() -> None:
        try:
            out.append(fn())
        except Exception as e:  # noqa: BLE001 - handed back to the test
            out.append(e)

    t = threading.Thread(target=body)
    t.start()
    return t, out


def test_a_process_restarted_during_the_window_breaks_it(verifier: V, tmp_path: Path) -> None:
    """Reports of target t come from process A at the open and from process B (a restart:
    fresh counters, another pid) at the seal: window.process_changed, held false."""
    v = verifier
    a, b = start_stepper(tmp_path, "A"), start_stepper(tmp_path, "B")
    try:
        send(v.addr, probe_report(a.pid, tmp_path))
        with VerifierClient(v.addr) as c:
            t, got = in_thread(lambda: c.open_window("r", 10))
            time.sleep(0.5)
            send(v.addr, probe_report(a.pid, tmp_path))  # the report after the call
            t.join()
            opened = got[0]
            assert isinstance(opened, wire.OpenedWindow), got
            a.do("step", 5)
            b.do("step", 20)
            res = tmp_path / "res"
            res.write_text("x")
            sha, size = sha256_file(res)
            sealing = wire.WindowSealing(opened.window_id, "r", sha, size, "res", 10)
            t, got = in_thread(lambda: c.seal_window(sealing))
            time.sleep(0.5)
            send(v.addr, probe_report(b.pid, tmp_path))
            t.join()
        sealed = got[0]
        assert isinstance(sealed, wire.SealedWindow), got
        assert sealed.held is False
        ids = {f["id"] for f in json.loads(
            base64.b64decode(json.loads(sealed.seal_json)["envelope"]["payload"])
        )["predicate"]["seal"]["findings"]}  # fmt: skip
        assert "window.process_changed" in ids, ids
    finally:
        stop_stepper(a)
        stop_stepper(b)


def test_cross_wired_replayed_and_double_seals_are_refused(
    verifier: V, stepper: Stepper, reporting: Daemon
) -> None:
    """Variations: seal run r's window under run `other`'s name; seal it twice; an unknown
    window; and replay a good seal for another results file (verify-seal names it)."""
    v = verifier
    results = v.tmp / "results.json"
    with VerifierClient(v.addr) as c:
        opened = c.open_window("r", 30)
        stepper.do("step", 3)
        results.write_text("good")
        sha, size = sha256_file(results)
        with pytest.raises(UsageError, match="a window on run r, not other"):
            c.seal_window(wire.WindowSealing(opened.window_id, "other", sha, size, "x", 10))
        with pytest.raises(UsageError, match="no window"):
            c.seal_window(wire.WindowSealing("f" * 32, "r", sha, size, "x", 10))
        sealed = c.seal_window(wire.WindowSealing(opened.window_id, "r", sha, size, "x", 10))
        assert sealed.held
        with pytest.raises(UsageError, match="already sealed"):
            c.seal_window(wire.WindowSealing(opened.window_id, "r", sha, size, "x", 10))
    seal = v.tmp / "good.seal.json"
    seal.write_text(sealed.seal_json)
    assert verify_seal(v, seal, "--results", str(results))[0] == 0
    forged = v.tmp / "forged-results.json"
    forged.write_text("better numbers")
    code, r = verify_seal(v, seal, "--results", str(forged))
    assert code == 1 and "results changed after sealing" in " ".join(r["problems"])


def test_a_window_survives_a_verifier_restart(
    verifier: V, stepper: Stepper, reporting: Daemon
) -> None:
    """Open windows are in the database: sealed after a restart, on evidence reported to the
    restarted verifier (the agent reconnects), and the seal verifies with the same key."""
    v = verifier
    with VerifierClient(v.addr) as c:
        opened = c.open_window("r", 30)
    stepper.do("step", 4)
    v.server.stop()
    v.server = start(v.tmp)
    res = v.tmp / "res"
    res.write_text("after restart")
    sha, size = sha256_file(res)
    with VerifierClient(v.addr) as c:
        sealed = c.seal_window(wire.WindowSealing(opened.window_id, "r", sha, size, "res", 30))
    assert sealed.held, sealed.seal_json
    (v.tmp / "res.seal.json").write_text(sealed.seal_json)
    assert verify_seal(v, v.tmp / "res.seal.json", "--results", str(res))[0] == 0


def test_exec_passes_the_commands_exit_code_through_and_still_writes_the_seal(
    verifier: V, stepper: Stepper, reporting: Daemon
) -> None:
    v = verifier
    results = v.tmp / "bench.json"
    script = f"echo '{{\"ok\": 1}}' > {results}; exit 3"
    out = cli("exec", "r", "--results", str(results), "--timeout", "30", "--verifier", v.addr,
              "--", "sh", "-c", script)  # fmt: skip
    assert out.returncode == 3, out.stdout + out.stderr
    seal = results.with_name("bench.json.seal.json")
    assert seal.is_file() and "window" in out.stdout
    # The fake worker did not step during the window: the seal says so (no_steps), signed.
    code, r = verify_seal(v, seal, "--results", str(results))
    assert code == 1 and r["verified"] and not r["held"], r
    assert {f["id"] for f in r["findings"]} == {"window.no_steps"}
    # Honest: the worker steps while the command runs (the test steps it when the command
    # says it started) and the command exits 0: exit 0, held.
    results2, go, done = v.tmp / "bench2.json", v.tmp / "go", v.tmp / "done"

    def step_when_running() -> None:
        deadline = time.monotonic() + 60
        while not go.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stepper.do("step", 5)
        done.touch()

    t, _ = in_thread(step_when_running)
    script = f"touch {go}; while [ ! -e {done} ]; do sleep 0.05; done; echo 1 > {results2}"
    out = cli("exec", "r", "--results", str(results2), "--timeout", "30", "--verifier", v.addr,
              "--", "sh", "-c", script)  # fmt: skip
    t.join()
    assert out.returncode == 0, out.stdout + out.stderr
    assert verify_seal(v, v.tmp / "bench2.json.seal.json", "--results", str(results2))[0] == 0


def test_refused_open_is_named(verifier: V) -> None:
    """No target at all: PENDING, never a window (absence of evidence); unknown run: 2."""
    with VerifierClient(verifier.addr) as c:
        with pytest.raises(TimeoutError_, match="PENDING"):
            c.open_window("r", 0.5)
        with pytest.raises(UsageError, match="no run named"):
            c.open_window("nope", 0.5)


def test_verify_seal_checks_the_seal_against_a_checkpoint_kept_elsewhere(
    verifier: V, stepper: Stepper, reporting: Daemon
) -> None:
    """--checkpoint: the seal's own note, or the earlier one its consistency proof starts
    from, verifies; a note of that size with another root (a forked history, signed with the
    verifier's own key) is named as a fork; one the seal has no proof from cannot be checked
    from the seal alone, which fails (never a silent pass) and names the command that can."""
    v = verifier
    results = v.tmp / "results.json"
    seal = open_and_seal(v, stepper, results)
    doc, _ = payload(seal)
    assert doc["consistency"] is not None, "an earlier checkpoint was signed at start"
    same, older = v.tmp / "same.note", v.tmp / "older.note"
    same.write_text(doc["checkpoint"])
    older.write_text(doc["consistency"]["note"])
    for kept, says in ((same, "is the one kept elsewhere"), (older, "extends the one kept")):
        code, r = verify_seal(v, seal, "--checkpoint", str(kept))
        assert code == 0 and any(says in c for c in r["checks"]), r
    key = keys.load_private_key(v.server.key_path)
    size = note.verify(doc["consistency"]["note"], key.public_key()).size
    forked = v.tmp / "forked.note"
    forked.write_text(note.sign_checkpoint(key, size, b"\x01" * 32))
    code, r = verify_seal(v, seal, "--checkpoint", str(forked))
    assert code == 1 and "forked" in " ".join(r["problems"]), r
    if size > 1:
        other = v.tmp / "other.note"
        other.write_text(note.sign_checkpoint(key, size - 1, b"\x02" * 32))
        code, r = verify_seal(v, seal, "--checkpoint", str(other))
        assert code == 1 and "audit consistency --from" in " ".join(r["problems"]), r


@pytest.mark.parametrize("cmd", ["step", "idle"])
def test_a_window_opened_on_one_replica_is_sealed_on_another(
    verifier: V, stepper: Stepper, reporting: Daemon, cmd: str
) -> None:
    """Replicas on one database (``serve --processes``, or several verifiers behind one
    Service): a harness whose connection moved between the open and the seal. The agent
    reports to replica A only; replica B seals A's window from what it followed: held when
    the hook fired on every step, broken when it stopped (never a held seal B could not see
    the evidence for), and the seal verifies with the shared key."""
    v = verifier
    other = VerifierServer(ServeConfig(f"unix:{v.tmp}/b.sock", v.db, report_interval_s=0.1))
    other.start()
    try:
        with VerifierClient(v.addr) as c:
            opened = c.open_window("r", 30)
        stepper.do(cmd, 6)
        res = v.tmp / "res"
        res.write_text("measured")
        sha, size = sha256_file(res)
        with VerifierClient(f"unix:{v.tmp}/b.sock") as c:
            sealed = c.seal_window(wire.WindowSealing(opened.window_id, "r", sha, size, "res", 30))
    finally:
        other.stop()
    assert sealed.held is (cmd == "step"), sealed.seal_json
    seal = v.tmp / "res.seal.json"
    seal.write_text(sealed.seal_json)
    code, r = verify_seal(v, seal, "--results", str(res))
    want = (0, True, True) if cmd == "step" else (1, True, False)
    assert (code, r["verified"], r["held"]) == want, r
    if cmd == "step":
        (row,) = payload(seal)[1]["predicate"]["seal"]["hooks"].values()
        assert (row["fired"], row["steps"]) == (6, 6), row
    else:
        assert "window.hook_lagged" in {f["id"] for f in r["findings"]}, r["findings"]
