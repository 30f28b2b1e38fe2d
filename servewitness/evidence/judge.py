"""The agent's judgement of one process's loaded files, from outside the process.

Everything here reads the files as the process sees them (``/proc/<pid>/root/…``), never
trusting the probe's report alone:

* **cross-check**: every file the probe hashed is hashed again; other bytes are either a
  file *modified after load* (its ctime is later than the process's start, so it changed
  while the process ran) or a *disagreement* between the two vantage points (the probe's
  record and the file as the agent sees it cannot both be right: always so when the file
  still has the identity the probe recorded with its hash);
* **changed after start**: a file hashed *after the fact* (``snapshot``, ``late``,
  ``deferred``: from disk, after the process had read it) whose ctime is later than the
  process's start may have held other bytes when it was imported; so may an extension module
  whose identity when the sweeper hashed it is not the one it had when it was loaded;
* **origins**: each file's provenance class against its distribution's ``RECORD``
  (``origins.py``), native libraries (hashed as mapped) included, and shadowed modules;
  an installer's file (``RECORD``, ``METADATA``, ``direct_url.json``) that could not be read
  is drift too (``provenance.record.unreadable``): what it would have said is unknown;
* **bytecode**: every ``.pyc`` the interpreter used is compared with its source (compiled,
  code objects compared; ``bytecode.py``): other code is drift, and a pyc counts as pristine
  only when shown to be compiled from its published source;
* **fileless modules**: modules the probe saw claiming a file that does not exist;
* **code from no plain file** (``unfiled.py``): zip members read again from their archive,
  ``-c`` code against the command line, ``.pth`` files that execute code, modules custom
  loaders executed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servewitness.errors import UnavailableError
from servewitness.evidence import bytecode, inputs, origins, places, recheck, statickey, unfiled
from servewitness.evidence.distindex import DistIndex, Sites
from servewitness.evidence.hashing import Hasher
from servewitness.evidence.native import native_mappings
from servewitness.evidence.pathchange import Cache, changed_ns
from servewitness.evidence.probe_reader import ProbeState
from servewitness.evidence.procfs import CHANGED_SLACK_S, ProcFS
from servewitness.evidence.stdlib import stdlib_dirs
from servewitness.evidence.verdicts import VerdictStore
from servewitness.model import (
    AFTER_THE_FACT,
    DRIFT_CHANGED_AFTER_START,
    DRIFT_CHANGED_IN_CACHE,
    DRIFT_MODIFIED_AFTER_LOAD,
    DRIFT_RECORD_UNREADABLE,
    Drift,
    FileDisagreement,
    FileEntry,
    FileIdentity,
    NativeMapping,
    Provenance,
)


@dataclass(frozen=True)
class Judgement:
    """The agent's view of one process's files (cached between full checks)."""

    disagreements: tuple[FileDisagreement, ...]
    provenance: Provenance | None
    drift: tuple[Drift, ...]
    # What depends only on the manifest, the native mappings and the installed distributions
    # (origins, shadowing, bytecode, unfiled modules: the static part), and the
    # (``static_digest``, native mappings digest) it was judged for: reused while those and
    # the files it read from the disk (DISK) stay the same; the cross-check, the fileless
    # modules and the .pth files are checked again on every full check.
    static_key: tuple[str, str] | None = None
    static_drift: tuple[Drift, ...] = ()
    # (path, sha256) of the files hashed after the fact that the agent itself saw with those
    # bytes and a ctime before the process started: the bytes imported (``cross_check``).
    vouched: frozenset[tuple[str, str]] = frozenset()
    # (path, distribution) of each code chain's owner file, as its RECORD names it when the
    # static part was judged (``codecheck.check_chains``' label; kept with the static part)
    owners: tuple[tuple[str, str | None], ...] = ()
    # what the static part read from the disk (``inputs``): reused while it reads the same
    disk: tuple[inputs.Input, ...] = ()


# /proc gives a process's start in clock ticks after a boot time in whole seconds: without
# the probe's own hashing time, "changed after the process started" allows this much slack.
START_SLACK_S = 1.0


def cross_check(
    procfs: ProcFS,
    pid: int,
    files: tuple[FileEntry, ...],
    hasher: Hasher,
    *,
    start_time: float,
    hashed_at: Mapping[str, float] | None = None,
    generated: Sequence[str] | places.GeneratedFiles = (),
    vouched: set[tuple[str, str]] | None = None,
) -> tuple[list[FileDisagreement], list[Drift]]:
    """Re-hash every manifest file the probe hashed, as the process sees it. A file with other
    bytes now whose ctime is after the probe hashed it (HASHED_AT: path -> unix time; else
    after the process started) changed while it ran: drift; unless it still has the identity
    the probe recorded with its hash (the same inode, unchanged: then the probe's hash is
    not of this file). Any other difference, or a file the agent cannot read, is a
    disagreement. A file with the bytes the probe recorded is checked by ``changed_after``.
    A pyc its loader read and rejected never ran: the loader compiled the source (which is
    checked) and, where the directory is writable, replaced that pyc with a fresh one, so its
    bytes now say nothing about what runs. GENERATED: the process's compile-cache and
    temporary directories (``places.generated_dirs``), see ``changed_after``.

    VOUCHED: what an agent that looks again and again remembers, read and added to: the
    (path, sha256) of each file hashed after the fact that it saw, itself, with the recorded
    bytes and a ctime before the process started. Such a file held those bytes from before
    the start until the probe hashed it (the record existed when the agent looked), so they
    are the bytes imported; a later ctime (a chmod, a new hard link: a package manager
    linking the same files into another environment) says nothing about the import, and is
    not flagged. A one-shot look has no such memory and flags it.

    Zip members and ``-c`` code are no files of the process: ``unfiled`` checks them. A file
    the interpreter ran before the probe hashed it (``.pth`` files, a main script hashed
    after it started: ``unfiled.ran_before_hashed``) is checked by ``changed_after`` like a
    file hashed after the fact."""
    rejected = {f.path for f in files if f.at == "rejected"}
    recorded = [f for f in files if f.sha256 and f.path not in rejected and unfiled.on_disk(f)]
    seen = hasher.hash_files(procfs.in_root_str(pid, f.path) for f in recorded)
    hashed_at = hashed_at or {}
    disagreements: list[FileDisagreement] = []
    drift: list[Drift] = []
    walked: Cache = {}
    for f, h in zip(recorded, seen, strict=True):
        if h.sha256 == f.sha256:
            if vouched is not None and (f.path, f.sha256) in vouched:
                continue
            path_ns = None
            if f.at in AFTER_THE_FACT or unfiled.ran_before_hashed(f):
                path_ns = changed_ns(procfs, pid, f.path, walked)
            why = changed_after(f, h.key, start_time, path_ns)
            if why is not None and waived(f, generated):
                why += "; it lies under the process's compile caches or temporary directories"
                drift.append(Drift(DRIFT_CHANGED_IN_CACHE, f.path, f.module, why))
            elif why is not None:
                drift.append(Drift(DRIFT_CHANGED_AFTER_START, f.path, f.module, why))
            elif vouched is not None and f.at in AFTER_THE_FACT and f.sha256:
                vouched.add((f.path, f.sha256))
            continue
        unchanged = h.key is not None and f.identity is not None and h.key == _key(f.identity)
        if unchanged:
            why = (
                "other bytes than the probe recorded, in the very file it hashed (the same "
                "device, inode, size, mtime and ctime as it recorded with its hash)"
            )
            disagreements.append(FileDisagreement(f.path, f.sha256, h.sha256, why))
            continue
        since = hashed_at.get(f.path, start_time + START_SLACK_S)
        after = h.key is not None and h.key[4] > int((since - unfiled.CTIME_COARSE_S) * 1e9)
        if h.sha256 is not None and after:
            drift.append(
                Drift(
                    DRIFT_MODIFIED_AFTER_LOAD,
                    f.path,
                    f.module,
                    f"{f.path} hashed {f.sha256[:12] if f.sha256 else '-'} when loaded but "
                    f"{h.sha256[:12]} now, and changed (ctime) after it was loaded",
                )
            )
            continue
        reason = h.error or "bytes differ"
        disagreements.append(FileDisagreement(f.path, f.sha256, h.sha256, reason))
    return disagreements, drift


def _key(i: FileIdentity) -> tuple[int, int, int, int, int]:
    return (i.dev, i.ino, i.size, i.mtime_ns, i.ctime_ns)


def changed_after(
    f: FileEntry,
    now: tuple[int, int, int, int, int] | None,
    start_time: float,
    path_ns: int | None = None,
) -> str | None:
    """Why the bytes F records (the agent found the same bytes on disk: NOW is the file's
    identity as it hashed them) may not be the bytes the process ran; None when nothing says
    so.

    * A file hashed after the fact (``AFTER_THE_FACT``) was read by the process earlier than
      the probe hashed it. If its ctime (the agent's, now, or the probe's, when it hashed it)
      is before the process started, it held those bytes all along; later, it may have held
      others when it was imported (a file rewritten between the import and the probe's hash,
      with its size and mtime put back or not, has a ctime after the start). PATH_NS: the
      latest ctime of a symbolic link on the way to it (``pathchange``: a link flipped to an
      older file), likewise.
    * An extension module is hashed by the sweeper after it was loaded: an identity then
      (``identity``) other than at load (``loaded``) means other bytes may have been hashed.
    * A file read at load (``load``: the bytes the import system read, hashed) proves what
      ran whatever happens to the file afterwards: nothing to say.

    Whether the answer is an error is ``waived``'s to say."""
    why = None
    if f.at in AFTER_THE_FACT or unfiled.ran_before_hashed(f):
        ctimes = [c for c in (now[4] if now else None, _ctime(f.identity)) if c is not None]
        after = max(ctimes) / 1e9 - start_time if ctimes else 0.0
        moved = path_ns / 1e9 - start_time if path_ns is not None else 0.0
        if after > CHANGED_SLACK_S:
            why = (
                f"{f.path} was hashed after the fact ({f.at}: from disk, after the process had "
                f"read it) and changed (ctime) {after:.3f} s after the process started: the "
                "bytes recorded may not be the bytes it ran"
            )
        elif moved > CHANGED_SLACK_S:
            why = (
                f"{f.path} was hashed after the fact ({f.at}: from disk, after the process had "
                f"read it) and a symbolic link on the way to it was made or replaced {moved:.3f} "
                "s after the process started: the path may lead to another file than the one "
                "it ran"
            )
    elif f.kind == "extension" and f.loaded and f.identity and f.loaded != f.identity:
        why = (
            f"{f.path} was hashed by the probe's sweeper after it was loaded, and was "
            f"another file or changed by then ({_describe(f.loaded)} when loaded, "
            f"{_describe(f.identity)} when hashed): the bytes recorded may not be the "
            "bytes it ran"
        )
    return why


