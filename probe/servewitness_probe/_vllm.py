"""vLLM integration: process role, the live model runner, and engine-step counting.

Size: one module because the wrappers it installs on vLLM's classes share state that every
engine step reads (the live runner, speculation on or off, the open step); in one namespace
those reads stay global lookups on the hot path, and the installation order stays in one place.

Everything is installed through post-import watches, so nothing here imports vLLM itself:

* ``vllm.v1.engine.core``: ``EngineCore.__init__`` marks the process ``engine_core``; its first
  ``add_request`` records how the engine steps (async scheduling, batch queue).
* ``vllm.v1.engine.llm_engine``: ``LLMEngine.__init__`` marks the process ``offline`` (the front
  end of ``vllm.LLM``; in one process with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` it is the
  engine core and the worker too).
* ``vllm.v1.worker.worker_base``: ``WorkerBase.__init__`` marks the process ``worker`` with its
  rank, and wraps the concrete worker class's ``execute_model`` (the per-step call, whatever
  runner is live) to count steps by phase (prefill and decode tokens), its ``sample_tokens``
  so that hook fires there count in the step, and ``init_device``/``load_model`` to record the
  live runner object and the graph/compile mode once they exist. Each counted step also notes
  which requests it served (``_bindings.step``).
* Warm-up, profiling and graph capture are counted apart as *dummy* steps, never as steps:
  every call of the live runner class's ``_dummy_run`` (V1 and V2: memory profiling, compile
  warm-up, CUDA-graph capture, data-parallel padding; V2's ``execute_model(dummy_run=True)``
  runs inside it), and every call of the worker's ``execute_model`` made while the worker's
  ``compile_or_warm_up_model`` runs (V2's kernel warm-up drives hand-built scheduler outputs
  through it). Nested ones count once; hook fires inside them count as outside steps. All
  of it per thread: only the calls of the thread inside a dummy run or the warm-up are dummy
  steps (a thread of the workload's that enters one and stays there leaves the engine
  thread's steps counted). These methods run at start-up only, so the wrappers cost nothing
  per step.
* Speculative decoding (``_spec``): the runner's speculative config is journaled with the live
  runner; while it is on, each step's scheduled drafts are counted against the runner output
  its ``execute_model`` or ``sample_tokens`` returns (one global check per step when off).
* ``vllm.logger``: vLLM's log lines about the model runner (why it chose one) are journaled.
* ``vllm.v1.engine.output_processor`` and ``vllm.entrypoints.serve.engine.serving``: the API
  server's external request id for each internal one (``_bindings``).

The live runner is reported as the object the worker holds (``type(worker.model_runner)``),
not as whatever runner module happens to be imported, with the file that defines its
``execute_model`` and that file's hash.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from servewitness_probe import _bindings, _code, _core, _device, _extids, _postimport, _spec
from servewitness_probe import layout as L
from servewitness_probe._split import split_tokens

STEP_METHODS = ("execute_model", "sample_tokens")
DUMMY_METHOD = "_dummy_run"  # on the runner class (V1 and V2)
WARMUP_METHOD = "compile_or_warm_up_model"  # on the worker class
_roles_done: set[str] = set()
_runner_seen: set[type] = set()
# Inside a dummy step, inside the worker's warm-up: per thread (a thread that enters a dummy
# run and stays there must not make another thread's steps dummy ones), kept as thread id ->
# depth (nested ones count once). The step's hot path reads only the two totals below, all
# threads together, which are 0 but at start-up: it asks which thread it is only when a
# thread is inside one (``_held``).
_dummy_threads: dict[int, int] = {}
_warming_threads: dict[int, int] = {}
_dummy_depth = 0  # the depths in _dummy_threads, summed
_warming = 0  # the depths in _warming_threads, summed
_depth_lock = threading.Lock()
# The worker object whose step returned last (``_stepped``; a module global, not a closure
# cell: the probe's wrappers are told apart by what their cells hold, ``_code.own``).
_stepped_worker: Any = None
_spec_on = False  # the live config has a speculative config: steps count drafts (_spec)
RAISED_LOGGED_MAX = 8  # execute_model errors journaled per process (all are counted)
_raised_logged = 0
_waiting = False  # the latest execute_model returned None: its step waits for sample_tokens
_step_phase = 0  # the latest step's phase bits (S_CURRENT_PHASE), kept here to put back


_wrappers: set[Callable[..., Any]] = set()  # this module's wrappers (by identity)


def _mark(fn: Callable[..., Any]) -> None:
    """Note FN as one of this module's wrappers (and mark it as the probe's, like every probe
    wrapper; ``functools.update_wrapper`` has set what it wraps)."""
    fn.__verifier_probe__ = True  # type: ignore[attr-defined]
    _wrappers.add(fn)
    _code.own(fn, getattr(fn, "__wrapped__", None))


def _ours(fn: Any) -> bool:
    """Whether FN is already one of this module's wrappers. Told by identity: a declared hook's
    wrapper is the probe's too (and ``functools.update_wrapper`` copies attributes onto it), but
    a hook on a worker's or runner's method must not turn the counting off."""
    try:
        return fn in _wrappers
    except TypeError:  # unhashable
        return False


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _held(_ident: Callable[[], int] = threading.get_ident) -> bool:
    """Whether this thread is inside a dummy step or the worker's warm-up (called only when
    some thread is: ``_dummy_depth`` or ``_warming``)."""
    t = _ident()
    return t in _dummy_threads or t in _warming_threads


def _enter(threads: dict[int, int], step: int) -> int:
    """Add STEP (1 or -1) to this thread's depth in THREADS; the depth it had before. Sets
    the totals the hot path reads."""
    global _dummy_depth, _warming
    t = threading.get_ident()
    with _depth_lock:
        depth = threads.get(t, 0)
        if depth + step > 0:
            threads[t] = depth + step
        else:
            threads.pop(t, None)
        _dummy_depth = sum(_dummy_threads.values())
        _warming = sum(_warming_threads.values())
    return depth


def _forked() -> None:
    """In a forked child only the forking thread lives on: the other threads' depths go."""
    global _depth_lock, _dummy_depth, _warming
    _depth_lock = threading.Lock()
    t = threading.get_ident()
    for threads in (_dummy_threads, _warming_threads):
        for other in [k for k in threads if k != t]:
            del threads[other]
    _dummy_depth = sum(_dummy_threads.values())
    _warming = sum(_warming_threads.values())


