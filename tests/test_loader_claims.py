"""Drift that ``[[claims]]`` can account for, built for real: a venv made by ``virtualenv``.

The session-28 GPU run FAILed honest vLLM processes in the device image's venv: virtualenv's
``_virtualenv.pth`` imports its ``_virtualenv.py``, whose meta-path finder sets
``partial(_Finder.exec_module, old)`` on the loaders of ``distutils.dist`` and
``setuptools.dist``. A method set on a loader instance runs code the probe does not see the
bytes of (``tests/test_import_system_attacks.py``), so the module is
``provenance.module.unfiled`` (ERROR), and the ``.pth`` is ``provenance.pth.unclaimed``
(ERROR). Both files are in no RECORD. The fix is general, not virtualenv's pattern: the drift
names the loaded files that hold all the code the loader ran (``Drift.defined_in``), and a
policy's ``[[claims]]`` entries for exactly those bytes turn it into the WARNING
``provenance.module.custom_loader`` (as for a loader a pristine file defines) and account for
the ``.pth`` (``provenance.drift.vouched``, INFO).

What the claims must not buy, each built as an attack on a module of a pristine distribution
(``fakedist``) in the same venv, with ``_virtualenv.py`` claimed: the claimed function with
the attacker's callable bound in the partial (a function of the attacker's file; a C callable
that sets the module's attribute without running its file), and the claimed partial beside a
second method set on the instance (``get_code``). Each still FAILs; the control (the claimed
partial binding the loader's own method, as virtualenv does) PASSes.

virtualenv is pinned (pyproject.toml) to 20.31.2: from a later release it writes these files
only for Python < 3.10, while venvs made earlier (the device image's, Python 3.12) keep them.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from servewitness._cli.policy_cmd import render_policy
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.evidence import judgements
from servewitness.evidence.judge import Judgement
from servewitness.model import (
    DRIFT_MODULE_CUSTOM_LOADER,
    DRIFT_MODULE_UNFILED,
    DRIFT_PTH_UNCLAIMED,
    Drift,
    ProcessReport,
    Severity,
    Verdict,
)
from servewitness.policy import TargetSnapshot, load_policy
from servewitness.policy import findings as F
from servewitness.wire import files as wire_files
from servewitness.wire.fields import WireError
from tests.helpers import REPO, probe_env, probed_report, weak_policy
from tests.test_bytecode_attacks import install
from tests.test_code_claims import sha
from tests.test_gate_time_attacks import make_lab

VIRTUALENV = "20.31.2"
SCRIPT = (
    "import sys, time, warnings\n"
    "warnings.simplefilter('ignore')\n"
    "import distutils.dist, fakedist.core\n"
    "old = distutils.dist.__spec__.loader.__dict__.get('exec_module')\n"
    "result = repr((type(old).__name__, fakedist.core.VALUE))\n"
    "open(sys.argv[1], 'w').write(result)\n"
    "time.sleep(600)\n"
)
# The attacker's sitecustomize: a finder first on the meta path answers fakedist.core with a
# plain SourceFileLoader of the published file whose exec_module is virtualenv's claimed
# function, bound to OLD (``ld``: the loader); EXTRA lines may set more on the instance.
ATTACK = """\
import functools, importlib.machinery, importlib.util, operator, os, sys
import _virtualenv

class Finder:
    def find_spec(self, name, p=None, t=None):
        if name != "fakedist.core":
            return None
        import fakedist
        path = os.path.join(os.path.dirname(fakedist.__file__), "core.py")
        ld = importlib.machinery.SourceFileLoader(name, path)
        EXTRA
        old = OLD
        ld.exec_module = functools.partial(_virtualenv._Finder.exec_module, old)
        return importlib.util.spec_from_file_location(name, path, loader=ld)

