"""The installed distributions a process can see, and what their installers wrote down.

Size: one module because the parsers of the three installer files (RECORD, METADATA,
direct_url.json) are private to the one index that reads them per site directory, on demand;
apart, they would be a module of helpers no one else may call.

Installers write down what they installed: every distribution's ``RECORD`` (PEP 376/627)
lists its files with their sha256, and ``direct_url.json`` (PEP 610) says when it was
installed from a local directory or file rather than an index. ``DistIndex`` reads those
per site directory, on demand, and answers which RECORD rows name a path, which
distributions install a module, and which local install's root holds a path.

Everything is read *as the process sees its filesystem*: paths are the process's paths, and
``to_host`` maps one to where this code can read it (``/proc/<pid>/root/<path>`` for a live
process in another mount namespace). Bad input never raises: an unreadable or malformed
``RECORD``, ``METADATA`` or ``direct_url.json`` is skipped, and why is kept in
``DistIndex.problems`` (and, with the file and distribution it concerns, in
``DistIndex.faults``: what it would have said is unknown, which the judgement reports).
"""

from __future__ import annotations

import base64
import csv
import errno
import io
import json
import os
import posixpath
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from servewitness.evidence import inputs as I
from servewitness.evidence.content import content_digest
from servewitness.evidence.regular import NotRegular, open_file

_DIST_INFO = ".dist-info"
MAX_RECORD_BYTES = 64 << 20  # vLLM's RECORD is ~3 MB: a bigger one is a fault, not read
MAX_DIRECT_URL_BYTES = 1 << 20
MAX_METADATA_BYTES = 64 << 20  # read whole (its digest is kept: ``inputs``); most are KBs
# A RECORD hash field: empty, sha256=<32 bytes urlsafe base64, unpadded>, or another algorithm.
_HASH_ALTERNATIVES = r"|sha256=[A-Za-z0-9_-]{43}=?|(?!sha256=)[A-Za-z0-9_]+=[A-Za-z0-9_=-]*"
_HASH_FIELD = re.compile(_HASH_ALTERNATIVES)
# A well-formed row (``_row_ok``) as CSV reads a line without CR or NUL (CRLF made LF first:
# CSV reads both as one line end): path, hash field,
# size (ASCII digits or nothing). Lines are matched in one pass in C. _PLAIN_ROW where the
# text has no quote at all; else _ROW, whose path is quoted ("" for a quote, no line break:
# group 1) or not (group 2); a quote anywhere else makes the line no match.
_PLAIN_ROW = re.compile(rf"^([^,\n]+),({_HASH_ALTERNATIVES}),([0-9]*)$", re.MULTILINE)
_ROW = re.compile(
    rf'^(?:"((?:[^"\n]|"")+)"|([^,\n"][^,\n]*)),({_HASH_ALTERNATIVES}),([0-9]*)$', re.MULTILINE
)
# A line of such plain rows whose path is absolute or would change under normpath (what
# ``_add_dist`` files under "elsewhere"): /..., ./..., ../..., "." or ".."; or holding //,
# /./ or /../; or ending in /, /. or /..
_ODD_PATH = re.compile(r"^(?:/|\.\.?[/,]|[^,\n]*?(?://|/\.{1,2}/|/\.{0,2},))", re.MULTILINE)
_MODULE_SUFFIXES = (".py", ".so", ".pyd")
_EXT = re.compile(r"([^.]+)(?:\.[^.]+)?\.(?:so|pyd)")  # <name>[.<tag>].so|.pyd


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
class Fault:
    """A file an installer wrote that could not be read or parsed (or a site that could not
    be listed): what it would have said about the installed files is unknown."""

    path: str  # the file or directory, as the process sees it
    detail: str  # one line: what is wrong
    distribution: str | None = None  # canonical name of the distribution it concerns


@dataclass(frozen=True)
class Folder:
    """A package folder of a site: a directory in which RECORDs list files."""

    path: str  # the folder, as the process sees it
    owners: tuple[tuple[str, str], ...]  # (canonical name, version) of each RECORD listing files
    record_path: str  # the path asked about, relative to the site (as a RECORD would write it)


