"""``[[distributions]]``: a pristine distribution pinned to the version and content its wheel
published, against the attacks ``pristine`` alone cannot see, built for real.

``pristine`` compares each loaded file with the sha256 its installed RECORD lists, and the
installer writes that RECORD. So each of these PASSes ``pristine = ["fakedist"]`` (asserted,
the documented gap): a file and its RECORD line edited together in the image; a wheel rebuilt
with other code under the same name and version, installed by pip; another version, installed
by pip; and, a variation, a second ``.dist-info`` of the same name and version in the same
site whose RECORD vouches for the edited file. With the pin that ``verifier policy pin-wheel``
computes from the published wheel, each FAILs ``provenance.distribution.mismatch``; the
published wheel installed by pip, with and without bytecode compiled at install, gives the
same content digest and PASSes.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from servewitness._cli.policy_cmd import render_policy
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.evidence.content import wheel_content
from servewitness.evidence.distindex import DistIndex
from servewitness.model import ProcessReport, Severity, Verdict
from servewitness.policy import findings as F
from servewitness.policy import load_policy
from servewitness.policy.interface import PolicyError
from servewitness.wire import files as wire_files
from tests.helpers import probe_env, probed_report, verifier_cli, weak_policy
from tests.test_gate_time_attacks import make_lab
from tests.test_loader_claims import judge

PUBLISHED = "VALUE = 'published'\n"
EVIL = "VALUE = 'evil!!!!!'\n"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def build_wheel(out: Path, version: str = "1.0", core: str = PUBLISHED) -> Path:
    """A fakedist wheel (what a publisher uploads): its package, METADATA, WHEEL, RECORD."""
    info = f"fakedist-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: fakedist\nVersion: {version}\n"
    files = {
        "fakedist/__init__.py": b"",
        "fakedist/core.py": core.encode(),
        f"{info}/METADATA": metadata.encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    rows = [f"{p},sha256={b64(d)},{len(d)}" for p, d in files.items()] + [f"{info}/RECORD,,"]
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fakedist-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, d in files.items():
            zf.writestr(p, d)
        zf.writestr(f"{info}/RECORD", "\n".join(rows) + "\n")
    return path


def pip_install(wheel: Path, target: Path, *, compile_pyc: bool = True) -> Path:
    """WHEEL installed into TARGET by the real pip, by name from the wheel's folder as from
    an index (a wheel installed by its path is a local install: not pristine, by design)."""
    name, version = wheel.name.split("-")[:2]
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    cmd += ["--disable-pip-version-check", "--find-links", str(wheel.parent)]
    cmd += ["--target", str(target), f"{name}=={version}"]
    cmd += [] if compile_pyc else ["--no-compile"]
    subprocess.run(cmd, check=True, timeout=120, capture_output=True)
    return target


def edit_together(site: Path, rel: str, data: bytes) -> None:
    """REL in SITE rewritten with DATA and its RECORD line with it: what an image build can
    do (the file is pristine against the RECORD that results)."""
    (site / rel).write_bytes(data)
    (info,) = site.glob("fakedist-*.dist-info")
    lines = (info / "RECORD").read_text().splitlines()
    lines = [f"{rel},sha256={b64(data)},{len(data)}" if ln.startswith(f"{rel},") else ln
             for ln in lines]  # fmt: skip
    (info / "RECORD").write_text("\n".join(lines) + "\n")


def run(tmp: Path, site: Path) -> tuple[str, ProcessReport]:
    """A probed interpreter (early probe) with SITE on PYTHONPATH that imports fakedist.core:
    what it printed (repr of VALUE) and the agent's report, once swept."""
    out = tmp / f"out-{time.monotonic_ns()}"
    env = probe_env(
        tmp / "probe", VERIFIER_PROBE_EARLY="1", PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1"
    )
    script = (
        "import sys, time, fakedist.core\n"
        "open(sys.argv[1], 'w').write(repr(fakedist.core.VALUE))\n"
        "time.sleep(600)\n"
    )
    return probed_report([sys.executable, "-c", script, str(out)], env, out)


def policy(pin: str = "") -> str:
    return weak_policy('version = 1\n[provenance]\npristine = ["fakedist"]\n' + pin)


def pin_of(wheel: Path) -> str:
    """``verifier policy pin-wheel WHEEL``'s output, run as a user would."""
    res = verifier_cli("policy", "pin-wheel", str(wheel))
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheels"))


