"""Step accounting in the process that runs the model, without vLLM: the prefill/decode split
of a scheduler output (chunked prefill, speculative drafts, mixed steps), empty steps, and
dummy steps (warm-up, profiling, graph capture, padding) counted apart from steps, on fake
worker and runner classes shaped like vLLM's V1 and V2 ones. The last test checks, by reading
the installed vLLM's source (not importing it), that the methods the probe wraps by name
exist there and are used the way these fakes use them."""

from __future__ import annotations

import ast
import importlib.util
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from servewitness_probe import _core, _hooks, _split, _vllm
from servewitness_probe import layout as L

HOOK = L.hook_slot(0)


class FakeState:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def remember(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)


@pytest.fixture
def counters(monkeypatch: pytest.MonkeyPatch) -> Iterator[memoryview]:
    """Fresh private counters for the probe code under test; no probe state on disk, no
    request bindings; any probe error fails the test."""
    c = memoryview(bytearray(L.SLOT_BYTES * L.N_SLOTS)).cast("Q")
    errors: list[tuple[str, str]] = []
    monkeypatch.setattr(_core, "COUNTERS", c)
    monkeypatch.setattr(_core, "state", lambda mode="lazy": FakeState())
    monkeypatch.setattr(_core, "report_error", lambda where, msg: errors.append((where, msg)))
    monkeypatch.setattr(_vllm, "_bind_step", None)
    yield c
    assert errors == []
    assert (_vllm._warming, _vllm._dummy_depth) == (0, 0)  # every wrapper unwound


def so(
    counts: dict[str, int],
    new: tuple[str, ...] = (),
    spec: dict[str, list[int]] | None = None,
) -> types.SimpleNamespace:
    """A scheduler output shaped like vLLM's: COUNTS per request id, NEW the new requests (the
    others continue), SPEC the speculative drafts per request."""
    return types.SimpleNamespace(
        total_num_scheduled_tokens=sum(counts.values()),
        num_scheduled_tokens=counts,
        scheduled_new_reqs=[types.SimpleNamespace(req_id=r) for r in new],
        scheduled_spec_decode_tokens=spec or {},
        scheduled_cached_reqs=types.SimpleNamespace(req_ids=[r for r in counts if r not in new]),
    )


def split(s: types.SimpleNamespace) -> tuple[int, int]:
    return _split.split_tokens(s, s.total_num_scheduled_tokens)


# -- the prefill/decode split ------------------------------------------------------------------


def test_new_requests_are_prefill() -> None:
    assert split(so({"a": 7, "b": 3}, new=("a", "b"))) == (10, 0)


def test_continuing_requests_of_one_token_are_decode() -> None:
    assert split(so({"a": 1, "b": 1, "c": 1})) == (0, 3)


def test_chunked_prefill_continues_as_prefill_beside_decodes() -> None:
    # step 1: a's first chunk (new); step 2: a's second chunk (continuing, 8 tokens) beside b
    # decoding one token and a new request c
    assert split(so({"a": 8}, new=("a",))) == (8, 0)
    assert split(so({"a": 8, "b": 1, "c": 5}, new=("c",))) == (13, 1)
    # a last chunk of exactly one token cannot be told from a decode: counted as decode
    assert split(so({"a": 1, "b": 1})) == (0, 2)


def test_speculative_drafts_decode_with_their_request() -> None:
    # a verifies 3 drafts (1 + 3 tokens), b has none (1 token): all decode
    assert split(so({"a": 4, "b": 1}, spec={"a": [5, 6, 7]})) == (0, 5)
    # c continues a chunked prefill (16 tokens) beside them: only c is prefill
    assert split(so({"a": 4, "b": 1, "c": 16}, spec={"a": [5, 6, 7]})) == (16, 5)
    # a scheduled fewer tokens than 1 + its drafts is not a decode of its drafts
    assert split(so({"a": 3, "c": 16}, spec={"a": [5, 6, 7]})) == (19, 0)


def test_output_of_another_shape_is_not_split() -> None:
    assert _split.split_tokens(types.SimpleNamespace(total_num_scheduled_tokens=4), 4) == (0, 0)


# -- steps: productive, empty, phases ----------------------------------------------------------


