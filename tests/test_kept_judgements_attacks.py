"""Attacks on the kept judgement (servewitness/evidence/judgements.py, agent/judged.py) from
inside the serving container: the workload can write its own files, its site-packages and
(through its probe, which runs in its own interpreter) its journal, and can act between two
runs of the agent, but cannot write the agent's state directory.

Each test drives a real probed interpreter that runs commands it is sent (``Workload``),
collects once with a real agent whose judgement store is on (the judgement is kept), lets the
workload act, then compares a restarted agent (the same state directory: the kept judgement
is offered) with a fresh agent whose store is off. The safe outcome: the restarted agent
reports what the fresh one reports. A test that fails names an unsafe divergence: something
the fresh agent flags that the restarted one does not."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.util
import py_compile
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servewitness.model import (
    DRIFT_MODULE_FILELESS,
    DRIFT_MODULE_SHADOWED,
    Origin,
    ProcessReport,
)
from tests.helpers import install_dist, probe_env, stop, swept, wait_ready
from tests.test_cold_manifest import make_site
from tests.test_kept_judgements import Classified, collect

CMD_TIMEOUT_S = 30.0

# The workload: imports CODE, says it is ready, then runs each command file <n>.py of its
# command directory in turn (exec, in one namespace kept across commands) and answers
# <n>.done, or <n>.err with the traceback.
LOOP = """
import os, sys, time, traceback
ready, cmds = sys.argv[1], sys.argv[2]
open(ready, "w").write("ok")
ns = {"__name__": "workload"}
n = 0
while True:
    path = os.path.join(cmds, f"{n}.py")
    if os.path.exists(path):
        try:
            exec(compile(open(path).read(), path, "exec"), ns)
            open(path + ".done", "w").write("ok")
        except BaseException:
            open(path + ".err", "w").write(traceback.format_exc())
        n += 1
    time.sleep(0.02)
"""


class Workload:
    """A probed interpreter (its pid) that runs the Python code it is sent."""

    def __init__(self, pid: int, cmds: Path, probe: Path) -> None:
        self.pid = pid
        self.cmds = cmds
        self.probe = probe
        self.sent = 0

    def settle(self) -> None:
        """Until a pass of its probe's sweeper that began now has ended (``swept``)."""
        swept(self.probe, self.pid)

    def run(self, code: str) -> None:
        """Run CODE in the workload and wait until it has run (raises with its traceback)."""
        n = self.sent
        self.sent += 1
        tmp = self.cmds / f".{n}.tmp"
        tmp.write_text(code)
        tmp.rename(self.cmds / f"{n}.py")
        deadline = time.monotonic() + CMD_TIMEOUT_S
        done, err = self.cmds / f"{n}.py.done", self.cmds / f"{n}.py.err"
        while not done.exists():
            if err.exists():
                raise AssertionError(f"the workload's command {n} failed:\n{err.read_text()}")
            assert time.monotonic() < deadline, f"the workload never ran command {n}"
            time.sleep(0.02)


@contextlib.contextmanager
def workload(root: Path, code: str, *paths: Path, name: str = "w") -> Iterator[Workload]:
    """A ``Workload`` that first runs CODE with PATHS on PYTHONPATH (no bytecode written), its
    probe files in ROOT/probe-NAME; yielded once CODE has run and the sweeper has recorded."""
    cmds = root / f"cmds-{name}"
    cmds.mkdir()
    ready = root / f"ready-{name}"
    (root / "scratch").mkdir(exist_ok=True)
    probe = root / f"probe-{name}"
    env = probe_env(
        probe,
        VERIFIER_PROBE_EARLY="1",
        PYTHONPATH=":".join(map(str, paths)),
        PYTHONDONTWRITEBYTECODE="1",
        TMPDIR=str(root / "scratch"),
    )
    script = f"{code}\n{LOOP}"
    proc = subprocess.Popen([sys.executable, "-c", script, str(ready), str(cmds)], env=env)
    try:
        wait_ready(proc, ready, 60)
        swept(probe, proc.pid)
        yield Workload(proc.pid, cmds, probe)
    finally:
        stop(proc)