def waived(f: FileEntry, generated: Sequence[str] | places.GeneratedFiles) -> bool:
    """Whether a change after the start of F (``changed_after``) is no error: F lies under
    the process's compile caches and temporary directories (GENERATED) and no RECORD row
    claims it, so the process itself wrote it there after it started, as a rule (torch
    inductor's modules, Triton's launchers). Not waived silently: the process names those
    directories (``TMPDIR=/``), so the change is still said (``provenance.file.changed_in_cache``,
    INFO), and a policy that pins F's bytes cannot be satisfied by its recorded hash. A
    ``.pth`` file or a main script is never waived, wherever it lies."""
    return (
        bool(generated)
        and not unfiled.ran_before_hashed(f)
        and places.is_generated(f.path, generated)
    )


def _ctime(i: FileIdentity | None) -> int | None:
    return i.ctime_ns if i is not None else None


def _describe(i: FileIdentity) -> str:
    return f"inode {i.ino}, {i.size} bytes, ctime {i.ctime_ns / 1e9:.3f}"


def context(
    procfs: ProcFS,
    pid: int,
    probe: ProbeState,
    stdlib: tuple[str, ...] | None = None,
    environ: Mapping[str, str] | None = None,
) -> origins.Context:
    """Where the process's standard library (STDLIB, else ``stdlib_dirs``), caches and
    sys.path entries are. ENVIRON: the environment it was started with, if already read
    (``started_environment``)."""
    listed = probe.interp.get("path")  # written by the process: a list of strings, or anything
    path = [p for p in listed if isinstance(p, str) and p] if isinstance(listed, list) else []
    environ = started_environment(procfs, pid) if environ is None else environ
    return origins.Context(
        stdlib_dirs=stdlib_dirs(procfs, pid, probe, environ)[0] if stdlib is None else stdlib,
        generated_dirs=places.generated_dirs(environ),
        site_dirs=tuple(path),
        import_dirs=import_dirs(probe, environ),
    )


