"""Speculative decoding on a real vLLM (CPU build, ngram drafter, V1 runner): the probe's
per-process totals (drafts, draft tokens, accepted tokens, accepted per position) equal vLLM's
own ``vllm:spec_decode_*`` counters on ``/metrics``; the evidence says speculation was on, with
which method and k, and which runner ran; the drafter's and the rejection sampler's hooks are
judged firing on decode steps. Negative control: the shared session server (no speculation)
reports speculation off with zero drafts, and the same two hooks there FAIL (never PASS)."""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servewitness import wire
from servewitness.evidence.bindings_reader import BindingsReader
from servewitness.evidence.bindings_reader import RequestSpan as ProbeSpan
from servewitness.model import DRIFT_MODULE_CUSTOM_LOADER, Severity, Verdict
from servewitness.policy import TargetSnapshot, load_policy
from servewitness.policy import findings as F
from servewitness.testing.vllm_server import VllmServer
from tests import boot_ahead
from tests.conftest import SPEC_PROPOSE, SPEC_REJECT, V1_STEP
from tests.helpers import PRISTINE_VLLM_CPU, REPO, hook_by_name, inspect_json, verifier_cli
from tests.test_gate_e2e import local_verifier
from tests.test_unfiled import HONEST_CUSTOM_LOADERS

pytestmark = pytest.mark.vllm

K = 3
SPEC_CONFIG = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3}
SPEC_CONFIG["prompt_lookup_min"] = 1
V1_CPU_RUNNER = "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
V2_CPU_RUNNER = "vllm.v1.worker.cpu.model_runner.CPUModelRunner"
# Repetitive prompts give the ngram drafter matches; greedy decoding makes the run repeatable.
PROMPTS = [
    "one two three one two three one two three one two",
    "the cat sat on the mat, the cat sat on the mat, the cat",
    "a b c d a b c d a b c d a b",
    "red green blue red green blue red green",
]
MAX_TOKENS = 24


def _spec_server(model: Path) -> VllmServer:
    return VllmServer(
        model,
        env={"VERIFIER_HOOKS": f"propose={SPEC_PROPOSE},reject={SPEC_REJECT},step={V1_STEP}"},
        extra_args=(
            "--no-enable-prefix-caching",
            "--speculative-config",
            json.dumps(SPEC_CONFIG),
        ),
        scratch_parent=REPO / ".scratch",
    )


SPEC_SERVER = boot_ahead.register("spec server", __name__, _spec_server)


@pytest.fixture(scope="module")
def spec_server(boot_pool: boot_ahead.BootPool) -> Iterator[VllmServer]:
    server = boot_pool.take(SPEC_SERVER)
    try:
        for prompt in PROMPTS:
            server.complete(prompt, max_tokens=MAX_TOKENS)
        yield server
    finally:
        server.stop()


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<v>\S+)")


def metrics(server: VllmServer) -> dict[tuple[str, str], float]:
    """vLLM's ``/metrics``: (sample name, its position label or "") -> value (summed over
    the other labels: one engine here)."""
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=10) as r:  # noqa: S310
        text = r.read().decode()
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or not m.group("name").startswith("vllm:"):
            continue
        pos = re.search(r'position="(\d+)"', m.group("labels") or "")
        key = (m.group("name"), pos.group(1) if pos else "")
        out[key] = out.get(key, 0.0) + float(m.group("v"))
    return out


def spec_metrics(server: VllmServer) -> dict[str, Any]:
    m = metrics(server)

    def get(name: str, pos: str = "") -> int:
        return int(m.get((f"vllm:spec_decode_{name}_total", pos), 0))

    return {
        "drafts": get("num_drafts"),
        "draft_tokens": get("num_draft_tokens"),
        "accepted_tokens": get("num_accepted_tokens"),
        "accepted_per_position": [get("num_accepted_tokens_per_pos", str(i)) for i in range(K)],
        "generation_tokens": int(m.get(("vllm:generation_tokens_total", ""), 0)),
    }


def the_worker(server: VllmServer) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    procs = inspect_json(server.pid, tree=True)
    workers = [p for p in procs if p["role"] == "worker"]
    assert len(workers) == 1, [p["role"] for p in procs]
    return workers[0], procs


