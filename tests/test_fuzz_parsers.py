"""Hostile input: every parser that reads bytes someone else wrote either returns a well-formed
result or raises the error it documents, never another exception, never hangs.

Property-based (hypothesis), bounded: each property runs at most ``FUZZ_EXAMPLES`` examples
(env ``VERIFIER_FUZZ_EXAMPLES``, default 200), derandomized so CI sees the same inputs every
run (``VERIFIER_FUZZ_RANDOM=1`` draws new ones). Each bug these found is kept as an
``@example``. docs/threat-model.md ("Hostile input") lists the contracts held here.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import json
import math
import os
import string
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from servewitness_probe import layout as L

from servewitness import wire
from servewitness.errors import NoSuchProcess
from servewitness.evidence import bytecode as bc
from servewitness.evidence.bindings_reader import BindingsReader, ExternalId, RequestSpan
from servewitness.evidence.codecheck import CodeCache, check_chains
from servewitness.evidence.container import (
    RUNTIMES,
    ContainerRef,
    container_from_cgroup,
    container_from_mountinfo,
    resolve_container,
)
from servewitness.evidence.distindex import DistIndex
from servewitness.evidence.journal import parse, read_journal
from servewitness.evidence.native import executable_files
from servewitness.evidence.probe_reader import ProbeState, read_probe_dir
from servewitness.evidence.procfs import ProcFS, mapped_files
from servewitness.ledger import dsse
from servewitness.ledger.errors import BundleCorrupt, WrongKey
from servewitness.ledger.verify_bundle import check_bundle, verify_bundle
from servewitness.model import FileEntry, ProcessKey, ProcessReport, TargetReport
from servewitness.policy import PolicyError, load_policy

FUZZ_EXAMPLES = int(os.environ.get("VERIFIER_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    database=None,
    derandomize=not os.environ.get("VERIFIER_FUZZ_RANDOM"),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

# Line breaks str.splitlines() honours besides "\n": valid in file names, cgroup and mount
# paths, and never escaped by the kernel.
ODD_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
# Text with a bias for what breaks parsers: separators, quotes, escapes, odd line breaks.
HOSTILE = st.text(
    alphabet=st.one_of(
        st.sampled_from(list(" \t\n/:-_.()[]{}\"'\\=,#0123456789abcdef" + ODD_BREAKS)),
        st.characters(codec="utf-8"),
    ),
    max_size=200,
)
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.just("\ud800"),  # a lone surrogate: json.loads("\"\\ud800\"") gives one
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
DEEP_JSON = b"[" * 100_000 + b"]" * 100_000


def _json_line(value: Any) -> bytes:
    return json.dumps(value).encode()


# 1. /proc ---------------------------------------------------------------------------------


class _BytesProcFS(ProcFS):
    """A ProcFS whose per-process files are given as bytes."""

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__("/nonexistent-proc")
        self.files = files

    def _read(self, pid: int, name: str) -> bytes:
        if name not in self.files:
            raise NoSuchProcess(pid)
        return self.files[name]


@FUZZ
@given(st.binary(max_size=2000))
@example(b"7f00-7f01 r-xp 0 08:01 12 /lib/a\xff\xfe.so\n")
def test_maps_bytes_never_raise(data: bytes) -> None:
    fs = _BytesProcFS({"maps": data})
    execs = executable_files(fs, 1)
    assert len({e.path for e in execs}) == len(execs)
    for e in execs:
        assert e.path.startswith("/") and not e.path.startswith("/memfd:")
        assert isinstance(e.inode, int) and e.inode >= 0
    assert all(p.startswith("/") for p in fs.executable_mappings(1))


_MAP_PATH = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\n\0"), min_size=1, max_size=60
).map(lambda s: "/" + s)


@FUZZ
@given(
    paths=st.lists(_MAP_PATH, min_size=1, max_size=5, unique=True),
    inode=st.integers(min_value=0, max_value=2**63),
    deleted=st.booleans(),
)
@example(paths=["/tmp/a\r7f00-7f01 r-xp 00000000 00:00 0 /usr/lib/libc.so.6"], inode=1,
         deleted=False)  # fmt: skip
@example(paths=["/x\u2028y.so"], inode=5, deleted=True)
def test_maps_paths_round_trip(paths: list[str], inode: int, deleted: bool) -> None:
    """Whatever a file is named (the kernel escapes only "\\n" in maps), the parser finds
    exactly the mapped paths: a name cannot forge a second line or hide the real one."""
    suffix = " (deleted)" if deleted else ""
    lines = [
        f"{0x1000 * i:x}-{0x1000 * i + 0x800:x} r-xp 00000000 08:01 {inode}"
        f"                {p}{suffix}"
        for i, p in enumerate(paths, 1)
    ]
    fs = _BytesProcFS({"maps": ("\n".join(lines) + "\n").encode()})
    execs = executable_files(fs, 1)
    want = [p for p in paths if not p.startswith("/memfd:")]
    # a name that itself ends in " (deleted)" loses that suffix once: as the kernel would
    # show an unlinked file of that name
    got = [e.path + (" (deleted)" if e.unlinked and not deleted else "") for e in execs]
    assert got == list(dict.fromkeys(want))
    assert all(e.inode == inode for e in execs)


@FUZZ
@given(data=st.binary(max_size=2000), inode=st.integers(min_value=0, max_value=2**64))
@example(data=b"1-2 rw-s 0 00:1a 7 /dev/shm/x\n1-2 r--p 0 zz:1 7 /bad\n", inode=7)
def test_mapped_files_of_any_maps_never_raise(data: bytes, inode: int) -> None:
    """``procfs.mapped_files`` over any text (what the state binding reads): well-formed
    (device, inode) pairs only; looking for one inode finds what the whole scan finds of it."""
    text = data.decode(errors="replace")
    every = mapped_files(text)
    assert all(isinstance(d, int) and isinstance(i, int) and i > 0 for d, i in every)
    assert mapped_files(text, inode) == {f for f in every if f[1] == inode}


@FUZZ
@given(
    names=st.lists(_MAP_PATH, min_size=1, max_size=4),
    real=st.tuples(st.integers(0, 4095), st.integers(0, 2**20 - 1), st.integers(1, 2**63)),
    fake=st.tuples(st.integers(0, 4095), st.integers(0, 2**20 - 1), st.integers(1, 2**63)),
)
def test_a_mapped_file_name_cannot_forge_a_mapping(
    names: list[str], real: tuple[int, int, int], fake: tuple[int, int, int]
) -> None:
    """A process's mapped files may be named by anyone: a name that spells another mapping's
    device and inode (as maps prints them) adds nothing to what the binding sees mapped."""
    spelled = f" {fake[0]:02x}:{fake[1]:02x} {fake[2]} "
    lines = [
        f"{0x1000 * i:x}-{0x1000 * i + 0x800:x} rw-s 00000000 {real[0]:02x}:{real[1]:02x} "
        f"{real[2]}      {n}{spelled}{n}"
        for i, n in enumerate(names, 1)
    ]
    text = "\n".join(lines) + "\n"
    want = {(os.makedev(real[0], real[1]), real[2])}
    assert mapped_files(text) == want
    assert mapped_files(text, fake[2]) == (want if fake[2] == real[2] else set())


def _stat_line(comm: bytes, ppid: int, ticks: int) -> bytes:
    rest = [b"S", str(ppid).encode()] + [b"0"] * 17 + [str(ticks).encode()] + [b"0"] * 30
    return b"42 (" + comm + b") " + b" ".join(rest) + b"\n"


@FUZZ
@given(
    comm=st.binary(min_size=0, max_size=15).filter(lambda b: b"\0" not in b),
    ppid=st.integers(min_value=0, max_value=2**22),
    ticks=st.integers(min_value=0, max_value=2**64 - 1),
)
@example(comm=b") 1 2 3 (", ppid=1, ticks=7)
@example(comm=b"\n)\r\xc2\x85", ppid=2, ticks=8)
def test_stat_fields_survive_any_command_name(comm: bytes, ppid: int, ticks: int) -> None:
    """The command name (up to 15 bytes the process chooses) cannot move the fields."""
    line = _stat_line(comm, ppid, ticks)
    assert L.start_ticks(line) == ticks
    assert int(L.stat_fields(line)[1]) == ppid


@FUZZ
@given(st.binary(max_size=300))
def test_stat_garbage_raises_only_what_callers_catch(data: bytes) -> None:
    """Documented by its callers (probe gc, ProcFS.parents): ValueError or IndexError."""
    with contextlib.suppress(ValueError, IndexError):
        assert isinstance(L.start_ticks(data), int)


@FUZZ
@given(comm=st.binary(max_size=15).filter(lambda b: b"\0" not in b), status=st.binary(max_size=300))
@example(comm=b"a\xc2\x85NSpid:\t9", status=b"Name:\ta\xc2\x85NSpid:\t9\nNSpid:\t7\n")
def test_identity_with_hostile_comm(comm: bytes, status: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "42").mkdir()
        (root / "42" / "stat").write_bytes(_stat_line(comm, 1, 99))
        (root / "42" / "status").write_bytes(b"Name:\t" + comm + b"\nNSpid:\t7\n")
        (root / "42" / "cmdline").write_bytes(comm + b"\0x\0")
        (root / "42" / "environ").write_bytes(status)
        (root / "stat").write_text("btime 1000\n")
        ident = ProcFS(root).identity(42)
        assert (ident.start_ticks, ident.ppid, ident.ns_pid) == (99, 1, 7)
        env = ProcFS(root).environ(42)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())


_ID = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
_CG_PART = st.one_of(
    HOSTILE.filter(lambda s: "/" not in s and "\n" not in s),
    _ID,
    _ID.map(lambda i: f"docker-{i}.scope"),
    _ID.map(lambda i: f"crio-conmon-{i}.scope"),
    st.sampled_from(["..", ".", "docker", "kubepods", "k8s.io", "a:b:c", "::"]),
)


def _check_ref(ref: ContainerRef | None, source: str) -> None:
    if ref is not None:
        assert len(ref.id) == 64 and set(ref.id) <= set(string.hexdigits.lower())
        assert ref.runtime in RUNTIMES and ref.source == source


@FUZZ
@given(
    text=st.one_of(
        HOSTILE,
        st.lists(
            st.tuples(
                st.sampled_from(["0:", "1:cpu:", "12:name=systemd:", "x::"]),
                st.lists(_CG_PART, max_size=6),
            ).map(lambda t: t[0] + "/" + "/".join(t[1])),
            max_size=5,
        ).map("\n".join),
    )
)
@example(text="0::/docker\r0::/docker/" + "a" * 64)
def test_cgroup_never_raises(text: str) -> None:
    _check_ref(container_from_cgroup(text), "cgroup")


_MOUNT_ROOT = st.one_of(
    HOSTILE.filter(lambda s: " " not in s and "\n" not in s),
    _ID.map(lambda i: f"/var/lib/docker/containers/{i}/hostname"),
    _ID.map(lambda i: f"/overlay-containers/{i}/userdata/.containerenv"),
)
_MOUNT_POINT = st.one_of(
    HOSTILE.filter(lambda s: " " not in s and "\n" not in s),
    st.sampled_from(["/etc/hostname", "/etc/hosts", "/run/.containerenv", "/"]),
)


@FUZZ
@given(
    text=st.one_of(
        HOSTILE,
        st.lists(
            st.tuples(_MOUNT_ROOT, _MOUNT_POINT, st.sampled_from(["", " shared:1", " \\040"])).map(
                lambda t: f"1 2 8:1 {t[0]} {t[1]} rw{t[2]} - ext4 /dev/sda1 rw"
            ),
            max_size=5,
        ).map("\n".join),
    ),
    cgroup=st.one_of(st.none(), HOSTILE),
)
def test_mountinfo_never_raises(text: str, cgroup: str | None) -> None:
    _check_ref(container_from_mountinfo(text), "mountinfo")
    ref = resolve_container(cgroup, text)
    if ref is not None:
        assert ref.source in ("cgroup", "mountinfo")


def _kernel_escape(field: str) -> str:
    """A mountinfo field as the kernel writes it: space, tab, newline, backslash in octal."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in field)


