"""Attacks on hook liveness from inside the serving process (a security tester's findings,
2026-12-07), built for real against probed Python processes; each test asserts what the
product says now that the hole is closed (or, marked xfail, what it should say of one still
open).

The attacks, each run in a real interpreter with the probe loaded, read by a real agent
(``collect_once``) and judged by a real policy:

1. A hook name declared on a method (``VERIFIER_HOOKS``) taken over by ``@hook(name)`` on a
   function of the attacker's own, which it calls: the decorator got the method's counter
   and its record replaced the method's, so the dead-hook policy PASSed (first seen against
   a real vLLM with a general plugin; the mechanism is the probe's, so a fake worker stands
   in here). Every order of two declarations of one name is tried.
2. ``hook.device_counter(name)`` handing out the device counter of a hook declared on a
   function that never runs, advanced by the workload on every step.
3. A side thread entering the live runner's ``_dummy_run`` (or the worker's warm-up) and
   staying there, so that every real step of the engine thread counted as a dummy one.
4. A ``@device`` or ``@first`` hook whose target no policy could pin (the probe records the
   suffix, the loader refuses one); and ``m:f@first@device`` silently dropping ``@first``.
5. A worker run by a copy of CPython named ``engine`` (its libpython ``libcore.so``), which
   the agent took for no Python process and dropped without a word, beside a decoy worker.

"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from servewitness_probe._hooks import parse_hooks

from servewitness.model import ProcessReport
from servewitness.policy import TargetSnapshot, load_policy
from tests.helpers import (
    SOURCE_PATH,
    collect_once,
    not_vllm_policy,
    probe_env,
    stand_in,
    state_dir,
    swept,
)

USERMOD = (
    "class Runner:\n    def __init__(self):\n        pass\n\n"
    "    def step(self):\n        return 1\n\n\ndef free():\n    return 2\n"
)

# The worker's step loop, in a module of its own (so that its code has a file, as vLLM's
# has): a worker class the probe wraps as it wraps vLLM's, whose live runner (LiveRunner,
# another class than usermod.Runner) can call usermod's code or not on each step. Its
# _dummy_run and the worker's warm-up block on ``gate`` when called on an object that has one.
FAKE_WORKER = """
import types

import usermod
from servewitness_probe import _vllm


class LiveRunner:
    def __init__(self):
        self.gate = None

    def _dummy_run(self, n):
        if getattr(self, "gate", None) is not None:
            self.entered.set()
            self.gate.wait()


class Worker:
    rank = 0
    local_rank = 0
    fire = False
    each = None

    def __init__(self):
        self.model_runner = LiveRunner()

    def execute_model(self, so):
        if self.fire:
            usermod.Runner().step()
        if self.each is not None:
            self.each()
        return object()

    def compile_or_warm_up_model(self):
        if getattr(self, "gate", None) is not None:
            self.entered.set()
            self.gate.wait()


WORKER = Worker()
_vllm._worker_initialised(WORKER)


def run(steps, fire=False, each=None):
    w = WORKER
    w.fire, w.each = fire, each
    for _ in range(steps):
        so = types.SimpleNamespace(
            total_num_scheduled_tokens=1, num_scheduled_tokens={"a": 1}, scheduled_new_reqs=[],
            scheduled_spec_decode_tokens={}, finished_req_ids=set(),
            scheduled_cached_reqs=types.SimpleNamespace(req_ids=["a"]),
        )
        w.execute_model(so)
