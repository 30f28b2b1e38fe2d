"""The per-step work that must not grow with the batch: the prefill/decode split of a step
(``_split``: new requests and a small hint, not every continuing request) and the request
bindings' fold (``_bindings``: steady steps touch only what changed). Both must give exactly
what looking at every request gives: checked against a plain reference on simulated vLLM
schedules (chunked prefills, last chunks of one token, drafts of different lengths, requests
skipped for a step, preempted and resumed, an id finished and new in the same step), and by
the number of requests each one looks at. The benchmark's scheduler-output stand-ins are
checked against the installed vLLM's field lists."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import random
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
from servewitness_probe import _bindings, _split

from tests.helpers import REPO, fresh_probe


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fresh private counters, no writer thread, no declared hooks; any probe error fails."""
    with fresh_probe(monkeypatch):
        yield


class Lookups(dict[str, int]):
    """num_scheduled_tokens that counts the requests looked up one by one."""

    looked = 0

    def get(self, key: str, default: Any = None) -> Any:
        Lookups.looked += 1
        return super().get(key, default)


def so(
    counts: dict[str, int],
    new: dict[str, int] | None = None,
    spec: dict[str, list[int]] | None = None,
    resumed: tuple[str, ...] = (),
    finished: tuple[str, ...] = (),
) -> types.SimpleNamespace:
    """A scheduler output with vLLM 0.32's fields: COUNTS per request id; NEW the new
    requests with their prompt lengths (none computed before), the others continue."""
    new = new or {}
    reqs = [types.SimpleNamespace(req_id=r, prompt_token_ids=[0] * p, num_computed_tokens=0,
                                  prefill_token_ids=None) for r, p in new.items()]  # fmt: skip
    return types.SimpleNamespace(
        total_num_scheduled_tokens=sum(counts.values()),
        num_scheduled_tokens=Lookups(counts),
        scheduled_new_reqs=reqs,
        scheduled_spec_decode_tokens=spec or {},
        scheduled_cached_reqs=types.SimpleNamespace(
            req_ids=[r for r in counts if r not in new], resumed_req_ids=set(resumed)
        ),
        finished_req_ids=set(finished),
    )


def reference_split(s: Any) -> tuple[int, int]:
    new = {r.req_id for r in s.scheduled_new_reqs}
    pre = dec = 0
    for rid, k in s.num_scheduled_tokens.items():
        if rid not in new and k == 1 + len(s.scheduled_spec_decode_tokens.get(rid, ())):
            dec += k
        else:
            pre += k
    return pre, dec


def split(s: Any) -> tuple[int, int]:
    return _split.split_tokens(s, s.total_num_scheduled_tokens)


# -- the split ---------------------------------------------------------------------------------


def test_a_chunked_prefill_among_256_decodes_is_split_looking_at_a_few_requests(
    probe: None,
) -> None:
    dec = {f"d{i}": 1 for i in range(254)}
    assert split(so({**dec, "a": 64}, new={"a": 128})) == (64, 0 + 254)
    Lookups.looked = 0
    # a's second chunk continues beside the decodes, b is new: only a and b are looked at
    assert split(so({**dec, "a": 64, "b": 64}, new={"b": 128})) == (128, 254)
    assert Lookups.looked <= 3
    # a's last chunk is one token (counted as decode), b continues, c is new
    Lookups.looked = 0
    assert split(so({**dec, "a": 1, "b": 64, "c": 8}, new={"c": 8})) == (72, 255)
    assert Lookups.looked <= 4


def test_a_resumed_request_is_found_without_a_hint(probe: None) -> None:
    dec = {f"d{i}": 1 for i in range(100)}
    Lookups.looked = 0
    assert split(so({**dec, "r": 40}, resumed=("r",))) == (40, 100)
    assert Lookups.looked <= 2


def test_a_missed_hint_costs_one_pass_and_stays_exact(probe: None) -> None:
    dec = {f"d{i}": 1 for i in range(50)}
    # x continues a prefill the probe never saw start: every continuing request is looked at
    Lookups.looked = 0
    assert split(so({**dec, "x": 30})) == (30, 50)
    assert Lookups.looked == 51
    Lookups.looked = 0  # then x is in the hint
    assert split(so({**dec, "x": 30})) == (30, 50)
    assert Lookups.looked <= 2


