"""Which processes the agent reports: every vLLM process it can see (under ``--pid`` if
given), and the ones ``/proc`` would not let it read, named rather than dropped."""

from __future__ import annotations

import os
from pathlib import PurePosixPath

from servewitness.errors import NotPythonProcess, ProcessAccessDenied, UnavailableError
from servewitness.evidence.journal import JournalCache
from servewitness.evidence.process import ProcessEvidence, read_process, state_dir_names
from servewitness.evidence.procfs import ProcFS


def is_vllm_candidate(ev: ProcessEvidence) -> bool:
    """A process the agent reports: it has a probe, or its command line names vLLM, or probe
    state was planted under its name (refused: said, not dropped, whatever it runs)."""
    if ev.probe is not None or ev.unbound:
        return True
    return any("vllm" in a.lower() for a in ev.identity.cmdline)


def discover(
    procfs: ProcFS,
    root_pid: int | None = None,
    cache: JournalCache | None = None,
    refused: list[str] | None = None,
) -> list[ProcessEvidence]:
    """Every vLLM process visible (under ROOT_PID if given), the agent itself excluded.
    CACHE: keep parsed probe journals between calls (only appended records are read).
    REFUSED: where to note the vLLM processes /proc would not let the agent read (they would
    otherwise vanish from the report as if they did not exist)."""
    pids = procfs.descendants(root_pid) if root_pid else sorted(procfs.parents())
    out = []
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            ev = read_process(procfs, pid, cache)
        except (ProcessAccessDenied, PermissionError) as e:
            # The process named with --pid is noted whatever its command line: it was asked for.
            what = "(--pid)" if pid == root_pid else "looks like vLLM"
            if refused is not None and (pid == root_pid or _names_vllm(procfs, pid)):
                refused.append(
                    f"pid {pid} {what} but /proc refused to show it ({e}): the agent "
                    "needs SYS_PTRACE and to run as the same user (root) in the process's "
                    "PID namespace"
                )
            continue
        except NotPythonProcess:
            # Not named as CPython (executable, libpython): a process that maps its own
            # probe's counters runs the probe, so it is Python whatever its files are named.
            anyway = _probed_anyway(procfs, pid, cache, refused)
            if anyway is None:
                continue
            ev = anyway
        except (UnavailableError, OSError, ValueError):
            continue
        except Exception as e:  # noqa: BLE001 - what the workload wrote must not end the agent
            # A process's own files (its journal above all) are the workload's to write: an
            # error nothing above expects is said as what could not be seen, never dropped,
            # and the other processes are still read.
            if refused is not None:
                refused.append(
                    f"pid {pid}: its evidence could not be read ({type(e).__name__}: "
                    f"{str(e)[:200]}); not reported"
                )
            continue
        if is_vllm_candidate(ev):
            out.append(ev)
    return out


class _TakenForPython(ProcFS):
    """PROCFS's tree, with PID taken for a CPython process (``_probed_anyway``)."""

    def __init__(self, procfs: ProcFS, pid: int) -> None:
        super().__init__(procfs.root)
        self._inner, self._pid = procfs, pid

    def is_python(self, pid: int) -> bool:
        return pid == self._pid or self._inner.is_python(pid)


def own_probe_counters(procfs: ProcFS, pid: int) -> str | None:
    """The path of the probe counters PID maps under its own state directory's name (the
    probe runs in it), or None."""
    try:
        names = set(state_dir_names(procfs, procfs.identity(pid)))
        maps = procfs.maps(pid)
    except (UnavailableError, OSError, ValueError):
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        path = PurePosixPath(fields[5].removesuffix(" (deleted)"))
        if path.name == "counters" and path.parent.name in names:
            return str(path)
    return None


def _probed_anyway(
    procfs: ProcFS, pid: int, cache: JournalCache | None, refused: list[str] | None
) -> ProcessEvidence | None:
    """PID's evidence, read as a Python process's, when PID is not named as CPython but maps
    its own probe's counters: an interpreter renamed (its executable, its libpython) still
    runs the probe, and must not vanish from the report. None when it does not map them (not
    Python: not the agent's); said in REFUSED when it does and cannot be read."""
    held = own_probe_counters(procfs, pid)
    if held is None:
        return None
    try:
        return read_process(_TakenForPython(procfs, pid), pid, cache)
    except Exception as e:  # noqa: BLE001 - said, never dropped, never the agent's end
        if refused is not None:
            refused.append(
                f"pid {pid} maps its probe's counters ({held}) but its interpreter is not "
                f"named as CPython, and its evidence could not be read ({type(e).__name__}: "
                f"{str(e)[:200]}); not reported"
            )
        return None


def _names_vllm(procfs: ProcFS, pid: int) -> bool:
    """Whether PID's command line (readable without ptrace rights) mentions vLLM."""
    try:
        cmdline = (procfs.root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False
    return b"vllm" in cmdline.lower()