sys.meta_path.insert(0, Finder())
"""
ATTACKS = {
    # the attacker's own function in the partial: it sets the value, the file never runs
    "own_function": ("lambda m: setattr(m, 'VALUE', 'evil!!!!!')", ""),
    # a C callable in the partial: no file holds its code at all
    "c_callable": ("operator.methodcaller('__setattr__', 'VALUE', 'evil!!!!!')", ""),
    # virtualenv's own pattern, and get_code set on the instance beside it
    "second_method": (
        "ld.exec_module",
        "ld.get_code = lambda name: compile(\"VALUE = 'evil!!!!!'\", path, 'exec')",
    ),
    # a variation: the exec_module of *another* plain loader, one of the attacker's file
    # (a loader's own method, but not this loader's)
    "other_loader": (
        "importlib.machinery.SourceFileLoader(name, evil).exec_module",
        "evil = os.path.join(os.path.dirname(__file__), 'evil.py'); "
        "open(evil, 'w').write(\"VALUE = 'evil!!!!!'\\n\")",
    ),
}
NO_FILE = ("c_callable", "other_loader")  # code no loaded file of known bytes holds
PUBLISHED = repr(("partial", "published"))


@dataclasses.dataclass(frozen=True)
class Venv:
    root: Path
    site: Path  # its site-packages

    @property
    def patch_file(self) -> Path:
        return self.site / "_virtualenv.py"

    @property
    def pth(self) -> Path:
        return self.site / "_virtualenv.pth"

    def claims(self) -> list[tuple[str, str]]:
        """The claims a user writes for the venv: virtualenv's two files, by their bytes."""
        return [(str(p), sha(p.read_bytes())) for p in (self.patch_file, self.pth)]

    def probe(self) -> tuple[str, str]:
        """The early probe's ``.pth``, copied in (installed from a wheel, its RECORD lists
        it): claimed by every policy here, so that only virtualenv's files are at stake."""
        p = self.site / "servewitness_probe_early.pth"
        return str(p), sha(p.read_bytes())


def make_venv(tmp: Path) -> Venv:
    """A venv made by the real virtualenv (no pip, setuptools or wheel: nothing else in
    it), with the early probe's ``.pth`` as a pip install of the probe would put it."""
    import virtualenv  # type: ignore[import-untyped]

    assert virtualenv.__version__ == VIRTUALENV, virtualenv.__version__  # see the docstring
    root = tmp / "venv"
    cmd = [sys.executable, "-m", "virtualenv", "-q", "--no-pip", "--no-setuptools", "--no-wheel"]
    subprocess.run([*cmd, str(root)], check=True, timeout=120)
    site = next(root.glob("lib/python3*/site-packages"))
    shutil.copy(REPO / "probe" / "servewitness_probe_early.pth", site)
    v = Venv(root, site)
    assert v.patch_file.is_file() and v.pth.read_text() == "import _virtualenv", sorted(
        p.name for p in site.iterdir()
    )
    return v


def run(tmp: Path, venv: Venv, sitecustomize: str | None = None) -> tuple[str, ProcessReport]:
    """The venv's interpreter, probed (early), with fakedist (published) on PYTHONPATH and
    SITECUSTOMIZE (the attacker's) before it: it imports distutils.dist and fakedist.core and
    prints (the type of what is set on distutils.dist's loader, fakedist.core.VALUE). What it
    printed and the agent's report of it, once swept."""
    site = tmp / "site"
    if not (site / "fakedist").exists():
        install(site)
    path = [str(site)]
    if sitecustomize is not None:
        attack = tmp / "attack"
        attack.mkdir(exist_ok=True)
        (attack / "sitecustomize.py").write_text(sitecustomize)
        path.insert(0, str(attack))
    out = tmp / f"out-{time.monotonic_ns()}"
    env = probe_env(
        tmp / "probe",
        VERIFIER_PROBE_EARLY="1",
        PYTHONPATH=":".join(path),
        PYTHONDONTWRITEBYTECODE="1",
    )
    return probed_report([str(venv.root / "bin" / "python"), "-c", SCRIPT, str(out)], env, out)


def policy(venv: Venv, claims: list[tuple[str, str]] | None = None) -> str:
    """``pristine = ["fakedist"]`` with the probe's ``.pth`` and CLAIMS claimed."""
    text = 'version = 1\n[provenance]\npristine = ["fakedist"]\n'
    for path, digest in [venv.probe(), *(claims or [])]:
        text += f'[[claims]]\npath = "{path}"\nsha256 = "{digest}"\n'
    return weak_policy(text)


def judge(report: ProcessReport, text: str) -> tuple[Verdict, dict[str, Any]]:
    """The verdict and {finding id: finding} (the first of each) of TEXT over REPORT, the
    process presented as an API server."""
    snap = TargetSnapshot("t", (dataclasses.replace(report, role="api_server"),), time.time())
    v = load_policy(text).evaluate_target(snap, now=snap.received_unix)
    found: dict[str, Any] = {}
    for f in v.findings:
        found.setdefault(f.id, f)
    return v.verdict, found


def shown(found: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The findings above INFO, for an assertion's message."""
    return [
        (k, f.severity.value, f.message[:300]) for k, f in found.items() if f.severity != "info"
    ]


def unfiled(report: ProcessReport, module: str) -> Drift:
    return next(d for d in report.drift if d.id == DRIFT_MODULE_UNFILED and d.module == module)


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Venv, ProcessReport]:
    """An honest process of a virtualenv venv, and its report (shared: one start)."""
    tmp = tmp_path_factory.mktemp("venv")
    venv = make_venv(tmp)
    result, report = run(tmp, venv)
    assert result == PUBLISHED  # virtualenv's partial is set; the published file ran
    return venv, report


