"""Which container a target's evidence came from, against the one the run binds it to.

A hash taken in a container that is not the serving one proves nothing about the serving
process, so a binding (``[targets.containers]``) turns evidence from anywhere else into an
ERROR. A binding by id prefix is checked from the cgroup alone; a binding by name or label
needs the Docker API on the agent's side, and without it the answer is PENDING, never PASS.
"""

from __future__ import annotations

import re

from verifier.model import ContainerInfo, Finding, ProcessReport, Severity
from verifier.policy import interface as I

_ID_PREFIX = re.compile(r"[0-9a-f]{12,64}")
_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")


def spec_error(spec: str) -> str | None:
    """Why SPEC is not a container binding, or None."""
    if spec.startswith("label:"):
        key, eq, _ = spec[len("label:") :].partition("=")
        return None if key and eq else "a label binding is label:KEY=VALUE"
    if _ID_PREFIX.fullmatch(spec) or _NAME.fullmatch(spec):
        return None
    return "not a container name, an id prefix (12 to 64 hex digits) or label:KEY=VALUE"


def _matches(spec: str, cid: str, info: ContainerInfo | None) -> bool | None:
    """Whether container CID (described by INFO) is SPEC's; None: cannot tell without Docker."""
    if _ID_PREFIX.fullmatch(spec) and cid.startswith(spec):
        return True
    named = info is not None and info.name is not None
    if spec.startswith("label:"):
        key, _, value = spec[len("label:") :].partition("=")
        return (info.label(key) == value) if named and info is not None else None
    if named and info is not None:
        return info.name == spec
    return False if _ID_PREFIX.fullmatch(spec) else None


def _where(p: ProcessReport) -> dict[str, object]:
    return {"pid": p.key.pid, "role": p.role, "rank": p.rank}


def container_findings(spec: str, snap: I.TargetSnapshot) -> list[Finding]:
    """Every process of SNAP must run in the container SPEC names."""
    infos = {c.id: c for c in snap.containers}
    out: list[Finding] = []
    for p in snap.processes:
        cid = p.container_id or ""
        info = infos.get(cid)
        ok = _matches(spec, cid, info) if cid else False
        if ok:
            continue
        got = {"container_id": cid or None, "name": info.name if info else None}
        if ok is None:
            why = (info.docker_error if info else None) or "the agent sent no Docker API data"
            out.append(
                Finding(
                    I.EVIDENCE_CONTAINER_UNKNOWN,
                    Severity.PENDING,
                    f"target {snap.target} is bound to container {spec!r}, and pid {p.key.pid} "
                    f"runs in container {cid[:12]} whose name and labels are unknown: {why}",
                    snap.target,
                    {**_where(p), "expected": spec, **got, "why": why},
                )
            )
            continue
        where = f"container {cid[:12]}" + (f" ({info.name})" if info and info.name else "")
        out.append(
            Finding(
                I.EVIDENCE_CONTAINER_MISMATCH,
                Severity.ERROR,
                f"target {snap.target} is bound to container {spec!r}, but pid {p.key.pid} "
                f"({p.role}) runs in {where if cid else 'no container'}: evidence from another "
                "container says nothing about the serving one",
                snap.target,
                {**_where(p), "expected": spec, **got},
            )
        )
    return out


def unobservable_findings(snap: I.TargetSnapshot) -> list[Finding]:
    return [
        Finding(
            I.EVIDENCE_UNOBSERVABLE,
            Severity.PENDING,
            f"target {snap.target} is not fully observable: {why}",
            snap.target,
            {"why": why},
        )
        for why in snap.unobservable
    ]