os.register_at_fork(after_in_child=_forked)


def set_role(role: str, **extra: Any) -> None:
    key = f"{role}:{sorted(extra.items())}"
    if key in _roles_done:
        return
    _roles_done.add(key)
    _core.state().remember({"k": "role", "role": role, **extra})


def _defining_file(cls: type, method: str) -> dict[str, Any] | None:
    owner = next((k for k in cls.__mro__ if method in k.__dict__), None)
    if owner is None:
        return None
    mod = sys.modules.get(owner.__module__)
    path = getattr(mod, "__file__", None)
    info: dict[str, Any] = {"class": _qualified(owner), "file": path, "sha256": None}
    if isinstance(path, str):
        try:
            with open(path, "rb") as f:
                info["sha256"] = hashlib.sha256(f.read()).hexdigest()
        except OSError as e:
            info["error"] = str(e)
    return info


def graph_mode(worker: Any, runner: Any) -> dict[str, Any]:
    """The compile and graph mode in force: eager, compiled, CUDA graphs (a zero fire count
    of code inside a captured region is explained by it)."""
    cfg = getattr(runner, "vllm_config", None) or getattr(worker, "vllm_config", None)
    comp = getattr(cfg, "compilation_config", None)
    model = getattr(cfg, "model_config", None)

    def name(v: Any) -> str | None:
        return None if v is None else str(getattr(v, "name", v))

    return {
        "enforce_eager": getattr(model, "enforce_eager", None),
        "compilation_mode": name(getattr(comp, "mode", None)),
        "cudagraph_mode": name(getattr(comp, "cudagraph_mode", None)),
        "device": name(getattr(getattr(cfg, "device_config", None), "device_type", None)),
    }


def record_runner(worker: Any) -> None:
    """Journal the live runner of WORKER once per runner class."""
    runner = getattr(worker, "model_runner", None)
    if runner is None:
        return
    cls = type(runner)
    if cls in _runner_seen:
        return
    _runner_seen.add(cls)
    _wrap_runner_class(cls)
    methods = {m: _defining_file(cls, m) for m in STEP_METHODS}
    step = methods.get("execute_model") or {}
    _core.state().remember({"k": "graph", **graph_mode(worker, runner)})
    spec = _spec.config_record(runner, worker)
    _core.state().remember(spec)
    global _spec_on
    _spec_on = spec.get("on") is True
    _core.state().remember(
        {
            "k": "runner",
            "class": _qualified(cls),
            "file": step.get("file"),
            "sha256": step.get("sha256"),
            "methods": methods,
            "worker": _qualified(type(worker)),
            "mro": [_qualified(k) for k in cls.__mro__],
        }
    )
    for m in STEP_METHODS:  # what runs them, as the worker calls them (``_code``)
        if hasattr(cls, m):
            _code.watch(f"runner.{m}", cls, m, instance=runner)
        if hasattr(type(worker), m):
            _code.watch(f"worker.{m}", type(worker), m, instance=worker)


