"""Before the probe looked (issue 18, class 2): a module the process imported before its probe
started is hashed from disk *after the fact* (``at: "snapshot"``); so is one that appears
without passing a loader the probe wraps (``late``). A workload that imports a patched module
and puts the published bytes back before the probe hashes it gets the published hash recorded
while the patched code runs. Every file record carries the file's identity when hashed, and
the agent flags a file hashed after the fact whose ctime is after the process started
(``provenance.file.changed_after_start``, an ERROR); the verdict lists which files were hashed
after the fact (``provenance.file.hashed_after``, INFO).

Each attack below is built on a real probed process; a ``[[files]]`` entry pinning the
published bytes shows what the attack wins without the check (the recorded hash matches)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from servewitness_probe import layout as L

from servewitness._cli.inspect_cmd import render_judgement
from servewitness.agent.config import AgentConfig
from servewitness.agent.runner import Agent
from servewitness.evidence import unfiled
from servewitness.evidence.hashing import Hasher
from servewitness.evidence.journal import identity_of
from servewitness.evidence.judge import changed_after, cross_check, waived
from servewitness.evidence.process import read_process
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.report import to_report
from servewitness.model import (
    DRIFT_CHANGED_AFTER_START,
    DRIFT_CHANGED_IN_CACHE,
    DRIFT_MODIFIED_AFTER_LOAD,
    FileEntry,
    FileIdentity,
    ProcessReport,
    Verdict,
)
from servewitness.policy import TargetSnapshot, load_policy
from tests.helpers import probe_env, weak_policy

PATCHED = "X = 'patched: runs unseen'\n"
PUBLISHED = "X = 'published'\n".ljust(len(PATCHED) - 1) + "\n"  # the same size
HASHED_AFTER = "provenance.file.hashed_after"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Child:
    """A probed Python process running BODY (its argv[1] is the module directory), then
    waiting; ``report`` is the agent's one-shot report of it."""

    def __init__(self, tmp: Path, body: str, **env: str) -> None:
        self.mods = tmp / "mods"
        self.mods.mkdir(exist_ok=True)
        self.probe = tmp / "probe"
        code = f"import os, sys, time\nsys.path.insert(0, sys.argv[1])\n{body}\n"
        code += "print('up', flush=True)\nsys.stdin.read()\n"
        # TMPDIR elsewhere than /tmp (where pytest's tmp_path is): files under the process's
        # temporary directory are "generated", which the check leaves out (tested below).
        env.setdefault("TMPDIR", str(tmp / "scratch"))
        (tmp / "scratch").mkdir(exist_ok=True)
        full = probe_env(self.probe, PYTHONDONTWRITEBYTECODE="1", **env)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(self.mods)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=full, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "up"

    def wait_for(self, path: Path) -> FileEntry:
        """PATH's entry in the probe's manifest, once the sweeper has recorded it."""
        deadline = time.monotonic() + 30
        while True:
            ev = read_process(ProcFS(), self.proc.pid)
            got = [f for f in (ev.probe.files if ev.probe else ()) if f.path == str(path)]
            if got:
                return got[0]
            assert time.monotonic() < deadline, f"{path} never recorded"
            time.sleep(0.1)

    def report(self) -> ProcessReport:
        procfs = ProcFS()
        return to_report(procfs, read_process(procfs, self.proc.pid))

    def journal(self) -> Path:
        (d,) = self.probe.glob("*-*")
        return d / L.JOURNAL_FILE

    def stop(self) -> None:
        self.proc.communicate(timeout=10)


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for c in made:
        c.stop()


def pinned(path: Path, text: str) -> str:
    """A policy that pins PATH to TEXT's bytes (the published ones)."""
    return weak_policy(f'version = 1\n[[files]]\npath = "{path}"\nsha256 = "{sha(text)}"\n')


def verdict(report: ProcessReport, policy: str) -> tuple[Verdict, list[str]]:
    """The policy's verdict on REPORT, judged as the worker of a target (a plain Python
    process has no vLLM role, and helpers and unknown roles are not judged)."""
    snap = TargetSnapshot("t", (dataclasses.replace(report, role="worker"),), time.time())
    v = load_policy(policy).evaluate_target(snap, time.time())
    return v.verdict, [f.id for f in v.findings]


def changed(report: ProcessReport) -> list[str]:
    return [d.path for d in report.drift if d.id == DRIFT_CHANGED_AFTER_START]


