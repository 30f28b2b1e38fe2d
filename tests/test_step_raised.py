"""A driver that misuses the two-phase step protocol: ``execute_model`` returns nothing (the
step goes on in ``sample_tokens``), the driver expects a result and calls ``execute_model``
again, and vLLM raises ("sample_tokens() must be called after execute_model() returns None",
``GPUModelRunner.execute_model``). That call ran no step: the probe takes its counts back,
counts it as raised, journals the error, keeps the waiting step open, and the evidence says so
(``inspect`` notes it; the policy warns ``liveness.steps.raised``). Without vLLM: a fake worker
shaped like V1's; the same against real vLLM is in test_offline_live.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from servewitness_probe import _bindings, _core, _spec, _vllm
from servewitness_probe import layout as L

from servewitness.evidence.counters import steps_of
from servewitness.model import Severity, Verdict
from servewitness.policy import findings as F
from tests.test_policy_engine import ids, judge, steps, worker
from tests.test_spec_counts import NGRAM, FakeState, config, journal, output, so

__all__ = ["journal"]  # the fixture, imported for these tests

STATE_ERROR = "State error: sample_tokens() must be called after execute_model() returns None."


def make_worker(spec: Any = None) -> Any:
    """A worker whose runner keeps V1's execute_model state: a second execute_model before
    sample_tokens raises, as vLLM's does."""

    class Runner:
        vllm_config = config(spec)

        def __init__(self) -> None:
            self.state: Any = None

    class Worker:
        def __init__(self) -> None:
            self.model_runner = Runner()

        def execute_model(self, s: Any) -> Any:
            if self.model_runner.state is not None:
                raise RuntimeError(STATE_ERROR)
            self.model_runner.state = s
            return None

        def sample_tokens(self, grammar: Any) -> Any:
            s, self.model_runner.state = self.model_runner.state, None
            return output({r: [1] for r in s.num_scheduled_tokens})

    _vllm._wrap_worker_class(Worker)
    return Worker()


def counted(c: memoryview) -> dict[str, int]:
    return {
        "total": c[L.S_STEPS_TOTAL],
        "productive": c[L.S_STEPS_PRODUCTIVE],
        "empty": c[L.S_STEPS_EMPTY],
        "tokens": c[L.S_TOKENS_SCHEDULED],
        "requests": c[L.S_REQUESTS_SCHEDULED],
        "prefill": c[L.S_STEPS_PREFILL],
        "decode": c[L.S_STEPS_DECODE],
        "raised": c[L.S_STEPS_RAISED],
        "in_step": c[L.S_IN_STEP],
    }


def test_execute_model_twice_is_one_step_and_one_raised_call(journal: FakeState) -> None:
    w = make_worker()
    c = _core.COUNTERS
    first = so({"a": 4}, new=("a",))
    assert w.execute_model(first) is None  # the driver expected the output here
    after_first = counted(c)
    assert after_first["total"] == 1 and after_first["in_step"] == 1
    with pytest.raises(RuntimeError, match="sample_tokens"):
        w.execute_model(so({"a": 1}))  # ... and asks again
    # the raised call is taken back; the first step is still open, waiting for its sample
    assert counted(c) == {**after_first, "raised": 1}
    assert c[L.S_CURRENT_PHASE] & L.PHASE_PREFILL  # the waiting step's phase, put back
    (rec,) = [r for r in journal.records if r["k"] == "step_raised"]
    assert rec["step"] == 2 and rec["error"] == f"RuntimeError: {STATE_ERROR}"
    w.sample_tokens(None)
    assert counted(c) == {**after_first, "raised": 1, "in_step": 0}
    got = steps_of(list(c))
    assert (got.total, got.productive, got.raised) == (1, 1, 1)
    # the next well-formed step counts as usual
    w.execute_model(so({"a": 1}))
    w.sample_tokens(None)
    assert counted(c)["total"] == 2 and counted(c)["decode"] == 1


def test_a_raised_call_leaves_no_bindings_entry_and_no_spec_counts(
    journal: FakeState, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_vllm, "_bind_step", _bindings.step)
    monkeypatch.setattr(_spec, "BIND", None)
    _bindings._log.clear()
    try:
        w = make_worker(NGRAM)
        w.execute_model(so({"a": 4}, new=("a",)))
        with pytest.raises(RuntimeError):
            w.execute_model(so({"a": 4}, spec={"a": [1, 2]}))
        assert [e[0] for e in _bindings._log] == [1]  # only the step that ran
        w.sample_tokens(None)
        assert _core.COUNTERS[L.S_SPEC_DRAFTS] == 0  # the raised call's drafts never ran
        assert _core.COUNTERS[L.S_SPEC_EMITTED] == 1  # the waiting step's output, counted
    finally:
        _bindings._log.clear()


def test_a_process_with_raised_calls_gets_a_warning_naming_the_misuse() -> None:
    w = worker(step=replace(steps(), raised=2))
    v = judge('[[hooks]]\nname = "v1_step"\n', w)
    assert v.verdict == Verdict.PASS  # a warning: the counted steps are still right
    assert ids(v) == [F.STEPS_RAISED]
    (f,) = [f for f in v.findings if f.id == F.STEPS_RAISED]
    assert f.severity == Severity.WARNING and f.context["raised"] == 2
    assert "execute_model again before sample_tokens" in f.message
    assert ids(judge('[[hooks]]\nname = "v1_step"\n', worker())) == []  # control
