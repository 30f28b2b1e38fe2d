"""Speculative decoding counted by the probe's step wrappers, without vLLM: fake worker and
runner classes shaped like V1's (``execute_model`` returns nothing, ``sample_tokens`` returns
the runner output), the other protocol (``execute_model`` returns the output itself) and an
asynchronous output. Counts follow vLLM's scheduler (``Scheduler.update_from_output``): per
request with drafts and a non-empty output, one draft, its draft tokens less the invalid ones,
``len(sampled) - 1`` accepted, positions ``0 .. accepted - 1``. With speculation off in the
config nothing is counted, whatever the scheduler output carries."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest
from servewitness_probe import _bindings, _core, _spec, _vllm
from servewitness_probe import layout as L

from servewitness.evidence.probe_reader import _speculation


class FakeState:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def remember(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)


@pytest.fixture
def journal(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeState]:
    st = FakeState()
    errors: list[tuple[str, str]] = []
    counters = memoryview(bytearray(L.SLOT_BYTES * L.N_SLOTS)).cast("Q")
    monkeypatch.setattr(_core, "COUNTERS", counters)
    monkeypatch.setattr(_core, "state", lambda mode="lazy": st)
    monkeypatch.setattr(_core, "report_error", lambda where, msg: errors.append((where, msg)))
    monkeypatch.setattr(_vllm, "_bind_step", None)
    monkeypatch.setattr(_vllm, "_spec_on", False)
    monkeypatch.setattr(_spec, "_pending", None)
    yield st
    assert errors == []


def so(
    counts: dict[str, int],
    spec: dict[str, list[int]] | None = None,
    invalid: dict[str, int] | None = None,
    new: tuple[str, ...] = (),
    finished: tuple[str, ...] = (),
) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        total_num_scheduled_tokens=sum(counts.values()),
        num_scheduled_tokens=counts,
        scheduled_new_reqs=[types.SimpleNamespace(req_id=r) for r in new],
        scheduled_spec_decode_tokens=spec or {},
        scheduled_cached_reqs=types.SimpleNamespace(req_ids=[r for r in counts if r not in new]),
        num_invalid_spec_tokens=invalid,
        finished_req_ids=set(finished),
    )


def output(sampled: dict[str, list[int]]) -> types.SimpleNamespace:
    """A ModelRunnerOutput: req_ids, req_id_to_index, sampled_token_ids."""
    ids = list(sampled)
    return types.SimpleNamespace(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[sampled[r] for r in ids],
    )


def config(spec: Any) -> Any:
    return types.SimpleNamespace(
        speculative_config=spec,
        compilation_config=None,
        model_config=None,
        device_config=None,
    )


NGRAM = types.SimpleNamespace(method="ngram", num_speculative_tokens=3)


class AsyncOut:
    """An AsyncModelRunnerOutput: the output comes from get_output, which vLLM calls later."""

    def __init__(self, out: Any) -> None:
        self.out = out

    def get_output(self) -> Any:
        return self.out


def make_worker(spec: Any, *, two_phase: bool = True) -> Any:
    """A fresh worker class (the probe wraps classes) whose runner returns the queued outputs:
    from sample_tokens (V1's two phases) or from execute_model itself."""

    class Runner:
        vllm_config = config(spec)

        def __init__(self) -> None:
            self.outputs: list[Any] = []

    class Worker:
        def __init__(self) -> None:
            self.model_runner = Runner()

        def execute_model(self, s: Any) -> Any:
            return None if two_phase else self.model_runner.outputs.pop(0)

        def sample_tokens(self, grammar: Any) -> Any:
            return self.model_runner.outputs.pop(0)

    _vllm._wrap_worker_class(Worker)
    return Worker()


def step(w: Any, s: Any, out: Any, *, two_phase: bool = True) -> None:
    w.model_runner.outputs.append(out)
    w.execute_model(s)
    if two_phase:
        w.sample_tokens(None)


def counts(c: memoryview) -> dict[str, Any]:
    return {
        "steps": c[L.S_SPEC_STEPS],
        "drafts": c[L.S_SPEC_DRAFTS],
        "tokens": c[L.S_SPEC_DRAFT_TOKENS],
        "accepted": c[L.S_SPEC_ACCEPTED],
        "emitted": c[L.S_SPEC_EMITTED],
        "unread": c[L.S_SPEC_UNREAD],
        "pos": [c[L.S_SPEC_POS_BASE + i] for i in range(4)],
    }


def serve(w: Any, *, two_phase: bool = True) -> None:
    """A prefill step (no drafts), then two steps with drafts: a accepts 1 of 3, b 2 of 2;
    then a accepts 3 of 3 and b (one draft invalidated by a grammar) 0 of 2."""
    step(w, so({"a": 4, "b": 3}, new=("a", "b")), output({"a": [7], "b": [8]}), two_phase=two_phase)
    step(
        w,
        so({"a": 4, "b": 3}, spec={"a": [1, 2, 3], "b": [4, 5]}),
        output({"a": [1, 9], "b": [4, 5, 6]}),
        two_phase=two_phase,
    )
    step(
        w,
        so({"a": 4, "b": 4}, spec={"a": [1, 2, 3], "b": [4, 5, 6]}, invalid={"b": 1}),
        output({"a": [1, 2, 3, 4], "b": [9]}),
        two_phase=two_phase,
    )


EXPECTED = {
    "steps": 2,
    "drafts": 4,
    "tokens": 3 + 2 + 3 + 2,
    "accepted": 1 + 2 + 3 + 0,
    "emitted": 2 + 5 + 5,
    "unread": 0,
    "pos": [3, 2, 1, 0],
}


def test_v1_two_phase_steps_count_like_the_scheduler(journal: FakeState) -> None:
    w = make_worker(NGRAM)
    serve(w)
    assert counts(_core.COUNTERS) == EXPECTED
    assert [r for r in journal.records if r["k"] == "spec"] == [
        {
            "k": "spec",
            "on": True,
            "method": "ngram",
            "num_speculative_tokens": 3,
            "positions": L.SPEC_POSITIONS,
        }
    ]
    sp = _speculation(journal.records, list(_core.COUNTERS))
    assert sp is not None and sp.on is True and sp.method == "ngram"
    assert (sp.drafts, sp.draft_tokens, sp.accepted_tokens) == (4, 10, 6)
    assert sp.accepted_per_position == (3, 2, 1)  # k = 3 positions


def test_execute_model_returning_the_output_counts_the_same(journal: FakeState) -> None:
    w = make_worker(NGRAM, two_phase=False)
    serve(w, two_phase=False)
    assert counts(_core.COUNTERS) == EXPECTED


def test_an_asynchronous_output_is_counted_when_collected(journal: FakeState) -> None:
    """Async scheduling: sample_tokens returns an AsyncModelRunnerOutput; vLLM's output
    thread calls its get_output later. Nothing is counted before that, everything after."""

    w = make_worker(NGRAM)
    pending = []
    for s, o in (
        (so({"a": 4}, spec={"a": [1, 2, 3]}), output({"a": [1, 2, 5]})),
        (so({"a": 4}, spec={"a": [1, 2, 3]}), output({"a": [1]})),
    ):
        a = AsyncOut(o)
        step(w, s, a)
        pending.append(a)
    assert counts(_core.COUNTERS)["drafts"] == 0
    assert [a.get_output() for a in pending] == [a.out for a in pending]
    got = counts(_core.COUNTERS)
    assert (got["drafts"], got["tokens"], got["accepted"], got["pos"]) == (2, 6, 2, [1, 1, 0, 0])


def test_speculation_off_counts_nothing(journal: FakeState) -> None:
    """Negative control: a config without a speculative config; the same outputs (even a
    scheduler output that carries drafts) leave every speculation slot at zero."""
    w = make_worker(None)
    serve(w)
    assert counts(_core.COUNTERS) == {k: [0] * 4 if k == "pos" else 0 for k in EXPECTED}
    assert [r for r in journal.records if r["k"] == "spec"] == [{"k": "spec", "on": False}]
    sp = _speculation(journal.records, list(_core.COUNTERS))
    assert sp is not None and sp.on is False and sp.accepted_per_position == ()
    assert _core.COUNTERS[L.S_STEPS_PRODUCTIVE] == 3  # the steps themselves were counted


def test_unreadable_config_is_recorded_as_unknown(journal: FakeState) -> None:
    class Runner:
        pass

    assert _spec.config_record(Runner(), object()) == {"k": "spec", "on": None}


def test_drafts_without_sampled_tokens_are_not_counted_but_noted(journal: FakeState) -> None:
    """A request whose output is empty (vLLM skips it too) or absent from the output; a step
    where no drafted request could be read is an unread step."""
    w = make_worker(NGRAM)
    step(w, so({"a": 1}), output({"a": [3]}))  # no drafts: emitted only
    step(w, so({"a": 4, "b": 4}, spec={"a": [1, 2, 3], "b": [1]}), output({"a": [], "c": [5]}))
    got = counts(_core.COUNTERS)
    assert (got["drafts"], got["tokens"], got["emitted"], got["unread"]) == (0, 0, 2, 1)


def test_positions_beyond_the_counted_ones_are_left_out(journal: FakeState) -> None:
    deep = types.SimpleNamespace(method="ngram", num_speculative_tokens=10)
    w = make_worker(deep)
    drafts = list(range(10))
    step(w, so({"a": 11}, spec={"a": drafts}), output({"a": [*drafts, 99]}))
    c = _core.COUNTERS
    assert c[L.S_SPEC_ACCEPTED] == 10
    assert [c[L.S_SPEC_POS_BASE + i] for i in range(L.SPEC_POSITIONS)] == [1] * L.SPEC_POSITIONS
    assert L.S_SPEC_POS_BASE + L.SPEC_POSITIONS <= L.HOOK_BASE  # the slots stay in the header
    sp = _speculation(journal.records, list(c))
    assert sp is not None and len(sp.accepted_per_position) == L.SPEC_POSITIONS


def test_spec_slots_do_not_overlap_other_slots() -> None:
    named = {
        v: k
        for k, v in vars(L).items()
        if k.startswith(("S_", "H_")) and isinstance(v, int) and k != "S_SPEC_POS_BASE"
    }
    pos = set(range(L.S_SPEC_POS_BASE, L.S_SPEC_POS_BASE + L.SPEC_POSITIONS))
    assert not pos & set(named), sorted(pos & set(named))
    assert len(named) == len([k for k in vars(L) if k.startswith(("S_", "H_"))]) - 1


@pytest.fixture
def bindings(journal: FakeState, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Request bindings on, as in a served process, without the writer thread or a file."""
    monkeypatch.setattr(_vllm, "_bind_step", _bindings.step)
    monkeypatch.setattr(_spec, "BIND", _bindings.spec_step)
    monkeypatch.setattr(_bindings, "_start_writer", lambda: None)
    monkeypatch.setattr(_bindings, "_hooks", [(), ()])
    parts = (_bindings._log, _bindings._open, _bindings._spec_log, _bindings._spec_open)
    for part in (*parts, _bindings._buf):
        part.clear()
    yield
    for part in (*parts, _bindings._buf):
        part.clear()


def closed() -> dict[str, dict[str, Any]]:
    """The request records folded so far, by id."""
    _bindings.fold()
    return {r["id"]: r for r in map(_bindings._record, _bindings._buf)}


@pytest.mark.parametrize("two_phase", [True, False], ids=["two-phase", "one-phase"])
def test_each_request_gets_its_share_and_the_shares_add_up_to_the_totals(
    bindings: None, two_phase: bool
) -> None:
    w = make_worker(NGRAM, two_phase=two_phase)
    serve(w, two_phase=two_phase)
    assert closed() == {}  # nothing closes before vLLM announces the finish
    step(w, so({}, finished=("a", "b")), output({}), two_phase=two_phase)
    got = closed()
    assert got["a"]["spec"] == {"drafts": 2, "draft_tokens": 6, "accepted": 4, "emitted": 7,
                                "pos": [2, 1, 1]}  # fmt: skip
    # b: one draft token invalidated by a grammar, none accepted on the second step
    assert got["b"]["spec"] == {"drafts": 2, "draft_tokens": 4, "accepted": 2, "emitted": 5,
                                "pos": [1, 1]}  # fmt: skip
    total = {k: sum(r["spec"][k] for r in got.values()) for k in ("drafts", "accepted", "emitted")}
    assert total == {"drafts": EXPECTED["drafts"], "accepted": EXPECTED["accepted"],
                     "emitted": EXPECTED["emitted"]}  # fmt: skip
    assert sum(r["spec"]["draft_tokens"] for r in got.values()) == EXPECTED["tokens"]
    assert [sum(r["spec"]["pos"][p] if p < len(r["spec"]["pos"]) else 0 for r in got.values())
            for p in range(4)] == EXPECTED["pos"]  # fmt: skip
    assert not _bindings._spec_open and not _bindings._spec_log  # nothing left behind


def test_a_request_closed_at_exit_keeps_its_share(bindings: None) -> None:
    w = make_worker(NGRAM)
    serve(w)
    _bindings.fold()
    with _bindings._fold_lock:
        _bindings._close(list(_bindings._open), "open", _bindings.snapshot())
    got = {r["id"]: r for r in map(_bindings._record, _bindings._buf)}
    assert got["a"]["end"] == "open" and got["a"]["spec"]["accepted"] == 4


def test_without_speculation_a_request_record_has_no_spec(bindings: None) -> None:
    w = make_worker(None)
    step(w, so({"a": 4}, spec={"a": [1, 2]}, new=("a",)), output({"a": [7, 8, 9]}))
    step(w, so({}, finished=("a",)), output({}))
    (rec,) = closed().values()
    assert "spec" not in rec and rec["n"] == 1


def test_an_asynchronous_output_is_shared_out_when_collected(bindings: None) -> None:
    w = make_worker(NGRAM)
    a = AsyncOut(output({"a": [1, 2, 5]}))
    step(w, so({"a": 4}, spec={"a": [1, 2, 3]}, new=("a",)), a)
    a.get_output()  # vLLM collects the output before it can announce the finish
    step(w, so({}, finished=("a",)), output({}))
    assert closed()["a"]["spec"] == {"drafts": 1, "draft_tokens": 3, "accepted": 2,
                                     "emitted": 3, "pos": [1, 1]}  # fmt: skip
