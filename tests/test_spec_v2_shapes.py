"""Speculation counted from outputs shaped exactly like vLLM 0.26.0's V2 model runner's
(``vllm/v1/worker/gpu/model_runner.py``, the default there), through the probe's real step
wrappers, counting (``_spec``) and per-request shares (``_specshare`` via ``_bindings``).

What V2 hands over, read from the 0.26.0 wheel's source:

* ``sample_tokens`` returns an ``AsyncOutput`` on every sampling step, with or without
  ``--async-scheduling`` (model_runner.py:1466-1472, 1535); the executor calls its
  ``get_output`` (multiproc_executor.py:944-946, uniproc_executor.py:93-94).
* That ``AsyncOutput`` carries ``sampled_token_ids`` of its own: a numpy int64 array of
  ``[num_reqs, K + 1]`` (``[num_reqs, 1]`` in a step without drafts), copied from the device
  without blocking, each row padded past the request's ``num_sampled`` with whatever the
  device buffer held (``new_empty``), and ``num_sampled_tokens_np``, int32 ``[num_reqs]``
  (async_utils.py:33, 42; rejection_sampler_utils.py:1026-1029; sampler.py:137).
* ``get_output`` waits for the copy and returns the ``ModelRunnerOutput`` built before it:
  ``req_ids`` a list in the batch's order (decodes first: ``sort_batch_req_ids``,
  model_runner.py:1652-1658), ``req_id_to_index`` a dict, ``sampled_token_ids`` the rows'
  ``tolist()`` trimmed to ``num_sampled`` (async_utils.py:49-60, model_runner.py:1457-1464).
* The scheduler's drafts are ``[-1] * K`` placeholders per request (the real drafts stay on the
  device; spec_decode/utils.py:45-51), or, for structured outputs, the drafts with the
  grammar-invalid ones replaced by -1 and counted in ``num_invalid_spec_tokens``
  (scheduler.py:2079-2114).

The expected counts are computed here as vLLM's scheduler counts them
(``Scheduler.update_from_output``, scheduler.py:1671-1705, and
``SpecDecodingStats.observe_draft``, spec_decode/metrics.py:41-47), from the drafts and the
sampled tokens the test builds, not from the probe. The same steps in V1's shape (a
``ModelRunnerOutput`` of lists from ``sample_tokens``) count the same. Negative control: the
probe before this fix raised on the V2 output (its ``or ()`` on the array) or, after a first
attempt, read it as an output without requests (0 drafts)."""

from __future__ import annotations

import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from servewitness_probe import _bindings, _core, _spec, _vllm
from servewitness_probe import layout as L

from tests.helpers import fresh_probe, spec_worker

K = 3  # --speculative-config '{"method": "eagle3", ..., "num_speculative_tokens": 3}'
DECODE_QUERY_LEN = 1 + K  # a decoding request's tokens in a step with drafts
# What a padded slot holds before and after the copy lands: the device buffer is new_empty.
GARBAGE = 0x7EADBEEF


@dataclass
class Step:
    """One engine step as the test builds it: the tokens scheduled per request, the drafts
    the scheduler sent for verification, the grammar-invalid ones, and the tokens the runner
    sampled per request (the verified drafts plus the bonus or correction token)."""

    scheduled: dict[str, int]
    drafts: dict[str, list[int]]
    sampled: dict[str, list[int]]
    invalid: dict[str, int] | None = None
    new: tuple[str, ...] = ()
    prompt: dict[str, int] = field(default_factory=dict)


P = [-1] * K  # V2's placeholder drafts (spec_decode/utils.py:51)

