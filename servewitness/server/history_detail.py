"""What the verdict history keeps of a run's verdict (``verdict_detail``), made per status
call and per history pass, so made from what is kept between calls.

A fresh target's verdict keeps its findings tuple, the same object, until its target reports
again (``policy.engine.Judgements.fresh``); its sorted finding ids are then the same too, and
are looked up by that object rather than sorted anew (at 500 targets, 0.5 ms of a status
call's 6.7 ms in-process, and about a fifth of its interpreter time under load). Details made
from kept entries share them, so comparing two details (``Store.record_verdict``'s JSON memo)
mostly compares identical objects.
"""

from __future__ import annotations

import threading
from typing import Any

from servewitness.model import Finding, RunVerdict

# Findings tuples whose sorted ids are kept (cleared when full): far more than a verifier's
# targets times its runs' policies.
MAX_KEPT = 65_536

_kept: dict[int, tuple[tuple[Finding, ...], str, tuple[str, ...]]] = {}
_lock = threading.Lock()  # the clear; entries are replaced whole, a race computes one twice


def _target_entry(verdict: str, findings: tuple[Finding, ...]) -> tuple[str, tuple[str, ...]]:
    kept = _kept.get(id(findings))
    if kept is not None and kept[0] is findings and kept[1] == verdict:
        return verdict, kept[2]
    ids = tuple(sorted(f.id for f in findings))
    if len(_kept) >= MAX_KEPT:
        with _lock:
            _kept.clear()
    _kept[id(findings)] = (findings, verdict, ids)  # the tuple itself held: its id stays its
    return verdict, ids


def verdict_detail(v: RunVerdict) -> dict[str, Any]:
    """What the verdict history keeps: verdicts and finding ids per target (no timestamps).
    Its JSON is what it always was (a target's entry is ``[verdict, [ids...]]``)."""
    return {
        "policy_digest": v.policy_digest,
        "run": [f.id for f in v.findings],
        "targets": {t.target: _target_entry(t.verdict.value, t.findings) for t in v.targets},
    }
