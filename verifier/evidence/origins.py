"""Where each file a live process loaded came from: its *provenance class*.

Installers write down what they installed: every distribution's ``RECORD`` (PEP 376/627)
lists its files with their sha256, and ``direct_url.json`` (PEP 610) says when it was
installed from a local directory or file rather than an index. Comparing the bytes the
process loaded with those records tells a pristine file from a patched one, an editable
checkout from an installed wheel, and leaves everything nobody claims visibly unclaimed.

Everything is read *as the process sees its filesystem*: paths are the process's paths, and
``to_host`` maps one to where this code can read it (``/proc/<pid>/root/<path>`` for a live
process in another mount namespace). Bad input never raises: an unreadable or malformed
``RECORD``, ``METADATA`` or ``direct_url.json`` is skipped, and why is kept in
``DistIndex.problems``.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from verifier.model import DRIFT_MODULE_SHADOWED, Drift, FileEntry, FileOrigin, Origin, Provenance

_DIST_INFO = ".dist-info"
# A RECORD hash field: empty, sha256=<32 bytes urlsafe base64, unpadded>, or another algorithm.
_HASH_FIELD = re.compile(r"|sha256=[A-Za-z0-9_-]{43}=?|(?!sha256=)[A-Za-z0-9_]+=[A-Za-z0-9_=-]*")
_MODULE_SUFFIXES = (".py", ".so", ".pyd")
_PYC = re.compile(r"([^.]+)\.[^.]+(?:\.opt-\d+)?\.pyc")  # <name>.<tag>[.opt-N].pyc
_EXT = re.compile(r"([^.]+)(?:\.[^.]+)?\.(?:so|pyd)")  # <name>[.<tag>].so|.pyd
_NON_STDLIB_DIRS = frozenset({"site-packages", "dist-packages"})
_SHADOW_AT = frozenset({"load", "snapshot", "late"})  # not "deferred": its bytecode is judged


@dataclass(frozen=True)
class Claim:
    """One RECORD row naming a file."""

    distribution: str  # canonical (PEP 503) name, from METADATA's Name
    version: str
    record_path: str  # exactly as written in RECORD
    sha256: str | None  # hex; None: the row has no sha256 (pip-compiled .pyc, RECORD itself)
    size: int | None
    site: str  # the site directory (as the process sees it) holding the .dist-info


@dataclass(frozen=True)
class LocalInstall:
    """A distribution installed from the local filesystem (PEP 610 ``file://`` URL)."""

    distribution: str
    version: str
    url: str  # direct_url.json "url"
    editable: bool  # dir_info.editable
    root: str | None  # for directory installs: the directory the URL names


@dataclass(frozen=True)
class Context:
    """What the process's interpreter and environment say about locations."""

    stdlib_dirs: tuple[str, ...]  # e.g. ("/usr/local/lib/python3.11",) incl. lib-dynload
    generated_dirs: tuple[str, ...]  # compile caches and temporary dirs (generated_dirs())
    site_dirs: tuple[str, ...] = ()  # indexed up front (e.g. the process's sys.path entries)


@dataclass
class _Dist:
    """One ``.dist-info`` directory as indexed."""

    name: str
    version: str
    site: str
    local: LocalInstall | None = None


_Row = tuple[_Dist, list[str]]  # a well-formed RECORD row and the dist whose RECORD it is in


@dataclass
class _Site:
    """One indexed site directory: its distributions and their RECORD rows."""

    dists: dict[str, _Dist] = field(default_factory=dict)  # canonical name -> dist
    # Rows naming a file inside the site, by the path RECORD writes (no "..", not absolute):
    # keeping them unjoined makes indexing a dict insert per row.
    rows: dict[str, list[_Row]] = field(default_factory=dict)
    moduled: bool = False  # rows are in DistIndex._modules


@dataclass
class _Judged:
    """A path's classification before it becomes a FileOrigin."""

    origin: Origin
    reason: str
    distribution: str | None = None
    version: str | None = None
    record_path: str | None = None
    expected_sha256: str | None = None


def canonical_name(name: str) -> str:
    """PEP 503 normalized distribution name: ``Foo_Bar.baz`` -> ``foo-bar-baz``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _clean(path: str) -> bool:
    """Whether normpath would leave PATH as it is (cheap; most paths are clean)."""
    return not (
        not path
        or "//" in path
        or "/./" in path
        or "/../" in path
        or path.endswith(("/", "/.", "/.."))
        or path.startswith(("./", "../"))
        or path in (".", "..")
    )


def _norm(path: str) -> str:
    """Normalized absolute-looking path ("//x" becomes "/x", as the kernel reads it)."""
    if _clean(path):
        return path
    p = posixpath.normpath(path)
    return "/" + p.lstrip("/") if p.startswith("//") else p


def _under(path: str, directory: str) -> bool:
    """Whether PATH is DIRECTORY or inside it, component-wise (both normalized)."""
    if directory == "/":
        return path.startswith("/")
    return path == directory or path.startswith(directory + "/")


def _join(site: str, record_path: str) -> str:
    """The absolute path a RECORD row names (RECORD paths are relative to the site, may hold
    "../", and may be absolute). Clean relative paths skip normpath: most rows are clean."""
    if record_path.startswith("/"):
        return _norm(record_path)
    if _clean(record_path):
        return f"{site.rstrip('/')}/{record_path}"
    return _norm(f"{site}/{record_path}")


def _module_of(record_path: str) -> str | None:
    """The module a RECORD row installs (``a/b.py``, ``a/b/__init__.py``, ``a/b.<tag>.so``),
    or None for anything else, including rows outside the site ("../")."""
    if not record_path.endswith(_MODULE_SUFFIXES) or record_path.startswith("/"):
        return None
    *package, last = record_path.split("/")
    if last == "__init__.py":
        last = package.pop() + ".py" if package else ""
    if last.endswith(".py"):
        stem = last[:-3]
    else:
        m = _EXT.fullmatch(last)
        stem = m.group(1) if m else ""
    names = [*package, stem]
    return ".".join(names) if all(n.isidentifier() for n in names) else None


def source_of_bytecode(path: str) -> str | None:
    """``<dir>/__pycache__/<name>.<tag>[.opt-N].pyc`` -> ``<dir>/<name>.py``; None for any
    other path (sourceless bytecode lives outside ``__pycache__``)."""
    parent, name = posixpath.split(path)
    pkg, cache = posixpath.split(parent)
    m = _PYC.fullmatch(name)
    if cache != "__pycache__" or m is None:
        return None
    return posixpath.join(pkg, m.group(1) + ".py")


def _record_rows(text: str) -> tuple[list[list[str]], list[str]]:
    """The well-formed rows of a RECORD's text, and what was wrong with the others (a CSV
    error ends the parse: the rows before it are kept)."""
    rows: list[list[str]] = []
    bad: list[str] = []
    try:
        for lineno, row in enumerate(csv.reader(io.StringIO(text, newline="")), 1):
            if _row_ok(row):
                rows.append(row)
            elif row:
                bad.append(f"line {lineno}: {','.join(row)[:80]!r}")
    except csv.Error as e:
        bad.append(f"CSV error, rest of the file skipped: {e}")
    return rows, bad


def _row_ok(row: list[str]) -> bool:
    """Whether a RECORD row is well formed: path, hash field (_HASH_FIELD), size or empty."""
    return (
        len(row) == 3
        and bool(row[0])
        and _HASH_FIELD.fullmatch(row[1]) is not None
        and (not row[2] or row[2].isdigit())
    )


def _sha256_hex(text: str) -> str | None:
    """The hex sha256 of a well-formed hash field (``sha256=<urlsafe b64>``); None when the
    field is empty or names another algorithm."""
    if not text.startswith("sha256="):
        return None
    return base64.urlsafe_b64decode(text[7:].rstrip("=") + "=").hex()


def _claim(dist: _Dist, row: list[str]) -> Claim:
    """The Claim a well-formed RECORD row of DIST makes."""
    size = int(row[2]) if row[2] else None
    return Claim(dist.name, dist.version, row[0], _sha256_hex(row[1]), size, dist.site)


def _metadata(host: Path) -> dict[str, str]:
    """Name and Version from a METADATA file's headers (stops at the first blank line: the
    body can be long and is not needed). Raises OSError or UnicodeDecodeError."""
    fields: dict[str, str] = {}
    with host.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                break
            key, sep, value = line.partition(":")
            key = key.strip().lower()
            if sep and line[0] not in " \t" and key in ("name", "version"):
                fields.setdefault(key, value.strip())
    return fields


def _file_url_dir(url: str) -> str | None:
    """The local path a ``file://`` URL names (None for a remote host)."""
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost") or not parts.path:
        return None
    return _norm(unquote(parts.path))