# The attack: imported patched, published bytes put back before the probe hashed them.
SNAPSHOT_ATTACK = """
import victim
assert victim.X.startswith("patched"), victim.X
time.sleep(0.2)  # vLLM imports for seconds before its plugins (and the probe) load
path, st = victim.__file__, os.stat(victim.__file__)
with open(path, "w") as f:  # in place: the same inode
    f.write(os.environ["PUBLISHED"])
if os.environ.get("RESTORE_MTIME"):
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
import servewitness_probe as p
p.start()
"""


def _snapshot_attack(tmp: Path, children: list[Child], **env: str) -> tuple[Child, Path]:
    victim = tmp / "mods" / "victim.py"
    victim.parent.mkdir()
    victim.write_text(PATCHED)
    c = Child(tmp, SNAPSHOT_ATTACK, PUBLISHED=PUBLISHED, **env)
    children.append(c)
    return c, victim


def test_an_untouched_snapshot_file_is_listed_as_hashed_after_the_fact_and_passes(
    tmp_path: Path, children: list[Child]
) -> None:
    """The negative control: imported before the probe started and never touched. Its hash
    is after the fact (listed, INFO) but its ctime is before the process started, so the
    bytes hashed are the bytes imported: no drift, and the pinned hash PASSes."""
    victim = tmp_path / "mods" / "victim.py"
    victim.parent.mkdir()
    victim.write_text(PUBLISHED)
    c = Child(tmp_path, "import victim\nimport servewitness_probe as p\np.start()")
    children.append(c)
    entry = c.wait_for(victim)
    assert (entry.at, entry.sha256) == ("snapshot", sha(PUBLISHED))
    assert entry.identity is not None and entry.identity.ino == victim.stat().st_ino
    report = c.report()
    assert changed(report) == []
    assert str(victim) in report.hashed_after and report.hashed_after_count >= 1
    got, ids = verdict(report, pinned(victim, PUBLISHED))
    assert (got, HASHED_AFTER in ids) == (Verdict.PASS, True), ids


def test_a_module_rewritten_before_the_probe_started_is_changed_after_start(
    tmp_path: Path, children: list[Child]
) -> None:
    """The attack: the process imports the patched module, writes the published bytes back
    (same inode, another size) and only then starts the probe, which hashes the published
    bytes. The recorded hash matches the pin (the lie works); the file's ctime, after the
    process started, keeps the gate from PASS."""
    c, victim = _snapshot_attack(tmp_path, children)
    entry = c.wait_for(victim)
    assert (entry.at, entry.sha256) == ("snapshot", sha(PUBLISHED))  # the lie is recorded
    report = c.report()
    assert changed(report) == [str(victim)], report.drift
    (d,) = [d for d in report.drift if d.id == DRIFT_CHANGED_AFTER_START]
    assert "after the process started" in d.detail and "snapshot" in d.detail
    got, ids = verdict(report, pinned(victim, PUBLISHED))
    assert "provenance.file.hash_mismatch" not in ids  # what the attack wins without the check
    assert (got, DRIFT_CHANGED_AFTER_START in ids) == (Verdict.FAIL, True), ids


def test_size_and_mtime_put_back_do_not_hide_the_rewrite(
    tmp_path: Path, children: list[Child]
) -> None:
    """Variation: the published bytes have the patched file's size and its mtime is set back
    (``os.utime``), so size and mtime say nothing changed; the ctime, which user space cannot
    set, still does."""
    c, victim = _snapshot_attack(tmp_path, children, RESTORE_MTIME="1")
    before = victim.stat()
    c.wait_for(victim)
    report = c.report()
    assert victim.stat().st_size == len(PATCHED.encode())
    assert victim.stat().st_mtime_ns == before.st_mtime_ns
    assert changed(report) == [str(victim)]
    assert verdict(report, pinned(victim, PUBLISHED))[0] == Verdict.FAIL


def test_an_older_ctime_forged_into_the_journal_does_not_vouch_for_the_file(
    tmp_path: Path, children: list[Child]
) -> None:
    """Variation: the workload also edits its journal (its own to write) so the record says
    the file's ctime was before the start. The agent judges by the ctime it reads itself."""
    c, victim = _snapshot_attack(tmp_path, children)
    c.wait_for(victim)
    journal = c.journal()
    lines = journal.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if rec.get("path") == str(victim) and "stat" in rec:
            rec["stat"][4] = 1_000_000_000  # 1970
            lines[i] = json.dumps(rec, separators=(",", ":")) + "\n"
    with journal.open("w") as f:  # same lines, same seq: the one-shot reader sees no edit
        f.writelines(lines)
    report = c.report()
    (entry,) = [f for f in report.files or () if f.path == str(victim)]
    assert entry.identity is not None and entry.identity.ctime_ns == 1_000_000_000
    assert changed(report) == [str(victim)]


