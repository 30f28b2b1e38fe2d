"""Hooks: named did-it-fire counters.

Two ways to get one:

* the public API, for code patched into vLLM or a user's module::

      from servewitness_probe import hook
      hook.fire("my_hook")          # count one fire

      @hook("my_step")              # count every call
      def step(...): ...

* a declaration by target, without editing code::

      VERIFIER_HOOKS="name=module:qualname,other=module"

  ``module:qualname`` wraps the target when (and only if) the module is imported; a class
  method is wrapped on the class, and the class's ``__init__`` records the first instance.
  ``name=module`` only tracks whether the module is imported; the code in it fires the hook
  through the API. ``name=module:qualname@device`` also counts on the device, so that the
  count advances on every replay of a captured CUDA graph (``_device``);
  ``name=module:qualname@first`` fires once, on the first call, and then costs nothing
  (``_firsthit``); one mode suffix at most. Malformed entries are reported by the probe
  (journal ``error`` records), never raised: vLLM start-up must not depend on a typo.

A hook name is declared once per process, on one thing (``_claim``): a function or method
(``VERIFIER_HOOKS`` ``module:qualname``, or ``@hook`` on one function), a module, or the API
alone (the first ``hook.fire``). A second declaration of the name on anything else, in either
order, is refused and said as a probe error (judged: no PASS rests on the hook); it gets no
counter and changes nothing of the first. A hook declared on a function or method counts
only its wrapper's calls: ``hook.fire`` and ``hook.device_counter`` refuse it.

One fire is a few memoryview operations on the shared counters: fires, the process's step
count at the first and at the latest fire.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from servewitness_probe import _code, _core, _device, _firsthit, _postimport
from servewitness_probe import layout as L

F = TypeVar("F", bound=Callable[..., Any])

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_CO_COROUTINE = 0x80

MODES = ("device", "first")  # a VERIFIER_HOOKS target's "@mode" suffixes

_bases: dict[str, int] = {}
_env_applied = False


@dataclass(frozen=True)
class _Claim:
    """What a hook name was declared on, the first time (the only one: see ``_claim``)."""

    target: str  # as journaled: "module:qualname[@mode]", "module", "" (fired by name)
    source: str  # as journaled: "env" (VERIFIER_HOOKS) or "api"
    how: str  # "env", "decorator" or "api" (hook.fire / hook.device_counter)
    wrapped: bool  # on a function or method: only its wrapper counts its fires
    # A decorator's: the function it decorated and the wrappers made of it (identity only:
    # the same function decorated again under the same name is the same declaration).
    fns: list[Any] = field(default_factory=list, compare=False)

    def describe(self) -> str:
        if self.how == "api":
            return "no target (fired by name through the API)"
        return f"{self.target} ({'VERIFIER_HOOKS' if self.how == 'env' else '@hook'})"


_claims: dict[str, _Claim] = {}
_api: dict[str, int] = {}  # hooks the API may fire (declared on a module, or by name): base
_claim_lock = threading.Lock()


def _new_lock() -> None:
    global _claim_lock
    _claim_lock = threading.Lock()  # a fork may have copied it held by a thread not copied


os.register_at_fork(after_in_child=_new_lock)


@dataclass(frozen=True)
class HookDecl:
    """One declared hook: NAME fires when MODULE:QUALNAME runs (or via the API in MODULE)."""

    name: str
    module: str
    qualname: str | None
    device: bool = False  # "@device": also count on the device (see _device)
    first: bool = False  # "@first": fire once, on the first call, then cost nothing

    @property
    def target(self) -> str:
        at = "@device" if self.device else "@first" if self.first else ""
        return (f"{self.module}:{self.qualname}" if self.qualname else self.module) + at


def parse_hooks(text: str) -> tuple[list[HookDecl], list[str]]:
    """Parse ``name=module:qualname,...`` into valid declarations and one message per bad entry."""
    decls: list[HookDecl] = []
    errors: list[str] = []
    seen: set[str] = set()
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        name, eq, target = entry.partition("=")
        name, target = name.strip(), target.strip()
        if not eq or not name or not target:
            errors.append(f"entry {entry!r}: expected name=module:qualname or name=module")
            continue
        if not _NAME.match(name):
            errors.append(f"entry {entry!r}: hook name may use letters, digits, '_', '.', '-'")
            continue
        target, *modes = target.split("@")
        if len(modes) > 1 or (modes and modes[0] not in MODES):
            errors.append(
                f"entry {entry!r}: one mode suffix at most, @device or @first"
                + (f", not {'@' + '@'.join(modes)!r}" if modes else "")
            )
            continue
        device, first = modes == ["device"], modes == ["first"]
        module, colon, qualname = target.strip().partition(":")
        if not _DOTTED.match(module) or (colon and not _DOTTED.match(qualname)):
            errors.append(
                f"entry {entry!r}: target must be a dotted module, optionally ':qualname'"
            )
            continue
        if (device or first) and not colon:
            errors.append(f"entry {entry!r}: @device and @first need a callable module:qualname")
            continue
        if name in seen:
            errors.append(f"entry {entry!r}: hook {name!r} declared twice; keeping the first")
            continue
        seen.add(name)
        decls.append(HookDecl(name, module, qualname if colon else None, device, first))
    return decls, errors


def _claim(name: str, new: _Claim, where: str) -> int | None:
    """The slot base of hook NAME declared as NEW: allocated (and journaled) by its first
    declaration; a later one gets it only when it is the same declaration (the API's again, or
    the same function decorated again). Any other is refused: a probe error under WHERE that
    names the hook (so a policy judging it cannot PASS), and None; the first declaration's
    counter, target and how stay as they were."""
    with _claim_lock:
        old = _claims.get(name)
        if old is None:
            base = _core.state().hook_index(name, new.target, new.source)
            _claims[name], _bases[name] = new, base
            if not new.wrapped:
                _api[name] = base
            return base
        if old == new and (old.how != "decorator" or any(f is new.fns[0] for f in old.fns)):
            return _bases[name]
    _core.state().error(
        where,
        f"{name!r} is declared already, on {old.describe()}: a second declaration, on "
        f"{new.describe()}, is refused and counts nothing",
    )
    return None


def declare(name: str, target: str = "", source: str = "api") -> int:
    """Slot base for hook NAME declared by name (TARGET "") or on a module, as the API's;
    ValueError when NAME is declared on something else already (a probe error too)."""
    base = _claim(name, _Claim(target, source, "api" if not target else source, False), "hooks")
    if base is None:
        raise ValueError(f"hook {name!r} is declared on something else")
    return base


def _api_base(name: str, where: str) -> int | None:
    """The slot base of hook NAME for the API (``hook.fire``, ``hook.device_counter``): a hook
    declared by name or on a module; None (a probe error under WHERE) for a hook declared on a
    function or method, which only its wrapper counts."""
    base = _api.get(name)
    if base is not None:
        return base
    old = _claims.get(name)
    if old is not None and old.wrapped:
        _core.report_error(
            where,
            f"{name!r} is declared on a function or method: only its wrapper counts its fires, "
            + ("this fire was not counted" if where == "hook.fire" else "no counter handed out"),
        )
        return None
    return _claim(name, _Claim("", "api", "api", False), where)


def _fire(
    base: int,
    _steps: int = L.S_STEPS_TOTAL,
    _phase: int = L.S_CURRENT_PHASE,
    _in_step: int = L.S_IN_STEP,
) -> None:
    """One fire (slot numbers bound as defaults: this runs on every call of a hooked function)."""
    c = _core.COUNTERS
    n = c[base] + 1
    c[base] = n
    s = c[_steps]
    c[base + L.HK_LAST_STEP] = s
    if n == 1:
        c[base + L.HK_FIRST_STEP] = s
    phase = c[_phase]
    if phase & L.PHASE_PRODUCTIVE:
        c[base + L.HK_FIRES_PRODUCTIVE] += 1
    if not c[_in_step]:
        c[base + L.HK_FIRES_OUTSIDE] += 1
        return
    if phase & L.PHASE_PREFILL:
        c[base + L.HK_FIRES_PREFILL] += 1
    if phase & L.PHASE_DECODE:
        c[base + L.HK_FIRES_DECODE] += 1


def _device_tick(base: int, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    try:
        _device.tick(base, name, args, kwargs)
    except Exception as e:  # noqa: BLE001 - a probe never raises into the hooked code
        _core.report_error("device_counter", f"{name!r}: {type(e).__name__}: {e}")


def _register_op(base: int, name: str) -> None:
    try:
        _device.register_op(base, name)
    except Exception as e:  # noqa: BLE001 - a probe never raises into the hooked code
        _core.report_error("device_counter", f"{name!r}: cannot register the op: {e}")


def _never() -> bool:
    return False


def _compiling_check() -> Callable[[], bool]:
    """``torch.compiler.is_compiling`` when torch is loaded, else a function that says no.
    Under torch.compile, Dynamo traces a hooked function's wrapper; it cannot trace the
    counters (a memoryview), and vLLM compiles with ``fullgraph=True``, where anything it
    cannot trace stops the engine from starting. Dynamo evaluates ``is_compiling()`` to True
    while tracing, so the fire is left out of the compiled graph: a compiled call is not
    counted (under CUDA graphs it never runs Python on replay anyway), an eager call is."""
    torch = sys.modules.get("torch")
    check = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return check if callable(check) else _never


def counting(fn: F, base: int, device: str | None = None) -> F:
    """FN wrapped so that each call fires the hook at BASE first (and, with DEVICE set to the
    hook's name, increments its device-side counter). Calls traced by torch.compile do not
    fire (see ``_compiling_check``); their device increment is traced into the compiled
    code as the ``verifier_probe::tick`` op, so compiled calls and graph replays count."""
    compiling = _compiling_check()
    code = getattr(fn, "__code__", None)
    if code is not None and code.co_flags & _CO_COROUTINE:

        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            _fire(base)
            return await fn(*args, **kwargs)

        wrapper: Callable[..., Any] = awrapper
    elif device is not None:
        _register_op(base, device)

        def dwrapper(*args: Any, **kwargs: Any) -> Any:
            if compiling():  # traced: the increment goes into the graph as an op
                _device.traced_tick(base, args, kwargs)
            else:
                _fire(base)
                _device_tick(base, device, args, kwargs)
            return fn(*args, **kwargs)

        wrapper = dwrapper
    else:

        def swrapper(*args: Any, **kwargs: Any) -> Any:
            if not compiling():
                _fire(base)
            return fn(*args, **kwargs)

        wrapper = swrapper
    functools.update_wrapper(wrapper, fn)
    wrapper.__verifier_probe__ = True  # type: ignore[attr-defined]
    _code.own(wrapper, fn)
    return wrapper  # type: ignore[return-value]


class HookAPI:
    """``hook.fire(name)`` and ``@hook(name)``."""

    def fire(self, name: str) -> None:
        """Count one fire of hook NAME. Never raises. A hook declared on a function or
        method (``VERIFIER_HOOKS`` ``name=module:qualname``, or ``@hook``) counts only when
        that target runs: firing it here is refused, and said as a probe error (which keeps
        a verdict judging it from PASS), so no other code can make a hook on a class that
        was never instantiated look live."""
        try:
            base = _api.get(name)
            if base is None:
                base = _api_base(name, "hook.fire")
                if base is None:
                    return
            _fire(base)
        except Exception as e:  # noqa: BLE001 - a probe never raises into its caller
            _core.report_error("hook.fire", f"{name!r}: {type(e).__name__}: {e}")

    def device_counter(self, name: str, like: Any) -> Any:
        """A one-element int64 tensor on LIKE's device (a tensor, a module, or a device) that
        counts for hook NAME: increment it with ``counter.add_(1)`` in code that a CUDA graph
        captures, and the count advances on every replay. None if torch is not loaded or
        LIKE names no device. Never raises. Refused for a hook declared on a function or
        method, as ``fire`` is (only its wrapper counts it; ``@device`` counts it on the
        device): a probe error, and None."""
        try:
            base = _api_base(name, "hook.device_counter")
            if base is None:
                return None
            device = like if type(like).__name__ == "device" else _device.device_of((like,), {})
            return _device.create(base, name, device)
        except Exception as e:  # noqa: BLE001 - a probe never raises into its caller
            _core.report_error("hook.device_counter", f"{name!r}: {type(e).__name__}: {e}")
            return None

    def __call__(self, name: str) -> Callable[[F], F]:
        """Decorator: every call of the function fires hook NAME. Refused (a probe error, the
        function returned as it is) when NAME is declared on anything else already: on
        another function or method, a module, or by ``hook.fire``."""

        def decorate(fn: F) -> F:
            try:
                old = _claims.get(name)
                if old is not None and old.how == "decorator" and any(w is fn for w in old.fns[1:]):
                    return fn  # already this hook's wrapper: counting it twice is not asked
                target = f"{fn.__module__}:{fn.__qualname__}"
                base = _claim(name, _Claim(target, "api", "decorator", True, [fn]), "hook.decorate")
                if base is None:
                    return fn
                wrapper = counting(fn, base)
                with _claim_lock:
                    _claims[name].fns.append(wrapper)
                st = _core.state()
                st.remember({"k": "hook_loaded", "name": name, "module": fn.__module__})
                st.remember(
                    {"k": "hook_wrapped", "name": name, "owner": target, "how": "decorator"}
                )
                return wrapper
            except Exception as e:  # noqa: BLE001 - never break the decorated module's import
                _core.report_error("hook.decorate", f"{name!r}: {type(e).__name__}: {e}")
                return fn

        return decorate


hook = HookAPI()


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _track_instances(owner: type, name: str) -> None:
    """Wrap OWNER.__init__ so the first instance (of it or a subclass) is journaled."""
    orig = next(k.__dict__["__init__"] for k in owner.__mro__ if "__init__" in k.__dict__)
    seen = False

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal seen
        if not seen:
            seen = True
            try:
                _core.state().remember(
                    {"k": "hook_instantiated", "name": name, "class": _qualified(type(self))}
                )
            except Exception:  # noqa: BLE001 - a probe never raises into a constructor
                pass
        if orig is object.__init__:
            orig(self)
        else:
            orig(self, *args, **kwargs)

    functools.update_wrapper(__init__, orig)
    _code.own(__init__, orig)
    owner.__init__ = __init__  # type: ignore[misc]


def _wrap_method(owner: type, attr: str, base: int, device: str | None = None) -> str:
    """Wrap OWNER.ATTR at class level, keeping static/class method descriptors; how it was
    declared there: "method" (an instance method: it runs on an instance), "staticmethod" or
    "classmethod" (no instance needed)."""
    raw = next((k.__dict__[attr] for k in owner.__mro__ if attr in k.__dict__), None)
    if raw is None:
        raise AttributeError(f"{owner.__qualname__} has no attribute {attr!r}")
    if isinstance(raw, staticmethod):
        wrapped: Any = staticmethod(counting(raw.__func__, base, device))
        how = "staticmethod"
    elif isinstance(raw, classmethod):
        wrapped = classmethod(counting(raw.__func__, base, device))
        how = "classmethod"
    elif callable(raw):
        wrapped = counting(raw, base, device)
        how = "method"
    else:
        raise TypeError(f"{owner.__qualname__}.{attr} is not callable")
    setattr(owner, attr, wrapped)
    return how


def _resolve_owner(decl: HookDecl, module: ModuleType) -> tuple[Any, str]:
    """The object holding the target attribute, and the attribute's name."""
    parts = (decl.qualname or "").split(".")
    owner: Any = module
    for part in parts[:-1]:
        if not hasattr(owner, part):
            raise AttributeError(f"{decl.module}: no attribute {part!r} on {owner!r}")
        owner = getattr(owner, part)
    attr = parts[-1]
    if not isinstance(owner, type) and not callable(getattr(owner, attr, None)):
        raise AttributeError(f"{decl.module}: no callable {attr!r} on {owner!r}")
    return owner, attr


def _apply(decl: HookDecl, base: int, module: ModuleType) -> None:
    st = _core.state()
    st.remember({"k": "hook_loaded", "name": decl.name, "module": decl.module})
    if decl.qualname is None:
        return
    try:
        owner, attr = _resolve_owner(decl, module)
        device = decl.name if decl.device else None
        if decl.first:
            how, where = "first_hit", _qualified(owner) if isinstance(owner, type) else decl.target
            st.remember(
                {
                    "k": "first_hit_armed",
                    "name": decl.name,
                    "via": _firsthit.install(owner, attr, _fire, base, decl.name),
                }
            )
            if isinstance(owner, type):
                _track_instances(owner, decl.name)
        elif isinstance(owner, type):
            how = _wrap_method(owner, attr, base, device)
            _track_instances(owner, decl.name)
            where = _qualified(owner)
        else:
            setattr(owner, attr, counting(getattr(owner, attr), base, device))
            how, where = "function", decl.target
    except (AttributeError, TypeError) as e:
        st.remember({"k": "hook_unresolved", "name": decl.name, "msg": str(e)})
        st.error("VERIFIER_HOOKS", f"hook {decl.name!r}: cannot wrap {decl.target}: {e}")
        return
    st.remember({"k": "hook_wrapped", "name": decl.name, "owner": where, "how": how})
    _code.watch(f"hook:{decl.name}", owner, attr)


def apply_env(text: str) -> None:
    """Declare the hooks of a VERIFIER_HOOKS value; watch for their modules (once per process)."""
    global _env_applied
    if _env_applied:
        return
    _env_applied = True
    decls, errors = parse_hooks(text)
    st = _core.state()
    for msg in errors:
        st.error("VERIFIER_HOOKS", msg)
    for decl in decls:
        claim = _Claim(decl.target, "env", "env", decl.qualname is not None)
        base = _claim(decl.name, claim, "hooks")
        if base is not None:
            _postimport.when_imported(decl.module, functools.partial(_apply, decl, base))
