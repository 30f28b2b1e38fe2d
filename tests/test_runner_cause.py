"""A runner switch is a finding that names its cause: when the live runner is not the one the
policy expects, ``liveness.runner.unexpected`` carries vLLM's own log line about the choice
(the probe journals the ``vllm`` log records that mention a model runner), from the process
that runs the steps or, failing that, another process of the target; and says "no cause
logged by vLLM" when there is none. Hand-built evidence; the probe's log capture is tested
on real ``logging`` records at the end."""

from __future__ import annotations

import logging
import logging.config
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from servewitness_probe import _core, _spec

from servewitness import wire
from servewitness.model import LogLine, ProcessReport, SpecEvidence, Verdict
from servewitness.policy import findings as F
from tests.test_policy_engine import CPU, V2, api, engine, judge, steps, worker

TRITON = LogLine(
    "WARNING",
    "vllm.config.vllm",
    "Model Runner V2 requires Triton; using the V1 model runner instead.",
)
NGRAM = LogLine(
    "WARNING",
    "vllm.config.vllm",
    "Model Runner V2 does not yet support ngram speculative decoding; using the V1 model "
    "runner instead.",
)
INFO_V2 = LogLine("INFO", "vllm.v1.worker.cpu_worker", "Using V2 Model Runner")
OTHER_WARNING = LogLine(
    "WARNING", "vllm.config.vllm", "Async scheduling is disabled because the V1 model runner ..."
)
EXPECT_V2 = f'[runner]\nexpect_class = "{V2}"\n'


def logged(p: ProcessReport, lines: tuple[LogLine, ...]) -> ProcessReport:
    return replace(p, runner_log=lines)


def unexpected(*procs: ProcessReport) -> Any:
    v = judge(EXPECT_V2, *procs)
    assert v.verdict == Verdict.FAIL
    found = [f for f in v.findings if f.id == F.RUNNER_UNEXPECTED]
    assert len(found) == 1, v.findings
    return found[0]


def test_the_cause_logged_in_the_worker_is_named() -> None:
    f = unexpected(api(), engine(), logged(worker(), (INFO_V2, NGRAM)))
    assert f.message == (
        f"the live runner in worker rank 0 (pid 300) is {CPU}, not the expected {V2}; "
        f"cause: {NGRAM.message} (vLLM WARNING)"
    )
    assert f.context["cause"] == NGRAM.message
    assert (f.context["cause_level"], f.context["cause_logger"]) == ("WARNING", NGRAM.logger)
    assert (f.context["cause_pid"], f.context["cause_role"]) == (300, "worker")


def test_a_cause_logged_only_in_another_process_is_named_with_that_process() -> None:
    """The worker's probe may start after vLLM logged its choice there; the API server reads
    the same config and logs the same line."""
    f = unexpected(logged(api(), (TRITON,)), engine(), worker())
    assert f.message.endswith(f"cause: {TRITON.message} (vLLM WARNING in api_server (pid 100))")
    assert (f.context["cause_pid"], f.context["cause_role"]) == (100, "api_server")


def test_the_worker_own_line_wins_over_another_process() -> None:
    f = unexpected(logged(api(), (TRITON,)), logged(worker(), (NGRAM,)))
    assert f.context["cause"] == NGRAM.message


def test_a_switch_line_wins_over_another_warning() -> None:
    f = unexpected(logged(worker(), (OTHER_WARNING, NGRAM)))
    assert f.context["cause"] == NGRAM.message
    # a warning that mentions a runner but no switch is still the best there is
    f = unexpected(logged(worker(), (OTHER_WARNING,)))
    assert f.context["cause"] == OTHER_WARNING.message


def test_no_cause_logged_says_so() -> None:
    """Negative control: no line at all, or only an INFO line (a statement, not a reason)."""
    for lines in ((), (INFO_V2,)):
        f = unexpected(api(), logged(worker(), lines))
        assert f.message.endswith(f"not the expected {V2}; no cause logged by vLLM"), f.message
        assert f.context["cause"] is None
        assert "cause_pid" not in f.context


def test_the_expected_runner_is_no_finding_whatever_was_logged() -> None:
    """A logged fallback is not a finding by itself: the policy expected the V1 runner."""
    v = judge(f'[runner]\nexpect_class = "{CPU}"\n', logged(worker(), (NGRAM,)))
    assert v.verdict == Verdict.PASS
    assert not [f for f in v.findings if f.id == F.RUNNER_UNEXPECTED]


