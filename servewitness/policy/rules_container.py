"""Which container a target's evidence came from, against the one the run binds it to.

A hash taken in a container that is not the serving one proves nothing about the serving
process, so a binding (``[targets.containers]``) turns evidence from anywhere else into an
ERROR. A binding by id prefix is checked from the cgroup alone; a binding by name needs the
Docker API on the agent's side, a binding by label the Docker API or (Kubernetes) the agent's
own pod's labels, which it gives only to containers that /proc places in its pod
(``servewitness.agent.containers.OwnPod``). Without them the answer is PENDING, never PASS.
"""

from __future__ import annotations

import re

from servewitness.model import ContainerInfo, Finding, ProcessReport, Severity
from servewitness.policy import findings as F
from servewitness.policy import interface as I

# The keys the CRI runtimes label containers with, and the agent gives its pod's containers
# (servewitness.agent.containers; not imported: the policy does not depend on the agent).
POD_NAME_LABEL = "io.kubernetes.pod.name"
POD_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"

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
    """Whether container CID (described by INFO) is SPEC's; None: cannot tell. Its labels are
    known when the Docker API named it, or when it has labels at all (the agent's pod's, in
    Kubernetes: there is no name then, and a name binding cannot be told)."""
    if _ID_PREFIX.fullmatch(spec) and cid.startswith(spec):
        return True
    if spec.startswith("label:"):
        key, _, value = spec[len("label:") :].partition("=")
        if info is None or (info.name is None and not info.labels):
            return None
        return info.label(key) == value
    if info is not None and info.name is not None:
        return info.name == spec
    return False if _ID_PREFIX.fullmatch(spec) else None


def _container(cid: str, info: ContainerInfo | None) -> str:
    """How a message names container CID: its short id, and its name or pod when known."""
    also = []
    if info is not None and info.name:
        also.append(info.name)
    pod = info.label(POD_NAME_LABEL) if info is not None else None
    if pod:
        ns = info.label(POD_NAMESPACE_LABEL) if info is not None else None
        also.append(f"pod {ns}/{pod}" if ns else f"pod {pod}")
    elif info is not None and info.pod_uid:
        also.append(f"pod {info.pod_uid}")
    return f"container {cid[:12]}" + (f" ({', '.join(also)})" if also else "")


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
                    F.EVIDENCE_CONTAINER_UNKNOWN,
                    Severity.PENDING,
                    f"target {snap.target} is bound to container {spec!r}, and pid {p.key.pid} "
                    f"runs in container {cid[:12]} whose name and labels are unknown: {why}",
                    snap.target,
                    {**_where(p), "expected": spec, **got, "why": why},
                )
            )
            continue
        where = _container(cid, info)
        out.append(
            Finding(
                F.EVIDENCE_CONTAINER_MISMATCH,
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
            F.EVIDENCE_UNOBSERVABLE,
            Severity.PENDING,
            f"target {snap.target} is not fully observable: {why}",
            snap.target,
            {"why": why},
        )
        for why in snap.unobservable
    ]


def mixed_finding(snap: I.TargetSnapshot) -> Finding:
    """``evidence.target.mixed``: the agent saw independent vLLM process trees (two servers)
    under SNAP's one target. ERROR, not PENDING: waiting does not tell which server the run
    means (the agent remembers the trees for its life, so one exiting does not clear it),
    and a PASS could rest on another server's evidence; only the agent's ``--pid`` does."""
    roots = [k.pid for k in snap.mixed_roots]
    return Finding(
        F.EVIDENCE_TARGET_MIXED,
        Severity.ERROR,
        f"target {snap.target} merges {len(roots)} independent vLLM process trees (root pids "
        f"{', '.join(map(str, roots))}): the agent reports every vLLM server it can see, so "
        "its evidence may be another server's; start the agent with --pid naming the "
        "server's root process",
        snap.target,
        {
            "root_pids": roots,
            "roots": [[k.boot_id, k.pid, k.start_ticks] for k in snap.mixed_roots],
        },
    )


