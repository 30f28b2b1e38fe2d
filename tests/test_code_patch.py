"""Monkey-patching in memory, for real: a probed Python process (no vLLM) imports a module
with a class whose method is a declared hook target, then an attacker module replaces what
runs it after import, in one of several ways, leaving every file on disk as it was. The
agent's judgement (``to_report``, what ``verifier inspect`` and the agent run) must flag
``provenance.code.patched`` naming the layer and its file; the unpatched process (the
negative control) must verify clean.

A second set drives a toy ``vllm.v1.worker`` (a package of that name on PYTHONPATH, so the
probe's real watches install on it) whose worker calls ``self.model_runner.execute_model``:
the live runner's step methods are recorded as the worker calls them, so a patch set on
the runner object itself (not its class) is seen too.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from servewitness.evidence.process import read_process
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.report import to_report
from servewitness.model import DRIFT_CODE_PATCHED, DRIFT_CODE_UNVERIFIED, CodeChain, ProcessReport
from servewitness.policy import TargetSnapshot, load_policy
from tests.helpers import not_vllm_policy, probe_env, wait_ready

TARGET = """\
def helper(x):
    return x + 1


class Runner:
    def step(self, x):
        return helper(x)


class Other:
    def step(self, x):
        return helper(x)
"""

# Each attack, applied by attacker.py after target_mod was imported (and the probe wrapped
# Runner.step for the declared hook). Line numbers below are attacker.py's.
ATTACKER = """\
import functools
import inspect
import types

import target_mod


def evil_step(self, x):
    return -1


def _original():
    return inspect.unwrap(target_mod.Runner.step)


def apply(kind):
    R = target_mod.Runner
    if kind == "replace":
        R.step = evil_step
    elif kind == "code":
        # Code compiled from an edited copy of target_mod.py under its own name: file,
        # qualified name and first line look right; only the bytecode differs.
        path = target_mod.__file__
        source = open(path).read().replace("return helper(x)", "return helper(x) * 7", 1)
        top = compile(source, path, "exec", dont_inherit=True)
        cls = next(c for c in top.co_consts if getattr(c, "co_name", "") == "Runner")
        code = next(c for c in cls.co_consts if getattr(c, "co_name", "") == "step")
        _original().__code__ = code
    elif kind == "wraps":
        orig = R.step

        @functools.wraps(orig)
        def wrapper(self, x):
            return orig(self, x) * 2

        R.step = wrapper
    elif kind == "exec":
        ns = {}
        exec("def step(self, x):\\n    return x + 3\\n", ns)
        R.step = ns["step"]
    elif kind == "globals":
        # The original code object, run in this module's namespace: its `helper` is ours.
        orig = _original()
        R.step = types.FunctionType(orig.__code__, globals(), "step")
        R.step.__qualname__ = "Runner.step"
        R.step.__module__ = "target_mod"
    elif kind == "borrowed":
        R.step = target_mod.Other.step  # pristine, same file, another class's definition
    elif kind == "probe_code":
        # Hide behind the probe: keep its wrapper object (left out of every chain), swap its
        # code for one with the same free variables that never calls the original.
        R.__dict__["step"].__code__ = _swrapper(None, None, None).__code__
    elif kind in ("probe_cell", "probe_slot"):
        # Keep the probe's wrapper object and code, change what its closure holds: the
        # function it calls (the wrapper still counts fires, __wrapped__ still names the
        # original), or the hook slot it counts in.
        w = R.__dict__["step"]
        for cell in w.__closure__:
            value = cell.cell_contents
            if kind == "probe_cell" and value is w.__wrapped__:
                cell.cell_contents = evil_step
            elif kind == "probe_slot" and type(value) is int:
                cell.cell_contents = value + 1


def _swrapper(compiling, base, fn):
    def swrapper(*args, **kwargs):
        return (compiling, base, fn) and -1

    return swrapper


def helper(x):
    return x - 1000
