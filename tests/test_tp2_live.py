"""Tensor parallelism 2 on the CPU build: two worker processes (ranks 0 and 1), each with its
own step counts by phase and its own hook counts, judged per rank. (vLLM's CPU backend starts
TP 2 here only with one OpenMP thread set per rank: VLLM_CPU_OMP_THREADS_BIND='0|1'.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import V1_STEP
from tests.helpers import REPO, hook_by_name, inspect_json
from verifier import wire
from verifier.policy import TargetSnapshot, load_policy
from verifier.policy import interface as I
from verifier.testing.server import VllmServer

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def tp2(tiny_model: Path) -> Iterator[tuple[VllmServer, list[dict[str, Any]]]]:
    server = VllmServer(
        tiny_model,
        env={"VLLM_CPU_OMP_THREADS_BIND": "0|1", "VERIFIER_HOOKS": f"step={V1_STEP}"},
        extra_args=("--tensor-parallel-size", "2", "--no-enable-prefix-caching"),
        scratch_parent=REPO / ".scratch",
    )
    server.start()
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
    policy = 'version = 1\n[[hooks]]\nname = "step"\non = "decode"\n'
    v = load_policy(policy).evaluate_target(snap, now=snap.received_unix)
    firing = [f for f in v.findings if f.id == I.HOOK_FIRING]
    assert sorted(f.context["rank"] for f in firing) == [0, 1]
    assert sorted((h.rank, h.fired_decode, h.decode_steps) for h in v.hooks) == [
        (0, 8, 8),
        (1, 8, 8),
    ]