@FUZZ
@given(point=_MAP_PATH)
@example(point="/mnt/x\r1 2 8:1 /var/lib/docker/containers/" + "c" * 64
         + "/hostname /etc/hostname rw - ext4 x rw")  # fmt: skip
def test_a_mount_point_cannot_forge_a_mount(point: str) -> None:
    """The kernel escapes the separators, so no mount point (whatever line breaks it holds:
    str.splitlines() splits on "\r", "\x85"...) reads as a per-container file's mount."""
    text = f"1 2 8:1 / {_kernel_escape(point)} rw - ext4 /dev/sda1 rw\n"
    assert container_from_mountinfo(text) is None


# 2. pyc headers (PEP 552) -------------------------------------------------------------------


@FUZZ
@given(
    head=st.one_of(
        st.binary(max_size=40),
        st.tuples(
            st.sampled_from([importlib.util.MAGIC_NUMBER, b"\x00\x00\r\n", b"\xff\xff\r\n"]),
            st.sampled_from([0, 1, 2, 3, 4, 2**32 - 1]),
            st.binary(min_size=8, max_size=8),
            st.binary(max_size=64),
        ).map(lambda t: t[0] + t[1].to_bytes(4, "little") + t[2] + t[3]),
    ),
    source=st.one_of(st.binary(max_size=200), st.just(b"x = (" * 200)),
)
def test_pyc_header_never_raises(head: bytes, source: bytes) -> None:
    """check_bytecode ("never raises on odd files") over any pyc bytes and any source."""
    import hashlib

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "pkg" / "__pycache__").mkdir(parents=True)
        (root / "pkg" / "mod.py").write_bytes(source)
        pyc = root / "pkg" / "__pycache__" / "mod.cpython-311.pyc"
        pyc.write_bytes(head)
        entries = [
            FileEntry("/pkg/__pycache__/mod.cpython-311.pyc", hashlib.sha256(head).hexdigest(),
                      len(head), "bytecode", "pkg.mod", "load"),
            FileEntry("/pkg/mod.py", None, len(source), "source", "pkg.mod", "load"),
            FileEntry("/pkg/__pycache__/\0.pyc", None, 0, "bytecode", "x", "load"),
            FileEntry("/pkg/loose.pyc", None, 0, "bytecode", "y", "load"),
        ]  # fmt: skip
        drifts = bc.check_bytecode(entries, lambda p: root / p.lstrip("/"), cache=None)
        assert all(dr.id.startswith("provenance.bytecode.") for dr in drifts)


