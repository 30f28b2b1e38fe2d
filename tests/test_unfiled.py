"""Code that does not come from a plain file, against real probed processes judged from
outside by ``verifier inspect`` (the agent's code path) and by the default policy: the main
script (both orders of the race with the sweeper), ``-c`` code, standard input and the
interactive prompt with ``PYTHONSTARTUP``, modules imported from a zip, modules executed by
custom loaders or exec'd into a hand-made module. Each attack is built for real; each has its
negative control. ``.pth`` files: ``tests/test_pth.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servewitness import wire
from servewitness.model import (
    DRIFT_CHANGED_AFTER_START,
    DRIFT_MODIFIED_AFTER_LOAD,
    DRIFT_MODULE_CUSTOM_LOADER,
    DRIFT_MODULE_FILELESS,
    DRIFT_MODULE_SHADOWED,
    DRIFT_MODULE_UNFILED,
    FileEntry,
    ProcessReport,
    Severity,
)
from servewitness.policy import TargetSnapshot, load_policy
from tests.helpers import inspect_json, probe_env, wait_ready, weak_policy

# A policy with nothing but a rule that cannot fail: what every policy judges (drift, the
# cross-check) is what is left.
# A forbid-only policy: these tests are about drift findings, not liveness or pinned vLLM.
DEFAULT = weak_policy('version = 1\n[[forbid]]\nmodule = "no_such_module_anywhere"\n')
READY = "open(os.environ['READY_FILE'], 'w').write('ready')\n"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@dataclasses.dataclass
class Judged:
    report: ProcessReport
    raw: dict[str, Any]

    def files(self, **match: Any) -> list[FileEntry]:
        return [
            f for f in self.report.files or () if all(getattr(f, k) == v for k, v in match.items())
        ]

    def drift(self, fid: str) -> dict[str | None, str]:
        """module -> path of each drift with id FID."""
        return {d.module: d.path for d in self.report.drift if d.id == fid}

    def drift_paths(self, fid: str) -> set[str]:
        return {d.path for d in self.report.drift if d.id == fid}

    def findings(self) -> dict[str, Severity]:
        report = dataclasses.replace(self.report, role="api_server")
        snap = TargetSnapshot("t", (report,), time.time())
        verdict = load_policy(DEFAULT).evaluate_target(snap, now=snap.received_unix)
        return {f.id: f.severity for f in verdict.findings}


def run_probed(
    tmp: Path,
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    early: bool = True,
    wait: float = 2.5,
) -> Judged:
    """Start ARGV (a Python command line) with the probe, wait until it wrote READY_FILE and
    the sweeper had time to pass, judge it with ``verifier inspect``, then end it."""
    ready = tmp / "ready"
    extra = {"READY_FILE": str(ready), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    if early:
        extra["VERIFIER_PROBE_EARLY"] = "1"
    proc = subprocess.Popen(
        argv,
        env=probe_env(tmp / "probe", **extra),
        cwd=tmp,
        stdin=subprocess.PIPE if stdin is not None else None,
        stderr=subprocess.PIPE,
    )
    try:
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin)
            proc.stdin.close()
        wait_ready(proc, ready, 60)
        time.sleep(wait)
        [raw] = inspect_json(proc.pid)
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    return Judged(wire.process_from_json(raw["report"]), raw)


# -- the main script -----------------------------------------------------------------------

SLEEPER = "import os, time\n" + READY + "time.sleep(600)\n"


def test_main_script_is_recorded_when_the_sweeper_looks_before_it_runs(tmp_path: Path) -> None:
    """The race, made deterministic: the probe starts (from sitecustomize, before the
    interpreter reads the script), its sweeper makes a whole pass while ``__main__`` has no
    ``__file__`` yet, and only then does the script run. Before the fix the sweeper marked
    ``__main__`` done on that pass and the script was never recorded."""
    site = _write(
        tmp_path / "site" / "sitecustomize.py",
        """\
        import threading
        from servewitness_probe import _imports
        import servewitness_probe
        passed = threading.Event()
        sweep_modules = _imports._sweep_modules
        def traced(st):
            sweep_modules(st)
            passed.set()
        _imports._sweep_modules = traced
        servewitness_probe.start("early")
        assert passed.wait(30), "the sweeper never passed"
        import __main__
        assert not hasattr(__main__, "__file__")  # the script has not started
        """,
    )
    script = _write(tmp_path / "bench.py", SLEEPER)
    pythonpath = f"{site.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    got = run_probed(tmp_path, [sys.executable, str(script)], env={"PYTHONPATH": pythonpath},
                     early=False)  # fmt: skip
    [main] = got.files(module="__main__")
    assert (main.path, main.kind, main.at) == (str(script), "source", "load")
    assert main.sha256 == _sha(script.read_bytes())
    assert got.report.disagreements == () and got.report.drift == ()


def test_main_script_is_recorded_once_when_the_probe_starts_after_it_runs(tmp_path: Path) -> None:
    """The other order: the script is running (``__file__`` set) when the probe starts: one
    record of the script (``snapshot``), not one from the start and another from the sweeper."""
    script = _write(
        tmp_path / "drive.py", "import servewitness_probe\nservewitness_probe.start()\n" + SLEEPER
    )
    got = run_probed(tmp_path, [sys.executable, str(script)], early=False)
    mains = got.files(module="__main__")
    assert [(f.path, f.kind, f.at) for f in mains] == [(str(script), "source", "snapshot")]
    assert mains[0].sha256 == _sha(script.read_bytes())
    assert got.report.drift == ()


DRIVER = (
    """\
