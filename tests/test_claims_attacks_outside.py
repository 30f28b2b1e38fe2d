"""Outside attacks on ``[provenance] all_code_claimed`` + ``only_distributions`` (a tester who
read only docs/policy.md, docs/threat-model.md and docs/probe.md first).

Each attack is built for real: a probed interpreter (early probe) with ``fakedist`` installed
(``tests/test_code_claims.py``'s harness), attacker's code that sets ``fakedist.core.VALUE``
after import, the agent's own judgement (``to_report(ProcFS(), read_process(...))``) and the
real policy engine under

    [provenance] pristine = ["fakedist"], all_code_claimed = true,
    only_distributions = <the honest distributions>

with the honest operator's claims only (this checkout's editable probe files and the
harness's own, unmodified ``-c`` script, as ``honest()`` builds them). Every test asserts
the SOUND outcome (not PASS); its docstring says what the attack got ("Gets: ..."). Seven
attacks PASSed when written (2026-12-07); six are closed:

* the spawn stub accepted from its command line alone (its pipe's pickle is code): only with
  the judged parent that started it (``rules_claims._started_by``);
* the forkserver stub (its literal ``main_path`` runs a file by path): not a stub; a main
  script is never ``generated`` (``origins._Classifier.entry``);
* relative, empty and since-removed ``PYTHONPATH`` entries, and a start environment
  rewritten in memory: the probe journals ``sys.path`` as it starts, before any
  ``sitecustomize``, and the agent takes every ``sys.path`` the probe ever recorded, made
  absolute against its working directory (``probe_reader.import_path``);
* a ``PYTHONHOME`` that is not the interpreter's own installation: not taken for the
  standard library (``stdlib.interpreter_stdlib``; ``evidence.stdlib.unconfirmed``).

* a child forked before its parent execs the judged server in its own pid: "started by"
  needs a start after the parent's probe started (``ProcessReport.probe_started_ticks``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import signal
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from servewitness.evidence.process import read_process
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.report import to_report
from servewitness.model import ProcessReport, Verdict
from servewitness.policy import TargetSnapshot, load_policy
from tests.helpers import probe_env, swept, wait_ready
from tests.test_bytecode_attacks import install
from tests.test_code_claims import EVIL, PATCHER, SCRIPT, own_claims, policy, sha

# the harness's own -c script, unmodified: what an honest operator runs and claims
HONEST_SCRIPT = SCRIPT.replace("EXTRA", "")
# the distributions an honest run of this harness loads (the control test checks it)
HONEST_DISTS = ["fakedist", "servewitness", "servewitness-probe", "setuptools"]

# attacker's helper: remove the planted file's own directory from sys.path once it ran
# (the probe's sys.path record is read later, at a sweep)
UNLIST_SELF = (
    "import os as _os, sys as _sys\n"
    "_d = _os.path.dirname(_os.path.abspath(__file__))\n"
    "_sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or '.') != _d]\n"
)

# attacker's helper: rename PYTHONPATH in the kernel's copy of the start environment
# (/proc/self/environ is the process's own memory, writable through /proc/self/mem)
HIDE_PYTHONPATH = (
    "def _hide():\n"
    "    stat = open('/proc/self/stat', 'rb').read()\n"
    "    fields = stat[stat.rindex(b')') + 2:].split()\n"
    "    start, end = int(fields[47]), int(fields[48])  # env_start, env_end\n"
    "    with open('/proc/self/mem', 'r+b', buffering=0) as mem:\n"
    "        mem.seek(start)\n"
    "        block = mem.read(end - start).split(b'\\0')\n"
    "        block = [b'PYTHONPATX=' + e[11:] if e.startswith(b'PYTHONPATH=') else e\n"
    "                 for e in block]\n"
    "        mem.seek(start)\n"
    "        mem.write(b'\\0'.join(block))\n"
    "_hide()\n"
)

# attacker's helper: write a title over the whole argv area (what setproctitle does for
# vLLM's engine and workers), without the setproctitle distribution
REWRITE_TITLE = (
    "def _title(t):\n"
    "    stat = open('/proc/self/stat', 'rb').read()\n"
    "    fields = stat[stat.rindex(b')') + 2:].split()\n"
    "    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end\n"
    "    with open('/proc/self/mem', 'r+b', buffering=0) as mem:\n"
    "        mem.seek(start)\n"
    "        mem.write(t + b'\\0' * (end - start - len(t)))\n"
    "_title(b'VLLM::Worker')\n"
)


def evil_main(out: Path) -> str:
    """Code that patches fakedist in memory, writes what the module holds to OUT, and stays."""
    return (
        "import importlib, time\nimport fakedist.core\nfakedist.core.VALUE = 'evil!!!!!'\n"
        f"open({str(out)!r}, 'w').write(repr(importlib.import_module('fakedist.core').VALUE))\n"
        "time.sleep(600)\n"
    )


@dataclasses.dataclass
class Box:
    tmp: Path

    @property
    def site(self) -> Path:
        return self.tmp / "site"

    @property
    def scratch(self) -> Path:  # the process's TMPDIR
        return self.tmp / "scratch"

    def env(self, **extra: str) -> dict[str, str]:
        base = {
            "VERIFIER_PROBE_EARLY": "1",
            "PYTHONPATH": str(self.site),
            "PYTHONDONTWRITEBYTECODE": "1",
            "TMPDIR": str(self.scratch),
        }
        base.update(extra)
        return probe_env(self.tmp / "probe", **base)


@pytest.fixture
def box(tmp_path: Path) -> Box:
    b = Box(tmp_path)
    install(b.site)
    b.scratch.mkdir()
    return b


def observe(
    argv: Sequence[str],
    env: dict[str, str],
    out: Path,
    *,
    cwd: Path | None = None,
    pass_fds: Sequence[int] = (),
    feed: tuple[int, bytes] | None = None,
) -> ProcessReport:
    """Start ARGV, wait until it wrote OUT, let the probe sweep, return the agent's report."""
    proc = subprocess.Popen(
        list(argv), env=env, cwd=cwd, pass_fds=tuple(pass_fds), stderr=subprocess.PIPE
    )
    try:
        if feed is not None:
            os.write(*feed)
        wait_ready(proc, out, 60)
        swept(Path(env["VERIFIER_PROBE_DIR"]), proc.pid)
        procfs = ProcFS()
        return to_report(procfs, read_process(procfs, proc.pid))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()