def judged(r: ProcessReport) -> tuple[object, ...]:
    return (r.provenance, r.drift, r.disagreements)


def origin_of(r: ProcessReport, path: Path) -> str:
    assert r.provenance is not None
    return {f.path: f.origin for f in r.provenance.files}.get(str(path), Origin.PRISTINE.value)


def drift_at(r: ProcessReport, path: Path) -> list[str]:
    return sorted(d.id for d in r.drift if d.path == str(path))


def restarted_and_fresh(
    pid: int, state: Path, other: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[ProcessReport, ProcessReport, int]:
    """A restarted agent's report (STATE: the kept judgement is offered), a fresh agent's
    with the store off (OTHER), and how many classifications the restarted one made (0: it
    reused the kept judgement)."""
    classified = Classified(monkeypatch)
    again = collect(pid, state)
    reused = classified.calls
    fresh = collect(pid, other, cache=False)
    return again, fresh, reused


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def patched_native(site: Path) -> tuple[Path, Path]:
    """A distribution in SITE whose native library (``natdist/_lib.so``) holds other bytes
    than its RECORD says (another real extension module's): the library, and the file with
    the published bytes."""
    donor = Path(importlib.util.find_spec("_json").origin or "")  # type: ignore[union-attr]
    other = Path(importlib.util.find_spec("_bisect").origin or "")  # type: ignore[union-attr]
    assert donor.suffix == ".so" and other.suffix == ".so"
    install_dist(
        site, "natdist", {"natdist/__init__.py": b"", "natdist/_lib.so": donor.read_bytes()}
    )
    lib = site / "natdist" / "_lib.so"
    lib.write_bytes(other.read_bytes())  # patched after install
    return lib, donor


# -- attacks -------------------------------------------------------------------------------


def test_a_module_loaded_after_the_first_judgement_is_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: after the agent kept its judgement, import a patched module of a distribution.
    Its (path, sha256) enters the manifest digest: the key differs, the restarted agent
    judges afresh and calls it patched, as an agent without the store does."""
    site = tmp_path / "site"
    install_dist(site, "lated", {"lated/__init__.py": b"", "lated/mod.py": b"A = 1\n"})
    (site / "lated" / "mod.py").write_bytes(b"A = 666  # patched after install\n")
    state = tmp_path / "state"
    with workload(tmp_path, "import lated", site) as w:
        first = collect(w.pid, state)
        assert origin_of(first, site / "lated" / "mod.py") == Origin.PRISTINE  # not loaded yet
        w.run("import lated.mod")
        w.settle()
        again, fresh, reused = restarted_and_fresh(w.pid, state, tmp_path / "o", monkeypatch)
    assert origin_of(fresh, site / "lated" / "mod.py") == Origin.PATCHED
    assert reused == 1  # judged afresh: the manifest changed
    assert judged(again) == judged(fresh)


def test_a_rejected_pyc_run_later_with_the_same_bytes_is_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: ship a pyc compiled from other code, stale against its (pristine) source. The
    import reads it, rejects it and compiles the source: the journal says ``load`` then
    ``rejected`` for the pyc, whose bytecode is then not judged (it did not run). Once the
    agent kept that judgement, the workload sets the source's mtime to the pyc's header and
    reloads the module: the loader reads the same pyc again and runs it (``load`` stands for
    the path again). The manifest digest is over (path, sha256) only, so it is unchanged:
    the static key matches and the kept judgement, made while the pyc had not run, is
    reused. An agent without the store compares that pyc with its source and flags it.

    UNSAFE when this fails: the restarted agent reports no bytecode finding for a pyc of
    other code the process runs. (A running agent shares the blind spot: its static key is
    the same one.)"""
    site = tmp_path / "site"
    good = b"X = 1\n"
    install_dist(site, "pycdist", {"pycdist/__init__.py": b"", "pycdist/mod.py": good})
    source = site / "pycdist" / "mod.py"
    tag = sys.implementation.cache_tag
    pyc = site / "pycdist" / "__pycache__" / f"mod.{tag}.pyc"
    evil = tmp_path / "evil" / "mod.py"
    evil.parent.mkdir()
    evil.write_bytes(b"X = 666  # not the published code\n")
    py_compile.compile(str(evil), cfile=str(pyc), dfile=str(source), doraise=True)
    mtime = 1_000_000_000  # the header names this mtime and the good source's size: stale now
    data = bytearray(pyc.read_bytes())
    data[8:12] = mtime.to_bytes(4, "little")
    data[12:16] = len(good).to_bytes(4, "little")
    pyc.write_bytes(bytes(data))
    state = tmp_path / "state"
    with workload(tmp_path, "import pycdist.mod\nassert pycdist.mod.X == 1", site) as w:
        first = collect(w.pid, state)
        assert not drift_at(first, pyc)  # rejected: it did not run, nothing to judge
        w.run(
            f"import os, importlib, pycdist.mod\nos.utime({str(source)!r}, ({mtime}, {mtime}))\n"
            "importlib.reload(pycdist.mod)\nassert pycdist.mod.X == 666, pycdist.mod.X"
        )
        w.settle()
        again, fresh, reused = restarted_and_fresh(w.pid, state, tmp_path / "o", monkeypatch)
    assert drift_at(fresh, pyc), "control: an agent without the store flags the pyc"
    assert drift_at(again, pyc) == drift_at(fresh, pyc), (reused, again.drift)
    assert judged(again) == judged(fresh)


def test_a_fileless_module_whose_file_is_staged_for_the_first_judgement_is_flagged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: run code as a module that claims a file that does not exist (the probe
    journals it ``fileless``). The agent confirms a fileless module only when it too finds
    no file there, and the key holds only the *count* of fileless records: so the workload
    puts a file at the claimed path while the agent first judges it (nothing to confirm),
    then removes it. An agent without the store finds the path empty and flags the module.

    UNSAFE when this fails: the kept judgement's "nothing there to confirm" outlives the
    file, across the agent's restart."""
    site = tmp_path / "site"
    make_site(site)
    claimed = tmp_path / "ghost" / "ghostmod.py"
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('ghostmod', {str(claimed)!r})\n"
        "mod = importlib.util.module_from_spec(spec)\n"
        "exec('EVIL = 1', vars(mod))\n"
        "sys.modules['ghostmod'] = mod\n"
    )
    state = tmp_path / "state"
    with workload(tmp_path, "import fakedist.core", site) as w:
        w.run(code)
        w.settle()  # the sweeper journals the fileless module
        claimed.parent.mkdir()
        claimed.write_bytes(b"")  # staged for the first judgement
        first = collect(w.pid, state)
        assert DRIFT_MODULE_FILELESS not in drift_at(first, claimed)
        claimed.unlink()
        again, fresh, reused = restarted_and_fresh(w.pid, state, tmp_path / "o", monkeypatch)
    assert drift_at(fresh, claimed) == [DRIFT_MODULE_FILELESS], "control"
    assert drift_at(again, claimed) == drift_at(fresh, claimed), reused
    assert judged(again) == judged(fresh)