# 3. RECORD, METADATA and direct_url.json ----------------------------------------------------

_RECORD_ROW = st.tuples(
    st.one_of(HOSTILE, st.sampled_from(["pkg/mod.py", "../../bin/x", "/abs/y.py", "a,b"])),
    st.one_of(
        HOSTILE,
        st.just("sha256=" + "A" * 43),
        st.just("sha256=" + "_" * 43 + "="),
        st.just("md5=abc"),
        st.just(""),
    ),
    st.one_of(st.just(""), st.integers(0, 2**80).map(str), HOSTILE),
).map(lambda r: ",".join(json.dumps(c) if "," in c or '"' in c else c for c in r))


@FUZZ
@given(
    record=st.one_of(st.binary(max_size=400), st.lists(_RECORD_ROW, max_size=8).map(
        lambda rows: "\n".join(rows).encode("utf-8", "surrogatepass"))),
    metadata=st.binary(max_size=200),
    direct_url=st.one_of(st.binary(max_size=200), JSON_VALUES.map(
        lambda v: json.dumps(v).encode("utf-8", "surrogatepass"))),
    lookups=st.lists(st.one_of(HOSTILE, st.just("/site/pkg/mod.py"), st.just("/site/\0x")),
                     max_size=4),
)  # fmt: skip
@example(record=b"", metadata=b"", direct_url=b"", lookups=["/site/\0x"])
@example(record=b"", metadata=b"", direct_url=b'{"url": "file://\\ud800", "dir_info": {}}',
         lookups=[])  # fmt: skip
