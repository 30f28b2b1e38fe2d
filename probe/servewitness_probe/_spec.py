"""Speculative decoding counted in the process that runs the model, and vLLM's own log lines
about which model runner it chose.

Speculation is counted from the data vLLM's scheduler fills its ``SpecDecodingStats`` from
(``Scheduler.update_from_output`` in ``vllm/v1/core/sched/scheduler.py``): the drafts each
step scheduled for verification (``scheduler_output.scheduled_spec_decode_tokens``, less the
grammar-invalidated ones in ``num_invalid_spec_tokens``) and the tokens the runner output
sampled per request (``sampled_token_ids``). For each request with drafts and a non-empty
output: one draft, ``len(drafts)`` draft tokens, ``len(sampled) - 1`` accepted ones (the last
sampled token is the bonus or the correction), positions ``0 .. accepted - 1`` accepted. These
are the counts behind ``vllm:spec_decode_num_drafts_total``, ``…_num_draft_tokens_total``,
``…_num_accepted_tokens_total`` and ``…_num_accepted_tokens_per_pos_total``. What the probe
cannot see (a request aborted while its step ran, preempted output discarded as stale) vLLM
leaves out and the probe counts: the totals agree on ordinary runs.

Per request: each counted step is also handed to ``_bindings.spec_step`` (references only),
which shares the same counts out to the step's requests off the step, in the writer thread;
each request's bindings record carries its share (``"spec"``), and the shares add up to the
process's totals.

The step wrappers (``_vllm``) call ``scheduled`` at ``execute_model`` and ``output`` on what
``execute_model`` or ``sample_tokens`` returned, and only while the live config has a
speculative config (``ON``): a step without speculation costs one global check.

The V2 model runner (vLLM 0.26.0 ``vllm/v1/worker/gpu/model_runner.py``) returns an
``AsyncOutput`` from every sampling ``sample_tokens`` (model_runner.py:1466-1472, 1535), with
or without async scheduling (the executor calls its ``get_output``: multiproc_executor.py:944-946,
uniproc_executor.py:93-94, 99-100). That object carries a ``sampled_token_ids`` of its own: a numpy
int64 array of ``[num_reqs, K + 1]`` (``[num_reqs, 1]`` in a step without drafts), copied from
the device without blocking and padded past each request's ``num_sampled``
(async_utils.py:33, 42; rejection_sampler_utils.py:1026-1029; sampler.py:137). Only its
``get_output`` waits for the copy and hands back a ``ModelRunnerOutput`` of V1's shape: lists
trimmed to the tokens sampled, ``req_ids`` a list, ``req_id_to_index`` a dict
(async_utils.py:49-60, model_runner.py:1457-1464). So an output with a ``get_output`` is
counted from what that returns, never from its own arrays (they read 0 drafts: no
``req_id_to_index``, and the array's truth value raised in an older probe). The scheduler's
drafts in V2 are placeholders, ``[-1] * K`` per request (the real ones stay on the device:
``vllm/v1/worker/gpu/spec_decode/utils.py:45-51``), or the drafts less grammar-invalid ones
padded with -1 (``Scheduler.update_draft_token_ids_in_output``, scheduler.py:2079-2114): their
number is what vLLM counts, and so does the probe.

Runner selection: vLLM logs why it picked a runner (``Model Runner V2 does not yet support
…; using the V1 model runner instead.``, ``Model Runner V2 requires Triton; …``, ``Using V2
Model Runner``). A log-record factory (it survives vLLM re-configuring its loggers) journals
each record of a ``vllm`` logger whose message mentions a model runner, as
``{"k": "vllm_log", "level", "logger", "msg", "t"}``, at most ``LOG_MAX`` per process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from servewitness_probe import _core, _split
from servewitness_probe import layout as L

LOG_MAX = 32
# The configured number of drafts per request (``num_speculative_tokens``; 0: unknown): a step
# in which every request drafted this many is counted without a Python loop (``_uniform``).
K = 0
# Where each counted step is also logged for the per-request counts (``_bindings.spec_step``;
# None: request bindings are off).
BIND: Callable[[Any, Any, Any, Any], None] | None = None
_pending: Any = None  # the scheduler output of the step whose output is not counted yet
_logged = 0
_factory_installed = False


def config_record(runner: Any, worker: Any) -> dict[str, Any]:
    """The speculative config in force, read from the live config (as ``graph_mode`` reads
    the compilation config): ``{"k": "spec", "on": bool, "method", "num_speculative_tokens"}``;
    ``on`` is None when the runner carries no config to read."""
    cfg = getattr(runner, "vllm_config", None) or getattr(worker, "vllm_config", None)
    if cfg is None:
        return {"k": "spec", "on": None}
    spec = getattr(cfg, "speculative_config", None)
    if spec is None:
        return {"k": "spec", "on": False}
    k = getattr(spec, "num_speculative_tokens", None)
    global K
    K = k if isinstance(k, int) and not isinstance(k, bool) and 0 < k < 255 else 0
    method = getattr(spec, "method", None)
    return {
        "k": "spec",
        "on": True,
        "method": None if method is None else str(method),
        "num_speculative_tokens": k if isinstance(k, int) and not isinstance(k, bool) else None,
        "positions": L.SPEC_POSITIONS,
    }


def scheduled(so: Any) -> None:
    """Note the scheduler output of the step now running (its drafts are counted against the
    output the step returns)."""
    global _pending
    _pending = so


def output(out: Any) -> None:
    """Count the step's drafts against OUT, the runner output of the noted step (None: not
    returned here; the step's ``sample_tokens`` returns it). An asynchronous output is
    counted when vLLM collects it (its ``get_output``)."""
    global _pending
    so = _pending
    if out is None or so is None:
        return
    _pending = None
    # A ready output's sampled tokens are a list (V1's ``ModelRunnerOutput``): one class check.
    # Anything else with a ``get_output`` is an asynchronous output, whatever else it carries:
    # V2's ``AsyncOutput`` (vLLM 0.26.0 vllm/v1/worker/gpu/async_utils.py:33) has a
    # ``sampled_token_ids`` of its own, a numpy array padded to K + 1 columns whose copy from
    # the device may not have landed yet; only its ``get_output`` (async_utils.py:49-60)
    # waits for the copy and trims each row to the tokens sampled.
    if getattr(out, "sampled_token_ids", None).__class__ is not list and callable(
        getattr(out, "get_output", None)
    ):
        _count_async(out, so)
        return
    count(so, out)


def _rows(sampled: Any) -> Any:
    """SAMPLED, a runner output's sampled tokens that are not a list, as rows: () for None, an
    array's or a tensor's ``tolist()`` (taken once per step: every later ``len`` and index is
    then a list's, and nothing tests an array's truth value), anything else as it is."""
    if sampled is None:
        return ()
    if hasattr(sampled, "tolist"):  # numpy or torch, duck-typed: the probe imports neither
        return sampled.tolist()
    return sampled


def _count_async(out: Any, so: Any) -> None:
    get: Callable[[], Any] = out.get_output

    def get_output() -> Any:
        result = get()
        try:
            count(so, result)
        except Exception as e:  # noqa: BLE001 - a probe never raises into vLLM
            _core.report_error("spec", f"async output: {type(e).__name__}: {e}")
        return result

    out.get_output = get_output


def count(
    so: Any,
    out: Any,
    _emitted: int = L.S_SPEC_EMITTED,
) -> None:
    """Count one step: its scheduler output SO and its runner output OUT. The common step
    (``_uniform``) is counted from one C-level pass over the sampled tokens; any other takes
    ``_count_each``. Sampled tokens that are not a list (an array or a tensor) are taken as
    rows once (``_rows``); nothing here tests an array's truth value."""
    c = _core.COUNTERS
    sampled = getattr(out, "sampled_token_ids", None)
    if sampled.__class__ is not list:  # V1 and V2 after get_output: a list (one check)
        sampled = _rows(sampled)
    spec: Any = getattr(so, "scheduled_spec_decode_tokens", None)
    index = getattr(out, "req_id_to_index", None)
    if index is None:
        index = {}
    invalid = getattr(so, "num_invalid_spec_tokens", None)
    uniform = None
    if spec and not invalid and len(index) == len(sampled):
        uniform = _uniform(so, out, spec, sampled)
    bind = BIND
    if uniform is not None:
        _count_uniform(c, len(spec), uniform[1])
        if bind is not None:
            bind(spec, K, out.req_ids, uniform[0])
        return
    c[_emitted] += sum(map(len, sampled))
    if bind is not None and index:
        bind(spec, invalid, index, sampled)
    if spec:
        _count_each(c, spec, invalid, index, sampled)


