"""The engine: run a policy's rules over each target's latest evidence and turn the findings
into verdicts. It knows nothing about rule kinds; ``loader.py`` builds the rules."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeGuard

from servewitness.instances import instance_family
from servewitness.model import (
    Finding,
    HookCount,
    RunVerdict,
    Severity,
    TargetVerdict,
    Verdict,
    combine,
)
from servewitness.policy import findings as F
from servewitness.policy import interface as I
from servewitness.policy.rules_container import (
    clock_skew_finding,
    container_findings,
    mixed_finding,
    stale_finding,
    unobservable_findings,
)
from servewitness.policy.unsafe import AT_LOAD, shown, unsafe_flags, without


def policy_digest(text: str) -> str:
    """``sha256:<hex>`` of the policy text's UTF-8 bytes, exactly as given (no normalising:
    the digest pins the text a run was registered with)."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def target_verdict(findings: list[Finding] | tuple[Finding, ...], stale: bool) -> Verdict:
    """STALE wins at target level; then any ERROR fails; then any PENDING; else PASS."""
    if stale:
        return Verdict.STALE
    severities = {f.severity for f in findings}
    if Severity.ERROR in severities:
        return Verdict.FAIL
    if Severity.PENDING in severities:
        return Verdict.PENDING
    return Verdict.PASS


def _dedup(findings: list[Finding]) -> list[Finding]:
    """Drop repeats (several rules report the same process's step shortage), keeping order."""
    seen: set[tuple[str, str, str, str]] = set()
    out: list[Finding] = []
    for f in findings:
        key = (f.id, f.target, f.message, json.dumps(f.context, sort_keys=True, default=str))
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


MAX_FINDINGS = 256
"""The most findings one target's verdict lists (its verdict is judged on all of them). A
report of 4,096 processes drew about 28,000: a 7.9 MB status answer, and ten such targets put
every status call over the 64 MiB message limit."""
_WORST_FIRST = (Severity.ERROR, Severity.PENDING, Severity.WARNING, Severity.INFO)


def _listed(findings: list[Finding], target: str) -> list[Finding]:
    """FINDINGS, or the MAX_FINDINGS - 1 most severe of them (in their order) and one
    ``verdict.findings_omitted`` counting the rest by id."""
    if len(findings) <= MAX_FINDINGS:
        return findings
    rank = sorted(range(len(findings)), key=lambda i: _WORST_FIRST.index(findings[i].severity))
    kept = set(rank[: MAX_FINDINGS - 1])
    omitted: dict[str, int] = {}
    for i, f in enumerate(findings):
        if i not in kept:
            omitted[f.id] = omitted.get(f.id, 0) + 1
    n = len(findings) - len(kept)
    note = Finding(
        F.VERDICT_FINDINGS_OMITTED,
        Severity.INFO,
        f"{n} more findings of target {target} are not listed (the verdict is judged on all "
        f"{len(findings)}): {', '.join(f'{k} x{v}' for k, v in sorted(omitted.items()))}",
        target,
        {"omitted": n, "by_id": omitted},
    )
    return [f for i, f in enumerate(findings) if i in kept] + [note]