def test_dist_index_never_raises(
    record: bytes, metadata: bytes, direct_url: bytes, lookups: list[str]
) -> None:
    """DistIndex: "bad input never raises" (skipped, with the reason in ``problems``)."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        info = root / "site" / "pkg-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "RECORD").write_bytes(record)
        (info / "METADATA").write_bytes(metadata)
        (info / "direct_url.json").write_bytes(direct_url)
        (root / "site" / "pkg").mkdir()
        (root / "site" / "pkg" / "mod.py").write_text("x = 1\n")
        index = DistIndex(lambda p: root / p.lstrip("/"))
        index.add_site("/site")
        for path in lookups:
            for c in index.claims(path):
                assert c.sha256 is None or len(c.sha256) == 64
            index.editable_root(path)
            index.site_of(path)
        index.claimants("pkg.mod")
        index.local_installs()
        assert all(isinstance(p, str) for p in index.problems)


# 4. Policy files ----------------------------------------------------------------------------


def _policy_error_is_located(e: PolicyError) -> None:
    """PolicyError's contract: a line, except for the few whole-file problems it names."""
    if e.line is None:
        assert (
            e.key == "version"
            or "has no rules" in e.what
            or e.what.startswith("invalid TOML")
            or e.what.startswith("weak policy refused:")  # the whole policy's rules, no one line
        ), e
    else:
        assert e.line >= 1


@FUZZ
@given(HOSTILE)
@example("version = 1\na = " + "[" * 5000 + "]" * 5000)
@example("version = 1\na = " + "{b=" * 3000 + "1" + "}" * 3000)
def test_policy_text_raises_only_policy_error(text: str) -> None:
    try:
        load_policy(text, "fuzz.toml")
    except PolicyError as e:
        _policy_error_is_located(e)