def _uniform(so: Any, out: Any, spec: Any, sampled: Any) -> tuple[bytes, list[int]] | None:
    """A uniform step's sampled-token counts (one byte per request, in ``out.req_ids``
    order) and how many requests sampled v tokens or more (index v, 1 .. K + 1); None if the
    step is not uniform: every scheduled request drafted exactly ``K`` tokens (the
    configured number: vLLM trims drafts to it, so a total of ``K`` per request is ``K``
    each; the total is the one ``_split`` took already), none invalidated, and every one is
    in the output with 1 to K + 1 tokens sampled. Every request in the output is then a
    drafted one: vLLM drafts only scheduled requests and outputs only scheduled ones, so as
    many drafted as scheduled as in the output are the same requests. (The caller has checked
    that no draft is invalidated and the output's index is as long as its sampled tokens.)"""
    k = K
    n = len(spec)
    nst = getattr(so, "num_scheduled_tokens", None)
    req_ids = getattr(out, "req_ids", None)
    if (
        not k
        or nst is None
        or req_ids.__class__ is not list  # logged for the fold, which compares it as a list
        or not n == len(nst) == len(sampled) == len(req_ids)
        or _split.drafts_of(spec) != n * k
    ):
        return None
    try:
        lens = bytes(map(len, sampled))
    except ValueError:  # more than 255 tokens sampled for one request: not a draft's output
        return None
    at_least = [0] * (k + 3)
    for v in range(k + 1, 0, -1):
        at_least[v] = at_least[v + 1] + lens.count(v)
    if at_least[1] != n:  # a request with nothing sampled, or more than K + 1 tokens
        return None
    return lens, at_least


