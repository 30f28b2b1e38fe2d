"""Modules executed by a loader whose bytes the probe does not see: custom loaders.

The probe hashes what the file loaders it wraps read (``_imports``), what zipimport reads
(``_zips``), and builtin, frozen and namespace modules run no bytes of a file (or those of the
standard library's, hashed after the fact). A module whose spec names any other loader ran
code that no file record names: a meta-path finder serving source from a string, a loader
that rewrites the source it read, one that returns another module. Each such module becomes
an ``unfiled`` journal record::

    {"k": "unfiled", "how": "loader", "module": NAME, "loader": "pkg.mod.Class",
     "loader_file": PATH|null, "file": PATH|null, "source_sha256": HEX|null,
     "source_size": int|null, "at": "load"|"snapshot"|"late"}

``loader_file`` is the file that defines the loader's class (where its own methods were
compiled from), so the agent can judge it against its distribution's RECORD. Where methods on
the code path are set on the loader instance, it is the file the first of them was compiled
from, and ``also`` (present only then) lists the file of every other piece of code those
methods carry: the others, each callable a ``functools.partial`` binds (virtualenv's
``partial(_Finder.exec_module, old)``: ``old``, the loader's own method, is the loader's and
not listed), each as ``null`` when no file holds its code (a C callable, an object that is
not plain data); ``source_sha256`` is the sha256 of what the loader's ``get_source``
returns, when it has one (the probe's word only: no file holds it).

A subclass of a wrapped file loader or of zipimport's that overrides none of the methods on
the code path leaves the reading to its base: not custom. Modules are seen two ways: the
import system's ``_load_unlocked`` is wrapped (a module global of ``importlib._bootstrap``)
so that a module imported through a custom loader is recorded even if it leaves
``sys.modules`` at once, and the sweeper looks at every module in ``sys.modules`` (a loader
run by hand, ``loader.exec_module(module)``, passes no import statement).

A module with no spec at all was made by hand (``types.ModuleType``) or in C (torch's
``torch._C._jit``: hundreds in a vLLM process, all of them C functions). One whose own
functions (or its classes' methods) were compiled from no file (``co_filename`` like
``<string>``), or from another file than its ``__file__`` says, had source executed into it:
an ``unfiled`` record with ``how: "exec"`` and the filename its code claims. Code compiled
from a file, in a module without ``__file__``, has that file hashed as the module's (torch
inductor's generated modules set ``__file__`` to the file they compiled: hashed as such).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import types
import zipimport
from importlib.machinery import (
    BuiltinImporter,
    ExtensionFileLoader,
    FrozenImporter,
    NamespaceLoader,
    SourceFileLoader,
    SourcelessFileLoader,
)
from typing import Any

from servewitness_probe import _core, _files, _integrity, _postimport

# Loaders whose bytes the probe records, or that run no bytes of a file.
_READERS: tuple[type, ...] = (
    SourceFileLoader,
    SourcelessFileLoader,
    ExtensionFileLoader,
    zipimport.zipimporter,
)
_NO_FILE: tuple[Any, ...] = (BuiltinImporter, FrozenImporter, NamespaceLoader)
# Readers whose every import reads its bytes through the wrapped ``get_data``.
_FILE_READERS = frozenset({SourceFileLoader, SourcelessFileLoader})
# The methods that make or run a module's code (get_data: the one the probe wraps).
_CODE_PATH = (
    "exec_module",
    "load_module",
    "get_code",
    "source_to_code",
    "create_module",
    "get_data",
)

# What a subclass of a reader may not override and stay a reader: the code path, and the
# lookups that can hand back any function for a code-path method's name.
_OVERRIDES = (*_CODE_PATH, "__getattribute__", "__getattr__")

_custom_types: dict[type, bool] = {}
_pending: list[tuple[str, Any, Any]] = []  # (name, module, spec) seen by _load_unlocked
_done: set[str] = set()
_installed = False


def _custom_type(t: type) -> bool:
    if t in _NO_FILE or t in _READERS:
        return False
    base = next((b for b in _READERS if issubclass(t, b)), None)
    if base is None:
        return True
    below = t.__mro__[: t.__mro__.index(base)]
    return any(m in vars(k) for k in below for m in _OVERRIDES)


def is_custom(loader: Any) -> bool:
    """Whether LOADER runs code the probe does not see the bytes of (never raises; a few
    tenths of a microsecond: it runs on every import)."""
    if loader is None:
        return False  # no loader: nothing executed by one
    if isinstance(loader, type):  # a class as its own loader: builtin, frozen, or another's
        return loader not in _NO_FILE
    t = type(loader)
    custom = _custom_types.get(t)
    if custom is None:
        try:
            custom = _custom_type(t)
        except Exception:  # noqa: BLE001 - a hostile class: custom
            custom = True
        _custom_types[t] = custom
    if custom:
        return True
    # A reader's own instance with a method on the code path set on it (``loader.get_data =
    # ...``) runs that instead of its class's, as an overriding subclass would: custom too,
    # unless it is the probe's own post-import wrapper (``_postimport``).
    return _instance_override(loader) is not None


def _instance_override(loader: Any) -> Any:
    """The first function set on LOADER itself for a method on the code path (not the
    probe's own post-import wrapper), or None (on every import: no list is built)."""
    own = getattr(loader, "__dict__", None)
    if not isinstance(own, dict):
        return None
    for m in _CODE_PATH:
        fn = own.get(m)
        if fn is not None and fn not in _postimport.WRAPPERS:
            return fn
    return None


def _instance_overrides(loader: Any) -> list[Any]:
    """Every function set on LOADER itself for a method on the code path (not the probe's own
    post-import wrapper)."""
    own = getattr(loader, "__dict__", None)
    if not isinstance(own, dict):
        return []
    out = []
    for m in _CODE_PATH:
        fn = own.get(m)
        if fn is not None and fn not in _postimport.WRAPPERS:
            out.append(fn)
    return out


# Values a partial may bind that run no code of their own.
_PLAIN: tuple[type, ...] = (str, bytes, int, float, bool, type(None))
_MAX_CARRIED = 16  # pieces of code followed per loader: more are one unknown


def _own_method(value: Any, loader: Any) -> bool:
    """Whether VALUE is a method of LOADER's own class bound to LOADER (virtualenv's ``old``:
    what the loader would have run anyway, judged with its class)."""
    try:
        fn = getattr(value, "__func__", None)
        name = getattr(fn, "__name__", None)
        return (
            getattr(value, "__self__", None) is loader
            and isinstance(name, str)
            and getattr(type(loader), name, None) is fn
        )
    except Exception:  # noqa: BLE001 - a hostile object: not the loader's
        return False


def _carried(overrides: list[Any], loader: Any) -> list[Any]:
    """The code objects (None: no Python code found) of what OVERRIDES run: each override,
    and each value it carries (``_code_of``) that is not plain data, the loader or one of its
    own methods (followed in turn; never raises)."""
    todo = list(overrides)
    codes: list[Any] = []
    while todo and len(codes) < _MAX_CARRIED:
        _, code, carried = _code_of(todo.pop(0))
        codes.append(code)
        for value in carried:
            if isinstance(value, _PLAIN) or value is loader or _own_method(value, loader):
                continue
            todo.append(value)
    if todo:
        codes.append(None)  # more than followed: unknown
    return codes


def _code_of(fn: Any) -> tuple[str, Any, list[Any]]:
    """What FN, a callable set on a loader, runs: its name as shown, the code object of
    the Python function it comes down to (None where none is found, or where the function is
    not what its code's file defines: its ``__globals__`` no module's namespace), and the
    values it carries, each of which it may call: what a ``functools.partial`` binds
    (virtualenv's ``_virtualenv.py`` sets ``partial(_Finder.exec_module, old)`` on the
    loaders of ``distutils.dist`` and ``setuptools.dist``; a partial *subclass* is a callable
    object), a bound method's ``__self__``, and the callables in a function's closure cells,
    defaults and keyword defaults. A callable object is its class's ``__call__``; a class,
    its first own method's code (never raises)."""
    shown: list[str] = []
    carried: list[Any] = []
    try:
        for _ in range(8):  # a chain of partials of partials: bounded
            if type(fn) is functools.partial:
                shown.append("partial")
                carried += [*fn.args, *fn.keywords.values()]
                fn = fn.func
                continue
            if isinstance(fn, types.MethodType):
                carried.append(fn.__self__)
                fn = fn.__func__
                continue
            if isinstance(fn, staticmethod | classmethod):
                fn = fn.__func__
                continue
            break
        code: Any = None
        name = getattr(fn, "__qualname__", None)
        if not isinstance(fn, types.FunctionType | type):  # an object: its class's __call__
            owner = next((k for k in type(fn).__mro__ if "__call__" in vars(k)), None)
            call = vars(owner).get("__call__") if owner is not None else None
            name = f"{getattr(type(fn), '__qualname__', '?')}.__call__"
            carried += _callables(getattr(fn, "__dict__", {}).values())  # what self holds
            fn = call  # a C __call__ (no Python code): unknown
        if isinstance(fn, types.FunctionType):
            if _own_namespace(fn.__globals__):
                code = fn.__code__
            filled = _integrity.filled
            carried += _callables(c.cell_contents for c in fn.__closure__ or () if filled(c))
            carried += _callables([*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()])
        elif isinstance(fn, type):
            code = next(
                (
                    f.__code__
                    for f in (getattr(v, "__func__", v) for v in vars(fn).values())
                    if isinstance(f, types.FunctionType)
                ),
                None,
            )
    except Exception:  # noqa: BLE001 - a hostile object: nothing found
        return "?", None, [object()]  # what it carries is unknown too
    return _label(name, shown), code if isinstance(code, types.CodeType) else None, carried


def _label(name: object, shown: list[str]) -> str:
    label = name if isinstance(name, str) else "?"
    for wrapper in shown:
        label = f"{wrapper}({label})"
    return label


def _own_namespace(g: Any) -> bool:
    """Whether G, a function's globals, is the namespace of the module its ``__name__``
    names (a function made from another's code with other globals is not that code's)."""
    try:
        mod = sys.modules.get(g.get("__name__"))
        return mod is not None and vars(mod) is g
    except Exception:  # noqa: BLE001 - odd objects: not a module's
        return False


def _callables(values: Any) -> list[Any]:
    """The callables among VALUES and in the lists, tuples and dicts among them (one level):
    what a function may call through its closure or defaults."""
    out: list[Any] = []
    for v in values:
        items = v.values() if isinstance(v, dict) else v if isinstance(v, list | tuple) else (v,)
        out += [x for x in items if callable(x) and not isinstance(x, types.ModuleType)]
    return out


def _defining_file(cls: type) -> str | None:
    """The file that defines the loader class CLS: where the first of its own methods was
    compiled from, else its module's file (a class that only inherits, ``class L(Base):
    pass``, is defined where that statement is, not where its base is)."""
    for value in list(vars(cls).values()):
        code = getattr(getattr(value, "__func__", value), "__code__", None)
        filename = getattr(code, "co_filename", None)
        if isinstance(filename, str):
            return filename
    mod = sys.modules.get(getattr(cls, "__module__", None) or "")
    file = getattr(mod, "__file__", None)
    return file if isinstance(file, str) else None


def _source(loader: Any, name: str) -> tuple[str, int] | None:
    """(sha256, size) of what LOADER's get_source gives for NAME (None: it gives nothing)."""
    get_source = getattr(loader, "get_source", None)
    if get_source is None:
        return None
    try:
        src = get_source(name)
    except Exception:  # noqa: BLE001 - any loader's failure: no source
        return None
    if isinstance(src, str):
        data = src.encode("utf-8", "surrogatepass")
    elif isinstance(src, bytes):
        data = src
    else:
        return None
    return hashlib.sha256(data).hexdigest(), len(data)


def record(st: Any, name: str, module: Any, spec: Any, at: str, *, custom: bool = False) -> None:
    """Journal module NAME (MODULE, SPEC) if a custom loader executed it (once per name);
    CUSTOM: it was seen custom as it was imported (whatever its loader looks like now)."""
    if name in _done:
        return
    loader = getattr(spec, "loader", None)
    if not (custom or is_custom(loader)):
        return
    _done.add(name)
    cls = loader if isinstance(loader, type) else type(loader)
    try:
        file = vars(module).get("__file__")
    except TypeError:
        file = None
    src = _source(loader, name)
    what = f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', '?')}"
    defined_in = _defining_file(cls)
    overrides = [] if isinstance(loader, type) else _instance_overrides(loader)
    extra: dict[str, Any] = {}
    if overrides:  # judged by where what they run was compiled, not by the class
        what = f"{what} with {_code_of(overrides[0])[0]} set on the instance"
        files = [_filename(c) for c in _carried(overrides, loader)]
        defined_in = files[0]
        extra["also"] = files[1:]
    st.remember(
        {
            "k": "unfiled",
            "how": "loader",
            "module": name,
            "loader": what,
            "loader_file": defined_in if isinstance(defined_in, str) else None,
            "file": file if isinstance(file, str) else None,
            "source_sha256": src[0] if src else None,
            "source_size": src[1] if src else None,
            "at": at,
            **extra,
        }
    )


def _filename(code: Any) -> str | None:
    name = getattr(code, "co_filename", None)
    return name if isinstance(name, str) else None


def _code_filename(name: str, module: types.ModuleType) -> str | None:
    """The filename the first function defined in MODULE (or in a class of it) was compiled
    from (None: it defines none in Python)."""
    try:
        for value in list(vars(module).values()):
            if getattr(value, "__module__", None) != name:
                continue
            candidates = list(vars(value).values()) if isinstance(value, type) else [value]
            for fn in candidates:
                if isinstance(fn, types.FunctionType):
                    return fn.__code__.co_filename
    except Exception:  # noqa: BLE001 - odd objects (proxies, lazy attributes): no answer
        return None
    return None


def record_exec(st: Any, name: str, module: Any, file: str | None, at: str) -> None:
    """Journal module NAME, which has no spec, if code compiled from no file was executed
    into it, or from another file than FILE (its ``__file__``, which the sweeper hashes) says
    (once per name). Without a ``__file__``, the file its code names is hashed as its own
    (what a module made from a file by hand, ``exec(compile(src, path, ...))``, ran)."""
    if name in _done or not isinstance(module, types.ModuleType):
        return
    filename = _code_filename(name, module)
    if filename is None or filename == file:
        return
    _done.add(name)
    if file is None and os.path.isabs(filename) and os.path.isfile(filename):
        st.remember(_files.file_record(filename, "source", name, at))
        return
    st.remember(
        {
            "k": "unfiled",
            "how": "exec",
            "module": name,
            "loader": None,
            "loader_file": None,
            "file": filename,
            "source_sha256": None,
            "source_size": None,
            "at": at,
        }
    )


def install() -> None:
    """Wrap the import system's ``_load_unlocked`` (idempotent; survives fork)."""
    global _installed
    if _installed:
        return
    _installed = True
    bootstrap = sys.modules.get("_frozen_importlib")
    orig = getattr(bootstrap, "_load_unlocked", None)
    if orig is None or getattr(orig, "__verifier_probe__", False):
        return

    def _load_unlocked(spec: Any) -> Any:
        try:
            # custom as it begins: a loader that makes itself look like a reader while it
            # runs (its own method deleted, its __class__ or the spec's loader swapped) was not
            custom = is_custom(spec.loader)
            if custom or type(spec.loader) not in _FILE_READERS:
                # a change that makes this import is in place as it begins (a file reader's
                # import is checked as its bytes leave ``get_data``: ``_imports``)
                _integrity.intact()
        except Exception as e:  # noqa: BLE001 - a probe never raises into an import
            _core.report_error("imports", f"integrity: {type(e).__name__}: {e}")
            custom = True
        module = orig(spec)
        try:
            if custom or is_custom(spec.loader):
                _pending.append((spec.name, module, spec))
        except Exception as e:  # noqa: BLE001 - a probe never raises into an import
            _core.report_error("loaders", f"{type(e).__name__}: {e}")
        return module

    _load_unlocked.__verifier_probe__ = True  # type: ignore[attr-defined]
    bootstrap._load_unlocked = _load_unlocked  # type: ignore[union-attr]


def sweep(st: Any) -> None:
    """Journal the modules custom loaders executed since the last sweep (import statements)."""
    while _pending:
        name, module, spec = _pending.pop(0)
        record(st, name, module, spec, "load", custom=True)