_TOML_KEY = st.one_of(
    st.sampled_from(["version", "targets", "evidence", "runner", "hooks", "files", "forbid",
                     "provenance", "patches", "names", "min_targets", "containers", "name",
                     "role", "path", "module", "sha256", "on", "pristine", "allow",
                     "distribution", "freshness_s", "min_steps", "require_probe",
                     "expect_class", "witness", "container_ids", "note"]),
    st.text(max_size=6),
)  # fmt: skip
_TOML_SCALAR = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["worker", "engine_core", "productive", "pkg.mod.Cls", "a" * 64, "vllm"]),
)
_TOML_VALUE = st.recursive(
    _TOML_SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(_TOML_KEY, inner, max_size=4)
    ),
    max_leaves=14,
)


def _toml_key(k: str) -> str:
    return k if k and all(c.isascii() and (c.isalnum() or c in "_-") for c in k) else json.dumps(k)


def _toml_value(v: Any, inline: bool) -> str:  # noqa: PLR0911 - one return per TOML type
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string (JSON escapes are TOML escapes)
    if isinstance(v, list):
        sep = ", " if inline else ",\n  # an element\n  "
        return "[" + sep.join(_toml_value(x, inline) for x in v) + "]"
    return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x, True)}" for k, x in v.items()) + "}"


def _toml(doc: dict[str, Any]) -> str:
    """DOC as TOML: scalars and arrays at the top, tables as [headers], arrays of tables as
    [[headers]] (a few forms of each, so the line scanner sees them)."""
    head, tail = [], []
    for k, v in doc.items():
        key = _toml_key(k)
        if isinstance(v, dict):
            tail.append(f"[{key}]  # a table")
            tail += [f"{_toml_key(kk)} = {_toml_value(vv, False)}" for kk, vv in v.items()]
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for x in v:
                tail.append(f"[[ {key} ]]")
                tail += [f"{_toml_key(kk)}\t=\t{_toml_value(vv, True)}" for kk, vv in x.items()]
        else:
            head.append(f"{key} = {_toml_value(v, False)}")
    return "\n".join(head + tail) + "\n"


@FUZZ
@given(
    st.dictionaries(_TOML_KEY, _TOML_VALUE, max_size=6).map(lambda d: {"version": 1, **d})
    | st.dictionaries(_TOML_KEY, _TOML_VALUE, max_size=6)
)
@example({"version": 1, "hooks": [{"name": 3}]})
@example({"version": 1, "targets": {"containers": {"\ud7ff": 1}}})
@example({"version": 1, "runner": {"expect_class": "a.B", "witness": "yes"}})
def test_well_formed_toml_of_wrong_shape_raises_located_policy_error(doc: dict[str, Any]) -> None:
    """Structurally valid TOML with wrong keys, types and values: PolicyError with a line."""
    text = _toml(doc)
    try:
        policy = load_policy(text, "fuzz.toml")
    except PolicyError as e:
        _policy_error_is_located(e)
        return
    # accepted: then it has at least one rule of its own besides the built-in ones
    assert len(policy.rules) > 5


@pytest.mark.parametrize(
    "text",
    [
        "version = 1\n",
        "version = 1\n[evidence]\nmin_steps = 3\n",
        "version = 1\n[targets]\nnames = ['a']\n",
        "version = 1\n[provenance]\nallow = ['provenance.bytecode.stale']\n",
    ],
)
def test_a_policy_that_checks_nothing_is_rejected(text: str) -> None:
    with pytest.raises(PolicyError, match="no rules"):
        load_policy(text, "empty.toml")


# 5. DSSE bundles and envelopes ------------------------------------------------------------


@pytest.fixture(scope="module")
def valid_bundle() -> dict[str, Any]:
    from tests.test_attest import _bundle

    return _bundle(since=3)


def _public_key() -> Any:
    from tests.test_attest import KEY

    return KEY.public_key()