# Request bindings per step (None: off, VERIFIER_PROBE_BINDINGS=0; the benchmark toggles it).
_bind_step: Callable[[Any, int, int], None] | None = _bindings.step


def _count_step(
    so: Any,
    _time_ns: Callable[[], int] = time.time_ns,
    _total: int = L.S_STEPS_TOTAL,
    _productive: int = L.S_STEPS_PRODUCTIVE,
    _tokens: int = L.S_TOKENS_SCHEDULED,
    _reqs: int = L.S_REQUESTS_SCHEDULED,
    _reqs_max: int = L.S_REQUESTS_MAX,
    _phase: int = L.S_CURRENT_PHASE,
    _last: int = L.S_LAST_STEP_UNIX_NS,
    _decode: tuple[int, int, int] = (L.PHASE_DECODE, L.S_STEPS_DECODE, L.S_TOKENS_DECODE),
    _prefill: tuple[int, int, int] = (L.PHASE_PREFILL, L.S_STEPS_PREFILL, L.S_TOKENS_PREFILL),
    _productive_bit: int = L.PHASE_PRODUCTIVE,
) -> int:
    """Count one step; its phase bits. It runs on every step: slot numbers are bound as
    defaults and each shared slot is touched as few times as the counts allow."""
    c = _core.COUNTERS
    total = c[_total] + 1
    c[_total] = total
    n = getattr(so, "total_num_scheduled_tokens", 0) or 0
    now = _time_ns()
    if n > 0:
        c[_productive] += 1
        c[_tokens] += n
        reqs = len(getattr(so, "num_scheduled_tokens", ()) or ())
        c[_reqs] += reqs
        if reqs > c[_reqs_max]:  # noqa: PLR1730 - a shared-memory write only when it grows
            c[_reqs_max] = reqs
        prefill, decode = split_tokens(so, n)
        phase = _productive_bit
        if prefill:
            bit, steps, tokens = _prefill
            phase |= bit
            c[steps] += 1
            c[tokens] += prefill
        if decode:
            bit, steps, tokens = _decode
            phase |= bit
            c[steps] += 1
            c[tokens] += decode
        c[_phase] = phase
    else:
        c[L.S_STEPS_EMPTY] += 1
        c[_phase] = phase = 0
    if total == 1:
        c[L.S_FIRST_STEP_UNIX_NS] = now
    c[_last] = now
    bind = _bind_step
    if bind is not None:
        bind(so, total, now)
    return phase


def _take_back(so: Any, before: tuple[bool, int, Any], error: BaseException) -> None:
    """Undo the counts of a step whose ``execute_model`` raised: the call ran no step (vLLM
    raises "sample_tokens() must be called after execute_model() returns None" at once when a
    driver calls it twice in a row; an error inside a real step ends the engine). It is
    counted in ``S_STEPS_RAISED`` instead, the latest step's phase is put back, and its
    bindings entry is dropped if the writer has not folded it yet. The first few errors are
    journaled (``{"k": "step_raised"}``). Runs while the step is still marked open, so a
    reader never judges the counts in between. Never raises."""
    global _raised_logged
    try:
        c = _core.COUNTERS
        total = c[L.S_STEPS_TOTAL]
        c[L.S_STEPS_RAISED] += 1
        n = getattr(so, "total_num_scheduled_tokens", 0) or 0
        if n > 0:
            c[L.S_STEPS_PRODUCTIVE] -= 1
            c[L.S_TOKENS_SCHEDULED] -= n
            c[L.S_REQUESTS_SCHEDULED] -= len(getattr(so, "num_scheduled_tokens", ()) or ())
            prefill, decode = split_tokens(so, n)
            if prefill:
                c[L.S_STEPS_PREFILL] -= 1
                c[L.S_TOKENS_PREFILL] -= prefill
            if decode:
                c[L.S_STEPS_DECODE] -= 1
                c[L.S_TOKENS_DECODE] -= decode
        else:
            c[L.S_STEPS_EMPTY] -= 1
        c[L.S_STEPS_TOTAL] = total - 1
        c[L.S_CURRENT_PHASE] = max(before[1], 0)
        _bindings.take_back(total)
        if _spec_on:
            _spec.scheduled(before[2])  # the step still waiting for its output, if any
        if _raised_logged < RAISED_LOGGED_MAX:
            _raised_logged += 1
            _core.state().remember(
                {
                    "k": "step_raised",
                    "step": total,
                    "error": f"{type(error).__name__}: {error}"[:500],
                    "t": time.time(),
                }
            )
    except Exception as e:  # noqa: BLE001 - a probe never raises into a step
        _core.report_error("steps", f"take back: {type(e).__name__}: {e}")


