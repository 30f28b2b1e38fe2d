"""Outside attacks on bytes a policy vouches for (``[[claims]]``: "Drift your claims account
for", "Every code file claimed" in docs/policy.md), by a tester who read only the docs, then
the harness (``tests/test_loader_claims.py``, ``tests/test_claims_attacks_outside.py``).

Every attack is built for real: a venv made by the real ``virtualenv`` (its ``_virtualenv.py``
and ``_virtualenv.pth``), a probed interpreter (early probe) started as a subprocess, the
agent's own judgement (``to_report(ProcFS(), read_process(...))``) and the real policy engine,
under a policy that claims only honest bytes: virtualenv's two files as ``make_venv`` wrote
them (and, for ``all_code_claimed``, this checkout's probe and the harness's own ``-c``).
Each test asserts the SOUND outcome, so a test whose attack works fails; those are marked
``xfail(strict=True)`` with the reason. The attacker's value is ``fakedist.core.VALUE ==
'evil!!!!!'`` where the published file says ``'published'``; a precondition that the attack
really served it raises ``RuntimeError`` (never an expected failure).

What worked when written (2026-12-07), each a PASS (WARNING only) with the attacker's value:

1. Loader code that carries code the probe does not follow, with only ``_virtualenv.py``
   claimed (``provenance.module.unfiled`` downgraded to ``custom_loader``): a bound method
   whose ``__func__`` is the claimed function and whose ``__self__`` is the attacker's callable
   (``types.MethodType``); a function with the claimed ``__code__`` but the attacker's
   ``__globals__``; the closure virtualenv's own ``patch_dist`` makes, over the attacker's
   function (no forging at all); a ``functools.partial`` subclass whose ``__call__`` is the
   attacker's; the claimed function's ``__code__`` swapped for code compiled under the claimed
   file's name; and (the documented in-memory limit, kept visible) the real ``_virtualenv``
   module's globals rewritten.
2. A ``SourceFileLoader`` subclass that overrides only ``__getattribute__`` (assigned as the
   instance's ``__class__``): no drift at all for the module it serves.
3. (Closed the same session: ``evidence/pathchange.py``.) A claimed file whose path is a
   symlink flipped, before the probe hashes it, from the attacker's bytes to an honest copy
   made before the start: ``_virtualenv.py`` (imported by
   the ``.pth`` before the probe) and ``_virtualenv.pth`` itself; the agent reads the target's
   ctime, which is old. Under ``all_code_claimed`` too. (Control: the same swap by rename is
   caught, ``provenance.file.changed_after_start``.)
4. (Closed the same session: ``servewitness_probe/_children.py``.) ``-c`` code behind a
   rewritten title "started by" the judged server: a process forked
   before the server's ``exec`` (no longer accepted since session 29) waits for the server's
   probe, then ``clone(CLONE_PARENT)``s: the new child's parent is the server and it started
   after the probe did, though the server's code never chose it. (Control: a plain fork.)

Closed the same session: all of 1 but the ``__code__`` swap and the module's globals (the
probe follows a bound method's ``__self__``, a function's closure cells and defaults, takes a
function only with its own module's namespace as globals and only an exact
``functools.partial`` as one: ``_loaders._code_of``), and 2 (a reader subclass overriding
attribute lookup is custom: ``_loaders._OVERRIDES``).
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servewitness.evidence.process import read_process
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.report import to_report
from servewitness.model import (
    DRIFT_MODULE_UNFILED,
    ProcessReport,
    Severity,
    Verdict,
)
from tests.helpers import probe_env, probed_report, wait_ready
from tests.test_bytecode_attacks import install
from tests.test_claims_attacks_outside import (
    HONEST_SCRIPT,
    REWRITE_TITLE,
    Box,
    errors,
    evil_main,
    verdict,
)
from tests.test_code_claims import own_claims, sha
from tests.test_code_claims import policy as code_policy
from tests.test_loader_claims import SCRIPT, Venv, judge, make_venv, policy, shown

EVIL = repr(("partial", "evil!!!!!"))  # what SCRIPT prints when the attack served its value
PUBLISHED = repr(("partial", "published"))


def require(cond: bool, what: str) -> None:
    """A precondition of the attack (it really ran): not an expected failure when unmet."""
    if not cond:
        raise RuntimeError(what)


def probed(tmp: Path, venv: Venv, sitecustomize: str | None = None) -> tuple[str, ProcessReport]:
    """``test_loader_claims.run`` with the process's TMPDIR in ``tmp/scratch``, so the venv
    (under the system's /tmp, as every pytest tmp_path is) is not under the process's
    temporary directory (a deployment's venv is not): the venv's interpreter, early probe,
    fakedist on PYTHONPATH (SITECUSTOMIZE before it), running SCRIPT. What it printed and the
    agent's report, once swept."""
    site = tmp / "site"
    if not (site / "fakedist").exists():
        install(site)
    path = [str(site)]
    if sitecustomize is not None:
        (tmp / "attack").mkdir(exist_ok=True)
        (tmp / "attack" / "sitecustomize.py").write_text(sitecustomize)
        path.insert(0, str(tmp / "attack"))
    (tmp / "scratch").mkdir(exist_ok=True)
    out = tmp / f"out-{time.monotonic_ns()}"
    env = probe_env(
        tmp / "probe",
        VERIFIER_PROBE_EARLY="1",
        PYTHONPATH=os.pathsep.join(path),
        PYTHONDONTWRITEBYTECODE="1",
        TMPDIR=str(tmp / "scratch"),
    )
    return probed_report([str(venv.root / "bin" / "python"), "-c", SCRIPT, str(out)], env, out)


def honest_claims(venv: Venv, claimed: tuple[tuple[str, str], ...]) -> str:
    """The strictest policy an honest operator of this venv writes: ``pristine =
    ["fakedist"]``, ``all_code_claimed``, and claims for exactly the honest bytes (virtualenv's
    two files as ``make_venv`` wrote them, the early probe's ``.pth``, this checkout's probe,
    the harness's ``-c`` script)."""
    claims = [*own_claims(), *claimed, venv.probe(), ("-c", sha(SCRIPT.encode()))]
    return code_policy(claims=claims)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """One virtualenv venv for the attacks that leave it untouched (sitecustomize only)."""
    return make_venv(tmp_path_factory.mktemp("vouched-venv"))


def copy_of(base: Venv, tmp: Path) -> Venv:
    """A copy of BASE at ``tmp/venv`` (links kept as links), for an attack that edits its
    site-packages: the same files virtualenv wrote, without running virtualenv again."""
    root = tmp / "venv"
    shutil.copytree(base.root, root, symlinks=True)
    return Venv(root, root / base.site.relative_to(base.root))


# control --------------------------------------------------------------------------------------


def test_control_the_honest_venv_passes_both_policies(venv: Venv, tmp_path: Path) -> None:
    """Negative control: nothing planted; with the honest claims the process PASSes under
    ``pristine`` + claims and under ``all_code_claimed`` (so every FAIL asserted below would
    be the attack's doing), and FAILs without the claims (the harness sees virtualenv's
    drift)."""
    result, report = probed(tmp_path, venv)
    assert result == PUBLISHED
    v, found = judge(report, policy(venv, venv.claims()))
    assert v == Verdict.PASS, shown(found)
    v, found = judge(report, honest_claims(venv, tuple(venv.claims())))
    assert v == Verdict.PASS, shown(found)
    assert judge(report, policy(venv))[0] == Verdict.FAIL


# 1. loader code that reaches the attacker's code while naming only claimed files --------------

# The attacker's sitecustomize: a finder first on the meta path serves fakedist.core (a
# pristine distribution) through a plain SourceFileLoader of the published file, with SETUP
# done to the loader ``ld``. ``F`` is virtualenv's claimed ``_Finder.exec_module(old, module)``
# (it calls ``old(module)``); ``evil`` sets the module's value without running its file.
LOADER_ATTACK = """\
import functools, importlib, importlib.machinery, importlib.util, json, os, sys, types
import _virtualenv

F = _virtualenv._Finder.exec_module

def evil(m, *a, **k):
    m.VALUE = 'evil!!!!!'

class Finder:
    def find_spec(self, name, p=None, t=None):
        if name != "fakedist.core":
            return None
        import fakedist
        path = os.path.join(os.path.dirname(fakedist.__file__), "core.py")
        ld = importlib.machinery.SourceFileLoader(name, path)
SETUP
        return importlib.util.spec_from_file_location(name, path, loader=ld)

sys.meta_path.insert(0, Finder())
"""

EVIL_EXEC_MODULE = (
    "def exec_module(old, module):\n"
    "    old(module)\n"
    "    module.VALUE = 'evil!!!!!'\n"
)  # fmt: skip


def _indent(code: str) -> str:
    return "".join(" " * 8 + line + "\n" for line in code.strip("\n").splitlines())


LOADER_ATTACKS: dict[str, tuple[str, str | None]] = {
    # name: (SETUP, None when caught today, else why it works)
    "bound_method_self": (
        """
class Caller:
    def __call__(self, m):
        evil(m)
ld.exec_module = types.MethodType(F, Caller())
""",
        None,  # closed in session 29 (was: it worked)
    ),
    "bound_method_self_in_partial": (
        """
class Maker:
    def __init__(self, m):
        evil(m)
ld.exec_module = functools.partial(F, types.MethodType(F, Maker))
""",
        None,  # closed in session 29 (was: it worked)
    ),
    "foreign_globals": (
        """
G = types.FunctionType(F.__code__, {**F.__globals__, "patch_dist": evil,
                       "_DISTUTILS_PATCH": ("fakedist.core",)}, "exec_module")
ld.exec_module = functools.partial(G, ld.exec_module)
""",
        None,  # closed in session 29 (was: it worked)
    ),
    "closure_over_attacker_code": (
        """
class Holder:
    class Distribution:
        def parse_config_files(self, *a, **k):
            evil(self)
            self.get_option_dict = lambda name: {}
_virtualenv.patch_dist(Holder)  # virtualenv's own code makes the closure
ld.exec_module = Holder.Distribution.parse_config_files
""",
        None,  # closed in session 29 (was: it worked)
    ),
    "partial_subclass_call": (
        """
class P(functools.partial):
    def __call__(self, *a, **k):
        evil(*a)
ld.exec_module = P(F, ld.exec_module)
""",
        None,  # closed in session 29 (was: it worked)
    ),
    "code_swapped_on_claimed_function": (
        f"""
src = {EVIL_EXEC_MODULE!r}
code = next(c for c in compile(src, _virtualenv.__file__, "exec").co_consts
            if isinstance(c, types.CodeType))
F.__code__ = code.replace(co_qualname="_Finder.exec_module",
                          co_firstlineno=F.__code__.co_firstlineno)
ld.exec_module = functools.partial(F, ld.exec_module)
""",
        "the claimed function's __code__ was replaced by code compiled from a string under "
        "the claimed file's name: code is attributed by co_filename, never compared with "
        "what the claimed bytes compile to",
    ),
    "claimed_module_globals_rewritten": (
        """
_virtualenv._DISTUTILS_PATCH += ("fakedist.core",)
_virtualenv.patch_dist = evil
ld.exec_module = functools.partial(F, ld.exec_module)
""",
        "documented limit (threat-model: what the claimed function reaches through its "
        "module's globals): the real _virtualenv module's patch_dist rewritten in memory",
    ),
    "getattribute_subclass": (
        """
class L(importlib.machinery.SourceFileLoader):
    def __getattribute__(self, n):
        return evil if n == "exec_module" else object.__getattribute__(self, n)
ld.__class__ = L
""",
        None,  # closed in session 29 (was: it worked)
    ),
    # caught today (regression guards)
    "callable_instance_in_partial": (
        """
class Caller:
    def __call__(self, m):
        evil(m)
ld.exec_module = functools.partial(F, Caller())
""",
        None,
    ),
    "wrapped_points_at_own_method": (
        """
w = functools.wraps(ld.exec_module)(lambda m: evil(m))
ld.exec_module = functools.partial(F, w)
""",
        None,
    ),
    "keyword_in_nested_partial": (
        "ld.exec_module = functools.partial(F, functools.partial(json.dumps, default=evil))",
        None,
    ),
    "long_partial_chain": (
        """
x = evil
for _ in range(40):
    x = functools.partial(F, x)
ld.exec_module = x
""",
        None,
    ),
    "reload_through_a_second_loader": (
        """
if getattr(self, "second", False):
    first = self.first
    class Evil:
        def create_module(s, spec):
            return None
        def exec_module(s, m):
            evil(m)
            m.__spec__, m.__loader__ = first, first.loader  # put the first spec back
    return importlib.util.spec_from_file_location(name, path, loader=Evil())
self.second = True
ld.exec_module = functools.partial(F, importlib.reload)
self.first = importlib.util.spec_from_file_location(name, path, loader=ld)
return self.first
""",
        None,
    ),
}


def _loader_params() -> list[object]:
    out: list[object] = []
    for name, (_, works) in LOADER_ATTACKS.items():
        marks = (
            []
            if works is None
            else [pytest.mark.xfail(strict=True, raises=AssertionError, reason=works)]
        )
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.parametrize("attack", _loader_params())
def test_claimed_loader_code_that_reaches_the_attackers_code_is_unfiled(
    venv: Venv, tmp_path: Path, attack: str
) -> None:
    """Attack: with virtualenv's honest bytes claimed (``pristine = ["fakedist"]`` plus
    ``[[claims]]`` for ``_virtualenv.py`` and ``_virtualenv.pth``), a sitecustomize serves the
    pristine ``fakedist.core`` through a plain loader whose code-path method is claimed code
    (or looks like it) that reaches the attacker's function (see LOADER_ATTACKS).
    Gets (the xfail ones): PASS, the module a ``provenance.module.custom_loader`` WARNING or no
    drift at all, ``fakedist.core.VALUE == 'evil!!!!!'``.
    Sound: ``provenance.module.unfiled`` ERROR, FAIL: the drift names the attacker's file (or
    none: code in no file) because the probe follows every piece of code the loader's
    callable reaches (``__self__`` of bound methods, ``__globals__`` identity with the
    defining module's, closure cells, defaults, the type's ``__call__`` of any non-function
    callable, ``__code__`` compared with the claimed file's compiled code), and a loader
    class with any override of attribute lookup is custom."""
    setup, _ = LOADER_ATTACKS[attack]
    text = LOADER_ATTACK.replace("SETUP\n", _indent(setup))
    result, report = probed(tmp_path, venv, text)
    require(result == EVIL, f"the attack did not serve its value: {result}")
    v, found = judge(report, policy(venv, venv.claims()))
    assert v == Verdict.FAIL, shown(found)
    drift = [
        d for d in report.drift if d.id == DRIFT_MODULE_UNFILED and d.module == "fakedist.core"
    ]
    assert drift, "fakedist.core was executed by the attacker's loader and has no unfiled drift"
    assert found[DRIFT_MODULE_UNFILED].severity == Severity.ERROR, shown(found)


# 2. a claimed file that holds other bytes than those that ran ---------------------------------

DELAY_S = 0.5  # well past the agent's 50 ms of ctime slack: a rename this late is caught


def _swap_code(how: str, path: Path, honest: Path) -> str:
    """Python that puts HONEST's bytes at PATH: an atomic symlink flip to HONEST (a copy made
    before the process started) or a rename of it over PATH."""
    if how == "symlink":
        return (
            f"os.symlink({str(honest)!r}, {str(path)!r} + '.t'); "
            f"os.replace({str(path)!r} + '.t', {str(path)!r})"
        )
    return f"os.replace({str(honest)!r}, {str(path)!r})"


PATCH_NOW = "import fakedist.core as _m; _m.VALUE = 'evil!!!!!'"


@pytest.mark.parametrize(
    "which,how",
    [
        pytest.param("py", "symlink"),  # closed in session 29: evidence/pathchange.py
        pytest.param("pth", "symlink"),  # closed in session 29: evidence/pathchange.py
        pytest.param("py", "rename"),  # control: caught, changed_after_start
        pytest.param("pth", "rename"),  # control
    ],
)
def test_a_claimed_file_swapped_after_it_ran_is_not_vouched_for(
    venv: Venv, tmp_path: Path, which: str, how: str
) -> None:
    """Attack: before the start, the claimed path (``_virtualenv.py`` or ``_virtualenv.pth``
    of the venv) holds the attacker's bytes: virtualenv's own code plus ``import fakedist.core;
    VALUE = 'evil!!!!!'`` (an in-memory patch of a pristine module, no loader involved) and,
    ``DELAY_S`` later, a swap that puts the honest bytes (a copy made before the start) at the
    path: a symlink flip (the path is a symlink to the evil copy, atomically replaced by one to
    the honest copy) or, the control, a rename of the honest copy over it. Both run before the
    early probe starts (``_virtualenv.pth`` sorts before the probe's ``.pth``).
    Gets (symlink): PASS under ``pristine`` + claims and under ``all_code_claimed``, with
    ``fakedist.core.VALUE == 'evil!!!!!'``; the rename is ``provenance.file.changed_after_start``.
    Sound: FAIL: a file hashed after the fact is trusted only when nothing on its path changed
    after the start: ``lstat`` of the final symlink and of every symlink (and directory entry)
    resolved on the way, not only the target's ctime; a ``.pth`` likewise."""
    venv = copy_of(venv, tmp_path)
    claimed = tuple(venv.claims())  # the honest bytes, as virtualenv wrote them
    store = tmp_path / "store"
    store.mkdir()
    target = venv.patch_file if which == "py" else venv.pth
    honest = store / f"honest{target.suffix}"
    shutil.copy(target, honest)
    swap = _swap_code(how, target, honest)
    if which == "py":
        evil = (
            target.read_text() + f"\n{PATCH_NOW}\nimport os, time\ntime.sleep({DELAY_S})\n{swap}\n"
        )
    else:  # one line site executes: virtualenv's import, the patch, the swap
        evil = f"import os, time; import _virtualenv; {PATCH_NOW}; time.sleep({DELAY_S}); {swap}\n"
    if how == "symlink":
        (store / f"evil{target.suffix}").write_text(evil)
        target.unlink()
        target.symlink_to(store / f"evil{target.suffix}")
    else:
        target.write_text(evil)
    time.sleep(0.1)  # the honest copy's ctime well before the start
    result, report = probed(tmp_path, venv)
    require(result == EVIL, f"the attack did not serve its value: {result}")
    require(sha(target.read_bytes()) == dict(claimed)[str(target)], "the swap did not happen")
    for text in (policy(venv, list(claimed)), honest_claims(venv, claimed)):
        v, found = judge(report, text)
        assert v == Verdict.FAIL, shown(found)
        if how == "rename":  # the control: caught by the target's own ctime
            assert found["provenance.file.changed_after_start"].severity == Severity.ERROR


# 3. "started by" a judged parent: a child adopted with clone(CLONE_PARENT) ---------------------

SYS_CLONE = {"x86_64": 56, "aarch64": 220}
# Stage one: forked by the shell before it execs the server, so the server's child. It waits
# for the server's probe (the server's ready file, then a little), then makes the payload's
# process: with CLONE_PARENT its parent is stage one's parent, the server; without, stage one.
# The payload writes its title over its argv (as vLLM's workers do), so its -c is unreadable.
STAGE_ONE = r"""
import ctypes, os, sys, time
ready, pidfile, code, flags = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
while not os.path.exists(ready):
    time.sleep(0.05)
time.sleep(0.5)
env = dict(os.environ)
env.pop("VERIFIER_PROBE_DISABLE", None)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
z = ctypes.c_void_p(0)
pid = libc.syscall(ctypes.c_long(SYS_CLONE), ctypes.c_ulong(flags | 17), z, z, z, z)  # SIGCHLD
if pid == 0:
    os.execve(sys.executable, [sys.executable, "-c", code], env)
with open(pidfile + ".t", "w") as f:
    f.write(str(pid))
os.rename(pidfile + ".t", pidfile)
os._exit(0)
"""
CLONE_PARENT = 0x8000


@pytest.mark.skipif(platform.machine() not in SYS_CLONE, reason="clone's number is per arch")
@pytest.mark.parametrize(
    "flags",
    [
        # closed in session 29: the parent's probe journals the children its code starts
        pytest.param(CLONE_PARENT, id="clone_parent"),
        pytest.param(0, id="plain_fork"),  # control: the payload's parent is stage one
    ],
)
def test_a_child_adopted_by_clone_parent_is_not_started_by_the_server(
    tmp_path: Path, flags: int
) -> None:
    """Attack: ``bash -c 'python -c STAGE_ONE & exec python -c <honest server>'``. Stage one
    is the server's child (the shell's fork), started before its probe, so it is no child the
    server started; it waits until the server's probe has started, then
    ``clone(CLONE_PARENT)``s and execs ``python -c <patcher>`` (a rewritten title): a process
    whose parent is the judged server and whose start is after the server's probe started,
    exactly what "started by" accepts; stage one exits (a zombie of the server's, no code).
    Gets: PASS under ``all_code_claimed`` with the honest claims (the payload's ``-c``:
    "started by api_server"), the payload's ``VALUE == 'evil!!!!!'``.
    Sound: FAIL (``provenance.code.unclaimed``, ``-c``): "started by" needs the parent's
    probe to have recorded starting that child (its pid and start, at ``fork``/``posix_spawn``
    /``subprocess``/multiprocessing), since the kernel's ppid does not say who made a child;
    the control (a plain fork: the payload's parent is stage one) FAILs today."""
    box = Box(tmp_path)
    install(box.site)
    box.scratch.mkdir()
    pout, cout, pidfile = tmp_path / "pout", tmp_path / "cout", tmp_path / "payload.pid"
    env = box.env()
    env["STAGE_ONE"] = STAGE_ONE.replace("SYS_CLONE", str(SYS_CLONE[platform.machine()]))
    env["EVIL_CODE"] = REWRITE_TITLE + evil_main(cout)
    env["HONEST_CODE"] = HONEST_SCRIPT
    py = sys.executable
    shell = (
        f'VERIFIER_PROBE_DISABLE=1 "{py}" -c "$STAGE_ONE" "{pout}" "{pidfile}" "$EVIL_CODE" '
        f'{flags} & exec "{py}" -c "$HONEST_CODE" "{pout}"'
    )
    proc = subprocess.Popen(["bash", "-c", shell], env=env, stderr=subprocess.PIPE)
    payload = None
    try:
        wait_ready(proc, pout, 60)
        wait_ready(proc, pidfile, 60)
        payload = int(pidfile.read_text())
        wait_ready(proc, cout, 60)
        time.sleep(2.0)  # a sweep or two
        procfs = ProcFS()
        server = to_report(procfs, read_process(procfs, proc.pid))
        child = to_report(procfs, read_process(procfs, payload))
        ppid = int(Path(f"/proc/{payload}/stat").read_text().rsplit(")", 1)[1].split()[1])
    finally:
        if payload is not None:
            with contextlib.suppress(OSError):
                os.kill(payload, signal.SIGKILL)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    require(pout.read_text() == repr("published"), "the server did not run honestly")
    require(cout.read_text() == repr("evil!!!!!"), "the payload did not serve its value")
    require("-c" not in child.cmdline, "the payload's title did not hide its -c")
    require((ppid == proc.pid) == bool(flags), f"the payload's parent is {ppid}")
    started = server.probe_started_ticks
    require(started is not None and child.key.start_ticks > started, "payload before the probe")
    v, found = verdict(server)
    require(v == Verdict.PASS, f"the honest server alone does not pass: {errors(found)}")
    v, found = verdict(server, child)
    assert v == Verdict.FAIL, errors(found)
    assert "provenance.code.unclaimed" in {i for i, _ in errors(found)}