def _paths(v: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, (*at, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _paths(x, (*at, i))


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    doc[path[0]] = _replace(doc[path[0]], path[1:], value)
    return doc


def _bundle_result(data: bytes) -> None:
    key = _public_key()
    r = check_bundle(data, key)
    assert r.ok or (r.problem and r.exit_code in (7, 8))
    with contextlib.suppress(BundleCorrupt, WrongKey):
        assert verify_bundle(data, key).ok


@FUZZ
@given(st.binary(max_size=500))
@example(DEEP_JSON)
@example(b'{"bundle": 1, "checkpoint": {}, "entries": [], "proofs": {}, "statements": [], '
         b'"contents": []}')  # fmt: skip
def test_bundle_bytes_never_raise(data: bytes) -> None:
    _bundle_result(data)


@FUZZ
@given(data=st.data())
def test_mutated_bundles_give_corrupt_or_wrong_key(
    valid_bundle: dict[str, Any], data: st.DataObject
) -> None:
    """Any one value of a valid bundle replaced by any JSON value, and, to reach past the
    signatures, any one value of a signed statement replaced and the statement re-signed."""
    from tests.test_attest import KEY

    doc = copy.deepcopy(valid_bundle)
    paths = list(_paths(doc))
    path = data.draw(st.sampled_from(paths[1:]), label="path")
    doc = _replace(doc, path, data.draw(JSON_VALUES, label="value"))
    if data.draw(st.booleans(), label="resign"):
        envs = [("checkpoint",)] + [
            ("statements", i) for i in range(len(valid_bundle["statements"]))
        ]
        where = data.draw(st.sampled_from(envs), label="envelope")
        stmt = json.loads(dsse.b64decode(_get(valid_bundle, where)["payload"]))
        spath = data.draw(st.sampled_from(list(_paths(stmt))[1:]), label="statement path")
        stmt = _replace(stmt, spath, data.draw(JSON_VALUES, label="statement value"))
        payload = json.dumps(stmt).encode("utf-8", "surrogatepass")
        doc = _replace(doc, where, dsse.sign(payload, "application/vnd.in-toto+json", KEY))
    _bundle_result(json.dumps(doc).encode("utf-8", "surrogatepass"))


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        doc = doc[p]
    return doc


@example(value="\ud800", field="payloadType")
@example(value=["x"], field="signatures")
@FUZZ
@given(value=JSON_VALUES, field=st.sampled_from(["payload", "payloadType", "signatures", "x"]))
def test_envelope_verify_raises_only_corrupt_or_wrong_key(value: Any, field: str) -> None:
    from tests.test_attest import KEY

    env: dict[str, Any] = dsse.sign(b"{}", "t", KEY)
    env[field] = value
    with contextlib.suppress(BundleCorrupt, WrongKey):
        dsse.verify(env, KEY.public_key())
    with pytest.raises((BundleCorrupt, WrongKey)):
        dsse.verify(value, KEY.public_key())  # no signature by KEY can be drawn here


# 6. The probe's journal and bindings ----------------------------------------------------------


_RECORD_KINDS = ["start", "file", "hook", "hook_loaded", "hook_wrapped", "hook_unresolved",
                 "hook_instantiated", "device_counter", "runner", "role", "interp", "graph",
                 "fileless", "unfiled", "error", "code"]  # fmt: skip
_RECORD_KEYS = ["pid", "start_ticks", "mode", "shared", "path", "sha256", "size", "kind",
                "module", "at", "t", "inherited", "name", "target", "source", "slot", "owner",
                "how", "msg", "class", "device", "file", "worker", "methods", "mro", "role",
                "rank", "claimed", "where", "stdlib", "prefix", "subject", "via", "attr",
                "layers", "owner_module", "owner_qualname", "owner_file", "probe_layers",
                "python", "optimize", "absent", "loader", "loader_file", "source_sha256",
                "source_size", "archive", "stat", "loaded"]  # fmt: skip
_RECORD = st.fixed_dictionaries(
    {"k": st.sampled_from(_RECORD_KINDS)},
    optional={k: JSON_VALUES for k in _RECORD_KEYS},
)


def _journal_bytes(records: list[Any], junk: list[bytes]) -> bytes:
    lines = [json.dumps(r).encode("utf-8", "surrogatepass") for r in records] + junk
    return b"\n".join(lines) + b"\n"


@FUZZ
@given(st.binary(max_size=1000))
@example(DEEP_JSON)
@example(b'{"k": "start", "pid": 1}\n' + b"[" * 5000 + b"\n")
def test_journal_bytes_never_raise(data: bytes) -> None:
    assert all(isinstance(r, dict) for r in parse(data.split(b"\n")))
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / L.JOURNAL_FILE).write_bytes(data)
        assert all(isinstance(r, dict) for r in read_journal(Path(d) / L.JOURNAL_FILE))
        (Path(d) / L.COUNTERS_FILE).write_bytes(data)
        _check_probe_state(read_probe_dir(Path(d)))


def _check_probe_state(state: ProbeState | None) -> None:
    """A ProbeState's fields have the types it declares, whatever the journal said."""
    if state is None:
        return
    assert isinstance(state.pid, int) and isinstance(state.start_ticks, int)
    if state.runner is not None:
        r = state.runner
        assert all(v is None or isinstance(v, str) for v in (r.file, r.sha256, state.runner_worker))
        assert isinstance(state.runner_methods, dict) and all(isinstance(c, str) for c in r.mro)
    for h in state.hooks:
        for v in (h.owner, h.how, h.unresolved, h.instantiated_class, h.device):
            assert v is None or isinstance(v, str)
        assert isinstance(h.fired, int) and h.wrapped == (h.how is not None)
    for f in state.files:
        assert isinstance(f.path, str) and (f.sha256 is None or isinstance(f.sha256, str))
        assert isinstance(f.size, int) and (f.module is None or isinstance(f.module, str))
    for u in state.unfiled:
        assert isinstance(u.module, str) and isinstance(u.how, str)
        for v in (u.loader, u.loader_file, u.file, u.source_sha256):
            assert v is None or isinstance(v, str)
        assert u.source_size is None or isinstance(u.source_size, int)
    state.role  # noqa: B018 - the property reads roles


def _with_code(chains: Any) -> ProcessReport:
    return ProcessReport(
        key=ProcessKey("boot", 1, 0), ns_pid=1, ppid=0, start_time=0.0, role="worker",
        rank=None, container_id=None, cmdline=(), exe="", probe_present=True, code=chains,
    )  # fmt: skip


def _report_of(state: ProbeState) -> None:
    """What the agent sends of STATE encodes: the reader's values are the report's values."""
    report = ProcessReport(
        key=ProcessKey("boot", 1, 0), ns_pid=1, ppid=0, start_time=0.0, role="worker",
        rank=None, container_id=None, cmdline=(), exe="", probe_present=True,
        runner=state.runner, steps=state.steps, hooks=state.hooks,
        manifest_digest=state.manifest_digest, files=state.files, runner_log=state.runner_log,
        code=state.code,
    )  # fmt: skip
    wire.process_to_json(report)


def _zip_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


@FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=400),
        st.builds(
            lambda b, cut, flip: bytes(
                x ^ (flip if i == cut % max(len(b), 1) else 0) for i, x in enumerate(b)
            ),
            st.just(_zip_bytes({"m.py": b"VALUE = 1\n" * 20})),
            st.integers(0, 10_000),
            st.integers(1, 255),
        ),
    ),
    size=st.integers(-5, 300),
)
@example(data=_zip_bytes({"m.py": b"VALUE = 1\n"}), size=10)
@example(data=_zip_bytes({"m.py": b"0" * 100_000}), size=3)
def test_zip_bytes_never_raise(data: bytes, size: int) -> None:
    """Any bytes where the journal says a zip archive is: a disagreement, never a crash."""
    from servewitness.evidence import unfiled
    from servewitness.model import FileEntry

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "1").mkdir()
        (Path(d) / "1" / "root").symlink_to("/")
        (Path(d) / "a.zip").write_bytes(data)
        member = FileEntry(f"{d}/a.zip/m.py", "0" * 64, size, "member", "m", "load")
        dis, drift = unfiled.check_members(
            ProcFS(d), 1, [member], start_time=0.0, hashed_at={}, slack=1.0
        )
        assert len(dis) + len(drift) == 1


