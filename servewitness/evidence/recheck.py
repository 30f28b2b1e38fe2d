"""What a process's judgement checks on every full check, never kept with its static part
(``judge.judge``): the disk as it is now, where the workload could have staged it for the
moment of a judgement and put it back after (found by an attacker who had not read this code,
2026-12-06)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from servewitness.evidence import inputs
from servewitness.evidence.probe_reader import ProbeState
from servewitness.evidence.procfs import CHANGED_SLACK_S, ProcFS
from servewitness.model import DRIFT_MODULE_FILELESS, DRIFT_RECORD_CHANGED_AFTER_START, Drift


def fileless(procfs: ProcFS, pid: int, probe: ProbeState) -> list[Drift]:
    """Modules the probe saw claiming a file that the agent, too, finds missing."""
    out = []
    for module, claimed in probe.fileless:
        if os.path.lexists(procfs.in_root_str(pid, claimed)):
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


def installer_changed(
    procfs: ProcFS, pid: int, disk: Sequence[inputs.Input], start_time: float
) -> list[Drift]:
    """One drift per installer file the judgement read (``RECORD``, ``METADATA``,
    ``direct_url.json``: DISK's files) whose ctime, now, is after the process started: what
    the loaded files were judged against changed while they ran. A row forged to match a
    patched file the process had loaded, and a forged file put back after the agent read it,
    both move the ctime, which no unprivileged process can set back. Checked on every full
    check, whether the judgement was made now or reused: a file whose identity was taken
    (just before it was read, or found the same again by ``inputs.unchanged``) has that
    ctime; one kept as absent or changing is looked at now."""
    out = []
    for path, kind, ident, _ in disk:
        if kind != inputs.FILE:
            continue
        if len(ident) == 5:  # its identity is the one now: the judgement was made or reused
            ctime = ident[4] / 1e9  # just now (``inputs.unchanged``)
        else:
            try:
                ctime = os.stat(procfs.in_root_str(pid, path)).st_ctime_ns / 1e9
            except (OSError, ValueError):
                continue  # gone or unreadable: a re-judgement says so (record.unreadable)
        after = ctime - start_time
        if after > CHANGED_SLACK_S:
            out.append(
                Drift(
                    DRIFT_RECORD_CHANGED_AFTER_START,
                    path,
                    None,
                    f"{path} changed (ctime) {after:.3f} s after the process started: the "
                    "files it loaded are judged against what it says now, which is not what "
                    "it said when they were loaded",
                )
            )
    return out
