"""Device-side hook counters: a count that advances on every replay of a captured graph.

Under CUDA graphs, Python code inside the captured region runs once, at capture; the kernels
it launched are what replays. A device counter is a one-element int64 tensor on the model's
device that the hooked code increments with a tensor op (``counter.add_(1)``): captured
once, that op runs on every replay, so the count keeps pace with the replays the Python fire
count cannot see.

Two ways to get one: ``name=module:Qual.method@device`` in ``VERIFIER_HOOKS`` (the wrapper
does the ``add_`` on the device of the call's first tensor argument, or of the module's
parameters), or ``hook.device_counter(name, like)`` (the caller does the ``add_``).

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

from verifier.probe import _core
from verifier.probe import _layout as L

_counters: dict[int, Any] = {}  # hook slot base -> counter tensor
_pending: dict[int, tuple[Any, Any]] = {}  # CUDA: base -> (pinned host copy, event)


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


def _read_all(cpu_only: bool) -> None:
    c = _core.COUNTERS
    for base, t in list(_counters.items()):
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