@pytest.fixture(scope="module")
def honest(published: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ProcessReport]:
    """The published wheel installed by pip, and a probed process's report of it."""
    tmp = tmp_path_factory.mktemp("honest")
    site = pip_install(published, tmp / "site")
    result, report = run(tmp, site)
    assert result == repr("published")
    return site, report


def test_the_published_wheel_installed_by_pip_passes_its_pin(
    published: Path, honest: tuple[Path, ProcessReport]
) -> None:
    """Control: the agent's content digest of pip's install is the one ``pin-wheel`` computes
    from the wheel file; under the pin the process PASSes."""
    _, report = honest
    pin = pin_of(published)
    assert report.provenance is not None
    mine = [c for c in report.provenance.contents if c[0] == "fakedist"]
    assert mine == [("fakedist", "1.0", wheel_content(published).sha256)], mine
    wheel_sha = hashlib.sha256(published.read_bytes()).hexdigest()
    assert f"the wheel's sha256 is {wheel_sha}" in pin
    res = verifier_cli("policy", "pin-wheel", str(published), "--json")
    assert json.loads(res.stdout) == {
        "pins": [
            {
                "wheel": str(published),
                "name": "fakedist",
                "version": "1.0",
                "content_sha256": wheel_content(published).sha256,
                "wheel_sha256": wheel_sha,
            }
        ]
    }
    verdict, found = judge(report, policy(pin))
    assert verdict == Verdict.PASS, found


def test_installs_of_one_wheel_give_one_digest(published: Path, tmp_path: Path) -> None:
    """pip with bytecode compiled at install (its pyc rows carry install-time mtimes) and
    without: one content digest, the wheel's."""
    digests = set()
    for compile_pyc in (True, False):
        site = pip_install(published, tmp_path / f"site-{compile_pyc}", compile_pyc=compile_pyc)
        assert any(site.rglob("*.pyc")) == compile_pyc
        index = DistIndex(Path)
        index.add_site(str(site))
        ((_, _, digest),) = index.contents([("fakedist", "1.0")])
        digests.add(digest)
    assert digests == {wheel_content(published).sha256}


@pytest.mark.parametrize("attack", ["edited_together", "rebuilt_wheel", "other_version"])
def test_what_pristine_passes_the_pin_fails(published: Path, tmp_path: Path, attack: str) -> None:
    """Attack: EVIL served from a fakedist whose RECORD agrees with it: the file and its
    RECORD line edited together; a wheel rebuilt with EVIL under the same name and version;
    version 2.0 (honest, but not the one pinned). Gets: PASS under ``pristine`` alone (every
    loaded file matches its RECORD). Sound: FAIL ``provenance.distribution.mismatch`` under
    the published wheel's pin."""
    if attack == "edited_together":
        site = pip_install(published, tmp_path / "site", compile_pyc=False)
        edit_together(site, "fakedist/core.py", EVIL.encode())
    elif attack == "rebuilt_wheel":
        rebuilt = build_wheel(tmp_path / "rebuilt", core=EVIL)
        site = pip_install(rebuilt, tmp_path / "site")
    else:
        site = pip_install(build_wheel(tmp_path / "v2", "2.0"), tmp_path / "site")
    result, report = run(tmp_path, site)
    assert result == repr("published" if attack == "other_version" else "evil!!!!!")
    verdict, found = judge(report, policy())
    assert verdict == Verdict.PASS, found  # the gap the pin closes
    verdict, found = judge(report, policy(pin_of(published)))
    assert verdict == Verdict.FAIL
    hit = found[F.DISTRIBUTION_MISMATCH]
    assert hit.severity == Severity.ERROR
    why = "version 2.0 is installed" if attack == "other_version" else "RECORD lists other"
    assert why in hit.message, hit.message


def test_a_second_dist_info_of_the_same_name_vouching_for_the_edit_fails(
    published: Path, tmp_path: Path
) -> None:
    """Variation: the published install left as it is, core.py edited, and a second
    ``.dist-info`` of fakedist 1.0 (another spelling of the name) added to the same site whose
    RECORD lists the edited bytes. The index keeps one distribution per name per site; a pin
    that looked at that one only would see the published content. Sound: every install of
    the name is reported, and the second one's content breaks the pin."""
    site = pip_install(published, tmp_path / "site", compile_pyc=False)
    (site / "fakedist" / "core.py").write_text(EVIL)
    second = site / "FakeDist-1.0.dist-info"
    second.mkdir()
    (second / "METADATA").write_text("Metadata-Version: 2.1\nName: FakeDist\nVersion: 1.0\n")
    row = f"fakedist/core.py,sha256={b64(EVIL.encode())},{len(EVIL)}"
    (second / "RECORD").write_text(f"{row}\nFakeDist-1.0.dist-info/RECORD,,\n")
    result, report = run(tmp_path, site)
    assert result == repr("evil!!!!!")
    assert report.provenance is not None
    assert len([c for c in report.provenance.contents if c[0] == "fakedist"]) == 2
    verdict, found = judge(report, policy(pin_of(published)))
    assert verdict == Verdict.FAIL
    assert F.DISTRIBUTION_MISMATCH in found