def test_a_virtualenv_venv_names_the_files_its_loader_code_is_in(
    honest: tuple[Venv, ProcessReport],
) -> None:
    """The report: distutils.dist unfiled, ``defined_in`` exactly virtualenv's file (``old``
    is the loader's own method, not listed); the ``.pth`` unclaimed. Without claims, FAIL on
    both, as on the GPU."""
    venv, report = honest
    d = unfiled(report, "distutils.dist")
    assert d.defined_in == (str(venv.patch_file),), d
    assert "partial(_Finder.exec_module) set on the instance" in d.detail, d.detail
    assert any(x.id == DRIFT_PTH_UNCLAIMED and x.path == str(venv.pth) for x in report.drift)
    verdict, found = judge(report, policy(venv))
    assert verdict == Verdict.FAIL
    assert found[DRIFT_MODULE_UNFILED].severity == Severity.ERROR
    assert found[DRIFT_PTH_UNCLAIMED].severity == Severity.ERROR


def test_claims_of_virtualenvs_bytes_pass_the_honest_process(
    honest: tuple[Venv, ProcessReport],
) -> None:
    """With ``[[claims]]`` for the two files (no ``all_code_claimed``): PASS; the module is
    the WARNING ``custom_loader`` and both are listed in ``provenance.drift.vouched``."""
    venv, report = honest
    verdict, found = judge(report, policy(venv, venv.claims()))
    assert verdict == Verdict.PASS, shown(found)
    assert DRIFT_MODULE_UNFILED not in found and DRIFT_PTH_UNCLAIMED not in found
    loader = found[DRIFT_MODULE_CUSTOM_LOADER]
    assert loader.severity == Severity.WARNING
    assert "bytes the policy vouches for" in loader.message, loader.message
    vouched = found[F.DRIFT_VOUCHED]
    assert vouched.severity == Severity.INFO
    assert {e["id"] for e in vouched.context["entries"]} == {
        DRIFT_MODULE_UNFILED,
        DRIFT_PTH_UNCLAIMED,
    }


@pytest.mark.parametrize("which", ["patch_file", "pth"])
def test_a_claim_of_other_bytes_accounts_for_nothing(
    honest: tuple[Venv, ProcessReport], which: str
) -> None:
    """Variation: a claim whose sha256 is not the bytes that ran (the file was edited after
    it was vouched for): that drift stays an ERROR."""
    venv, report = honest
    claims = venv.claims()
    i = 0 if which == "patch_file" else 1
    claims[i] = (claims[i][0], sha(b"other bytes"))
    verdict, found = judge(report, policy(venv, claims))
    assert verdict == Verdict.FAIL
    kept = DRIFT_MODULE_UNFILED if which == "patch_file" else DRIFT_PTH_UNCLAIMED
    assert found[kept].severity == Severity.ERROR


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_the_claimed_loader_code_carrying_the_attackers_code_is_unfiled(
    tmp_path: Path, attack: str
) -> None:
    """Attack: with virtualenv's bytes claimed, the attacker builds a plain loader of a
    pristine module whose exec_module is ``partial(<claimed function>, X)``: X their own
    function, X a C callable, X the loader's own method beside ``get_code`` set on the
    instance, or (a variation) X another plain loader's own method, of the attacker's file.
    Without the probe following what the partial binds (and every method set), the drift
    would name only the claimed file: a WARNING, and the attacker's value served under PASS.
    Sound: the drift names the attacker's file too (claimable, unclaimed) or none at all (a
    C callable, the import system's frozen code: no loaded file holds it), and the verdict
    is FAIL."""
    venv = make_venv(tmp_path)
    old, extra = ATTACKS[attack]
    text = ATTACK.replace("OLD", old).replace("EXTRA", extra or "pass")
    result, report = run(tmp_path, venv, text)
    assert result == repr(("partial", "evil!!!!!"))  # the attacker's value is served
    verdict, found = judge(report, policy(venv, venv.claims()))
    assert verdict == Verdict.FAIL, shown(found)
    d = unfiled(report, "fakedist.core")
    mine = str(tmp_path / "attack" / "sitecustomize.py")
    want = () if attack in NO_FILE else (str(venv.patch_file), mine)
    assert set(d.defined_in) == set(want), d
    assert found[DRIFT_MODULE_UNFILED].severity == Severity.ERROR
    # control: the same attacker's loader binding only the loader's own method, as virtualenv
    # does, is accounted for by the claims: the FAIL above is the partial's doing
    honest = ATTACK.replace("OLD", "ld.exec_module").replace("EXTRA", "pass")
    result, report = run(tmp_path, venv, honest)
    assert result == repr(("partial", "published"))
    verdict, found = judge(report, policy(venv, venv.claims()))
    assert verdict == Verdict.PASS, shown(found)