def test_drafts_of_different_lengths_decode_with_their_requests(probe: None) -> None:
    spec = {"a": [1], "b": [1, 2, 3], "c": [1, 2]}
    assert split(so({"a": 2, "b": 4, "c": 3, "d": 1}, spec=spec)) == (0, 10)
    # b scheduled fewer than 1 + its drafts, e continues a chunk: both prefill
    assert split(so({"a": 2, "b": 2, "c": 3, "e": 9}, spec=spec)) == (11, 5)


# -- simulated schedules -----------------------------------------------------------------------


def schedule(  # noqa: PLR0912 - one simulated scheduler, read top to bottom
    seed: int, steps: int, spec: bool
) -> Iterator[types.SimpleNamespace]:
    """Scheduler outputs of a simulated vLLM: requests arrive with prompts of 1 to 300
    tokens, prefill in chunks of up to 64 (a last chunk may be one token), decode one token
    plus 0 to 3 drafts, are now and then skipped for a step or preempted and resumed (their
    recompute scheduled as a continuing request), and finish (announced in the next step;
    now and then an id comes back as a new request in the step that announces its finish)."""
    rnd = random.Random(seed)  # noqa: S311 - a reproducible simulation, not a secret
    live: dict[str, list[int]] = {}  # id -> [tokens left to prefill, decoded]
    preempted: dict[str, list[int]] = {}
    finished: set[str] = set()
    serial = 0
    for _ in range(steps):
        counts: dict[str, int] = {}
        drafts: dict[str, list[int]] = {}
        resumed: set[str] = set()
        new: dict[str, int] = {}
        for rid, st in list(live.items()):
            if rnd.random() < 0.03:
                continue  # skipped this step (token budget)
            if rnd.random() < 0.01:
                preempted[rid] = live.pop(rid)
                continue
            if st[0] > 0:
                k = min(st[0], rnd.choice((1, 16, 64)))
                st[0] -= k
                counts[rid] = k
            else:
                d = rnd.randint(0, 3) if spec else 0
                counts[rid] = 1 + d
                if d:
                    drafts[rid] = list(range(d))
                st[1] += 1
        if preempted and rnd.random() < 0.2:
            rid, st = preempted.popitem()
            live[rid] = st
            counts[rid], resumed = 10 + st[1], {rid}
        for _ in range(rnd.choice((0, 0, 0, 1, 2))):
            if finished and rnd.random() < 0.3:
                rid = rnd.choice(sorted(finished))  # an id finished now comes back as new
            else:
                serial += 1
                rid = f"r{serial}"
            prompt = rnd.choice((1, 5, 64, 100, 300))
            k = min(prompt, rnd.choice((1, 64)))
            live[rid] = [prompt - k, 0]
            counts[rid], new[rid] = k, prompt
        out = so(counts, new=new, spec=drafts, resumed=tuple(resumed), finished=tuple(finished))
        finished = set()
        for rid in list(live):
            if rid not in new and rid in counts and live[rid][0] == 0 and rnd.random() < 0.05:
                del live[rid]
                finished.add(rid)
        yield out


@pytest.mark.parametrize("spec", [False, True], ids=["decode", "spec"])
@pytest.mark.parametrize("seed", range(6))
def test_split_equals_looking_at_every_request(probe: None, seed: int, spec: bool) -> None:
    for s in schedule(seed, 400, spec):
        assert split(s) == reference_split(s)


