"""A vLLM general plugin that patches vLLM in memory, the common way: it replaces the V1 model
runner's ``execute_model`` (which the CPU runner inherits) with a wrapper of its own after the
module is imported, leaving every file of vLLM pristine. The wrapper still calls the original,
so the server serves as before; it only counts the calls. Its directory on PYTHONPATH
registers it (the dist-info's entry point), and vLLM loads it in every process it starts, the
worker included.

The runner module is patched when it is imported (a meta path finder), so that no process
imports it only because of this plugin. ``sample_tokens`` is left alone: the negative control
in the same process."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

RUNNER = "vllm.v1.worker.gpu_model_runner"
CALLS = [0]


def _patch(module: ModuleType) -> None:
    cls = module.GPUModelRunner
    if "_patch_plugin" in cls.__dict__:
        return
    cls._patch_plugin = True
    orig = cls.execute_model

    @functools.wraps(orig)
    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        CALLS[0] += 1
        return orig(self, *args, **kwargs)

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
        if name != RUNNER:
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
    if RUNNER in sys.modules:
        _patch(sys.modules[RUNNER])