@dataclass(frozen=True)
class Policy:
    """A loaded policy: which targets it covers, how much evidence it needs, and its rules.
    Fails closed: a policy without rules cannot be built."""

    rules: tuple[I.Rule, ...]
    evidence: I.EvidenceSettings = field(default_factory=I.EvidenceSettings)
    selection: I.TargetSelection = field(default_factory=I.TargetSelection)
    source: str = "<policy>"
    provenance: I.ProvenanceSettings = field(default_factory=I.ProvenanceSettings)

    def __post_init__(self) -> None:
        if not self.rules:
            raise I.PolicyError(self.source, None, None, "a policy needs at least one rule")

    @property
    def freshness_s(self) -> float:
        return self.evidence.freshness_s

    @property
    def context(self) -> I.EvalContext:
        return I.EvalContext(self.evidence.min_steps, self.evidence.require_probe)

    def selects(self, target: str, container_ids: tuple[str, ...]) -> bool:
        """Whether the run covers TARGET: its name is listed, or it is an instance of a listed
        family (when names or replicas_of are given; without either, any name but an
        instance), and one of its processes runs in a listed container (when container ids
        are given)."""
        sel = self.selection
        if sel.names or sel.replicas_of:
            if target not in sel.names and self._replica_family(target) is None:
                return False
        elif instance_family(target) is not None:
            # "Every target that reports" means every plain name: instances only where the
            # policy asks for them (replicas_of), or else one credential for a family could
            # report instances enough to meet min_targets on its own
            return False
        return not sel.container_ids or any(
            cid.startswith(prefix) for cid in container_ids for prefix in sel.container_ids
        )

    def _replica_family(self, target: str) -> str | None:
        """The family of TARGET when it is an instance of one ``[targets] replicas_of``
        lists (``servewitness.instances``), else None."""
        fam = instance_family(target)
        return fam if fam in self.selection.replicas_of else None

    def age(self, snap: I.TargetSnapshot, now: float, now_boot_s: float | None) -> float | None:
        """How old SNAP's evidence is. A verifier gives NOW_BOOT_S, its age clock (seconds
        since boot, which no one can step back), and the age is measured on it alone: a
        snapshot without a receipt time on that clock (stored before the verifier started)
        has no known age (None). Without NOW_BOOT_S (a snapshot evaluated offline, built the
        moment it is judged) the age is the wall-clock difference. A snapshot whose agent could
        not measure its age (read before its host rebooted) has none either way."""
        if not snap.age_known:
            return None
        if now_boot_s is None:
            return now - snap.evidence_unix
        at = snap.evidence_boot_s
        return None if at is None else now_boot_s - at

    def evaluate_target(
        self,
        snap: I.TargetSnapshot,
        now: float,
        now_boot_s: float | None = None,
        judgements: Judgements | None = None,
    ) -> TargetVerdict:
        """SNAP's verdict at NOW: its age judged now, everything else (``judge``) taken from
        JUDGEMENTS when they hold it for this policy and this very snapshot."""
        age = self.age(snap, now, now_boot_s)
        stale = age is None or age > self.evidence.freshness_s
        if not stale and judgements is not None:  # the same verdict as last time, but when
            return judgements.fresh(self, snap, now).at(now)
        judged = self.judge(snap) if judgements is None else judgements.judged(self, snap)
        return self.verdict_of(snap, judged, now, age if stale else None, stale)

    def verdict_of(
        self, snap: I.TargetSnapshot, judged: Judged, now: float, age: float | None, stale: bool
    ) -> TargetVerdict:
        """SNAP's verdict at NOW from what JUDGED found and whether it is STALE (at AGE)."""
        # evidence.stale comes from here alone, so the deduplicated list stays deduplicated
        findings = [stale_finding(snap, age, self.evidence.freshness_s)] if stale else []
        findings.extend(judged.findings)
        return TargetVerdict(
            target=snap.target,
            verdict=target_verdict(findings, stale),
            findings=tuple(_listed(findings, snap.target)),
            evaluated_unix=now,
            report_unix=snap.evidence_unix,
            hooks=judged.hooks,
        )

    def judge(self, snap: I.TargetSnapshot) -> Judged:
        """What SNAP's evaluation finds that does not depend on when it is judged: every
        finding but ``evidence.stale`` (deduplicated, in order) and the hook counts."""
        findings: list[Finding] = []
        skew = snap.clock_skew_s
        if skew is not None and abs(skew) > self.evidence.clock_skew_s:
            findings.append(clock_skew_finding(snap, skew, self.evidence.clock_skew_s))
        findings.extend(unobservable_findings(snap))
        if snap.mixed_roots:
            findings.append(mixed_finding(snap))
        if snap.authenticated_as is None and not self.evidence.unsafe_allow_unauthenticated:
            findings.append(
                Finding(
                    F.EVIDENCE_UNAUTHENTICATED,
                    Severity.PENDING,
                    f"nobody vouches for who sent target {snap.target}'s evidence (plaintext "
                    "TCP, loopback included: no certificate, no token, no kernel credentials; "
                    "or a report stored before this verifier started): never PASS on it",
                    snap.target,
                    {},
                )
            )
        elif snap.authenticated_as not in (None, "local"):  # "local": engine tests' default
            findings.append(
                Finding(
                    F.EVIDENCE_AUTHENTICATED,
                    Severity.INFO,
                    f"target {snap.target}'s evidence was sent by {snap.authenticated_as}",
                    snap.target,
                    {"authenticated_as": snap.authenticated_as},
                )
            )
        bindings = dict(self.selection.containers)
        bound = bindings.get(snap.target)
        fam = self._replica_family(snap.target)
        if bound is None and fam is not None:
            bound = bindings.get(fam)  # the family's binding, per instance
        if bound is not None:
            findings.extend(container_findings(bound, snap))
        counts: list[HookCount] = []
        if not snap.processes:
            findings.append(
                Finding(
                    F.EVIDENCE_NO_PROCESSES,
                    Severity.PENDING,
                    f"target {snap.target} reported no processes",
                    snap.target,
                    {"received_unix": snap.received_unix},
                )
            )
        else:
            ctx = self.context
            for rule in self.rules:
                findings.extend(rule.evaluate(snap, ctx))
                if _counts_hooks(rule):
                    counts.extend(rule.hook_counts(snap, ctx))
        # a hook named for its role and by default may judge a process twice: once each
        hooks = tuple({(c.name, c.pid): c for c in counts}.values())
        return Judged(tuple(_dedup(findings)), hooks)


