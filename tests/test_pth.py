"""``.pth`` files: every one in a site directory is hashed, and one that executes code with
bytes no RECORD vouches for fails the default policy. Built for real in a fresh venv (what
``site`` really processes: a ``.pth`` on ``PYTHONPATH`` alone is never executed), judged from
outside by ``verifier inspect``; the controls are a path-only ``.pth``, one a distribution's
RECORD claims, and this project's and setuptools' own in the shared venv."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from servewitness.model import DRIFT_CHANGED_AFTER_START, DRIFT_PTH_UNCLAIMED, Origin, Severity
from tests.helpers import SOURCE_PATH
from tests.test_unfiled import Judged, run_probed

VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"
MARK = "import os; open(os.environ['PTH_MARK'] + '.{name}', 'w').write('ran')\n"
PTH = {
    # runs code, and nothing claims it: the attack
    "evil.pth": MARK.format(name="evil"),
    # the import line hidden behind a bare carriage return (site reads universal newlines)
    "hidden.pth": "# only a path here\r/nonexistent\r" + MARK.format(name="hidden"),
    # runs code, then a thread rewrites it to look harmless before a late probe looks
    "cleaner.pth": (
        "import os, threading, time; "
        "threading.Thread(target=lambda f=fullname, t=time: (t.sleep(0.5), "
        "open(f, 'w').write('# nothing here\\n')), daemon=True).start(); "
        + MARK.format(name="cleaner")
    ),
    # controls: a path only (no code), and one a RECORD claims with its bytes
    "paths.pth": "../extra\n",
    "claimed.pth": MARK.format(name="claimed"),
    # claimed, but its RECORD lists other bytes (patched after installation)
    "patched.pth": MARK.format(name="patched"),
}
# site imports it after the .pth files, before any late probe: an ordinary import, recorded
SITECUSTOMIZE = MARK.format(name="sitecustomize")
SCRIPT = """\
import os, time
import servewitness_probe
time.sleep(1)                  # the plugin starts late; the cleaner has done its work
servewitness_probe.start()
open(os.environ["READY_FILE"], "w").write("ready")
time.sleep(600)
"""


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Judged]]:
    tmp = tmp_path_factory.mktemp("pth")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True)
    site = tmp / "venv" / "lib" / VERSION / "site-packages"
    for name, text in PTH.items():
        (site / name).write_text(text)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    info = site / "goodpth-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: goodpth\nVersion: 1.0\n")
    claimed = PTH["claimed.pth"].encode()
    rows = [f"claimed.pth,{_record_hash(claimed)},{len(claimed)}"]
    rows += [f"patched.pth,{_record_hash(b'the published bytes')},19", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    script = tmp / "app.py"
    script.write_text(textwrap.dedent(SCRIPT))
    got = run_probed(
        tmp,
        [str(tmp / "venv" / "bin" / "python"), str(script)],
        # the fresh venv sees no installed package: the probe under test comes from this checkout
        env={"PTH_MARK": str(tmp / "mark"), "PYTHONPATH": SOURCE_PATH},
        early=False,
    )
    yield tmp, got


def test_every_pth_of_the_site_directory_is_hashed(venv: tuple[Path, Judged]) -> None:
    tmp, got = venv
    site = tmp / "venv" / "lib" / VERSION / "site-packages"
    recorded = {Path(f.path).name: f for f in got.files(kind="pth")}
    assert recorded.keys() == PTH.keys()
    for name in PTH.keys() - {"cleaner.pth"}:
        assert recorded[name].sha256 == hashlib.sha256((site / name).read_bytes()).hexdigest()
    # site really executed each one that has an import line, the hidden one too
    for name in ("evil", "hidden", "cleaner", "claimed", "patched"):
        assert (tmp / f"mark.{name}").read_text() == "ran", name


def test_a_pth_that_executes_code_and_no_record_claims_fails(venv: tuple[Path, Judged]) -> None:
    _, got = venv
    flagged = {Path(p).name for p in got.drift_paths(DRIFT_PTH_UNCLAIMED)}
    assert flagged == {"evil.pth", "hidden.pth", "patched.pth"}
    details = {Path(d.path).name: d.detail for d in got.report.drift if d.id == DRIFT_PTH_UNCLAIMED}
    assert "line 3" in details["hidden.pth"] and "patched" in details["patched.pth"]
    assert got.findings()[DRIFT_PTH_UNCLAIMED] == Severity.ERROR


def test_a_pth_that_cleaned_itself_up_before_the_probe_looked_is_caught(
    venv: tuple[Path, Judged],
) -> None:
    """The cleaner's file holds harmless bytes when the late probe hashes it, and the agent
    reads the same: but it changed after the process started, and site ran it before."""
    _, got = venv
    [f] = [f for f in got.files(kind="pth") if f.path.endswith("/cleaner.pth")]
    assert f.sha256 == hashlib.sha256(b"# nothing here\n").hexdigest()
    assert f.path in got.drift_paths(DRIFT_CHANGED_AFTER_START)
    assert got.findings()[DRIFT_CHANGED_AFTER_START] == Severity.ERROR


def test_sitecustomize_is_an_ordinary_import_recorded_with_its_bytes(
    venv: tuple[Path, Judged],
) -> None:
    """``site`` imports ``sitecustomize`` at every start, before a late probe: it is recorded
    by module name with the bytes it holds (hashed after the fact), and judged as the
    unclaimed file it is, never left out."""
    tmp, got = venv
    assert (tmp / "mark.sitecustomize").read_text() == "ran"
    [f] = [f for f in got.files() if f.module == "sitecustomize"]
    site = tmp / "venv" / "lib" / VERSION / "site-packages"
    assert f.path == str(site / "sitecustomize.py")
    assert f.sha256 == hashlib.sha256(SITECUSTOMIZE.encode()).hexdigest()
    assert got.report.provenance is not None
    [o] = [o for o in got.report.provenance.files if o.path == f.path]
    # no RECORD claims it (pinned only by a policy's [[files]]); under the temporary directory
    # this venv lies in, its class is "generated", elsewhere "unknown": never pristine
    assert o.distribution is None and o.origin in (Origin.UNKNOWN, Origin.GENERATED)


def test_the_controls_are_not_flagged(venv: tuple[Path, Judged]) -> None:
    _, got = venv
    quiet = [d for d in got.report.drift if Path(d.path).name in ("paths.pth", "claimed.pth")]
    assert quiet == []


def test_this_projects_and_setuptools_pth_files_are_claimed(tmp_path: Path) -> None:
    """In the shared venv (the early probe loads from its own ``.pth``): each ``.pth`` of the
    venv's site directory is recorded, none is flagged, and no ``.pth`` of the base
    interpreter (a directory the venv never processes) is recorded."""
    script = tmp_path / "plain.py"
    script.write_text(
        "import os, time\nopen(os.environ['READY_FILE'], 'w').write('ready')\ntime.sleep(600)\n"
    )
    got = run_probed(tmp_path, [sys.executable, str(script)])
    site = Path(sys.prefix) / "lib" / VERSION / "site-packages"
    recorded = {Path(f.path) for f in got.files(kind="pth")}
    assert {site / "servewitness_probe_early.pth", site / "distutils-precedence.pth"} <= recorded
    assert {p.parent for p in recorded} == {site}
    assert got.drift_paths(DRIFT_PTH_UNCLAIMED) == set()
    assert got.report.drift == ()