"""


def _mods(tmp_path: Path) -> Path:
    mods = tmp_path / "mods"
    mods.mkdir(exist_ok=True)
    (mods / "usermod.py").write_text(USERMOD)
    (mods / "fakeworker.py").write_text(FAKE_WORKER)
    return mods


def _probed(tmp_path: Path, body: str, hooks: str) -> ProcessReport:
    """The agent's report of a probed interpreter (VERIFIER_HOOKS=HOOKS, usermod and
    fakeworker importable) once it has run BODY."""
    script = textwrap.dedent(body) + '\nprint("up", flush=True)\nimport sys; sys.stdin.read()\n'
    env = probe_env(tmp_path / "probe", PYTHONPATH=str(_mods(tmp_path)), VERIFIER_HOOKS=hooks)
    with stand_in([sys.executable, "-c", script], env=env) as pid:
        swept(tmp_path / "probe", pid)  # CPU device counters are read by the sweeper
        report = collect_once(pid, tmp_path / "spool")
    (proc,) = [p for p in report.processes if p.key.pid == pid]
    assert isinstance(proc, ProcessReport)
    return proc


def _judge(proc: ProcessReport, policy: str) -> tuple[str, set[str], str]:
    """The verdict of POLICY (a weak one, for a process outside vLLM) on PROC alone: the
    verdict, its finding ids, and the findings as text (for the assertion messages)."""
    now = time.time()
    snap = TargetSnapshot("t", (dataclasses.replace(proc, files=proc.files or ()),), now)
    v = load_policy(not_vllm_policy(policy)).evaluate_target(snap, now)
    text = "\n".join(f"{f.id} [{f.severity.value}] {f.message}" for f in v.findings)
    return v.verdict.value, {f.id for f in v.findings}, text


def _hook(proc: ProcessReport, name: str) -> Any:
    (h,) = [h for h in proc.hooks if h.name == name]
    return h


def _refusals(proc: ProcessReport, name: str) -> list[str]:
    return [e for e in proc.probe_errors if f"'{name}' is declared already" in e]


# -- 1. @hook(name) on one's own function takes over a hook declared on a method --------------


def test_probe_a_decorator_reusing_a_declared_hooks_name_is_not_the_declared_method(
    tmp_path: Path,
) -> None:
    """The attack: VERIFIER_HOOKS declares step on usermod:Runner.step; Runner is never
    instantiated and step never runs. After usermod is imported, the process decorates a
    function of its own, ``@hook("step")``, and calls it five times. It read 5 fires, how
    "decorator" (so the not-instantiated check, for methods only, was skipped), no probe
    error. Now the decorator is refused (a probe error naming the hook) and the hook is the
    method's, unfired, not instantiated."""
    proc = _probed(
        tmp_path,
        """
        import servewitness_probe as p
        p.start()
        import usermod
        @p.hook("step")
        def tick():
            return None
        for _ in range(5):
            tick()
        """,
        "step=usermod:Runner.step",
    )
    h = _hook(proc, "step")
    assert (h.target, h.how, h.owner, h.fired, h.instantiated_class) == (
        "usermod:Runner.step",
        "method",
        "usermod.Runner",
        0,
        None,
    )
    assert len(_refusals(proc, "step")) == 1, proc.probe_errors
    assert _refusals(proc, "step")[0].startswith("[hook.decorate] 'step'")


# Each case: the script (after p.start() and `import usermod`), VERIFIER_HOOKS, the first
# declaration's (target, how) as reported, its fires, and where the refusal is said.
ORDERS = {
    "env_then_decorator": (
        "@p.hook('h')\ndef mine():\n    return 1\nfor _ in range(4): mine()\n"
        "for _ in range(2): usermod.free()\n",
        "h=usermod:free",
        ("usermod:free", "function"),
        2,
        "hook.decorate",
    ),
    # the decorator first: at import, before the probe starts; the env's declaration is
    # refused, and said under a tag the policy judges (not VERIFIER_HOOKS, which it does not)
    "decorator_then_env": (
        "for _ in range(4): mine()\nfor _ in range(2): usermod.free()\n",
        "h=usermod:free",
        ("__main__:mine", "decorator"),
        4,
        "hooks",
    ),
    "decorator_twice_on_two_functions": (
        "@p.hook('h')\ndef mine():\n    return 1\n"
        "@p.hook('h')\ndef other():\n    return 2\n"
        "for _ in range(3): mine()\nfor _ in range(5): other()\n",
        "",
        ("__main__:mine", "decorator"),
        3,
        "hook.decorate",
    ),
    "fired_by_name_then_decorator": (
        "p.hook.fire('h')\n@p.hook('h')\ndef mine():\n    return 1\nfor _ in range(4): mine()\n",
        "",
        ("", None),
        1,
        "hook.decorate",
    ),
    "module_then_decorator": (
        "p.hook.fire('h')\n@p.hook('h')\ndef mine():\n    return 1\nfor _ in range(4): mine()\n",
        "h=usermod",
        ("usermod", None),
        1,
        "hook.decorate",
    ),
}


