"""Outside attacks on ``[[distributions]]`` pins (a tester who read docs/policy.md "Pinning
what was published", its reference block and findings row, and docs/threat-model.md's row "a
pristine distribution that is not the published one" first; then the tests only).

Each attack is built for real: the published ``fakedist`` wheel installed by the real pip
(``tests/test_distribution_pins.py``'s harness), the install then edited the way an image
build can, a probed interpreter (early probe) that imports ``fakedist.core`` and prints its
``VALUE``, the agent's own report of it and the real policy engine under

    [provenance] pristine = ["fakedist"]
    + the [[distributions]] entry `verifier policy pin-wheel` prints for the published wheel

Every attack makes the process run ``VALUE = 'evil!!!!!'`` (a precondition: a RuntimeError
when it did not), which the published wheel does not contain. Each test asserts the SOUND
outcome (FAIL); its docstring says what the attack got. Attacks that PASS today are marked
``xfail(strict=True)`` with the reason.

Found PASSing when written (three attacks, two roots), all closed the same session (the
digest counts a row where it resolves, ``evidence/content.py``; rows that disagree about a
file make it patched against the one it differs from, ``evidence/origins.py``):

* a RECORD row whose path leaves the site directory by its text (``../site/...`` or an
  absolute path) but resolves to a file inside it is left out of the content digest (as the
  installer's scripts and data are) while the file classifier reads it: an extra row vouches
  for an edited ``core.py`` (the later row for one file wins), or for a new package
  ``fakedist/core/`` that shadows the published ``core.py``;
* another distribution's RECORD in the same site listing ``fakedist/core.py`` with other
  bytes takes the file away from fakedist (pristine against the made-up RECORD, neither
  required pristine nor pinned), while fakedist's install keeps the published digest.

Caught: a ``__pycache__/..`` spelling (the digest counts it), a row without a hash, a
second row for the same path, a row with no size column, a forged ``__pycache__`` pyc, a
sourceless pyc, and a second install of the name under another folder name.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from servewitness.model import ProcessReport, Verdict
from servewitness.policy import findings as F
from tests.test_distribution_pins import (
    EVIL,
    PUBLISHED,
    b64,
    build_wheel,
    pin_of,
    pip_install,
    policy,
    run,
)
from tests.test_loader_claims import judge, shown

EVIL_B = EVIL.encode()
assert len(EVIL_B) == len(PUBLISHED.encode())  # one size: a pyc header cannot tell them apart


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheels"))


@pytest.fixture(scope="module")
def pinned(wheel: Path) -> str:
    """The policy: pristine fakedist + the pin ``verifier policy pin-wheel`` prints."""
    return policy(pin_of(wheel))


@pytest.fixture(scope="module")
def base(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The published wheel installed by pip (no bytecode), copied for each attack."""
    return pip_install(wheel, tmp_path_factory.mktemp("base") / "site", compile_pyc=False)


def copy_site(base: Path, tmp: Path) -> Path:
    site = tmp / "site"
    shutil.copytree(base, site)
    return site


def record_of(site: Path, name: str = "fakedist") -> Path:
    (info,) = site.glob(f"{name}-*.dist-info")
    return info / "RECORD"


def add_rows(site: Path, *rows: str, first: bool = False) -> None:
    """ROWS added to fakedist's installed RECORD (after its rows, or FIRST before them)."""
    rec = record_of(site)
    lines = rec.read_text().splitlines()
    lines = [*rows, *lines] if first else [*lines, *rows]
    rec.write_text("\n".join(lines) + "\n")


def row(path: str, data: bytes = EVIL_B) -> str:
    return f"{path},sha256={b64(data)},{len(data)}"


def pyc_of(source: bytes, filename: str, mtime: int, size: int) -> bytes:
    """A timestamp pyc of SOURCE whose header names MTIME and SIZE."""
    from importlib import _bootstrap_external as be

    code = compile(source, filename, "exec")
    return bytes(be._code_to_timestamp_pyc(code, mtime, size))  # type: ignore[attr-defined]


def served_evil(tmp: Path, site: Path) -> ProcessReport:
    """The process run over SITE; a RuntimeError unless it ran the attacker's VALUE."""
    result, report = run(tmp, site)
    if result != repr("evil!!!!!"):
        raise RuntimeError(f"the attack did not serve the attacker's code: {result!r}")
    return report


def assert_fails(report: ProcessReport, text: str) -> None:
    verdict, found = judge(report, text)
    assert verdict == Verdict.FAIL, (verdict, shown(found))


# -- control -------------------------------------------------------------------------------