def _local_install(data: object, dist: _Dist) -> LocalInstall | None:
    """A LocalInstall from parsed direct_url.json; None when not a ``file://`` URL. Raises
    ValueError when the document is not what PEP 610 describes."""
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        raise ValueError("not an object with a string 'url'")
    url: str = data["url"]
    if not url.lower().startswith("file:"):
        return None
    dir_info = data.get("dir_info")
    if dir_info is not None and not isinstance(dir_info, dict):
        raise ValueError("'dir_info' is not an object")
    editable = isinstance(dir_info, dict) and dir_info.get("editable") is True
    root = _file_url_dir(url) if isinstance(dir_info, dict) else None
    return LocalInstall(dist.name, dist.version, url, editable, root)


class DistIndex:
    """The installed distributions a process can see, indexed per site directory on demand.

    A *site* is a directory holding ``*.dist-info`` directories. Each site's RECORDs are read
    once and kept by the path each row names, so a lookup is a dict access per ancestor site.
    Rows are kept raw (validated) and become Claims when looked up: a process loads a small
    part of what its site-packages holds, and decoding every hash would dominate.
    """

    def __init__(self, to_host: Callable[[str], Path]) -> None:
        self.to_host = to_host
        self.problems: list[str] = []  # what was skipped, and why
        self._site_of: dict[str, str | None] = {}  # directory -> nearest site (or None)
        self._sites: dict[str, _Site] = {}  # indexed sites, in indexing order
        self._chains: dict[str, tuple[str, ...]] = {}  # directory -> its sites, nearest first
        self._elsewhere: dict[str, list[_Row]] = {}  # rows naming "../" or absolute paths
        self._claims: dict[str, list[Claim]] = {}  # paths looked up -> their Claims
        self._modules: dict[str, list[_Row]] = {}  # module -> rows installing it (on demand)
        self._roots: list[tuple[str, LocalInstall]] = []  # directory installs, longest first

    # -- sites ------------------------------------------------------------------------------

    def site_of(self, path: str) -> str | None:
        """The nearest ancestor directory of PATH holding a ``*.dist-info`` directory. Every
        directory visited is cached with its answer: paths share few ancestors. A relative
        PATH (relative to a working directory unknown here) has none."""
        directory = posixpath.dirname(_norm(path))
        if not directory.startswith("/"):
            return None
        visited: list[str] = []
        while directory not in self._site_of:
            if self._holds_dist_info(directory):
                self._site_of[directory] = directory
                break
            visited.append(directory)
            parent = posixpath.dirname(directory)
            if parent == directory:
                self._site_of[directory] = None
                break
            directory = parent
        answer = self._site_of[directory]
        for d in visited:
            self._site_of[d] = answer
        return answer

    def _holds_dist_info(self, directory: str) -> bool:
        """Whether DIRECTORY has a ``*.dist-info`` subdirectory (unreadable: no)."""
        try:
            with os.scandir(self.to_host(directory)) as it:
                return any(e.name.endswith(_DIST_INFO) and e.is_dir() for e in it)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as e:
            self.problems.append(f"cannot list {directory}: {e.strerror or e}")
            return False

    def add_site(self, site: str) -> None:
        """Index every ``*.dist-info`` directory in SITE (idempotent). A relative SITE (a
        sys.path entry relative to the process's working directory) is ignored."""
        site = _norm(site)
        if site in self._sites or not site.startswith("/"):
            return
        self._sites[site] = entry = _Site()
        try:
            with os.scandir(self.to_host(site)) as it:
                names = sorted(e.name for e in it if e.name.endswith(_DIST_INFO) and e.is_dir())
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as e:
            self.problems.append(f"cannot list {site}: {e.strerror or e}")
            return
        for name in names:
            dist = self._add_dist(site, entry, name)
            if entry.dists.setdefault(dist.name, dist) is not dist:
                self.problems.append(f"{site}/{name}: a second {dist.name} in {site}; ignored")
        self._roots.sort(key=lambda r: len(r[0]), reverse=True)
        self._claims.clear()  # a "../" row of this site may name a path looked up before

    def _add_dist(self, site: str, entry: _Site, dir_name: str) -> _Dist:
        """Index one ``.dist-info`` directory: its name, version, RECORD and direct_url."""
        dist = self._read_metadata(site, dir_name)
        base = f"{site.rstrip('/')}/{dir_name}"
        for row in self._read_record(base):
            rp = row[0]
            if rp[0] != "/" and _clean(rp):
                entry.rows.setdefault(rp, []).append((dist, row))
            else:
                self._elsewhere.setdefault(_join(site, rp), []).append((dist, row))
        dist.local = self._read_direct_url(base, dist)
        if dist.local is not None and dist.local.root is not None:
            self._roots.append((dist.local.root, dist.local))
        return dist

    def _read_metadata(self, site: str, dir_name: str) -> _Dist:
        """Canonical name and version from METADATA, falling back on the directory's name
        (``<name>-<version>.dist-info``) for whatever METADATA does not say."""
        stem = dir_name[: -len(_DIST_INFO)]
        name, _, version = stem.partition("-")
        path = f"{site.rstrip('/')}/{dir_name}/METADATA"
        try:
            fields = _metadata(self.to_host(path))
        except (OSError, UnicodeDecodeError) as e:
            self.problems.append(f"{path}: unreadable ({_why(e)}); name from directory name")
            fields = {"name": name}
        if "name" not in fields:
            self.problems.append(f"{path}: no Name header; name from directory name")
        return _Dist(
            canonical_name(fields.get("name") or name), fields.get("version") or version, site
        )

    def _read_record(self, base: str) -> list[list[str]]:
        """Every well-formed row of ``<base>/RECORD``. Malformed rows are skipped; a RECORD
        that is not UTF-8 or stops parsing part way keeps the rows before the fault."""
        path = f"{base}/RECORD"
        try:
            data = self.to_host(path).read_bytes()
        except OSError as e:
            self.problems.append(f"{path}: unreadable ({_why(e)})")
            return []
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            text = data[: e.start].decode("utf-8").rpartition("\n")[0]
            self.problems.append(f"{path}: not UTF-8 at byte {e.start}; rows before it kept")
        rows, bad = _record_rows(text)
        if bad:
            self.problems.append(f"{path}: {len(bad)} malformed rows skipped, first {bad[0]}")
        return rows

    def _read_direct_url(self, base: str, dist: _Dist) -> LocalInstall | None:
        """The local install ``<base>/direct_url.json`` describes, if any."""
        host = self.to_host(f"{base}/direct_url.json")
        try:
            return _local_install(json.loads(host.read_bytes()), dist)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError: ValueErrors
            self.problems.append(f"{base}/direct_url.json: skipped ({_why(e)})")
            return None

    def _ancestor_sites(self, path: str) -> tuple[str, ...]:
        """Every site that is an ancestor of normalized PATH, nearest first, each indexed
        (vendored ``.dist-info`` directories make nested sites: the outer ones count too)."""
        directory = posixpath.dirname(path)
        chain = self._chains.get(directory)
        if chain is None:
            sites: list[str] = []
            site = self.site_of(path)
            while site is not None:
                self.add_site(site)
                sites.append(site)
                site = self.site_of(site)
            chain = self._chains[directory] = tuple(sites)
        return chain

    # -- lookups ----------------------------------------------------------------------------

    def claims(self, path: str) -> list[Claim]:
        """Every RECORD row, across indexed sites, that names exactly PATH (its ancestor
        sites are indexed first)."""
        path = _norm(path)
        found = self._claims.get(path)
        if found is None:
            rows = [
                r
                for site in self._ancestor_sites(path)
                for r in self._sites[site].rows.get(path[len(site.rstrip("/")) + 1 :], ())
            ]
            rows += self._elsewhere.get(path, ())
            found = self._claims[path] = [_claim(*r) for r in rows]
        return found

    def claim(self, path: str) -> Claim | None:
        """The RECORD row that lists exactly PATH (the first one, if several do)."""
        found = self.claims(path)
        return found[0] if found else None

    def claimants(self, module: str) -> list[Claim]:
        """RECORD rows, across indexed sites, that install MODULE (``a/b.py``,
        ``a/b/__init__.py`` or an extension ``a/b[.<tag>].so|.pyd``)."""
        for entry in self._sites.values():
            if not entry.moduled:
                entry.moduled = True
                for record_path, rows in entry.rows.items():
                    name = _module_of(record_path)
                    if name is not None:
                        self._modules.setdefault(name, []).extend(rows)
        return [_claim(*r) for r in self._modules.get(module, ())]

    def local_install(self, distribution: str, site: str) -> LocalInstall | None:
        """The local install (``file://`` direct_url.json) of DISTRIBUTION in SITE, if any."""
        site = _norm(site)
        self.add_site(site)
        entry = self._sites.get(site)
        dist = entry.dists.get(canonical_name(distribution)) if entry is not None else None
        return dist.local if dist is not None else None

    def local_installs(self) -> list[LocalInstall]:
        """Every local install across indexed sites, in indexing order."""
        dists = (d for s in self._sites.values() for d in s.dists.values())
        return [d.local for d in dists if d.local is not None]

    def editable_root(self, path: str) -> LocalInstall | None:
        """The directory install whose root holds PATH (the innermost root wins). A file in
        a site nested inside the root (a venv in the checkout) belongs to that site."""
        path = _norm(path)
        for root, local in self._roots:
            if _under(path, root):
                site = self.site_of(path)
                if site is not None and site != root and _under(site, root):
                    return None
                return local
        return None