@FUZZ
@given(
    records=st.lists(_RECORD, max_size=8).map(lambda rs: [{"k": "start"}, *rs]),
    junk=st.lists(st.binary(max_size=30), max_size=3),
)
@example(records=[{"k": "start", "pid": "x"}], junk=[])
@example(records=[{"k": "start", "pid": []}, {"k": "runner", "mro": 5, "file": 3}], junk=[])
@example(records=[{"k": "start"}, {"k": "hook", "name": "h", "slot": 64},
                  {"k": "hook_wrapped", "name": "h", "how": 7, "owner": []}], junk=[])  # fmt: skip
@example(records=[{"k": "start", "start_ticks": 1e400}], junk=[])
@example(records=[{"k": "start"}, {"k": "code", "subject": "s", "via": "class", "attr": "a",
                   "t": 1e400, "optimize": -1, "probe_layers": 2**70,
                   "layers": [{"kind": 3, "line": 2**64, "held": "y", "sha256": "A" * 64,
                               "file": "/x\u0000y", "globals_file": "/x\u0000y"},
                              7, {"cut": 1}] * 20}], junk=[])  # fmt: skip
@example(records=[{"k": "start"},
                  {"k": "file", "kind": "member", "path": "/a\x00/b", "sha256": "x"},
                  {"k": "file", "kind": "pth", "path": "\ud800.pth"},
                  {"k": "unfiled", "how": "loader", "loader_file": 3, "source_size": -1}],
         junk=[])  # fmt: skip