def run_honest_script(
    box: Box, *, cwd: Path | None = None, more: dict[str, str] | None = None, **env: str
) -> tuple[str, ProcessReport]:
    out = box.tmp / f"out-{time.monotonic_ns()}"
    argv = [sys.executable, "-c", HONEST_SCRIPT, str(out)]
    report = observe(argv, box.env(**env, **(more or {})), out, cwd=cwd)
    return out.read_text(), report


def honest_claims() -> list[tuple[str, str]]:
    return [*own_claims(), ("-c", sha(HONEST_SCRIPT.encode()))]


def verdict(
    *reports: ProcessReport, claims: list[tuple[str, str]] | None = None
) -> tuple[Verdict, list[Any]]:
    """The target's verdict over REPORTS (the first as api_server, the rest as workers) under
    the strict policy with the honest claims."""
    roles = ["api_server"] + ["worker"] * (len(reports) - 1)
    procs = tuple(dataclasses.replace(r, role=role) for r, role in zip(reports, roles, strict=True))
    for r in procs:
        assert r.provenance is not None
        dists = {d for d, _, _ in r.provenance.distributions}
        assert dists <= set(HONEST_DISTS), dists  # no attacker distribution is involved
    text = policy(claims=honest_claims() if claims is None else claims, only=HONEST_DISTS)
    snap = TargetSnapshot("t", procs, time.time())
    v = load_policy(text).evaluate_target(snap, now=snap.received_unix)
    return v.verdict, list(v.findings)


def errors(found: list[Any]) -> list[tuple[str, str]]:
    return [(f.id, f.message) for f in found if f.severity.name in ("ERROR", "PENDING")]


# negative control ----------------------------------------------------------------------------


def test_control_an_honest_process_passes(box: Box) -> None:
    """Negative control: the unmodified harness script, nothing planted: PASS under the strict
    policy with the honest claims (so every FAIL below is the attack's doing)."""
    result, report = run_honest_script(box)
    assert result == repr("published")
    assert report.provenance is not None
    assert {d for d, _, _ in report.provenance.distributions} == set(HONEST_DISTS)
    v, found = verdict(report)
    assert v == Verdict.PASS, errors(found)


# 1. multiprocessing's start stubs as delivery --------------------------------------------------