def test_a_record_forged_for_the_first_judgement_then_restored_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: the mirror of ``test_kept_judgements.py::test_a_record_rewritten_after_the_
    process_started_is_a_finding``. The workload rewrites the RECORD row of the patched file
    it loaded so the file looks published *while the agent first judges it* (the workload can
    tell when: inotify on its own RECORD), then puts the genuine RECORD back. The kept
    judgement says pristine; an agent without the store parses the genuine RECORD and says
    patched.

    UNSAFE when this fails: a transient forgery made once is kept across restarts (a running
    agent keeps it too; without the store a restart would have shown the patch)."""
    site = tmp_path / "site"
    make_site(site)
    core = site / "fakedist" / "core.py"
    record = site / "fakedist-1.0.dist-info" / "RECORD"
    genuine = record.read_text()
    forged = "".join(
        f"fakedist/core.py,sha256={_b64(core.read_bytes())},{core.stat().st_size}\n"
        if row.startswith("fakedist/core.py,")
        else row + "\n"
        for row in genuine.splitlines()
    )
    state = tmp_path / "state"
    with workload(tmp_path, "import fakedist.core", site) as w:
        record.write_text(forged)
        first = collect(w.pid, state)
        assert origin_of(first, core) == Origin.PRISTINE  # the forgery fools a first look
        record.write_text(genuine)
        again, fresh, reused = restarted_and_fresh(w.pid, state, tmp_path / "o", monkeypatch)
    assert origin_of(fresh, core) == Origin.PATCHED, "control"
    assert origin_of(again, core) == origin_of(fresh, core), reused


def test_a_distribution_hidden_for_the_first_judgement_then_restored_shows_the_shadowing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a module loaded from a directory first on the path shadows the copy a
    distribution installs in site-packages (``provenance.module.shadowed``). The workload
    renames that distribution's ``.dist-info`` away while the agent first judges (no
    claimant: nothing shadowed), then back. An agent without the store sees the claimant and
    flags the shadowing.

    UNSAFE when this fails: a shadowing hidden once stays hidden across restarts."""
    site = tmp_path / "site"
    install_dist(site, "victim", {"victim.py": b"V = 1\n", "other_victim.py": b"W = 1\n"})
    front = tmp_path / "front"
    front.mkdir()
    shadow = front / "victim.py"
    shadow.write_bytes(b"V = 666  # shadows site's victim\n")
    info = site / "victim-1.0.dist-info"
    away = tmp_path / "away"
    state = tmp_path / "state"
    with workload(tmp_path, "import victim, other_victim", front, site) as w:
        control = collect(w.pid, tmp_path / "c", cache=False)
        assert drift_at(control, shadow) == [DRIFT_MODULE_SHADOWED], "control: it shadows"
        shutil.move(str(info), str(away))
        first = collect(w.pid, state)
        assert DRIFT_MODULE_SHADOWED not in drift_at(first, shadow)
        shutil.move(str(away), str(info))
        again, fresh, reused = restarted_and_fresh(w.pid, state, tmp_path / "o", monkeypatch)
    assert drift_at(fresh, shadow) == [DRIFT_MODULE_SHADOWED], "control"
    assert drift_at(again, shadow) == drift_at(fresh, shadow), reused


