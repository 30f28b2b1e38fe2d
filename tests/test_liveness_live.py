"""Liveness by phase against the real vLLM server (CPU): prefill and decode steps and tokens,
hook fires on each, fires outside steps (start-up), and the policy judging hooks on decode
steps. Counts are compared as differences around requests this test sends, so other tests'
requests on the shared server do not matter."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from servewitness import wire
from servewitness.model import ProcessReport
from servewitness.policy import TargetSnapshot, load_policy
from servewitness.policy import findings as F
from servewitness.testing.vllm_server import VllmServer
from tests.helpers import PRISTINE_VLLM_CPU, hook_by_name, inspect_json

pytestmark = pytest.mark.vllm

MAX_TOKENS = 6


def worker(server: VllmServer) -> dict[str, Any]:
    (w,) = [p for p in inspect_json(server.pid, tree=True) if p["role"] == "worker"]
    return w


@pytest.fixture(scope="module")
def around(vllm_server: VllmServer) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The worker before and after three sequential requests, and their usage."""
    before = worker(vllm_server)
    usage = [
        vllm_server.complete(f"phase accounting {i}", max_tokens=MAX_TOKENS)["usage"]
        for i in range(3)
    ]
    return before, worker(vllm_server), usage


def delta(before: dict[str, Any], after: dict[str, Any], key: str) -> int:
    return int(after["steps"][key]) - int(before["steps"][key])


def test_prefill_and_decode_tokens_match_what_the_server_served(
    around: tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]],
) -> None:
    before, after, usage = around
    prompt = sum(u["prompt_tokens"] for u in usage)
    completion = sum(u["completion_tokens"] for u in usage)
    assert delta(before, after, "prefill_tokens") == prompt
    # the prefill step samples each request's first token; every other one is a decode step
    assert delta(before, after, "decode_tokens") == completion - len(usage)
    assert delta(before, after, "decode") == completion - len(usage)  # one request at a time
    assert delta(before, after, "prefill") == len(usage)
    assert delta(before, after, "prefill_tokens") + delta(before, after, "decode_tokens") == delta(
        before, after, "tokens_scheduled"
    )


def test_empty_steps_are_the_steps_that_scheduled_nothing(
    around: tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]],
) -> None:
    before, after, _ = around
    assert delta(before, after, "productive") > 0
    assert delta(before, after, "empty") == delta(before, after, "total") - delta(
        before, after, "productive"
    )
    s = after["steps"]
    assert s["empty"] == s["total"] - s["productive"]


def test_dummy_steps_are_reported_apart_and_none_ran_on_this_server(
    around: tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]],
) -> None:
    """Dummy steps (the runner's _dummy_run: profiling, compile warm-up, graph capture) are
    counted apart from steps. This server runs none: CPUWorker skips its warm-up forward
    when eager with an explicit KV-cache size (--enforce-eager --kv-cache-memory-bytes), and
    on the CPU eager it would return before any forward anyway. The warm-up stage did run
    (the `warm` hook fired), so zero is a count, not a blind spot; a real request never
    counts as one. (Dummy counting itself: tests/test_step_accounting.py, fake runners.)"""
    before, after, _ = around
    assert before["steps"]["dummy"] == after["steps"]["dummy"] == 0
    assert hook_by_name(after, "warm")["fired"] == 1


def test_graph_mode_is_recorded_with_the_counts(
    around: tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]],
) -> None:
    graph = around[1]["steps"]["graph"]
    assert graph["enforce_eager"] is True  # the test server runs --enforce-eager
    assert graph["compilation_mode"] == "NONE"
    assert graph["device"] == "cpu"


def test_step_hook_fires_once_per_decode_and_prefill_step(
    around: tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]],
) -> None:
    before, after, _ = around
    b, a = hook_by_name(before, "v1_step"), hook_by_name(after, "v1_step")
    assert a["fired_on_decode_steps"] - b["fired_on_decode_steps"] == delta(before, after, "decode")
    assert a["fired_on_prefill_steps"] - b["fired_on_prefill_steps"] == delta(
        before, after, "prefill"
    )
    assert a["fired_outside_steps"] == 0  # a step method fires only inside steps


def test_start_up_hook_fires_only_outside_steps(
    around: tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]],
) -> None:
    load = hook_by_name(around[1], "v1_load")
    assert load["fired"] >= 1
    assert load["fired_outside_steps"] == load["fired"]
    assert (load["fired_on_decode_steps"], load["fired_on_prefill_steps"]) == (0, 0)


@pytest.fixture(scope="module")
def tree(
    vllm_server: VllmServer, around: tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]
) -> tuple[ProcessReport, ...]:
    """The server's reports (``inspect --tree``, one full read: about 6 s) once ``around``'s
    requests ran; the tests below judge them under policies of their own."""
    return tuple(wire.process_from_json(p["report"]) for p in inspect_json(vllm_server.pid, True))