STEPS = [
    # a prefill of four requests: no drafts, one token each ([4, 1] array)
    Step(
        {"a": 8, "b": 6, "c": 7, "d": 5},
        {},
        {"a": [11], "b": [12], "c": [13], "d": [14]},
        new=("a", "b", "c", "d"),
        prompt={"a": 8, "b": 6, "c": 7, "d": 5},
    ),
    # uniform: every request drafts K and samples 1 .. K + 1 ([4, 4] array, padded)
    Step(
        dict.fromkeys("abcd", 1 + K),
        dict.fromkeys("abcd", P),
        {"a": [21], "b": [22, 23], "c": [24, 25, 26], "d": [27, 28, 29, 30]},
    ),
    # uniform again, another mix of acceptances
    Step(
        dict.fromkeys("abcd", 1 + K),
        dict.fromkeys("abcd", P),
        {"a": [31, 32, 33, 34], "b": [35], "c": [36, 37], "d": [38]},
    ),
    # mixed: d drafts fewer (its drafts trimmed to what it is scheduled), e prefills beside
    # the drafts and f is a chunked prefill that samples nothing (num_sampled 0)
    Step(
        {"a": 4, "b": 4, "c": 4, "d": 3, "e": 5, "f": 16},
        {"a": P, "b": P, "c": P, "d": [-1, -1]},
        {"a": [41, 42, 43, 44], "b": [45], "c": [46, 47], "d": [48, 49, 50], "e": [51], "f": []},
        new=("e", "f"),
        prompt={"e": 5, "f": 40},
    ),
    # structured output: b's drafts validated by its grammar, one invalid (padded with -1);
    # f still prefilling, with placeholder drafts and nothing sampled (vLLM skips it)
    Step(
        {"a": 4, "b": 4, "c": 4, "d": 4, "e": 4, "f": 4},
        {"a": [5, 6, 7], "b": [8, 9, -1], "c": P, "d": P, "e": P, "f": P},
        {"a": [61, 62], "b": [63], "c": [64, 65, 66, 67], "d": [68], "e": [69, 70, 71], "f": []},
        invalid={"b": 1},
    ),
]


def vllm_metrics(steps: list[Step]) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """What vLLM's /metrics counts for STEPS (``update_from_output``: a request with drafts and
    tokens generated is one draft, its drafts less the invalid ones are draft tokens,
    ``len(generated) - 1`` are accepted, positions ``0 .. accepted - 1``), plus every token
    generated (emitted), in total and per request: [drafts, draft tokens, accepted, emitted,
    accepted at position 0, 1, ...]."""
    tot: dict[str, Any] = {"drafts": 0, "tokens": 0, "accepted": 0, "emitted": 0,
                           "pos": [0] * L.SPEC_POSITIONS}  # fmt: skip
    per: dict[str, list[int]] = {}
    for s in steps:
        for rid in s.scheduled:
            generated = s.sampled[rid]
            e = per.setdefault(rid, [0] * (4 + L.SPEC_POSITIONS))
            e[3] += len(generated)
            tot["emitted"] += len(generated)
            spec = s.drafts.get(rid)
            if not spec or not generated:
                continue
            tokens = len(spec) - (s.invalid or {}).get(rid, 0)
            accepted = max(len(generated) - 1, 0)
            for j, v in enumerate((1, tokens, accepted)):
                e[j] += v
            tot["drafts"] += 1
            tot["tokens"] += tokens
            tot["accepted"] += accepted
            for p in range(min(accepted, L.SPEC_POSITIONS)):
                e[4 + p] += 1
                tot["pos"][p] += 1
    return tot, per


def scheduler_output(s: Step) -> types.SimpleNamespace:
    """A SchedulerOutput (vllm/v1/core/sched/output.py) with the fields the probe reads."""
    new = [types.SimpleNamespace(req_id=r, prompt_token_ids=[0] * s.prompt[r],
                                 num_computed_tokens=0, prefill_token_ids=None)
           for r in s.new]  # fmt: skip
    return types.SimpleNamespace(
        total_num_scheduled_tokens=sum(s.scheduled.values()),
        num_scheduled_tokens=dict(s.scheduled),
        scheduled_new_reqs=new,
        scheduled_spec_decode_tokens={r: list(d) for r, d in s.drafts.items()},
        scheduled_cached_reqs=types.SimpleNamespace(
            req_ids=[r for r in s.scheduled if r not in s.new], resumed_req_ids=set()
        ),
        num_invalid_spec_tokens=s.invalid,
        finished_req_ids=set(),
    )


def batch_order(scheduled: dict[str, int]) -> list[str]:
    """V2's batch order (``sort_batch_req_ids``, model_runner.py:1652-1658): decodes first."""
    return sorted(scheduled, key=lambda r: (scheduled[r] != DECODE_QUERY_LEN, scheduled[r]))


