"""Liveness over a measurement window: did the serving processes stay the same ones and keep
working, and every hook keep pace with its steps, between the window's open and its seal?

The verifier opens and seals windows itself (``servewitness.server.windows``) and judges them
from the reports it stored at each end:

- the processes must be the same ones (``window_ends.same_processes``): every process of the
  run's targets reported at the open (API servers, engine cores, workers: every role but
  helpers and unknown processes, which come and go) is there at the seal with the same boot
  id, pid and start ticks, and none is there that was not (a restart, a reboot, a replaced
  API server, an extra worker, a target that joined or left the run:
  ``window.process_changed``);
- the processes that run steps (every worker, or where there is none every process with a
  live runner) ran productive steps *during the window*, each of them, whether or not the
  policy declares hooks (``window_ends.progress``; ``window.no_steps``: an idle window proves
  nothing);
- every hook the run's policy requires fired at least its minimum per judged step during the
  window (fires at the seal minus fires at the open, over the same difference of steps), in
  every process, each on its own counts (``pace``, here);
- the seal is not dated before the open, and where the verifier's host did not boot again in
  between, the window's length on its wall clock agrees with its length on ``CLOCK_BOOTTIME``,
  which cannot be stepped (``window_ends.elapsed``: ``window.sealed_before_open``,
  ``window.clock_stepped``);
- and the run must still PASS at the seal. The finding ids are stable (the older ones were the
  client-side window's). ``verifier audit verify-seal`` derives the process, step and time
  findings again from the seal's signed content, so a held seal that should not hold fails.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servewitness.model import (
    HookCount,
    ProcessKey,
    RunVerdict,
    Severity,
    Verdict,
    request_ids_sha256,
)

WINDOW_NOT_PASS = "window.verdict_not_pass"  # noqa: S105 - a finding id
WINDOW_NO_STEPS = "window.no_steps"
WINDOW_HOOK_LAGGED = "window.hook_lagged"
WINDOW_PROCESS_CHANGED = "window.process_changed"
# No report arrived from some target after the seal began, within its timeout: nothing shows
# the window's end (the agent or the server may be dead).
WINDOW_NO_FRESH_EVIDENCE = "window.no_fresh_evidence"
# A request the harness says it sent during the window is bound to no step of the window's
# processes that ran after it opened: something the verifier does not see served it (a twin
# outside the reported tree, a proxy, a redirected port) or it never ran.
WINDOW_REQUESTS_UNSERVED = "window.requests_unserved"
# The seal is dated before the open: the verifier's wall clock was stepped back in between.
WINDOW_SEALED_BEFORE_OPEN = "window.sealed_before_open"
# The window's length on the verifier's wall clock is not its length on its boot clock (same
# boot): the wall clock was stepped during the window, so its times are not the window's.
WINDOW_CLOCK_STEPPED = "window.clock_stepped"
# Evidence the window rests on (at the open or the seal) is a report with no ledger entry: a
# row written into the database behind the ledger's back, which no agent sent.
WINDOW_EVIDENCE_UNLEDGERED = "window.evidence_unledgered"
WINDOW_IDS = (
    WINDOW_NOT_PASS,
    WINDOW_NO_STEPS,
    WINDOW_HOOK_LAGGED,
    WINDOW_PROCESS_CHANGED,
    WINDOW_NO_FRESH_EVIDENCE,
    WINDOW_REQUESTS_UNSERVED,
    WINDOW_SEALED_BEFORE_OPEN,
    WINDOW_CLOCK_STEPPED,
    WINDOW_EVIDENCE_UNLEDGERED,
)


@dataclass(frozen=True)
class WindowFinding:
    id: str
    message: str
    context: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "message": self.message, "context": self.context}


def judged_counts(h: HookCount) -> tuple[int, int]:
    """(fires on the judged steps, judged steps) of one hook count."""
    if h.on == "decode":
        return h.fired_decode, h.decode_steps
    if h.on == "prefill":
        return h.fired_prefill, h.prefill_steps
    return h.fired_productive, h.productive_steps


def process_tag(key: ProcessKey | None, pid: int) -> str:
    """A process in a hook row's key: pid reuse (or a restart) changes start_ticks. The boot id
    is left out (the keys of windows opened by older verifiers stay comparable): a process's
    whole identity, boot id included, is compared by ``same_processes``, and the hook rows of
    a process it finds changed are not compared at all."""
    if key is None:
        return f"pid {pid}"
    return f"pid {pid}@{key.start_ticks}"


def hook_rows(
    verdict: RunVerdict, keys: Mapping[tuple[str, int], ProcessKey]
) -> dict[str, dict[str, Any]]:
    """Every policy hook of every process VERDICT judged, with its absolute counts, keyed
    ``target/pid P@START/name/on`` (KEYS: (target, pid) -> that process's identity)."""
    rows: dict[str, dict[str, Any]] = {}
    for t in verdict.targets:
        for h in t.hooks:
            tag = process_tag(keys.get((t.target, h.pid)), h.pid)
            fired, steps = judged_counts(h)
            rows[f"{t.target}/{tag}/{h.name}/{h.on}"] = {
                "name": h.name,
                "pid": h.pid,
                "role": h.role,
                "rank": h.rank,
                "on": h.on,
                "fired": fired,
                "steps": steps,
                "fired_in_all": h.fired,
                "total_steps": h.total_steps,
                "min_fires_per_step": h.min_fires_per_step,
            }
    return rows


def pace(
    start: Mapping[str, Mapping[str, Any]], end: Mapping[str, Mapping[str, Any]]
) -> tuple[dict[str, dict[str, Any]], list[WindowFinding]]:
    """Per hook (``hook_rows`` keys): fires and judged steps during the window, and what
    broke. START and END are ``hook_rows`` at the window's open and at its seal."""
    before = dict(start)
    rows: dict[str, dict[str, Any]] = {}
    found: list[WindowFinding] = []
    for key, now in end.items():
        then = before.pop(key, None)
        if then is None:
            found.append(
                WindowFinding(
                    WINDOW_PROCESS_CHANGED,
                    f"{key}: the process was not there when the window opened",
                    {"hook": key},
                )
            )
            continue
        row: dict[str, Any] = {
            "name": now["name"],
            "pid": now["pid"],
            "role": now["role"],
            "rank": now["rank"],
            "on": now["on"],
            "fired": int(now["fired"]) - int(then["fired"]),
            "steps": int(now["steps"]) - int(then["steps"]),
            "fired_in_all": int(now["fired_in_all"]) - int(then["fired_in_all"]),
            "total_steps": int(now["total_steps"]) - int(then["total_steps"]),
            "min_fires_per_step": now["min_fires_per_step"],
        }
        rows[key] = row
        if row["steps"] <= 0:
            found.append(
                WindowFinding(
                    WINDOW_NO_STEPS,
                    f"{key}: no {row['on']} steps ran during the window, so nothing shows the "
                    "hook was live while measuring",
                    row,
                )
            )
        elif row["fired"] < float(row["min_fires_per_step"]) * row["steps"]:
            found.append(
                WindowFinding(
                    WINDOW_HOOK_LAGGED,
                    f"{key}: fired {row['fired']} times on {row['steps']} {row['on']} steps "
                    f"during the window (the policy needs {row['min_fires_per_step']:g} per "
                    "step)",
                    row,
                )
            )
    for key in before:
        found.append(
            WindowFinding(
                WINDOW_PROCESS_CHANGED,
                f"{key}: the process that reported at the window's start is gone",
                {"hook": key},
            )
        )
    return rows, _restarts(start, end, found)


def _slot(key: str, row: Mapping[str, Any]) -> tuple[str, Any, Any, Any, Any]:
    """Where a hook row's process serves: its target (a key is ``target/pid P@START/name/on``,
    and a target may hold ``/``), role, rank, hook and step kind."""
    target = key.rsplit("/", 3)[0]
    return target, row["role"], row["rank"], row["name"], row["on"]


def _restarts(
    start: Mapping[str, Mapping[str, Any]],
    end: Mapping[str, Mapping[str, Any]],
    found: list[WindowFinding],
) -> list[WindowFinding]:
    """FOUND with each pair of process-changed findings that is one restart (a process gone
    and a new one in its place: same target, role, rank and hook) said as one: the window
    spans a restart of the served process, which no window survives."""
    gone = {_slot(k, start[k]): k for k in start if k not in end}
    new = {_slot(k, end[k]): k for k in end if k not in start}
    pairs = {gone[s]: new[s] for s in gone.keys() & new.keys()}
    if not pairs:
        return found
    out = [f for f in found if f.context.get("hook") not in pairs.keys() | set(pairs.values())]
    for old, now in sorted(pairs.items()):
        out.append(
            WindowFinding(
                WINDOW_PROCESS_CHANGED,
                f"{now}: the process restarted during the window (it was {old}): its counts "
                "start again, and nothing shows the hook kept pace across the restart",
                {"hook": now, "restarted": True, "was": old},
            )
        )
    return out


_RANK = {Severity.ERROR: 0, Severity.PENDING: 1, Severity.WARNING: 2, Severity.INFO: 3}


def top_finding(verdict: RunVerdict) -> str:
    """The most severe finding of VERDICT in one line (what a refused open names)."""
    found = list(verdict.findings) + [f for t in verdict.targets for f in t.findings]
    found = [f for f in found if f.severity != Severity.INFO]
    if not found:
        return "no findings"
    found.sort(key=lambda f: _RANK[f.severity])
    return f"{found[0].id}: {found[0].message}"


def not_pass(run: str, verdict: RunVerdict) -> WindowFinding | None:
    """The finding for a run that does not PASS at the seal (None: it does)."""
    if verdict.verdict == Verdict.PASS:
        return None
    return WindowFinding(
        WINDOW_NOT_PASS,
        f"run {run} is {verdict.verdict.value} at the window's end: {top_finding(verdict)}",
        {"verdict": verdict.verdict.value},
    )


# A process of the window: (target, boot id, pid, start ticks).
ProcessAt = tuple[str, str, int, int]
UNSERVED_SHOWN = 10  # request ids a requests_unserved finding names; its counts say the rest


def is_served(
    rows: Iterable[tuple[str, str, int, int, int]], at_open: Mapping[ProcessAt, int | None]
) -> bool:
    """Whether one of ROWS (a request's bindings) is a process of AT_OPEN whose first step ran
    after the open's step count."""
    return any(r[:4] in at_open and r[4] > (at_open[r[:4]] or 0) for r in rows)


def requests_served(
    ids: Sequence[str],
    where: Mapping[str, Sequence[tuple[str, str, int, int, int]]],
    at_open: Mapping[ProcessAt, int | None],
) -> tuple[dict[str, Any], WindowFinding | None]:
    """Were the request IDS the harness sent served inside the window? WHERE: each id's stored
    bindings (target, boot id, pid, start ticks, first step); AT_OPEN: the window's processes
    with their step count at the open (None: not recorded, an older verifier's window). An id
    is served when one of its bindings is a process of the window whose first step came after
    the open's count. The seal's ``requests`` summary, and the finding when any is not."""
    served = 0
    before: list[str] = []  # bound to a window process, but its first step ran before the open
    outside: list[str] = []  # bound only to processes the window does not judge
    unbound: list[str] = []  # no binding at all
    for rid in ids:
        rows = where.get(rid, ())
        mine = [r for r in rows if r[:4] in at_open]
        if is_served(mine, at_open):
            served += 1
        elif mine:
            before.append(rid)
        elif rows:
            outside.append(rid)
        else:
            unbound.append(rid)
    summary = {"sent": len(ids), "served": served, "ids_sha256": request_ids_sha256(ids)}
    missing = unbound + outside + before
    if not missing:
        return summary, None
    return summary, WindowFinding(
        WINDOW_REQUESTS_UNSERVED,
        f"{len(missing)} of the {len(ids)} requests the harness sent were not served by the "
        f"window's processes after it opened ({len(unbound)} bound to no process at all, "
        f"{len(outside)} only to processes outside the window, {len(before)} before it "
        "opened): something the verifier does not see served them (a twin outside the "
        "reported tree, a proxy, a redirected port), or they never ran",
        {
            "sent": len(ids),
            "unserved": len(missing),
            "unbound": len(unbound),
            "outside": len(outside),
            "before_open": len(before),
            "ids": missing[:UNSERVED_SHOWN],
        },
    )


def findings_json(found: Sequence[WindowFinding]) -> list[dict[str, Any]]:
    return [f.to_json() for f in found]
