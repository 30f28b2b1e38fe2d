"""What the agent remembers of each process it judged, from one collect to the next and, for
the static part of each judgement and the compile verdicts, across its own restarts.

A process's manifest files are judged in full when its manifest changed or every
``recheck_s``; in between, the last judgement is reused (the runner file is re-hashed on every
report). The static part (origins, shadowing, bytecode: ``judge.Judgement.static_key``) is
reused while the manifest and the native mappings' bytes stay the same, by a running agent
from its memory and by a restarted one from its judgement store
(``evidence/judgements.py``); a process that is gone is forgotten.
"""

from __future__ import annotations

import dataclasses
import time

import structlog

from servewitness.agent.config import AgentConfig
from servewitness.errors import UnavailableError
from servewitness.evidence import inputs
from servewitness.evidence.distindex import DistIndex, Sites
from servewitness.evidence.hashing import Hasher
from servewitness.evidence.judge import Judgement, dist_index, view_of
from servewitness.evidence.judgements import FILENAME as JUDGEMENTS_FILE
from servewitness.evidence.judgements import JudgementStore
from servewitness.evidence.native import NativeMemory
from servewitness.evidence.process import ProcessEvidence, still_running
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.report import report_with_judgement
from servewitness.evidence.stacks import Witnesses
from servewitness.evidence.verdicts import FILENAME as VERDICTS_FILE
from servewitness.evidence.verdicts import VerdictStore
from servewitness.model import ProcessKey, ProcessReport

log = structlog.get_logger(__name__)


class Judged:
    """The agent's memory of the processes it judged (CONFIG: where its state directory is,
    which stores are on, how often every file is re-hashed)."""

    def __init__(self, config: AgentConfig, procfs: ProcFS) -> None:
        self.procfs = procfs
        self.recheck_s = config.recheck_s
        self.hasher = Hasher()  # its cache makes re-hashing unchanged files a stat each
        # (pid, start ticks) -> (manifest digest, when, judgement) of the last full check
        self._checked: dict[tuple[int, int], tuple[str | None, float, Judgement]] = {}
        self._indexes: dict[tuple[int, int], DistIndex] = {}  # RECORDs parsed once per process
        # ... and once per collect for all the processes that see the same files (each collect
        # a new one: a process started later reads the RECORDs as they are then)
        self._sites = Sites()
        self._disk: dict[object, dict[inputs.Input, bool]] = {}  # new_collect's
        # The mapped bytes first seen per process and native mapping (changed in place)
        self.natives = NativeMemory()
        self.witnesses = Witnesses()  # py-spy stack samples of step-running processes
        state = config.spool_dir
        # pyc compile outcomes by content: a restarted agent compiles only what changed
        self.verdicts = VerdictStore(state / VERDICTS_FILE if config.compile_cache else None)
        # each process's static judgement: a restarted agent reuses it where a running one would
        self.judgements = JudgementStore(
            state / JUDGEMENTS_FILE if config.judgement_cache else None
        )

    def new_collect(self) -> None:
        """A collect begins: the sites its processes index are parsed as they are now, and
        whether the disk a judgement read is the same is found once per file and view."""
        self._sites = Sites()
        self._disk = {}

    def report(self, ev: ProcessEvidence) -> ProcessReport | None:
        """EV's report, judged in full or from what is remembered (see the module's doc).
        None when the process exited while it was being read: files that vanished with it
        are not evidence of anything, and the next collect reports it gone."""
        digest = ev.probe.manifest_digest if ev.probe else None
        ident = ev.identity
        key = (ident.pid, ident.start_ticks)
        last = self._checked.get(key)
        now = time.monotonic()
        fresh = last is not None and last[0] == digest and now - last[1] < self.recheck_s
        kept = (ident.boot_id, ident.pid, ident.start_ticks)
        # a restarted agent: the static part its last run kept (checked by its key)
        reuse = last[2] if last else self.judgements.get(kept)
        index = self._indexes.get(key)
        if reuse is not None and not fresh and not self._same_disk(ident.pid, reuse):
            reuse = None  # what it read changed: judged afresh, by an index that reads it now
            index = None
        if index is None:
            index = self._indexes[key] = dist_index(self.procfs, ident.pid, self._sites)
        index.sites = self._sites  # sites it indexes later: parsed as they are then
        try:
            report, judged = report_with_judgement(
                self.procfs,
                ev,
                self.hasher,
                previous=last[2] if fresh and last else None,
                index=index,
                reuse=reuse,
                memory=self.natives,
                verdicts=self.verdicts,
                disk_checked=True,
            )
        except (UnavailableError, OSError) as e:
            if still_running(self.procfs, ev):
                raise
            log.info("process_exited_mid_scan", pid=ident.pid, error=str(e))
            return None
        if not still_running(self.procfs, ev):
            log.info("process_exited_mid_scan", pid=ident.pid)
            return None
        if not fresh and judged is not None:
            self._checked[key] = (digest, now, judged)
            self.judgements.keep(kept, judged)
        if report.runner is not None and report.steps is not None:
            witness = self.witnesses.observe(key, ident.pid, report.steps.total, report.runner.file)
            report = dataclasses.replace(report, stack_witness=witness)
        return report

    def _same_disk(self, pid: int, judged: Judgement) -> bool:
        """Whether what JUDGED read from the disk would read the same now (the processes of
        one view, in one collect, share the answers)."""
        view = view_of(self.procfs, pid)
        memo = self._disk.setdefault(view, {}) if view is not None else None
        return inputs.unchanged(judged.disk, lambda path: self.procfs.in_root_str(pid, path), memo)

    def forget(self, keys: set[ProcessKey]) -> None:
        """Forget every process but KEYS (those the collect reported), and write the
        judgement store if it changed."""
        self.judgements.retain((k.boot_id, k.pid, k.start_ticks) for k in keys)
        self.judgements.save()
        self.verdicts.save()  # (what the code chains' files answered is kept there too)
        alive = {(k.pid, k.start_ticks) for k in keys}
        for cache in (self._checked, self._indexes):
            for stale in [k for k in cache if k not in alive]:
                del cache[stale]
        self.witnesses.forget(alive)
        self.natives.forget(keys)