@pytest.mark.parametrize("order", list(ORDERS))
def test_a_second_declaration_of_a_hook_name_is_refused_whatever_the_order(
    tmp_path: Path, order: str
) -> None:
    """A hook name is declared once per process: a second declaration of it on anything else
    (VERIFIER_HOOKS then @hook, @hook then VERIFIER_HOOKS, @hook on two functions, a name
    fired through the API or declared on a module then @hook) is refused, said as a probe
    error naming the hook, shares no counter with the first and changes none of its record;
    a policy judging the hook cannot PASS (evidence.probe_errors.judged)."""
    script, hooks, (target, how), fired, where = ORDERS[order]
    before = "import servewitness_probe as p\n"
    if order == "decorator_then_env":
        before += "@p.hook('h')\ndef mine():\n    return 1\n"
    body = (
        before + "p.start()\nimport usermod\n" + script + "import fakeworker\nfakeworker.run(3)\n"
    )
    proc = _probed(tmp_path, body, hooks)
    h = _hook(proc, "h")
    assert (h.target, h.how, h.fired) == (target, how, fired), h
    refusals = _refusals(proc, "h")
    assert [e.partition("]")[0] for e in refusals] == [f"[{where}"], proc.probe_errors
    verdict, ids, text = _judge(proc, 'version = 1\n[[hooks]]\nname = "h"\n')
    assert verdict != "PASS" and "evidence.probe_errors.judged" in ids, text


def test_the_same_function_decorated_again_under_its_name_still_counts(tmp_path: Path) -> None:
    """The control: decorating the very same function again under the same name (stacked, or
    the decorator applied to it twice) is the same declaration: no probe error, each call of
    a wrapper counts once."""
    proc = _probed(
        tmp_path,
        """
        import servewitness_probe as p
        p.start()
        @p.hook("h")
        @p.hook("h")
        def twice():
            return 1
        def f():
            return 2
        a, b = p.hook("g")(f), p.hook("g")(f)
        twice(); twice(); a(); b(); b()
        """,
        "",
    )
    assert (_hook(proc, "h").fired, _hook(proc, "h").target) == (2, "__main__:twice")
    assert (_hook(proc, "g").fired, _hook(proc, "g").target) == (3, "__main__:f")
    assert proc.probe_errors == ()


@pytest.mark.parametrize("pinned", [False, True])
def test_the_dead_hook_policy_fails_when_the_process_decorates_its_own_function(
    tmp_path: Path, pinned: bool
) -> None:
    """The attack first built against a real vLLM (its plugin decorated a function of its
    own with the public ``@hook("v2_step")`` and called it from a thread while the CPU worker
    ran its steps; the shipped dead-hook policy, pinned or not, PASSed). Here a fake worker
    whose live runner is another class runs 12 steps while a thread calls the decorated
    function; v2_step is declared on usermod.Runner.step, never instantiated. The policy
    FAILs: not instantiated, and the refused declaration is a judged probe error."""
    proc = _probed(
        tmp_path,
        """
        import servewitness_probe as p
        p.start()
        import threading, time, usermod, fakeworker
        def plugin():
            @p.hook("v2_step")
            def tick():
                return None
            while True:
                tick()
                time.sleep(0.001)
        threading.Thread(target=plugin, daemon=True).start()
        time.sleep(0.2)
        fakeworker.run(12)
        """,
        "v2_step=usermod:Runner.step",
    )
    pin = 'target = "usermod:Runner.step"\n' if pinned else ""
    verdict, ids, text = _judge(
        proc, f'version = 1\n[[hooks]]\nname = "v2_step"\nrole = "worker"\n{pin}'
    )
    assert proc.steps is not None and proc.steps.productive == 12
    assert verdict == "FAIL", text
    assert {"liveness.hook.not_instantiated", "evidence.probe_errors.judged"} <= ids, text


# -- 2. hook.device_counter credits a hook declared on a function ----------------------------


def test_device_counter_is_refused_for_a_hook_declared_on_a_function(tmp_path: Path) -> None:
    """The attack: VERIFIER_HOOKS declares d=usermod:free@device; the policy counts it on the
    device (count = "device"). ``hook.fire("d")`` was refused for such a hook, but
    ``hook.device_counter("d", like=...)`` handed out the hook's counter, and the workload
    added 1 to it on every step while usermod.free never ran: PASS. Now the counter is refused
    as the fire is (None, and a probe error naming the hook) and the policy does not PASS. A
    hook declared on a module alone keeps its device counter (the control)."""
    proc = _probed(
        tmp_path,
        """
        import servewitness_probe as p
        p.start()
        import torch
        import usermod, fakeworker
        counter = p.hook.device_counter("d", like=torch.device("cpu"))
        assert counter is None
        mod = p.hook.device_counter("m", like=torch.device("cpu"))
        fakeworker.run(20, each=lambda: mod.add_(1))
        """,
        "d=usermod:free@device,m=usermod",
    )
    d, m = _hook(proc, "d"), _hook(proc, "m")
    assert (d.fired, d.device_fired) == (0, None)
    assert m.device_fired == 20  # declared on a module: the API's counter
    refused = [e for e in proc.probe_errors if e.startswith("[hook.device_counter] 'd'")]
    assert len(refused) == 1, proc.probe_errors
    verdict, ids, text = _judge(proc, 'version = 1\n[[hooks]]\nname = "d"\ncount = "device"\n')
    assert verdict != "PASS" and "evidence.probe_errors.judged" in ids, text