def test_productive_empty_and_mixed_steps_are_counted(counters: memoryview) -> None:
    c = counters
    _vllm._count_step(so({"a": 6}, new=("a",)))  # prefill
    assert c[L.S_CURRENT_PHASE] == L.PHASE_PRODUCTIVE | L.PHASE_PREFILL
    _vllm._count_step(so({"a": 1, "b": 4}, new=("b",)))  # mixed: a decodes, b prefills
    assert c[L.S_CURRENT_PHASE] == L.PHASE_PRODUCTIVE | L.PHASE_PREFILL | L.PHASE_DECODE
    _vllm._count_step(so({}))  # empty
    assert c[L.S_CURRENT_PHASE] == 0
    _vllm._count_step(so({"a": 1, "b": 1}))  # decode
    _vllm._count_step(types.SimpleNamespace(total_num_scheduled_tokens=0))  # empty
    got = {
        "total": c[L.S_STEPS_TOTAL],
        "productive": c[L.S_STEPS_PRODUCTIVE],
        "empty": c[L.S_STEPS_EMPTY],
        "prefill": c[L.S_STEPS_PREFILL],
        "decode": c[L.S_STEPS_DECODE],
        "prefill_tokens": c[L.S_TOKENS_PREFILL],
        "decode_tokens": c[L.S_TOKENS_DECODE],
        "tokens": c[L.S_TOKENS_SCHEDULED],
        "max_batch": c[L.S_REQUESTS_MAX],
        "dummy": c[L.S_STEPS_DUMMY],
    }
    assert got == {
        "total": 5,
        "productive": 3,
        "empty": 2,
        "prefill": 2,  # the mixed step counts as both
        "decode": 2,
        "prefill_tokens": 10,
        "decode_tokens": 3,
        "tokens": 13,
        "max_batch": 2,
        "dummy": 0,
    }
    assert got["empty"] == got["total"] - got["productive"]


# -- dummy steps on fake workers and runners ---------------------------------------------------


def fire() -> None:
    _hooks._fire(HOOK)


class V1Runner:
    """Like V1's GPUModelRunner: warm-up, profiling and capture go through ``_dummy_run``, never
    through the worker's ``execute_model``; a step may pad with a dummy run (data parallel)."""

    def __init__(self) -> None:
        self.forwards = 0

    def _dummy_run(self, num_tokens: int, **_: Any) -> int:
        self.forwards += 1
        fire()
        return num_tokens

    def profile_run(self) -> None:
        self._dummy_run(64, is_profile=True)

    def capture_model(self) -> None:
        for n in (1, 2, 4):
            self._dummy_run(n)

    def execute_model(self, s: Any) -> str:
        self.forwards += 1
        if not s.total_num_scheduled_tokens:
            self._dummy_run(1)  # padding inside an empty step
            return "empty"
        fire()
        return "out"

    def sample_tokens(self, grammar: Any) -> str:
        fire()
        return "sampled"


class V1Worker:
    def init_device(self) -> None:
        self.model_runner = self.runner_class()

    runner_class: type = V1Runner

    def load_model(self) -> None:
        pass

    def determine_available_memory(self) -> int:
        self.model_runner.profile_run()
        return 1

    def compile_or_warm_up_model(self) -> None:
        self.model_runner._dummy_run(8)  # a compile size
        self.model_runner.capture_model()

    def execute_model(self, s: Any) -> Any:
        return self.model_runner.execute_model(s)

    def sample_tokens(self, grammar: Any) -> Any:
        return self.model_runner.sample_tokens(grammar)


def boot(worker_base: type[V1Worker]) -> Any:
    """Wrap the worker class as the probe does at ``WorkerBase.__init__``, then start it the
    way vLLM does: device, model, memory profile, warm-up. (Fresh subclasses of the worker
    and its runner: the probe wraps classes, and no test may see another's wrappers.)"""
    runner_cls = type(worker_base.runner_class.__name__, (worker_base.runner_class,), {})
    worker_cls = type(worker_base.__name__, (worker_base,), {"runner_class": runner_cls})
    _vllm._wrap_worker_class(worker_cls)
    w = worker_cls()
    w.init_device()
    w.load_model()
    w.determine_available_memory()
    w.compile_or_warm_up_model()
    return w


