"""Tensor parallelism 2 on the CPU build: two worker processes (ranks 0 and 1), each with its
own step counts by phase and its own hook counts, judged per rank. (vLLM's CPU backend starts
TP 2 here only with one OpenMP thread set per rank: VLLM_CPU_OMP_THREADS_BIND='0|1'.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servewitness import wire
from servewitness.policy import TargetSnapshot, load_policy
from servewitness.policy import findings as F
from servewitness.testing.vllm_server import VllmServer
from tests import boot_ahead
from tests.conftest import V1_STEP
from tests.helpers import PRISTINE_VLLM_CPU, REPO, hook_by_name, inspect_json

pytestmark = pytest.mark.vllm
RANK0_PLUGIN = REPO / "tests" / "data" / "rank0_plugin"


def _tp2_server(model: Path) -> VllmServer:
    return VllmServer(
        model,
        env={
            "VLLM_CPU_OMP_THREADS_BIND": "0|1",
            "VERIFIER_HOOKS": f"step={V1_STEP},rank0_only=rank0_plugin",
            # a vLLM plugin (entry point in its dist-info) that fires rank0_only on rank 0 only
            "PYTHONPATH": str(RANK0_PLUGIN),
        },
        extra_args=("--tensor-parallel-size", "2", "--no-enable-prefix-caching"),
        scratch_parent=REPO / ".scratch",
    )


TP2_SERVER = boot_ahead.register("tensor parallel 2 server", __name__, _tp2_server)


@pytest.fixture(scope="module")
def tp2(boot_pool: boot_ahead.BootPool) -> Iterator[tuple[VllmServer, list[dict[str, Any]]]]:
    server = boot_pool.take(TP2_SERVER)
    try:
        for i in range(2):
            server.complete(f"tensor parallel {i}", max_tokens=5)
        yield server, inspect_json(server.pid, tree=True)
    finally:
        server.stop()


def workers(procs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((p for p in procs if p["role"] == "worker"), key=lambda p: p["rank"])


def test_two_ranks_each_count_every_step(tp2: tuple[VllmServer, list[dict[str, Any]]]) -> None:
    ranks = workers(tp2[1])
    assert [p["rank"] for p in ranks] == [0, 1]
    assert ranks[0]["pid"] != ranks[1]["pid"]
    for p in ranks:  # both ranks run every step: counted per rank, not summed
        s = p["steps"]
        assert (s["prefill"], s["decode"]) == (2, 2 * 4), (p["rank"], s)
        step = hook_by_name(p, "step")
        assert step["fired_on_decode_steps"] == s["decode"]


def test_policy_judges_each_rank_on_its_own_counts(
    tp2: tuple[VllmServer, list[dict[str, Any]]],
) -> None:
    reports = [wire.process_from_json(p["report"]) for p in tp2[1]]
    snap = TargetSnapshot("tp2", tuple(reports), time.time())
    policy = 'version = 1\n[[hooks]]\nname = "step"\non = "decode"\n' + PRISTINE_VLLM_CPU
    v = load_policy(policy).evaluate_target(snap, now=snap.received_unix)
    firing = [f for f in v.findings if f.id == F.HOOK_FIRING]
    assert sorted(f.context["rank"] for f in firing) == [0, 1]
    assert sorted((h.rank, h.fired_decode, h.decode_steps) for h in v.hooks) == [
        (0, 8, 8),
        (1, 8, 8),
    ]


def test_a_hook_alive_on_rank_0_only_fails_naming_rank_1(
    tp2: tuple[VllmServer, list[dict[str, Any]]],
) -> None:
    """Negative control: rank0_only is loaded in every rank (a module hook) and fired after
    each runner step on rank 0 only (tests/data/rank0_plugin). A policy that requires it on
    the processes that run steps FAILs, naming rank 1 with its step count; rank 0 passes."""
    ranks = workers(tp2[1])
    r0, r1 = (hook_by_name(p, "rank0_only") for p in ranks)
    assert r0["module_loaded"] and r1["module_loaded"]
    assert r0["fired"] == ranks[0]["steps"]["total"] > 0
    assert r1["fired"] == 0
    reports = [wire.process_from_json(p["report"]) for p in tp2[1]]
    snap = TargetSnapshot("tp2", tuple(reports), time.time())
    policy = 'version = 1\n[[hooks]]\nname = "rank0_only"\n' + PRISTINE_VLLM_CPU
    v = load_policy(policy).evaluate_target(snap, now=snap.received_unix)
    assert v.verdict.value == "FAIL"
    errors = [(f.id, f.context["rank"]) for f in v.findings if f.id.startswith("liveness.hook")]
    assert sorted(errors) == [(F.HOOK_FIRING, 0), (F.HOOK_NOT_FIRING, 1)]
    dead = next(f for f in v.findings if f.id == F.HOOK_NOT_FIRING)
    assert "rank 1" in dead.message and dead.context["productive_steps"] > 0
