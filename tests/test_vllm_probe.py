"""The motivating failure, against a real vLLM server on the CPU.

On this CPU build the worker imports the V2 runner module but instantiates the V1 runner
(``CPUModelRunner``, whose step methods live in ``gpu_model_runner.py``). A hook on the V2
runner's step method must therefore read "not firing, because its class was never
instantiated", a hook on the live V1 runner must fire exactly once per step, and a hook in a
user module that vLLM never imports must read "not loaded". Absence of evidence is never a pass.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from servewitness.testing.vllm_server import VllmServer
from tests.conftest import MALFORMED_ENTRY, V1_STEP, V2_STEP
from tests.helpers import hook_by_name, inspect_json, verifier_cli

pytestmark = pytest.mark.vllm

MAX_TOKENS = 8


def _tree(server: VllmServer) -> list[dict[str, Any]]:
    assert server.proc is not None
    return inspect_json(server.proc.pid, tree=True)


def _only(procs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    found = [p for p in procs if p["role"] == role]
    assert len(found) == 1, [(p["pid"], p["role"]) for p in procs]
    return found[0]


@pytest.fixture(scope="module")
def served(vllm_server: VllmServer) -> list[dict[str, Any]]:
    """The tree after a few requests (usage kept for the token accounting test)."""
    for i in range(3):
        vllm_server.complete(f"the engine worker {i} decode", max_tokens=MAX_TOKENS)
    return _tree(vllm_server)


def test_tree_has_one_process_per_role_and_all_are_probed(served: list[dict[str, Any]]) -> None:
    probed = sorted((p["role"], p["rank"]) for p in served if p["probe"]["present"])
    assert probed == [("api_server", None), ("engine_core", None), ("worker", 0)]


def test_live_runner_is_the_v1_cpu_runner_with_hash_of_its_step_file(
    served: list[dict[str, Any]],
) -> None:
    runner = _only(served, "worker")["runner"]
    assert runner["class"] == "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
    assert Path(runner["file"]).name == "gpu_model_runner.py"
    assert runner["sha256"] == hashlib.sha256(Path(runner["file"]).read_bytes()).hexdigest()
    assert (
        runner["methods"]["execute_model"]["class"]
        == "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
    )


def test_only_the_worker_holds_a_runner(served: list[dict[str, Any]]) -> None:
    holders = [p["role"] for p in served if p["runner"]["class"] is not None]
    assert holders == ["worker"]


def test_v2_hook_is_imported_but_dead_and_says_why(served: list[dict[str, Any]]) -> None:
    worker = _only(served, "worker")
    h = hook_by_name(worker, "v2_step")
    assert h["target"] == V2_STEP
    assert (h["module_loaded"], h["instantiated"], h["fired"]) == (True, False, 0)
    assert worker["steps"]["total"] > 0
    assert h["status"] == "not_instantiated"
    assert h["live_runner_is_instance"] is False
    assert "never instantiated" in h["why"]


def test_v1_hook_fires_once_per_productive_step(served: list[dict[str, Any]]) -> None:
    worker = _only(served, "worker")
    h = hook_by_name(worker, "v1_step")
    steps = worker["steps"]
    assert h["target"] == V1_STEP
    assert h["status"] == "firing"
    assert (h["module_loaded"], h["instantiated"], h["live_runner_is_instance"]) == (
        True,
        True,
        True,
    )
    assert steps["productive"] > 0
    assert h["fired_on_productive_steps"] == steps["productive"]
    # The runner's execute_model also runs (and returns at once) on empty steps.
    assert h["fired"] == steps["total"]


def test_steps_and_hooks_advance_together_with_new_requests(vllm_server: VllmServer) -> None:
    before = _only(_tree(vllm_server), "worker")
    usage = [
        vllm_server.complete(f"alpha beta {i} gamma", max_tokens=MAX_TOKENS)["usage"]
        for i in range(4)
    ]
    after = _only(_tree(vllm_server), "worker")
    d_prod = after["steps"]["productive"] - before["steps"]["productive"]
    d_tok = after["steps"]["tokens_scheduled"] - before["steps"]["tokens_scheduled"]
    # Sequential greedy requests: one prefill step, then one decode step per further token.
    assert d_prod == 4 * MAX_TOKENS
    assert d_tok == sum(u["prompt_tokens"] for u in usage) + 4 * (MAX_TOKENS - 1)
    for name in ("v1_step", "v1_sample"):
        fired = [hook_by_name(p, name)["fired_on_productive_steps"] for p in (before, after)]
        assert fired[1] - fired[0] == d_prod, name
    assert hook_by_name(after, "v2_step")["fired"] == 0


def test_user_module_hook_is_not_loaded_anywhere(served: list[dict[str, Any]]) -> None:
    for proc in served:
        if not proc["probe"]["present"]:
            continue
        h = hook_by_name(proc, "user_step")
        assert (h["module_loaded"], h["fired"], h["status"]) == (False, 0, "not_loaded"), proc[
            "role"
        ]


def test_module_only_hook_sees_the_v1_module_only_in_the_worker(
    served: list[dict[str, Any]],
) -> None:
    loaded = {
        p["role"]: hook_by_name(p, "v1_module")["module_loaded"]
        for p in served
        if p["probe"]["present"]
    }
    assert loaded["worker"] is True


def test_malformed_declaration_is_reported_not_raised(served: list[dict[str, Any]]) -> None:
    for proc in served:
        if not proc["probe"]["present"]:
            continue
        msgs = [e["msg"] for e in proc["probe"]["errors"] if e["where"] == "VERIFIER_HOOKS"]
        assert any(MALFORMED_ENTRY in m for m in msgs), proc["role"]


def test_unresolvable_target_is_reported_as_unresolved(served: list[dict[str, Any]]) -> None:
    h = hook_by_name(_only(served, "worker"), "missing_attr")
    assert h["status"] == "unresolved"
    assert "NoSuchRunner" in h["why"]


def test_manifest_records_what_the_worker_loaded(served: list[dict[str, Any]]) -> None:
    worker = _only(served, "worker")
    m = worker["manifest"]
    assert m["digest"].startswith("sha256:") and len(m["digest"]) == 7 + 64
    assert m["files"] > 1000
    assert m["by_origin"].get("load", 0) > 0 and m["by_origin"].get("snapshot", 0) > 0


def test_table_output_explains_dead_hooks(vllm_server: VllmServer) -> None:
    assert vllm_server.proc is not None
    out = verifier_cli("inspect", "--pid", str(vllm_server.proc.pid), "--tree")
    assert out.returncode == 0, out.stderr
    assert "vllm.v1.worker.cpu_model_runner.CPUModelRunner" in out.stdout
    assert "v2_step: not_instantiated: module imported but class" in out.stdout
    assert "user_step: not_loaded" in out.stdout
