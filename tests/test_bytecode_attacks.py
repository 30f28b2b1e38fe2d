"""Bytecode that is not its source, built for real (issue 18, class 1).

A probed Python process imports ``fakedist.core``, a module of a tiny installed distribution
(its RECORD lists the sources, and the pycs without a hash, as pip writes it), from a ``.pyc``
the attacker wrote: the process runs the attacker's code, which the test checks first. Then
the agent's judgement (``evidence.report.to_report``: what the agent and ``verifier inspect``
run) and the policy engine judge it from outside. Every attack must end in
``provenance.bytecode.stale`` (ERROR) and the pyc not counting as pristine, so that
``[provenance] pristine = ["fakedist"]`` FAILs; the honest pycs must pass.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.util
import marshal
import os
import py_compile
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
    DRIFT_BYTECODE_STALE,
    DRIFT_BYTECODE_UNCHECKED,
    Origin,
    ProcessReport,
    Severity,
    Verdict,
)
from servewitness.policy import TargetSnapshot, load_policy
from servewitness.policy import findings as F
from tests.helpers import SOURCE_PATH, probe_env, swept, wait_ready, weak_policy

Mode = py_compile.PycInvalidationMode
PUBLISHED = "VALUE = 'published'\n"
EVIL = "VALUE = 'evil!!!!!'\n"  # the same size as PUBLISHED: a rewrite can keep the stat
GUARDED = (
    "def check(x):\n"
    "    assert x > 0, 'refused'\n"
    "    return x\n"
    "VALUE = 'published'\n"
)  # fmt: skip
# drift of a fake distribution is what is judged here: no vLLM, no step (explicitly weak)
PRISTINE = weak_policy('version = 1\n[provenance]\npristine = ["fakedist"]\n')
TAG = sys.implementation.cache_tag


def record_row(rel: str, data: bytes | None) -> str:
    if data is None:
        return f"{rel},,"
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")
    return f"{rel},sha256={digest},{len(data)}"


def install(site: Path, core: str = PUBLISHED) -> Path:
    """fakedist 1.0 in SITE: its package (``__init__.py``, ``core.py`` holding CORE) with
    honest timestamp pycs, METADATA, and a RECORD with the sources' hashes and the pycs
    listed without one. Returns core.py's path."""
    files = {"fakedist/__init__.py": b"", "fakedist/core.py": core.encode()}
    info = site / "fakedist-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakedist\nVersion: 1.0\n")
    rows = []
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        py_compile.compile(str(site / rel), doraise=True)
        name = Path(rel).stem
        rows += [record_row(rel, data), f"fakedist/__pycache__/{name}.{TAG}.pyc,,"]
    rows.append("fakedist-1.0.dist-info/RECORD,,")
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    return site / "fakedist" / "core.py"


def pyc_of(src: Path, optimize: int = 0) -> Path:
    return Path(importlib.util.cache_from_source(str(src), optimization=optimize or ""))


