"""vLLM used as a library (CPU, the tiny model): offline ``vllm.LLM`` in its two process
layouts, and a script that drives the engine's executor directly. ``verifier inspect`` and the
policy engine (and, for the multi-process layout, the real agent and verifier over gRPC) must
give the same evidence as for a server: every process probed, the live runner, steps split
into prefill and decode that reconcile with the tokens generated, declared hooks firing on
decode steps, manifest digests; and say plainly what is weaker (no API server: no client
request ids; direct driving: no front-end id at all).

Each layout is one script started once for the module (tests/data/offline_llm.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servewitness.evidence.process import OFFLINE_FRONT_END_NOTE, OFFLINE_ONE_PROCESS_NOTE
from servewitness.policy import findings as F
from tests import boot_ahead
from tests.helpers import PRISTINE_VLLM_CPU, hook_by_name, verifier_cli
from tests.offline import (
    CPU_RUNNER,
    HOOK_ENV,
    OfflineScript,
    by_role,
    delta,
    ids,
    passes,
    verdict,
)
from tests.test_gate_e2e import local_verifier

pytestmark = pytest.mark.vllm


def offline_policy(
    *roles: str, hooks: tuple[str, ...] = ("step", "sample"), runner: str = ""
) -> str:
    """What offline use can honestly be held to: the roles it has, the live runner, hooks
    firing on every decode step, vLLM's files as published."""
    listed = ", ".join(f'"{r}"' for r in roles)
    body = "version = 1\n"
    if roles:
        body += f"[evidence]\nrequire_probe = [{listed}]\n"
    body += f'[runner]\nexpect_class = "{runner or CPU_RUNNER}"\n'
    for h in hooks:
        body += f'[[hooks]]\nname = "{h}"\non = "decode"\n'
    return body + PRISTINE_VLLM_CPU


# The default layout: script -> engine core -> worker.
MULTI = boot_ahead.register(
    "offline script, multiprocess", __name__, lambda m: OfflineScript(m, "generate", HOOK_ENV)
)
# VLLM_ENABLE_V1_MULTIPROCESSING=0: the script runs the engine core and the worker.
SINGLE = boot_ahead.register(
    "offline script, one process",
    __name__,
    lambda m: OfflineScript(m, "generate", {**HOOK_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}),
)


@pytest.fixture(scope="module")
def multi(boot_pool: boot_ahead.BootPool) -> Iterator[tuple[OfflineScript, dict[str, Any]]]:
    """The default layout: script -> engine core -> worker."""
    script = boot_pool.take(MULTI)
    try:
        yield script, flushed(script)
    finally:
        script.stop()


def flushed(script: OfflineScript, timeout_s: float = 15.0) -> dict[str, Any]:
    """The tree's inspect document once the front end's bindings writer has written the ids
    of the requests the script made: it writes every FLUSH_INTERVAL_S (0.5 s), so a document
    taken the moment the script is ready may not have them yet. After TIMEOUT_S, the last
    document, whatever it holds (the tests then say what is missing)."""
    n = len(script.ready["prompt_tokens"])
    deadline = time.monotonic() + timeout_s
    while True:
        doc = script.inspect()
        r = doc["requests"]
        if (r["bound"] >= n - 1 and r["ext"] >= r["bound"]) or time.monotonic() > deadline:
            return doc
        time.sleep(0.5)


@pytest.fixture(scope="module")
def single(boot_pool: boot_ahead.BootPool) -> Iterator[OfflineScript]:
    """VLLM_ENABLE_V1_MULTIPROCESSING=0: the script runs the engine core and the worker."""
    script = boot_pool.take(SINGLE)
    try:
        yield script
    finally:
        script.stop()


