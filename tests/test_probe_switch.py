"""The probe's per-step switch (``servewitness_probe._switch``, used by bench/tokens_ab.py): off
puts back the exact methods the probe wrapped, so a step counts nothing and fires nothing;
on puts the probe's wrappers back, so steps count again. On worker and runner classes shaped
like vLLM's two-phase V1 ones, wrapped by the probe's own code (``_vllm`` and ``_hooks``);
bench/tokens_ab.py's smoke checks the same on a real offline vLLM engine (every phase)."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest
from servewitness_probe import _core, _hooks, _vllm
from servewitness_probe import layout as L
from servewitness_probe._switch import Switch, original

HOOK = L.hook_slot(1)


class _State:
    def remember(self, rec: dict[str, Any]) -> None:
        pass


@pytest.fixture
def counters(monkeypatch: pytest.MonkeyPatch) -> Iterator[memoryview]:
    """Fresh private counters; no probe state on disk, no request bindings; a probe error
    fails the test."""
    c = memoryview(bytearray(L.SLOT_BYTES * L.N_SLOTS)).cast("Q")
    errors: list[tuple[str, str]] = []
    monkeypatch.setattr(_core, "COUNTERS", c)
    monkeypatch.setattr(_core, "state", lambda mode="lazy": _State())
    monkeypatch.setattr(_core, "report_error", lambda where, msg: errors.append((where, msg)))
    monkeypatch.setattr(_vllm, "_bind_step", None)
    yield c
    assert errors == []


def decode_step(n: int) -> types.SimpleNamespace:
    counts = {f"r{i}": 1 for i in range(n)}
    return types.SimpleNamespace(
        total_num_scheduled_tokens=n,
        num_scheduled_tokens=counts,
        scheduled_new_reqs=[],
        scheduled_spec_decode_tokens={},
        scheduled_cached_reqs=types.SimpleNamespace(req_ids=list(counts)),
    )


def make_classes() -> tuple[type, type]:
    """A runner whose sample_tokens carries a declared hook, and a two-phase worker."""

    class Runner:
        def execute_model(self, so: Any) -> None:
            return None

        def sample_tokens(self, grammar: Any) -> str:
            return "sampled"

    Runner.sample_tokens = _hooks.counting(Runner.sample_tokens, HOOK)  # type: ignore[method-assign]

    class Worker:
        def __init__(self) -> None:
            self.model_runner = Runner()

        def execute_model(self, so: Any) -> None:
            return self.model_runner.execute_model(so)

        def sample_tokens(self, grammar: Any) -> str:
            return self.model_runner.sample_tokens(grammar)

    return Worker, Runner


def step(worker: Any) -> str:
    assert worker.execute_model(decode_step(4)) is None
    out: str = worker.sample_tokens(None)
    return out


def test_off_runs_no_probe_code_and_on_counts_again(counters: memoryview) -> None:
    """Steps in the off state count nothing and fire nothing, and run the original methods
    (the same objects the probe wrapped); back on, every step counts and fires again."""
    c = counters
    worker_cls, runner_cls = make_classes()
    originals = {
        (worker_cls, "execute_model"): worker_cls.__dict__["execute_model"],
        (worker_cls, "sample_tokens"): worker_cls.__dict__["sample_tokens"],
        (runner_cls, "sample_tokens"): runner_cls.__dict__["sample_tokens"].__wrapped__,
    }
    _vllm._wrap_worker_class(worker_cls)
    w = worker_cls()
    switch = Switch.of([w, w.model_runner])
    assert {(t.owner, t.name): t.original for t in switch.targets} == originals

    assert [step(w) for _ in range(3)] == ["sampled"] * 3
    assert (c[L.S_STEPS_TOTAL], c[L.S_TOKENS_DECODE], c[HOOK]) == (3, 12, 3)

    switch.off()
    assert not switch.is_on
    for (owner, name), fn in originals.items():
        assert owner.__dict__[name] is fn
    assert [step(w) for _ in range(5)] == ["sampled"] * 5
    assert (c[L.S_STEPS_TOTAL], c[L.S_TOKENS_DECODE], c[HOOK]) == (3, 12, 3)  # unchanged

    switch.on()
    assert [step(w) for _ in range(2)] == ["sampled"] * 2
    assert (c[L.S_STEPS_TOTAL], c[L.S_TOKENS_DECODE], c[HOOK]) == (5, 20, 5)
    assert c[L.S_IN_STEP] == 0  # every step closed, across the switches


def test_original_is_under_every_probe_wrapper(counters: memoryview) -> None:
    """A declared hook on the worker's own execute_model, under the probe's step wrapper:
    off puts back the method under both, not the hook."""
    c = counters

    class Worker:
        def execute_model(self, so: Any) -> str:
            return "out"

    bare = Worker.__dict__["execute_model"]
    Worker.execute_model = _hooks.counting(bare, HOOK)  # type: ignore[method-assign]
    _vllm._wrap_worker_class(Worker)
    assert original(Worker.__dict__["execute_model"]) is bare
    switch = Switch.of([Worker()])
    switch.off()
    assert Worker().execute_model(decode_step(1)) == "out"
    assert (Worker.__dict__["execute_model"], c[L.S_STEPS_TOTAL], c[HOOK]) == (bare, 0, 0)
    switch.on()
    assert Worker().execute_model(decode_step(1)) == "out"
    assert (c[L.S_STEPS_TOTAL], c[HOOK]) == (1, 1)


def test_nothing_to_switch_on_classes_the_probe_did_not_wrap() -> None:
    """Negative control: a class the probe never wrapped yields no target, and off() leaves
    it as it was."""

    class Plain:
        def execute_model(self, so: Any) -> str:
            return "out"

    fn = Plain.__dict__["execute_model"]
    switch = Switch.of([Plain()])
    switch.off()
    assert (switch.targets, Plain.__dict__["execute_model"]) == ((), fn)