@dataclass
class _Dist:
    """One ``.dist-info`` directory as indexed."""

    name: str
    version: str
    site: str
    local: LocalInstall | None = None
    dir_name: str = ""  # the .dist-info directory's name
    fields: list[_Fields] = field(default_factory=list)  # its RECORD's well-formed rows
    content: str | None = None  # content.content_digest of them, once asked (``contents``)


_Fields = tuple[str, str, str]  # a well-formed RECORD row: path, hash field, size
_Row = tuple[_Dist, _Fields]  # a well-formed RECORD row and the dist whose RECORD it is in


@dataclass
class _Site:
    """One indexed site directory: its distributions and their RECORD rows."""

    dists: dict[str, _Dist] = field(default_factory=dict)  # canonical name -> dist
    # every .dist-info indexed, a second of one name too (whose rows are indexed all the same)
    every: list[_Dist] = field(default_factory=list)
    # Rows naming a file inside the site, by the path RECORD writes (no "..", not absolute):
    # keeping them unjoined makes indexing a dict insert per row.
    rows: dict[str, list[_Row]] = field(default_factory=dict)
    # directory (relative to the site) -> the dists whose RECORD lists a file under it; built
    # on demand (folders())
    _folders: dict[str, list[_Dist]] | None = None
    # module -> the rows installing it; built on demand (modules())
    _modules: dict[str, list[_Row]] | None = None

    def modules(self) -> dict[str, list[_Row]]:
        """Every module a row of this site installs, with those rows (in RECORD order)."""
        if self._modules is None:
            modules: dict[str, list[_Row]] = {}
            for record_path, rows in self.rows.items():
                name = _module_of(record_path)
                if name is not None:
                    modules.setdefault(name, []).extend(rows)
            self._modules = modules
        return self._modules

    def folders(self) -> dict[str, list[_Dist]]:
        """Every directory under which some RECORD row of this site names a file, with the
        distributions whose rows do (``.dist-info`` directories are not package folders)."""
        if self._folders is None:
            folders: dict[str, list[_Dist]] = {}
            for record_path, rows in self.rows.items():
                if record_path.partition("/")[0].endswith(_DIST_INFO):
                    continue
                for dist, _ in rows:
                    directory = record_path
                    while (cut := directory.rfind("/")) > 0:
                        directory = directory[:cut]
                        owners = folders.setdefault(directory, [])
                        if any(o is dist for o in owners):
                            break  # so are all the directories above it
                        owners.append(dist)
            self._folders = folders
        return self._folders


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


def norm_path(path: str) -> str:
    """Normalized absolute-looking path ("//x" becomes "/x", as the kernel reads it)."""
    if _clean(path):
        return path
    p = posixpath.normpath(path)
    return "/" + p.lstrip("/") if p.startswith("//") else p


def is_under(path: str, directory: str) -> bool:
    """Whether PATH is DIRECTORY or inside it, component-wise (both normalized)."""
    if directory == "/":
        return path.startswith("/")
    return path == directory or path.startswith(directory + "/")


def record_abspath(site: str, record_path: str) -> str:
    """The absolute path a RECORD row names (RECORD paths are relative to the site, may hold
    "../", and may be absolute). Clean relative paths skip normpath: most rows are clean."""
    if record_path.startswith("/"):
        return norm_path(record_path)
    if _clean(record_path):
        return f"{site.rstrip('/')}/{record_path}"
    return norm_path(f"{site}/{record_path}")


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


def _record_rows(text: str) -> tuple[list[_Fields], list[str], bool]:
    """The well-formed rows of a RECORD's text, what was wrong with the others (a CSV error
    ends the parse: the rows before it are kept), and whether every row's path is relative
    and normalized (what most RECORDs hold: then no row needs looking at one by one).

    In most RECORDs every line is a well-formed row: then one regular expression reads them
    all in C (a path that holds a comma is quoted: vLLM's RECORD has some). Any other text,
    or one line that is not such a row, takes the ``csv`` reader and its messages."""
    lf = text.replace("\r\n", "\n") if "\r" in text else text  # pip writes CRLF
    if "\r" not in lf and "\0" not in lf:
        fast: list[_Fields] | None = None
        if '"' not in lf:
            fast = _PLAIN_ROW.findall(lf)
        else:
            found: list[tuple[str, str, str, str]] = _ROW.findall(lf)
            fast = [(p or q.replace('""', '"'), h, n) for q, p, h, n in found]
        lines = lf.split("\n")
        # each match is a whole line; csv stops at a field over its limit, so does this
        if len(fast) == len(lines) - lines.count("") and (
            max(map(len, lines)) <= csv.field_size_limit()
        ):
            return fast, [], '"' not in lf and _ODD_PATH.search(lf) is None
    return (*_csv_rows(text), False)


