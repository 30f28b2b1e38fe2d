"""The prefill/decode split of one engine step's tokens, read from vLLM's scheduler output
(``SchedulerOutput`` and its ``CachedRequestData``, ``vllm/v1/core/sched/output.py``). Runs on
every productive step (``_vllm._count_step``): in the common steps it looks at the new
requests only, and otherwise at a small hint of the continuing requests that are not
decoding, never at every request of a big batch unless the hint has missed one.
"""

from __future__ import annotations

from typing import Any

# Continuing requests last seen not decoding (a chunked prefill going on, a resumed request's
# recompute), and new requests whose prompt was not all scheduled: the hint ``split_tokens``
# looks at first when a step is not all decode. A hint only: its answer is checked against the
# step's totals, and a wrong or missing hint costs one pass over the continuing requests.
_irregular: dict[str, None] = {}
IRREGULAR_MAX = 64
# Steps with this many continuing requests or fewer, some not decoding, look at every one:
# cheaper than the hint there (measured: 0.3-0.7 against 1.0-1.4 us per step at 1 and 8).
SMALL = 8
# The latest step's drafts and their total (``drafts_of``: ``_spec`` counts the same step).
_drafts: list[Any] = [None, 0]


def drafts_of(spec: dict[str, Any]) -> int:
    """The total of SPEC's drafts (a step's ``scheduled_spec_decode_tokens``), taken once per
    step: ``split_tokens`` took it already when SPEC is the step it split last."""
    memo = _drafts
    if memo[0] is spec:
        return int(memo[1])
    return sum(map(len, spec.values()))


def _take_drafts(spec: dict[str, Any]) -> int:
    drafts = sum(map(len, spec.values()))
    _drafts[0], _drafts[1] = spec, drafts
    return drafts


def split_tokens(so: Any, total: int) -> tuple[int, int]:
    """(prefill, decode) tokens of one step's scheduler output. New requests prefill; a
    continuing request decodes when it is scheduled one token plus its speculative drafts,
    and otherwise continues a chunked prefill (a last prefill chunk of exactly one token is
    counted as decode). (0, 0) for an output without these fields (another vLLM): its tokens
    are then counted, but not split.

    Cost: the new requests are looked at one by one; the continuing ones are not, as long as
    the totals show them all decoding. When some do not, the hinted ones (``_irregular``) and
    the resumed ones are looked at, and the rest are known to decode when their tokens add up
    to one each plus their drafts: vLLM schedules every continuing request at least one token
    plus its drafts (its drafts are trimmed to what it is scheduled), so a sum that adds up
    is every term adding up. Otherwise (a hint missed) every continuing request is looked
    at, and the hint is rebuilt from what that finds."""
    try:
        counts = so.num_scheduled_tokens
        new = so.scheduled_new_reqs
        spec = so.scheduled_spec_decode_tokens
        cont = so.scheduled_cached_reqs
        cached = cont.req_ids
    except AttributeError:
        return 0, 0
    hint = _irregular
    prefill = 0
    partial = None
    for r in new:
        rid = r.req_id
        k = counts.get(rid, 0)
        prefill += k
        if hint:
            hint.pop(rid, None)
        # prompt left for a later step (unknown: assumed); V2 sends what it prefills
        ids = getattr(r, "prefill_token_ids", None) or getattr(r, "prompt_token_ids", None)
        if ids is None or (getattr(r, "num_computed_tokens", 0) or 0) + k < len(ids):
            if partial is None:
                partial = [rid]
            else:
                partial.append(rid)
    drafts = _take_drafts(spec) if spec else 0
    rest = total - prefill
    if rest == len(cached) + drafts:
        decode = rest  # every continuing request decodes
    elif len(cached) <= SMALL:
        decode = _split_small(counts, spec, cached)
        prefill += rest - decode
    else:
        decode = _split_continuing(counts, spec, cont, rest, drafts)
        prefill += rest - decode
    if partial is not None:
        for rid in partial:
            hint[rid] = None
        if len(hint) > IRREGULAR_MAX:
            hint.clear()  # a hint only: a step it would have served takes the long way
    return prefill, decode


def _split_small(counts: Any, spec: Any, cached: Any) -> int:
    """Decode tokens of a few continuing requests, some not decoding: every one looked at
    (cheaper than the hint at this size, which is left as it is)."""
    decode = 0
    if spec:
        for rid in cached:
            k = counts.get(rid, 0)
            if k == 1 + len(spec.get(rid, ())):
                decode += k
    else:
        for rid in cached:
            if counts.get(rid, 0) == 1:
                decode += 1
    return decode


def _split_continuing(counts: Any, spec: Any, cont: Any, rest: int, drafts: int) -> int:
    """Decode tokens of a step's continuing requests (REST tokens, DRAFTS drafts), some of
    which do not decode: the hinted and resumed ones first, every one if the rest do not add
    up (see ``split_tokens``)."""
    hint = _irregular
    cached = cont.req_ids
    resumed = getattr(cont, "resumed_req_ids", None)
    candidates = list(hint)
    if resumed:
        candidates += [r for r in resumed if r not in hint]
    seen_tok = seen_n = seen_d = decode = 0
    for rid in candidates:
        k = counts.get(rid)
        if k is None:  # not scheduled (finished, preempted, or new this step)
            hint.pop(rid, None)
            continue
        d = len(spec.get(rid, ())) if spec else 0
        seen_tok += k
        seen_n += 1
        seen_d += d
        if k == 1 + d:
            decode += k
            hint.pop(rid, None)
        else:
            hint[rid] = None
    if rest - seen_tok == len(cached) - seen_n + drafts - seen_d:
        return decode + rest - seen_tok  # the others all decode
    hint.clear()
    decode = 0
    for rid in cached:
        k = counts.get(rid, 0)
        if k == 1 + (len(spec.get(rid, ())) if spec else 0):
            decode += k
        else:
            hint[rid] = None
    if len(hint) > IRREGULAR_MAX:
        hint.clear()
    return decode
