"""The agent's cold manifest, made faster, judges exactly as before.

* It parses each site's RECORDs once for all the processes that see the same files
  (``distindex.Sites``), and judges every process as a fresh index of its own does: the same
  provenance classes (a file patched against its RECORD, a file no RECORD lists), the same
  drift (a malformed RECORD), the same disagreements. Two real probed interpreters importing
  a fake distribution and a real installed one (structlog).
* It compiles the sources of loaded pycs on every core (``compilers``): the same drifts and
  the same pycs shown compiled from their source as compiling each here, one by one."""

from __future__ import annotations

import contextlib
import posixpath
import sys
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pytest

from servewitness._cli._local import read_local
from servewitness.evidence import compilers, pycfile
from servewitness.evidence.bytecode import judge_bytecode
from servewitness.evidence.distindex import DistIndex, Sites
from servewitness.evidence.hashing import Hasher
from servewitness.evidence.judge import dist_index, view_of
from servewitness.evidence.process import read_process
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.pycfile import CompileCache
from servewitness.evidence.report import report_with_judgement, to_report
from servewitness.model import (
    DRIFT_BYTECODE_STALE,
    DRIFT_BYTECODE_UNCHECKED,
    DRIFT_RECORD_UNREADABLE,
    FileEntry,
    Origin,
    ProcessReport,
)
from tests import test_bytecode as tb
from tests.helpers import install_dist, spawn_probed, swept

CODE = "import fakedist.core, fakedist.extra, brokendist, structlog"


def make_site(site: Path) -> None:
    """fakedist: core.py patched after install, extra.py added (no RECORD row); brokendist:
    a RECORD with a malformed row."""
    install_dist(site, "fakedist", {"fakedist/__init__.py": b"", "fakedist/core.py": b"X = 1\n"})
    (site / "fakedist" / "core.py").write_bytes(b"X = 2  # patched\n")
    (site / "fakedist" / "extra.py").write_bytes(b"Y = 1\n")
    install_dist(site, "brokendist", {"brokendist.py": b"Z = 1\n"}, "not,a,valid,row\n")


def probed(
    root: Path, site: Path, n: int, settle: bool = False
) -> contextlib.AbstractContextManager[int]:
    """A probed interpreter importing CODE with SITE on its path; its pid once loaded (and
    SETTLE: once a sweep after that has ended)."""
    return spawn_probed(root, CODE, site, probe_dir=f"probe-{n}", settle=settle)


def _judged(r: ProcessReport) -> tuple[object, ...]:
    return (r.provenance, r.drift, r.disagreements)