# -- 3. a side thread holding a dummy run open makes every real step a dummy one ---------------


@pytest.mark.parametrize("held", ["_dummy_run", "compile_or_warm_up_model"])
def test_steps_run_while_a_side_thread_holds_a_dummy_run_are_still_counted(
    tmp_path: Path, held: str
) -> None:
    """The attack (first built against a real vLLM on CPU): a hook on code that the decode
    steps run (here usermod.Runner.step, judged on decode steps). Four steps fire it (the
    control); then a thread of the workload's calls the live runner class's ``_dummy_run``
    (or the worker class's warm-up) on an object of its own and stays inside; 16 steps follow
    on the engine thread without the hooked code. The probe's "inside a dummy run" depth was
    one for the whole process, so those steps counted as neither steps nor dummy steps: the
    hook read 4 fires on 4 decode steps, PASS. Now the depth is the thread's: the 16 steps
    are counted, the held call is one dummy step, and the ratio is low (FAIL)."""
    if held == "_dummy_run":
        hold = "fake = object.__new__(type(fakeworker.WORKER.model_runner))\n"
        call = "type(fake)._dummy_run(fake, 1)"
    else:
        hold = (
            "fake = object.__new__(fakeworker.Worker)\n"
            "fake.model_runner = fakeworker.WORKER.model_runner\n"
        )
        call = "type(fake).compile_or_warm_up_model(fake)"
    body = (
        "import servewitness_probe as p\np.start()\nimport threading, usermod, fakeworker\n"
        "fakeworker.run(4, fire=True)\n"
        f"{hold}fake.gate, fake.entered = threading.Event(), threading.Event()\n"
        f"threading.Thread(target=lambda: {call}, daemon=True).start()\n"
        "assert fake.entered.wait(10)\n"
        "fakeworker.run(16)\n"
    )
    proc = _probed(tmp_path, body, "step=usermod:Runner.step")
    s = proc.steps
    assert s is not None
    assert (s.productive, s.decode_steps, s.dummy_steps) == (
        20,
        20,
        1 if held == "_dummy_run" else 0,
    )
    assert _hook(proc, "step").fired_decode == 4
    verdict, ids, text = _judge(proc, 'version = 1\n[[hooks]]\nname = "step"\non = "decode"\n')
    assert verdict == "FAIL" and "liveness.hook.fire_ratio_low" in ids, text


# -- 4. a device-counted or first-hit hook's target can be pinned ------------------------------


@pytest.mark.parametrize("suffix", ["@device", "@first"])
def test_a_device_or_first_hit_hooks_target_can_be_pinned(tmp_path: Path, suffix: str) -> None:
    """The gap: ``[[hooks]] target`` is the defence against a hook name put on other code,
    but the probe records a ``@device`` (or ``@first``) hook's target with its suffix
    ("usermod:free@device") and the loader refuses a target with one, so the right pin
    FAILed target_mismatch. A pin names code; the suffix says how its calls are counted
    (judged by ``count`` and the fire rules): the pin is compared with the target without it.
    The right pin PASSes, a wrong one FAILs."""
    proc = _probed(
        tmp_path,
        """
        import servewitness_probe as p
        p.start()
        import torch, usermod, fakeworker
        fakeworker.run(20, each=usermod.free)
        """,
        f"d=usermod:free{suffix}",
    )
    h = _hook(proc, "d")
    assert (h.target, h.fired > 0) == (f"usermod:free{suffix}", True)
    for pin, expected in (("usermod:free", "PASS"), ("usermod:Runner.step", "FAIL")):
        verdict, ids, text = _judge(proc, f'version = 1\n[[hooks]]\nname = "d"\ntarget = "{pin}"\n')
        assert verdict == expected, f"pinned {pin}: {text}"
        assert ("liveness.hook.target_mismatch" in ids) == (expected == "FAIL"), text


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ("x=m:f@first@device", "one mode suffix at most, @device or @first, not '@first@device'"),
        ("x=m:f@device@first", "one mode suffix at most, @device or @first, not '@device@first'"),
        ("x=m:f@device@device", "one mode suffix at most"),
        ("x=m:f@fast", "one mode suffix at most, @device or @first, not '@fast'"),
        ("x=m:f@", "one mode suffix at most, @device or @first, not '@'"),
    ],
)
def test_a_declaration_with_more_than_one_or_an_unknown_mode_is_an_error(
    entry: str, fragment: str
) -> None:
    """``x=m:f@first@device`` silently dropped ``@first``: more than one mode suffix, or one
    the probe does not know, is a malformed entry (a probe error; the hook is not declared,
    so a policy judging it sees it never fire)."""
    decls, errors = parse_hooks(f"good=m:g@device,{entry}")
    assert [d.name for d in decls] == ["good"]
    assert len(errors) == 1 and fragment in errors[0] and repr(entry) in errors[0], errors