def reconcile(proc: dict[str, Any], ready: dict[str, Any]) -> None:
    """Steps and hook fires against the tokens the script got back, one request at a time:
    the prefill step samples each request's first token, every later token is a decode step
    (tests/test_liveness_live.py reconciles the server the same way)."""
    s, n = proc["steps"], len(ready["prompt_tokens"])
    completion = sum(ready["completion_tokens"])
    assert s["prefill_tokens"] == sum(ready["prompt_tokens"]), s
    assert s["prefill"] == n, s
    assert s["decode_tokens"] == s["decode"] == completion - n, s
    assert s["prefill_tokens"] + s["decode_tokens"] == s["tokens_scheduled"], s
    assert s["total"] == s["productive"] + s["empty"], s
    for name in ("step", "sample"):
        h = hook_by_name(proc, name)
        assert h["status"] == "firing", h
        assert h["fired_on_decode_steps"] == s["decode"] > 0, h
        assert h["fired_on_prefill_steps"] == s["prefill"], h
        assert h["fired_outside_steps"] == 0, h
    # execute_model runs on every step (an empty one too), sample_tokens only on those that
    # sampled: the two phases are one step, counted once
    assert hook_by_name(proc, "step")["fired"] == s["total"], s
    assert hook_by_name(proc, "sample")["fired"] == s["productive"], s


def full_evidence(proc: dict[str, Any]) -> None:
    assert proc["probe"]["present"] and proc["probe"]["errors"] == [], proc["probe"]
    assert proc["manifest"]["digest"] and proc["manifest"]["files"] > 100, proc["manifest"]


# -- (a) offline LLM, multi-process -------------------------------------------------------


def test_multi_process_layout_every_process_probed_with_its_role(
    multi: tuple[OfflineScript, dict[str, Any]],
) -> None:
    script, doc = multi
    procs = doc["processes"]
    assert script.ready["client"] == "SyncMPClient"
    front, core, worker = (by_role(procs, r) for r in ("offline", "engine_core", "worker"))
    assert front["pid"] == script.pid
    assert core["ppid"] == script.pid and worker["pid"] not in (script.pid, core["pid"])
    for p in (front, core, worker):
        full_evidence(p)
    assert front["notes"] == [OFFLINE_FRONT_END_NOTE]
    assert core["notes"] == worker["notes"] == []
    assert (front["steps"]["total"], core["steps"]["total"]) == (0, 0)  # steps run in the worker
    assert core["engine"] == {"async_scheduling": False, "batch_queue": 1, "step": "step"}
    assert worker["rank"] == 0 and worker["runner"]["class"] == CPU_RUNNER
    assert worker["runner"]["sha256"]


def test_multi_process_layout_steps_and_hooks_reconcile_with_the_tokens(
    multi: tuple[OfflineScript, dict[str, Any]],
) -> None:
    script, doc = multi
    reconcile(by_role(doc["processes"], "worker"), script.ready)


def test_multi_process_layout_says_what_is_weaker(
    multi: tuple[OfflineScript, dict[str, Any]],
) -> None:
    """No API server: the tree's note says so; every request bound to steps has the LLM's
    own id (a front-end id), none a client's."""
    script, doc = multi
    assert any("no API server" in n for n in doc["notes"]), doc["notes"]
    r = doc["requests"]
    assert r["client"] == 0 and r["ext"] == r["bound"], r
    assert r["bound"] >= len(script.ready["prompt_tokens"]) - 1, r  # the last may be open
    text = verifier_cli("inspect", "--pid", str(script.pid), "--tree")
    assert text.returncode == 0 and "NOTE     offline front end" in text.stdout, text.stdout
    assert "NOTE no API server" in text.stdout and "engine   async scheduling False" in text.stdout


def test_multi_process_layout_passes_an_offline_policy_and_fails_its_negative_controls(
    multi: tuple[OfflineScript, dict[str, Any]],
) -> None:
    procs = multi[1]["processes"]
    ok = verdict(procs, offline_policy("offline", "engine_core", "worker"))
    assert passes(ok), [(f.id, f.message) for f in ok.findings]
    assert ids(ok).count(F.HOOK_FIRING) == 2
    # the default require_probe names api_server: never a silent pass without one
    default = verdict(procs, offline_policy())
    assert default.verdict.value == "PENDING" and F.EVIDENCE_ROLE_MISSING in ids(default)
    (missing,) = [f for f in default.findings if f.id == F.EVIDENCE_ROLE_MISSING]
    assert missing.context["role"] == "api_server" and "offline" in missing.message
    explicit = verdict(procs, offline_policy("api_server", "worker"))
    assert explicit.verdict.value == "PENDING" and F.EVIDENCE_ROLE_MISSING in ids(explicit)
    # a hook on a runner class never instantiated, one whose module is never imported, and a
    # wrong runner expectation each FAIL on the same real evidence
    roles = ("engine_core", "worker")
    dead = verdict(procs, offline_policy(*roles, hooks=("step", "v2_step")))
    assert dead.verdict.value == "FAIL" and F.HOOK_NOT_INSTANTIATED in ids(dead)
    unloaded = verdict(procs, offline_policy(*roles, hooks=("user_step",)))
    assert unloaded.verdict.value == "FAIL" and F.HOOK_NOT_LOADED in ids(unloaded)
    wrong = verdict(
        procs, offline_policy(*roles, runner="vllm.v1.worker.gpu.model_runner.GPUModelRunner")
    )
    assert wrong.verdict.value == "FAIL", [(f.id, f.message) for f in wrong.findings]


