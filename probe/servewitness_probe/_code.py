"""Which code object actually runs a step method or a declared hook target.

A plugin or script that replaces a function on a class after import (``Cls.method = f``,
``Cls.method.__code__ = g.__code__``, a wrapper, an attribute set on the live object) leaves
every file pristine. So for each *subject* (the live runner's and worker's step methods,
every declared hook target once it resolves) the probe journals the chain of what runs when
the attribute is called: from the attribute (on the live object first, where one is set
there, since it shadows its class's), through every ``__wrapped__``, ``__func__`` and
``func`` layer, the probe's own wrappers left out. Each layer with Python code is described
by its file, first line, qualified name and a digest of its code (``layout.code_digest``), so
the agent can compile that file from outside and say whether it is the file's own definition
(``servewitness.evidence.codecheck``).

Cost: the chain is described once when a subject is watched (a digest of each layer's code:
well under a millisecond for vLLM's ``execute_model``), then the sweeper (``_imports``, once
a second) walks each chain again comparing object identities only, and journals a new
``code`` record only when something in it changed. Nothing here runs on a step.

The probe's wrappers are known by identity (``own``), not by an attribute: an attribute such
as ``__verifier_probe__`` is copied by ``functools.wraps`` onto a wrapper put around the
probe's, and anyone can set it on a function of their own.
"""

from __future__ import annotations

import functools
import sys
import weakref
from dataclasses import dataclass, field
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType
from typing import Any

from servewitness_probe import _core
from servewitness_probe import layout as L

MAX_LAYERS = 16  # deeper chains are cut (and say so)

# The probe's own wrappers (by identity), each with its code, what it calls, and what its
# closure held when it was made (``_pinned``).
_own: dict[int, tuple[Any, Any, Any, tuple[tuple[int, Any], ...]]] = {}


def own(wrapper: Any, wrapped: Any) -> None:
    """Note WRAPPER as one of the probe's, calling WRAPPED: left out of every chain as long
    as it still runs its own code (``__code__`` can be assigned) with what its closure held
    then (a cell can be assigned too: the function it calls, the hook slot it counts in)."""
    code = getattr(wrapper, "__code__", None)
    _own[id(wrapper)] = (wrapper, code, wrapped, _pinned(wrapper))