def test_policy_init_pins_each_pristine_distribution(
    published: Path, honest: tuple[Path, ProcessReport]
) -> None:
    """``policy init`` writes the pin from the boot's RECORD: the same as the wheel's."""
    _, report = honest
    r = dataclasses.replace(report, role="api_server")
    text = render_policy("pid 1", r, allow_unsafe=True, tree=(r,))
    digest = wheel_content(published).sha256
    assert (
        f'[[distributions]]\nname = "fakedist"\nversion = "1.0"\ncontent_sha256 = "{digest}"'
        in (text)
    ), text
    _, found = judge(report, text)
    assert F.DISTRIBUTION_MISMATCH not in found, found


def test_a_report_without_contents_does_not_match_a_pin(honest: tuple[Path, ProcessReport]) -> None:
    """Fail closed: a process that loaded the pinned distribution's files but reports no
    content digest for it (an agent before the pins) does not match."""
    _, report = honest
    assert report.provenance is not None
    bare = dataclasses.replace(
        report, provenance=dataclasses.replace(report.provenance, contents=())
    )
    verdict, found = judge(bare, policy('[[distributions]]\nname = "fakedist"\nversion = "1.0"\n'))
    assert verdict == Verdict.FAIL and "not reported" in found[F.DISTRIBUTION_MISMATCH].message


@pytest.mark.parametrize(
    ("pin", "message"),
    [
        ('name = "torch"\nversion = "1"\n', "not in provenance.pristine"),
        ('name = "fakedist"\nversion = "1"\n[[distributions]]\nname = "FakeDist"\nversion = "1"\n',
         "pinned twice"),
        ('name = "fakedist"\nversion = "1"\ncontent_sha256 = "x"\n', "64 lowercase hex"),
        ('name = "fakedist"\nversion = " 1"\n', "as METADATA writes it"),
        ('name = "fakedist"\n', "version"),
    ],
)  # fmt: skip
def test_pins_fail_closed_at_load(pin: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        load_policy(policy("[[distributions]]\n" + pin))


def test_contents_cross_the_wire_and_the_live_verifier_judges_the_pin(
    published: Path, honest: tuple[Path, ProcessReport], tmp_path: Path
) -> None:
    """The honest report sent to a real ``verifier serve`` over mTLS: the run pinned to the
    published wheel PASSes, the run pinned to the rebuilt one FAILs (the digest crossed the
    wire: a verifier without it would fail both as "not reported")."""
    _, report = honest
    assert report.provenance is not None
    back = wire_files.provenance_from_pb(wire_files.provenance_to_pb(report.provenance), "p")
    assert back == report.provenance
    rebuilt = build_wheel(tmp_path / "rebuilt", core=EVIL)
    runs = {"published": policy(pin_of(published)), "rebuilt": policy(pin_of(rebuilt))}
    L = make_lab(tmp_path / "lab", runs)
    L.start()
    try:
        for target in runs:
            L.report(target, (dataclasses.replace(report, role="api_server"),))
        got = {t: status_of(L, f"r-{t}") for t in runs}
    finally:
        L.stop()
    assert got["published"][0] == "VERDICT_PASS", got
    assert got["rebuilt"][0] == "VERDICT_FAIL" and F.DISTRIBUTION_MISMATCH in got["rebuilt"][1]


def status_of(L: Any, run: str) -> tuple[str, set[str]]:
    from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc

    with L.channel("ci") as ch:
        got = pb_grpc.VerifierServiceStub(ch).GetRunStatus(pb.GetRunStatusRequest(name=run))
    return str(pb.Verdict.Name(got.verdict.verdict)), {
        f.id for t in got.verdict.targets for f in t.findings
    }


def test_pin_wheel_refuses_what_is_not_a_wheel(tmp_path: Path) -> None:
    bad = tmp_path / "x.whl"
    bad.write_bytes(b"not a zip")
    res = verifier_cli("policy", "pin-wheel", str(bad))
    assert res.returncode == 3 and "not a readable wheel" in res.stderr, res.stderr
