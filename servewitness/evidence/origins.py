"""Where each file a live process loaded came from: its *provenance class*, and which
loaded modules shadow the file a distribution (or the standard library) provides.

Comparing the bytes the process loaded with what installers wrote down (``DistIndex``, in
``distindex.py``) tells a pristine file from a patched one, an editable checkout from an
installed wheel, and leaves everything nobody claims visibly unclaimed; what no RECORD
claims may still be the standard library's, or generated at run time (compile caches). A
file inside a distribution's package folder that its RECORD does not list was *added* there
after installation: it belongs to that distribution, and is not pristine.

Bytecode in ``__pycache__`` is derived from its source, and counts under its source's class,
with one exception: it is ``pristine`` only when its code was shown to be compiled from the
bytes its RECORD lists for the source (``bytecode.judge_bytecode``'s ``compiled_from``). A
pyc of a pristine source that was not shown so (stale, another Python's, not comparable) is
``unknown``, with its distribution: what runs is not known to be what was published.

Native code is judged too: each executable mapping's mapped inode (``native.py``) against
the RECORD that lists its path, so a replaced ``.so`` of a distribution is ``patched``.

Paths are the process's paths, read through the index's ``to_host``. Bad input never
raises.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from servewitness.evidence.distindex import Claim, DistIndex, norm_path, record_abspath
from servewitness.evidence.places import in_stdlib, innermost, system_code
from servewitness.model import (
    DRIFT_MODULE_SHADOWED,
    Drift,
    FileEntry,
    FileOrigin,
    NativeMapping,
    Origin,
    Provenance,
)

_MAIN_MODULES = frozenset({"__main__", "__mp_main__"})
_PYC = re.compile(r"([^.]+)\.[^.]+(?:\.opt-\d+)?\.pyc")  # <name>.<tag>[.opt-N].pyc
_SHADOW_AT = frozenset({"load", "snapshot", "late"})  # not "deferred": its bytecode is judged


@dataclass(frozen=True)
class Context:
    """What the process's interpreter and environment say about locations."""

    stdlib_dirs: tuple[str, ...]  # e.g. ("/usr/local/lib/python3.11",) incl. lib-dynload
    generated_dirs: tuple[str, ...]  # compile caches and temporary dirs (generated_dirs())
    site_dirs: tuple[str, ...] = ()  # indexed up front (e.g. the process's sys.path entries)
    # The directories the process imports modules from by name: its sys.path as its probe
    # recorded it and the PYTHONPATH it was started with (the kernel's copy of its
    # environment). A generated file under one of them is no compile cache (``_judge``).
    import_dirs: tuple[str, ...] = ()


@dataclass
class _Judged:
    """A path's classification before it becomes a FileOrigin."""

    origin: Origin
    reason: str
    distribution: str | None = None
    version: str | None = None
    record_path: str | None = None
    expected_sha256: str | None = None


def source_of_bytecode(path: str) -> str | None:
    """``<dir>/__pycache__/<name>.<tag>[.opt-N].pyc`` -> ``<dir>/<name>.py``; None for any
    other path (sourceless bytecode lives outside ``__pycache__``)."""
    parent, name = posixpath.split(path)
    pkg, cache = posixpath.split(parent)
    m = _PYC.fullmatch(name)
    if cache != "__pycache__" or m is None:
        return None
    return posixpath.join(pkg, m.group(1) + ".py")


# -- classification --------------------------------------------------------------------------


