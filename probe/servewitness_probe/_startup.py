"""Code the interpreter runs at start-up outside the import system: the main script, ``-c``
code, standard input, ``PYTHONSTARTUP`` and ``.pth`` files.

* **The main script** (``python bench.py``): the interpreter reads it itself, through no
  loader. How ``__main__`` runs is read from the interpreter's own command line
  (``sys.orig_argv``, parsed as CPython does: ``layout.interpreter_main``), not from
  ``__main__`` (whose ``__file__`` is set only once the script starts: a sweeper that looked
  earlier recorded nothing). The script is hashed when the probe starts, as a ``source`` file
  record of module ``__main__``: ``at: "load"`` when the probe starts early (from its
  ``.pth``, before the interpreter reads the script), ``"snapshot"`` otherwise (after). A
  directory or zip run as a script (``python app.pyz``) runs its ``__main__.py`` through a
  loader (``_imports``, ``_zips``), as ``python -m pkg.mod`` runs its module.
* **``-c CODE``**: hashed as a file record of kind ``inline``, path ``-c``: sha256 of the
  code's bytes as on the command line, which the agent compares with ``/proc/<pid>/cmdline``.
* **Standard input and the interactive prompt**: the code is read as it runs and nothing
  keeps it; an ``unfiled`` record says so (``how``: ``stdin`` or ``interactive``), and so
  does ``-i`` (a prompt after the script). ``PYTHONSTARTUP`` runs only at such a prompt: its
  file is hashed then (a ``source`` record without a module).
* **``.pth`` files** in every site directory (``site.getsitepackages()``, the user site
  when enabled, and any directory given to ``site.addsitedir`` later): each is hashed as a
  file record of kind ``pth``: by the sweeper once its directory is on ``sys.path``
  (``at: "snapshot"``: they ran before the probe, or while the early probe itself was loading
  from one), and at ``site.addpackage`` (wrapped) for those processed after the probe started
  (``at: "load"``; in a venv, CPython 3.11 runs the venv's ``.pth`` files twice). Which lines
  execute code is for the agent to read (``servewitness.evidence.unfiled``).
* ``sitecustomize`` and ``usercustomize`` are imported through the import system after the
  ``.pth`` files: the file loaders record them (``at: "load"`` with the early probe).
"""

from __future__ import annotations

import hashlib
import os
import sys
import zipimport
from typing import Any

from servewitness_probe import _core, _files
from servewitness_probe import layout as L

_main_done = False
main_path: str | None = None  # the main script's path, as recorded here
_pth_scanned: set[str] = set()  # site directories scanned
_pth_recorded: dict[str, str | None] = {}  # path -> "load" | "snapshot"
_site_dirs: list[str] = []  # directories site.addpackage processed since the probe started
_installed = False


def _is_zip(path: str) -> bool:
    try:
        zipimport.zipimporter(path)
    except Exception:  # noqa: BLE001 - not an archive zipimport reads
        return False
    return True


def _script_path(arg: bytes) -> str:
    """The absolute path of the script the interpreter was given (ARG, from its command
    line): ``__main__.__file__`` once set (absolute, since 3.9), else ARG from the current
    directory (the probe starts early, before any chdir)."""
    main = sys.modules.get("__main__")
    try:
        file = vars(main).get("__file__") if main is not None else None
    except TypeError:
        file = None
    if isinstance(file, str) and os.path.isabs(file):
        return file
    return os.path.abspath(os.fsdecode(arg))