_COUNTS_HOOKS: dict[type, bool] = {}


def _counts_hooks(rule: object) -> TypeGuard[I.CountsHooks]:
    """``isinstance(rule, I.CountsHooks)``, decided once per rule class: a runtime-checkable
    Protocol's isinstance inspects the class's attributes on every call (~4 % of the
    verifier's GIL time at 500 agents, measured with py-spy; a rule's methods are its
    class's)."""
    cls = type(rule)
    known = _COUNTS_HOOKS.get(cls)
    if known is None:
        known = _COUNTS_HOOKS[cls] = isinstance(rule, I.CountsHooks)
    return known


@dataclass(frozen=True)
class Judged:
    """``Policy.judge``'s result: a target's findings but ``evidence.stale``, its hook counts."""

    findings: tuple[Finding, ...]
    hooks: tuple[HookCount, ...]


# Entries Judgements keeps (one per policy and target; cleared when full): far more than the
# targets a verifier tracks times its runs' policies.
MAX_JUDGEMENTS = 65_536


class Judgements:
    """Verdicts kept, not recomputed per status call: ``Policy.judge`` of a (policy, target)
    kept while the target's latest snapshot is the same object (a new report is a new
    snapshot) and the policy the same object (a run registered with another policy has
    another). Only the age, which decides STALE, is judged on every call, so a verdict from
    here is exactly what a fresh evaluation gives at the same time. Thread-safe: entries are
    replaced whole (a race computes one twice)."""

    def __init__(self, max_entries: int = MAX_JUDGEMENTS) -> None:
        self._max = max_entries
        self._by: dict[tuple[int, str], tuple[Policy, I.TargetSnapshot, Judged]] = {}
        self._fresh: dict[tuple[int, str], tuple[Policy, I.TargetSnapshot, TargetVerdict]] = {}
        self._variants: dict[tuple[int, str], tuple[Policy, Policy]] = {}
        self.hits = self.misses = 0

    def judged(self, policy: Policy, snap: I.TargetSnapshot) -> Judged:
        key = (id(policy), snap.target)
        kept = self._by.get(key)
        if kept is not None and kept[0] is policy and kept[1] is snap:
            self.hits += 1
            return kept[2]
        self.misses += 1
        out = policy.judge(snap)
        if len(self._by) >= self._max:
            self._by.clear()
            self._fresh.clear()
        self._by[key] = (policy, snap, out)
        return out

    def fresh(self, policy: Policy, snap: I.TargetSnapshot, now: float) -> TargetVerdict:
        """SNAP's verdict under POLICY while it is not stale, as first computed: the same
        object (its findings and hooks too) until the snapshot changes, so that what is made
        of it (its message, ``wire.verdicts``) can be kept as well. Its ``evaluated_unix`` is
        the first call's: the caller sets its own."""
        key = (id(policy), snap.target)
        kept = self._fresh.get(key)
        if kept is not None and kept[0] is policy and kept[1] is snap:
            self.hits += 1
            return kept[2]
        judged = self.judged(policy, snap)
        out = policy.verdict_of(snap, judged, now, None, False)
        self._fresh[key] = (policy, snap, out)
        return out

    def without(self, policy: Policy, flag: str) -> Policy:
        """``unsafe.without``, the same object each time (so its judgements are kept too)."""
        key = (id(policy), flag)
        kept = self._variants.get(key)
        if kept is not None and kept[0] is policy:
            return kept[1]
        out = without(policy, flag)
        if len(self._variants) >= self._max:
            self._variants.clear()
        self._variants[key] = (policy, out)
        return out