def test_a_new_hard_link_after_the_agent_looked_is_not_flagged_but_a_first_look_says_so(
    tmp_path: Path, children: list[Child]
) -> None:
    """A file's ctime also moves without its bytes changing: a chmod, or a new hard link (a
    package manager linking the same files into another environment from its cache, as uv
    does). An agent that saw the file unchanged since before the start (it looks every few
    seconds) vouches for it: the later ctime says nothing about what was imported. The
    attack is still flagged when it happened before the agent's first look, and a one-shot
    look (``verifier inspect``) after such a change cannot tell it from a rewrite."""
    victim = tmp_path / "mods" / "victim.py"
    victim.parent.mkdir()
    victim.write_text(PUBLISHED)
    c = Child(tmp_path, "import victim\nimport servewitness_probe as p\np.start()")
    children.append(c)
    c.wait_for(victim)
    agent = Agent(AgentConfig("unix:/", "t", "a", tmp_path / "spool", root_pid=c.proc.pid,
                              recheck_s=0))  # fmt: skip
    try:
        (first,) = agent.collect().processes
        assert changed(first) == []
        os.link(victim, tmp_path / "elsewhere.py")  # the same inode: its ctime moves
        assert victim.stat().st_ctime > first.start_time
        (again,) = agent.collect().processes
        assert changed(again) == []
        assert changed(c.report()) == [str(victim)]  # the one-shot look: the documented limit
    finally:
        agent.channel.close()


def test_the_agent_keeps_flagging_a_rewrite_it_first_saw(
    tmp_path: Path, children: list[Child]
) -> None:
    c, victim = _snapshot_attack(tmp_path, children)
    c.wait_for(victim)
    agent = Agent(AgentConfig("unix:/", "t", "a", tmp_path / "spool", root_pid=c.proc.pid,
                              recheck_s=0))  # fmt: skip
    try:
        for _ in range(2):
            (report,) = agent.collect().processes
            assert changed(report) == [str(victim)]
    finally:
        agent.channel.close()


def test_a_module_executed_outside_the_import_system_and_rewritten_is_flagged(
    tmp_path: Path, children: list[Child]
) -> None:
    """Variation: after the probe started, the process runs a module's patched source itself
    (``exec``, as torch inductor loads its generated code) and puts the published bytes back
    before the module appears in ``sys.modules``. No wrapped loader read it: the sweeper
    hashes it from disk (``late``), after the fact."""
    late = tmp_path / "mods" / "late_mod.py"
    late.parent.mkdir()
    late.write_text(PATCHED)
    body = f"""
import types, servewitness_probe as p
p.start()
time.sleep(0.2)
path = {str(late)!r}
mod = types.ModuleType("late_mod")
mod.__file__ = path
exec(compile(open(path).read(), path, "exec"), mod.__dict__)
assert mod.X.startswith("patched")
with open(path, "w") as f:
    f.write(os.environ["PUBLISHED"])
sys.modules["late_mod"] = mod
"""
    c = Child(tmp_path, body, PUBLISHED=PUBLISHED)
    children.append(c)
    entry = c.wait_for(late)
    assert (entry.at, entry.sha256) == ("late", sha(PUBLISHED))
    report = c.report()
    assert changed(report) == [str(late)]
    assert str(late) in report.hashed_after
    assert verdict(report, pinned(late, PUBLISHED))[0] == Verdict.FAIL


def test_a_file_read_at_load_and_touched_later_is_not_flagged(
    tmp_path: Path, children: list[Child]
) -> None:
    """Control for ``load`` records: the probe hashed the very bytes the import system read,
    so the same bytes written again later (ctime after the start) change nothing that ran;
    other bytes are a file modified after load, as before."""
    same = tmp_path / "mods" / "same_mod.py"
    same.parent.mkdir()
    same.write_text(PUBLISHED)
    other = tmp_path / "mods" / "other_mod.py"
    other.write_text(PUBLISHED)
    body = "import servewitness_probe as p\np.start()\nimport same_mod, other_mod"
    c = Child(tmp_path, body)
    children.append(c)
    assert c.wait_for(same).at == "load"
    c.wait_for(other)
    time.sleep(0.1)
    same.write_text(PUBLISHED)  # the same bytes, a new ctime
    other.write_text(PATCHED)
    report = c.report()
    assert changed(report) == []
    assert [d.path for d in report.drift if d.id == DRIFT_MODIFIED_AFTER_LOAD] == [str(other)]
    assert [d.path for d in report.disagreements] == []