def test_a_library_mapped_after_the_first_judgement_is_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: after the judgement was kept, ``dlopen`` (ctypes) a native library of a
    distribution whose bytes are not its RECORD's. No file record enters the manifest (no
    import): only the native mappings' digest changes, so the key differs and the restarted
    agent judges the mapped library afresh, as an agent without the store does."""
    site = tmp_path / "site"
    lib, _ = patched_native(site)
    state = tmp_path / "state"
    with workload(tmp_path, "import natdist", site) as w:
        first = collect(w.pid, state)
        assert origin_of(first, lib) == Origin.PRISTINE  # not mapped yet
        w.run(f"import ctypes\nLIB = ctypes.CDLL({str(lib)!r})")
        w.settle()  # ctypes' own modules journaled: both agents see one manifest
        again, fresh, reused = restarted_and_fresh(w.pid, state, tmp_path / "o", monkeypatch)
    assert origin_of(fresh, lib) == Origin.PATCHED, "control"
    assert reused == 1
    assert judged(again) == judged(fresh)


def test_a_mapped_library_swapped_on_disk_between_runs_is_judged_as_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a patched native library is mapped; the workload renames the published bytes
    over its path while the agent is down (or before it first looks). The mapped inode is
    what is hashed and keyed, so nothing is laundered: both agents judge the mapped bytes."""
    site = tmp_path / "site"
    lib, donor = patched_native(site)
    state = tmp_path / "state"
    code = f"import natdist, ctypes\nLIB = ctypes.CDLL({str(lib)!r})"
    with workload(tmp_path, code, site) as w:
        first = collect(w.pid, state)
        assert origin_of(first, lib) == Origin.PATCHED
        swap = lib.with_name(".swap")
        swap.write_bytes(donor.read_bytes())
        swap.rename(lib)  # the published bytes at the path; the mapping keeps the old inode
        again, fresh, reused = restarted_and_fresh(w.pid, state, tmp_path / "o", monkeypatch)
    assert origin_of(fresh, lib) == Origin.PATCHED, "control"
    assert origin_of(again, lib) == Origin.PATCHED, reused
    assert judged(again) == judged(fresh)