def _count_uniform(
    c: memoryview,
    drafts: int,
    at_least: list[int],
    _emitted: int = L.S_SPEC_EMITTED,
    _positions: int = L.SPEC_POSITIONS,
    _pos: int = L.S_SPEC_POS_BASE,
) -> None:
    """Count a uniform step of DRAFTS requests from AT_LEAST (requests that sampled v tokens
    or more, by v): a request that sampled v tokens emitted v, accepted v - 1, at positions
    0 .. v - 2."""
    emitted = sum(at_least)  # each request counted once for every v up to its own
    c[_emitted] += emitted
    _add(c, drafts, drafts * K, emitted - drafts)
    for p in range(min(K, _positions)):
        m = at_least[p + 2]
        if not m:
            break  # a later position never accepts more than an earlier one
        c[_pos + p] += m


def _add(c: memoryview, drafts: int, tokens: int, accepted: int) -> None:
    """The step's totals (written before its positions: a reader between two writes never
    sees a position ahead of them)."""
    c[L.S_SPEC_STEPS] += 1
    c[L.S_SPEC_DRAFTS] += drafts
    c[L.S_SPEC_DRAFT_TOKENS] += tokens
    c[L.S_SPEC_ACCEPTED] += accepted


def _count_each(
    c: memoryview,
    spec: dict[str, Any],
    invalid: dict[str, int] | None,
    index: dict[str, int],
    sampled: Any,
    _positions: int = L.SPEC_POSITIONS,
    _pos: int = L.S_SPEC_POS_BASE,
) -> None:
    """Count one step request by request, as vLLM's scheduler does: a request with no draft
    tokens, absent from the output or with nothing sampled is left out; invalid drafts are
    not counted as draft tokens."""
    drafts = tokens = accepted = 0
    pos = [0] * _positions
    for rid, draft in spec.items():
        i = index.get(rid)
        if i is None or i >= len(sampled):
            continue
        n = len(sampled[i])
        if not n or not len(draft):
            continue
        drafts += 1
        tokens += len(draft) - (invalid.get(rid, 0) if invalid else 0)
        a = n - 1
        accepted += a
        for p in range(a if a < _positions else _positions):
            pos[p] += 1
    if not drafts:
        c[L.S_SPEC_UNREAD] += 1
        return
    _add(c, drafts, tokens, accepted)
    for p, k in enumerate(pos):
        if not k:
            break  # a later position never accepts more than an earlier one
        c[_pos + p] += k


# -- vLLM's log lines about the model runner ---------------------------------------------------


def _note(record: logging.LogRecord) -> None:
    """Journal RECORD when it is a ``vllm`` logger's line about a model runner."""
    global _logged
    if _logged >= LOG_MAX or not record.name.startswith("vllm"):
        return
    msg = record.msg
    if not isinstance(msg, str) or "runner" not in msg.lower():
        return
    text = record.getMessage()
    if "model runner" not in text.lower():
        return
    _logged += 1
    _core.state().remember(
        {
            "k": "vllm_log",
            "level": record.levelname,
            "logger": record.name,
            "msg": text[:1000],
            "t": time.time(),
        }
    )


def install_log_capture() -> None:
    """Wrap the process's log-record factory (once): every record vLLM logs passes through it,
    whatever handlers vLLM's logging configuration sets up or replaces later."""
    global _factory_installed
    if _factory_installed:
        return
    _factory_installed = True
    inner = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = inner(*args, **kwargs)
        try:
            _note(record)
        except Exception as e:  # noqa: BLE001 - a probe never raises into logging
            _core.report_error("vllm_log", f"{type(e).__name__}: {e}")
        return record

    factory.__verifier_probe__ = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