def _why(e: BaseException) -> str:
    """A short reason for a skipped file."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return f"{type(e).__name__}: {e}"


def generated_dirs(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Directories whose files are generated at run time (compile caches, temporary files),
    computed from the PROCESS's environment the way vLLM, torch inductor and triton compute
    them. Relative paths (relative to an unknown cwd) and unset ``$HOME`` defaults are left
    out; the rest is normalized and deduplicated."""
    home = environ.get("HOME", "")
    tmp = environ.get("TMPDIR") or environ.get("TEMP") or environ.get("TMP") or "/tmp"  # noqa: S108
    xdg = environ.get("XDG_CACHE_HOME") or (home and f"{home}/.cache")
    user = next(
        (environ[k] for k in ("LOGNAME", "USER", "LNAME", "USERNAME") if environ.get(k)), "root"
    )
    candidates = (
        tmp,
        environ.get("VLLM_CACHE_ROOT") or (xdg and f"{xdg}/vllm"),
        environ.get("TORCHINDUCTOR_CACHE_DIR") or f"{tmp}/torchinductor_{user}",
        environ.get("TRITON_CACHE_DIR") or (home and f"{home}/.triton/cache"),
        xdg,
    )
    out: list[str] = []
    for c in candidates:
        expanded = home + c[1:] if c.startswith("~") and home else c
        if expanded.startswith("/") and _norm(expanded) not in out:
            out.append(_norm(expanded))
    return tuple(out)


