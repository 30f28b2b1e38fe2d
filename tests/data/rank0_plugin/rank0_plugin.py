"""A vLLM general plugin for the tensor-parallel negative control: after every step of the
model runner, it fires hook ``rank0_only`` through the probe's API, on rank 0 only. Its
directory on PYTHONPATH registers it (the dist-info's entry point); declare the hook in every
process with ``VERIFIER_HOOKS=rank0_only=rank0_plugin`` so that rank 1 reports it loaded and
silent. A policy that requires it on every rank must FAIL naming rank 1.

The runner modules are patched when they are imported (a meta path finder), so that no
process imports them only because of this plugin."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

RUNNERS = {
    "vllm.v1.worker.gpu_model_runner": "GPUModelRunner",  # V1 (the CPU runner inherits it)
    "vllm.v1.worker.gpu.model_runner": "GPUModelRunner",  # V2
}


def _rank() -> int | None:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_initialized():
        return None
    return int(dist.get_rank())


def _patch(module: ModuleType) -> None:
    cls = getattr(module, RUNNERS[module.__name__], None)
    if cls is None or "_rank0_patched" in cls.__dict__:
        return
    cls._rank0_patched = True
    orig = cls.execute_model

    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, *args, **kwargs)
        if _rank() == 0:
            from servewitness_probe import hook

            hook.fire("rank0_only")
        return out

    cls.execute_model = execute_model


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in RUNNERS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


def register() -> None:
    """vLLM calls this in every process; install the finder once, patch what is loaded."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for name in RUNNERS:
        if name in sys.modules:
            _patch(sys.modules[name])