def test_the_finding_names_the_speculation_method() -> None:
    spec = SpecEvidence(on=True, method="ngram", num_speculative_tokens=3)
    f = unexpected(logged(worker(step=replace(steps(), spec=spec)), (NGRAM,)))
    assert f.context["speculation"] == "ngram"
    f = unexpected(worker(step=replace(steps(), spec=SpecEvidence(on=False))))
    assert f.context["speculation"] is None


def test_runner_log_and_speculation_cross_the_wire() -> None:
    spec = SpecEvidence(
        on=True,
        method="ngram",
        num_speculative_tokens=3,
        steps=5,
        drafts=7,
        draft_tokens=21,
        accepted_tokens=12,
        emitted_tokens=40,
        unread_steps=1,
        accepted_per_position=(6, 4, 2),
    )
    p = logged(worker(step=replace(steps(), spec=spec)), (INFO_V2, NGRAM))
    back = wire.process_from_json(wire.process_to_json(p))
    assert back.runner_log == (INFO_V2, NGRAM)
    assert back.steps is not None and back.steps.spec == spec
    off = worker(step=replace(steps(), spec=SpecEvidence(on=False)))
    back = wire.process_from_json(wire.process_to_json(off))
    assert back.steps is not None and back.steps.spec == SpecEvidence(on=False)
    none = wire.process_from_json(wire.process_to_json(worker()))
    assert none.steps is not None and none.steps.spec is None


# -- the probe's capture of vLLM's log lines ---------------------------------------------------


class Journal:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.errors: list[tuple[str, str]] = []

    def remember(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)


@pytest.fixture
def journal(monkeypatch: pytest.MonkeyPatch) -> Iterator[Journal]:
    j = Journal()
    monkeypatch.setattr(_core, "state", lambda mode="lazy": j)
    monkeypatch.setattr(_core, "report_error", lambda where, msg: j.errors.append((where, msg)))
    monkeypatch.setattr(_spec, "_logged", 0)
    monkeypatch.setattr(_spec, "_factory_installed", False)
    saved = logging.getLogRecordFactory()
    try:
        _spec.install_log_capture()
        yield j
    finally:
        logging.setLogRecordFactory(saved)


def test_log_capture_keeps_vllm_lines_about_the_model_runner(journal: Journal) -> None:
    log = logging.getLogger("vllm.config.vllm")
    log.warning("Model Runner V2 does not yet support %s; using the V1 model runner instead.", "x")
    log.warning("KV cache size is %d", 64)  # not about the runner
    logging.getLogger("other.lib").warning("my model runner")  # not vLLM's
    log.info("the runner of the bench")  # mentions a runner, not a model runner
    assert [(r["k"], r["level"], r["logger"], r["msg"]) for r in journal.records] == [
        (
            "vllm_log",
            "WARNING",
            "vllm.config.vllm",
            "Model Runner V2 does not yet support x; using the V1 model runner instead.",
        )
    ]
    assert journal.errors == []


def test_log_capture_survives_a_logging_reconfiguration(journal: Journal) -> None:
    """vLLM re-applies its dictConfig in child processes (handlers replaced): the record
    factory sees records whatever handlers are configured."""
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "handlers": {"null": {"class": "logging.NullHandler"}},
            "loggers": {"vllm": {"handlers": ["null"], "propagate": False}},
        }
    )
    logging.getLogger("vllm.config.vllm").warning("Using the V1 model runner instead.")
    assert len(journal.records) == 1
    assert journal.errors == []


def test_log_capture_is_bounded_and_never_raises(journal: Journal) -> None:
    log = logging.getLogger("vllm.x")
    for i in range(_spec.LOG_MAX + 10):
        log.warning("model runner line %d", i)
    assert len(journal.records) == _spec.LOG_MAX
    assert journal.errors == []
    _spec._logged = 0
    # a malformed format (getMessage raises): the record is still made, the error journaled
    factory = logging.getLogRecordFactory()
    rec = factory("vllm.x", logging.WARNING, "f.py", 1, "model runner %d %d", (1,), None)
    assert isinstance(rec, logging.LogRecord)
    assert [w for w, _ in journal.errors] == ["vllm_log"]