# -- classification --------------------------------------------------------------------------


@dataclass
class _Classifier:
    """Classifies paths for one classify() call, memoizing per (path, hash)."""

    index: DistIndex
    ctx: Context
    sources: dict[str, FileEntry] = field(default_factory=dict)  # first non-bytecode entry
    memo: dict[tuple[str, str | None, bool], _Judged] = field(default_factory=dict)

    def entry(self, f: FileEntry) -> _Judged:
        """One manifest file's class (bytecode in ``__pycache__`` takes its source's)."""
        source = source_of_bytecode(f.path) if f.kind == "bytecode" else None
        if source is None:
            return self.path(f.path, f.sha256, derived=False)
        src = self.sources.get(_norm(source))
        judged = (
            self.path(src.path, src.sha256, derived=False)
            if src is not None
            else self.path(source, None, derived=True)
        )
        own = self.index.claim(f.path)
        reason = f"bytecode of {source}"
        if judged.origin is not Origin.PRISTINE:
            reason += f" ({judged.reason})"
        return _Judged(
            judged.origin,
            reason,
            judged.distribution,
            judged.version,
            own.record_path if own is not None else None,
        )

    def path(self, path: str, sha256: str | None, *, derived: bool) -> _Judged:
        """PATH's class given the hash it was loaded with (memoized). DERIVED: the source
        of loaded bytecode, not loaded itself: a RECORD listing suffices."""
        key = (path, sha256, derived)
        if key not in self.memo:
            self.memo[key] = self._judge(path, sha256, derived)
        return self.memo[key]

    def _judge(self, path: str, sha256: str | None, derived: bool) -> _Judged:
        """Rules in order: claimed by a RECORD; under a directory install's root; standard
        library; generated; unknown."""
        claims = self.index.claims(path)
        if claims:
            return self._claimed(claims, sha256, derived)
        local = self.index.editable_root(path)
        if local is not None:
            kind = "editable" if local.editable else "local"
            reason = f"under the root of the {kind} install from {local.url}"
            return _Judged(Origin.EDITABLE, reason, local.distribution, local.version)
        if in_stdlib(_norm(path), self.ctx.stdlib_dirs):
            return _Judged(Origin.STDLIB, "in the standard library")
        gen = _innermost(_norm(path), self.ctx.generated_dirs)
        if gen is not None:
            return _Judged(Origin.GENERATED, f"under {gen} (a compile cache or temporary dir)")
        return _Judged(Origin.UNKNOWN, "no distribution claims it")

    def _claimed(self, claims: list[Claim], sha256: str | None, derived: bool) -> _Judged:
        """Class of a file RECORD lists: its hash against RECORD's, local installs aside."""
        sha = sha256.lower() if sha256 else None
        c = next((c for c in claims if sha is not None and c.sha256 == sha), claims[0])
        who = f"{c.distribution} {c.version}"

        def judged(origin: Origin, reason: str, expected: str | None = None) -> _Judged:
            return _Judged(origin, reason, c.distribution, c.version, c.record_path, expected)

        local = self.index.local_install(c.distribution, c.site)
        if sha is None and not derived:
            return judged(Origin.UNKNOWN, "not hashed when loaded")
        if sha is not None and c.sha256 is not None and c.sha256 != sha:
            return judged(Origin.PATCHED, f"sha256 differs from RECORD of {who}", c.sha256)
        if local is not None:
            kind = "editable" if local.editable else "local"
            return judged(Origin.EDITABLE, f"{kind} install from {local.url}")
        if derived:
            return judged(Origin.PRISTINE, f"listed in RECORD of {who}")
        if c.sha256 is None:
            return judged(Origin.UNKNOWN, f"RECORD of {c.distribution} lists it without a hash")
        return judged(Origin.PRISTINE, f"sha256 matches RECORD of {who}")


