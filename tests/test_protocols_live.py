"""Both execution protocols, and async scheduling, against real vLLM (CPU, the tiny model).

vLLM 0.32's engine core calls the worker's ``execute_model(scheduler_output)``; the runner
either returns the step's output itself (an empty step, a pooling model) or returns None and
leaves the output to a second call, ``sample_tokens(grammar_output)`` (every generating step).
The probe counts one step per ``execute_model`` call, and hook fires in ``sample_tokens``
count in that same step. Each combination the CPU build can run is checked against the
tokens vLLM actually produced:

* two-phase, async scheduling off (``step``): the session's server;
* one-phase on every productive step: the model as a pooling (embedding) model, where
  ``sample_tokens`` is never called;
* async scheduling requested: the CPU platform turns it off (``vllm/platforms/cpu.py`` sets
  ``scheduler_config.async_scheduling = False``), and the evidence records the engine's
  effective protocol rather than the flag.

Not runnable on the CPU build, so not here: the batch queue (``step_with_batch_queue``, the
next batch scheduled before the previous one's output is back). Its two ways in are async
scheduling (turned off, above) and pipeline parallelism; ``--pipeline-parallel-size 2``
starts (with ``VLLM_CPU_OMP_THREADS_BIND='0|1'``) but the first request kills the engine
inside vLLM, with or without the probe: ``AssertionError`` at ``assert
self.intermediate_tensors is not None`` in ``GPUModelRunner.sync_and_gather_intermediate_
tensors`` on the last stage, then ``KeyError`` in ``Scheduler.update_from_output``.

The one-phase empty steps inside a generating run are covered by the direct executor driver
in tests/test_offline_live.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from servewitness.policy import findings as F
from servewitness.testing.vllm_server import VllmServer
from tests import boot_ahead
from tests.helpers import PRISTINE_VLLM_CPU, hook_by_name, inspect_json
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

pytestmark = pytest.mark.vllm

SYNC = {"async_scheduling": False, "batch_queue": 1, "step": "step"}


def hook_policy(*hooks: tuple[str, str], roles: str = "") -> str:
    body = "version = 1\n" + (f"[evidence]\nrequire_probe = [{roles}]\n" if roles else "")
    for name, on in hooks:
        body += f'[[hooks]]\nname = "{name}"\non = "{on}"\n'
    return body + PRISTINE_VLLM_CPU


def fires(before: dict[str, Any], after: dict[str, Any], hook: str, key: str = "fired") -> int:
    return int(hook_by_name(after, hook)[key]) - int(hook_by_name(before, hook)[key])


# -- two-phase, async scheduling off: the session's server ---------------------------------


def test_two_phase_steps_counted_once_and_both_phases_fire_on_every_decode_step(
    vllm_server: VllmServer,
) -> None:
    """Three requests, one at a time: execute_model (hook v1_step) and sample_tokens (hook
    v1_sample) fire once per step each, the step is counted once, and the decode tokens are
    the completion tokens less the one each prefill step sampled."""

    def tree() -> list[dict[str, Any]]:
        return inspect_json(vllm_server.pid, tree=True)

    b = by_role(tree(), "worker")
    usage = [vllm_server.complete(f"two phases {i}", max_tokens=5)["usage"] for i in range(3)]
    procs = tree()
    a = by_role(procs, "worker")
    assert by_role(procs, "engine_core")["engine"] == SYNC
    completion = sum(u["completion_tokens"] for u in usage)
    assert delta(b, a, "prefill") == 3
    assert delta(b, a, "prefill_tokens") == sum(u["prompt_tokens"] for u in usage)
    assert delta(b, a, "decode") == delta(b, a, "decode_tokens") == completion - 3
    # once per step, not once per phase: execute_model on every step (empty ones included),
    # sample_tokens on every productive one
    assert fires(b, a, "v1_step") == delta(b, a, "total")
    assert fires(b, a, "v1_sample") == delta(b, a, "productive") == completion
    for hook in ("v1_step", "v1_sample"):
        assert fires(b, a, hook, "fired_on_decode_steps") == delta(b, a, "decode"), hook
        assert fires(b, a, hook, "fired_on_prefill_steps") == 3, hook
    v = verdict(procs, hook_policy(("v1_step", "decode"), ("v1_sample", "decode")))
    assert ids(v).count(F.HOOK_FIRING) == 2, [(f.id, f.message) for f in v.findings]


# -- one-phase: a pooling model --------------------------------------------------------------


EMBED = boot_ahead.register(
    "offline script, embedding",
    __name__,
    lambda m: OfflineScript(
        m, "embed", {**HOOK_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, "--async-scheduling"
    ),
)


@pytest.fixture(scope="module")
def embed(boot_pool: boot_ahead.BootPool) -> Iterator[OfflineScript]:
    script = boot_pool.take(EMBED)
    try:
        yield script
    finally:
        script.stop()


def test_one_phase_pooling_counts_each_step_once_and_never_calls_sample_tokens(
    embed: OfflineScript,
) -> None:
    """Embedding, one prompt at a time: execute_model returns each output itself, so each
    step is one call; the sample_tokens hook is loaded and its class live, yet never fires:
    a policy that requires it FAILs (not_firing), one on execute_model PASSes."""
    procs = embed.inspect()["processes"]
    w = by_role(procs, "worker")
    s = w["steps"]
    n = len(embed.ready["prompt_tokens"])
    assert w["runner"]["class"] == CPU_RUNNER
    assert (s["prefill"], s["decode"], s["decode_tokens"]) == (n, 0, 0), s
    assert s["prefill_tokens"] == sum(embed.ready["prompt_tokens"]), s
    step, sample = hook_by_name(w, "step"), hook_by_name(w, "sample")
    assert step["fired"] == s["total"] and step["fired_on_prefill_steps"] == n, step
    assert sample["fired"] == 0 and sample["status"] == "not_firing", sample
    ok = verdict(procs, hook_policy(("step", "productive"), roles='"worker"'))
    assert passes(ok), [(f.id, f.message) for f in ok.findings]
    dead = verdict(procs, hook_policy(("sample", "productive"), roles='"worker"'))
    assert dead.verdict.value == "FAIL" and F.HOOK_NOT_FIRING in ids(dead)


def test_async_scheduling_requested_on_the_cpu_is_recorded_as_off(embed: OfflineScript) -> None:
    """The script asked for async_scheduling=True; the CPU platform turned it off. The probe
    records the engine as it runs (no batch queue, ``step``), not the flag."""
    assert embed.ready["async_scheduling"] is False
    assert (embed.ready["batch_queue"], embed.ready["step"]) == (1, "step")
    w = by_role(embed.inspect()["processes"], "worker")
    assert w["engine"] == SYNC
