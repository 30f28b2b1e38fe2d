"""What vLLM's model runner hands the probe's speculation counting, step by step, logged from
inside a live engine (GPU machine; not run by the tests). It settles, on the machine, what the
probe's ``_spec`` assumes from vLLM 0.26.0's source:

* ``sample_tokens`` returns V2's ``AsyncOutput`` (``vllm/v1/worker/gpu/async_utils.py``) with a
  numpy ``sampled_token_ids`` of ``[num_reqs, K + 1]`` (``[num_reqs, 1]`` without drafts);
* its ``get_output`` returns a ``ModelRunnerOutput`` whose ``sampled_token_ids`` is a list of
  lists trimmed to the tokens sampled, ``req_ids`` a list, ``req_id_to_index`` a dict;
* the scheduler's ``scheduled_spec_decode_tokens`` is a dict of lists, ``[-1] * K`` each
  (placeholders: V2 keeps the drafts on the device);
* the probe's counters equal vLLM's own ``vllm:spec_decode_*`` counters at the end.

Run (one process: the worker is in it, so its classes can be wrapped here)::

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python scripts/gpu/spec_shapes.py \
        --model meta-llama/Llama-3.1-8B-Instruct \
        --draft yuhuili/EAGLE3-LLaMA3.1-Instruct-8B [--async-scheduling] [--k 3]

One JSON line per logged step (``"k": "so"`` at ``execute_model``, ``"k": "out"`` for what
``sample_tokens`` returned, ``"k": "collected"`` for what its ``get_output`` returned), then
one ``"k": "totals"`` line: vLLM's counters and the probe's (``null`` where the probe is not
loaded in this process). Only metadata is read off arrays (type, dtype, shape): their
contents may still be in flight from the device until ``get_output``.

Nothing here imports numpy or torch itself: arrays are described by duck typing."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections import Counter
from typing import Any

LOGGED_MAX = 12  # steps logged in full (the first ones, with and without drafts)
_logged = [0]  # steps logged so far


def emit(rec: dict[str, Any]) -> None:
    print(json.dumps(rec, default=repr), flush=True)


def kind(x: Any) -> str:
    t = type(x)
    return f"{t.__module__}.{t.__qualname__}"


def describe(x: Any) -> dict[str, Any]:
    """X's type, and its shape and dtype (an array or a tensor) or its length and first item's
    type (a sequence or a mapping). Never its contents: they may not have landed yet."""
    d: dict[str, Any] = {"type": kind(x)}
    if hasattr(x, "shape"):
        d["shape"] = list(x.shape)
        d["dtype"] = str(getattr(x, "dtype", None))
    elif isinstance(x, (list, tuple, dict)):
        d["len"] = len(x)
        if x:
            first = next(iter(x.values())) if isinstance(x, dict) else x[0]
            d["first"] = kind(first)
    return d


def on_scheduled(so: Any) -> None:
    spec = getattr(so, "scheduled_spec_decode_tokens", None)
    rec: dict[str, Any] = {"k": "so", "spec": describe(spec)}
    if isinstance(spec, dict):
        rec["draft_lens"] = dict(Counter(len(v) for v in spec.values()))
        rec["placeholders"] = sum(1 for v in spec.values() if list(v) == [-1] * len(v))
        if spec:
            rec["first_drafts"] = list(next(iter(spec.values())))
    rec["invalid"] = describe(getattr(so, "num_invalid_spec_tokens", None))
    rec["num_scheduled_tokens"] = describe(getattr(so, "num_scheduled_tokens", None))
    emit(rec)


def on_output(out: Any) -> None:
    rec: dict[str, Any] = {"k": "out", **describe(out)}
    rec["attrs"] = sorted(vars(out)) if hasattr(out, "__dict__") else None
    for name in ("sampled_token_ids", "num_sampled_tokens_np", "req_ids", "req_id_to_index"):
        if hasattr(out, name):
            rec[name] = describe(getattr(out, name))
    get = getattr(out, "get_output", None)
    rec["get_output"] = callable(get)
    emit(rec)
    if callable(get):

        def get_output() -> Any:
            result = get()
            on_collected(result)
            return result

        out.get_output = get_output


def on_collected(result: Any) -> None:
    sampled = getattr(result, "sampled_token_ids", None)
    rec: dict[str, Any] = {"k": "collected", **describe(result)}
    rec["sampled_token_ids"] = describe(sampled)
    if isinstance(sampled, list):
        rec["row_lens"] = dict(Counter(len(r) for r in sampled))
    rec["req_ids"] = describe(getattr(result, "req_ids", None))
    rec["req_id_to_index"] = describe(getattr(result, "req_id_to_index", None))
    emit(rec)


def wrap_worker() -> None:
    """Wrap the GPU worker's two step methods before the engine builds one (the probe, when
    loaded, wraps the class again at the worker's ``__init__``, around these)."""
    from vllm.v1.worker import gpu_worker

    cls = gpu_worker.Worker
    execute, sample = cls.execute_model, cls.sample_tokens

    @functools.wraps(execute)
    def execute_model(self: Any, so: Any, *args: Any, **kwargs: Any) -> Any:
        if _logged[0] < LOGGED_MAX:
            emit({"k": "runner", "class": kind(getattr(self, "model_runner", None))})
            on_scheduled(so)
        return execute(self, so, *args, **kwargs)

    @functools.wraps(sample)
    def sample_tokens(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = sample(self, *args, **kwargs)
        if _logged[0] < LOGGED_MAX and out is not None:
            _logged[0] += 1
            on_output(out)
        return out

    cls.execute_model = execute_model
    cls.sample_tokens = sample_tokens


def vllm_totals(llm: Any) -> dict[str, Any]:
    got: dict[str, Any] = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            # a counter's value, else a vector's values (a count of 0 is a value, not missing)
            got[m.name] = m.value if hasattr(m, "value") else getattr(m, "values", None)
    return got


def probe_totals() -> dict[str, Any] | None:
    core = sys.modules.get("servewitness_probe._core")
    layout = sys.modules.get("servewitness_probe.layout")
    counters = getattr(core, "COUNTERS", None)
    if layout is None or counters is None:
        return None
    lay: Any = layout
    return {
        "drafts": counters[lay.S_SPEC_DRAFTS],
        "draft_tokens": counters[lay.S_SPEC_DRAFT_TOKENS],
        "accepted": counters[lay.S_SPEC_ACCEPTED],
        "emitted": counters[lay.S_SPEC_EMITTED],
        "unread": counters[lay.S_SPEC_UNREAD],
        "pos": [counters[lay.S_SPEC_POS_BASE + p] for p in range(lay.SPEC_POSITIONS)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", required=True, help="the EAGLE-3 draft model")
    ap.add_argument("--method", default="eagle3")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--async-scheduling", action="store_true")
    ap.add_argument("--prompts", type=int, default=16)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    wrap_worker()
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=args.model,
        speculative_config={
            "method": args.method,
            "model": args.draft,
            "num_speculative_tokens": args.k,
        },
        async_scheduling=args.async_scheduling,
        max_model_len=256,  # the GPU kit's tiny model allows 512; the prompts and 96 tokens fit
        disable_log_stats=False,
    )
    prompts = [f"Count from {i} to {i + 40}, one number per line." for i in range(args.prompts)]
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=96))
    emit({"k": "totals", "vllm": vllm_totals(llm), "probe": probe_totals()})


if __name__ == "__main__":
    main()
