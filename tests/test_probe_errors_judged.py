"""The probe's own errors, from a real probed process through the agent's reader to a verdict.

The H200's V2 runner made the probe's speculation path raise on every step (3,270 errors in
12 s) while it counted 0 drafts, and the run passed with a warning. Here a real process's probe
records errors the same way (``_core.report_error``, what every guarded probe path calls):
a flood in the step accounting and one in log capture. The journal keeps the first few of
each place and says the rest were only counted; the verdict is FAIL, naming the step
accounting's error; the log capture's stays a warning.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from servewitness_probe import _state

from servewitness.evidence.process import read_process
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.report import to_report
from servewitness.model import Severity, Verdict
from tests.test_probe_state_binding import python, verdict

FLOOD = """
from servewitness_probe import _core
for i in range(1000):
    _core.report_error("spec", f"ValueError: The truth value of an array is ambiguous ({i})")
_core.report_error("vllm_log", "TypeError: a log record the probe could not read")
"""


def test_a_flood_of_step_accounting_errors_is_bounded_in_the_journal_and_fails(
    tmp_path: Path,
) -> None:
    probe = tmp_path / "probe"
    with python(probe, FLOOD, probed=True) as proc:
        ev = read_process(ProcFS(), proc.pid)
        report = to_report(ProcFS(), ev)
    assert ev.probe is not None
    assert ev.probe.error_count == 1001  # every error counted in the shared slot
    spec = [e for e in ev.probe.errors if e.get("where") == "spec"]
    bound = _state.ERRORS_JOURNALED_PER_WHERE
    assert len(spec) == bound + 1, spec  # the first ones, then one saying the rest are counted
    assert "(0)" in spec[0]["msg"] and "not journaled" in spec[-1]["msg"]
    assert [e["where"] for e in ev.probe.errors if e.get("where") != "spec"] == ["vllm_log"]

    v = verdict(report)
    assert v.verdict == Verdict.FAIL
    judged = [f for f in v.findings if f.id == "evidence.probe_errors.judged"]
    assert len(judged) == 1 and judged[0].severity == Severity.ERROR
    assert "in spec: ValueError: The truth value of an array" in judged[0].message
    warned = [f for f in v.findings if f.id == "evidence.probe_errors"]
    assert len(warned) == 1 and warned[0].context["wheres"] == ["vllm_log"]


def test_negative_control_errors_outside_what_is_judged_leave_the_verdict_alone(
    tmp_path: Path,
) -> None:
    """The same process with only the log capture's error: the hook is unfired here, so the
    verdict is not PASS either way; what matters is that no judged finding appears."""
    probe = tmp_path / "probe"
    code = 'from servewitness_probe import _core\n_core.report_error("vllm_log", "TypeError: x")\n'
    with python(probe, code, probed=True) as proc:
        report = to_report(ProcFS(), read_process(ProcFS(), proc.pid))
    found = {f.id for f in verdict(report).findings}
    assert "evidence.probe_errors" in found and "evidence.probe_errors.judged" not in found


def test_a_sweeper_failure_names_where_it_was_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen once under load in the container tests (2026-12-03): "in sweeper: RuntimeError:
    dictionary changed size during iteration", with nothing saying where. A failed pass now
    names the file and line it was raised at, so one journal line finds it."""
    from servewitness_probe import _core as core
    from servewitness_probe import _imports, _startup

    errors: list[tuple[str, str]] = []
    monkeypatch.setattr(core, "report_error", lambda where, msg: errors.append((where, msg)))

    def racing(st: object) -> None:
        d = {1: 1}
        for k in d:  # the error vLLM's worker hit, raised here
            d[k + 1] = k

    monkeypatch.setattr(_startup, "scan_pth", racing)
    _imports.sweep_once()
    ((where, msg),) = errors
    assert where == "sweeper" and "dictionary changed size during iteration" in msg
    assert "(at test_probe_errors_judged.py:" in msg, msg


# A process with thousands of modules (vLLM's workers hold about 7,000) and garbage whose
# finalizer imports: each collection finalizes one and leaves the next.
_GC_RACE = """
import gc, os, sys, types
import servewitness_probe as p
from servewitness_probe import _core, _imports
errors = []
_core.report_error = lambda where, msg: errors.append(f"{where}: {msg}")
for i in range(5000):
    sys.modules[f"filler_{i}"] = types.ModuleType(f"filler_{i}")
class ImportsWhenFreed:
    n = 0
    def __del__(self):
        ImportsWhenFreed.n += 1
        sys.modules[f"imported_in_a_finalizer_{ImportsWhenFreed.n}"] = types.ModuleType("x")
        if ImportsWhenFreed.n < 20000:
            again = ImportsWhenFreed(); again.cycle = again
p.start()
gc.disable()
first = ImportsWhenFreed(); first.cycle = first
del first
_imports._last_len = -1
gc.set_threshold(1, 1, 1)
gc.enable()
_imports.sweep_once()
gc.disable()
print(ImportsWhenFreed.n, errors)
"""


def test_a_collection_that_imports_during_the_sweep_does_not_break_it(tmp_path: Path) -> None:
    """The container tests' sweeper error, reproduced: copying sys.modules with
    ``list(sys.modules.items())`` allocates a tuple per module past the free list, a
    collection that sets off runs finalizers (Python code; on a loaded machine another
    thread's imports run in between), and sys.modules changes under the copy. Before the fix
    this test got the containers' very message, "sweeper: RuntimeError: dictionary changed
    size during iteration (at _imports.py:293)". ``sys.modules.copy()`` copies in one call."""
    import subprocess
    import sys

    env = {"VERIFIER_PROBE_DIR": str(tmp_path / "probe"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", _GC_RACE], capture_output=True, text=True,
                         timeout=60, env=env, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    finalized, errors = out.stdout.split(" ", 1)
    assert int(finalized) > 1  # the finalizers ran, during the sweep
    assert errors.strip() == "[]", errors
