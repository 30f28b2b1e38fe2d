"""An audit hook added after the early probe started, judged by who added it.

The session-29 GPU run FAILed honest processes under every policy that judges loaded files:
the image's filelock (3.32.5) calls ``sys.addaudithook`` when imported (a guard that raises on
``fork`` while a lock changes hands), and an audit hook added after the probe is an ``imports``
probe error, judged. The probe now names the file of the code that added it (``by``); the
agent reports it as ``audit_hook`` (said in every verdict, not judged) only when that file is
one the process loaded and that is pristine against its distribution's RECORD. Built for real:
a pristine distribution whose module adds a hook at import (as filelock does) is said, not
judged; the same module edited (patched), and the same call from a ``sitecustomize`` nobody
installed, stay judged (FAIL).
"""

from __future__ import annotations

import py_compile
from pathlib import Path

import pytest

from servewitness.evidence.report import probe_errors
from servewitness.model import Verdict
from tests.helpers import install_dist
from tests.test_code_claims import judge, policy, run

HOOKING = b"import sys\ndef _guard(event, args):\n    pass\nsys.addaudithook(_guard)\n"


def hook_errors(errors: tuple[str, ...]) -> list[str]:
    return [e for e in errors if "an audit hook was added" in e]


@pytest.mark.parametrize("pyc", [False, True])
def test_a_pristine_distribution_adding_an_audit_hook_is_said_not_judged(
    tmp_path: Path, pyc: bool
) -> None:
    """PYC: its bytecode compiled, as pip does at install (the source is then hashed after
    the pyc ran, ``deferred``: the GPU image's filelock)."""
    install_dist(tmp_path / "site", "hookdist", {"hookdist/__init__.py": HOOKING})
    if pyc:
        py_compile.compile(str(tmp_path / "site" / "hookdist" / "__init__.py"), doraise=True)
    r = run(tmp_path, extra="import hookdist")
    (said,) = hook_errors(r.report.probe_errors)
    path = str(tmp_path / "site" / "hookdist" / "__init__.py")
    assert said.startswith("[audit_hook] ") and f"by {path}:4 (<module>)" in said, said
    verdict, found = judge(r.report, policy(claimed=False))  # pristine = ["fakedist"]
    assert verdict == Verdict.PASS, [(f.id, f.message) for f in found]
    assert any(f.id == "evidence.probe_errors" and "audit hook" in f.message for f in found)


def test_an_edited_distribution_adding_an_audit_hook_is_judged(tmp_path: Path) -> None:
    """Attack: the hook added from a distribution's file whose bytes are not its RECORD's
    (patched): it is no published code, so the error stays ``imports``: FAIL."""
    site = tmp_path / "site"
    install_dist(site, "hookdist", {"hookdist/__init__.py": HOOKING})
    (site / "hookdist" / "__init__.py").write_bytes(HOOKING + b"# edited\n")
    r = run(tmp_path, extra="import hookdist")
    (said,) = hook_errors(r.report.probe_errors)
    assert said.startswith("[imports] "), said
    verdict, _ = judge(r.report, policy(claimed=False))
    assert verdict == Verdict.FAIL


def test_a_sitecustomize_adding_an_audit_hook_is_judged(tmp_path: Path) -> None:
    """Attack: the same call from a file no distribution installed: judged, FAIL."""
    r = run(tmp_path, sitecustomize=HOOKING.decode())
    (said,) = hook_errors(r.report.probe_errors)
    assert said.startswith("[imports] ") and "sitecustomize.py:4" in said, said
    verdict, _ = judge(r.report, policy(claimed=False))
    assert verdict == Verdict.FAIL


def test_the_process_cannot_name_its_error_audit_hook_itself() -> None:
    """A record whose ``where`` is already ``audit_hook`` (written by the process, not the
    agent) is judged as ``imports``; a ``by`` naming no loaded pristine file changes nothing."""
    got = probe_errors(
        [{"where": "audit_hook", "msg": "x"}, {"where": "imports", "msg": "y", "by": "/nope.py"}],
        [],
        None,
        (),
    )
    assert got == ("[imports] x", "[imports] y")