def test_control_the_published_install_passes_the_pin(
    base: Path, pinned: str, tmp_path: Path
) -> None:
    """Control: the published wheel, installed by pip and copied as every attack below copies
    it, PASSes the pin (so each FAIL below is the attack's, not the harness's)."""
    result, report = run(tmp_path, copy_site(base, tmp_path))
    assert result == repr("published")
    verdict, found = judge(report, pinned)
    assert verdict == Verdict.PASS, shown(found)
    assert F.DISTRIBUTION_MISMATCH not in found


# -- RECORD rows the digest leaves out, that the file classifier still reads ---------------


DOTDOT = "dotdot"
ABSOLUTE = "absolute"
PYCACHE_DOTDOT = "pycache_dotdot"


# closed in session 29 (was an xfail: it PASSed)
@pytest.mark.parametrize("spelling", [DOTDOT, ABSOLUTE])
def test_an_extra_row_outside_the_digest_vouches_for_an_edited_file(
    base: Path, pinned: str, tmp_path: Path, spelling: str
) -> None:
    """Attack: core.py edited in the install; fakedist's RECORD keeps its published row for
    ``fakedist/core.py`` and gains one more row naming the same file by a path that leaves
    the site directory and comes back (``../site/fakedist/core.py``) or by its absolute path,
    with the edited bytes' sha256. Gets: PASS under the published wheel's pin (the digest
    leaves the row out as "installed outside the site directory", the classifier finds the
    file pristine against it). Sound: FAIL: a RECORD row that resolves into the site is part
    of what the install vouches for (in the digest, or refused), and two rows for one file
    that disagree are not pristine."""
    site = copy_site(base, tmp_path)
    (site / "fakedist" / "core.py").write_bytes(EVIL_B)
    path = "../site/fakedist/core.py" if spelling == DOTDOT else str(site / "fakedist/core.py")
    add_rows(site, row(path))
    assert_fails(served_evil(tmp_path, site), pinned)


def test_a_row_through_pycache_vouches_for_an_edited_file(
    base: Path, pinned: str, tmp_path: Path
) -> None:
    """Attack: as above, the extra row spelled ``fakedist/__pycache__/../core.py`` (a path
    with a ``__pycache__`` part, perhaps left out as bytecode, that normalizes to core.py).
    Sound: FAIL."""
    site = copy_site(base, tmp_path)
    (site / "fakedist" / "core.py").write_bytes(EVIL_B)
    add_rows(site, row("fakedist/__pycache__/../core.py"))
    assert_fails(served_evil(tmp_path, site), pinned)


# closed in session 29 (was an xfail: it PASSed)
def test_a_new_package_shadowing_a_published_module_through_an_outside_row(
    base: Path, pinned: str, tmp_path: Path
) -> None:
    """Attack: the published files untouched, RECORD's published rows untouched; a package
    ``fakedist/core/__init__.py`` added (the import system prefers it to ``core.py``) and
    listed by a row ``../site/fakedist/core/__init__.py``. Gets: PASS. Sound: FAIL (the file
    is in the package folder: in the digest, or ``added``)."""
    site = copy_site(base, tmp_path)
    (site / "fakedist" / "core").mkdir()
    (site / "fakedist" / "core" / "__init__.py").write_bytes(EVIL_B)
    add_rows(site, row("../site/fakedist/core/__init__.py"))
    assert_fails(served_evil(tmp_path, site), pinned)


def test_a_new_package_listed_by_a_row_without_a_hash(
    base: Path, pinned: str, tmp_path: Path
) -> None:
    """Caught (``provenance.not_pristine``: "lists it without a hash"; the row itself is
    outside the digest). Attack: the shadowing package listed by a row without a hash
    (``fakedist/core/__init__.py,,``, as RECORD lists itself), perhaps left out of the
    digest as the RECORD's own row is. Sound: FAIL (a file with no hash is not pristine)."""
    site = copy_site(base, tmp_path)
    (site / "fakedist" / "core").mkdir()
    (site / "fakedist" / "core" / "__init__.py").write_bytes(EVIL_B)
    add_rows(site, "fakedist/core/__init__.py,,")
    assert_fails(served_evil(tmp_path, site), pinned)


# -- two rows for one path -------------------------------------------------------------------


@pytest.mark.parametrize("first", [False, True], ids=["evil_last", "evil_first"])
def test_two_rows_for_one_path(base: Path, pinned: str, tmp_path: Path, first: bool) -> None:
    """Attack: core.py edited; a second ``fakedist/core.py`` row with its sha256 added after
    (or before) the published one: a digest that keeps one row per path and a classifier that
    keeps the other would disagree. Sound: FAIL. Caught by the pin alone
    (``provenance.distribution.mismatch``: the digest has both rows); the file classifier
    took the appended evil row and found core.py pristine."""
    site = copy_site(base, tmp_path)
    (site / "fakedist" / "core.py").write_bytes(EVIL_B)
    add_rows(site, row("fakedist/core.py"), first=first)
    assert_fails(served_evil(tmp_path, site), pinned)