def in_stdlib(path: str, stdlib_dirs: Iterable[str]) -> bool:
    """Whether normalized PATH is under a standard library directory and not in a
    site-packages/dist-packages directory below it (relative directories match nothing)."""
    for d in map(_norm, stdlib_dirs):
        if d.startswith("/") and _under(path, d):
            rest = path[len(d) :].split("/")
            if _NON_STDLIB_DIRS.isdisjoint(rest):
                return True
    return False


def _innermost(path: str, dirs: Iterable[str]) -> str | None:
    """The longest of DIRS that normalized PATH is under, if any."""
    hits = [d for d in map(_norm, dirs) if d.startswith("/") and _under(path, d)]
    return max(hits, key=len) if hits else None


def _file_origin(f: FileEntry, j: _Judged) -> FileOrigin:
    """The FileOrigin a manifest entry and its classification make."""
    return FileOrigin(
        f.path,
        j.origin.value,
        j.reason,
        j.distribution,
        j.version,
        j.record_path,
        f.sha256,
        j.expected_sha256,
    )


def classify(
    files: Sequence[FileEntry], index: DistIndex, ctx: Context
) -> tuple[Provenance, list[Drift]]:
    """Each loaded file's provenance class, and the modules loaded from somewhere other than
    where their distribution (or the standard library) puts them. ``distributions`` counts
    the loaded files attributed to each distribution (by RECORD, or by an install's root).

    Every site on the way to any manifest file, and every ``ctx.site_dirs`` entry, is indexed
    before anything is judged, so the answer does not depend on manifest order."""
    for site in ctx.site_dirs:
        index.add_site(site)
    for f in files:
        index.claims(f.path)  # indexes every site on the way to it
    c = _Classifier(index, ctx)
    for f in files:
        if f.kind != "bytecode":
            c.sources.setdefault(_norm(f.path), f)
    counts = dict.fromkeys(Origin, 0)
    per_dist: dict[tuple[str, str], int] = {}
    reported: list[FileOrigin] = []
    for f in files:
        j = c.entry(f)
        counts[j.origin] += 1
        if j.distribution is not None:
            key = (j.distribution, j.version or "")
            per_dist[key] = per_dist.get(key, 0) + 1
        if j.origin not in (Origin.PRISTINE, Origin.STDLIB):
            reported.append(_file_origin(f, j))
    reported.sort(key=lambda fo: fo.path)
    prov = Provenance(
        counts=tuple((o.value, n) for o, n in counts.items()),
        files=tuple(reported),
        distributions=tuple((d, v, n) for (d, v), n in sorted(per_dist.items())),
    )
    return prov, shadowing(files, index, ctx)