def _pinned(fn: Any) -> tuple[tuple[int, Any], ...]:
    """FN's closure cells that must keep what they hold, with it: every cell but an empty one
    (bound later: a wrapper's own name) and a flag (a bool the wrapper sets itself, ``nonlocal
    done``)."""
    out = []
    for i, cell in enumerate(getattr(fn, "__closure__", None) or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # empty: filled after the wrapper was made
            continue
        if not isinstance(value, bool):
            out.append((i, value))
    return tuple(out)


def _probe_wrapped(obj: Any) -> tuple[bool, Any]:
    """Whether OBJ is one of the probe's wrappers, untouched, and what it calls. One whose
    code or a pinned cell changed is not the probe's any more: it is a layer like any other
    (its code the probe's file's, not the subject's: ``provenance.code.patched``), and its
    cells say what it calls."""
    entry = _own.get(id(obj))
    if entry is None or entry[0] is not obj or getattr(obj, "__code__", None) is not entry[1]:
        return False, None
    cells = getattr(obj, "__closure__", None) or ()
    for i, value in entry[3]:
        try:
            if cells[i].cell_contents is not value:
                return False, None
        except (IndexError, ValueError):  # a cell emptied (del) or gone
            return False, None
    return True, entry[2]


@dataclass
class _Subject:
    name: str  # runner.execute_model, hook:NAME, ...
    owner: Any  # a class, a module, or another object holding the attribute
    attr: str
    instance: Any = None  # a weak reference to the live object, or the object itself
    seen: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # via -> identities


_subjects: dict[str, _Subject] = {}


def watch(name: str, owner: Any, attr: str, instance: Any = None) -> None:
    """Journal what runs for OWNER.ATTR (called on INSTANCE, when given) now, and again
    whenever it changes (``recheck``). Never raises."""
    try:
        ref: Any = None
        if instance is not None:
            try:
                ref = weakref.ref(instance)
            except TypeError:
                ref = instance
        sub = _Subject(name, owner, attr, ref)
        _subjects[name] = sub
        _check(sub)
    except Exception as e:  # noqa: BLE001 - a probe never raises into its host
        _core.report_error("code", f"{name}: {type(e).__name__}: {e}")


def recheck() -> None:
    """Journal each watched chain that changed since it was last journaled (the sweeper)."""
    for sub in list(_subjects.values()):
        try:
            _check(sub)
        except Exception as e:  # noqa: BLE001 - the sweeper must keep going
            _core.report_error("code", f"{sub.name}: {type(e).__name__}: {e}")


def _live(sub: _Subject) -> Any:
    ref = sub.instance
    if isinstance(ref, weakref.ref):
        return ref()
    return ref


def _check(sub: _Subject) -> None:
    owner_cls, raw = _owner_and_raw(sub.owner, sub.attr)
    _journal_if_changed(sub, "class", owner_cls, raw, present=raw is not None)
    obj = _live(sub)
    if obj is None and not isinstance(sub.owner, (type, ModuleType)):
        obj = sub.owner  # a hook target on an object: its own attribute
    if obj is not None:
        try:
            inst = vars(obj).get(sub.attr)
        except TypeError:  # no __dict__
            inst = None
        if inst is not None or "instance" in sub.seen:
            _journal_if_changed(sub, "instance", owner_cls, inst, present=inst is not None)


def _same(old: tuple[Any, ...] | None, new: tuple[Any, ...]) -> bool:
    return (
        old is not None
        and len(old) == len(new)
        and all(a is b for a, b in zip(old, new, strict=True))
    )


def _journal_if_changed(sub: _Subject, via: str, owner: Any, raw: Any, *, present: bool) -> None:
    """Journal the chain from RAW unless the objects in it (each layer, its code and its
    globals, by identity) are the ones last journaled: the cheap walk goes first."""
    if _same(sub.seen.get(via), _identities(_walk(raw, describe=False) if present else [])):
        return
    layers = _walk(raw, describe=True) if present else []
    sub.seen[via] = _identities(layers)
    probe_layers = sum(1 for _, rec in layers if rec is None)
    rec = {
        "k": "code",
        "subject": sub.name,
        "via": via,
        "attr": sub.attr,
        **_owner_record(owner),
        "probe_layers": probe_layers,
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "optimize": sys.flags.optimize,
        "layers": [r for _, r in layers if r is not None],
    }
    if not present:
        rec["absent"] = True
    _core.state().remember(rec)


def _owner_and_raw(owner: Any, attr: str) -> tuple[Any, Any]:
    """The class (or module) whose definition of ATTR is the one OWNER uses, and the raw
    attribute there (unbound: ``vars``, not ``getattr``). A probe wrapper that a subclass got
    from the probe (it wraps what the class inherits) stands for the class it came from."""
    if isinstance(owner, ModuleType):
        return owner, vars(owner).get(attr)
    cls = owner if isinstance(owner, type) else type(owner)
    mro = cls.__mro__
    for i, k in enumerate(mro):
        if attr not in k.__dict__:
            continue
        raw = k.__dict__[attr]
        inner, probe = _unbind(raw), 0
        while probe < MAX_LAYERS:
            ours, wrapped = _probe_wrapped(inner)
            if not ours:
                break
            inner, probe = wrapped, probe + 1
        if probe:  # the probe's wrappers (of one or more of its parts) around ...
            for later in mro[i + 1 :]:  # ... what the class inherits: the owner is its class
                if attr in later.__dict__ and _unbind(later.__dict__[attr]) is inner:
                    return later, raw
        return k, raw
    return cls, None


def _unbind(raw: Any) -> Any:
    return raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw


def _owner_record(owner: Any) -> dict[str, Any]:
    if isinstance(owner, ModuleType):
        module: Any = owner.__name__
        qualname: Any = ""
        mod: Any = owner
    else:
        module = getattr(owner, "__module__", None)
        qualname = getattr(owner, "__qualname__", None)
        mod = sys.modules.get(module) if isinstance(module, str) else None
    return {
        "owner_module": _str(module),
        "owner_qualname": _str(qualname),
        "owner_file": _str(getattr(mod, "__file__", None)),
    }


Layers = list[tuple[tuple[Any, ...], dict[str, Any] | None]]


def _identities(layers: Layers) -> tuple[Any, ...]:
    return tuple(x for objs, _ in layers for x in objs)


def _walk(raw: Any, *, describe: bool) -> Layers:
    """The layers of RAW, outermost first: (the objects whose identity stands for the layer,
    its record; None for one of the probe's wrappers). DESCRIBE: with each layer's code
    described (its digest computed); without, only what identifies the objects."""
    out: Layers = []
    obj, via, held = raw, "attribute", None
    seen: set[int] = set()
    while obj is not None and len(out) < MAX_LAYERS and id(obj) not in seen:
        seen.add(id(obj))
        ours, wrapped = _probe_wrapped(obj)
        if ours:
            out.append(((obj, obj.__code__), None))
            if via == "attribute":  # else: the link into the probe's wrapper is the one to tell
                via, held = "probe", True  # called by the probe's wrapper
            obj = wrapped
            continue
        rec, nxt, nvia, nheld = _layer(obj, describe)
        rec["via"], rec["held"] = via, held
        code = rec.pop("_code", None)
        glob = rec.pop("_globals", None)
        out.append(((obj, code, glob), rec))
        obj, via, held = nxt, nvia, nheld
    if obj is not None and len(out) >= MAX_LAYERS:
        out.append(((), {"kind": "other", "via": via, "held": held, "cut": True}))
    return out


def _layer(obj: Any, describe: bool) -> tuple[dict[str, Any], Any, str, bool | None]:
    """One layer's record, the next layer, how it was reached and whether OBJ holds it."""
    rec: dict[str, Any] = {
        "module": _str(getattr(obj, "__module__", None)),
        "qualname": _str(getattr(obj, "__qualname__", None)),
    }
    if isinstance(obj, (staticmethod, classmethod)):
        rec["kind"] = type(obj).__name__
        return rec, obj.__func__, "__func__", True
    if isinstance(obj, MethodType):
        rec["kind"] = "method"
        return rec, obj.__func__, "__func__", True
    if isinstance(obj, functools.partial):
        rec["kind"] = "partial"
        return rec, obj.func, "func", True
    if isinstance(obj, FunctionType):
        rec["kind"] = "function"
        _describe(rec, obj, describe)
        return (rec, *_wrapped(obj, _closure(obj)))
    if isinstance(obj, BuiltinFunctionType) or not callable(obj):
        rec["kind"] = "builtin" if callable(obj) else "other"
        return (rec, *_wrapped(obj, ()))
    call = next(
        (k.__dict__["__call__"] for k in type(obj).__mro__ if "__call__" in k.__dict__), None
    )
    rec["kind"] = "object"
    rec["qualname"] = _str(getattr(type(obj), "__qualname__", None))
    rec["module"] = _str(getattr(type(obj), "__module__", None))
    if isinstance(call, FunctionType):
        _describe(rec, call, describe)
    try:
        holds = tuple(vars(obj).values())
    except TypeError:
        holds = ()
    return (rec, *_wrapped(obj, holds))


def _describe(rec: dict[str, Any], fn: FunctionType, describe: bool) -> None:
    code = fn.__code__
    glob = fn.__globals__
    rec["_code"], rec["_globals"] = code, glob
    if not describe:
        return
    rec["code_qualname"] = getattr(code, "co_qualname", code.co_name)
    rec["name"] = code.co_name
    rec["file"] = code.co_filename
    rec["line"] = code.co_firstlineno
    rec["sha256"] = _digest(code)
    rec["globals_file"] = _str(glob.get("__file__"))


_digests: dict[int, tuple[Any, str]] = {}  # id(code) -> (code, its digest)


def _digest(code: Any) -> str:
    """``layout.code_digest``, once per code object (kept alive here, so its id stays its)."""
    hit = _digests.get(id(code))
    if hit is not None and hit[0] is code:
        return hit[1]
    digest = L.code_digest(code)
    _digests[id(code)] = (code, digest)
    return digest


def _closure(fn: FunctionType) -> tuple[Any, ...]:
    out = []
    for cell in fn.__closure__ or ():
        try:
            out.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    return tuple(out)


def _wrapped(obj: Any, holds: tuple[Any, ...]) -> tuple[Any, str, bool | None]:
    """What OBJ says it wraps (``__wrapped__``), and whether HOLDS has it (a wrapper calls
    what its closure holds, not what its ``__wrapped__`` says)."""
    try:
        inner = getattr(obj, "__wrapped__", None)
    except Exception:  # noqa: BLE001 - an object's own __getattr__ may raise anything
        inner = None
    if inner is None:
        return None, "", None
    return inner, "__wrapped__", any(h is inner for h in holds)


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None
