"""vLLM used as a library, for tests/test_offline_live.py and tests/test_protocols_live.py.

    python offline_llm.py MODEL STATE_DIR MODE [--async-scheduling]

MODE ``generate``: build ``vllm.LLM`` on the tiny model (the process layout comes from
VLLM_ENABLE_V1_MULTIPROCESSING), generate greedily one prompt at a time, and write
STATE_DIR/ready.json (token counts and the engine's effective settings). Then wait: each file
STATE_DIR/go-N that appears runs command N (its text) and writes STATE_DIR/done-N.json:

* ``generate``: one more round of LLM.generate;
* ``direct``: drive the engine's executor by hand, as a hidden-state extraction tool does:
  requests go straight into the engine core's scheduler (no front end, so no request id of
  the LLM's), and each step calls ``executor.execute_model(scheduler_output)``, which under
  the two-phase protocol returns None and leaves the output to ``sample_tokens`` (one
  process only: the executor must be in this process);
* ``misuse``: ``direct``, by a driver written for the one-phase protocol: on the first step
  where execute_model returns None it calls execute_model again for the output it expected
  (vLLM raises), then recovers with sample_tokens; the error is in the result.

MODE ``embed``: the same model as a pooling (embedding) model, one prompt at a time: there
``execute_model`` returns the output itself and ``sample_tokens`` is never called.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

PROMPTS = ["offline one two three", "library use of the engine", "a third prompt here"]
MAX_TOKENS = 6


def build(model: str, mode: str, async_scheduling: bool) -> Any:
    from vllm import LLM

    kwargs: dict[str, Any] = {
        "enforce_eager": True,
        "dtype": "float32",
        "max_model_len": 256,
        "kv_cache_memory_bytes": 64 << 20,
        "enable_prefix_caching": False,
    }
    if async_scheduling:
        kwargs["async_scheduling"] = True
    if mode == "embed":
        kwargs.update(runner="pooling", convert="embed")
    return LLM(model, **kwargs)


def generate(llm: Any) -> dict[str, Any]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    prompt, completion = [], []
    for p in PROMPTS:  # one at a time: one request per step
        (out,) = llm.generate([p], params, use_tqdm=False)
        prompt.append(len(out.prompt_token_ids))
        completion.append(len(out.outputs[0].token_ids))
    return {"prompt_tokens": prompt, "completion_tokens": completion}


def embed(llm: Any) -> dict[str, Any]:
    prompt = []
    for p in PROMPTS:
        (out,) = llm.embed([p], use_tqdm=False)
        prompt.append(len(out.prompt_token_ids))
    return {"prompt_tokens": prompt, "completion_tokens": [0] * len(PROMPTS)}


def direct(llm: Any, misuse: bool = False) -> dict[str, Any]:
    """Drive the executor by hand: scheduler output in, execute_model, then sample_tokens
    when execute_model left the output to it. MISUSE: once, call execute_model again first."""
    from vllm import SamplingParams
    from vllm.v1.engine import EngineCoreRequest

    core = llm.llm_engine.engine_core.engine_core  # InprocClient -> EngineCore
    executor = core.model_executor
    tokens = [[5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16]]
    for i, ids in enumerate(tokens):
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
        req = EngineCoreRequest(
            request_id=f"direct-{i}",
            prompt_token_ids=ids,
            mm_features=None,
            sampling_params=params,
            pooling_params=None,
            arrival_time=time.time(),
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
        )
        request, _ = core.preprocess_add_request(req)
        core.scheduler.add_request(request)
    steps = returned_none = sampled = 0
    raised: list[str] = []
    generated: dict[str, int] = {}
    while core.scheduler.has_requests():
        so = core.scheduler.schedule()
        out = executor.execute_model(so)
        steps += 1
        if out is None:  # the two-phase protocol: the output comes from sample_tokens
            returned_none += 1
            if misuse and not raised:
                try:
                    executor.execute_model(so)  # "where is my output?"
                    raised.append("(it did not raise)")
                except Exception as e:  # noqa: BLE001 - what the driver saw
                    raised.append(f"{type(e).__name__}: {e}")
            out = executor.sample_tokens(core.scheduler.get_grammar_bitmask(so))
            sampled += 1
        for rid, toks in zip(out.req_ids, out.sampled_token_ids, strict=False):
            generated[rid] = generated.get(rid, 0) + len(toks)
        core.scheduler.update_from_output(so, out)
    return {
        "prompt_tokens": [len(t) for t in tokens],
        "completion_tokens": [generated.get(f"direct-{i}", 0) for i in range(len(tokens))],
        "execute_model_calls": steps,
        "returned_none": returned_none,
        "sample_tokens_calls": sampled,
        "raised": raised,
    }


def engine_facts(llm: Any) -> dict[str, Any]:
    engine = llm.llm_engine
    cfg = engine.vllm_config
    facts: dict[str, Any] = {
        "async_scheduling": cfg.scheduler_config.async_scheduling,
        "client": type(engine.engine_core).__name__,
    }
    core = getattr(engine.engine_core, "engine_core", None)  # in this process only
    if core is not None:
        facts["batch_queue"] = core.batch_queue_size
        facts["step"] = core.step_fn.__name__
    return facts


def write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.rename(path)


def main() -> None:
    model, state, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    llm = build(model, mode, "--async-scheduling" in sys.argv[4:])
    run = embed if mode == "embed" else generate
    write(state / "ready.json", {**run(llm), **engine_facts(llm)})
    n = 0
    while True:  # the test reads the evidence, then kills this process group
        go = state / f"go-{n}"
        if not go.exists():
            time.sleep(0.1)
            continue
        command = go.read_text().strip()
        try:
            if command in ("direct", "misuse"):
                result = direct(llm, misuse=command == "misuse")
            else:
                result = run(llm)
        except Exception as e:  # noqa: BLE001 - the test shows it
            result = {"error": f"{type(e).__name__}: {e}"}
        write(state / f"done-{n}.json", result)
        n += 1


if __name__ == "__main__":
    main()