def shadowing(files: Sequence[FileEntry], index: DistIndex, ctx: Context) -> list[Drift]:
    """Modules loaded from a file that shadows the one a distribution installs, or that
    shadows the standard library's module of that name. One Drift per module.

    A file some RECORD claims, or one under an editable root, is where its installer put
    it and shadows nothing (setuptools' ``distutils`` replaces the standard library's on
    purpose, in every process that has setuptools); nor does the standard library's own
    file, which wins over site-packages by design."""
    seen: set[str] = set()
    stdlib_cache: dict[str, str | None] = {}
    out: list[Drift] = []
    for f in files:
        if f.module is None or f.at not in _SHADOW_AT or f.module in seen:
            continue
        source = source_of_bytecode(f.path) if f.kind == "bytecode" else None
        path = _norm(source or f.path)
        if in_stdlib(path, ctx.stdlib_dirs) or _installed_there(path, index):
            continue
        detail = _stdlib_shadow(f.module, path, index, ctx, stdlib_cache)
        detail = detail or _dist_shadow(f.module, path, index)
        if detail is not None:
            seen.add(f.module)
            out.append(Drift(DRIFT_MODULE_SHADOWED, path, f.module, detail))
    return out


def _installed_there(path: str, index: DistIndex) -> bool:
    """Whether PATH is where an installer put it: claimed by a RECORD, or under the root of
    an editable install (a non-editable directory install copied its files elsewhere)."""
    if index.claims(path):
        return True
    local = index.editable_root(path)
    return local is not None and local.editable