# -- a runner object that runs nothing ----------------------------------------------------------


@pytest.mark.parametrize("through", ["warm_up", "a_step_then_real_ones"])
def test_a_runner_object_that_runs_nothing_is_not_the_live_runner(
    tmp_path: Path, through: str
) -> None:
    """The attack (first built against a real vLLM on CPU, its side plugin doing it): the
    worker class's ``compile_or_warm_up_model`` called on a worker object of the workload's
    own (``object.__new__``, no constructor) whose ``model_runner`` is an uninitialised
    object of another runner class (vLLM's V2 GPUModelRunner there; usermod.Runner here).
    The probe's warm-up wrapper calls ``record_runner(self)`` first; that class was not seen,
    so a new runner record names it, and the agent reads the latest runner record as the
    live runner. The real runner keeps running every step. Observed: a policy expecting the
    other class PASSed. Now the live runner is the class of the runner whose step completed
    last (a ``stepped`` record each time the stepping worker object changes): FAIL
    runner.unexpected. The variation: the fake worker stepped through the worker's wrapped
    ``execute_model`` itself (this fake worker's step completes without its runner; vLLM's
    calls the runner's own ``execute_model``, which an object never constructed does not
    complete), then real steps: the latest step's runner is the live one again."""
    fake_step = (
        "type(fake).compile_or_warm_up_model(fake)"
        if through == "warm_up"
        else "type(fake).execute_model(fake, types.SimpleNamespace(total_num_scheduled_tokens=1,"
        " num_scheduled_tokens={'a': 1}, scheduled_new_reqs=[], scheduled_spec_decode_tokens={},"
        " finished_req_ids=set(), scheduled_cached_reqs=types.SimpleNamespace(req_ids=['a'])))"
    )
    proc = _probed(
        tmp_path,
        """
        import servewitness_probe as p
        p.start()
        import types, usermod, fakeworker
        fakeworker.run(4)
        fake = object.__new__(fakeworker.Worker)
        fake.model_runner = object.__new__(usermod.Runner)
        FAKE_STEP
        fakeworker.run(4)
        """.replace("FAKE_STEP", fake_step),
        "",
    )
    verdict, ids, text = _judge(proc, 'version = 1\n[runner]\nexpect_class = "usermod.Runner"\n')
    assert verdict == "FAIL" and "liveness.runner.unexpected" in ids, text


FAKE_STEPS = """
import servewitness_probe as p
p.start()
import setproctitle
setproctitle.setproctitle("VLLM::Worker_TP0")
import fakeworker
fakeworker.run(STEPS, fire=FIRE)
print("up", flush=True)
import sys; sys.stdin.read()
"""

TREE_ROOT = """
import servewitness_probe as p
p.start()
import os, subprocess, sys
kids = []
for argv, env in ((HIDDEN_ARGV, HIDDEN_ENV), (DECOY_ARGV, DECOY_ENV)):
    k = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert k.stdout.readline().strip() == "up"
    kids.append(k)
print("up", flush=True)
sys.stdin.read()
for k in kids:
    k.kill()
"""