@dataclass
class _Classifier:
    """Classifies paths for one classify() call, memoizing per (path, hash)."""

    index: DistIndex
    ctx: Context
    # pyc path -> sha256 of the source it was shown to be compiled from (judge_bytecode)
    compiled_from: Mapping[str, str] = field(default_factory=dict)
    sources: dict[str, FileEntry] = field(default_factory=dict)  # first non-bytecode entry
    memo: dict[tuple[str, str | None, bool], _Judged] = field(default_factory=dict)
    caches_on_path: list[str] | None = None  # _import_dirs_in_caches, once

    def entry(self, f: FileEntry) -> _Judged:
        """One manifest file's class (bytecode in ``__pycache__`` takes its source's, but is
        pristine only when shown to be compiled from the published source)."""
        source = source_of_bytecode(f.path) if f.kind == "bytecode" else None
        if source is None:
            judged = self.path(f.path, f.sha256, derived=False)
            if judged.origin is Origin.GENERATED and f.module in _MAIN_MODULES:
                why = f"a main script run by path, {judged.reason}: no compile cache runs one"
                return _Judged(Origin.UNKNOWN, why)
            return judged
        src = self.sources.get(norm_path(source))
        judged = (
            self.path(src.path, src.sha256, derived=False)
            if src is not None
            else self.path(source, None, derived=True)
        )
        own = self.index.claim(f.path)
        origin, reason = judged.origin, f"bytecode of {source}"
        if origin is Origin.PRISTINE and not self._compiled_from_published(f.path, source, src):
            origin = Origin.UNKNOWN
            reason += (
                f", which is pristine ({judged.reason}), but its code was not shown to be "
                "compiled from it (see the provenance.bytecode findings)"
            )
        elif origin is not Origin.PRISTINE:
            reason += f" ({judged.reason})"
        return _Judged(
            origin,
            reason,
            judged.distribution,
            judged.version,
            own.record_path if own is not None else None,
        )

    def _compiled_from_published(self, pyc: str, source: str, src: FileEntry | None) -> bool:
        """Whether PYC's code was shown to be compiled from the bytes the RECORD lists for
        SOURCE: the source as the probe hashed it (SRC, judged pristine), or, when the
        process did not hash it, one of the hashes RECORD files list for it."""
        shown = self.compiled_from.get(pyc)
        if shown is None:
            return False
        if src is not None:
            return src.sha256 is not None and src.sha256.lower() == shown
        return any(c.sha256 == shown for c in self.index.claims(source))

    def path(self, path: str, sha256: str | None, *, derived: bool) -> _Judged:
        """PATH's class given the hash it was loaded with (memoized). DERIVED: the source
        of loaded bytecode, not loaded itself: a RECORD listing suffices."""
        key = (path, sha256, derived)
        if key not in self.memo:
            self.memo[key] = self._judge(path, sha256, derived)
        return self.memo[key]

    def _judge(self, path: str, sha256: str | None, derived: bool) -> _Judged:
        """Rules in order: claimed by a RECORD; under a directory install's root; in a
        distribution's package folder but not in its RECORD; standard library; generated;
        unknown."""
        claims = self.index.claims(path)
        if claims:
            return self._claimed(claims, sha256, derived)
        local = self.index.editable_root(path)
        if local is not None:
            kind = "editable" if local.editable else "local"
            reason = f"under the root of the {kind} install from {local.url}"
            return _Judged(Origin.EDITABLE, reason, local.distribution, local.version)
        folder = self.index.package_folder(path)
        if folder is not None:
            (name, version), *others = folder.owners
            also = f" (and of {', '.join(n for n, _ in others)})" if others else ""
            reason = f"in package folder {folder.path} of {name} {version}{also}, not in its RECORD"
            return _Judged(Origin.ADDED, reason, name, version, folder.record_path)
        if in_stdlib(norm_path(path), self.ctx.stdlib_dirs):
            return _Judged(Origin.STDLIB, "in the standard library")
        return self._unclaimed(norm_path(path))

    def _unclaimed(self, path: str) -> _Judged:
        """A path nothing installed claims: generated (under a compile cache or temporary dir
        the process does not import modules from by name) or unknown."""
        gen = innermost(path, self.ctx.generated_dirs)
        if gen is None:
            return _Judged(Origin.UNKNOWN, "no distribution claims it")
        entry = innermost(path, self._import_dirs_in_caches())
        if entry is not None:
            return _Judged(
                Origin.UNKNOWN,
                f"under {gen} (a compile cache or temporary dir), which the process imports "
                f"modules from by name through {entry}: a file planted there runs as any "
                "module, so it is not taken as generated",
            )
        return _Judged(Origin.GENERATED, f"under {gen} (a compile cache or temporary dir)")

    def _import_dirs_in_caches(self) -> list[str]:
        """The import path's directories that lie in a compile cache or temporary dir."""
        if self.caches_on_path is None:
            gen = self.ctx.generated_dirs
            self.caches_on_path = [
                norm_path(d)
                for d in self.ctx.import_dirs
                if d.startswith("/") and innermost(norm_path(d), gen) is not None
            ]
        return self.caches_on_path

    def _claimed(self, claims: list[Claim], sha256: str | None, derived: bool) -> _Judged:
        """Class of a file RECORD lists: its hash against RECORD's, local installs aside. Rows
        that disagree about the file (two RECORDs, or two rows of one, with other hashes)
        make it patched against one it does not match, not pristine against the one it does:
        another distribution's row, or an extra row spelled to look like it is outside the
        site, cannot vouch for an edit of a file its distribution lists (an outside tester,
        2026-12-07)."""
        sha = sha256.lower() if sha256 else None
        c = next((c for c in claims if sha is not None and c.sha256 == sha), claims[0])
        other = next((o for o in claims if sha and o.sha256 and o.sha256 != sha), None)
        also = ""
        if other is not None and c.sha256 == sha:  # judged against the row it differs from
            also = f" (a row of {c.distribution} {c.version} lists its bytes: rows disagree)"
            c = other
        who = f"{c.distribution} {c.version}"

        def judged(origin: Origin, reason: str, expected: str | None = None) -> _Judged:
            return _Judged(origin, reason, c.distribution, c.version, c.record_path, expected)

        local = self.index.local_install(c.distribution, c.site)
        if sha is None and not derived:
            return judged(Origin.UNKNOWN, "not hashed when loaded")
        if sha is not None and c.sha256 is not None and c.sha256 != sha:
            return judged(Origin.PATCHED, f"sha256 differs from RECORD of {who}{also}", c.sha256)
        if local is not None:
            kind = "editable" if local.editable else "local"
            return judged(Origin.EDITABLE, f"{kind} install from {local.url}")
        if derived:
            return judged(Origin.PRISTINE, f"listed in RECORD of {who}")
        if c.sha256 is None:
            return judged(Origin.UNKNOWN, f"RECORD of {c.distribution} lists it without a hash")
        return judged(Origin.PRISTINE, f"sha256 matches RECORD of {who}")


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
    files: Sequence[FileEntry],
    index: DistIndex,
    ctx: Context,
    native: Sequence[NativeMapping] = (),
    compiled_from: Mapping[str, str] | None = None,
    *,
    inline: Sequence[FileEntry] = (),
) -> tuple[Provenance, list[Drift]]:
    """Each loaded file's provenance class, and the modules loaded from somewhere other than
    where their distribution (or the standard library) puts them. ``distributions`` counts
    the loaded files attributed to each distribution (by RECORD, by an install's root, or by
    its package folder).

    NATIVE: the process's executable mappings (``native.native_mappings``). Each one hashed
    as mapped, not in FILES, that belongs to a distribution is judged and counted like a
    loaded file, with the mapped inode's sha256; of the rest, those in the system's
    directories (the interpreter, system libraries: ``places.system_code``) have no RECORD to
    compare with and are left to the native mapping checks, and any other (an
    ``LD_PRELOAD``, a library loaded with ``ctypes``, a compile cache's) is counted and
    listed ``unknown`` or ``generated``, hashed or not.

    COMPILED_FROM: ``judge_bytecode``'s pycs shown to be compiled from their source (pyc path
    -> the source's sha256); a pyc of a pristine source that is not in it is ``unknown``
    (None: no pyc was shown, so none is pristine).

    INLINE: the ``-c`` code the process ran (manifest entries of kind ``inline``, path
    ``-c``): no file, so nothing installed claims it; each is ``unknown``, counted and
    listed, so a rule that asks who vouches for every piece of code sees it too.

    Every site on the way to any manifest file or native mapping, and every
    ``ctx.site_dirs`` entry, is indexed before anything is judged, so the answer does not
    depend on manifest order."""
    for site in ctx.site_dirs:
        index.add_site(site)
    listed = {norm_path(f.path) for f in files}
    mapped = [m for m in native if m.sha256 is not None and norm_path(m.path) not in listed]
    for path in [f.path for f in files] + [m.path for m in mapped]:
        index.claims(path)  # indexes every site on the way to it
    c = _Classifier(index, ctx, compiled_from or {})
    for f in files:
        if f.kind != "bytecode":
            c.sources.setdefault(norm_path(f.path), f)
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
    unread = [m for m in native if m.sha256 is None and norm_path(m.path) not in listed]
    for m in [*mapped, *unread]:
        judged = _native(c, m, ctx.stdlib_dirs)
        if judged is None:
            continue
        counts[judged.origin] += 1
        if judged.distribution is not None:
            key = (judged.distribution, judged.version or "")
            per_dist[key] = per_dist.get(key, 0) + 1
        if judged.origin is not Origin.PRISTINE:
            entry = FileEntry(m.path, m.sha256, m.size, "native", None, "mapped")
            reported.append(_file_origin(entry, judged))
    for f in inline:
        counts[Origin.UNKNOWN] += 1
        reason = "code given on the command line (python -c): no file, nothing installed claims it"
        reported.append(_file_origin(f, _Judged(Origin.UNKNOWN, reason)))
    reported.sort(key=lambda fo: fo.path)
    prov = Provenance(
        counts=tuple((o.value, n) for o, n in counts.items()),
        files=tuple(reported),
        distributions=tuple((d, v, n) for (d, v), n in sorted(per_dist.items())),
        contents=index.contents(per_dist),
    )
    return prov, shadowing(files, index, ctx)