def _dist_shadow(module: str, path: str, index: DistIndex) -> str | None:
    """Why MODULE loaded from PATH shadows a distribution's copy (None: none installs it)."""
    claimants = index.claimants(module)
    if not claimants:
        return None
    c = claimants[0]
    where = _join(c.site, c.record_path)
    return (
        f"module {module} was loaded from {path}, but distribution {c.distribution} "
        f"installs it at {where}"
    )


def _stdlib_shadow(
    module: str, path: str, index: DistIndex, ctx: Context, cache: dict[str, str | None]
) -> str | None:
    """Why top-level MODULE, loaded from PATH outside the standard library, shadows the
    standard library's module of that name (None: it does not)."""
    if not module.isidentifier():  # a submodule, or not a module name at all
        return None
    if module not in cache:
        cache[module] = _stdlib_file(module, index, ctx)
    found = cache[module]
    if found is None:
        return None
    return f"module {module} was loaded from {path}, but it shadows the standard library's {found}"


def _stdlib_file(module: str, index: DistIndex, ctx: Context) -> str | None:
    """The standard library's file for top-level MODULE, if there is one."""
    for d in (d for d in map(_norm, ctx.stdlib_dirs) if d.startswith("/")):
        for rel in (f"{module}.py", f"{module}/__init__.py"):
            candidate = f"{d.rstrip('/')}/{rel}"
            try:
                if index.to_host(candidate).is_file():
                    return candidate
            except OSError:
                continue
    return None