def selects_snapshot(policy: Policy, snap: I.TargetSnapshot) -> bool:
    """Whether POLICY's run covers SNAP's target (``Policy.selects``, with its containers)."""
    return policy.selects(snap.target, snap.every_container_id)


def refused_run(run: str, digest: str, error: I.PolicyError, now: float) -> RunVerdict:
    """The verdict on a run whose stored policy does not load under this verifier's rules
    (e.g. a weak policy registered before they refused it, issue 19 item 3): FAIL, with one
    run-level ``policy.refused`` finding naming the error and, for a weak policy, the unsafe
    keys that would accept it. FAIL, not PENDING: no evidence can make it PASS, so a gate
    waiting on it must stop now, with the reason, rather than time out."""
    flags = list(error.flags) if isinstance(error, I.WeakPolicyError) else []
    keys = f" (accepted only with {', '.join(f'{k} = true' for k in flags)})" if flags else ""
    finding = Finding(
        F.POLICY_REFUSED,
        Severity.ERROR,
        f"run {run}'s stored policy is refused by this verifier's rules{keys}: "
        f"{error.explain()}; register the run again under a policy that loads",
        "",
        {"error": error.explain(), "unsafe_keys": flags, "source": error.source},
    )
    return RunVerdict(run, digest, Verdict.FAIL, (), (finding,), now)