def serve(w: Any) -> None:
    """Two requests: a prefill step, a mixed step, two decode steps and one empty step."""
    for s in (so({"a": 5}, new=("a",)), so({"a": 1, "b": 3}, new=("b",)), so({"a": 1, "b": 1})):
        w.execute_model(s)
        w.sample_tokens(None)
    w.execute_model(so({"b": 1}))
    w.sample_tokens(None)
    w.execute_model(so({}))


def test_v1_warm_up_profile_and_capture_are_dummy_steps_not_steps(counters: memoryview) -> None:
    c = counters
    w = boot(V1Worker)
    assert w.model_runner.forwards == 5  # profile 1, compile size 1, capture 3
    assert c[L.S_STEPS_DUMMY] == 5
    assert (c[L.S_STEPS_TOTAL], c[L.S_STEPS_PRODUCTIVE], c[L.S_STEPS_EMPTY]) == (0, 0, 0)
    # the fires inside them are outside steps
    assert (c[HOOK], c[HOOK + L.HK_FIRES_OUTSIDE], c[HOOK + L.HK_FIRES_PRODUCTIVE]) == (5, 5, 0)

    serve(w)
    # the empty step pads with one dummy run: one more dummy, and it is still one empty step
    assert c[L.S_STEPS_DUMMY] == 6
    assert (c[L.S_STEPS_TOTAL], c[L.S_STEPS_PRODUCTIVE], c[L.S_STEPS_EMPTY]) == (5, 4, 1)
    assert (c[L.S_STEPS_PREFILL], c[L.S_STEPS_DECODE]) == (2, 3)
    # 4 productive steps fire twice each (forward, sampling): on prefill 2 x 2, decode 3 x 2;
    # the padding fire is outside steps, though it ran inside execute_model
    assert c[HOOK + L.HK_FIRES_OUTSIDE] == 6
    assert (c[HOOK + L.HK_FIRES_PREFILL], c[HOOK + L.HK_FIRES_DECODE]) == (4, 6)
    assert c[L.S_IN_STEP] == 0


def test_dummy_run_inside_a_step_restores_the_step(counters: memoryview) -> None:
    c = counters
    w = boot(V1Worker)
    w.execute_model(so({"a": 2}, new=("a",)))
    c[L.S_IN_STEP] = 1  # as inside the next execute_model, which pads with a dummy run
    w.model_runner._dummy_run(1)
    assert c[L.S_IN_STEP] == 1  # back in the step after it
    assert c[L.S_CURRENT_PHASE] == L.PHASE_PRODUCTIVE | L.PHASE_PREFILL
    assert c[HOOK + L.HK_FIRES_PREFILL] == 1  # the step's own fire; the padding's was outside
    c[L.S_IN_STEP] = 0


class NestedRunner(V1Runner):
    """A subclass whose ``_dummy_run`` calls its base's: one dummy step, not two."""

    def _dummy_run(self, num_tokens: int, **kw: Any) -> int:
        return super()._dummy_run(num_tokens, **kw)


class NestedWorker(V1Worker):
    runner_class = NestedRunner


def test_nested_dummy_runs_count_once_and_wrapping_is_idempotent(counters: memoryview) -> None:
    w = boot(NestedWorker)
    _vllm._wrap_runner_class(type(w.model_runner))  # again: no second wrapper
    _vllm._wrap_worker_class(type(w))
    w.model_runner._dummy_run(1)
    assert counters[L.S_STEPS_DUMMY] == 5 + 1
    assert w.model_runner.forwards == 6


class V2Runner:
    """Like V2's GPUModelRunner: ``_dummy_run`` calls the runner's own ``execute_model`` with
    ``dummy_run=True`` (the worker's is not involved)."""

    def __init__(self) -> None:
        self.forwards = 0

    def _dummy_run(self, num_tokens: int, **_: Any) -> None:
        self.execute_model(so({"_dummy_req_0": num_tokens}), dummy_run=True)

    def profile_run(self) -> None:
        self._dummy_run(64, is_profile=True)

    def execute_model(self, s: Any, dummy_run: bool = False) -> Any:
        self.forwards += 1
        fire()
        return None

    def sample_tokens(self, grammar: Any) -> str:
        fire()
        return "sampled"