def _wrap_worker_class(cls: type) -> None:
    """Wrap the step and set-up methods of a concrete worker class (once per class)."""
    if cls.__dict__.get("__verifier_probe_wrapped__"):
        return
    orig_exec = getattr(cls, "execute_model", None)
    if orig_exec is not None and not _ours(orig_exec):
        recorded = False
        in_step = L.S_IN_STEP  # slot numbers bound here: no module lookups in the step

        def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal recorded
            global _waiting, _step_phase, _stepped_worker
            if ((_warming or _dummy_depth) and _held()) or (kwargs and kwargs.get("dummy_run")):
                # warm-up (V2 kernel warm-up drives the worker) or padding: not a step
                return _dummy_call(orig_exec, self, (scheduler_output, *args), kwargs)
            c = _core.COUNTERS
            c[in_step] = 1  # not nested: execute_model and sample_tokens take turns
            phase = -1  # not counted (yet)
            pending = None
            try:
                phase = _count_step(scheduler_output)
                if not recorded:
                    recorded = True
                    record_runner(self)
                if _spec_on:
                    pending = _spec._pending
                    _spec.scheduled(scheduler_output)
            except Exception as e:  # noqa: BLE001 - a probe never raises into a step
                _core.report_error("steps", f"{type(e).__name__}: {e}")
            try:
                out = orig_exec(self, scheduler_output, *args, **kwargs)
            except BaseException as e:
                # It ran no step: its counts are taken back, and the in-step mark is left as
                # it was (a step still waiting for its sample_tokens stays open).
                if phase >= 0:
                    _take_back(scheduler_output, (_waiting, _step_phase, pending), e)
                c[in_step] = 1 if _waiting else 0
                if _device._counters:
                    _read_device()
                raise
            if self is not _stepped_worker:  # another worker object than the last step's
                _stepped_worker = _stepped(self)
            if _spec_on:  # before the step may close: its counts are in when it does
                _spec_output(out)
            # Two-phase protocol: execute_model returned nothing, the step goes on in
            # sample_tokens (where the sampler's hooks fire): it stays open until then, so
            # that a reader does not judge the step before its fires are in.
            _step_phase = phase
            if out is None:
                _waiting = True
            else:
                _waiting = False
                c[in_step] = 0
            if _device._counters:
                _read_device()
            return out

        functools.update_wrapper(execute_model, orig_exec)
        _mark(execute_model)
        cls.execute_model = execute_model  # type: ignore[attr-defined]

    _wrap_setup(cls)


def _wrap_setup(cls: type) -> None:
    """The worker class's methods around its steps: sample_tokens (in the step), the ones
    that make its runner (which they record) and its warm-up (dummy steps)."""
    _mark_in_step(cls, "sample_tokens")
    for name in ("init_device", "load_model"):
        _observe(cls, name, after=record_runner)
    _wrap_warm_up(cls, WARMUP_METHOD)
    cls.__verifier_probe_wrapped__ = True  # type: ignore[attr-defined]


def _stepped(worker: Any) -> Any:
    """Journal the runner class of WORKER, whose step just returned, when it is another worker
    object than the last step's (an identity test per step; a record only when it changes);
    WORKER, the step's worker from now on.
    A runner record says which runner the probe saw, not that it ran: the warm-up wrapper, for
    one, records whatever object it is called on. The reader takes the live runner from the
    latest of these, so an object that never completed a step is not the live runner."""
    try:
        runner = getattr(worker, "model_runner", None)
        if runner is not None:
            _core.state().remember({"k": "stepped", "class": _qualified(type(runner))})
    except Exception as e:  # noqa: BLE001 - a probe never raises into a step
        _core.report_error("steps", f"stepped: {type(e).__name__}: {e}")
    return worker


