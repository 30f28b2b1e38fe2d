"""Device-side hook counters: a count that advances on every replay of a captured graph.

Under CUDA graphs, Python code inside the captured region runs once, at capture; the kernels
it launched are what replays. A device counter is a one-element int64 tensor on the model's
device that the hooked code increments with a tensor op (``counter.add_(1)``): captured
once, that op runs on every replay, so the count keeps pace with the replays the Python fire
count cannot see.

Two ways to get one: ``name=module:Qual.method@device`` in ``VERIFIER_HOOKS`` (the wrapper
does the ``add_`` on the device of the call's first tensor argument, or of the module's
parameters), or ``hook.device_counter(name, like)`` (the caller does the ``add_``).

Under torch.compile (vLLM compiles the model before it captures graphs), the wrapper's Python
does not run on compiled calls: Dynamo traces it once. So that the increment is part of what
was traced, the wrapper calls the custom op ``verifier_probe::tick`` there (``traced_tick``).
Dynamo, AOTAutograd and Inductor keep it as an opaque call registered as side-effecting (it
has no outputs: without that it would be dead code); at run time it does the ``add_`` on the
hook's counter, so it counts every compiled call and, launched during a capture, becomes a
kernel of the graph that every replay runs again.

The probe reads the counters outside the step (after ``execute_model`` returns; the sweeper
reads CPU counters of processes that run no steps): a CPU counter directly; a CUDA counter
through a non-blocking copy into pinned host memory whose completion is checked with an
event on the next read, so no read ever waits for the device. A counter must be created
before graph capture (the first call is normally in warm-up or profiling, eager); one
created while a capture is in progress is reported as a probe error.

torch is never imported here: it is taken from ``sys.modules`` (a process with device code
has it loaded already).
"""

from __future__ import annotations

import sys
from typing import Any

from servewitness_probe import _core
from servewitness_probe import layout as L

_counters: dict[int, Any] = {}  # hook slot base -> counter tensor
_pending: dict[int, tuple[Any, Any]] = {}  # CUDA: base -> (pinned host copy, event)
_names: dict[int, str] = {}  # hook slot base -> hook name, for the op's errors
_op: list[Any] = []  # the registered ``verifier_probe::tick`` (empty: not registered)
_based: set[int] = set()  # hook slot bases whose base value has been recorded
OP_NAMESPACE = "verifier_probe"


def _torch() -> Any:
    return sys.modules.get("torch")


def device_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The device of the first tensor argument, else of the first module's parameters."""
    torch = _torch()
    if torch is None:
        return None
    values = [*args, *kwargs.values()]
    for v in values:
        if isinstance(v, torch.Tensor):
            return v.device
    for v in values:
        if isinstance(v, torch.nn.Module):
            for p in v.parameters():
                return p.device
    return None


def create(base: int, name: str, device: Any) -> Any:
    """The counter of hook slot BASE, created on DEVICE at first use."""
    t = _counters.get(base)
    if t is not None:
        return t
    _names.setdefault(base, name)
    torch = _torch()
    if torch is None or device is None:
        return None
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available() and cuda.is_current_stream_capturing():
        _core.report_error(
            "device_counter",
            f"{name!r}: first used during graph capture; its replays may reset it",
        )
    t = torch.zeros(1, dtype=torch.int64, device=device)
    _counters[base] = t
    _core.state().remember({"k": "device_counter", "name": name, "device": str(device)})
    return t


def tick(base: int, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """One device-side increment (a captured op when called during capture)."""
    t = _counters.get(base)
    if t is None:
        t = create(base, name, device_of(args, kwargs))
        if t is None:
            return
    t.add_(1)


def anchor_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The first tensor argument (the op's device), else the first module's first parameter.
    Plain Python over the arguments, so that Dynamo can trace it."""
    torch = _torch()
    values = [*args, *kwargs.values()]
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
    for v in values:
        if isinstance(v, torch.nn.Module):
            for p in v.parameters():
                return p
    return None


def register_op(base: int, name: str) -> bool:
    """Register ``verifier_probe::tick`` once (torch must be loaded); remember NAME for BASE.
    False when it cannot be registered (no torch, or a torch without ``torch.library``)."""
    _names[base] = name
    if _op:
        return True
    torch = _torch()
    library: Any = getattr(torch, "library", None)
    if torch is None or not hasattr(library, "custom_op"):
        return False
    from torch.fx.node import has_side_effect  # torch is loaded already

    def _tick(anchor: Any, base: int) -> None:
        try:
            t = _counters.get(base)
            if t is None:
                t = create(base, _names.get(base, str(base)), anchor.device)
                if t is None:
                    return
            t.add_(1)
        except Exception as e:  # noqa: BLE001 - a probe never raises into the hooked code
            _core.report_error("device_counter", f"{_names.get(base)!r}: {type(e).__name__}: {e}")

    # Annotations as objects, not strings: torch.library reads them to infer the schema.
    _tick.__annotations__ = {"anchor": torch.Tensor, "base": int, "return": None}
    op = library.custom_op(f"{OP_NAMESPACE}::tick", _tick, mutates_args=())
    op.register_fake(_fake_tick)
    has_side_effect(torch.ops.verifier_probe.tick.default)
    _op.append(torch.ops.verifier_probe.tick)
    return True


def _fake_tick(anchor: Any, base: int) -> None:
    """Tracing (fake tensors): nothing to compute; the op has no outputs."""


def traced_tick(base: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The increment as Dynamo traces it: one call of the registered op on the call's anchor
    tensor. Nothing when the op is not registered or the call has no tensor."""
    if not _op:
        return
    anchor = anchor_of(args, kwargs)
    if anchor is not None:
        _op[0](anchor, base)


def read_all(cpu_only: bool = False) -> None:
    """Copy every counter's value into its hook's HK_DEVICE slot, never waiting on a device.
    Always under inference mode: counters made inside a model's forward are inference tensors
    (vLLM runs it under ``torch.inference_mode``), and so is every host copy made from a read
    inside it; an in-place copy into one outside inference mode is refused (seen on the H200)."""
    torch = _torch()
    mode = getattr(torch, "inference_mode", None)
    if mode is None:
        _read_all(cpu_only)
        return
    with mode():
        _read_all(cpu_only)


def _read_base(base: int, t: Any, productive: int) -> None:
    """Record, once, the counter's value right after the process's first productive step:
    everything before it (warm-up, profiling, graph capture, which also run the hooked code)
    is not a measured step. The one read that waits for the device (a synchronous copy)."""
    _based.add(base)  # first: a failing read is reported once, never retried on every step
    value = int(t[0]) if t.device.type == "cpu" else int(t.to("cpu")[0])
    _core.state().emit(
        {"k": "device_base", "name": _names.get(base, ""), "value": value, "step": productive}
    )


def _read_all(cpu_only: bool) -> None:
    c = _core.COUNTERS
    productive = c[L.S_STEPS_PRODUCTIVE]
    for base, t in _counters.copy().items():  # one C call: no finalizer runs in between
        if productive and base not in _based and not (cpu_only and t.device.type != "cpu"):
            _read_base(base, t, productive)
        if t.device.type == "cpu":
            c[base + L.HK_DEVICE] = int(t[0])
            continue
        if cpu_only:
            continue
        pending = _pending.get(base)
        if pending is not None:
            host, event = pending
            if not event.query():
                continue  # the last copy has not landed yet: read it next time
            c[base + L.HK_DEVICE] = int(host[0])
        torch = _torch()
        host = pending[0] if pending else torch.empty(1, dtype=torch.int64, pin_memory=True)
        host.copy_(t, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        _pending[base] = (host, event)
