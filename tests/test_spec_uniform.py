"""Speculation counted without a Python loop over the requests where the batch is uniform
(every request drafted the configured number of tokens, none invalidated, every one sampled):
the process's totals from one pass over the sampled tokens, each request's share settled once
per run of such steps. Both must equal what counting request by request gives, on simulated
schedules that mix uniform steps with every kind of step that is not (fewer drafts, grammar-
invalidated drafts, a prefill beside the drafts, a drafted request with nothing sampled,
requests arriving, finishing and changing places), through the probe's real step wrappers.
The sampled tokens may come as a numpy array (the V2 runner): never tested for truth."""

from __future__ import annotations

import functools
import random
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from servewitness_probe import _bindings, _core, _spec, _specshare, _vllm
from servewitness_probe import layout as L

from tests.helpers import fresh_probe, spec_worker
from tests.test_step_split_fold import reference_records

K = 3


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fresh counters, request bindings on without the writer thread; any probe error fails."""
    monkeypatch.setattr(_core, "state", lambda mode="lazy": types.SimpleNamespace(
        remember=lambda rec: None))  # fmt: skip
    monkeypatch.setattr(_vllm, "_bind_step", _bindings.step)
    monkeypatch.setattr(_vllm, "_spec_on", False)
    monkeypatch.setattr(_spec, "BIND", _bindings.spec_step)
    monkeypatch.setattr(_spec, "_pending", None)
    monkeypatch.setattr(_bindings, "_hooks", [(), ()])
    with fresh_probe(monkeypatch):
        yield


class Looked(dict[str, int]):
    """req_id_to_index that counts the requests looked up one by one."""

    looked = 0

    def get(self, key: str, default: Any = None) -> Any:
        Looked.looked += 1
        return super().get(key, default)

    def __getitem__(self, key: str) -> int:
        Looked.looked += 1
        return super().__getitem__(key)

    def items(self) -> Any:
        Looked.looked += len(self)
        return super().items()


def worker() -> Any:
    return spec_worker("ngram", K)


def schedule(seed: int, steps: int, batch: int, as_array: bool) -> Iterator[tuple[Any, Any]]:
    """(scheduler output, runner output) of a simulated vLLM with speculation: BATCH
    requests decode drafting K tokens, mostly uniformly; now and then one drafts fewer, has a
    draft invalidated, samples nothing, or a request finishes (announced next step) and a new
    one prefills beside the drafts; the output's order changes now and then. AS_ARRAY: a
    uniform step's sampled tokens come as one numpy array (rows of equal length)."""
    rnd = random.Random(seed)  # noqa: S311 - a reproducible simulation, not a secret
    serial = batch
    live = [f"r{i}" for i in range(batch)]
    counts0 = dict.fromkeys(live, 8)
    new0 = [types.SimpleNamespace(req_id=r, prompt_token_ids=[0] * 8, num_computed_tokens=0,
                                  prefill_token_ids=None) for r in live]  # fmt: skip
    yield out_pair(counts0, new0, {}, None, set(), sampled={r: [1] for r in live}, order=live)
    finished: set[str] = set()
    for _ in range(steps):
        counts: dict[str, int] = {}
        spec: dict[str, list[int]] = {}
        invalid: dict[str, int] | None = None
        sampled: dict[str, list[int]] = {}
        new = []
        fewer = rnd.choice(live) if rnd.random() < 0.1 else None  # drafts fewer than K
        empty = rnd.choice(live) if rnd.random() < 0.05 else None  # samples nothing
        for rid in live:
            d = K if rid != fewer else rnd.randint(1, K - 1)
            spec[rid] = list(range(d))
            counts[rid] = 1 + d
            sampled[rid] = [7] * (rnd.randint(1, d + 1) if rid != empty else 0)
        if rnd.random() < 0.05:
            rid = rnd.choice(live)
            invalid = {rid: 1}
        if rnd.random() < 0.05:
            serial += 1
            rid = f"r{serial}"
            counts[rid] = 5
            sampled[rid] = [7]
            new.append(types.SimpleNamespace(
                req_id=rid, prompt_token_ids=[0] * 5, num_computed_tokens=0, prefill_token_ids=None
            ))  # fmt: skip
            live.append(rid)
        order = list(sampled)
        if rnd.random() < 0.05:
            rnd.shuffle(order)
        yield out_pair(
            counts, new, spec, invalid, finished, sampled=sampled, order=order, as_array=as_array
        )
        finished = set()
        if rnd.random() < 0.05 and len(live) > 2:
            finished.add(live.pop(rnd.randrange(len(live))))