def _csv_rows(text: str) -> tuple[list[_Fields], list[str]]:
    """``_record_rows`` by the ``csv`` reader, line by line: the definition the fast path
    must agree with, and what reads any text it does not take."""
    rows: list[_Fields] = []
    bad: list[str] = []
    try:
        for lineno, row in enumerate(csv.reader(io.StringIO(text, newline="")), 1):
            if _row_ok(row):
                rows.append((row[0], row[1], row[2]))
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
        and (not row[2] or (row[2].isascii() and row[2].isdigit()))
    )


def _sha256_hex(text: str) -> str | None:
    """The hex sha256 of a well-formed hash field (``sha256=<urlsafe b64>``); None when the
    field is empty or names another algorithm."""
    if not text.startswith("sha256="):
        return None
    return base64.urlsafe_b64decode(text[7:].rstrip("=") + "=").hex()


def _claim(dist: _Dist, row: _Fields) -> Claim:
    """The Claim a well-formed RECORD row of DIST makes."""
    size = int(row[2]) if row[2] else None
    return Claim(dist.name, dist.version, row[0], _sha256_hex(row[1]), size, dist.site)


def _metadata(data: bytes) -> dict[str, str]:
    """Name and Version from a METADATA file's headers (its bytes DATA; stops at the first
    blank line: the body is not needed). Raises UnicodeDecodeError as a text file read of
    it would (decoded in the same chunks)."""
    fields: dict[str, str] = {}
    with io.TextIOWrapper(io.BytesIO(data), encoding="utf-8") as fh:
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
    return norm_path(unquote(parts.path))


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


@dataclass(frozen=True)
class _Parsed:
    """What indexing one site added to an index: its entry (read-only once made), and the
    rows naming paths outside it, the directory installs and the faults it found, in order."""

    entry: _Site
    elsewhere: tuple[tuple[str, _Row], ...]
    roots: tuple[tuple[str, LocalInstall], ...]
    faults: tuple[Fault, ...]
    # what was read (``inputs``): the site's listing, each distribution's METADATA, RECORD
    # and direct_url.json
    inputs: tuple[I.Input, ...] = ()


class Sites:
    """Sites already parsed, for every index of a process that sees the same filesystem (its
    *view*: mount namespace and root directory, ``judge.view_of``). The processes of one
    vLLM tree share their site-packages: one parse serves them all. Keep one only as long as
    the files may be taken as unchanged (the agent: one per collect)."""

    def __init__(self) -> None:
        self._parsed: dict[tuple[object, str], _Parsed] = {}

    def get(self, view: object, site: str) -> _Parsed | None:
        return self._parsed.get((view, site))

    def put(self, view: object, site: str, parsed: _Parsed) -> None:
        self._parsed[(view, site)] = parsed

    def __len__(self) -> int:
        return len(self._parsed)