def test_shared_sites_judge_every_process_as_its_own_index_does(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_site(site)
    procfs = ProcFS()
    with ExitStack() as stack:
        pids = [stack.enter_context(probed(tmp_path, site, n)) for n in range(2)]
        for n, pid in enumerate(pids):  # the interpreter layout is recorded
            swept(tmp_path / f"probe-{n}", pid)
        evidence = [read_process(procfs, pid) for pid in pids]
        shared = Sites()
        optimized, indexes = [], []
        for ev in evidence:
            index = dist_index(procfs, ev.identity.pid, shared)
            indexes.append(index)
            optimized.append(report_with_judgement(procfs, ev, Hasher(), index=index)[0])
        after_first = len(shared)
        reference = [to_report(procfs, ev, Hasher()) for ev in evidence]
        views = [view_of(procfs, pid) for pid in pids]
    assert [_judged(r) for r in reference] == [_judged(r) for r in optimized]
    # one view, so the second process parsed nothing: every site it indexed came from the first
    assert views[0] == views[1] is not None
    assert after_first > 0 and set(indexes[0]._sites) == set(indexes[1]._sites)
    assert all(indexes[0]._sites[s] is indexes[1]._sites[s] for s in indexes[0]._sites)
    # negative controls: the tree has what the sharing must not lose, for each process
    for r in optimized:
        assert r.provenance is not None
        classes = {f.path: f.origin for f in r.provenance.files}
        assert classes[str(site / "fakedist" / "core.py")] == Origin.PATCHED
        assert classes[str(site / "fakedist" / "extra.py")] == Origin.ADDED
        broken = [d for d in r.drift if d.id == DRIFT_RECORD_UNREADABLE]
        assert [d.path for d in broken] == [str(site / "brokendist-1.0.dist-info" / "RECORD")]
        assert r.provenance.count(Origin.PRISTINE) > 10  # structlog's files, against its RECORD


# A parent that starts a probed child importing the same (the child inherits the probe's
# environment and PYTHONPATH) and waits for it; the child ends when its parent does.
TREE = f"""{CODE}
import os, subprocess, sys, time
child_ready = sys.argv[1] + ".child"
child = (
    {CODE!r} + "\\nimport os, sys, time\\nparent = os.getppid()\\n"
    "open(sys.argv[1], 'w').write('ok')\\n"
    "while os.getppid() == parent:\\n    time.sleep(0.2)\\n"
)
subprocess.Popen([sys.executable, "-c", child, child_ready])
while not os.path.exists(child_ready):
    time.sleep(0.05)
"""


def test_inspect_of_a_tree_parses_each_site_once_and_judges_as_a_fresh_index_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``verifier inspect --tree`` (``_local.read_local``) shares the parse of a site-packages
    between the processes of the tree, as the agent does: each site is parsed once, and each
    process is judged as a fresh index of its own judges it (patched, added, malformed RECORD)."""
    site = tmp_path / "site"
    make_site(site)
    parsed: Counter[str] = Counter()
    real_parse = DistIndex._parse_site

    def counting(self: DistIndex, where: str) -> object:
        parsed[where] += 1
        return real_parse(self, where)

    procfs = ProcFS()
    with spawn_probed(tmp_path, TREE, site) as pid:
        monkeypatch.setattr(DistIndex, "_parse_site", counting)
        got = read_local(procfs, pid, tree=True)
        monkeypatch.undo()
        reference = {ev.identity.pid: to_report(procfs, ev, Hasher()) for ev, _ in got}
    assert len(got) == 2, [ev.identity.pid for ev, _ in got]
    assert parsed[str(site)] == 1 and set(parsed.values()) == {1}, parsed
    for ev, report in got:
        assert _judged(report) == _judged(reference[ev.identity.pid])
        assert report.provenance is not None
        classes = {f.path: f.origin for f in report.provenance.files}
        assert classes[str(site / "fakedist" / "core.py")] == Origin.PATCHED
        assert classes[str(site / "fakedist" / "extra.py")] == Origin.ADDED


def test_an_index_without_a_view_shares_nothing(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_site(site)
    shared = Sites()
    alone = DistIndex(Path, shared, view=None)
    alone.add_site(str(site))
    assert len(shared) == 0 and len(alone.faults) == 1
    viewed = DistIndex(Path, shared, view=("mnt:[1]", 1, 2))
    viewed.add_site(str(site))
    other = DistIndex(Path, shared, view=("mnt:[9]", 1, 2))  # another view parses its own
    other.add_site(str(site))
    assert len(shared) == 2
    assert alone.faults == viewed.faults == other.faults


def pycs(directory: Path) -> list[FileEntry]:
    """40 loaded pycs (more than compilers.MIN_JOBS): fresh ones, stale ones (their source
    rewritten after, size and mtime kept), sources that no longer compile, unchecked-hash
    pycs of changed sources, and fresh optimized ones."""
    files = []
    for i in range(40):
        kind = i % 5
        mode = tb.UNCHECKED if kind == 3 else tb.TIMESTAMP
        src, pyc = tb.write_module(
            directory / f"p{i}", tb.OLD + f"N = {i}\n".encode(), mode, 2 if kind == 4 else -1
        )
        if kind == 1:
            tb.make_stale(src, pyc, tb.NEW + f"N = {i}\n".encode())
        elif kind == 2:
            tb.make_stale(src, pyc, b"VALUE = 'old\n\n" + f"N = {i}\n".encode())
        elif kind == 3:
            tb.make_stale(src, pyc, tb.NEW + f"N = {i}\n".encode())
        files.append(tb.entry(pyc, module=f"p{i}.mod"))
    return files


def test_compiles_on_every_core_judge_as_compiling_here(tmp_path: Path) -> None:
    files = pycs(tmp_path)
    serial = judge_bytecode(files, Path, cache=None)  # each compiled here, one after another
    parallel = judge_bytecode(files, Path, cache=CompileCache())
    assert serial == parallel
    found = Counter(d.id for d in parallel.drift)
    # negative controls: 8 stale, 8 uncompilable (stale too), 8 unchecked-and-stale
    assert found == {DRIFT_BYTECODE_STALE: 24, DRIFT_BYTECODE_UNCHECKED: 8}
    assert len(parallel.compiled_from) == 16


def test_helpers_answer_what_this_process_computes_and_a_failed_one_is_made_up_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = []
    for f in pycs(tmp_path):
        pyc = Path(f.path)
        src = pyc.parent.parent / "mod.py"
        level = pycfile.optimization(pyc.name)
        jobs.append((pyc.read_bytes(), src.read_bytes(), str(src), level))
    here = [pycfile.compare(*job) for job in jobs]
    assert compilers.compare_all(jobs, helpers=2) == here
    assert sum(o is None for o in here) == 16 and all(o is None or o[0] for o in here)
    monkeypatch.setattr(sys, "executable", "/bin/false")  # no helper can start
    assert compilers._in_helper(jobs[:2]) is None
    assert compilers.compare_all(jobs, helpers=2) == here


@pytest.mark.parametrize("root", ["/proc", "/tmp/proc/", "/srv/.hidden/proc"])
def test_in_root_str_spells_a_path_as_in_root_does(root: str) -> None:
    """The hot loops' string form of ``ProcFS.in_root`` is the Path's own spelling, for clean
    paths (the fast path, also under dot-directories like ``.venv``) and for every shape Path
    normalizes (doubled and trailing slashes, ``.`` components) or the process climbs (``..``
    stays at its root)."""
    procfs = ProcFS(root)
    paths = ["/a/b.py", "/w/.venv/lib/x.py", "a//b", "/a/./b", "/a/../../b", "/", "", "/a/"]
    paths += ["/.hidden/x", "x/.", "./a", "/a/.", "/a/..", ".", "..", "/a/b/"]
    for path in paths:
        # the join the agent used before (a ".." path normalized first, as then)
        climbed = posixpath.normpath("/" + path) if ".." in path.split("/") else path
        joined = str(Path(root) / "7" / "root" / climbed.lstrip("/"))
        assert (joined, joined) == (procfs.in_root_str(7, path), str(procfs.in_root(7, path)))
    assert procfs.in_root_str(7, "/a/../../b") == f"{Path(root)}/7/root/b"
    assert procfs.in_root_str(7, "/w/.venv/x.py") == f"{Path(root)}/7/root/w/.venv/x.py"