import os, sys, time
# an offline driver: builds its engine, runs its prompts, reports its numbers
PROMPTS = ["a", "b"]
{rewrite}
import servewitness_probe
servewitness_probe.start()
"""
    + READY
    + "time.sleep(600)\n"
)


def test_offline_driver_script_is_pinned_by_its_hash(tmp_path: Path) -> None:
    """An offline ``vllm.LLM``-style driver (``python bench.py``) is in the manifest with its
    hash, so a policy can pin it: the right hash passes, another fails."""
    script = _write(tmp_path / "bench.py", DRIVER.format(rewrite=""))
    got = run_probed(tmp_path, [sys.executable, str(script)], early=False)
    sha = _sha(script.read_bytes())
    assert [f.sha256 for f in got.files(path=str(script))] == [sha]
    for pinned, ok in ((sha, True), ("0" * 64, False)):
        policy = weak_policy(f'version = 1\n[[files]]\npath = "bench.py"\nsha256 = "{pinned}"\n')
        report = dataclasses.replace(got.report, role="api_server")
        snap = TargetSnapshot("t", (report,), time.time())
        ids = {f.id for f in load_policy(policy).evaluate_target(snap, now=time.time()).findings}
        assert ("provenance.file.hash_mismatch" not in ids) is ok, ids


def test_driver_that_rewrites_itself_before_the_probe_looks_is_caught(tmp_path: Path) -> None:
    """The attack on a probe that starts late (the vLLM plugin): the script, once running,
    rewrites its own file to something innocent before the probe hashes it. The hashes then
    agree with the disk, but the file changed after the process started, and the interpreter
    had read it before: what ran is not what was recorded. (The agent reads the start to a
    clock tick; a rewrite within a few tens of ms of the start is not told apart from one just
    before it: the early probe, which hashes the script before it runs, closes that.)"""
    rewrite = (
        "time.sleep(0.5)\n"
        "data = open(__file__).read()\n"
        "open(__file__, 'w').write(data.replace('# an offline driver', '# innocent driver!'))"
    )
    script = _write(tmp_path / "bench.py", DRIVER.format(rewrite=rewrite))
    time.sleep(1.1)  # the script's ctime well before the process start
    got = run_probed(tmp_path, [sys.executable, str(script)], early=False)
    assert got.drift(DRIFT_CHANGED_AFTER_START) == {"__main__": str(script)}
    assert got.findings()[DRIFT_CHANGED_AFTER_START] == Severity.ERROR


# -- -c, standard input, the interactive prompt ------------------------------------------

COMMAND = "import os, sys, time\n" + READY + "time.sleep(600)\n"


def test_command_code_is_hashed_and_checked_against_the_command_line(tmp_path: Path) -> None:
    got = run_probed(tmp_path, [sys.executable, "-c", COMMAND, "arg"])
    [inline] = got.files(kind="inline")
    assert (inline.path, inline.module, inline.at) == ("-c", "__main__", "load")
    assert inline.sha256 == _sha(COMMAND.encode())
    assert got.report.disagreements == () and got.report.drift == ()


def test_command_code_that_lies_about_itself_is_a_disagreement(tmp_path: Path) -> None:
    """A workload that makes the probe hash other code than it runs (it edits
    ``sys.orig_argv`` before starting the probe): the agent's read of ``/proc/<pid>/cmdline``
    disagrees."""
    code = (
        "import os, sys, time\n"
        "sys.orig_argv[sys.orig_argv.index('-c') + 1] = 'print(\"innocent\")'\n"
        "import servewitness_probe\nservewitness_probe.start()\n" + READY + "time.sleep(600)\n"
    )
    got = run_probed(tmp_path, [sys.executable, "-c", code], early=False)
    [d] = got.report.disagreements
    assert (d.path, d.sha256_in_process, d.sha256_agent) == (
        "-c",
        _sha(b'print("innocent")'),
        _sha(code.encode()),
    )
    assert "cmdline" in d.reason


def test_code_from_standard_input_is_unfiled(tmp_path: Path) -> None:
    """``python -`` runs what it reads from standard input: nothing keeps or hashes it. The
    same code from a file is the control."""
    got = run_probed(tmp_path, [sys.executable, "-"], stdin=SLEEPER.encode())
    assert got.drift(DRIFT_MODULE_UNFILED) == {"__main__": "<stdin>"}
    assert got.findings()[DRIFT_MODULE_UNFILED] == Severity.ERROR
    control = tmp_path / "control"
    control.mkdir()
    script = _write(control / "same.py", SLEEPER)
    assert run_probed(control, [sys.executable, str(script)]).report.drift == ()


def test_interactive_prompt_is_unfiled_and_pythonstartup_is_hashed(tmp_path: Path) -> None:
    """At a prompt (a terminal on standard input), typed code runs unhashed; PYTHONSTARTUP,
    which runs only there, is hashed as a file."""
    startup = _write(tmp_path / "startup.py", "STARTED = True\n")
    ready = tmp_path / "ready"
    env = probe_env(
        tmp_path / "probe",
        VERIFIER_PROBE_EARLY="1",
        PYTHONSTARTUP=str(startup),
        READY_FILE=str(ready),
    )
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-q"], env=env, cwd=tmp_path, stdin=follower, stdout=follower,
        stderr=follower,
    )  # fmt: skip
    os.close(follower)
    try:
        os.write(leader, b"import os, time\n" + READY.encode() + b"time.sleep(600)\n")
        deadline = time.monotonic() + 60
        while not ready.exists():  # the prompt echoes: keep the terminal drained
            assert time.monotonic() < deadline and proc.poll() is None
            if select.select([leader], [], [], 0.1)[0]:
                os.read(leader, 4096)
        time.sleep(2.5)
        [raw] = inspect_json(proc.pid)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        os.close(leader)
    got = Judged(wire.process_from_json(raw["report"]), raw)
    assert got.drift(DRIFT_MODULE_UNFILED) == {"__main__": "<interactive>"}
    [f] = got.files(path=str(startup))
    assert f.sha256 == _sha(startup.read_bytes())


# -- zip archives ------------------------------------------------------------------------------


def _zip(path: Path, members: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in members.items():
            z.writestr(name, text)
    return path


ZOO = (
    """\
