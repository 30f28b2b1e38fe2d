"""Speculation per request: each counted speculative step's drafts and sampled tokens, shared
out to its requests off the step, in the bindings writer thread (``fold``, called by
``_bindings`` with its fold lock held, before it folds the steps: a request's counts are all in
when it closes). ``_bindings`` closes an entry of ``_spec_open`` with the request's record.

A run of uniform steps (``_spec._uniform``: every request drafting the configured K) of the
same requests in the same order is shared out in one pass over its requests, whatever its
length (``_fold_uniform``); any other step request by request (``_fold_spec_step``). The
uniform steps' drafts are remembered (``uniform_specs``) so that the steps' fold can take them
as steady steps (every open request scheduled 1 + K tokens).
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any

from servewitness_probe import layout as L

# Speculative steps not folded yet (only while speculation is on): (scheduled_spec_decode_tokens,
# num_invalid_spec_tokens, req_id_to_index, sampled_token_ids) of one step, by reference.
_spec_log: deque[tuple[Any, Any, Any, Any]] = deque()
# Speculation per open request: [drafts, draft tokens, accepted, emitted, accepted at 0, ...].
_spec_open: dict[str, list[int]] = {}
# Uniform speculative steps (``_spec._uniform``) shared out already, by id of their drafts
# (the drafts and how many steps logged them): a steady step may be one (every open request
# scheduled 1 + K tokens).
uniform_specs: dict[int, list[Any]] = {}
UNIFORM_SPECS_MAX = 4096
NUMPY = True  # count a run's columns with numpy where it is imported already (tests: both)


def spec_step(
    spec: Any,
    invalid: Any,
    index: Any,
    sampled: Any,
    _spec_log: deque[tuple[Any, Any, Any, Any]] = _spec_log,
) -> None:
    """Log one speculative step's drafts and sampled tokens (references: vLLM builds them
    anew each step and does not change them afterwards) for ``fold`` to share out per request.
    ``_spec`` calls it where it counts the step, before the step's requests can be announced
    finished (vLLM announces a finish in a later step's scheduler output). A uniform step
    (``_spec._uniform``) comes as (drafts, K, req_ids, one byte per request: tokens
    sampled): every request drafted K and sampled that many."""
    _spec_log.append((spec, invalid, index, sampled))


def fold(count: int) -> None:
    """Share COUNT logged speculative steps out to their requests, as ``_spec`` counts the
    process's totals. Consecutive uniform steps of the same requests in the same order (a
    steady batch) are shared out together, one pass over their requests for the whole run
    (``_fold_uniform``); any other step request by request (``_fold_spec_step``)."""
    log = _spec_log
    run: list[bytes] = []
    run_ids: Any = None
    run_k = 0
    for _ in range(count):
        entry = log.popleft()
        if entry[1].__class__ is int:
            spec, k, ids, lens = entry
            uniform = uniform_specs
            if len(uniform) >= UNIFORM_SPECS_MAX:
                uniform.clear()  # steps taken back, never folded: a hint only
            seen = uniform.get(id(spec))
            if seen is not None and seen[0] is spec:
                seen[1] += 1
            else:
                uniform[id(spec)] = [spec, 1]
            if run and (k != run_k or (ids is not run_ids and ids != run_ids)):
                _fold_uniform(run_ids, run_k, run)
                run = []
            if not run:
                run_ids, run_k = ids, k
            run.append(lens)
            continue
        if run:
            _fold_uniform(run_ids, run_k, run)
            run = []
        _fold_spec_step(*entry)
    if run:
        _fold_uniform(run_ids, run_k, run)


def _fold_uniform(
    ids: list[str], k: int, run: list[bytes], _positions: int = L.SPEC_POSITIONS
) -> None:
    """Share out RUN, uniform steps of requests IDS (each step's sampled-token counts, one
    byte per request in IDS order, each 1 to K + 1), each request drafting K per step: per
    request, one draft and K draft tokens per step, and for each step in which it sampled v
    tokens, v emitted, v - 1 accepted, positions 0 .. v - 2. One Python pass over the
    requests per run, whatever its length (``_by_value`` counts the run's columns)."""
    table = _spec_open
    steps = len(run)
    width = 4 + _positions
    top = min(k, _positions)
    by_value = _by_value(b"".join(run), steps, len(ids), k)
    for j, rid in enumerate(ids):
        e = table.get(rid)
        if e is None:
            e = table[rid] = [0] * width
        at_least = steps  # steps in which the request sampled more than v tokens
        emitted = 0
        for v, counts in enumerate(by_value, start=1):
            m = counts[j]
            emitted += v * m
            at_least -= m
            if at_least and v <= top:
                e[3 + v] += at_least  # position v - 1
        e[0] += steps
        e[1] += steps * k
        e[2] += emitted - steps
        e[3] += emitted


def _by_value(joined: bytes, steps: int, width: int, k: int) -> list[list[int]]:
    """For v = 1 .. K + 1, how many of STEPS rows of JOINED (WIDTH bytes each) hold v, per
    column: with numpy where the process has it already (vLLM's do; the probe never imports
    it), else a strided slice per column counted in C (``bytes.count``)."""
    np = sys.modules.get("numpy") if NUMPY else None
    if np is not None and steps > 1:
        arr = np.frombuffer(joined, dtype=np.uint8).reshape(steps, width)
        return [(arr == v).sum(axis=0).tolist() for v in range(1, k + 2)]
    cols = [joined[j::width] for j in range(width)]
    return [[c.count(v) for c in cols] for v in range(1, k + 2)]


def _fold_spec_step(
    spec: Any, invalid: Any, index: Any, sampled: Any, _positions: int = L.SPEC_POSITIONS
) -> None:
    """Share one logged speculative step out request by request: a request with drafts and
    sampled tokens has one draft, its draft tokens (less invalid ones), ``sampled - 1``
    accepted, positions ``0 .. accepted - 1``; every request in the output has its sampled
    tokens emitted."""
    table = _spec_open
    n_out = len(sampled)
    for rid, i in index.items():
        if i < n_out:
            e = table.get(rid)
            if e is None:
                e = table[rid] = [0] * (4 + _positions)
            e[3] += len(sampled[i])
    if spec is None:
        return
    for rid, draft in spec.items():
        i = index.get(rid)
        if i is None or i >= n_out or not len(draft):
            continue
        n = len(sampled[i])
        if not n:
            continue
        e = table[rid]
        e[0] += 1
        e[1] += len(draft) - (invalid.get(rid, 0) if invalid else 0)
        e[2] += n - 1
        for p in range(min(n - 1, _positions)):
            e[4 + p] += 1


def uniform_step(drafts: Any) -> bool:
    """Whether DRAFTS (a logged step's) are those of a uniform speculative step shared out
    already (``fold``); each step logged so is answered yes once."""
    seen = uniform_specs.get(id(drafts))
    if seen is None or seen[0] is not drafts:
        return False
    seen[1] -= 1
    if not seen[1]:
        del uniform_specs[id(drafts)]
    return True