def judged(tree: tuple[ProcessReport, ...], policy: str) -> list[tuple[str, dict[str, Any]]]:
    snap = TargetSnapshot("cpu", tree, time.time())
    v = load_policy(policy).evaluate_target(snap, now=snap.received_unix)
    return [(f.id, dict(f.context)) for f in v.findings]


def hook_policy(name: str, on: str) -> str:
    return f'version = 1\n[[hooks]]\nname = "{name}"\non = "{on}"\n{PRISTINE_VLLM_CPU}'


def test_hook_that_fires_only_at_start_up_fails_on_decode(tree: tuple[ProcessReport, ...]) -> None:
    found = judged(tree, hook_policy("v1_load", "decode"))
    (hit,) = [c for i, c in found if i == F.HOOK_OUTSIDE_STEPS_ONLY]
    assert hit["fired_outside_steps"] == hit["fired"] >= 1 and hit["decode_steps"] > 0


def test_hook_that_fires_only_during_warm_up_fails_on_decode(
    tree: tuple[ProcessReport, ...],
) -> None:
    """A hook on the worker's warm-up method (compile_or_warm_up_model: once, after the KV
    cache exists and before the first step) fired, yet never on a decode step: FAIL, with its
    fired count and the step counts beside it."""
    found = judged(tree, hook_policy("warm", "decode"))
    (hit,) = [c for i, c in found if i == F.HOOK_OUTSIDE_STEPS_ONLY]
    assert hit["hook"] == "warm" and hit["target"].endswith("CPUWorker.compile_or_warm_up_model")
    assert hit["fired"] == hit["fired_outside_steps"] == 1
    assert (hit["fired_decode"], hit["fired_prefill"], hit["fired_productive"]) == (0, 0, 0)
    assert hit["decode_steps"] > 0 and hit["productive_steps"] >= hit["decode_steps"]
    assert hit["total_steps"] >= hit["productive_steps"]
    assert [i for i, _ in found if i.startswith("liveness.hook")] == [F.HOOK_OUTSIDE_STEPS_ONLY]


def test_step_hook_passes_on_decode_with_fires_equal_to_decode_steps(
    tree: tuple[ProcessReport, ...],
) -> None:
    found = judged(tree, hook_policy("v1_step", "decode"))
    assert [i for i, _ in found if i.startswith("liveness.")] == [F.HOOK_FIRING]
    (c,) = [c for i, c in found if i == F.HOOK_FIRING]
    assert c["fired_decode"] == c["decode_steps"] > 0


def test_hook_on_a_class_never_instantiated_fails_on_decode(
    tree: tuple[ProcessReport, ...],
) -> None:
    found = judged(tree, hook_policy("v2_step", "decode"))
    assert F.HOOK_NOT_INSTANTIATED in [i for i, _ in found]


def test_copy_of_a_report_with_decode_fires_removed_fails(tree: tuple[ProcessReport, ...]) -> None:
    """The negative control for the PASS above: the same real evidence with the decode fires
    taken away is a FAIL (fire_ratio_low), not a pass."""
    reports = list(tree)
    w = next(r for r in reports if r.role == "worker")
    hooks = tuple(
        dataclasses.replace(h, fired_decode=h.fired_decode // 2) if h.name == "v1_step" else h
        for h in w.hooks
    )
    reports = [dataclasses.replace(r, hooks=hooks) if r is w else r for r in reports]
    snap = TargetSnapshot("cpu", tuple(reports), time.time())
    v = load_policy(hook_policy("v1_step", "decode")).evaluate_target(snap, now=time.time())
    assert F.HOOK_FIRE_RATIO_LOW in [f.id for f in v.findings]


def test_device_counter_on_the_model_forward_keeps_pace_with_its_fires(
    around: tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]],
) -> None:
    """Eager on the CPU, the device-side count (a tensor op in the forward) and the Python
    fire count must agree; the forward runs once per productive step."""
    before, after, _ = around
    b, a = hook_by_name(before, "fwd_dev"), hook_by_name(after, "fwd_dev")
    assert a["device"] == "cpu"
    assert a["device_fired"] == a["fired"] > 0
    assert a["fired"] - b["fired"] == delta(before, after, "productive")
    # the base read right after the first productive step: what the policy's count = "device"
    # judges is the advance since, on the productive steps since
    assert a["device_base_step"] >= 1 and a["device_base"] >= 1
    steps_since = after["steps"]["productive"] - a["device_base_step"]
    assert a["device_fired"] - a["device_base"] == steps_since


def test_first_hit_hook_fired_once_inside_a_step_and_passes(
    around: tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]],
    tree: tuple[ProcessReport, ...],
) -> None:
    first = hook_by_name(around[1], "v1_first")
    assert first["fired"] == 1  # however many steps ran since
    assert first["fired_outside_steps"] == 0 and first["first_step"] >= 1  # inside a step
    found = judged(tree, 'version = 1\n[[hooks]]\nname = "v1_first"\n' + PRISTINE_VLLM_CPU)
    assert [i for i, _ in found if i.startswith("liveness.")] == [F.HOOK_FIRING]