@pytest.fixture(scope="module")
def spec_tree(spec_server: VllmServer) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The spec server's worker and tree as ``inspect --tree --json`` reads them after the
    fixture's requests (none is in flight after): one read (~11 s of a 2-core machine) for the
    tests that only read that state."""
    return the_worker(spec_server)


def probe_counts(w: dict[str, Any]) -> dict[str, Any]:
    sp = w["steps"]["speculation"]
    return {
        "drafts": sp["drafts"],
        "draft_tokens": sp["draft_tokens"],
        "accepted_tokens": sp["accepted_tokens"],
        "accepted_per_position": sp["accepted_per_position"],
    }


def test_probe_totals_equal_vllm_spec_decode_counters(
    spec_server: VllmServer, spec_tree: tuple[dict[str, Any], list[dict[str, Any]]]
) -> None:
    """The requests are finished; /metrics may lag the last output by a moment (the API
    server's stat loggers), so it is read until it stops changing, then compared."""
    w, _ = spec_tree
    ours = probe_counts(w)
    theirs: dict[str, Any] = {}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        theirs = spec_metrics(spec_server)
        if {k: theirs[k] for k in ours} == ours:
            break
        time.sleep(0.5)
    assert {k: theirs[k] for k in ours} == ours, (ours, theirs)
    # not a vacuous agreement: drafts were verified and some accepted at every position
    assert ours["drafts"] > 0 and ours["accepted_tokens"] > 0, ours
    assert ours["draft_tokens"] > ours["accepted_tokens"] or ours["accepted_tokens"] > 0
    assert all(n > 0 for n in ours["accepted_per_position"][:1]), ours
    sp = w["steps"]["speculation"]
    assert sp["unread_steps"] == 0, sp
    # every token vLLM generated was sampled by the runner (some past max_tokens are dropped)
    gen = theirs["generation_tokens"]
    assert gen <= sp["emitted_tokens"] <= gen + len(PROMPTS) * K, (sp, theirs)


def test_each_request_has_its_share_and_the_shares_add_up_to_the_totals(
    spec_server: VllmServer,
) -> None:
    """Per request: each finished request's bindings record carries its drafts, draft tokens,
    accepted tokens (per position) and emitted tokens; summed over the requests they are the
    process's totals, which the test above holds equal to vLLM's /metrics."""
    w, _ = the_worker(spec_server)
    reader = BindingsReader()
    spans: list[ProbeSpan] = []
    deadline = time.monotonic() + 15
    while True:  # the writer thread writes finished requests within about a second
        spans += reader.read(Path(w["probe"]["state_dir"]))[0]
        if len(spans) >= len(PROMPTS) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    w, _ = the_worker(spec_server)  # the totals now: no request is in flight
    sp = w["steps"]["speculation"]
    assert len(spans) >= len(PROMPTS) and all(s.finished for s in spans), spans
    shares = [s.spec for s in spans]
    assert all(x is not None for x in shares), spans
    got = [x for x in shares if x is not None]
    assert sum(x.drafts for x in got) == sp["drafts"] > 0
    assert sum(x.draft_tokens for x in got) == sp["draft_tokens"]
    assert sum(x.accepted_tokens for x in got) == sp["accepted_tokens"] > 0
    assert sum(x.emitted_tokens for x in got) == sp["emitted_tokens"]
    per_pos = [sum(x.accepted_per_position[i] for x in got if i < len(x.accepted_per_position))
               for i in range(K)]  # fmt: skip
    assert per_pos == sp["accepted_per_position"], (per_pos, sp)
    for s in spans:
        x = s.spec
        assert x is not None
        # a request's own counts hold together: every accepted token is at some position, no
        # request verifies drafts on more steps than served it, and it emitted its tokens
        assert sum(x.accepted_per_position) == x.accepted_tokens <= x.draft_tokens, s
        assert x.drafts < s.steps and x.emitted_tokens >= MAX_TOKENS, s
    # not all alike: the prompts draft and accept differently
    assert len({(x.drafts, x.accepted_tokens) for x in got}) > 1, got


def test_evidence_records_speculation_method_k_and_runner(
    spec_tree: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    w, _ = spec_tree
    sp = w["steps"]["speculation"]
    assert (sp["on"], sp["method"], sp["num_speculative_tokens"]) == (True, "ngram", K)
    assert len(sp["accepted_per_position"]) == K
    assert w["runner"]["class"] == V1_CPU_RUNNER
    # the same facts in the report the agent sends (through the wire format)
    report = wire.process_from_json(w["report"])
    assert report.steps is not None and report.steps.spec is not None
    assert (report.steps.spec.method, report.steps.spec.drafts) == ("ngram", sp["drafts"])
    # on this CPU build vLLM says why it runs V1: no Triton (logged in the worker itself)
    log = [x["message"] for x in w["runner"]["log"]]
    assert any("using the V1 model runner instead" in m for m in log), log


def test_inspect_shows_speculation_and_vllm_runner_line(spec_server: VllmServer) -> None:
    out = verifier_cli("inspect", "--pid", str(spec_server.pid), "--tree")
    assert out.returncode == 0, out.stderr
    spec = [line for line in out.stdout.splitlines() if line.startswith("  spec ")]
    assert len(spec) == 1 and spec[0].split()[1:4] == ["ngram", "k", str(K)], spec
    assert "  vllm log WARNING " in out.stdout


def test_runner_switch_finding_names_the_cause_vllm_logged(
    spec_tree: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    """A policy that expects the V2 runner: the finding says why vLLM runs V1 here, in its own
    words, and that the process runs ngram speculation."""
    _, procs = spec_tree
    v = judge(
        procs, f'version = 1\n[runner]\nexpect_class = "{V2_CPU_RUNNER}"\n{PRISTINE_VLLM_CPU}'
    )
    assert v.verdict == Verdict.FAIL
    (f,) = [f for f in v.findings if f.id == F.RUNNER_UNEXPECTED]
    assert "using the V1 model runner instead" in f.context["cause"], f.context
    assert f"; cause: {f.context['cause']} (vLLM WARNING" in f.message, f.message
    assert f.context["speculation"] == "ngram"


def judge(procs: list[dict[str, Any]], policy: str) -> Any:
    reports = [wire.process_from_json(p["report"]) for p in procs]
    snap = TargetSnapshot("t", tuple(reports), time.time())
    return load_policy(policy).evaluate_target(snap, now=snap.received_unix)


def hooks_policy(*names: str, on: str = "decode") -> str:
    body = "version = 1\n"
    for name in names:
        body += f'[[hooks]]\nname = "{name}"\non = "{on}"\n'
    return body + PRISTINE_VLLM_CPU


def test_drafter_and_rejection_sampler_fire_on_decode_steps(
    spec_tree: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    w, procs = spec_tree
    decode = w["steps"]["decode"]
    propose, reject = hook_by_name(w, "propose"), hook_by_name(w, "reject")
    assert propose["status"] == reject["status"] == "firing", (propose, reject)
    # the ngram drafter proposes after every sampled step, inside sample_tokens
    assert propose["fired_on_decode_steps"] >= decode > 0, (propose, decode)
    # with a speculative config the V1 runner samples every step through the rejection
    # sampler (a step without drafts verifies zero of them), so it fires once per step,
    # on every step that verified drafts among them
    spec_steps = w["steps"]["speculation"]["steps"]
    assert reject["fired_on_decode_steps"] == decode >= spec_steps > 0, (reject, spec_steps)
    assert reject["fired_on_productive_steps"] == w["steps"]["productive"], reject
    v = judge(procs, hooks_policy("propose", "reject"))
    assert v.verdict == Verdict.PASS, v.findings
    firing = sorted(f.context["hook"] for f in v.findings if f.id == F.HOOK_FIRING)
    assert firing == ["propose", "reject"], v.findings
    # torch's and setuptools' loaders warn in every honest vLLM process (test_unfiled.py)
    loaders = [f for f in v.findings if f.id == DRIFT_MODULE_CUSTOM_LOADER]
    assert all(f.severity == Severity.WARNING for f in loaders), loaders
    modules = {e["module"] for f in loaders for e in f.context["entries"]}
    assert modules <= HONEST_CUSTOM_LOADERS, modules
    assert [f.id for f in v.findings if f.severity != Severity.INFO and f not in loaders] == []


# -- negative control: the shared session server runs without speculation ---------------------


@pytest.fixture(scope="module")
def unspeculated(vllm_server: VllmServer) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The shared server (no speculation), once it served a repetitive prompt (what the ngram
    drafter would have matched) and another: its worker's inspect document, and the tree's."""
    vllm_server.complete("one two three one two three one two three", max_tokens=12)
    vllm_server.complete("negative control for the speculative hooks", max_tokens=6)
    return the_worker(vllm_server)


def test_without_speculation_the_evidence_says_off_and_counts_nothing(
    vllm_server: VllmServer, unspeculated: tuple[dict[str, Any], list[dict[str, Any]]]
) -> None:
    w, _ = unspeculated
    sp = w["steps"]["speculation"]
    assert sp is not None and sp["on"] is False, sp
    assert (sp["drafts"], sp["draft_tokens"], sp["accepted_tokens"], sp["steps"]) == (0, 0, 0, 0)
    assert w["steps"]["decode"] > 0
    theirs = spec_metrics(vllm_server)
    assert (theirs["drafts"], theirs["draft_tokens"]) == (0, 0), theirs


def test_speculative_hooks_fail_without_speculation(
    unspeculated: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    """The drafter's and the rejection sampler's hooks in a server without speculation: never
    PASS. The rejection sampler's module is imported by the V1 runner but the class is never
    instantiated; the ngram drafter's module may never be imported at all."""
    w, procs = unspeculated
    reject, propose = hook_by_name(w, "spec_reject"), hook_by_name(w, "spec_propose")
    assert (reject["fired"], propose["fired"]) == (0, 0)
    assert reject["status"] == "not_instantiated", reject
    assert propose["status"] in ("not_loaded", "not_instantiated"), propose
    for name, expected in (
        ("spec_reject", {F.HOOK_NOT_INSTANTIATED}),
        ("spec_propose", {F.HOOK_NOT_LOADED, F.HOOK_NOT_INSTANTIATED}),
    ):
        v = judge(procs, hooks_policy(name))
        assert v.verdict == Verdict.FAIL, (name, v.findings)
        errors = {f.id for f in v.findings if f.severity == Severity.ERROR}
        assert errors and errors <= expected, (name, errors)


def test_audit_request_shows_a_request_s_speculation_through_agent_and_verifier(
    spec_server: VllmServer, tmp_path: Path
) -> None:
    """Which drafts served which request, end to end: a client's request on the speculative
    server, the real agent reading its bindings, the real verifier storing them over gRPC,
    and ``verifier audit request <X-Request-Id>`` naming its speculation counts."""
    client = f"spec-audit-{uuid.uuid4().hex[:8]}"
    with local_verifier(tmp_path) as v:
        v.agent("spec-0", spec_server.pid)
        spec_server.complete(PROMPTS[0], max_tokens=MAX_TOKENS, headers={"X-Request-Id": client})
        deadline = time.monotonic() + 60
        while True:
            out = verifier_cli("audit", "request", client, "--db", str(v.db), "--json")
            if out.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert out.returncode == 0, out.stderr + v.logs()
        (served,) = json.loads(out.stdout)
        sp = served["spec"]
        assert sp is not None and sp["drafts"] > 0 and sp["emitted"] >= MAX_TOKENS, served
        assert sum(sp["pos"]) == sp["accepted"] <= sp["draft_tokens"], sp
        assert served["external_ids"] == [f"cmpl-{client}-0"], served
        text = verifier_cli("audit", "request", client, "--db", str(v.db))
        assert f"speculation: {sp['drafts']} draft(s), {sp['draft_tokens']} draft tokens" in (
            text.stdout
        ), text.stdout
        ok = verifier_cli("audit", "verify", "--db", str(v.db))
        assert ok.returncode == 0, ok.stdout + ok.stderr