def test_probe_dir_records_of_wrong_types_never_raise(
    records: list[dict[str, Any]], junk: list[bytes]
) -> None:
    """read_probe_dir over records the probed process wrote (it may be hostile), and the
    agent's checks of code from no plain file over what it read."""
    from servewitness.evidence import unfiled
    from servewitness.evidence.judge import context

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / L.JOURNAL_FILE).write_bytes(_journal_bytes(records, junk))
        state = read_probe_dir(Path(d))
        _check_probe_state(state)
        assert state is not None
        _report_of(state)
        # The agent's verification of what the records say runs (files read under D only).
        chains, _ = check_chains(
            state.code, state.files, lambda p: Path(d) / p.lstrip("/"), cache=CodeCache(0)
        )
        wire.process_to_json(_with_code(chains))
        (Path(d) / "1").mkdir()
        (Path(d) / "1" / "environ").write_bytes(b"HOME=/root\0")
        context(ProcFS(d), 1, state)
        procfs, files = ProcFS(d), state.files
        members = [f for f in files if f.kind == "member"]
        unfiled.check_members(procfs, 1, members, start_time=0.0, hashed_at={}, slack=1.0)
        unfiled.check_inline(procfs, 1, [f for f in files if f.kind == "inline"])
        unfiled.pth_drift(procfs, 1, files, None)
        unfiled.unfiled_drift(state.unfiled, files, None, ("/usr/lib/python3.11",))


@FUZZ
@given(
    records=st.lists(
        st.fixed_dictionaries(
            {"k": st.sampled_from(["req", "ext", "other"])},
            optional={
                k: JSON_VALUES
                for k in [
                    "id",
                    "s0",
                    "s1",
                    "n",
                    "tok",
                    "t0",
                    "t1",
                    "f0",
                    "f1",
                    "hooks",
                    "end",
                    "ext",
                    "t",
                    "xrid",
                ]
            },
        )
        | JSON_VALUES,
        max_size=8,
    ),
    junk=st.lists(st.binary(max_size=30), max_size=3),
    tail=st.binary(max_size=20),
)
@example(records=[], junk=[DEEP_JSON], tail=b"")
def test_bindings_bytes_never_raise(records: list[Any], junk: list[bytes], tail: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / L.BINDINGS_FILE
        path.write_bytes(_journal_bytes(records, junk) + tail)
        reader = BindingsReader()
        spans, exts = reader.read(Path(d))
        assert all(isinstance(s, RequestSpan) for s in spans)
        assert all(isinstance(e, ExternalId) for e in exts)
        assert all(isinstance(s.internal_id, str) and isinstance(s.steps, int) for s in spans)
        assert reader.malformed >= 0 and reader.unknown >= 0
        reader.seed(path, 0, 10**12)  # a stale offset past the end: read from the start
        reader.read(Path(d))


# 7. Wire decoding of a report ---------------------------------------------------------------


@pytest.fixture(scope="module")
def valid_report() -> bytes:
    from tests.test_wire import full_report

    return wire.report_to_bytes(full_report())


def _report_result(data: bytes) -> None:
    with contextlib.suppress(wire.WireError):
        assert isinstance(wire.report_from_bytes(data), TargetReport)


@FUZZ
@given(st.binary(max_size=600))
def test_report_bytes_raise_only_wire_error(data: bytes) -> None:
    _report_result(data)


@FUZZ
@given(data=st.data())
def test_mutated_reports_raise_only_wire_error(valid_report: bytes, data: st.DataObject) -> None:
    raw = bytearray(valid_report)
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "byte"]), label="op")
        at = data.draw(st.integers(0, max(0, len(raw) - 1)), label="at")
        if op == "flip" and raw:
            raw[at] ^= 1 << data.draw(st.integers(0, 7), label="bit")
        elif op == "byte" and raw:
            raw[at] = data.draw(st.integers(0, 255), label="value")
        elif op == "cut":
            del raw[at : at + data.draw(st.integers(1, 16), label="len")]
        else:
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=8), label="bytes")
    _report_result(bytes(raw))


@pytest.mark.parametrize("field", ["spans_text", "payloadType"])
def test_a_lone_surrogate_in_a_bundle_is_corrupt(valid_bundle: dict[str, Any], field: str) -> None:
    """Found by fuzzing: "\\ud800" in a text field hashed as UTF-8 raised UnicodeEncodeError."""
    doc = copy.deepcopy(valid_bundle)
    if field == "payloadType":
        doc["checkpoint"]["payloadType"] = "\ud800"
    else:
        (bindings,) = [c for c in doc["contents"] if c["kind"] == "bindings"]
        bindings["fields"]["spans_text"] = "\ud800"
    r = check_bundle(json.dumps(doc).encode(), _public_key())
    assert not r.ok and r.exit_code == 7 and r.problem and "Unicode" in r.problem