def _hidden_interpreter(root: Path) -> tuple[Path, dict[str, str]]:
    """A copy of this interpreter named "engine", whose libpython is a copy named libcore.so
    (found first through LD_LIBRARY_PATH, as a symbolic link named as the binary asks): the
    same CPython, running the same code; the environment to run it with."""
    import shutil
    import sysconfig

    exe = Path(os.path.realpath(sys.executable))
    lib = Path(sysconfig.get_config_var("LIBDIR")) / str(sysconfig.get_config_var("LDLIBRARY"))
    d = root / "hidden"
    (d / "lib").mkdir(parents=True)
    shutil.copy2(exe, d / "engine")
    soname = next(p.name for p in lib.parent.glob("libpython3*.so.1.0"))
    shutil.copy2(lib.parent / soname, d / "lib" / "libcore.so")
    (d / "lib" / soname).symlink_to("libcore.so")
    site = next(p for p in sys.path if p.endswith("site-packages"))
    return d / "engine", {
        "LD_LIBRARY_PATH": str(d / "lib"),
        "PYTHONHOME": sys.base_prefix,
        "SITE": site,
    }


def test_a_worker_run_by_a_renamed_interpreter_is_reported_and_judged(
    tmp_path: Path,
) -> None:
    """The attack (the serving container's root controls its image and how workers start:
    e.g. ``multiprocessing.set_executable``): the worker that runs the steps is started by a
    copy of CPython named ``engine`` whose libpython is a copy named ``libcore.so``. The agent
    decides "is this Python?" by the executable's base name containing "python" or a mapping
    whose path contains "libpython"; neither holds, so ``read_process`` raises
    NotPythonProcess and ``discover`` drops the process without a word, although it is in the
    --pid tree, carries the probe (bound state directory), is titled VLLM::Worker_TP0 and ran
    20 productive steps on which the declared hook never fired. A decoy worker beside it (the
    ordinary interpreter, same title) runs steps that fire the hook.
    It read: the API server and the decoy only, no unobservable note, and the hook policy
    (role worker, target pinned) PASSed. Now a process that maps its own probe's counters is
    a probed Python process whatever its executable is named: the hidden worker is reported
    and its dead hook FAILs the policy."""
    import subprocess

    mods = _mods(tmp_path)
    engine, hidden_env = _hidden_interpreter(tmp_path)
    site = hidden_env.pop("SITE")
    base = probe_env(tmp_path / "probe", PYTHONPATH=str(mods),
                     VERIFIER_HOOKS="step=usermod:Runner.step")  # fmt: skip
    hidden = {**base, **hidden_env,
              "PYTHONPATH": os.pathsep.join([str(mods), SOURCE_PATH, site])}  # fmt: skip

    def steps(n: int, fire: bool) -> str:
        return FAKE_STEPS.replace("FIRE", str(fire)).replace("STEPS", str(n))

    root_script = (
        f"HIDDEN_ARGV = {json.dumps([str(engine), '-c', steps(20, False)])}\n"
        f"HIDDEN_ENV = {json.dumps(hidden)}\n"
        f"DECOY_ARGV = {json.dumps([sys.executable, '-c', steps(5, True)])}\n"
        f"DECOY_ENV = {json.dumps(base)}\n" + TREE_ROOT
    )
    argv = [sys.executable, "-c", root_script, "vllm.entrypoints.openai.api_server"]
    with stand_in(argv, env=base) as root_pid:
        time.sleep(1.5)
        report = collect_once(root_pid, tmp_path / "spool")
        tree = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(root_pid)], check=True,
                              capture_output=True, text=True).stdout  # fmt: skip
        kids = [int(line.split()[0]) for line in tree.splitlines() if line.strip()]
        hidden_pid = next(k for k in kids if os.readlink(f"/proc/{k}/exe") == str(engine))
        # it is probed: its state directory is there, under its name, and it maps its counters
        held = state_dir(tmp_path / "probe", hidden_pid)
        assert held.is_dir()
        assert str(held / "counters") in Path(f"/proc/{hidden_pid}/maps").read_text()
    roles = sorted((p.role or "", p.key.pid) for p in report.processes)
    policy = load_policy(not_vllm_policy(
        'version = 1\n[[hooks]]\nname = "step"\nrole = "worker"\ntarget = "usermod:Runner.step"\n'
    ))  # fmt: skip
    procs = tuple(dataclasses.replace(p, files=p.files or ()) for p in report.processes)
    now = time.time()
    v = policy.evaluate_target(
        TargetSnapshot("t", procs, now, unobservable=report.unobservable), now
    )
    seen = hidden_pid in {p.key.pid for p in report.processes}
    assert seen and v.verdict.value == "FAIL", (
        f"the tree under {root_pid}:\n{tree}\nreported: {roles}, unobservable: "
        f"{report.unobservable}; verdict {v.verdict.value}: "
        f"{[(f.id, f.message) for f in v.findings if f.severity.value != 'INFO' or 'hook' in f.id]}"
    )