def record_main(early: bool) -> None:
    """Journal what ``__main__`` runs (once per process: a forked child inherits it)."""
    global _main_done, main_path
    if _main_done:
        return
    _main_done = True
    st = _core.state()
    at = "load" if early else "snapshot"
    argv = [os.fsencode(a) for a in getattr(sys, "orig_argv", None) or sys.argv]
    if not argv:
        return  # an embedding application gave no command line: nothing to read it from
    how, arg = L.interpreter_main(argv)
    if how == "command" and arg is not None:
        st.remember(
            {
                "k": "file",
                "path": "-c",
                "kind": "inline",
                "module": "__main__",
                "at": at,
                "sha256": hashlib.sha256(arg).hexdigest(),
                "size": len(arg),
            }
        )
    elif how == "script" and arg is not None:
        path = _script_path(arg)
        if os.path.isfile(path) and not _is_zip(path):
            main_path = path
            st.remember(_files.file_record(path, "source", "__main__", at))
    elif how == "stdin":
        interactive = sys.stdin is not None and _isatty(sys.stdin)
        st.remember(
            {
                "k": "unfiled",
                "how": "interactive" if interactive else "stdin",
                "module": "__main__",
                "at": at,
            }
        )
        startup = os.environ.get("PYTHONSTARTUP")
        if interactive and startup and not sys.flags.ignore_environment:
            st.remember(_files.file_record(os.path.abspath(startup), "source", None, at))
    if how != "stdin" and (sys.flags.interactive or sys.flags.inspect):
        st.remember({"k": "unfiled", "how": "interactive", "module": "__main__", "at": at})


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:  # noqa: BLE001 - a closed or replaced stream
        return False


def site_dirs() -> list[str]:
    """The directories whose ``.pth`` files this interpreter processed (or may have)."""
    site = sys.modules.get("site")
    if site is None or sys.flags.no_site:
        return []
    dirs: list[str] = []
    try:
        dirs.extend(site.getsitepackages())
        if getattr(site, "ENABLE_USER_SITE", False):
            dirs.append(site.getusersitepackages())
    except Exception as e:  # noqa: BLE001 - a site module not as CPython's
        _core.report_error("pth", f"site directories: {type(e).__name__}: {e}")
    dirs.extend(_site_dirs)
    return list(dict.fromkeys(os.path.abspath(d) for d in dirs if isinstance(d, str)))


def _record_pth(st: Any, path: str, at: str) -> None:
    if _pth_recorded.get(path) == "load" or (at == "snapshot" and path in _pth_recorded):
        return
    _pth_recorded[path] = at
    st.remember(_files.file_record(path, "pth", None, at))


def scan_pth(st: Any) -> None:
    """Hash every ``.pth`` file of each site directory not scanned yet (the sweeper, every
    pass; a forked child inherits the records). A directory counts once it is on
    ``sys.path``: ``site.addsitedir`` puts it there before it runs its ``.pth`` files, and
    while ``site`` is still at work ``site.getsitepackages()`` may name the base
    interpreter's directory, which a venv never processes."""
    on_path = {os.path.abspath(p) for p in sys.path if isinstance(p, str)}
    for d in site_dirs():
        if d in _pth_scanned or d not in on_path:
            continue
        _pth_scanned.add(d)
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(".pth"))
        except OSError:
            continue
        for name in names:
            path = os.path.join(d, name)
            if os.path.isfile(path):
                _record_pth(st, path, "snapshot")


def install() -> None:
    """Wrap ``site.addpackage``, which executes a ``.pth`` file's import lines, so that each
    processed after the probe started is hashed first (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    site = sys.modules.get("site")
    orig = getattr(site, "addpackage", None)
    if orig is None or getattr(orig, "__verifier_probe__", False):
        return

    def addpackage(sitedir: Any, name: Any, known_paths: Any) -> Any:
        try:
            d = os.path.abspath(os.fspath(sitedir))
            if d not in _site_dirs:
                _site_dirs.append(d)
            _record_pth(_core.state(), os.path.join(d, os.fspath(name)), "load")
        except Exception as e:  # noqa: BLE001 - a probe never raises into site
            _core.report_error("pth", f"{name!r}: {type(e).__name__}: {e}")
        return orig(sitedir, name, known_paths)

    addpackage.__verifier_probe__ = True  # type: ignore[attr-defined]
    site.addpackage = addpackage  # type: ignore[union-attr]