class DistIndex:
    """The installed distributions a process can see, indexed per site directory on demand.

    A *site* is a directory holding ``*.dist-info`` directories. Each site's RECORDs are read
    once and kept by the path each row names, so a lookup is a dict access per ancestor site.
    Rows are kept raw (validated) and become Claims when looked up: a process loads a small
    part of what its site-packages holds, and decoding every hash would dominate.
    """

    def __init__(
        self, to_host: Callable[[str], Path], sites: Sites | None = None, view: object = None
    ) -> None:
        self.to_host = to_host
        # SITES: sites parsed for other processes of the same VIEW (None: no view known, so
        # nothing is shared); replaceable between lookups (the agent gives each collect one)
        self.sites = sites
        self.view = view
        self.problems: list[str] = []  # what was skipped, and why
        self.faults: list[Fault] = []  # the same, with the file and distribution concerned
        self._site_of: dict[str, str | None] = {}  # directory -> nearest site (or None)
        self._sites: dict[str, _Site] = {}  # indexed sites, in indexing order
        self._chains: dict[str, tuple[str, ...]] = {}  # directory -> its sites, nearest first
        self._elsewhere: dict[str, list[_Row]] = {}  # rows naming "../" or absolute paths
        self._claims: dict[str, list[Claim]] = {}  # paths looked up -> their Claims
        self._roots: list[tuple[str, LocalInstall]] = []  # directory installs, longest first
        # every read, by (path, kind) (``inputs``)
        self._inputs: dict[tuple[str, str], I.Input] = {}

    # -- sites ------------------------------------------------------------------------------

    def site_of(self, path: str) -> str | None:
        """The nearest ancestor directory of PATH holding a ``*.dist-info`` directory. Every
        directory visited is cached with its answer: paths share few ancestors. A relative
        PATH (relative to a working directory unknown here) has none."""
        directory = posixpath.dirname(norm_path(path))
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
        names, fault = self._list(directory, self._keep)
        if fault is not None:
            self._fault(fault, directory)
        return bool(names)

    def _list(
        self, directory: str, keep: Callable[[I.Input], None]
    ) -> tuple[list[str], str | None]:
        """The ``*.dist-info`` names of DIRECTORY, sorted (none where it cannot be listed,
        with why, when that is a fault), the read kept with KEEP: the identity of the very
        directory listed (a descriptor's, so a directory renamed in between is not taken for
        another), and a look at each ``*.dist-info`` that is a symbolic link (where it points
        can change while DIRECTORY does not)."""
        host = self.to_host(directory)
        fault = None
        linked: list[str] = []
        try:
            fd = os.open(host, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                ident = I.ident_of(os.fstat(fd))
                names = sorted(I.dist_infos(fd))
                linked = I.linked_dist_infos(fd)
            finally:
                os.close(fd)
            digest = I.of_names(names)
        except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: NUL, "\ud800"
            ident, names, digest = I.ABSENT, [], I.of_names([])
        except OSError as e:
            ident, names, digest = I.CHANGING, [], I.UNREADABLE
            fault = f"cannot list {directory}: {e.strerror or e}"
        keep((directory, I.LISTING, ident, digest))
        for name in linked:
            path = f"{directory.rstrip('/')}/{name}"
            keep((path, I.EXISTS, *I.look(self.to_host(path))))
        return names, fault

    def _keep(self, read: I.Input) -> None:
        self._inputs.setdefault((read[0], read[1]), read)

    def add_site(self, site: str) -> None:
        """Index every ``*.dist-info`` directory in SITE (idempotent). A relative SITE (a
        sys.path entry relative to the process's working directory) is ignored."""
        site = norm_path(site)
        if site in self._sites or not site.startswith("/"):
            return
        shared = self.sites is not None and self.view is not None
        parsed = self.sites.get(self.view, site) if self.sites is not None and shared else None
        if parsed is None:
            parsed = self._parse_site(site)
            if self.sites is not None and shared:
                self.sites.put(self.view, site, parsed)
        self._sites[site] = parsed.entry
        for read in parsed.inputs:
            self._keep(read)
        for path, row in parsed.elsewhere:
            self._elsewhere.setdefault(path, []).append(row)
        self._roots.extend(parsed.roots)
        for fault in parsed.faults:
            self.problems.append(fault.detail)
            self.faults.append(fault)
        self._roots.sort(key=lambda r: len(r[0]), reverse=True)
        self._claims.clear()  # a "../" row of this site may name a path looked up before

    def _parse_site(self, site: str) -> _Parsed:
        """Every ``*.dist-info`` directory of SITE read: what indexing it adds."""
        entry = _Site()
        elsewhere: list[tuple[str, _Row]] = []
        roots: list[tuple[str, LocalInstall]] = []
        faults: list[Fault] = []
        inputs: list[I.Input] = []
        names, fault = self._list(site, inputs.append)
        if fault is not None:
            faults.append(Fault(site, fault))
        for name in names:
            dist = self._add_dist(site, entry, name, elsewhere, faults, inputs=inputs)
            entry.every.append(dist)
            if dist.local is not None and dist.local.root is not None:
                roots.append((dist.local.root, dist.local))
            if entry.dists.setdefault(dist.name, dist) is not dist:
                faults.append(
                    Fault(
                        f"{site.rstrip('/')}/{name}",
                        f"{site}/{name}: a second {dist.name} in {site}; ignored",
                        dist.name,
                    )
                )
        return _Parsed(entry, tuple(elsewhere), tuple(roots), tuple(faults), tuple(inputs))

    def _add_dist(
        self,
        site: str,
        entry: _Site,
        dir_name: str,
        elsewhere: list[tuple[str, _Row]],
        faults: list[Fault],
        *,
        inputs: list[I.Input],
    ) -> _Dist:
        """Index one ``.dist-info`` directory: its name, version, RECORD and direct_url (each
        read kept in INPUTS)."""
        dist = self._read_metadata(site, dir_name, faults, inputs)
        base = f"{site.rstrip('/')}/{dir_name}"
        rows = entry.rows
        fields, clean = self._read_record(base, dist.name, faults, inputs)
        dist.dir_name, dist.fields = dir_name, fields
        if clean:  # every path relative and normalized
            for row in fields:
                rows.setdefault(row[0], []).append((dist, row))
        else:
            for row in fields:
                rp = row[0]
                if rp[0] != "/" and _clean(rp):
                    rows.setdefault(rp, []).append((dist, row))
                else:
                    elsewhere.append((record_abspath(site, rp), (dist, row)))
        dist.local = self._read_direct_url(base, dist, faults, inputs)
        return dist

    def _read_metadata(
        self, site: str, dir_name: str, faults: list[Fault], inputs: list[I.Input]
    ) -> _Dist:
        """Canonical name and version from METADATA, falling back on the directory's name
        (``<name>-<version>.dist-info``) for whatever METADATA does not say."""
        stem = dir_name[: -len(_DIST_INFO)]
        name, _, version = stem.partition("-")
        path = f"{site.rstrip('/')}/{dir_name}/METADATA"
        try:
            fields = _metadata(self._read(path, MAX_METADATA_BYTES, inputs))
        except (OSError, UnicodeDecodeError) as e:
            why = f"{path}: unreadable ({_why(e)}); name from directory name"
            faults.append(Fault(path, why, canonical_name(name)))
            fields = {"name": name}
        if "name" not in fields:
            why = f"{path}: no Name header; name from directory name"
            faults.append(Fault(path, why, canonical_name(name)))
        return _Dist(
            canonical_name(fields.get("name") or name), fields.get("version") or version, site
        )

    def _read_record(
        self, base: str, dist: str, faults: list[Fault], inputs: list[I.Input]
    ) -> tuple[list[_Fields], bool]:
        """Every well-formed row of ``<base>/RECORD`` (of distribution DIST), and whether every
        row's path is known to be relative and normalized. Malformed rows are skipped; a
        RECORD that is not UTF-8 or stops parsing part way keeps the rows before the fault.
        Each fault is kept (``faults``)."""
        path = f"{base}/RECORD"
        try:
            data = self._read(path, MAX_RECORD_BYTES, inputs)
        except OSError as e:
            faults.append(Fault(path, f"{path}: unreadable ({_why(e)})", dist))
            return [], True
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            text = data[: e.start].decode("utf-8").rpartition("\n")[0]
            why = f"{path}: not UTF-8 at byte {e.start}; rows before it kept"
            faults.append(Fault(path, why, dist))
        rows, bad, clean = _record_rows(text)
        if bad:
            why = f"{path}: {len(bad)} malformed rows skipped, first {bad[0]}"
            faults.append(Fault(path, why, dist))
        return rows, clean

    def _read_direct_url(
        self, base: str, dist: _Dist, faults: list[Fault], inputs: list[I.Input]
    ) -> LocalInstall | None:
        """The local install ``<base>/direct_url.json`` describes, if any."""
        path = f"{base}/direct_url.json"
        try:
            return _local_install(json.loads(self._read(path, MAX_DIRECT_URL_BYTES, inputs)), dist)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError: ValueErrors
            path = f"{base}/direct_url.json"
            faults.append(Fault(path, f"{path}: skipped ({_why(e)})", dist.name))
            return None

    def _read(self, path: str, limit: int, inputs: list[I.Input]) -> bytes:
        """The bytes of the regular file PATH (at most LIMIT), the read kept in INPUTS (one
        that fails too: a file absent, or unreadable) with the identity of the very file
        read (its descriptor's: a file renamed over the path between a look and the read is
        not taken for the one looked at). Raises OSError as ``read_regular``."""
        try:
            with open_file(self.to_host(path)) as f:
                ident = I.ident_of(os.fstat(f.fileno()))
                data = f.read(limit + 1)
        except FileNotFoundError:
            inputs.append((path, I.FILE, I.ABSENT, I.of_bytes(None)))
            raise
        except OSError:
            inputs.append((path, I.FILE, I.CHANGING, I.UNREADABLE))
            raise
        if len(data) > limit:
            inputs.append((path, I.FILE, I.CHANGING, I.UNREADABLE))
            raise NotRegular(errno.EFBIG, f"larger than {limit} bytes: not read", path)
        inputs.append((path, I.FILE, ident, I.of_bytes(data)))
        return data

    def is_file(self, path: str) -> bool:
        """Whether PATH is a file (anything that cannot be examined: no), the look kept (one
        ``stat``: the identity kept is the one the answer came from)."""
        ident, what = I.look(self.to_host(path))
        self._keep((path, I.EXISTS, ident, what))
        return what == "file"

    def inputs(self) -> tuple[I.Input, ...]:
        """Every read this index made (``inputs``), sorted: the judgement it served holds
        while each would read the same."""
        return tuple(sorted(self._inputs.values()))

    def _fault(self, message: str, path: str, distribution: str | None = None) -> None:
        """Keep what was skipped (MESSAGE), about PATH of DISTRIBUTION."""
        self.problems.append(message)
        self.faults.append(Fault(path, message, distribution))

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
        path = norm_path(path)
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
        rows = (r for entry in self._sites.values() for r in entry.modules().get(module, ()))
        return [_claim(*r) for r in rows]

    def package_folder(self, path: str) -> Folder | None:
        """The innermost folder holding PATH in which RECORDs of its site list files (a
        package folder of the distributions whose RECORDs do), nearest site first. None when
        PATH lies directly in a site, or in no site. A file found there that no RECORD lists
        was put there after installation."""
        path = norm_path(path)
        for site in self._ancestor_sites(path):
            base = site.rstrip("/")
            rel = path[len(base) + 1 :]
            folders = self._sites[site].folders()
            directory = posixpath.dirname(rel)
            while directory:
                owners = folders.get(directory)
                if owners:
                    return Folder(
                        f"{base}/{directory}", tuple((d.name, d.version) for d in owners), rel
                    )
                directory = posixpath.dirname(directory)
        return None

    def contents(self, keys: Iterable[tuple[str, str]]) -> tuple[tuple[str, str, str], ...]:
        """(name, version, content digest: ``content.content_digest``) of every indexed
        distribution whose (canonical name, version) is in KEYS, sorted: one per install, so
        two installs of one name and version with other contents are both there."""
        wanted = set(keys)
        out: set[tuple[str, str, str]] = set()
        for entry in self._sites.values():
            for dist in entry.every:
                if (dist.name, dist.version) in wanted:
                    if dist.content is None:
                        dist.content = content_digest(dist.dir_name, dist.fields, dist.site)
                    out.add((dist.name, dist.version, dist.content))
        return tuple(sorted(out))

    def local_install(self, distribution: str, site: str) -> LocalInstall | None:
        """The local install (``file://`` direct_url.json) of DISTRIBUTION in SITE, if any."""
        site = norm_path(site)
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
        path = norm_path(path)
        for root, local in self._roots:
            if is_under(path, root):
                site = self.site_of(path)
                if site is not None and site != root and is_under(site, root):
                    return None
                return local
        return None


def _why(e: BaseException) -> str:
    """A short reason for a skipped file."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return f"{type(e).__name__}: {e}"