class V2Worker(V1Worker):
    runner_class = V2Runner

    def compile_or_warm_up_model(self) -> None:
        self.model_runner._dummy_run(8)
        # V2's kernel warm-up drives hand-built scheduler outputs through the worker itself
        warmup_kernels(self.execute_model, self.sample_tokens)


def warmup_kernels(execute: Any, sample: Any) -> None:
    execute(so({"w0": 16, "w1": 16}, new=("w0", "w1")))
    sample(None)
    for _ in range(3):
        execute(so({"w0": 1, "w1": 1}))
        sample(None)
    execute(so({}))


def test_v2_dummy_runs_and_kernel_warm_up_are_dummy_steps_not_steps(counters: memoryview) -> None:
    c = counters
    w = boot(V2Worker)
    # profile 1, compile size 1, kernel warm-up 5 worker steps: all dummy
    assert (w.model_runner.forwards, c[L.S_STEPS_DUMMY]) == (7, 7)
    assert (c[L.S_STEPS_TOTAL], c[L.S_STEPS_PRODUCTIVE], c[L.S_TOKENS_SCHEDULED]) == (0, 0, 0)
    assert (c[L.S_STEPS_PREFILL], c[L.S_STEPS_DECODE]) == (0, 0)
    assert c[HOOK] == c[HOOK + L.HK_FIRES_OUTSIDE] == 7 + 4  # forwards and warm-up samplings
    serve(w)
    assert c[L.S_STEPS_DUMMY] == 7  # no padding in V2's empty step here
    assert (c[L.S_STEPS_TOTAL], c[L.S_STEPS_PRODUCTIVE], c[L.S_STEPS_EMPTY]) == (5, 4, 1)
    assert (c[HOOK + L.HK_FIRES_PREFILL], c[HOOK + L.HK_FIRES_DECODE]) == (4, 6)


def test_without_the_warm_up_wrapper_warm_up_would_read_as_steps(counters: memoryview) -> None:
    """Negative control: the same V2 warm-up driven through a worker whose warm-up method the
    probe does not know (another name) counts as productive steps, which is what the
    compile_or_warm_up_model wrapper prevents."""

    class Unknown(V2Worker):
        def compile_or_warm_up_model(self) -> None:
            pass

        def other_warm_up(self) -> None:
            warmup_kernels(self.execute_model, self.sample_tokens)

    w = boot(Unknown)
    w.other_warm_up()
    assert counters[L.S_STEPS_PRODUCTIVE] == 4 and counters[L.S_STEPS_DUMMY] == 1


class BareRunner:
    """A runner with no ``_dummy_run`` (another vLLM): left alone, steps still counted."""

    def execute_model(self, s: Any) -> None:
        return None

    def sample_tokens(self, grammar: Any) -> None:
        return None


class BareWorker(V1Worker):
    runner_class = BareRunner

    def determine_available_memory(self) -> int:
        return 1

    def compile_or_warm_up_model(self) -> None:
        pass


def test_runner_without_a_dummy_run_is_left_alone(counters: memoryview) -> None:
    w = boot(BareWorker)
    assert not hasattr(type(w.model_runner), "_dummy_run")
    serve(w)
    assert (counters[L.S_STEPS_TOTAL], counters[L.S_STEPS_DUMMY]) == (5, 0)


def test_a_failing_dummy_run_raises_its_own_error_and_unwinds(counters: memoryview) -> None:
    class Failing(V1Runner):
        def _dummy_run(self, num_tokens: int, **_: Any) -> int:
            raise RuntimeError("out of memory")

    _vllm._wrap_runner_class(Failing)
    counters[L.S_IN_STEP] = 1
    with pytest.raises(RuntimeError, match="out of memory"):
        Failing()._dummy_run(1)
    assert counters[L.S_STEPS_DUMMY] == 1 and counters[L.S_IN_STEP] == 1
    counters[L.S_IN_STEP] = 0


# -- the names wrapped exist in the installed vLLM ---------------------------------------------