def import_dirs(probe: ProbeState, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The directories the process imports modules from by name: every ``sys.path`` its
    probe recorded (``ProbeState.import_path``: an entry removed since still counts) and the
    ``PYTHONPATH`` it was started with, an empty or relative entry taken against the working
    directory of the probe's first record (``""`` means that directory)."""
    started = (
        places.import_entry(e, probe.start_cwd) for e in environ.get("PYTHONPATH", "").split(":")
    )
    return tuple(dict.fromkeys([*probe.import_path, *filter(None, started)]))


def generated_dirs(procfs: ProcFS, pid: int) -> tuple[str, ...]:
    """The process's compile-cache and temporary directories, from the environment it was
    started with (``places.generated_dirs``; the defaults when none can be read)."""
    return places.generated_dirs(started_environment(procfs, pid))


def started_environment(procfs: ProcFS, pid: int) -> dict[str, str]:
    """The environment PID was started with: ``/proc/<pid>/environ``, unless the process
    reused that block for its title. vLLM names its engine and worker processes with
    setproctitle, which on Linux writes the title over the argv+environ block and pads it
    with NULs, leaving any variables after the first one set before the call
    (``procfs.environ_overwritten``): such a block may still hold ``PATH`` but not ``HOME``.
    Such a process runs with the environment its parent handed down (vLLM starts them with
    multiprocessing, which passes it on), so the nearest ancestor whose block is intact and
    holds ``PATH`` or ``HOME`` stands in. Read from the retitled block instead, a
    worker's ``$HOME`` caches (vLLM's and Triton's) would be unknown to the agent and every
    kernel compiled there after the start a library "rewritten in place". The walk stays in
    PID's PID namespace: a container's first process gets its environment from the runtime,
    not from its parent on the host (the runtime's shim), whose environment is the host's.
    Empty when nothing can be read."""
    seen: set[int] = set()
    try:
        ns = procfs.pid_ns(pid)
    except (UnavailableError, OSError):
        ns = None
    while pid > 0 and pid not in seen and len(seen) < 16:
        seen.add(pid)
        try:
            environ = procfs.environ_as_started(pid)
            if environ is not None and ("PATH" in environ or "HOME" in environ):
                return environ
            parent = procfs.identity(pid).ppid
            if parent > 0 and procfs.pid_ns(parent) != ns:
                break  # the PID namespace's first process: nothing handed down from outside
        except (UnavailableError, OSError):  # gone, or not readable
            break
        pid = parent
    return {}


def _to_host(procfs: ProcFS, pid: int) -> Callable[[str], Path]:
    def to_host(path: str) -> Path:
        return procfs.in_root(pid, path)

    return to_host


def _to_host_str(procfs: ProcFS, pid: int) -> Callable[[str], str]:
    def to_host(path: str) -> str:
        return procfs.in_root_str(pid, path)

    return to_host


def dist_index(procfs: ProcFS, pid: int, sites: Sites | None = None) -> DistIndex:
    """An index of the distributions installed as PID sees its filesystem. SITES: sites
    parsed for other processes, shared with those that see the same filesystem (``view_of``;
    none when PID's view cannot be read)."""
    view = view_of(procfs, pid) if sites is not None else None
    return DistIndex(_to_host(procfs, pid), sites, view)


def view_of(procfs: ProcFS, pid: int) -> tuple[str, int, int] | None:
    """What PID sees its files through: its mount namespace and the device and inode of its
    root directory. Two processes with the same view read the same bytes at the same path.
    None when either cannot be read (the process is gone, or not ours to read)."""
    where = procfs.root / str(pid)
    try:
        ns = os.readlink(where / "ns" / "mnt")
        st = os.stat(where / "root")
    except OSError:
        return None
    return ns, st.st_dev, st.st_ino


def judge(
    procfs: ProcFS,
    pid: int,
    probe: ProbeState,
    files: tuple[FileEntry, ...],
    hasher: Hasher,
    *,
    start_time: float,
    index: DistIndex | None = None,
    reuse: Judgement | None = None,
    native: Sequence[NativeMapping] | None = None,
    verdicts: VerdictStore | None = None,
    stdlib: tuple[str, ...] | None = None,
    environ: Mapping[str, str] | None = None,
    disk_checked: bool = False,
) -> Judgement:
    """Everything above for one process. Never raises on odd files: each problem is a
    disagreement or a drift with its reason. INDEX: reuse one made by ``dist_index`` for the
    same process, so RECORD files are parsed once. REUSE: an earlier judgement of the same
    process, whose manifest-only part is kept if the manifest and the native mappings are
    unchanged, and whose vouched files stay vouched (``cross_check``). NATIVE: the process's
    native mappings, if already read (else read here: the hasher's cache answers for the
    inodes already hashed). VERDICTS: compile outcomes kept across agent restarts
    (``bytecode.judge_bytecode``). STDLIB: the standard library directories, if already
    confirmed (``stdlib_dirs``); ENVIRON: the environment it was started with, if already
    read (``started_environment``). DISK_CHECKED: the caller found REUSE's disk unchanged
    (``inputs.unchanged``) just now: not checked again."""
    hashed_at = probe.hashed_at
    ctx = context(procfs, pid, probe, stdlib, environ)
    index = index or DistIndex(_to_host(procfs, pid))
    generated = places.GeneratedFiles(ctx.generated_dirs, index, ctx.stdlib_dirs)
    vouched = set(reuse.vouched) if reuse is not None else set()
    disagreements, drift = cross_check(
        procfs,
        pid,
        files,
        hasher,
        start_time=start_time,
        hashed_at=hashed_at,
        generated=generated,
        vouched=vouched,
    )
    members = [f for f in files if f.kind == unfiled.MEMBER]
    more, moved = unfiled.check_members(
        procfs, pid, members, start_time=start_time, hashed_at=hashed_at, slack=START_SLACK_S
    )
    disagreements += more + unfiled.check_inline(
        procfs, pid, [f for f in files if f.kind == unfiled.INLINE]
    )
    drift += moved
    if native is None:
        native = native_mappings(procfs, pid, hasher, start_time=start_time, generated=generated)
    key = (statickey.static_digest(files, probe, ctx), statickey.native_digest(native))
    if (
        reuse is not None
        and reuse.static_key == key
        and (disk_checked or inputs.unchanged(reuse.disk, _to_host_str(procfs, pid)))
    ):
        provenance, static = reuse.provenance, list(reuse.static_drift)
        owners, disk = reuse.owners, reuse.disk
    else:
        provenance, static, sources = _static(
            procfs, pid, probe, files, index, ctx=ctx, native=native, verdicts=verdicts
        )
        owners = chain_owners(probe, index)
        # after everything the static part and the owners read: the index's reads, and the
        # sources the pycs were compared with
        disk = tuple(sorted({*index.inputs(), *sources}))
    # Read from the disk on every full check, never kept: whether a module's claimed file
    # exists, what a .pth file holds
    ran = _ran(files)
    drift += static + recheck.fileless(procfs, pid, probe)
    drift += recheck.installer_changed(procfs, pid, disk, start_time)
    if provenance is not None:
        drift += unfiled.pth_drift(procfs, pid, ran, provenance)
    drift.sort(key=lambda d: (d.id, d.path))
    return Judgement(
        tuple(disagreements),
        provenance,
        tuple(drift),
        key,
        tuple(static),
        frozenset(vouched),
        owners,
        disk,
    )


def _ran(files: Sequence[FileEntry]) -> tuple[FileEntry, ...]:
    """FILES that ran: a pyc its loader read and rejected did not; -c code is no file."""
    return tuple(f for f in files if f.at != "rejected" and f.kind != unfiled.INLINE)


def chain_owners(probe: ProbeState, index: DistIndex) -> tuple[tuple[str, str | None], ...]:
    """(path, distribution) of each code chain's owner file: the distribution whose RECORD
    lists it (``DistIndex.claim``), None when none does or its RECORDs cannot be read."""
    out: dict[str, str | None] = {}
    for chain in probe.code:
        path = chain.owner_file
        if path and path not in out:
            try:
                claim = index.claim(path)
            except (OSError, ValueError):
                claim = None
            out[path] = claim.distribution if claim is not None else None
    return tuple(out.items())


def record_faults(index: DistIndex) -> list[Drift]:
    """One drift per installer file the index could not read or parse (``RECORD``,
    ``METADATA``, ``direct_url.json``, a site directory): the files it speaks for cannot be
    judged against it, so a patched file could pass as ``unknown``."""
    seen: set[tuple[str, str]] = set()
    out: list[Drift] = []
    for f in index.faults:
        if (f.path, f.detail) not in seen:
            seen.add((f.path, f.detail))
            out.append(Drift(DRIFT_RECORD_UNREADABLE, f.path, None, f.detail))
    return out


def _static(
    procfs: ProcFS,
    pid: int,
    probe: ProbeState,
    files: tuple[FileEntry, ...],
    index: DistIndex,  # judge's: made before the cross-check, which asks it too
    *,
    ctx: origins.Context,
    native: Sequence[NativeMapping] = (),
    verdicts: VerdictStore | None = None,
) -> tuple[Provenance, list[Drift], tuple[inputs.Input, ...]]:
    to_host = _to_host(procfs, pid)
    ran = _ran(files)
    version = probe.interp.get("version")  # written by the process: a string, or anything
    python = version if isinstance(version, str) else None
    code = bytecode.judge_bytecode(ran, to_host, python=python, verdicts=verdicts)
    inline = [f for f in files if f.kind == unfiled.INLINE]
    provenance, drift = origins.classify(ran, index, ctx, native, code.compiled_from, inline=inline)
    drift += code.drift
    drift += record_faults(index)
    drift += unfiled.unfiled_drift(probe.unfiled, ran, provenance, ctx.stdlib_dirs)
    return provenance, drift, code.reads