def test_spawn_stub_started_by_an_unjudged_parent_runs_a_pickled_payload(box: Box) -> None:
    """The exact ``-c`` multiprocessing.spawn writes (``spawn_main(pipe_handle=N)``, literal
    arguments, ``--multiprocessing-fork``), started by a process nobody judges (here the test;
    in a deployment: an entrypoint script), with a pipe whose pickle reduces to
    ``exec(<patcher>, {})``: the stub unpickles its preparation data and runs the attacker's
    code. No file holds that code.
    Gets: PASS ('-c' accepted as 'spawn stub' from its command line alone, whoever the parent
    is and whatever the pipe carries), with fakedist.core.VALUE == 'evil!!!!!'."""
    from multiprocessing import spawn

    out = box.tmp / "out"
    payload = evil_main(out)

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (exec, (payload, {}))

    r, w = os.pipe()
    try:
        argv = spawn.get_command_line(pipe_handle=r)
        assert argv[argv.index("-c") + 1] == (
            f"from multiprocessing.spawn import spawn_main; spawn_main(pipe_handle={r})"
        )
        data = pickle.dumps({"name": "x", "payload": Payload()}, protocol=2)
        report = observe(argv, box.env(), out, pass_fds=(r,), feed=(w, data))
    finally:
        os.close(r)
        os.close(w)
    assert out.read_text() == EVIL
    # the operator claims only their probe: the stub is the only -c there is
    v, _ = verdict(report, claims=own_claims())
    assert v != Verdict.PASS, "PASS with attacker code run from a pickle by a spawn stub"


def test_forkserver_stub_with_a_literal_main_path_in_tmpdir_runs_a_planted_file(box: Box) -> None:
    """The forkserver's start stub, literal arguments only
    (``main(5, 6, ['__main__'], **{'sys_path': [...], 'main_path': '<TMPDIR>/evil.py'})``):
    ``forkserver.main`` runs ``main_path`` by path (``runpy.run_path``) before it touches its
    fds. The planted file lies in the process's TMPDIR and in no directory the process imports
    modules from by name, so it is classed ``generated``.
    Gets: PASS (stub accepted; evil.py accepted as generated), VALUE == 'evil!!!!!'."""
    out = box.tmp / "out"
    planted = box.scratch / "evil.py"
    planted.write_text(evil_main(out))
    data = {"sys_path": [str(box.site)], "main_path": str(planted)}
    code = f"from multiprocessing.forkserver import main; main(5, 6, {['__main__']!r}, **{data!r})"
    report = observe([sys.executable, "-c", code], box.env(), out)
    assert out.read_text() == EVIL
    v, _ = verdict(report, claims=own_claims())
    assert v != Verdict.PASS, "PASS with a planted file run by the forkserver stub's main_path"


# 2. a planted sitecustomize in TMPDIR that the "imports by name" check does not see ------------


def test_relative_pythonpath_entry_into_tmpdir_is_imported_by_name(box: Box) -> None:
    """``PYTHONPATH=evil:<site>`` (a relative entry) with the working directory in TMPDIR: the
    interpreter imports ``sitecustomize`` from ``<TMPDIR>/evil``; the sitecustomize patches and
    then drops its directory from ``sys.path``. The import dirs the agent compares with are the
    probe's ``sys.path`` (no longer listing it) and the start PYTHONPATH's *absolute* entries
    only, so the relative entry is never resolved against the process's cwd.
    Gets: PASS, the sitecustomize classed ``generated``, VALUE == 'evil!!!!!'."""
    evil = box.scratch / "evil"
    evil.mkdir()
    (evil / "sitecustomize.py").write_text(PATCHER + UNLIST_SELF)
    result, report = run_honest_script(
        box, cwd=box.scratch, PYTHONPATH=f"evil{os.pathsep}{box.site}"
    )
    assert result == EVIL
    v, _ = verdict(report)
    assert v != Verdict.PASS, "PASS with a sitecustomize imported through a relative entry"


def test_empty_pythonpath_entry_with_cwd_in_tmpdir_is_imported_by_name(box: Box) -> None:
    """``PYTHONPATH=:<site>`` (an empty entry: the working directory) with the process started
    in TMPDIR, where ``sitecustomize.py`` is planted; it unlists the cwd from ``sys.path``
    after patching. Same gap as the relative entry (empty entries are dropped).
    Gets: PASS, classed ``generated``, VALUE == 'evil!!!!!'."""
    (box.scratch / "sitecustomize.py").write_text(PATCHER + UNLIST_SELF)
    result, report = run_honest_script(box, cwd=box.scratch, PYTHONPATH=f"{os.pathsep}{box.site}")
    assert result == EVIL
    v, _ = verdict(report)
    assert v != Verdict.PASS, "PASS with a sitecustomize imported through an empty entry"