# -- the agent and the verifier over gRPC, for the multi-process layout ------------------


def test_agent_and_gate_pass_an_offline_run_and_hold_a_server_policy_pending(
    multi: tuple[OfflineScript, dict[str, Any]], tmp_path: Path
) -> None:
    script = multi[0]
    with local_verifier(tmp_path) as v:
        target = '[targets]\nnames = ["offline-0"]\n'
        runs = {
            "offline": offline_policy("offline", "engine_core", "worker"),
            "server": offline_policy(),  # the default require_probe: an API server expected
        }
        for name, text in runs.items():
            path = tmp_path / f"{name}.toml"
            path.write_text(text.replace("version = 1\n", f"version = 1\n{target}"))
            out = verifier_cli("run", "register", name, "--policy", str(path), "--verifier", v.addr)
            assert out.returncode == 0, out.stderr
        v.agent("offline-0", script.pid)
        passed = verifier_cli("wait", "offline", "--timeout", "90", "--verifier", v.addr)
        assert passed.returncode == 0, passed.stderr + v.logs()
        assert "run offline: PASS" in passed.stdout
        held = verifier_cli("wait", "server", "--timeout", "3", "--verifier", v.addr)
        assert held.returncode == 5, held.stdout + held.stderr
        assert "still PENDING" in held.stderr
        status = verifier_cli("status", "server", "--verifier", v.addr, "--json")
        assert F.EVIDENCE_ROLE_MISSING in status.stdout and "api_server" in status.stdout


# -- (b) offline LLM in one process --------------------------------------------------------


def test_one_process_layout_is_front_end_engine_and_worker_with_full_evidence(
    single: OfflineScript,
) -> None:
    doc = single.inspect()
    (proc,) = [p for p in doc["processes"] if p["role"] not in ("helper", "unknown")]
    assert single.ready["client"] == "InprocClient"
    assert proc["pid"] == single.pid and proc["role"] == "worker" and proc["rank"] == 0
    assert proc["roles"] == ["engine_core", "offline", "worker"]
    assert proc["notes"] == [OFFLINE_ONE_PROCESS_NOTE]
    assert proc["engine"] == {"async_scheduling": False, "batch_queue": 1, "step": "step"}
    full_evidence(proc)
    assert proc["runner"]["class"] == CPU_RUNNER
    reconcile(proc, single.ready)
    assert any("no API server" in n for n in doc["notes"]), doc["notes"]
    ok = verdict(doc["processes"], offline_policy("worker"))
    assert passes(ok), [(f.id, f.message) for f in ok.findings]
    both = verdict(doc["processes"], offline_policy("offline", "engine_core", "worker"))
    assert passes(both), [(f.id, f.message) for f in both.findings]
    # the report names this process by the role that runs steps (worker) and carries every
    # role it plays, so the default policy tells it from a server whose API server is out
    # of view: PENDING for want of an API server, as in the multi-process layout
    (report,) = [p["report"] for p in doc["processes"] if p["pid"] == single.pid]
    assert report["role"] == "worker" and report["roles"] == ["engine_core", "offline", "worker"]
    for policy in (offline_policy(), offline_policy("api_server", "worker")):
        held = verdict(doc["processes"], policy)
        assert held.verdict.value == "PENDING" and F.EVIDENCE_ROLE_MISSING in ids(held)
        (f,) = [f for f in held.findings if f.id == F.EVIDENCE_ROLE_MISSING]
        assert "offline" in f.context["roles_present"], f.context