# -- bytecode: outside the digest by design --------------------------------------------------


def test_a_forged_pyc_listed_by_its_own_row(base: Path, pinned: str, tmp_path: Path) -> None:
    """Attack: core.py left published; ``__pycache__/core.cpython-3X.pyc`` compiled from the
    edited source, with the published source's mtime and size in its header (the two are one
    size), and listed in RECORD with its sha256 (bytecode rows are outside the digest).
    Sound: FAIL (the agent compiles the source and compares: bytecode drift). Caught."""
    site = copy_site(base, tmp_path)
    src = site / "fakedist" / "core.py"
    st = src.stat()
    pyc = Path(importlib.util.cache_from_source(str(src)))
    pyc.parent.mkdir()
    data = pyc_of(EVIL_B, str(src), int(st.st_mtime), st.st_size)
    pyc.write_bytes(data)
    add_rows(site, row(str(pyc.relative_to(site)), data))
    assert_fails(served_evil(tmp_path, site), pinned)


# -- another distribution's RECORD for a file of the pinned one ------------------------------


# closed in session 29 (was an xfail: it PASSed)
@pytest.mark.parametrize("other", ["aaadist", "zzzdist"])
def test_another_distribution_in_the_same_site_claims_a_pinned_module(
    base: Path, pinned: str, tmp_path: Path, other: str
) -> None:
    """Attack: core.py edited; fakedist's RECORD left published; a made-up distribution
    OTHER in the same site whose RECORD lists ``fakedist/core.py`` with the edited bytes. If
    the index gives the file to OTHER (not pristine-required, not pinned), fakedist's own
    install still reports the published digest. Sound: FAIL (two installations of one file
    that disagree, or the file judged as fakedist's)."""
    site = copy_site(base, tmp_path)
    (site / "fakedist" / "core.py").write_bytes(EVIL_B)
    info = site / f"{other}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {other}\nVersion: 1.0\n")
    (info / "RECORD").write_text(f"{row('fakedist/core.py')}\n{info.name}/RECORD,,\n")
    assert_fails(served_evil(tmp_path, site), pinned)


def test_a_second_install_of_the_name_under_another_folder_name(
    base: Path, pinned: str, tmp_path: Path
) -> None:
    """Attack: as the harness's second ``.dist-info`` test, the folder named for another
    distribution (``evil-1.0.dist-info``) while its METADATA says ``Name: fakedist``: a
    report that collects installs by folder name would miss it. Sound: FAIL. Caught
    (``provenance.distribution.mismatch``, and "a second fakedist": not pristine)."""
    site = copy_site(base, tmp_path)
    (site / "fakedist" / "core.py").write_bytes(EVIL_B)
    info = site / "evil-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakedist\nVersion: 1.0\n")
    (info / "RECORD").write_text(f"{row('fakedist/core.py')}\n{info.name}/RECORD,,\n")
    assert_fails(served_evil(tmp_path, site), pinned)


def test_a_sourceless_pyc_listed_by_a_bytecode_row(base: Path, pinned: str, tmp_path: Path) -> None:
    """Attack: core.py removed (its published row kept: a file not loaded is not looked at)
    and ``fakedist/core.pyc`` (the edited code, no source beside it) listed by a row of its
    own: a bytecode row, outside the digest. Sound: FAIL. Caught
    (``provenance.bytecode.sourceless``, drift; not the pin)."""
    site = copy_site(base, tmp_path)
    (site / "fakedist" / "core.py").unlink()
    data = pyc_of(EVIL_B, "core.py", 0, 0)
    (site / "fakedist" / "core.pyc").write_bytes(data)
    add_rows(site, row("fakedist/core.pyc", data))
    assert_fails(served_evil(tmp_path, site), pinned)


def test_a_row_without_its_size_column(base: Path, pinned: str, tmp_path: Path) -> None:
    """Attack: core.py edited and a second ``fakedist/core.py`` row of two columns (path and
    hash, no size), which the digest skips as malformed: a classifier that read it would
    take its hash. Sound: FAIL. Caught (``provenance.record.unreadable`` made an error by
    ``pristine``: "malformed rows skipped"; the published row then says ``patched``)."""
    site = copy_site(base, tmp_path)
    (site / "fakedist" / "core.py").write_bytes(EVIL_B)
    add_rows(site, f"fakedist/core.py,sha256={b64(EVIL_B)}")
    assert_fails(served_evil(tmp_path, site), pinned)