def test_start_environment_rewritten_in_memory_hides_pythonpath(box: Box) -> None:
    """``PYTHONPATH=<TMPDIR>/evil:<site>`` (absolute), the sitecustomize there patches, drops its
    directory from ``sys.path`` and renames ``PYTHONPATH`` in its own start-environment block
    (``/proc/self/mem`` at ``env_start``), which is what ``/proc/<pid>/environ`` shows the
    agent. ``PATH`` and ``HOME`` are left in place, so no ancestor's environment stands in.
    Gets: PASS, classed ``generated``, VALUE == 'evil!!!!!'. (Control, caught: the same without
    the environment rewrite, ``test_caught_variants[absolute-unlisted]``.)"""
    evil = box.scratch / "evil"
    evil.mkdir()
    (evil / "sitecustomize.py").write_text(PATCHER + UNLIST_SELF + HIDE_PYTHONPATH)
    result, report = run_honest_script(box, PYTHONPATH=f"{evil}{os.pathsep}{box.site}")
    assert result == EVIL
    v, _ = verdict(report)
    assert v != Verdict.PASS, "PASS with the start environment rewritten in memory"


# 3. -c hidden by a title, "started by its parent" ----------------------------------------------


def test_child_forked_before_its_parent_execs_the_judged_server(box: Box) -> None:
    """A shell forks ``python -c <patcher>`` into the background and then ``exec``s the honest,
    judged server in its own pid. The child writes a title over its argv (as vLLM's workers
    do), so its ``-c`` cannot be read; its parent pid is now the judged server's, which also
    started earlier (the shell's fork). The server's own code never chose the child.
    Gets: PASS (child's '-c' 'started by api_server'), child's VALUE == 'evil!!!!!'.
    Sound (closed in session 29): "started by" needs a start after the parent's *probe*
    started (``probe_started_ticks``), which the exec'd server's probe did after the fork."""
    pout, cout = box.tmp / "pout", box.tmp / "cout"
    env = box.env()
    env["EVIL_CODE"] = REWRITE_TITLE + evil_main(cout)
    env["HONEST_CODE"] = HONEST_SCRIPT
    py = sys.executable
    shell = f'"{py}" -c "$EVIL_CODE" & exec "{py}" -c "$HONEST_CODE" "{pout}"'
    proc = subprocess.Popen(["bash", "-c", shell], env=env, stderr=subprocess.PIPE)
    child = None
    try:
        wait_ready(proc, pout, 60)
        wait_ready(proc, cout, 60)
        child = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        swept(box.tmp / "probe", proc.pid, child)
        procfs = ProcFS()
        parent_report = to_report(procfs, read_process(procfs, proc.pid))
        child_report = to_report(procfs, read_process(procfs, child))
    finally:
        if child is not None:
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert pout.read_text() == repr("published") and cout.read_text() == EVIL
    assert "-c" not in child_report.cmdline  # hidden by the title
    started = parent_report.probe_started_ticks
    assert started is not None and child_report.key.start_ticks <= started
    assert child_report.key.start_ticks >= parent_report.key.start_ticks  # the shell's fork
    v, _ = verdict(parent_report, child_report)
    assert v != Verdict.PASS, "PASS with a child the judged parent never started"


# 4. the standard library's location is the attacker's ----------------------------------------


def test_pythonhome_pointing_at_a_planted_stdlib(box: Box) -> None:
    """``PYTHONHOME=<dir>`` whose ``lib/python3.X`` is symlinks to every entry of the real
    standard library plus a planted ``sitecustomize.py``: the agent confirms the standard
    library as ``<PYTHONHOME>/lib/python3.X`` (it has ``os.py``), so the planted file is classed
    ``stdlib``. No image write is needed, only the environment and a writable directory.
    Gets: PASS, VALUE == 'evil!!!!!'. (Adjacent to the documented "standard library is never
    verified against a reference" limit, which speaks of files edited in the image.)"""
    real = Path(sysconfig.get_paths()["stdlib"])
    home = box.tmp / "home"
    lib = home / "lib" / real.name
    lib.mkdir(parents=True)
    for entry in real.iterdir():
        (lib / entry.name).symlink_to(entry)
    (lib / "sitecustomize.py").write_text(PATCHER)
    result, report = run_honest_script(box, PYTHONHOME=str(home))
    assert result == EVIL
    v, _ = verdict(report)
    assert v != Verdict.PASS, "PASS with a sitecustomize planted in a PYTHONHOME stdlib"