class V2AsyncOutput:
    """vLLM 0.26.0's ``AsyncOutput`` (vllm/v1/worker/gpu/async_utils.py:12-70) as the probe
    sees it: ``sampled_token_ids`` an int64 array ``[num_reqs, width]`` and
    ``num_sampled_tokens_np`` int32 ``[num_reqs]``, both still being copied (they hold
    garbage until ``get_output``, which is ``copy_event.synchronize()`` and then exactly
    vLLM's trimming), and the ``ModelRunnerOutput`` in ``model_runner_output``."""

    def __init__(self, s: Step) -> None:
        ids = batch_order(s.scheduled)
        width = 1 + K if s.drafts else 1  # rejection sampler or plain sampler
        rows = np.full((len(ids), width), GARBAGE, dtype=np.int64)
        for i, rid in enumerate(ids):
            rows[i, : len(s.sampled[rid])] = s.sampled[rid]
        self._landed: tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]] = (
            rows,
            np.array([len(s.sampled[r]) for r in ids], dtype=np.int32),
        )
        # the device-to-host copy has not landed yet
        self.sampled_token_ids = np.full_like(rows, GARBAGE)
        self.num_sampled_tokens_np = np.full(len(ids), K + 1, dtype=np.int32)
        self.num_nans: npt.NDArray[np.int32] | None = None
        self.logprobs_tensors = None
        self.model_runner_output = types.SimpleNamespace(
            req_ids=ids,
            req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=None,
        )
        self.collected = 0

    def get_output(self) -> Any:
        self.sampled_token_ids[...], self.num_sampled_tokens_np[...] = self._landed
        self.collected += 1
        sampled_token_ids: list[list[int]] = self.sampled_token_ids.tolist()
        num_sampled_tokens: list[int] = self.num_sampled_tokens_np.tolist()
        for token_ids, num_tokens in zip(sampled_token_ids, num_sampled_tokens, strict=True):
            del token_ids[num_tokens:]
        self.model_runner_output.sampled_token_ids = sampled_token_ids
        return self.model_runner_output


def v1_output(s: Step) -> types.SimpleNamespace:
    """V1's ``ModelRunnerOutput`` for the same step: lists, in the scheduler's order."""
    ids = list(s.scheduled)
    return types.SimpleNamespace(
        req_ids=ids,
        req_id_to_index={rid: i for i, rid in enumerate(ids)},
        sampled_token_ids=[list(s.sampled[r]) for r in ids],
    )


def worker() -> Any:
    return spec_worker("eagle3", K)