def test_files_under_the_process_temporary_directory_are_left_out(
    tmp_path: Path, children: list[Child]
) -> None:
    """The documented limit: a module under the process's TMPDIR (or a compile cache) is
    written by the process itself after it started (torch inductor's generated code), and no
    RECORD pins its bytes, so its ctime is not judged: the change is said as INFO
    (``provenance.file.changed_in_cache``), not an error. It is still listed as hashed after
    the fact, and classed ``unknown``: the process imported it by name from the import path."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    victim = scratch / "victim.py"
    victim.write_text(PATCHED)
    body = SNAPSHOT_ATTACK.replace("import victim", f"sys.path.insert(0, {str(scratch)!r})\n"
                                   "import victim")  # fmt: skip
    c = Child(tmp_path, body, PUBLISHED=PUBLISHED)
    children.append(c)
    c.wait_for(victim)
    report = c.report()
    assert changed(report) == []
    assert [d.path for d in report.drift if d.id == DRIFT_CHANGED_IN_CACHE] == [str(victim)]
    assert str(victim) in report.hashed_after
    # inspect says it once, as a count with the paths, never as a DRIFT line
    text = "\n".join(render_judgement(report, verbose=False))
    assert "cache    1 files hashed after the fact changed" in text and str(victim) in text
    assert "DRIFT" not in text, text
    assert report.provenance is not None
    # imported by name from a directory on its import path, so not a compile cache's output:
    # unknown (``all_code_claimed`` judges it; see tests/test_code_claims.py)
    assert str(victim) in {f.path for f in report.provenance.files if f.origin == "unknown"}


def _site_with(site: Path, files: dict[str, bytes]) -> None:
    """An installed distribution ``victimdist`` 1.0 in SITE whose RECORD lists FILES (path
    relative to SITE: bytes) with their hashes; the files themselves are left to the caller."""
    info = site / "victimdist-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: victimdist\nVersion: 1.0\n")
    rows = [f"{rel},sha256={_b64(data)},{len(data)}" for rel, data in files.items()]
    (info / "RECORD").write_text("\n".join([*rows, "victimdist-1.0.dist-info/RECORD,,"]) + "\n")


def _b64(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


@pytest.mark.parametrize("variable", ["TMPDIR", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT"])
def test_a_cache_directory_named_over_a_distribution_does_not_exempt_its_files(
    tmp_path: Path, children: list[Child], variable: str
) -> None:
    """The attack on the exemption above: the process names its own compile caches and
    temporary directory (its environment), so the workload starts it with one of them set
    over the site-packages that hold the distribution it patches, then runs the snapshot
    attack on one of that distribution's files. The file is under the process's "generated"
    directories, but a RECORD claims it: it is the distribution's, not generated, and its
    ctime after the start is still judged. (The variation: TMPDIR is "/", every file.)"""
    from servewitness.evidence.judge import generated_dirs

    site = tmp_path / "site"
    core = site / "victimdist" / "core.py"
    core.parent.mkdir(parents=True)
    (core.parent / "__init__.py").write_text("")
    _site_with(site, {"victimdist/__init__.py": b"", "victimdist/core.py": PUBLISHED.encode()})
    core.write_text(PATCHED)  # installed, then patched on disk before the start
    body = SNAPSHOT_ATTACK.replace("import victim\n", "import victimdist.core as victim\n")
    body = f"sys.path.insert(0, {str(site)!r})\n" + body
    where = "/" if variable == "TMPDIR" else str(site)
    c = Child(tmp_path, body, PUBLISHED=PUBLISHED, **{variable: where})
    children.append(c)
    entry = c.wait_for(core)
    assert (entry.at, entry.sha256) == ("snapshot", sha(PUBLISHED))  # the lie is recorded
    procfs = ProcFS()
    assert any(core.is_relative_to(d) for d in generated_dirs(procfs, c.proc.pid))  # the setup
    report = c.report()
    assert report.provenance is not None
    # what the attack wins without the check: RECORD's hash (only files not pristine are listed)
    assert str(core) not in {f.path for f in report.provenance.files}
    assert ("victimdist", "1.0", 2) in report.provenance.distributions
    assert changed(report) == [str(core)], report.drift
    policy = weak_policy('version = 1\n[provenance]\npristine = ["victimdist"]\n')
    got, ids = verdict(report, policy)
    assert (got, DRIFT_CHANGED_AFTER_START in ids) == (Verdict.FAIL, True), ids


def test_a_pinned_file_the_process_puts_under_its_temporary_directory_is_never_pass(
    tmp_path: Path, children: list[Child]
) -> None:
    """The variation no RECORD covers: the file is the workload's own (no distribution), the
    policy pins it with ``[[files]]``, and the process is started with ``TMPDIR=/``, so the
    file lies in its temporary directory and its ctime is not judged: the snapshot attack
    leaves no drift. The pin cannot be checked then, and says so (PENDING, never PASS)."""
    c, victim = _snapshot_attack(tmp_path, children, TMPDIR="/")
    c.wait_for(victim)
    report = c.report()
    assert changed(report) == []  # generated: no error, but said
    assert [d.path for d in report.drift if d.id == DRIFT_CHANGED_IN_CACHE] == [str(victim)]
    assert report.provenance is not None
    # imported by name from a directory on its import path, so not a compile cache's output:
    # unknown (``all_code_claimed`` judges it; see tests/test_code_claims.py)
    assert str(victim) in {f.path for f in report.provenance.files if f.origin == "unknown"}
    got, ids = verdict(report, pinned(victim, PUBLISHED))
    assert "provenance.file.hash_mismatch" not in ids  # the recorded hash is the published one
    assert got == Verdict.PENDING and "provenance.file.unverifiable" in ids, (got, ids)


def _editable_checkout(tmp: Path) -> tuple[Path, Path]:
    """A site holding an editable install of ``proj`` 0.1 whose root (a checkout) is
    ``tmp/proj``; returns (site, root)."""
    site, root = tmp / "site", tmp / "proj"
    root.mkdir()
    pth = f"{root}\n".encode()
    _site_with(site, {"__editable__.proj-0.1.pth": pth})
    (site / "__editable__.proj-0.1.pth").write_bytes(pth)
    info = site / "victimdist-1.0.dist-info"  # _site_with's name: make it proj's
    url = {"url": f"file://{root}", "dir_info": {"editable": True}}
    (info / "direct_url.json").write_text(json.dumps(url))
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: proj\nVersion: 0.1\n")
    info.rename(site / "proj-0.1.dist-info")
    return site, root


@pytest.mark.parametrize("where", ["editable", "package_folder"])
def test_a_pinned_file_no_record_claims_under_a_named_cache_is_never_pass(
    tmp_path: Path, children: list[Child], where: str
) -> None:
    """The variation past the RECORD rule: the pinned file is claimed by no RECORD row but is
    not generated either: a module of an editable install (a checkout) started with
    ``TMPDIR=/``, or a module added into a distribution's package folder with
    ``TRITON_CACHE_DIR`` over its site. Its class is ``editable`` or ``added``, not
    ``generated``, so the pin's own rule for generated files does not see it, and the agent
    does not judge its ctime (the directory is the process's cache). The agent says it waived
    the check (``provenance.file.changed_in_cache``, INFO), and the pin is unverifiable
    (PENDING), never PASS; without that, the snapshot attack PASSed both."""
    if where == "editable":
        site, root = _editable_checkout(tmp_path)
        victim, env, origin = root / "victim.py", {"TMPDIR": "/"}, "editable"
    else:
        site = tmp_path / "site"
        _site_with(site, {"victimdist/__init__.py": b""})
        (site / "victimdist").mkdir()
        (site / "victimdist" / "__init__.py").write_text("")
        root, victim = site, site / "victimdist" / "victim.py"
        env, origin = {"TRITON_CACHE_DIR": str(site)}, "added"
    victim.write_text(PATCHED)
    module = "victim" if where == "editable" else "victimdist.victim"
    body = SNAPSHOT_ATTACK.replace("import victim\n", f"import {module} as victim\n")
    body = f"sys.path[:0] = [{str(site)!r}, {str(root)!r}]\n" + body
    c = Child(tmp_path, body, PUBLISHED=PUBLISHED, **env)
    children.append(c)
    entry = c.wait_for(victim)
    assert (entry.at, entry.sha256) == ("snapshot", sha(PUBLISHED))  # the lie is recorded
    report = c.report()
    assert report.provenance is not None
    assert {f.path: f.origin for f in report.provenance.files}.get(str(victim)) == origin
    assert changed(report) == []  # under the process's caches: not an error
    waived = [d.path for d in report.drift if d.id == DRIFT_CHANGED_IN_CACHE]
    assert waived == [str(victim)], report.drift
    got, ids = verdict(report, pinned(victim, PUBLISHED))
    assert "provenance.file.hash_mismatch" not in ids  # the recorded hash is the published one
    assert got == Verdict.PENDING and "provenance.file.unverifiable" in ids, (got, ids)


def test_a_distribution_s_library_rewritten_in_place_under_a_named_cache_is_changed(
    tmp_path: Path, children: list[Child]
) -> None:
    """The same for native code: the process is started with TRITON_CACHE_DIR set to the
    site-packages of a distribution whose RECORD lists a shared library; the library's inode
    is written after the start (a rewrite in place) and mapped. Under a real compile cache
    such a library is generated (Triton's launchers: ``same``); a distribution's is
    ``changed``. The control: an unclaimed library written beside it stays ``same``."""
    from servewitness.evidence.native import native_mappings
    from servewitness.evidence.places import GeneratedFiles
    from tests.test_native import LIBZ

    if not LIBZ.exists():
        pytest.skip(f"{LIBZ} is not on this machine (any small shared library would do)")
    site = tmp_path / "site"
    lib = LIBZ.read_bytes()
    _site_with(site, {"victimdist/_native.so": lib})
    (site / "victimdist").mkdir()
    body = (
        "import ctypes, shutil\n"
        "time.sleep(0.3)\n"  # well after the start, as a library rewritten in place
        "for name in ('victimdist/_native.so', 'kernel.so'):\n"
        f"    dst = os.path.join({str(site)!r}, name)\n"
        f"    ctypes.CDLL(shutil.copy({str(LIBZ.resolve())!r}, dst))\n"
    )
    c = Child(tmp_path, body, TRITON_CACHE_DIR=str(site))
    children.append(c)
    report = c.report()
    states = {m.path: m.state for m in report.native_mappings if m.path.startswith(str(site))}
    assert states == {
        str(site / "victimdist" / "_native.so"): "changed",
        str(site / "kernel.so"): "same",
    }, states
    # what the exemption by directory alone would say: both generated, both "same"
    procfs = ProcFS()
    ident = procfs.identity(c.proc.pid)
    loose = native_mappings(
        procfs, c.proc.pid, Hasher(), start_time=ident.start_time,
        generated=GeneratedFiles((str(site),)),
    )  # fmt: skip
    assert {m.state for m in loose if m.path.startswith(str(site))} == {"same"}


def test_every_file_record_carries_the_identity_it_was_hashed_with(
    tmp_path: Path, children: list[Child]
) -> None:
    """Load records (a stat right after the read), snapshot records (the hashed descriptor)
    and extension modules (when loaded, and when the sweeper hashed them)."""
    mod = tmp_path / "mods" / "plain_mod.py"
    mod.parent.mkdir()
    mod.write_text(PUBLISHED)
    c = Child(tmp_path, "import servewitness_probe as p\np.start()\nimport plain_mod, _csv")
    children.append(c)
    entry = c.wait_for(mod)
    st = mod.stat()
    assert entry.at == "load"
    assert entry.identity == FileIdentity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                          st.st_ctime_ns)  # fmt: skip
    import _csv  # the same interpreter: the same extension module file

    ext = c.wait_for(Path(_csv.__file__))
    assert (ext.kind, ext.at) == ("extension", "load")
    assert ext.loaded is not None and ext.loaded == ext.identity == _ident(Path(_csv.__file__))
    ev = read_process(ProcFS(), c.proc.pid)
    assert ev.probe is not None
    # every file of the process: -c code and zip members are no files (kinds inline, member)
    snaps = [f for f in ev.probe.files if f.at == "snapshot" and f.sha256 and unfiled.on_disk(f)]
    assert snaps and all(f.identity is not None for f in snaps)


# The judgement's rules, on hand-made entries ------------------------------------------------


def _ident(path: Path) -> FileIdentity:
    st = path.stat()
    return FileIdentity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _as_root(tmp: Path) -> ProcFS:
    """A captured /proc whose process 4242 has "/" as its root."""
    (tmp / "proc" / "4242").mkdir(parents=True)
    (tmp / "proc" / "4242" / "root").symlink_to("/")
    return ProcFS(tmp / "proc")


def test_other_bytes_in_the_very_file_the_probe_hashed_are_a_disagreement(
    tmp_path: Path,
) -> None:
    """A probe record whose hash is not the file's although the file still has the identity
    recorded with that hash: the probe's hash is false, whatever the times say (without an
    identity the ctime decides, as before)."""
    f = tmp_path / "m.py"
    f.write_text(PUBLISHED)
    lie = FileEntry(str(f), sha(PATCHED), 1, "source", "m", "snapshot", _ident(f))
    procfs = _as_root(tmp_path)
    got, drift = cross_check(procfs, 4242, (lie,), Hasher(), start_time=time.time() - 60)
    assert drift == [] and len(got) == 1 and "very file it hashed" in got[0].reason
    bare = dataclasses.replace(lie, identity=None)
    got, drift = cross_check(procfs, 4242, (bare,), Hasher(), start_time=0.0)
    assert got == [] and [d.id for d in drift] == [DRIFT_MODIFIED_AFTER_LOAD]


def test_changed_after_start_rules() -> None:
    start = 1_000.0
    before, after = FileIdentity(1, 2, 3, 4, 999 * 10**9), FileIdentity(1, 2, 3, 4, 1001 * 10**9)
    now_before = (1, 2, 3, 4, 999 * 10**9)
    snap = FileEntry("/a.py", "0" * 64, 3, "source", "a", "snapshot", before)
    assert changed_after(snap, now_before, start) is None
    assert changed_after(dataclasses.replace(snap, identity=after), now_before, start)
    assert changed_after(snap, (1, 2, 3, 4, 1001 * 10**9), start)  # the agent's own ctime
    assert changed_after(snap, (1, 2, 3, 4, int((start + 0.01) * 1e9)), start) is None  # slack
    for at in ("late", "deferred"):
        assert changed_after(dataclasses.replace(snap, at=at, identity=after), None, start)
    load = dataclasses.replace(snap, at="load", identity=after)
    assert changed_after(load, (1, 2, 3, 4, 1001 * 10**9), start) is None  # hashed as read
    ext = FileEntry("/e.so", "0" * 64, 3, "extension", "e", "load", after, before)
    assert "when loaded" in (changed_after(ext, None, start) or "")
    assert changed_after(dataclasses.replace(ext, loaded=after), None, start) is None
    gen = dataclasses.replace(snap, path="/tmp/x/a.py", identity=after)
    assert changed_after(gen, None, start) and waived(gen, ("/tmp",))  # said, as INFO
    assert not waived(gen, ()) and not waived(gen, ("/var",))
    pth = dataclasses.replace(gen, path="/tmp/x/a.pth", kind="pth")
    assert not waived(pth, ("/tmp",))  # ran before it was hashed: never waived


@pytest.mark.parametrize(
    "value",
    [None, "x", [1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, True], [1, -2, 3, 4, 5],
     [1, 2, 3.5, 4, 5], [1 << 64, 2, 3, 4, 5], [1, 2, 3, 4, 1 << 63]],
)  # fmt: skip
def test_a_malformed_identity_in_the_journal_reads_as_absent(value: object) -> None:
    assert identity_of(value) is None


def test_a_well_formed_identity_in_the_journal_is_read() -> None:
    assert identity_of([1, 2, 3, -4, 5]) == FileIdentity(1, 2, 3, -4, 5)


def test_the_start_time_is_known_to_well_under_the_slack() -> None:
    """The check needs the process's start to a few ms: /proc/stat's btime alone is whole
    seconds. On the live /proc, this process's computed start is before now and at most a
    tick or so before the kernel's own value (checked against the process's age)."""
    procfs = ProcFS()
    ident = procfs.identity(os.getpid())
    boot = procfs.boot_time()
    assert boot != int(boot) or boot == 0  # not a whole second (almost surely)
    with open("/proc/self/stat", "rb") as f:
        ticks = L.start_ticks(f.read())
    up = time.clock_gettime(time.CLOCK_BOOTTIME)
    age = up - ticks / os.sysconf("SC_CLK_TCK")
    assert abs((time.time() - age) - ident.start_time) < 0.01