import importlib.abc, importlib.machinery, importlib.util, os, sys, time, types
sys.path.insert(0, os.environ["ZIP"])
import zmod, zpkg.sub          # members of a zip
import jmespath                # ... one shadowing an installed distribution

class StringFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    # serves modules from strings
    SOURCES = {"evil": "SECRET = 42\\n", "evil_gone": "GONE = 1\\n"}
    def find_spec(self, name, path, target=None):
        if name in self.SOURCES:
            return importlib.util.spec_from_loader(name, self)
    def exec_module(self, module):
        exec(self.SOURCES[module.__name__], module.__dict__)
    def get_source(self, name):
        return self.SOURCES[name]

sys.meta_path.insert(0, StringFinder())
import evil
import evil_gone
del sys.modules["evil_gone"]   # gone before any sweep

class Injecting(importlib.machinery.SourceFileLoader):
    # reads a real file, runs something else
    def source_to_code(self, data, path, *, _optimize=-1):
        return compile(data + b"\\nINJECTED = True\\n", path, "exec")

class Plain(importlib.machinery.SourceFileLoader):
    # a subclass that leaves reading and compiling to its base: the control
    pass

def load(name, loader_cls):
    path = os.path.join(os.environ["PLAIN_DIR"], name + ".py")
    spec = importlib.util.spec_from_file_location(name, path, loader=loader_cls(name, path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)

load("injected", Injecting)
load("plainly", Plain)

handmade = types.ModuleType("handmade")
exec("def answer():\\n    return 42\\n", handmade.__dict__)
sys.modules["handmade"] = handmade

disguised = types.ModuleType("disguised")   # claims a real file, runs a string
disguised.__file__ = os.path.join(os.environ["PLAIN_DIR"], "plainly.py")
exec("def answer():\\n    return 43\\n", disguised.__dict__)
sys.modules["disguised"] = disguised

liar = types.ModuleType("liar")
liar.__file__ = os.environ["ZIP"].replace("lib.zip", "notzip.txt") + "/liar.py"
sys.modules["liar"] = liar

import distutils  # setuptools' shim: a custom loader of a pristine file, returning its copy
"""
    + READY
    + "time.sleep(600)\n"
)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Judged]:
    tmp = tmp_path_factory.mktemp("zoo")
    archive = _zip(
        tmp / "lib.zip",
        {
            "zmod.py": "VALUE = 'from the zip'\n",
            "zpkg/__init__.py": "",
            "zpkg/sub.py": "from . import __name__ as parent\n",
            "jmespath.py": "SHADOW = True\n",
        },
    )
    (tmp / "notzip.txt").write_text("not a zip\n")
    plain = tmp / "plain"
    _write(plain / "injected.py", "VALUE = 1\n")
    _write(plain / "plainly.py", "VALUE = 2\n")
    script = _write(tmp / "zoo.py", ZOO)
    yield run_probed(
        tmp, [sys.executable, str(script)], env={"ZIP": str(archive), "PLAIN_DIR": str(plain)}
    )


def test_zip_members_and_their_archive_are_hashed_and_verified(zoo: Judged) -> None:
    [archive] = zoo.files(kind="archive")
    members = {
        Path(f.path).relative_to(archive.path).as_posix(): f for f in zoo.files(kind="member")
    }
    assert {"zmod.py", "zpkg/__init__.py", "zpkg/sub.py", "jmespath.py"} <= members.keys()
    with zipfile.ZipFile(archive.path) as z:
        for name, f in members.items():
            assert f.sha256 == _sha(z.read(name)), name
    assert members["zpkg/sub.py"].module == "zpkg.sub"
    assert archive.sha256 == _sha(Path(archive.path).read_bytes())
    assert zoo.report.disagreements == ()  # the agent read each member from the archive


def test_a_zip_shadowing_a_distribution_is_caught_by_the_shadowing_check(zoo: Judged) -> None:
    shadowed = zoo.drift(DRIFT_MODULE_SHADOWED)
    assert shadowed == {"jmespath": str(Path(zoo.files(kind="archive")[0].path) / "jmespath.py")}


def test_modules_from_custom_loaders_are_unfiled(zoo: Judged) -> None:
    unfiled = zoo.drift(DRIFT_MODULE_UNFILED)
    script = next(f.path for f in zoo.files(module="__main__"))
    # a finder serving strings (also one whose module left sys.modules at once), a file
    # loader subclass that compiles other code than it read, source exec'd into a module
    # (also one whose __file__ names a real file)
    assert unfiled == {
        "evil": script,
        "evil_gone": script,
        "injected": script,
        "handmade": "<string>",
        "disguised": "<string>",
    }
    evil = next(d for d in zoo.report.drift if d.module == "evil")
    assert _sha(b"SECRET = 42\n") in evil.detail
    assert zoo.findings()[DRIFT_MODULE_UNFILED] == Severity.ERROR


def test_a_pristine_loader_and_a_plain_loader_subclass_are_not_unfiled(zoo: Judged) -> None:
    """The controls: setuptools' distutils shim (a loader class its pristine file defines) is
    a warning only; a file loader subclass that overrides nothing on the code path, nothing."""
    shim = zoo.drift(DRIFT_MODULE_CUSTOM_LOADER)
    assert shim.keys() == {"distutils", "setuptools._distutils"} or shim.keys() == {"distutils"}
    assert all(p.endswith("_distutils_hack/__init__.py") for p in shim.values())
    assert zoo.findings()[DRIFT_MODULE_CUSTOM_LOADER] == Severity.WARNING
    assert "plainly" not in zoo.drift(DRIFT_MODULE_UNFILED)
    assert {d.module for d in zoo.report.drift if d.module == "plainly"} == set()


def test_a_module_claiming_a_path_inside_a_file_that_is_no_zip_is_fileless(zoo: Judged) -> None:
    assert list(zoo.drift(DRIFT_MODULE_FILELESS)) == ["liar"]


def test_the_zoo_fails_the_default_policy_only_on_its_attacks(zoo: Judged) -> None:
    errors = {i for i, s in zoo.findings().items() if s == Severity.ERROR}
    assert errors == {DRIFT_MODULE_UNFILED, DRIFT_MODULE_SHADOWED, DRIFT_MODULE_FILELESS}


LATE_ZIP = (
    """\
import os, sys, time, zipfile
sys.path.insert(0, os.environ["ZIP"])
import zmod                      # before the probe
import servewitness_probe
servewitness_probe.start()
time.sleep(2)                    # the sweeper reads zmod from the archive
import zlate                     # after: read at load
with zipfile.ZipFile(os.environ["ZIP"] + ".new", "w") as z:   # then the archive is replaced
    z.writestr("zmod.py", "VALUE = 'replaced'\\n")
    z.writestr("zlate.py", "VALUE = 'replaced too'\\n")
os.replace(os.environ["ZIP"] + ".new", os.environ["ZIP"])
"""
    + READY
    + "time.sleep(600)\n"
)


def test_zip_imported_before_the_probe_and_replaced_after(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "lib.zip", {"zmod.py": "VALUE = 1\n", "zlate.py": "VALUE = 2\n"})
    before = {n: _sha(zipfile.ZipFile(archive).read(n)) for n in ("zmod.py", "zlate.py")}
    script = _write(tmp_path / "late.py", LATE_ZIP)
    got = run_probed(tmp_path, [sys.executable, str(script)], env={"ZIP": str(archive)},
                     early=False)  # fmt: skip
    members = {Path(f.path).name: f for f in got.files(kind="member")}
    assert (members["zmod.py"].at, members["zlate.py"].at) == ("snapshot", "load")
    assert {n: f.sha256 for n, f in members.items()} == before
    # the replaced archive: a new file (new inode, ctime after the reads), other members
    moved = got.drift(DRIFT_MODIFIED_AFTER_LOAD)
    assert moved.get("zmod") == members["zmod.py"].path
    assert moved.get("zlate") == members["zlate.py"].path
    assert got.findings()[DRIFT_MODIFIED_AFTER_LOAD] == Severity.ERROR


# -- the control of all of the above: an honest vLLM server ----------------------------------

# What an honest vLLM process runs through custom loaders (warnings, never errors): torch makes
# a module from a template in its own pristine file, setuptools' distutils shim returns its copy.
# torch's _StringLoader, setuptools' distutils shim, and vLLM's env_override, which sets its
# own exec_module on torch._inductor.pattern_matcher's SourceFileLoader instance (a pristine
# vllm file defines it: provenance.module.custom_loader, a WARNING)
HONEST_CUSTOM_LOADERS = {
    "_remote_module_non_scriptable",
    "distutils",
    "setuptools._distutils",
    "torch._inductor.pattern_matcher",
}
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "policies"


@pytest.mark.vllm
def test_an_honest_vllm_server_passes_with_nothing_new(vllm_server: Any) -> None:
    """The real server (API server, engine core, worker; the plugin starts the probe late):
    its ``.pth`` files are recorded and claimed, its main module is recorded, no module is
    unfiled, the custom loaders are torch's and setuptools' (warnings), and the example
    policies judge it as before: the live hook PASSes, the dead one FAILs for its own reason
    only."""
    for i in range(2):
        vllm_server.complete(f"an honest request {i}", max_tokens=4)
    procs = inspect_json(vllm_server.pid, tree=True)
    reports = tuple(wire.process_from_json(p["report"]) for p in procs)
    probed = [r for r in reports if r.probe_present]
    assert {r.role for r in probed} == {"api_server", "engine_core", "worker"}
    for r in probed:
        loaders = {d.module for d in r.drift if d.id == DRIFT_MODULE_CUSTOM_LOADER}
        assert loaders <= HONEST_CUSTOM_LOADERS, (r.role, loaders)
        assert [d for d in r.drift if d.id != DRIFT_MODULE_CUSTOM_LOADER] == [], r.role
        assert r.disagreements == (), r.role
        files = r.files or ()
        assert any(
            f.kind == "pth" and f.path.endswith("/servewitness_probe_early.pth") for f in files
        )
        assert any(f.module == "__main__" for f in files), r.role
    snap = TargetSnapshot("serving", reports, time.time())
    verdicts = {
        name: load_policy((EXAMPLES / name).read_text()).evaluate_target(snap, now=time.time())
        for name in ("cpu-live-hook.toml", "cpu-dead-hook.toml")
    }
    live, dead = verdicts["cpu-live-hook.toml"], verdicts["cpu-dead-hook.toml"]
    assert live.verdict.value == "PASS", [(f.id, f.message) for f in live.findings]
    errors = {f.id for f in dead.findings if f.severity == Severity.ERROR}
    assert errors == {"liveness.hook.not_instantiated"}, errors
    warned = {f.id for f in live.findings if f.severity == Severity.WARNING}
    assert warned <= {DRIFT_MODULE_CUSTOM_LOADER, "evidence.probe_errors"}, warned
