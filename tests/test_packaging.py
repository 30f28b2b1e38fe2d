"""The wheel built from this tree (`pip wheel`, the project's own build backend, no network):
it says the package is typed (PEP 561 ``py.typed``), ships the policy's JSON Schema, carries
every file of the package and nothing of the tests, and declares the runtime dependencies
the daemons import."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest

import servewitness
from tests.helpers import REPO

PKG = servewitness.__name__  # the import package, whatever it is called
PKG_DIR = Path(servewitness.__file__).parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-q", "-w", str(out), str(REPO)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    wheels = sorted(out.glob("*.whl"))
    main = [w for w in wheels if f"{PKG}/__init__.py" in _names(w)]
    assert len(main) == 1, wheels
    with zipfile.ZipFile(main[0]) as z:
        yield z


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def _package_files() -> set[str]:
    """Every file of the import package in this tree, as the wheel names it."""
    ignored = subprocess.run(
        ["git", "ls-files", "--others", "--ignored", "--exclude-standard", "--", str(PKG_DIR)],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    skip = {str((REPO / p).resolve()) for p in ignored}
    return {
        f"{PKG}/{p.relative_to(PKG_DIR).as_posix()}"
        for p in PKG_DIR.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and str(p.resolve()) not in skip
    }


def test_the_wheel_says_the_package_is_typed(wheel: zipfile.ZipFile) -> None:
    assert f"{PKG}/py.typed" in wheel.namelist()
    assert (PKG_DIR / "py.typed").exists()


def test_the_wheel_ships_the_policy_schema_as_in_the_tree(wheel: zipfile.ZipFile) -> None:
    name = f"{PKG}/policy/policy.schema.json"
    assert wheel.read(name) == (PKG_DIR / "policy" / "policy.schema.json").read_bytes()


def test_the_wheel_carries_every_package_file_and_no_tests(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    mine = {n for n in names if n.startswith(f"{PKG}/")}
    assert mine == _package_files()
    assert not [n for n in names if n.startswith(("tests/", "bench/", "scripts/"))]


def test_the_wheel_declares_what_the_daemons_import(wheel: zipfile.ZipFile) -> None:
    meta_name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(wheel.read(meta_name).decode())
    required = {r.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()
                for r in meta.get_all("Requires-Dist") or () if "extra ==" not in r}  # fmt: skip
    assert {"prometheus-client", "grpcio-reflection", "grpcio", "protobuf"} <= {
        r.replace("_", "-") for r in required
    }