def _class(path: Path, name: str) -> ast.ClassDef:
    tree = ast.parse(path.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    return cls


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    (fn,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return fn


def test_wrapped_names_exist_in_the_installed_vllm() -> None:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    worker = Path(next(iter(spec.submodule_search_locations))) / "v1" / "worker"
    v1 = _class(worker / "gpu_model_runner.py", "GPUModelRunner")
    assert _method(v1, _vllm.DUMMY_METHOD)
    v2 = _class(worker / "gpu" / "model_runner.py", "GPUModelRunner")
    v2_dummy = ast.unparse(_method(v2, _vllm.DUMMY_METHOD))
    assert "self.execute_model(" in v2_dummy and "dummy_run=True" in v2_dummy
    gpu = _method(_class(worker / "gpu_worker.py", "Worker"), _vllm.WARMUP_METHOD)
    assert "warmup_kernels(self.model_runner, self.execute_model" in ast.unparse(gpu)
    assert _method(_class(worker / "cpu_worker.py", "CPUWorker"), _vllm.WARMUP_METHOD)


def test_declared_hooks_on_the_wrapped_methods_do_not_turn_counting_off(
    counters: memoryview,
) -> None:
    """A user's hook on the worker's step or warm-up method, or on the runner's _dummy_run, is a
    probe wrapper too; the probe's own counting must still wrap around it (it once skipped
    any method already wrapped by the probe)."""
    c = counters
    bases = {name: L.hook_slot(i) for i, name in enumerate(("step", "warm", "dummy"), start=1)}

    # declared hooks wrap the classes first, when their modules are imported
    class HookedRunner(V2Runner):
        _dummy_run = _hooks.counting(V2Runner._dummy_run, bases["dummy"])

    class HookedWorker(V2Worker):
        runner_class = HookedRunner
        execute_model = _hooks.counting(V1Worker.execute_model, bases["step"])
        compile_or_warm_up_model = _hooks.counting(V2Worker.compile_or_warm_up_model, bases["warm"])

    w = boot(HookedWorker)
    serve(w)
    assert c[L.S_STEPS_DUMMY] == 7 and c[bases["dummy"]] == 2  # profile + compile size
    assert (c[L.S_STEPS_TOTAL], c[L.S_STEPS_PRODUCTIVE]) == (5, 4)
    assert c[bases["warm"]] == c[bases["warm"] + L.HK_FIRES_OUTSIDE] == 1
    # the worker's step hook: 5 warm-up calls outside steps, then one per step
    assert c[bases["step"]] == 5 + 5 and c[bases["step"] + L.HK_FIRES_OUTSIDE] == 5


# -- a step stays open from execute_model to the end of sample_tokens ---------------------------


class TwoPhaseRunner(V1Runner):
    """V1's two-phase protocol: execute_model returns nothing, sample_tokens the output."""

    def execute_model(self, s: Any) -> Any:
        self.forwards += 1
        return None if s.total_num_scheduled_tokens else "empty"


class TwoPhaseWorker(V1Worker):
    runner_class = TwoPhaseRunner


def test_a_two_phase_step_is_open_until_sample_tokens_ends(counters: memoryview) -> None:
    """Its hooks fire in sample_tokens: a reader that judged the step while only execute_model
    had run would see the step without its fire. The probe keeps the step open (S_IN_STEP)
    until sample_tokens ends; a step whose execute_model returns its output closes there."""
    c = counters
    w = boot(TwoPhaseWorker)
    warm = c[HOOK + L.HK_FIRES]  # warm-up's fires (dummy steps)
    w.execute_model(so({"a": 5}, new=("a",)))
    assert c[L.S_IN_STEP] == 1 and c[HOOK + L.HK_FIRES] == warm  # its fire is still to come
    w.sample_tokens(None)
    assert c[L.S_IN_STEP] == 0 and c[HOOK + L.HK_FIRES] == warm + 1
    assert c[HOOK + L.HK_FIRES_PREFILL] == 1
    w.execute_model(so({}))  # an empty step returns its output from execute_model: closed
    assert c[L.S_IN_STEP] == 0


def test_a_failing_execute_model_does_not_leave_the_step_open(counters: memoryview) -> None:
    class Failing(TwoPhaseRunner):
        def execute_model(self, s: Any) -> Any:
            raise RuntimeError("boom")

    class Worker(V1Worker):
        runner_class = Failing

    w = boot(Worker)
    with pytest.raises(RuntimeError, match="boom"):
        w.execute_model(so({"a": 1}))
    assert counters[L.S_IN_STEP] == 0