"""

MAIN = """\
import sys, time
import target_mod, attacker
r = target_mod.Runner()
r.step(1)
attacker.apply(sys.argv[1])
r.step(1)
time.sleep(1.5)  # the sweeper (once a second) journals the changed chain
open(sys.argv[2], "w").write("ok")
time.sleep(600)
"""


@pytest.fixture(scope="module")
def mods(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("codepatch")
    (d / "target_mod.py").write_text(TARGET)
    (d / "attacker.py").write_text(ATTACKER)
    (d / "main.py").write_text(MAIN)
    return d


def _pythonpath(*dirs: Path) -> str:
    return os.pathsep.join([*map(str, dirs), *filter(None, [os.environ.get("PYTHONPATH")])])


def _report(
    code_dir: Path,
    tmp_path: Path,
    args: list[str],
    until: Callable[[ProcessReport], bool] = lambda r: True,
    **env: str,
) -> ProcessReport:
    """The agent's report of main.py ARGS run in CODE_DIR, once UNTIL holds (the probe's
    sweeper journals a changed chain within about a second; a loaded machine may be late)."""
    ready = tmp_path / "ready"
    full = probe_env(
        tmp_path / "probe",
        VERIFIER_PROBE_EARLY="1",
        PYTHONPATH=_pythonpath(code_dir),
        PYTHONDONTWRITEBYTECODE="1",
        **env,
    )
    proc = subprocess.Popen(
        [sys.executable, str(code_dir / "main.py"), *args, str(ready)],
        env=full,
        stderr=subprocess.PIPE,
    )
    try:
        wait_ready(proc, ready)
        procfs = ProcFS()
        deadline = time.monotonic() + 15
        while True:
            report = to_report(procfs, read_process(procfs, proc.pid))
            if until(report) or time.monotonic() > deadline:
                return report
            time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def _hooked(mods: Path, tmp_path: Path, kind: str) -> tuple[ProcessReport, CodeChain]:
    def changed(r: ProcessReport) -> bool:  # journaled again after the attack
        return kind == "none" or any(c.subject == "hook:h" and c.changes > 1 for c in r.code)

    report = _report(mods, tmp_path, [kind], changed, VERIFIER_HOOKS="h=target_mod:Runner.step")
    chains = [c for c in report.code if c.subject == "hook:h" and c.via == "class"]
    assert len(chains) == 1, report.code
    return report, chains[0]


def _patched(report: ProcessReport) -> list[str]:
    return [d.detail for d in report.drift if d.id == DRIFT_CODE_PATCHED]


def test_unpatched_hook_target_verifies_clean(mods: Path, tmp_path: Path) -> None:
    """Negative control: the declared hook's own wrapper is left out, and the one layer that
    runs is target_mod.py's own Runner.step, verified against the file."""
    report, chain = _hooked(mods, tmp_path, "none")
    assert chain.status == "verified", chain
    assert chain.probe_layers == 1
    assert [(x.code_qualname, x.file, x.check) for x in chain.layers] == [
        ("Runner.step", str(mods / "target_mod.py"), "verified")
    ]
    assert chain.changes == 1
    assert not [d for d in report.drift if d.id.startswith("provenance.code.")]


def test_method_replaced_after_import_is_flagged_naming_its_file_and_line(
    mods: Path, tmp_path: Path
) -> None:
    report, chain = _hooked(mods, tmp_path, "replace")
    assert chain.status == "patched"
    assert chain.probe_layers == 0  # the replacement dropped the probe's wrapper too
    assert chain.changes == 2  # recorded clean at import, again after the patch
    (detail,) = _patched(report)
    assert "target_mod.Runner.step (hook:h) is not its file's definition" in detail
    assert f"defined in {mods / 'attacker.py'} line 8" in detail
    # The policy turns it into an ERROR: the target FAILs (the process judged as a worker:
    # a process of no vLLM role is not judged).
    snap = TargetSnapshot("t", (dataclasses.replace(report, role="worker"),), time.time())
    verdict = load_policy(not_vllm_policy('version = 1\n[[hooks]]\nname = "h"\n')).evaluate_target(
        snap, now=snap.received_unix
    )
    ids = {f.id: f.severity.value for f in verdict.findings}
    assert ids[DRIFT_CODE_PATCHED] == "error" and verdict.verdict.value == "FAIL"


def test_code_object_swapped_under_the_same_file_and_name_is_caught_by_its_digest(
    mods: Path, tmp_path: Path
) -> None:
    """``__code__`` replaced with code compiled from an edited copy under the file's own name:
    file, qualified name and line all look right; the digest of the bytecode does not."""
    report, chain = _hooked(mods, tmp_path, "code")
    (layer,) = chain.layers
    assert (layer.file, layer.code_qualname, layer.line) == (
        str(mods / "target_mod.py"),
        "Runner.step",
        6,
    )
    assert layer.check == "patched"
    (detail,) = _patched(report)
    assert "its bytecode differs from" in detail and "its __code__ was replaced" in detail


