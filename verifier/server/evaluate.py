"""Evaluate registered runs over the latest stored evidence."""

from __future__ import annotations

import dataclasses
from typing import Any

from verifier import wire
from verifier.model import FileEntry, RunVerdict, TargetReport
from verifier.policy import Policy, evaluate_run, load_policy
from verifier.policy.interface import TargetSnapshot
from verifier.server.store import RunRecord, Store


def _files(rows: list[dict[str, Any]]) -> tuple[FileEntry, ...]:
    return tuple(FileEntry(**r) for r in rows)


def files_to_rows(files: tuple[FileEntry, ...]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(f) for f in files]


class Evaluator:
    """Caches parsed policies by digest; resolves manifests from the store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._policies: dict[str, Policy] = {}
        self._manifests: dict[str, tuple[FileEntry, ...]] = {}

    def policy(self, run: RunRecord) -> Policy:
        pol = self._policies.get(run.policy_digest)
        if pol is None:
            pol = load_policy(run.policy_toml, run.source)
            self._policies[run.policy_digest] = pol
        return pol

    def _manifest(self, digest: str | None) -> tuple[FileEntry, ...]:
        if digest is None:
            return ()
        got = self._manifests.get(digest)
        if got is None:
            rows = self.store.get_manifest(digest)
            got = _files(rows) if rows is not None else ()
            self._manifests[digest] = got
        return got

    def snapshots(self) -> list[TargetSnapshot]:
        out = []
        for stored in self.store.latest_reports():
            report: TargetReport = wire.report_from_bytes(stored.report)
            procs = tuple(
                p
                if p.files is not None
                else dataclasses.replace(p, files=self._manifest(p.manifest_digest))
                for p in report.processes
            )
            containers = tuple(sorted({p.container_id for p in procs if p.container_id}))
            out.append(TargetSnapshot(report.target, procs, stored.received_unix, containers))
        return out

    def run_verdict(
        self, run: RunRecord, now: float, snaps: list[TargetSnapshot] | None = None
    ) -> RunVerdict:
        pol = self.policy(run)
        snaps = self.snapshots() if snaps is None else snaps
        return evaluate_run(run.name, pol, run.policy_digest, snaps, now)
