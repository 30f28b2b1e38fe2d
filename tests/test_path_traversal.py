"""A path the probed process reports is read through ``/proc/<pid>/root``: a hostile one
(``..`` above the root, a NUL byte, a lone surrogate from a JSON escape) must neither climb out
of that root nor crash the agent's judgement.

A real temporary directory stands in for ``/proc``: ``<tmp>/proc/42/root`` is the process's
root, and a secret lies outside it, in ``<tmp>/proc/etc/shadow`` and ``<tmp>/etc/shadow``.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from servewitness.evidence import judge
from servewitness.evidence.hashing import Hasher
from servewitness.evidence.procfs import ProcFS
from servewitness.model import FileEntry

SECRET = b"root:$6$secret:19000:0:99999:7:::\n"
SECRET_SHA = hashlib.sha256(SECRET).hexdigest()
INSIDE = b"import os\n"
PID = 42
LATER = time.time() + 1e6  # a process start after every file here: none changed since

HOSTILE = [
    "/../../etc/shadow",
    "../../../etc/shadow",
    "/usr/../../../../etc/shadow",
    "/usr/lib/../../../../../etc/shadow",
    "//..//..//etc//shadow",
    "/./../etc/shadow",
]
INVALID = [
    "/usr/lib/\0/etc/shadow",
    "/etc/shadow\0",
    "/usr/lib/\udcff\udcfe.py",  # non-UTF-8 bytes, as os.fsdecode gives them
    "/usr/lib/\ud800.py",  # a lone surrogate: json.loads('"\\ud800"') gives one
]


@pytest.fixture
def procfs(tmp_path: Path) -> ProcFS:
    proc = tmp_path / "proc"
    root = proc / str(PID) / "root"
    (root / "etc").mkdir(parents=True)
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "etc" / "shadow").write_bytes(INSIDE)
    (proc / "etc").mkdir()
    (proc / "etc" / "shadow").write_bytes(SECRET)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "shadow").write_bytes(SECRET)
    (proc / str(PID) / "environ").write_bytes(b"HOME=/root\0")
    return ProcFS(proc)


@pytest.mark.parametrize("path", HOSTILE)
def test_dot_dot_stays_inside_the_process_root(procfs: ProcFS, path: str) -> None:
    """As for the process itself, ".." at its root is its root: /etc/shadow *inside*."""
    host = procfs.in_root(PID, path)
    root = (procfs.root / str(PID) / "root").resolve()
    assert host.resolve().is_relative_to(root)
    assert host.read_bytes() == INSIDE


@pytest.mark.parametrize("path", HOSTILE)
def test_the_cross_check_never_hashes_a_file_outside(procfs: ProcFS, path: str) -> None:
    files = (FileEntry(path, SECRET_SHA, len(SECRET), "source", "m", "load"),)
    disagreements, drift = judge.cross_check(procfs, PID, files, Hasher(), start_time=LATER)
    # the probe claimed the secret's hash; the agent sees the file inside the root instead
    assert [d.sha256_agent for d in disagreements] == [hashlib.sha256(INSIDE).hexdigest()]
    assert not drift


@pytest.mark.parametrize("path", INVALID)
def test_invalid_names_are_a_disagreement_not_a_crash(procfs: ProcFS, path: str) -> None:
    files = (FileEntry(path, SECRET_SHA, 1, "source", "m", "load"),)
    disagreements, drift = judge.cross_check(procfs, PID, files, Hasher(), start_time=LATER)
    assert len(disagreements) == 1 and disagreements[0].sha256_agent is None
    assert not drift


@pytest.mark.parametrize("path", HOSTILE + INVALID)
def test_the_whole_judgement_survives_hostile_names(procfs: ProcFS, path: str) -> None:
    """Origins (RECORD lookups), bytecode and fileless checks too, with the path as a source,
    a pyc, a sys.path entry and a fileless module's claim."""
    from servewitness.evidence.probe_reader import ProbeState
    from servewitness.model import StepEvidence

    pyc = path.rstrip("\0") + "/__pycache__/x.cpython-311.pyc"
    files = (
        FileEntry(path, SECRET_SHA, 1, "source", "m", "load"),
        FileEntry(pyc, SECRET_SHA, 1, "bytecode", "m", "load"),
    )
    probe = ProbeState(
        directory="/x", pid=PID, start_ticks=1, mode="", shared=False, roles=[], runner=None,
        steps=StepEvidence(0, 0, 0, 0, 0, 0, 0), hooks=(), files=(), errors=[], error_count=0,
        manifest_digest="", interp={"stdlib": path, "path": [path, "/usr/lib"]},
        fileless=(("m", path),),
    )  # fmt: skip
    got = judge.judge(procfs, PID, probe, files, Hasher(), start_time=LATER)
    assert SECRET_SHA not in {d.sha256_agent for d in got.disagreements}


def test_hasher_reports_invalid_paths() -> None:
    for path in INVALID:
        h = Hasher().hash_files([path])[0]
        assert h.sha256 is None and h.error