def test_policy_init_claims_the_files_drift_names(honest: tuple[Venv, ProcessReport]) -> None:
    """``verifier policy init`` writes a ``[[claims]]`` entry for each file whose bytes
    account for the boot's drift, and its policy no longer FAILs on that drift."""
    venv, report = honest
    r = dataclasses.replace(report, role="api_server")
    text = render_policy("pid 1", r, allow_unsafe=True, tree=(r,))
    for path, digest in venv.claims():
        assert f'[[claims]]\npath = "{path}"\nsha256 = "{digest}"' in text, text
    _, found = judge(report, text)
    assert DRIFT_MODULE_UNFILED not in found and DRIFT_PTH_UNCLAIMED not in found, found
    assert found[DRIFT_MODULE_CUSTOM_LOADER].severity == Severity.WARNING


def test_the_live_verifier_takes_the_claims_over_grpc(
    honest: tuple[Venv, ProcessReport], tmp_path: Path
) -> None:
    """The honest report sent by a target's agent credential to a real ``verifier serve``
    over mTLS: ``defined_in`` crosses the wire (a verifier that dropped it could not account
    for the loader): the run with the claims PASSes, the run without FAILs on both."""
    venv, report = honest
    runs = {"bare": policy(venv), "claimed": policy(venv, venv.claims())}
    L = make_lab(tmp_path / "lab", runs)
    L.start()
    try:
        proc = (dataclasses.replace(report, role="api_server"),)
        for target in runs:
            L.report(target, proc)
        got = {t: status_of(L, f"r-{t}") for t in runs}
    finally:
        L.stop()
    assert got["bare"][0] == "VERDICT_FAIL", got
    assert {DRIFT_MODULE_UNFILED, DRIFT_PTH_UNCLAIMED} <= got["bare"][1], got
    assert got["claimed"][0] == "VERDICT_PASS", got
    assert {DRIFT_MODULE_CUSTOM_LOADER, F.DRIFT_VOUCHED} <= got["claimed"][1], got


def status_of(L: Any, run: str) -> tuple[str, set[str]]:
    from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc

    with L.channel("ci") as ch:
        got = pb_grpc.VerifierServiceStub(ch).GetRunStatus(pb.GetRunStatusRequest(name=run))
    ids = {f.id for t in got.verdict.targets for f in t.findings}
    json.dumps(sorted(ids))  # plain strings
    return str(pb.Verdict.Name(got.verdict.verdict)), ids


# the wire and the agent's kept judgements ----------------------------------------------------


def test_defined_in_crosses_the_wire_and_hostile_values_are_refused() -> None:
    d = Drift(DRIFT_MODULE_UNFILED, "/s/_virtualenv.py", "distutils.dist", "x", ("/s/a.py",))
    assert wire_files.drift_from_pb(wire_files.drift_to_pb(d), "d") == d
    other = pb.Drift(id=DRIFT_PTH_UNCLAIMED, path="/s/a.pth", detail="x", defined_in=["/s/a.py"])
    with pytest.raises(WireError, match=r"only provenance\.module\.unfiled"):
        wire_files.drift_from_pb(other, "d")
    many = pb.Drift(id=DRIFT_MODULE_UNFILED, path="/a", detail="x", defined_in=["/a"] * 33)
    with pytest.raises(WireError, match="more than 32"):
        wire_files.drift_from_pb(many, "d")


def test_a_probe_start_before_its_process_is_refused_on_the_wire() -> None:
    """``probe_started_ticks`` earlier than the process's own start is no start a probe can
    have (the checked and the fast converter agree); absent is None."""
    from servewitness.wire.process import process_from_pb
    from servewitness.wire.process_fast import process_fast

    msg = pb.ProcessReport(
        key=pb.ProcessKey(boot_id="b", pid=7, start_ticks=500), role="worker", start_time=1.0
    )
    assert process_from_pb(msg, "p").probe_started_ticks is None
    msg.probe_started_ticks = 501
    assert process_from_pb(msg, "p").probe_started_ticks == 501
    msg.probe_started_ticks = 499
    with pytest.raises(WireError, match="before the process started"):
        process_from_pb(msg, "p")
    assert process_fast(msg, "p") is None  # steps aside: the checked converter refuses it


def test_kept_judgements_keep_defined_in() -> None:
    d = Drift(DRIFT_MODULE_UNFILED, "/s/_virtualenv.py", "distutils.dist", "x", ("/s/a.py",))
    j = Judgement((), None, (), ("k", "v"), (d,))
    assert judgements._decode(judgements._encode(j)).static_drift == (d,)
    row = judgements._encode(j)
    row["drift"][0][4] = [3]  # edited: not a path
    with pytest.raises(ValueError, match="malformed"):
        judgements._decode(row)