def out_pair(
    counts: dict[str, int],
    new: list[Any],
    spec: dict[str, list[int]],
    invalid: dict[str, int] | None,
    finished: set[str],
    *,
    sampled: dict[str, list[int]],
    order: list[str],
    as_array: bool = False,
) -> tuple[Any, Any]:
    new_ids = {r.req_id for r in new}
    so = types.SimpleNamespace(
        total_num_scheduled_tokens=sum(counts.values()),
        num_scheduled_tokens=counts,
        scheduled_new_reqs=new,
        scheduled_spec_decode_tokens=spec,
        scheduled_cached_reqs=types.SimpleNamespace(
            req_ids=[r for r in counts if r not in new_ids], resumed_req_ids=set()
        ),
        num_invalid_spec_tokens=invalid,
        finished_req_ids=finished,
    )
    rows = [sampled[r] for r in order]
    tokens: Any = rows
    if as_array and len({len(r) for r in rows}) == 1:
        tokens = np.array(rows, dtype=np.int64)
    out = types.SimpleNamespace(
        req_ids=order, req_id_to_index=Looked({r: i for i, r in enumerate(order)}),
        sampled_token_ids=tokens,
    )  # fmt: skip
    return so, out


def reference(steps: list[tuple[Any, Any]]) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """The process's totals and each request's share, every request looked at in every step
    (as vLLM's scheduler counts)."""
    tot: dict[str, Any] = {
        "drafts": 0,
        "tokens": 0,
        "accepted": 0,
        "emitted": 0,
        "pos": [0] * L.SPEC_POSITIONS,
    }
    per: dict[str, list[int]] = {}
    for so, out in steps:
        spec = so.scheduled_spec_decode_tokens
        invalid = so.num_invalid_spec_tokens or {}
        for rid, i in dict.items(out.req_id_to_index):
            n = len(out.sampled_token_ids[i])
            e = per.setdefault(rid, [0] * (4 + L.SPEC_POSITIONS))
            e[3] += n
            tot["emitted"] += n
            draft = spec.get(rid)
            if not spec or not draft or not n:
                continue
            t = len(draft) - invalid.get(rid, 0)
            for j, v in enumerate((1, t, n - 1)):
                e[j] += v
            tot["drafts"] += 1
            tot["tokens"] += t
            tot["accepted"] += n - 1
            for p in range(min(n - 1, L.SPEC_POSITIONS)):
                e[4 + p] += 1
                tot["pos"][p] += 1
    return tot, per


def totals(c: memoryview) -> dict[str, Any]:
    return {
        "drafts": c[L.S_SPEC_DRAFTS],
        "tokens": c[L.S_SPEC_DRAFT_TOKENS],
        "accepted": c[L.S_SPEC_ACCEPTED],
        "emitted": c[L.S_SPEC_EMITTED],
        "pos": [c[L.S_SPEC_POS_BASE + p] for p in range(L.SPEC_POSITIONS)],
    }


def records() -> list[dict[str, Any]]:
    """The request records (the open ones closed as at exit)."""
    _bindings.fold()
    with _bindings._fold_lock:
        _bindings._close(list(_bindings._open), "open", None)
    recs = list(map(_bindings._record, _bindings._buf))
    _bindings._buf.clear()
    return recs


