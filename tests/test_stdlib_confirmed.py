"""Which directory is the standard library is not the process's to say.

The probe records ``sys._stdlib_dir``, and a module loaded from the standard library is exempt
from the shadowing check (``provenance.module.shadowed``) and classed ``stdlib``. Any code in
the process can set ``sys._stdlib_dir``: a workload that names a directory of its own the
standard library (with a copy of ``importlib`` there, so the probe finds the frozen modules'
files) hides a module that shadows the real standard library's. The agent finds the standard
library of the interpreter the kernel runs (``/proc/<pid>/exe``, ``PYTHONHOME``,
``pyvenv.cfg``) and believes the probe only where they agree
(``evidence.stdlib.unconfirmed``, an ERROR, otherwise).

Each case is a real probed Python process judged by the real agent code and policy."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servewitness.evidence.process import read_process
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.report import to_report
from servewitness.evidence.stdlib import interpreter_stdlib
from servewitness.model import (
    DRIFT_MODULE_SHADOWED,
    EVIDENCE_STDLIB_UNCONFIRMED,
    ProcessReport,
    Verdict,
)
from servewitness.policy import TargetSnapshot, load_policy
from tests.helpers import probe_env, weak_policy

# a module of the standard library the probe itself never imports, shadowed
SHADOW = "def mean(data): return 42  # not the standard library's\n"
REAL_IMPORTLIB = Path(importlib.machinery.__file__).parent


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    made: list[subprocess.Popen[str]] = []
    yield made
    for p in made:
        p.communicate(timeout=10)


def probed(
    tmp: Path, procs: list[subprocess.Popen[str]], before: str = "", python: str = sys.executable,
    **env: str,
) -> ProcessReport:  # fmt: skip
    """A probed process that ran BEFORE, started its probe and imported ``statistics`` (what
    PYTHONPATH in ENV gives it); the agent's report of it once the probe recorded it."""
    code = (
        f"import sys\n{before}\nimport servewitness_probe as p\np.start()\nimport statistics\n"
        "print(statistics.mean([1, 2]), flush=True)\nsys.stdin.read()\n"
    )
    full = probe_env(tmp / "probe", PYTHONDONTWRITEBYTECODE="1", **env)
    proc = subprocess.Popen(
        [python, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=full, text=True
    )
    procs.append(proc)
    assert proc.stdout is not None
    said = proc.stdout.readline().strip()
    deadline = time.monotonic() + 30
    while True:
        procfs = ProcFS()
        report = to_report(procfs, read_process(procfs, proc.pid))
        files = {f.module for f in report.files or ()}
        if "statistics" in files or time.monotonic() > deadline:
            assert "statistics" in files, f"statistics never recorded (it said {said!r})"
            return report
        time.sleep(0.1)


def shadow_dir(tmp: Path) -> Path:
    x = tmp / "x"
    x.mkdir()
    (x / "statistics.py").write_text(SHADOW)
    return x


def verdict(report: ProcessReport) -> tuple[Verdict, set[str]]:
    snap = TargetSnapshot("t", (dataclasses.replace(report, role="worker"),), time.time())
    policy = weak_policy('version = 1\n[[forbid]]\nmodule = "no_such_module_anywhere"\n')
    v = load_policy(policy).evaluate_target(snap, time.time())
    return v.verdict, {f.id for f in v.findings}


def shadowed(report: ProcessReport) -> list[str]:
    return [d.module or "" for d in report.drift if d.id == DRIFT_MODULE_SHADOWED]


def problems(report: ProcessReport) -> list[str]:
    return [e.detail for e in report.evidence_problems if e.id == EVIDENCE_STDLIB_UNCONFIRMED]


def test_a_module_shadowing_the_standard_library_is_seen(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """The control: ``statistics`` from PYTHONPATH shadows the standard library's, and the
    interpreter's own standard library is confirmed (no evidence problem)."""
    report = probed(tmp_path, procs, PYTHONPATH=str(shadow_dir(tmp_path)))
    assert shadowed(report) == ["statistics"], report.drift
    assert problems(report) == []
    assert verdict(report)[0] == Verdict.FAIL


def test_a_forged_stdlib_dir_does_not_hide_the_shadowing(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """The attack: the workload sets ``sys._stdlib_dir`` to its own directory (holding the
    shadowing module and a copy of ``importlib``, so nothing reads as fileless) before the
    probe starts. Without the check the report had no drift and the verdict PASSed; now the
    interpreter's standard library stands, the shadowing is seen, and the forged claim is an
    ERROR of its own."""
    x = shadow_dir(tmp_path)
    shutil.copytree(REAL_IMPORTLIB, x / "importlib")
    report = probed(tmp_path, procs, f"sys._stdlib_dir = {str(x)!r}", PYTHONPATH=str(x))
    assert "statistics" in shadowed(report), report.drift
    [why] = problems(report)
    assert str(x) in why and str(Path(shutil.__file__).parent) in why, why
    got, ids = verdict(report)
    assert got == Verdict.FAIL and {EVIDENCE_STDLIB_UNCONFIRMED, DRIFT_MODULE_SHADOWED} <= ids


def test_a_forged_version_confirms_no_directory(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """The variation: the workload also rewrites ``sys.version``, so the agent looks for a
    standard library of another release: none is found, none is taken, and that is an ERROR
    (never the probe's word)."""
    x = shadow_dir(tmp_path)
    shutil.copytree(REAL_IMPORTLIB, x / "importlib")
    forge = f"sys._stdlib_dir = {str(x)!r}\nsys.version = '2.7.18 (forged)'"
    report = probed(tmp_path, procs, forge, PYTHONPATH=str(x))
    [why] = problems(report)
    assert "no directory is taken" in why, why
    got, ids = verdict(report)
    assert got == Verdict.FAIL and EVIDENCE_STDLIB_UNCONFIRMED in ids


def test_pythonhome_and_a_virtualenv_made_with_copies_are_confirmed(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """Where CPython finds its standard library elsewhere than beside the executable, so does
    the agent: PYTHONHOME (the base installation), and a virtualenv whose python is a copy
    (its pyvenv.cfg names the base interpreter's directory). No evidence problem."""
    home = probed(tmp_path / "home", procs, PYTHONHOME=sys.base_prefix)
    assert problems(home) == [] and home.evidence_problems == (), home.evidence_problems
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--copies", "--without-pip", str(venv)],
        check=True, timeout=120,
    )  # fmt: skip
    python = venv / "bin" / "python"
    assert not python.is_symlink()
    copied = probed(tmp_path / "copies", procs, python=str(python))
    assert problems(copied) == [], copied.evidence_problems


def test_interpreter_stdlib_of_this_process() -> None:
    """This interpreter's standard library, found from its /proc entry alone, is the one it
    uses; a version string that is no release finds none."""
    import os

    expected = str(Path(shutil.__file__).parent)
    v = ".".join(map(str, sys.version_info[:2]))
    assert interpreter_stdlib(ProcFS(), os.getpid(), v) == expected
    assert interpreter_stdlib(ProcFS(), os.getpid(), "../../etc") is None
    assert interpreter_stdlib(ProcFS(), os.getpid(), "2.7") is None