def _dummy_call(fn: Callable[..., Any], self: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """FN(SELF, *ARGS, **KWARGS) counted as one dummy step (unless inside one already): not a
    step, and hook fires inside it count as outside steps (the latest step's phase and the
    in-step mark are put back after it, for a dummy run inside a step). Nested is per
    thread: one thread inside a dummy run leaves every other thread's steps steps. The marks
    are put back only if no step moved them meanwhile (one of another thread: a dummy run
    held open must not reopen a step that has closed since)."""
    saved: tuple[int, int] | None = None
    c = _core.COUNTERS
    outer = not _enter(_dummy_threads, 1)
    if outer:
        try:
            c[L.S_STEPS_DUMMY] += 1
            saved = c[L.S_IN_STEP], c[L.S_CURRENT_PHASE]
            c[L.S_IN_STEP] = 0
            c[L.S_CURRENT_PHASE] = 0
        except Exception as e:  # noqa: BLE001 - a probe never raises into vLLM
            _core.report_error("steps", f"dummy: {type(e).__name__}: {e}")
    try:
        return fn(self, *args, **kwargs)
    finally:
        _enter(_dummy_threads, -1)
        if saved is not None and c[L.S_IN_STEP] == 0 and c[L.S_CURRENT_PHASE] == 0:
            c[L.S_IN_STEP], c[L.S_CURRENT_PHASE] = saved


def _wrap_runner_class(cls: type) -> None:
    """Count each call of the runner class's ``_dummy_run`` as a dummy step (looked up by
    name: a runner without one is left alone). Warm-up only: nothing here runs per step."""
    try:
        orig = getattr(cls, DUMMY_METHOD, None)
        if not callable(orig) or _ours(orig):
            return

        def dummy_run(self: Any, *args: Any, **kwargs: Any) -> Any:
            return _dummy_call(orig, self, args, kwargs)

        functools.update_wrapper(dummy_run, orig)
        _mark(dummy_run)
        setattr(cls, DUMMY_METHOD, dummy_run)
    except Exception as e:  # noqa: BLE001 - a probe never raises into vLLM
        _core.report_error("steps", f"{_qualified(cls)}.{DUMMY_METHOD}: {type(e).__name__}: {e}")


def _wrap_warm_up(cls: type, name: str) -> None:
    """Wrap the worker's warm-up method: while it runs, the worker's own ``execute_model`` and
    ``sample_tokens`` calls (V2's kernel warm-up) are dummy steps, not steps."""
    orig = getattr(cls, name, None)
    if not callable(orig) or _ours(orig):
        return

    def warm_up(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            record_runner(self)  # the runner's _dummy_run is wrapped before warm-up at the latest
        except Exception as e:  # noqa: BLE001 - a probe never raises into vLLM
            _core.report_error(f"{cls.__qualname__}.{name}", f"{type(e).__name__}: {e}")
        _enter(_warming_threads, 1)
        try:
            return orig(self, *args, **kwargs)
        finally:
            _enter(_warming_threads, -1)

    functools.update_wrapper(warm_up, orig)
    _mark(warm_up)
    setattr(cls, name, warm_up)


def _read_device() -> None:
    try:
        _device.read_all()
    except Exception as e:  # noqa: BLE001 - a probe never raises into a step
        _core.report_error("device_counter", f"read: {type(e).__name__}: {e}")


def _mark_in_step(cls: type, name: str) -> None:
    """Wrap CLS.NAME so hook fires inside it count as fires in the current step (V1 samples
    in ``sample_tokens``, a second call per step after ``execute_model``)."""
    orig = getattr(cls, name, None)
    if orig is None or _ours(orig):
        return

    in_step = L.S_IN_STEP  # bound here: no module lookups in the step

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if (_warming or _dummy_depth) and _held():
            return orig(self, *args, **kwargs)  # warm-up: not in a step
        global _waiting
        c = _core.COUNTERS
        c[in_step] = 1
        try:
            out = orig(self, *args, **kwargs)
            if _spec_on:  # before the step closes: its counts are in when it does
                _spec_output(out)
            return out
        finally:
            _waiting = False
            c[in_step] = 0

    functools.update_wrapper(wrapper, orig)
    _mark(wrapper)
    setattr(cls, name, wrapper)


def _spec_output(out: Any) -> None:
    """Count the speculative drafts of the step whose runner output is OUT (``_spec``)."""
    try:
        _spec.output(out)
    except Exception as e:  # noqa: BLE001 - a probe never raises into a step
        _core.report_error("spec", f"{type(e).__name__}: {e}")


def _observe(
    cls: type,
    name: str,
    before: Callable[[Any], None] | None = None,
    after: Callable[[Any], None] | None = None,
) -> None:
    """Wrap CLS.NAME at class level to call BEFORE(self) / AFTER(self) around it (once).

    The observers' failures are journaled, never raised; the wrapped method's own behaviour,
    arguments, result and exceptions are untouched.
    """
    orig = getattr(cls, name, None)
    if orig is None or _ours(orig):
        return

    def observe(fn: Callable[[Any], None] | None, obj: Any) -> None:
        if fn is None:
            return
        try:
            fn(obj)
        except Exception as e:  # noqa: BLE001 - a probe never raises into vLLM
            _core.report_error(f"{cls.__qualname__}.{name}", f"{type(e).__name__}: {e}")

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        observe(before, self)
        result = orig(self, *args, **kwargs)
        observe(after, self)
        return result

    functools.update_wrapper(wrapper, orig)
    _mark(wrapper)
    setattr(cls, name, wrapper)


def _worker_initialised(worker: Any) -> None:
    rank, local_rank = getattr(worker, "rank", None), getattr(worker, "local_rank", None)
    set_role("worker", rank=rank, local_rank=local_rank)
    _wrap_worker_class(type(worker))
    if _bind_step is not None:
        _bindings.start()


def _on_worker_base(module: Any) -> None:
    _observe(module.WorkerBase, "__init__", after=_worker_initialised)


def _on_engine_core(module: Any) -> None:
    _observe(module.EngineCore, "__init__", before=lambda _: set_role("engine_core"))
    # The engine's step protocol, once it exists: plugins load inside EngineCore.__init__ in
    # a spawned engine core, too late for the __init__ watch there; add_request comes after.
    _observe(module.EngineCore, "add_request", before=record_engine)


_engine_seen = False


def record_engine(core: Any) -> None:
    """Journal once how the engine core steps: async scheduling on or off, and the batch
    queue (a queue of size > 1 runs ``step_with_batch_queue``: the next batch is scheduled
    before the previous one's output is back). A second ``engine_core`` role record."""
    global _engine_seen
    if _engine_seen:
        return
    _engine_seen = True
    fn = getattr(core, "step_fn", None)
    set_role(
        "engine_core",
        async_scheduling=getattr(core, "async_scheduling", None),
        batch_queue=getattr(core, "batch_queue_size", None),
        step=getattr(fn, "__name__", None),
    )


def _on_llm_engine(module: Any) -> None:
    """Offline use: a process that builds ``LLMEngine`` (``vllm.LLM``) is its front end; the
    API server builds ``AsyncLLM`` instead."""
    _observe(module.LLMEngine, "__init__", before=lambda _: set_role("offline"))


def _role_from_process() -> None:
    """Role from multiprocessing's process name (vLLM names its children) or the main module.

    vLLM loads plugins inside ``EngineCore.__init__``, too late for the ``__init__`` watch to
    see that process's engine, so the process name is the first witness there.
    """
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return
    name = str(mp.current_process().name)
    if name.startswith("EngineCore"):
        dp = name.partition("_DP")[2]
        set_role("engine_core", **({"dp_rank": int(dp)} if dp.isascii() and dp.isdigit() else {}))
        return
    if mp.parent_process() is not None:
        return  # a spawned child re-imports the parent's main module as __mp_main__
    main = sys.modules.get("__main__")
    main_name = getattr(getattr(main, "__spec__", None), "name", "") or ""
    if main_name.startswith("vllm.entrypoints"):
        set_role("api_server")


_installed = False


def install() -> None:
    """Arm the vLLM watches and note the process's role where already known (idempotent)."""
    global _installed, _bind_step
    _role_from_process()
    if _installed:
        return
    _installed = True
    _postimport.when_imported("vllm.v1.worker.worker_base", _on_worker_base)
    _postimport.when_imported("vllm.v1.engine.core", _on_engine_core)
    _postimport.when_imported("vllm.v1.engine.llm_engine", _on_llm_engine)
    _postimport.when_imported("vllm.logger", lambda _: _spec.install_log_capture())
    if not bindings_enabled():
        _bind_step = None
        _spec.BIND = None
        return
    _spec.BIND = _bindings.spec_step
    _postimport.when_imported("vllm.v1.engine.output_processor", _extids.on_output_processor)
    _postimport.when_imported("vllm.entrypoints.serve.engine.serving", _extids.on_serving)


def bindings_enabled() -> bool:
    return os.environ.get(L.ENV_BINDINGS, "") != "0"