def test_a_process_that_execs_another_program_under_its_pid_is_judged_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack (pid reuse without a new pid): ``execve`` keeps the pid and the start ticks,
    the store's whole process key. The workload, judged clean, execs a new interpreter that
    imports a patched module. The new image's manifest differs, so the kept judgement's key
    does not match and the patched module is found, as an agent without the store finds it."""
    site = tmp_path / "site"
    make_site(site)
    install_dist(site, "lated", {"lated/__init__.py": b"", "lated/mod.py": b"A = 1\n"})
    patched = site / "lated" / "mod.py"
    patched.write_bytes(b"A = 666  # patched after install\n")
    ready = tmp_path / "ready-exec"
    image = (
        "import fakedist.core, lated.mod, sys, time\n"
        "open(sys.argv[1], 'w').write('ok')\ntime.sleep(600)\n"
    )
    state = tmp_path / "state"
    with workload(tmp_path, "import fakedist.core", site) as w:
        first = collect(w.pid, state)
        assert origin_of(first, patched) == Origin.PRISTINE  # not loaded
        w.cmds.joinpath("0.py").write_text(
            f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', {image!r}, "
            f"{str(ready)!r}])\n"
        )
        deadline = time.monotonic() + CMD_TIMEOUT_S
        while not ready.exists():
            assert time.monotonic() < deadline, "the exec'd image never got ready"
            time.sleep(0.05)
        w.settle()
        again, fresh, reused = restarted_and_fresh(w.pid, state, tmp_path / "o", monkeypatch)
    assert origin_of(fresh, patched) == Origin.PATCHED, "control"
    assert origin_of(again, patched) == Origin.PATCHED, reused
    assert judged(again) == judged(fresh)


def test_a_file_read_under_another_module_name_then_imported_shows_the_shadowing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: the manifest digest is over (path, sha256) only; a record's module name (what
    shadowing is judged by) is not in it. Before the agent first looks, the workload reads
    its shadowing file through a loader named ``harmless`` (journaled ``load``, module
    ``harmless``: shadows nothing). After the judgement is kept it imports the file as
    ``victim``, which a distribution installs in site-packages: the same path and bytes, so
    the same digest, and the kept "nothing shadowed" is reused. An agent without the store
    reads the latest record (module ``victim``) and flags the shadowing.

    UNSAFE when this fails (a running agent shares it: the same static key)."""
    site = tmp_path / "site"
    install_dist(site, "victim", {"victim.py": b"V = 1\n"})
    front = tmp_path / "front"
    front.mkdir()
    shadow = front / "victim.py"
    shadow.write_bytes(b"V = 666  # shadows site's victim\n")
    pre = (
        "from importlib.machinery import SourceFileLoader\n"
        f"SourceFileLoader('harmless', {str(shadow)!r}).get_data({str(shadow)!r})\n"
    )
    state = tmp_path / "state"
    with workload(tmp_path, pre, front, site) as w:
        first = collect(w.pid, state)
        assert DRIFT_MODULE_SHADOWED not in drift_at(first, shadow)
        w.run("import victim\nassert victim.V == 666")
        w.settle()
        again, fresh, reused = restarted_and_fresh(w.pid, state, tmp_path / "o", monkeypatch)
    assert drift_at(fresh, shadow) == [DRIFT_MODULE_SHADOWED], "control"
    assert drift_at(again, shadow) == drift_at(fresh, shadow), reused
