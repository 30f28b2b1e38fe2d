"""Evaluate registered runs over the latest evidence of every target."""

from __future__ import annotations

import dataclasses
import threading

from verifier import wire
from verifier.model import FileEntry, RunVerdict, TargetReport
from verifier.policy import Policy, PolicyError, evaluate_run, load_policy, refused_run
from verifier.policy.interface import TargetSnapshot
from verifier.server.store import RunRecord, Store


class Evaluator:
    """Caches parsed policies and manifests by digest, and every target's latest snapshot
    (loaded from the store once, then kept current by ``note`` on each ingest), so evaluating
    never scans or decodes stored reports."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._policies: dict[str, Policy | PolicyError] = {}
        self._manifests: dict[str, tuple[FileEntry, ...]] = {}
        self._latest: dict[str, TargetSnapshot] | None = None
        self._lock = threading.Lock()

    def policy(self, run: RunRecord) -> Policy | PolicyError:
        """RUN's parsed policy, or why this verifier refuses it: a run stored by an earlier
        verifier (or before its rules refused weak policies) may hold one that no longer
        loads, which is a verdict (``policy.refused``), not an internal error."""
        pol = self._policies.get(run.policy_digest)
        if pol is None:
            try:
                pol = load_policy(run.policy_toml, run.source)
            except PolicyError as e:
                pol = e
            self._policies[run.policy_digest] = pol
        return pol

    def _manifest(self, digest: str | None) -> tuple[FileEntry, ...]:
        if digest is None:
            return ()
        got = self._manifests.get(digest)
        if got is None:
            got = self.store.get_manifest(digest) or ()
            self._manifests[digest] = got
        return got

    def _snapshot(
        self, report: TargetReport, received_unix: float, authenticated_as: str | None
    ) -> TargetSnapshot:
        procs = tuple(
            p
            if p.files is not None
            else dataclasses.replace(p, files=self._manifest(p.manifest_digest))
            for p in report.processes
        )
        containers = tuple(sorted({p.container_id for p in procs if p.container_id}))
        return TargetSnapshot(
            report.target,
            procs,
            received_unix,
            containers,
            report.collect_s,
            report.containers,
            report.unobservable,
            authenticated_as,
        )

    def _load(self) -> dict[str, TargetSnapshot]:
        # Evidence stored before this verifier started: how it was authenticated is not known
        # now, so it counts as unauthenticated until its target reports again.
        return {
            s.target: self._snapshot(wire.report_from_bytes(s.report), s.received_unix, None)
            for s in self.store.latest_reports()
        }

    def note(
        self, report: TargetReport, received_unix: float, authenticated_as: str | None = "local"
    ) -> None:
        """A report was stored: it is now its target's latest evidence."""
        snap = self._snapshot(report, received_unix, authenticated_as)
        with self._lock:
            if self._latest is None:
                self._latest = self._load()
            self._latest[report.target] = snap

    def snapshots(self) -> list[TargetSnapshot]:
        with self._lock:
            if self._latest is None:
                self._latest = self._load()
            return [self._latest[t] for t in sorted(self._latest)]

    def run_verdict(
        self, run: RunRecord, now: float, snaps: list[TargetSnapshot] | None = None
    ) -> RunVerdict:
        pol = self.policy(run)
        if isinstance(pol, PolicyError):
            return refused_run(run.name, run.policy_digest, pol, now)
        snaps = self.snapshots() if snaps is None else snaps
        return evaluate_run(run.name, pol, run.policy_digest, snaps, now)
