"""Measurement windows: open one when the gate passes, seal it when the measurement is done.

Sealing checks that every hook the run's policy requires kept pace with the steps it is
judged on *over the window* (fires during the window / those steps during the window >= the
policy's minimum, in every process, each on its own counts), that the processes are the same
ones as at the start (none restarted), that steps of the judged kind ran at all, and that the
run still PASSes. It then writes a statement binding the results file's sha256 to that
evidence. It FAILs even when the gate passed at the window's start.

The window's start is a ``RunVerdict`` the verifier returned (saved as JSON); the seal asks
the verifier again, for a verdict resting on reports received after the seal began.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verifier import wire
from verifier.client.api import VerifierClient
from verifier.errors import ConfigError, TimeoutError_
from verifier.model import HookCount, RunVerdict, Verdict

STATEMENT_VERSION = 1

WINDOW_NOT_PASS = "window.verdict_not_pass"  # noqa: S105 - a finding id
WINDOW_NO_STEPS = "window.no_steps"
WINDOW_HOOK_LAGGED = "window.hook_lagged"
WINDOW_PROCESS_CHANGED = "window.process_changed"


@dataclass(frozen=True)
class WindowFinding:
    id: str
    message: str
    context: dict[str, Any]


def _key(target: str, h: HookCount) -> str:
    return f"{target}/pid {h.pid}/{h.name}/{h.on}"


def _counts(h: HookCount) -> tuple[int, int]:
    """(fires on the judged steps, judged steps) of one hook count."""
    if h.on == "decode":
        return h.fired_decode, h.decode_steps
    if h.on == "prefill":
        return h.fired_prefill, h.prefill_steps
    return h.fired_productive, h.productive_steps


def pace(
    start: RunVerdict, end: RunVerdict
) -> tuple[dict[str, dict[str, Any]], list[WindowFinding]]:
    """Per target/process/hook: fires and judged steps during the window, and what broke."""
    before = {_key(t.target, h): h for t in start.targets for h in t.hooks}
    rows: dict[str, dict[str, Any]] = {}
    found: list[WindowFinding] = []
    for t in end.targets:
        for h in t.hooks:
            key = _key(t.target, h)
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
            (f1, s1), (f0, s0) = _counts(h), _counts(then)
            row: dict[str, Any] = {
                "name": h.name,
                "pid": h.pid,
                "role": h.role,
                "rank": h.rank,
                "on": h.on,
                "fired": f1 - f0,
                "steps": s1 - s0,
                "fired_in_all": h.fired - then.fired,
                "total_steps": h.total_steps - then.total_steps,
                "min_fires_per_step": h.min_fires_per_step,
            }
            rows[key] = row
            if row["steps"] <= 0:
                found.append(
                    WindowFinding(
                        WINDOW_NO_STEPS,
                        f"{key}: no {h.on} steps ran during the window, so nothing shows the "
                        "hook was live while measuring",
                        row,
                    )
                )
            elif row["fired"] < h.min_fires_per_step * row["steps"]:
                found.append(
                    WindowFinding(
                        WINDOW_HOOK_LAGGED,
                        f"{key}: fired {row['fired']} times on {row['steps']} {h.on} steps during "
                        f"the window (the policy needs {h.min_fires_per_step:g} per step)",
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
    return rows, found


def is_fresh(verdict: RunVerdict, since: float) -> bool:
    """Every target's evidence was read at or after SINCE (verifier clock), and there is one."""
    return bool(verdict.targets) and all((t.report_unix or 0) >= since for t in verdict.targets)


def fresh_status(client: VerifierClient, run: str, timeout_s: float) -> RunVerdict:
    """RUN's verdict once every target's evidence was read after this call began: after the
    verifier's clock at its first answer (a client's own clock may be off from the verifier's,
    which dates the evidence)."""
    deadline = time.monotonic() + timeout_s
    since: float | None = None
    while True:
        v = client.status(run)
        if since is None:
            since = v.evaluated_unix
        if is_fresh(v, since):
            return v
        if time.monotonic() >= deadline:
            raise TimeoutError_(
                f"run {run}: no report newer than the seal arrived within {timeout_s:g} s"
            )
        time.sleep(0.2)


WINDOW_FILE_VERSION = 2  # 1: the verdict in protobuf's JSON mapping (before one JSON form)


def save_start(path: Path, verdict: RunVerdict) -> None:
    data = {
        "window": WINDOW_FILE_VERSION,
        "opened_unix": time.time(),
        "verdict": wire.run_verdict_to_json(verdict),
    }
    path.write_text(json.dumps(data, indent=2) + "\n")


def load_start(path: Path) -> tuple[float, RunVerdict]:
    try:
        data = json.loads(path.read_text())
        version = data.get("window") if isinstance(data, dict) else None
        if version == 1:
            raise ValueError(
                "written by an older verifier (window file 1): open the window again with "
                "`verifier window`"
            )
        if version != WINDOW_FILE_VERSION:
            raise ValueError("not a window file written by `verifier window`")
        return float(data["opened_unix"]), wire.run_verdict_from_json(data["verdict"], "verdict")
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: no such window file (open one with `verifier window`)") from e
    except (OSError, ValueError, KeyError, TypeError, wire.WireError) as e:
        raise ConfigError(f"{path}: not a window file: {e}") from e


def _sha256_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    try:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
    except OSError as e:
        raise ConfigError(f"cannot read the results file {path}: {e}") from e
    return h.hexdigest(), size


def statement(
    run: str,
    opened_unix: float,
    start: RunVerdict,
    end: RunVerdict,
    results: Path,
) -> tuple[dict[str, Any], bool]:
    """The sealed statement for RESULTS, and whether the window held."""
    sha, size = _sha256_file(results)
    rows, found = pace(start, end)
    if end.verdict != Verdict.PASS:
        found.insert(
            0,
            WindowFinding(
                WINDOW_NOT_PASS,
                f"run {run} is {end.verdict.value} at the window's end",
                {"verdict": end.verdict.value},
            ),
        )
    body: dict[str, Any] = {
        "statement": STATEMENT_VERSION,
        "run": run,
        "policy_digest": end.policy_digest,
        "results": {"path": str(results), "sha256": sha, "size": size},
        "window": {"opened_unix": opened_unix, "sealed_unix": time.time()},
        "verdict_at_open": start.verdict.value,
        "verdict_at_seal": end.verdict.value,
        "held": not found,
        "hooks": rows,
        "findings": [{"id": f.id, "message": f.message, "context": f.context} for f in found],
        "evidence_read_unix": {t.target: t.report_unix for t in end.targets},
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return {**body, "statement_sha256": digest}, not found
