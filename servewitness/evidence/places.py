"""Where a path lies, as a process names it: in the interpreter's standard library, or under
the compile caches and temporary directories its environment names (``generated_dirs``), and
which of its files those make generated (``GeneratedFiles``). ``origins.py`` classes files
with these; the changed-after-start checks (``judge.py``, ``native.py``) waive generated ones.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from servewitness.evidence.distindex import DistIndex, is_under, norm_path

_NON_STDLIB_DIRS = frozenset({"site-packages", "dist-packages"})


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
        if expanded.startswith("/") and norm_path(expanded) not in out:
            out.append(norm_path(expanded))
    return tuple(out)


def in_stdlib(path: str, stdlib_dirs: Iterable[str]) -> bool:
    """Whether normalized PATH is under a standard library directory and not in a
    site-packages/dist-packages directory below it (relative directories match nothing)."""
    for d in map(norm_path, stdlib_dirs):
        if d.startswith("/") and is_under(path, d):
            rest = path[len(d) :].split("/")
            if _NON_STDLIB_DIRS.isdisjoint(rest):
                return True
    return False


def stdlib_test(stdlib_dirs: Iterable[str]) -> Callable[[str], bool]:
    """``in_stdlib`` with STDLIB_DIRS normalized once: for judging many paths."""
    dirs = tuple(d for d in map(norm_path, stdlib_dirs) if d.startswith("/"))

    def test(path: str) -> bool:
        for d in dirs:
            if is_under(path, d) and _NON_STDLIB_DIRS.isdisjoint(path[len(d) :].split("/")):
                return True
        return False

    return test


@dataclass(frozen=True)
class GeneratedFiles:
    """Which of a process's files were generated at run time (compile caches, temporary
    files): under one of DIRS (``generated_dirs``), listed in no distribution's RECORD and
    not in the standard library. Such a file is left out of the
    changed-after-start checks (``judge.changed_after``, ``native.native_mappings``), so which
    files qualify must not be the process's to say: DIRS come from its environment, and a
    ``TMPDIR=/`` or a ``TRITON_CACHE_DIR`` inside site-packages would otherwise exempt vLLM's
    own files from the check that catches a module swapped back after its import. Without an
    INDEX (no probe, or a test) only DIRS and STDLIB_DIRS decide."""

    dirs: tuple[str, ...]
    index: DistIndex | None = None
    stdlib_dirs: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.dirs)

    def covers(self, path: str) -> bool:
        p = norm_path(path)
        if innermost(p, self.dirs) is None or in_stdlib(p, self.stdlib_dirs):
            return False
        index = self.index
        # A local install's root (a checkout: caches often lie inside) and a package folder's
        # unlisted files pin no bytes; only a RECORD row does.
        return index is None or not index.claims(p)


def is_generated(path: str, generated: Sequence[str] | GeneratedFiles) -> bool:
    """Whether PATH is a generated file: GENERATED's ``covers``, or under one of the
    directories GENERATED lists."""
    if isinstance(generated, GeneratedFiles):
        return generated.covers(path)
    return under_any(path, generated)


def under_any(path: str, dirs: Iterable[str]) -> bool:
    """Whether PATH (as the process names it) is under one of DIRS (absolute directories)."""
    return innermost(norm_path(path), dirs) is not None


def innermost(path: str, dirs: Iterable[str]) -> str | None:
    """The longest of DIRS that normalized PATH is under, if any."""
    hits = [d for d in map(norm_path, dirs) if d.startswith("/") and is_under(path, d)]
    return max(hits, key=len) if hits else None


def import_entry(entry: str, cwd: str | None) -> str | None:
    """An import path entry as an absolute, normalized directory: a relative one (``""``
    is the directory itself) taken against CWD; None when it is relative and CWD unknown."""
    if not entry.startswith("/"):
        if cwd is None or not cwd.startswith("/"):
            return None
        entry = f"{cwd}/{entry}" if entry else cwd
    return norm_path(entry)


# Where an image's system installs its native code: the interpreter and the libraries it and
# the dynamic loader map from there are the image's (no RECORD speaks for them).
SYSTEM_DIRS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin")


def system_code(path: str, stdlib_dirs: Iterable[str] = ()) -> bool:
    """Whether PATH (as the process names it) is in the system's directories
    (``SYSTEM_DIRS``) or in the installation of the interpreter whose standard library is
    STDLIB_DIRS (``<prefix>/lib/pythonX.Y``: its ``<prefix>``, where the executable and
    libpython are, for an interpreter outside ``/usr``), and not in a site directory below
    them (where distributions install and anyone with pip can write)."""
    p = norm_path(path)
    prefixes = [
        posixpath.dirname(posixpath.dirname(norm_path(d)))
        for d in stdlib_dirs
        if d.startswith("/") and not d.endswith("/lib-dynload")
    ]
    if not any(is_under(p, d) for d in (*SYSTEM_DIRS, *prefixes) if d.startswith("/")):
        return False
    return _NON_STDLIB_DIRS.isdisjoint(p.split("/"))