def reference_records(steps: list[tuple[Any, int, int]]) -> list[dict[str, Any]]:
    """The bindings records, every request looked at in every step."""
    table: dict[str, list[Any]] = {}
    out = []
    for s, total, now in steps:
        for rid, k in s.num_scheduled_tokens.items():
            e = table.get(rid)
            if e is None:
                table[rid] = [total, total, 1, k, now, now]
            else:
                e[1], e[5] = total, now
                e[2] += 1
                e[3] += k
        for rid in s.finished_req_ids:
            if rid in table:
                out.append((rid, table.pop(rid), "finished"))
    out += [(rid, e, "open") for rid, e in table.items()]
    keys = ("s0", "s1", "n", "tok", "t0", "t1")
    return sorted(
        ({"id": rid, **dict(zip(keys, e, strict=True)), "end": end} for rid, e, end in out),
        key=lambda r: (r["id"], r["s0"]),
    )


def folded_records() -> list[dict[str, Any]]:
    _bindings.fold()
    with _bindings._fold_lock:
        _bindings._close(list(_bindings._open), "open", None)
    keep = ("id", "s0", "s1", "n", "tok", "t0", "t1", "end")
    recs = [{k: r[k] for k in keep} for r in map(_bindings._record, _bindings._buf)]
    return sorted(recs, key=lambda r: (r["id"], r["s0"]))


@pytest.mark.parametrize("spec", [False, True], ids=["decode", "spec"])
@pytest.mark.parametrize("seed", range(6))
def test_bindings_equal_looking_at_every_request(probe: None, seed: int, spec: bool) -> None:
    rnd = random.Random(seed)  # noqa: S311 - a reproducible simulation, not a secret
    steps = []
    for total, s in enumerate(schedule(seed, 400, spec), start=1):
        _bindings.step(s, total, 1000 * total)
        steps.append((s, total, 1000 * total))
        if rnd.random() < 0.2:
            _bindings.fold()  # the writer folds at any point
    _bindings.fold()
    if not spec:
        assert _bindings._epoch > 10  # steps took the steady way (the way under test)
    assert folded_records() == reference_records(steps)


def test_a_steady_step_touches_only_what_changed(probe: None) -> None:
    dec = {f"d{i}": 1 for i in range(256)}
    _bindings.step(so(dec, new=dict.fromkeys(dec, 1)), 1, 1)
    _bindings.step(so(dec), 2, 2)
    _bindings.fold()
    before = {rid: list(e) for rid, e in _bindings._open.items()}
    # d0 finishes, a continues a chunk (new here), b is new: the other 255 are not touched
    _bindings.step(so({**dec, "a": 64}, new={"a": 128}), 3, 3)
    rest = {k: v for k, v in dec.items() if k != "d0"}
    _bindings.step(so({**rest, "a": 64, "b": 8}, new={"b": 8}, finished=("d0",)), 4, 4)
    _bindings.fold()
    assert all(_bindings._open[rid] == before[rid] for rid in rest)
    assert {r["id"]: (r["n"], r["tok"], r["s1"]) for r in folded_records()}["d1"] == (4, 4, 4)


# -- the benchmark's stand-ins -----------------------------------------------------------------


def _vllm_fields() -> dict[str, list[tuple[str, bool]]]:
    """Field names (and whether each has a default) of vLLM's scheduler-output dataclasses,
    read from the installed source without importing vLLM."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    path = f"{next(iter(spec.submodule_search_locations))}/v1/core/sched/output.py"
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return {
        node.name: [
            (item.target.id, item.value is not None)
            for item in node.body
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
        ]
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }


def test_the_benchmark_stand_ins_have_vllms_fields() -> None:
    real = _vllm_fields()
    path = REPO / "bench" / "step_cost.py"
    spec = importlib.util.spec_from_file_location("step_cost_bench", path)
    assert spec is not None and spec.loader is not None
    sys.path.insert(0, str(path.parent))
    try:
        bench = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = bench  # dataclasses look their module up
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(path.parent))
        sys.modules.pop(spec.name, None)
    for name in ("CachedRequestData", "NewRequestData"):
        assert [f.name for f in dataclasses.fields(getattr(bench, name))] == [
            n for n, _ in real[name]
        ]
    mine = [f.name for f in dataclasses.fields(bench.SchedulerOutput)]
    required = [n for n, default in real["SchedulerOutput"] if not default]
    assert mine[: len(required)] == required
    assert set(mine) <= {n for n, _ in real["SchedulerOutput"]}