def test_wrapper_put_around_the_original_is_named_as_the_outer_layer(
    mods: Path, tmp_path: Path
) -> None:
    """A functools.wraps wrapper from attacker.py around the probe's wrapper around the
    original: the original still verifies; the outer layer is the patch, and the finding
    says which (its own file verifies, but the definition has no decorator to account for it)."""
    report, chain = _hooked(mods, tmp_path, "wraps")
    assert [(x.code_qualname, x.check) for x in chain.layers] == [
        ("apply.<locals>.wrapper", "patched"),
        ("Runner.step", "verified"),
    ]
    assert chain.layers[1].held is True  # the wrapper's closure holds what it calls
    assert chain.probe_layers == 1
    (detail,) = _patched(report)
    assert f"layer 0 of 2, apply.<locals>.wrapper in {mods / 'attacker.py'} line" in detail
    assert "a wrapper put around it at run time" in detail


def test_method_built_with_exec_has_no_file(mods: Path, tmp_path: Path) -> None:
    report, chain = _hooked(mods, tmp_path, "exec")
    assert chain.layers[0].file == "<string>"
    (detail,) = _patched(report)
    assert "has no file (exec'd or built at run time: '<string>')" in detail


def test_original_code_run_in_another_modules_globals_is_flagged(
    mods: Path, tmp_path: Path
) -> None:
    """Variation: the very code object of Runner.step (same file, line, name and digest), in a
    new function whose globals are attacker.py's, so its ``helper`` is the attacker's. Only
    the namespace it runs in gives it away."""
    report, chain = _hooked(mods, tmp_path, "globals")
    (layer,) = chain.layers
    assert (layer.code_qualname, layer.qualname, layer.module) == (
        "Runner.step",
        "Runner.step",
        "target_mod",
    )
    (detail,) = _patched(report)
    assert f"runs in the namespace of {mods / 'attacker.py'}" in detail


def test_pristine_definition_of_another_class_is_not_the_owners(mods: Path, tmp_path: Path) -> None:
    """Variation: Other.step from the same pristine file put on Runner (as V1's method put on
    a V2 class would be): the file is right, the definition is not Runner's."""
    report, chain = _hooked(mods, tmp_path, "borrowed")
    (layer,) = chain.layers
    assert layer.code_qualname == "Other.step" and layer.check == "patched"
    (detail,) = _patched(report)
    assert "not Runner.step of" in detail


def test_code_swapped_into_the_probes_own_wrapper_is_not_left_out(
    mods: Path, tmp_path: Path
) -> None:
    """Variation: the probe's wrappers are left out of chains, so an attacker swaps the code
    of the probe's own wrapper. It is then no longer the probe's (known by object and code):
    its layer is recorded, from attacker.py, running in the probe's module namespace."""
    report, chain = _hooked(mods, tmp_path, "probe_code")
    assert chain.probe_layers == 0
    assert [(x.code_qualname, x.check) for x in chain.layers] == [
        ("_swrapper.<locals>.swrapper", "patched"),
        ("Runner.step", "verified"),
    ]
    (detail,) = _patched(report)
    assert "runs in the namespace of" in detail and "probe/servewitness_probe/_hooks.py" in detail


@pytest.mark.parametrize("kind", ["probe_cell", "probe_slot"])
def test_a_cell_of_the_probes_own_wrapper_swapped_is_not_left_out(
    mods: Path, tmp_path: Path, kind: str
) -> None:
    """The variation past the code check: the probe's wrapper keeps its object and its code,
    but what its closure holds is swapped: the function it calls (``evil_step``; its
    ``__wrapped__`` still names the original, which never runs again while the wrapper keeps
    counting fires) or the hook slot it counts in. Before, the wrapper was left out and the
    chain verified. Now it is a layer of the chain like any other: the probe's code, not the
    owner's (patched), and what it calls is what its closure holds."""
    report, chain = _hooked(mods, tmp_path, kind)
    assert chain.probe_layers == 0, chain
    layers = [(x.code_qualname, x.check) for x in chain.layers]
    assert layers[0] == ("counting.<locals>.swrapper", "patched"), layers
    assert chain.status != "verified" and _patched(report), (chain, report.drift)
    if kind == "probe_cell":  # its __wrapped__ (the original) is not what it holds
        assert [x.held for x in chain.layers][:2] == [None, False], chain.layers


# ------------------------------------------------------------- the live runner, as called

TOY_BASE = """\
class WorkerBase:
    def __init__(self):
        self.rank = 0
        self.local_rank = 0
"""