def evaluate_run(
    run: str,
    policy: Policy,
    digest: str,
    snapshots: list[I.TargetSnapshot],
    now: float,
    *,
    now_boot_s: float | None = None,
    judgements: Judgements | None = None,
    expired: Sequence[I.TargetSnapshot] = (),
) -> RunVerdict:
    """The run's verdict over the targets the policy selects (others are ignored): ``combine``
    of their verdicts, PENDING (``evidence.no_report``) while fewer than ``min_targets`` of them
    have reported or a target named in ``[targets] names`` has not. NOW is the wall clock
    (displayed); NOW_BOOT_S the verifier's age clock (``Policy.age``); JUDGEMENTS: what to
    reuse of earlier evaluations (the same verdict, computed faster). EXPIRED: the last
    snapshots of targets the verifier expired (silent past ``--target-expiry``): not judged,
    but each one the policy selects is named (``evidence.target_expired``, a WARNING)."""
    latest: dict[str, I.TargetSnapshot] = {}
    for snap in snapshots:
        if not policy.selects(snap.target, snap.every_container_id):
            continue
        prev = latest.get(snap.target)
        if prev is None or snap.received_unix >= prev.received_unix:
            latest[snap.target] = snap
    targets = tuple(
        policy.evaluate_target(latest[t], now, now_boot_s, judgements) for t in sorted(latest)
    )
    sel = policy.selection
    missing = [n for n in sel.names if n not in latest]
    findings: list[Finding] = []
    if len(latest) < sel.min_targets or missing:
        need = max(sel.min_targets, len(sel.names))
        what = f"; not reported: {', '.join(missing)}" if missing else ""
        findings.append(
            Finding(
                F.EVIDENCE_NO_REPORT,
                Severity.PENDING,
                f"{len(latest)} selected target(s) of run {run} reported, fewer than the "
                f"{need} it needs{what}",
                "",
                {
                    "reported": sorted(latest),
                    "missing": missing,
                    "min_targets": sel.min_targets,
                    "names": list(sel.names),
                },
            )
        )
    verdicts = [t.verdict for t in targets]
    if findings:
        verdicts.append(Verdict.PENDING)
    for snap in sorted(expired, key=lambda s: s.target):
        if snap.target in latest or not policy.selects(snap.target, snap.every_container_id):
            continue
        findings.append(
            Finding(
                F.EVIDENCE_TARGET_EXPIRED,
                Severity.WARNING,
                f"target {snap.target} of run {run} was silent past the verifier's "
                "--target-expiry and has left the run's verdict until it reports again (its "
                "pod or container is gone, or its agent cannot reach the verifier)",
                snap.target,
                {"target": snap.target, "last_report_unix": snap.received_unix},
            )
        )
    verdict = combine(verdicts)
    findings.extend(
        _unsafe_findings(run, policy, digest, snapshots, now, verdict=verdict, kept=judgements)
    )
    return RunVerdict(
        run=run,
        policy_digest=digest,
        verdict=verdict,
        targets=targets,
        findings=tuple(findings),
        evaluated_unix=now,
    )


def _unsafe_findings(
    run: str,
    policy: Policy,
    digest: str,
    snapshots: list[I.TargetSnapshot],
    now: float,
    *,
    verdict: Verdict,
    kept: Judgements | None = None,
) -> list[Finding]:
    """One ``policy.unsafe`` WARNING per unsafe flag the policy sets, saying whether this
    verdict holds only because of it: the run is evaluated again with the flag at its safe
    default (generic over flags: no rule needs to know what a flag does)."""
    out = []
    for flag in unsafe_flags(policy):
        if flag in AT_LOAD:  # accepted the policy itself: every verdict under it rests on it
            out.append(
                Finding(
                    F.POLICY_UNSAFE,
                    Severity.WARNING,
                    f"run {run}: {verdict.value} under a policy accepted only because "
                    f"{shown(flag)}: it has {AT_LOAD[flag]}",
                    "",
                    {"flag": flag, "verdict": verdict.value, "at_load": True},
                )
            )
            continue
        safe = without(policy, flag) if kept is None else kept.without(policy, flag)
        alt = evaluate_run(run, safe, digest, snapshots, now, judgements=kept).verdict
        if alt == verdict:
            what = f"{shown(flag)} is set; this verdict ({verdict.value}) does not depend on it"
        elif verdict == Verdict.PASS:
            what = f"passed only because {shown(flag)} (without it: {alt.value})"
        else:
            what = f"{verdict.value} only because {shown(flag)} (without it: {alt.value})"
        out.append(
            Finding(
                F.POLICY_UNSAFE,
                Severity.WARNING,
                f"run {run}: {what}",
                "",
                {"flag": flag, "verdict": verdict.value, "without_flag": alt.value},
            )
        )
    return out