def clock_skew_finding(snap: I.TargetSnapshot, skew: float, tolerance_s: float) -> Finding:
    """``evidence.clock_skew``: the agent dated its report SKEW seconds away from the verifier's
    receipt (positive: in the verifier's future). Neither clock can be told right: the
    verifier's may have been stepped, or the agent's; a report dated by clocks that disagree
    by more than the tolerance is never fresh evidence."""
    way = "ahead of" if skew > 0 else "behind"
    return Finding(
        F.EVIDENCE_CLOCK_SKEW,
        Severity.PENDING,
        f"target {snap.target}'s latest report is dated {abs(skew):.1f} s {way} the "
        f"verifier's clock when it arrived, beyond the policy's clock_skew_s {tolerance_s:g}: "
        "the agent's or the verifier's wall clock is wrong (stepped, or never synchronised), "
        "so the evidence is not fresh on any clock both agree on; never PASS on it",
        snap.target,
        {
            "skew_s": skew,
            "clock_skew_s": tolerance_s,
            "sent_unix": snap.sent_unix,
            "received_unix": snap.received_unix,
        },
    )


def stale_finding(snap: I.TargetSnapshot, age: float | None, freshness_s: float) -> Finding:
    """``evidence.stale``: SNAP, the target's latest report, is AGE seconds old (None: of no
    age known to this verifier: stored before it started, or read before its agent's host
    rebooted; it is not fresh until its target reports again). Says where that
    evidence came from (the containers, else the processes) and what the silence most likely
    means: a sidecar shares the serving container's PID namespace and dies with it, so a
    serving container that exited or restarted stops the reports."""
    infos = {c.id: c for c in snap.containers}
    cids = list(dict.fromkeys([*snap.container_ids, *infos]))
    restarts = {c.id: c.restart_count for c in snap.containers if c.restart_count is not None}
    if cids:
        named = [_container(cid, infos.get(cid)) for cid in cids[:3]]
        more = f" and {len(cids) - 3} more" if len(cids) > 3 else ""
        came = f"it came from {', '.join(named)}{more}"
        why = (
            "the serving container may have exited or restarted (a sidecar in its PID "
            "namespace dies with it and must be started again in the new one), or the agent "
            "stopped or cannot reach the verifier"
        )
    elif snap.processes:
        pids = ", ".join(str(p.key.pid) for p in snap.processes[:5])
        came = f"it came from processes in no container the agent could name (pid {pids})"
        why = "those processes may have exited, or the agent stopped or cannot reach the verifier"
    else:
        came = "it showed no vLLM process"
        why = (
            "the serving container may have exited (a sidecar in its PID namespace dies with "
            "it), or the agent stopped or cannot reach the verifier"
        )
    if age is None and not snap.age_known:
        how_old = (
            "was read before its agent's host last rebooted (the agent could not measure its "
            "age on its boot clock, which restarts with the host), so its age is unknown and it "
            f"is not fresh under freshness_s {freshness_s:g}"
        )
    elif age is None:
        how_old = (
            "was stored before this verifier started, so its age on the verifier's clock "
            f"(which restarts with it) is unknown and it is not fresh under freshness_s "
            f"{freshness_s:g}"
        )
    else:
        how_old = f"is {age:.1f} s old, older than the policy's freshness_s {freshness_s:g}"
    return Finding(
        F.EVIDENCE_STALE,
        Severity.PENDING,
        f"the latest report of target {snap.target} {how_old}; {came}, and nothing has "
        f"reported since: {why}",
        snap.target,
        {
            "age_s": age,
            "freshness_s": freshness_s,
            "received_unix": snap.received_unix,
            "containers": [
                {
                    "container_id": cid,
                    "name": infos[cid].name if cid in infos else None,
                    "pod": infos[cid].label(POD_NAME_LABEL) if cid in infos else None,
                    "restart_count": restarts.get(cid),
                }
                for cid in cids
            ],
            "pids": [p.key.pid for p in snap.processes],
        },
    )