TOY_RUNNER = """\
import functools

from vllm.v1.worker.worker_base import WorkerBase


def _decorate(fn):
    @functools.wraps(fn)
    def decorated(*args, **kwargs):
        return fn(*args, **kwargs)

    return decorated


class ToyRunner:
    @_decorate
    def execute_model(self, so):
        return None

    def sample_tokens(self, grammar):
        return "sampled"


class GpuWorker(WorkerBase):
    def execute_model(self, so):
        return self.model_runner.execute_model(so)

    def sample_tokens(self, grammar):
        return self.model_runner.sample_tokens(grammar)


class ToyWorker(GpuWorker):  # inherits its step methods, as vLLM's CPUWorker does
    def __init__(self):
        super().__init__()
        self.model_runner = ToyRunner()
"""

TOY_ATTACK = """\
def evil_execute(self, so):
    return "forged"
"""

TOY_MAIN = """\
import functools, sys, time, types
from vllm.v1.worker.toy_runner import ToyWorker
from toy_attack import evil_execute

w = ToyWorker()
so = types.SimpleNamespace(total_num_scheduled_tokens=1, num_scheduled_tokens={"r": 1})
w.execute_model(so)
w.sample_tokens(None)
if sys.argv[1] == "instance":
    w.model_runner.execute_model = types.MethodType(evil_execute, w.model_runner)
elif sys.argv[1] == "partial":
    w.model_runner.execute_model = functools.partial(evil_execute, w.model_runner)
w.execute_model(so)
time.sleep(1.5)
open(sys.argv[2], "w").write("ok")
time.sleep(600)
"""


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("toyvllm")
    worker = d / "vllm" / "v1" / "worker"
    worker.mkdir(parents=True)
    for pkg in (d / "vllm", d / "vllm" / "v1", worker):
        (pkg / "__init__.py").write_text("")
    (worker / "worker_base.py").write_text(TOY_BASE)
    (worker / "toy_runner.py").write_text(TOY_RUNNER)
    (d / "main.py").write_text(TOY_MAIN)
    (d / "toy_attack.py").write_text(TOY_ATTACK)
    yield d


def _chains(report: ProcessReport) -> dict[tuple[str, str], CodeChain]:
    return {(c.subject, c.via): c for c in report.code}


def test_live_runner_and_worker_step_methods_verify_clean(toy: Path, tmp_path: Path) -> None:
    """Negative control: the runner's execute_model (one decorator: its wrapper verifies
    against toy_runner.py, and the definition accounts for it), sample_tokens, and the
    worker's inherited methods behind the probe's own step-counting wrappers all verify."""
    report = _report(toy, tmp_path, ["none"], VERIFIER_PROBE_BINDINGS="0")
    chains = _chains(report)
    assert set(chains) == {
        ("runner.execute_model", "class"),
        ("runner.sample_tokens", "class"),
        ("worker.execute_model", "class"),
        ("worker.sample_tokens", "class"),
    }
    assert {k: c.status for k, c in chains.items()} == dict.fromkeys(chains, "verified")
    ex = chains[("runner.execute_model", "class")]
    assert [x.code_qualname for x in ex.layers] == [
        "_decorate.<locals>.decorated",
        "ToyRunner.execute_model",
    ]
    worker = chains[("worker.execute_model", "class")]
    assert worker.probe_layers == 1  # the probe's step counter, put on ToyWorker itself ...
    assert worker.owner == "vllm.v1.worker.toy_runner.GpuWorker"  # ... around what it inherits
    assert not [d for d in report.drift if d.id.startswith("provenance.code.")]


@pytest.mark.parametrize("kind", ["instance", "partial"])
def test_patch_set_on_the_live_runner_object_is_flagged(
    toy: Path, tmp_path: Path, kind: str
) -> None:
    """``runner.execute_model = ...`` on the object the worker calls: its class is untouched
    (that chain still verifies); the one the worker really calls is flagged."""

    def seen(r: ProcessReport) -> bool:
        return any(c.via == "instance" for c in r.code)

    report = _report(toy, tmp_path, [kind], seen, VERIFIER_PROBE_BINDINGS="0")
    chains = _chains(report)
    assert chains[("runner.execute_model", "class")].status == "verified"
    inst = chains[("runner.execute_model", "instance")]
    assert inst.status == "patched"
    assert inst.layers[0].kind == ("method" if kind == "instance" else "partial")
    (detail,) = _patched(report)
    assert "(runner.execute_model, set on the live object itself)" in detail
    if kind == "instance":
        assert f"it is toy_attack.evil_execute, defined in {toy / 'toy_attack.py'} line 1" in detail
    else:
        assert "a functools.partial built at run time" in detail
    assert not [d for d in report.drift if d.id == DRIFT_CODE_UNVERIFIED]
