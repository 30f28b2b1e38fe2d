"""The agent's judgement of one process's loaded files, from outside the process.

Everything here reads the files as the process sees them (``/proc/<pid>/root/…``), never
trusting the probe's report alone:

* **cross-check**: every file the probe hashed is hashed again; other bytes are either a
  file *modified after load* (its ctime is later than the process's start, so it changed
  while the process ran) or a *disagreement* between the two vantage points (the probe's
  record and the file as the agent sees it cannot both be right);
* **origins**: each file's provenance class against its distribution's ``RECORD``
  (``origins.py``), native libraries (hashed as mapped) included, and shadowed modules;
  an installer's file (``RECORD``, ``METADATA``, ``direct_url.json``) that could not be read
  is drift too (``provenance.record.unreadable``): what it would have said is unknown;
* **bytecode**: ``.pyc`` files the interpreter used that do not correspond to their source
  (``bytecode.py``);
* **fileless modules**: modules the probe saw claiming a file that does not exist;
* **code from no plain file** (``unfiled.py``): zip members read again from their archive,
  ``-c`` code against the command line, ``.pth`` files that execute code, modules custom
  loaders executed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from verifier.errors import UnavailableError
from verifier.evidence import bytecode, origins, unfiled
from verifier.evidence.distindex import DistIndex
from verifier.evidence.hashing import Hasher
from verifier.evidence.native import native_mappings
from verifier.evidence.probe_reader import ProbeState
from verifier.evidence.procfs import ProcFS
from verifier.model import (
    DRIFT_MODIFIED_AFTER_LOAD,
    DRIFT_MODULE_FILELESS,
    DRIFT_RECORD_UNREADABLE,
    Drift,
    FileDisagreement,
    FileEntry,
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
    # (origins, shadowing, bytecode, fileless and unfiled modules, .pth files), and the
    # (manifest digest, fileless count, native mappings digest, unfiled count) it was judged
    # for: reused while those stay the same; the cross-check is redone on every full check.
    static_key: tuple[str, int, str, int] | None = None
    static_drift: tuple[Drift, ...] = ()


# /proc gives a process's start in clock ticks after a boot time in whole seconds: without
# the probe's own hashing time, "changed after the process started" allows this much slack.
START_SLACK_S = 1.0
# ... and with the start read to a clock tick (``ProcFS.started_at``, within 10 ms), this
# much: a file written just before the process started is not taken for one changed after it.
# (Site runs the .pth files 10 to 60 ms after the start: a .pth that rewrites itself as it
# runs can land inside it; docs/threat-model.md.)
TICK_SLACK_S = 0.03


def cross_check(
    procfs: ProcFS,
    pid: int,
    files: tuple[FileEntry, ...],
    hasher: Hasher,
    *,
    start_time: float,
    hashed_at: Mapping[str, float] | None = None,
    started_at: float | None = None,
) -> tuple[list[FileDisagreement], list[Drift]]:
    """Re-hash every manifest file the probe hashed, as the process sees it. A file with other
    bytes now whose ctime is after the probe hashed it (HASHED_AT: path -> unix time; else
    after the process started) changed while it ran: drift. Any other difference, or a file
    the agent cannot read, is a disagreement. A pyc its loader read and rejected never ran:
    the loader compiled the source (which is checked) and, where the directory is writable,
    replaced that pyc with a fresh one, so its bytes now say nothing about what runs.

    Zip members and ``-c`` code are no files of the process: ``unfiled`` checks them. A file
    the interpreter ran before the probe hashed it (``.pth`` files, a main script hashed
    after it started) that changed after the process started is drift even with the bytes
    the probe recorded: those may not be the bytes that ran (STARTED_AT: when the process
    started, to a clock tick, ``ProcFS.started_at``; else START_TIME with a second's slack)."""
    rejected = {f.path for f in files if f.at == "rejected"}
    recorded = [f for f in files if f.sha256 and f.path not in rejected and unfiled.on_disk(f)]
    seen = hasher.hash_files(str(procfs.in_root(pid, f.path)) for f in recorded)
    hashed_at = hashed_at or {}
    disagreements: list[FileDisagreement] = []
    drift: list[Drift] = []
    since_start = start_time + START_SLACK_S if started_at is None else started_at + TICK_SLACK_S
    started = int(since_start * 1e9)
    for f, h in zip(recorded, seen, strict=True):
        if h.sha256 == f.sha256:
            if unfiled.ran_before_hashed(f) and h.key is not None and h.key[4] > started:
                drift.append(
                    Drift(
                        DRIFT_MODIFIED_AFTER_LOAD,
                        f.path,
                        f.module,
                        f"{f.path} changed (ctime) after the process started, and the "
                        "interpreter ran it before the probe hashed it: the bytes that ran "
                        "may not be the ones recorded",
                    )
                )
            continue
        since = hashed_at.get(f.path, start_time + START_SLACK_S)
        if h.sha256 is not None and h.key is not None and h.key[4] > int(since * 1e9):
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


def fileless(procfs: ProcFS, pid: int, probe: ProbeState) -> list[Drift]:
    """Modules the probe saw claiming a file that the agent, too, finds missing."""
    out = []
    for module, claimed in probe.fileless:
        if os.path.lexists(procfs.in_root(pid, claimed)):
            continue  # there now: nothing the agent can confirm
        out.append(
            Drift(
                DRIFT_MODULE_FILELESS,
                claimed,
                module,
                f"module {module} claims to come from {claimed}, which does not exist",
            )
        )
    return out


def context(procfs: ProcFS, pid: int, probe: ProbeState) -> origins.Context:
    """Where the process's standard library, caches and sys.path entries are."""
    interp = probe.interp
    stdlib: list[str] = []
    if isinstance(interp.get("stdlib"), str):
        stdlib.append(interp["stdlib"])
        stdlib.append(os.path.join(interp["stdlib"], "lib-dynload"))
    listed = interp.get("path")  # written by the process: a list of strings, or anything
    path = [p for p in listed if isinstance(p, str) and p] if isinstance(listed, list) else []
    try:
        environ = procfs.environ(pid)
    except (UnavailableError, OSError):  # gone, or not readable: no cache dirs from it
        environ = {}
    return origins.Context(
        stdlib_dirs=tuple(stdlib),
        generated_dirs=origins.generated_dirs(environ),
        site_dirs=tuple(path),
    )


def _to_host(procfs: ProcFS, pid: int) -> Callable[[str], Path]:
    def to_host(path: str) -> Path:
        return procfs.in_root(pid, path)

    return to_host


def dist_index(procfs: ProcFS, pid: int) -> DistIndex:
    """An index of the distributions installed as PID sees its filesystem."""
    return DistIndex(_to_host(procfs, pid))


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
) -> Judgement:
    """Everything above for one process. Never raises on odd files: each problem is a
    disagreement or a drift with its reason. INDEX: reuse one made by ``dist_index`` for the
    same process, so RECORD files are parsed once. REUSE: an earlier judgement of the same
    process, whose manifest-only part is kept if the manifest and the native mappings are
    unchanged. NATIVE: the process's native mappings, if already read (else read here: the
    hasher's cache answers for the inodes already hashed)."""
    hashed_at = probe.hashed_at
    disagreements, drift = cross_check(
        procfs,
        pid,
        files,
        hasher,
        start_time=start_time,
        hashed_at=hashed_at,
        started_at=procfs.started_at(pid),
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
        native = native_mappings(procfs, pid, hasher)
    key = (probe.manifest_digest, len(probe.fileless), _native_digest(native), len(probe.unfiled))
    if reuse is not None and reuse.static_key == key:
        provenance, static = reuse.provenance, list(reuse.static_drift)
    else:
        provenance, static = _static(procfs, pid, probe, files, index, native=native)
    drift += static
    drift.sort(key=lambda d: (d.id, d.path))
    return Judgement(tuple(disagreements), provenance, tuple(drift), key, tuple(static))


def _native_digest(native: Sequence[NativeMapping]) -> str:
    """A digest of which native files are mapped with which bytes."""
    h = hashlib.sha256()
    for m in native:
        h.update(f"{m.path}\0{m.sha256}\n".encode(errors="backslashreplace"))
    return h.hexdigest()


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
    index: DistIndex | None,
    *,
    native: Sequence[NativeMapping] = (),
) -> tuple[Provenance, list[Drift]]:
    to_host = _to_host(procfs, pid)
    index = index or DistIndex(to_host)
    # a pyc its loader read and rejected did not run; -c code is no file to class
    ran = tuple(f for f in files if f.at != "rejected" and f.kind != unfiled.INLINE)
    ctx = context(procfs, pid, probe)
    provenance, drift = origins.classify(ran, index, ctx, native)
    drift += bytecode.check_bytecode(ran, to_host)
    drift += fileless(procfs, pid, probe)
    drift += record_faults(index)
    drift += unfiled.pth_drift(procfs, pid, ran, provenance)
    drift += unfiled.unfiled_drift(probe.unfiled, ran, provenance, ctx.stdlib_dirs)
    return provenance, drift