def _native(c: _Classifier, m: NativeMapping, stdlib_dirs: Sequence[str]) -> _Judged | None:
    """A mapping's class, to be counted (and listed unless pristine), or None: a
    distribution's that could not be read (the native mapping checks say so), or one in
    the system's directories or the interpreter's installation (``places.system_code``).
    Any other that no distribution claims (an ``LD_PRELOAD``, a library loaded with ctypes,
    a compile cache's) is ``unknown`` or ``generated``, read or not."""
    j = c.path(m.path, m.sha256, derived=False)
    if j.distribution is None:
        nobodys = j.origin in (Origin.UNKNOWN, Origin.GENERATED)
        if not nobodys or system_code(m.path, stdlib_dirs):
            return None
    elif m.sha256 is None:
        return None
    if j.origin is Origin.PRISTINE:
        return j
    return dataclasses.replace(j, reason=f"mapped native code: {j.reason}")


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
        path = norm_path(source or f.path)
        if in_stdlib(path, ctx.stdlib_dirs):
            continue
        claims = index.claims(path)
        if claims:
            detail = _second_install(f.module, path, claims, index)
        elif _installed_there(path, index):
            continue
        else:
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


def _second_install(
    module: str, path: str, claims: Sequence[Claim], index: DistIndex
) -> str | None:
    """Why MODULE, loaded from PATH where a RECORD put it (CLAIMS), is not what another
    site's installation installs for it (None: none installs it elsewhere, or with the same
    bytes).

    The attack (found by a black-box attacker, 2026-12-05): a copy of vLLM's package and its
    ``.dist-info``, one module patched and its RECORD row rewritten, in a directory put first
    on ``PYTHONPATH``. Every file of the copy is where its (forged) RECORD says: pristine,
    shadowing nothing. The installation in site-packages says other bytes for that module:
    that is the finding, whatever distribution the copy's RECORD names (a second attacker
    moved the patched file's row into the RECORD of a made-up distribution). The two RECORDs
    are compared, not the
    files, so a module loaded from its pyc counts the same; the copies' other modules (the
    same bytes in both) say nothing. Which copy is genuine the RECORDs cannot tell: the
    finding is raised whichever was loaded. A vendored copy (``setuptools/_vendor``, which
    setuptools puts on ``sys.path``) is claimed by its vendor's RECORD too, in an outer site:
    not a second installation, whether it or the other copy is the one loaded."""
    sites = {c.site for c in claims}
    mine = next((c for c in claims if c.sha256), None)
    if mine is None or mine.sha256 is None:
        return None
    for c in index.claimants(module):
        if c.site not in sites and c.sha256 not in (None, mine.sha256):
            where = record_abspath(c.site, c.record_path)
            if any(o.site != c.site for o in index.claims(where)):
                continue  # a vendored copy: its vendor's RECORD, in another site, lists it
            same = "the same distribution" if c.distribution == mine.distribution else "another"
            return (
                f"module {module} was loaded from {path}, installed there by "
                f"{mine.distribution} {mine.version} in {mine.site} with sha256 "
                f"{mine.sha256[:12]}, but {c.distribution} {c.version} ({same}) in {c.site} "
                f"installs other bytes for it at {where} ({(c.sha256 or '')[:12]}): two "
                "installations of the module that disagree"
            )
    return None


def _dist_shadow(module: str, path: str, index: DistIndex) -> str | None:
    """Why MODULE loaded from PATH shadows a distribution's copy (None: none installs it)."""
    claimants = index.claimants(module)
    if not claimants:
        return None
    c = claimants[0]
    where = record_abspath(c.site, c.record_path)
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
    for d in (d for d in map(norm_path, ctx.stdlib_dirs) if d.startswith("/")):
        for rel in (f"{module}.py", f"{module}/__init__.py"):
            candidate = f"{d.rstrip('/')}/{rel}"
            try:
                if index.is_file(candidate):  # the look is kept: ``inputs``
                    return candidate
            except OSError:
                continue
    return None