# -- (c) a script that drives the executor directly -----------------------------------------


def test_direct_executor_driver_counts_each_call_once_and_has_no_front_end_id(
    single: OfflineScript,
) -> None:
    """Requests put straight into the engine core's scheduler, each step driven as
    ``executor.execute_model(scheduler_output)`` and, when that returns None (the two-phase
    protocol), ``executor.sample_tokens(...)``. The probe counts each execute_model call as
    one step whichever protocol it took (an empty step returns its output itself), hooks on
    both phases fire on the decode steps, and the requests show as bound to steps with no
    front-end id."""
    before = single.inspect()
    b = by_role(before["processes"], "worker")
    done = single.command("direct")
    assert done["completion_tokens"] == [6, 6], done
    doc = single.inspect()
    a = by_role(doc["processes"], "worker")
    calls, none = done["execute_model_calls"], done["returned_none"]
    assert delta(b, a, "total") == calls and none == done["sample_tokens_calls"]
    assert delta(b, a, "productive") == none > 0 and delta(b, a, "empty") == calls - none
    # both requests prefill in the first step, then decode side by side
    assert delta(b, a, "prefill") == 1 and delta(b, a, "prefill_tokens") == sum(
        done["prompt_tokens"]
    )
    assert delta(b, a, "decode_tokens") == sum(done["completion_tokens"]) - 2
    assert delta(b, a, "decode") == none - 1
    for name, want in (("step", calls), ("sample", none)):
        hb, ha = hook_by_name(b, name), hook_by_name(a, name)
        assert ha["fired"] - hb["fired"] == want, (name, hb, ha)
        decode = ha["fired_on_decode_steps"] - hb["fired_on_decode_steps"]
        assert decode == delta(b, a, "decode"), (name, hb, ha)
    # the two requests were bound to steps without any front-end id (written by the probe's
    # writer thread within a second)
    deadline = time.monotonic() + 10
    while doc["requests"]["bound"] - doc["requests"]["ext"] < 2:
        assert time.monotonic() < deadline, doc["requests"]
        time.sleep(0.5)
        doc = single.inspect()
    assert doc["requests"]["bound"] - doc["requests"]["ext"] == 2, doc["requests"]
    assert any("have no front-end id" in n for n in doc["notes"]), doc["notes"]
    ok = verdict(doc["processes"], offline_policy("worker"))
    assert passes(ok), [(f.id, f.message) for f in ok.findings]


def test_a_driver_calling_execute_model_twice_has_that_call_not_counted_and_said(
    single: OfflineScript,
) -> None:
    """The issue's driver, written for the one-phase protocol: execute_model returns None, it
    calls execute_model again for its output and vLLM raises. That call ran no step: the
    counts are those of the steps that ran, the call is counted as raised, ``inspect`` notes
    it with vLLM's error, and the policy warns (``liveness.steps.raised``) without failing
    the steps that did run."""
    before = single.inspect()
    b = by_role(before["processes"], "worker")
    done = single.command("misuse")
    (error,) = done["raised"]
    assert "sample_tokens() must be called after execute_model() returns None" in error, error
    assert done["completion_tokens"] == [6, 6], done
    doc = single.inspect()
    a = by_role(doc["processes"], "worker")
    calls, none = done["execute_model_calls"], done["returned_none"]
    assert delta(b, a, "total") == calls and delta(b, a, "productive") == none
    assert delta(b, a, "raised") == 1
    assert a["steps"]["errors"][-1]["error"] == error
    hb, ha = hook_by_name(b, "step"), hook_by_name(a, "step")
    # the hook on the runner's execute_model was entered by the raised call too (vLLM raises
    # inside it): a fire is counted for each entry, a step only for a call that ran one
    assert ha["fired"] - hb["fired"] == calls + 1
    (note,) = [n for n in a["notes"] if "raised" in n]
    assert note.startswith(f"{a['steps']['raised']} execute_model call(s) raised") and error in note
    v = verdict(doc["processes"], offline_policy("worker"))
    assert passes(v) and F.STEPS_RAISED in ids(v), [(f.id, f.message) for f in v.findings]