# 5. variants that are caught today (regression guards) -----------------------------------------


def _build_extension(where: Path) -> None:
    src = where / "m.c"
    src.write_text(
        "#include <Python.h>\n"
        "static struct PyModuleDef def = {\n"
        '    PyModuleDef_HEAD_INIT, "sitecustomize", NULL, -1, NULL};\n'
        "PyMODINIT_FUNC PyInit_sitecustomize(void) {\n"
        '    PyRun_SimpleString("import fakedist.core\\n"\n'
        "                       \"fakedist.core.VALUE = 'evil!!!!!'\\n\");\n"
        "    return PyModule_Create(&def);\n"
        "}\n"
    )
    so = where / ("sitecustomize" + sysconfig.get_config_var("EXT_SUFFIX"))
    include = sysconfig.get_paths()["include"]
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", f"-I{include}", str(src), "-o", str(so)], check=True
    )
    src.unlink()


def _caught_setup(box: Box, variant: str) -> dict[str, str]:
    """Plant VARIANT's sitecustomize; return the process's extra environment."""
    evil = box.scratch / "evil"
    evil.mkdir()
    site = str(box.site)
    if variant == "absolute-unlisted":  # absolute PYTHONPATH entry, unlisted from sys.path
        (evil / "sitecustomize.py").write_text(PATCHER + UNLIST_SELF)
        return {"PYTHONPATH": f"{evil}{os.pathsep}{site}"}
    if variant == "dotted-entry":  # a non-normalised absolute entry, unlisted
        (evil / "sitecustomize.py").write_text(PATCHER + UNLIST_SELF)
        return {"PYTHONPATH": f"{box.scratch}/./evil/{os.pathsep}{site}"}
    if variant == "package":  # sitecustomize as a package whose folder is no sys.path entry
        (box.scratch / "sitecustomize").mkdir()
        (box.scratch / "sitecustomize" / "__init__.py").write_text(PATCHER)
        return {"PYTHONPATH": f"{box.scratch}{os.pathsep}{site}"}
    if variant == "symlinked-entry":  # a PYTHONPATH entry that is a link into TMPDIR
        (evil / "sitecustomize.py").write_text(PATCHER)
        (box.tmp / "link").symlink_to(evil)
        return {"PYTHONPATH": f"{box.tmp / 'link'}{os.pathsep}{site}"}
    if variant == "zip-in-tmpdir":
        with zipfile.ZipFile(box.scratch / "evil.zip", "w") as z:
            z.writestr("sitecustomize.py", PATCHER)
        return {"PYTHONPATH": f"{box.scratch / 'evil.zip'}{os.pathsep}{site}"}
    if variant == "extension-module":  # native code, but imported as a module
        _build_extension(evil)
        return {"PYTHONPATH": f"{evil}{os.pathsep}{site}"}
    raise AssertionError(variant)


@pytest.mark.parametrize(
    "variant",
    [
        "absolute-unlisted",
        "dotted-entry",
        "package",
        "symlinked-entry",
        "zip-in-tmpdir",
        "extension-module",
    ],
)
def test_caught_variants(box: Box, variant: str) -> None:
    """Variants caught today with ``provenance.code.unclaimed`` (the planted file ``unknown``):
    an absolute PYTHONPATH entry under TMPDIR unlisted from ``sys.path`` after the import (the
    start PYTHONPATH still names it), a ``/./``-and-trailing-slash spelling of it, a
    ``sitecustomize`` package under a TMPDIR entry, an entry that is a symlink into TMPDIR, a
    zip archive in TMPDIR, and a C extension module named ``sitecustomize``."""
    if variant == "extension-module" and not any(
        (Path(d) / "gcc").exists() for d in os.environ.get("PATH", "").split(os.pathsep)
    ):
        pytest.skip("no gcc on this machine to build the C extension module this variant loads")
    extra = _caught_setup(box, variant)
    result, report = run_honest_script(box, more=extra)
    assert result == EVIL
    v, found = verdict(report)
    assert v == Verdict.FAIL
    assert "provenance.code.unclaimed" in {i for i, _ in errors(found)}