def forge(src: Path, code: str, *, flags: int = 0, optimize: int = 0) -> bytes:
    """A pyc for SRC whose header the interpreter accepts (FLAGS 0: SRC's mtime and size now;
    1 or 3: the hash of SRC's bytes now) and whose code is CODE compiled at OPTIMIZE."""
    compiled = compile(code, str(src), "exec", dont_inherit=True, optimize=optimize)
    if flags == 0:
        st = src.stat()
        tail = (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
        tail += (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    else:
        tail = importlib.util.source_hash(src.read_bytes())
    head = importlib.util.MAGIC_NUMBER + flags.to_bytes(4, "little") + tail
    return head + marshal.dumps(compiled)


@dataclasses.dataclass(frozen=True)
class Run:
    result: str  # what the process printed: repr of the expression it was given
    report: ProcessReport


def run(tmp: Path, site: Path, expr: str = "m.VALUE", *flags: str, after: str = "") -> Run:
    """A probed interpreter (FLAGS, e.g. -O) that imports fakedist.core as m, runs AFTER and
    writes repr(EXPR); its report as the agent builds it, once the probe's sweeper ran."""
    out = tmp / f"out-{time.monotonic_ns()}"
    (tmp / "scratch").mkdir(exist_ok=True)
    script = (
        "import sys, time\n"
        "import fakedist.core as m\n"
        f"{after}"
        "try:\n"
        f"    result = repr({expr})\n"
        "except AssertionError as e:\n"
        "    result = f'AssertionError({e})'\n"
        "open(sys.argv[1], 'w').write(result)\n"
        "time.sleep(600)\n"
    )
    env = probe_env(
        tmp / "probe",
        VERIFIER_PROBE_EARLY="1",
        PYTHONPATH=f"{site}{os.pathsep}{SOURCE_PATH}",  # this checkout's probe, not another's
        PYTHONDONTWRITEBYTECODE="1",  # the attacker's pycs stay as written
        TMPDIR=str(tmp / "scratch"),  # files under TMP are not "generated"
    )
    cmd = [sys.executable, *flags, "-c", script, str(out)]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)
    try:
        wait_ready(proc, out)
        swept(tmp / "probe", proc.pid)  # it hashes the sources of modules run from bytecode
        procfs = ProcFS()
        report = to_report(procfs, read_process(procfs, proc.pid))
        return Run(out.read_text(), report)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()


def drift_ids(report: ProcessReport, path: Path) -> set[str]:
    return {d.id for d in report.drift if d.path == str(path)}


def origin_of(report: ProcessReport, path: Path) -> tuple[str, str | None]:
    """PATH's class and distribution ("pristine" if counted and not listed, as pristine
    files are); fails if the process did not load it."""
    assert str(path) in {f.path for f in report.files or ()}, f"{path} was not loaded"
    assert report.provenance is not None
    for f in report.provenance.files:
        if f.path == str(path):
            return f.origin, f.distribution
    return "pristine", "fakedist"


def judged(report: ProcessReport) -> tuple[Verdict, set[tuple[str, Severity, str | None]]]:
    """``[provenance] pristine = ["fakedist"]`` over REPORT through the real engine, the
    process presented as an API server (the rules judge vLLM roles)."""
    snap = TargetSnapshot("t", (dataclasses.replace(report, role="api_server"),), time.time())
    v = load_policy(PRISTINE).evaluate_target(snap, now=snap.received_unix)
    return v.verdict, {(f.id, f.severity, f.context.get("path")) for f in v.findings}


def assert_caught(got: Run, pyc: Path, *also: str) -> None:
    """The pyc is stale (and ALSO), not pristine, and the pristine policy FAILs on it."""
    assert drift_ids(got.report, pyc) == {DRIFT_BYTECODE_STALE, *also}
    assert origin_of(got.report, pyc) == (Origin.UNKNOWN, "fakedist")
    verdict, found = judged(got.report)
    assert verdict == Verdict.FAIL
    assert (F.PROVENANCE_NOT_PRISTINE, Severity.ERROR, str(pyc)) in found
    assert (DRIFT_BYTECODE_STALE, Severity.ERROR, None) in found


# negative controls ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [Mode.TIMESTAMP, Mode.CHECKED_HASH, Mode.UNCHECKED_HASH])
def test_honest_pycs_are_shown_compiled_from_their_source_and_pristine(
    tmp_path: Path, mode: Mode
) -> None:
    site = tmp_path / "site"
    core = install(site)
    py_compile.compile(str(core), doraise=True, invalidation_mode=mode)
    got = run(tmp_path, site)
    assert got.result == repr("published")
    for pyc in (pyc_of(core), pyc_of(site / "fakedist" / "__init__.py")):
        [entry] = [f for f in got.report.files or () if f.path == str(pyc)]
        assert entry.at == "load"  # used (a checked-hash pyc too: its source read is a check)
        assert drift_ids(got.report, pyc) == set()  # an unchecked one too: its code was shown
        assert origin_of(got.report, pyc) == ("pristine", "fakedist")
    verdict, found = judged(got.report)
    assert verdict == Verdict.PASS, found


def test_honest_optimized_pyc_under_python_o_is_compared_at_its_level(tmp_path: Path) -> None:
    site = tmp_path / "site"
    core = install(site, GUARDED)
    py_compile.compile(str(core), cfile=str(pyc_of(core, 1)), doraise=True, optimize=1)
    got = run(tmp_path, site, "m.check(-1)", "-O")
    assert got.result == "-1"  # -O strips asserts, as asked for
    assert drift_ids(got.report, pyc_of(core, 1)) == set()
    assert origin_of(got.report, pyc_of(core, 1)) == ("pristine", "fakedist")


@pytest.mark.parametrize("flags", [0, 3], ids=["timestamp", "checked-hash"])
def test_a_pyc_its_loader_rejects_is_recorded_rejected_and_never_judged(
    tmp_path: Path, flags: int
) -> None:
    """Other code whose header does not match the source (another mtime; another hash): the
    loader rejects it and compiles the source, so the probe records the pyc rejected, and it
    is neither drift nor counted (the source ran, pristine)."""
    site = tmp_path / "site"
    core = install(site)
    forged = bytearray(forge(core, EVIL, flags=flags))
    forged[8] ^= 0xFF  # the mtime's low byte, or the hash's first byte
    pyc_of(core).write_bytes(bytes(forged))
    got = run(tmp_path, site)
    assert got.result == repr("published")
    [entry] = [f for f in got.report.files or () if f.path == str(pyc_of(core))]
    assert entry.at == "rejected"
    assert drift_ids(got.report, pyc_of(core)) == set()
    assert origin_of(got.report, core) == ("pristine", "fakedist")
    verdict, found = judged(got.report)
    assert verdict == Verdict.PASS, found


# the attacks ----------------------------------------------------------------------------------


def test_forged_timestamp_pyc_written_after_its_source(tmp_path: Path) -> None:
    """Other code with the source's size and mtime in its header, written after the source:
    its mtime is later than the source's ctime and no later than its own ctime, so no
    timestamp says anything is wrong. Before: no finding, and the pyc counted pristine."""
    site = tmp_path / "site"
    core = install(site)
    pyc_of(core).write_bytes(forge(core, EVIL))
    pyc_st, src_st = pyc_of(core).stat(), core.stat()
    assert src_st.st_ctime_ns <= pyc_st.st_mtime_ns <= pyc_st.st_ctime_ns
    got = run(tmp_path, site)
    assert got.result == repr("evil!!!!!")  # the process runs the forged code
    assert_caught(got, pyc_of(core))


def test_stale_pyc_touched_after_its_source_was_rewritten(tmp_path: Path) -> None:
    """The other ordering: an honest pyc of the evil source, the source then rewritten to the
    published bytes with its mtime put back (so the header still matches), and the pyc
    ``touch``ed afterwards, so it looks written after the rewrite."""
    site = tmp_path / "site"
    core = install(site)
    core.write_text(EVIL)
    py_compile.compile(str(core), doraise=True)
    st = core.stat()
    core.write_text(PUBLISHED)
    os.utime(core, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.utime(pyc_of(core))  # touch
    assert core.stat().st_ctime_ns <= pyc_of(core).stat().st_mtime_ns
    got = run(tmp_path, site)
    assert got.result == repr("evil!!!!!")
    assert_caught(got, pyc_of(core))


def test_checked_hash_pyc_with_the_sources_hash_and_other_code(tmp_path: Path) -> None:
    """PEP 552 flags 3: the loader reads the source and checks the hash in the header, which
    says nothing about the code after it. Before: the probe took the source read for a
    rejection (``at: "rejected"``), so the pyc was not judged, nor even counted."""
    site = tmp_path / "site"
    core = install(site)
    pyc_of(core).write_bytes(forge(core, EVIL, flags=3))
    got = run(tmp_path, site)
    assert got.result == repr("evil!!!!!")
    [entry] = [f for f in got.report.files or () if f.path == str(pyc_of(core))]
    assert entry.at == "load"  # the probe: used, not rejected
    assert_caught(got, pyc_of(core))


def test_unchecked_hash_pyc_with_the_sources_hash_and_other_code(tmp_path: Path) -> None:
    """PEP 552 flags 1, never checked: stale, and unchecked too (what the interpreter skipped
    is what would have caught it)."""
    site = tmp_path / "site"
    core = install(site)
    pyc_of(core).write_bytes(forge(core, EVIL, flags=1))
    got = run(tmp_path, site)
    assert got.result == repr("evil!!!!!")
    assert_caught(got, pyc_of(core), DRIFT_BYTECODE_UNCHECKED)


def test_pyc_compiled_at_another_optimization_level_strips_asserts(tmp_path: Path) -> None:
    """The published source compiled with -O into the plain pyc's name: the same source, but
    its asserts are gone in a process that did not ask for -O."""
    site = tmp_path / "site"
    core = install(site, GUARDED)
    pyc_of(core).write_bytes(forge(core, GUARDED, optimize=1))
    got = run(tmp_path, site, "m.check(-1)")
    assert got.result == "-1"  # without the forgery: AssertionError(refused)
    assert_caught(got, pyc_of(core))


def test_source_touched_after_load_does_not_hide_a_forged_pyc(tmp_path: Path) -> None:
    """Once the forged pyc ran, the process moves its source's mtime: the header no longer
    matches, as if the source changed after load (its bytes did not). Before: not judged."""
    site = tmp_path / "site"
    core = install(site)
    pyc_of(core).write_bytes(forge(core, EVIL))
    touch = "import os\nos.utime(m.__file__, (1, 1))\n"
    got = run(tmp_path, site, after=touch)
    assert got.result == repr("evil!!!!!")
    assert_caught(got, pyc_of(core))


# the forged module covering its own tracks ----------------------------------------------------


SELF_READ = "__loader__.get_data(__spec__.origin)\n" + EVIL
REJECT_LATER = (
    "import os\n"
    "st = os.stat(__spec__.origin)\n"
    "os.utime(__spec__.origin, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))\n"
    "__loader__.get_code(__name__)  # now stale: read, rejected, its source read\n"
    "os.utime(__spec__.origin, ns=(st.st_atime_ns, st.st_mtime_ns))\n"
    + EVIL
)  # fmt: skip


@pytest.mark.parametrize("code", [SELF_READ, REJECT_LATER], ids=["reads-source", "get-code"])
def test_forged_pyc_cannot_have_itself_recorded_as_rejected(tmp_path: Path, code: str) -> None:
    """The probe calls a pyc rejected when its loader reads the source right after it. The
    forged code reads its own source first thing (through its loader, as the loader would), or
    makes itself stale and has its loader's get_code reject it a second time. Before: the
    latest record said "rejected", and a rejected pyc is never judged."""
    site = tmp_path / "site"
    core = install(site)
    pyc_of(core).write_bytes(forge(core, code))
    got = run(tmp_path, site)
    assert got.result == repr("evil!!!!!")
    [entry] = [f for f in got.report.files or () if f.path == str(pyc_of(core))]
    assert entry.at == "load"
    assert_caught(got, pyc_of(core))