@pytest.fixture
def errors(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """Fresh counters and request bindings on (without the writer thread); yields the probe
    errors reported (each test asserts there are none)."""
    monkeypatch.setattr(_core, "state", lambda mode="lazy": types.SimpleNamespace(
        remember=lambda rec: None))  # fmt: skip
    monkeypatch.setattr(_vllm, "_bind_step", _bindings.step)
    monkeypatch.setattr(_vllm, "_spec_on", False)
    monkeypatch.setattr(_spec, "BIND", _bindings.spec_step)
    monkeypatch.setattr(_spec, "_pending", None)
    monkeypatch.setattr(_bindings, "_hooks", [(), ()])
    with fresh_probe(monkeypatch):
        got: list[tuple[str, str]] = []
        monkeypatch.setattr(_core, "report_error", lambda where, msg: got.append((where, msg)))
        yield got


def totals(c: memoryview) -> dict[str, Any]:
    return {
        "drafts": c[L.S_SPEC_DRAFTS],
        "tokens": c[L.S_SPEC_DRAFT_TOKENS],
        "accepted": c[L.S_SPEC_ACCEPTED],
        "emitted": c[L.S_SPEC_EMITTED],
        "pos": [c[L.S_SPEC_POS_BASE + p] for p in range(L.SPEC_POSITIONS)],
    }


def shares() -> dict[str, list[int]]:
    """Each request's share as its bindings record carries it (open requests closed as at
    exit)."""
    _bindings.fold()
    with _bindings._fold_lock:
        _bindings._close(list(_bindings._open), "open", None)
    got = {}
    for r in map(_bindings._record, _bindings._buf):
        s = r["spec"]
        pos = s["pos"] + [0] * (L.SPEC_POSITIONS - len(s["pos"]))
        got[r["id"]] = [s["drafts"], s["draft_tokens"], s["accepted"], s["emitted"], *pos]
    _bindings._buf.clear()
    return got


def run_v2(*, lag: int) -> list[V2AsyncOutput]:
    """STEPS through the V2 protocol; each step's ``get_output`` is called LAG steps later
    (0: at once, as the executor does without async scheduling; 1: after the next step ran,
    as the worker's output thread may under ``--async-scheduling``)."""
    w = worker()
    outs: list[V2AsyncOutput] = []
    for t, s in enumerate(STEPS):
        out = V2AsyncOutput(s)
        w.queued.append(out)
        w.execute_model(scheduler_output(s))
        assert w.sample_tokens(None) is out  # the probe hands vLLM its own object back
        outs.append(out)
        if t - lag >= 0:
            outs[t - lag].get_output()
    for out in outs[len(outs) - lag :]:
        out.get_output()
    return outs


def test_the_steps_exercise_every_way() -> None:
    """The expected numbers are not trivial: drafts, partial and full acceptance, an invalid
    draft, a drafted request with nothing sampled, requests without drafts."""
    tot, per = vllm_metrics(STEPS)
    assert tot["drafts"] == 4 + 4 + 4 + 5 == 17
    assert tot["tokens"] == 12 + 12 + 11 + 14 == 49  # d's 2 drafts; b's invalid one
    assert tot["accepted"] == 6 + 4 + 6 + 6 == 22
    assert tot["emitted"] == 4 + 10 + 8 + 11 + 11 == 44
    assert tot["pos"][:4] == [3 + 2 + 3 + 3, 2 + 1 + 2 + 2, 1 + 1 + 1 + 1, 0]
    assert per["f"][:4] == [0, 0, 0, 0]  # prefilling: never a draft, nothing emitted


@pytest.mark.parametrize("lag", [0, 1], ids=["collected-at-once", "async-scheduling"])
def test_v2_async_output_counts_as_vllm_metrics(errors: list[tuple[str, str]], lag: int) -> None:
    outs = run_v2(lag=lag)
    assert errors == []
    assert [o.collected for o in outs] == [1] * len(STEPS)
    tot, per = vllm_metrics(STEPS)
    assert totals(_core.COUNTERS) == tot
    assert _core.COUNTERS[L.S_SPEC_STEPS] == 4  # the steps with drafts
    assert _core.COUNTERS[L.S_SPEC_UNREAD] == 0
    assert shares() == per


def test_nothing_is_counted_before_get_output(errors: list[tuple[str, str]]) -> None:
    """The arrays of an AsyncOutput are not read: until vLLM collects the output (its copy
    has landed then) the step is not counted at all."""
    w = worker()
    s = STEPS[1]
    out = V2AsyncOutput(s)
    w.queued.append(out)
    w.execute_model(scheduler_output(s))
    w.sample_tokens(None)
    assert totals(_core.COUNTERS) == {"drafts": 0, "tokens": 0, "accepted": 0, "emitted": 0,
                                      "pos": [0] * L.SPEC_POSITIONS}  # fmt: skip
    out.get_output()
    assert totals(_core.COUNTERS) == vllm_metrics([s])[0]
    assert errors == []


def test_v1_shape_of_the_same_steps_counts_the_same(errors: list[tuple[str, str]]) -> None:
    w = worker()
    for s in STEPS:
        w.queued.append(v1_output(s))
        w.execute_model(scheduler_output(s))
        w.sample_tokens(None)
    assert errors == []
    tot, per = vllm_metrics(STEPS)
    assert totals(_core.COUNTERS) == tot
    assert shares() == per


@pytest.mark.parametrize("steps", [STEPS[1:2], STEPS[3:5]], ids=["uniform", "mixed"])
def test_count_takes_array_rows_once(
    errors: list[tuple[str, str]], steps: list[Step], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``count`` on a ModelRunnerOutput whose sampled tokens are an array (one row per
    request, rows as long as the tokens sampled: a uniform step with every request sampling
    K + 1, or padded rows read as vLLM would read them) counts what the same lists count."""
    monkeypatch.setattr(_spec, "K", K)
    for s in steps:
        ids = list(s.scheduled)
        full = {r: s.sampled[r] + [0] * (1 + K - len(s.sampled[r])) for r in ids}
        arr = types.SimpleNamespace(
            req_ids=ids,
            req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=np.array([full[r] for r in ids], dtype=np.int64),
        )
        _spec.count(scheduler_output(s), arr)
    assert errors == []
    as_full = [Step(s.scheduled, s.drafts, {r: [0] * (1 + K) for r in s.scheduled}, s.invalid)
               for s in steps]  # fmt: skip
    assert totals(_core.COUNTERS) == vllm_metrics(as_full)[0]


def test_negative_control_the_old_reads_of_a_v2_output() -> None:
    """The probe before this fix, on the same object: its first version's ``or ()`` on the
    output's ``sampled_token_ids`` raised the error the H200 run recorded on every step; the
    next version (``sampled is None`` before looking for ``get_output``) counted the
    AsyncOutput itself, which has no ``req_id_to_index``: every drafted request is missing
    from an empty index, so 0 drafts."""
    out = V2AsyncOutput(STEPS[1])
    with pytest.raises(ValueError, match="truth value of an array with more than one element"):
        _ = getattr(out, "sampled_token_ids", None) or ()
    assert getattr(out, "sampled_token_ids", None) is not None  # the old test for async
    assert getattr(out, "req_id_to_index", None) is None
    one_request = V2AsyncOutput(Step({"a": 8}, {}, {"a": [5]}))
    assert bool(one_request.sampled_token_ids)  # a [1, 1] array passed: the few tokens it read