def shares(recs: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Each request's share as its record carries it."""
    got = {}
    for r in recs:
        s = r["spec"]
        pos = s["pos"] + [0] * (L.SPEC_POSITIONS - len(s["pos"]))
        got[r["id"]] = [s["drafts"], s["draft_tokens"], s["accepted"], s["emitted"], *pos]
    return got


@pytest.mark.parametrize("numpy", [False, True], ids=["bytes", "numpy"])
@pytest.mark.parametrize("as_array", [False, True], ids=["lists", "array"])
@pytest.mark.parametrize("seed", range(3))
def test_counts_equal_counting_request_by_request(
    probe: None, seed: int, as_array: bool, numpy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_specshare, "NUMPY", numpy)
    now = [0]
    clocked = functools.partial(_vllm._count_step, _time_ns=lambda: now[0])
    monkeypatch.setattr(_vllm, "_count_step", clocked)
    w = worker()
    rnd = random.Random(seed)  # noqa: S311 - a reproducible simulation, not a secret
    steps = list(schedule(seed, 300, 24, as_array))
    for t, (so, out) in enumerate(steps, start=1):
        w.queued.append(out)
        now[0] = 1000 * t
        w.execute_model(so)
        w.sample_tokens(None)
        if rnd.random() < 0.1:
            _bindings.fold()  # the writer folds at any point
    assert _spec.K == K
    assert _bindings._epoch > 50  # steady uniform steps took the steady way (under test)
    tot, per = reference(steps)
    assert totals(_core.COUNTERS) == tot
    recs = records()
    # every request's share, the open ones and those closed after a finish alike
    assert {r: e for r, e in shares(recs).items() if r in per} == per
    # and its steps and tokens, as looking at every request in every step gives
    keep = ("id", "s0", "s1", "n", "tok", "t0", "t1", "end")
    got = sorted(({k: r[k] for k in keep} for r in recs), key=lambda r: (r["id"], r["s0"]))
    want = reference_records([(so, t, 1000 * t) for t, (so, _) in enumerate(steps, start=1)])
    assert got == want


@pytest.mark.parametrize("numpy", [False, True], ids=["bytes", "numpy"])
def test_a_steady_uniform_batch_looks_up_no_request(
    probe: None, numpy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """256 requests drafting K each, 50 steps: no request is looked up in the output's index,
    in the step or in the fold, and the fold shares the run out in one pass."""
    monkeypatch.setattr(_specshare, "NUMPY", numpy)
    w = worker()
    ids = [f"q{i}" for i in range(256)]
    steps = [
        out_pair(
            dict.fromkeys(ids, 4),
            [],
            {r: [1, 2, 3] for r in ids},
            None,
            set(),
            sampled={r: [7] * (1 + (i + t) % (K + 1)) for i, r in enumerate(ids)},
            order=ids,
        )
        for t in range(51)
    ]
    Looked.looked = 0
    for so, out in steps:
        w.queued.append(out)
        w.execute_model(so)
        w.sample_tokens(None)
    assert [e[1] for e in _bindings._spec_log] == [K] * len(steps)  # each logged as uniform
    _bindings.fold()
    assert Looked.looked == 0
    assert _bindings._epoch == len(steps) - 1  # all but the first folded as steady steps
    tot, per = reference(steps)
    assert totals(_core.COUNTERS) == tot
    assert shares(records()) == per


def test_an_array_of_sampled_tokens_is_counted_as_its_rows(probe: None) -> None:
    """A step whose sampled tokens are one numpy array counts as the same rows in a list,
    uniform or not (a grammar-invalidated draft takes the request-by-request way)."""
    w = worker()
    ids = ["a", "b"]
    for invalid in (None, {"b": 1}):
        for rows in ([[1, 2], [3, 4]], [[1, 2, 3, 4], [5, 6, 7, 8]]):
            spec = {"a": [1, 2, 3], "b": [1, 2, 3]}
            sampled = dict(zip(ids, rows, strict=True))
            so, out = out_pair({"a": 4, "b": 4}, [], spec, invalid, set(),
                               sampled=sampled, order=ids, as_array=True)  # fmt: skip
            assert isinstance(out.sampled_token_ids, np.ndarray)
            w.queued.append(out)
            w.execute_model(so)
            w.sample_tokens(None)
    assert totals(_core.COUNTERS) == {
        "drafts": 8,
        "tokens": 3 * 4 + 2 * 2 + 2 * 3,  # uniform: 3 each; with b's invalid draft: 3 + 2
        "accepted": 2 * (1 + 1 + 3 + 3),
        "emitted": 2 * (2 + 2 + 4 + 4),
        "pos": [8, 4, 4] + [0] * (L.SPEC_POSITIONS - 3),
    }
