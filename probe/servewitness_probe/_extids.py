"""Request bindings, the API server's half: which external id is which internal one. One
``"ext"`` record per engine request, written with the engine's records by the bindings writer
(``_bindings``: its buffer, writer thread and file).

``OutputProcessor.add_request`` is wrapped at class level: it sees each engine request with its
internal id (``request.request_id``, e.g. ``cmpl-<X-Request-Id>-0-<8 random chars>``; a child of
an ``n > 1`` request gets ``<index>_`` in front) and the external id
(``request.external_req_id``, e.g. ``cmpl-<X-Request-Id>-0``). The client's raw
``X-Request-Id`` is added as ``"xrid"`` when the request came through an OpenAI serving class
that read it (``BaseServing._base_request_id`` is wrapped to note it in a context variable,
which the engine request's task inherits). Nothing here raises into vLLM.
"""

from __future__ import annotations

import contextvars
import functools
import time
from typing import Any

from servewitness_probe import _bindings, _core

_xrid: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "verifier_probe_xrid", default=None
)


def ext(internal: Any, external: Any) -> None:
    """Buffer one external-id record (the API server)."""
    rec: dict[str, Any] = {"k": "ext", "id": internal, "ext": external, "t": time.time_ns()}
    xrid = _xrid.get()
    if xrid is not None:
        rec["xrid"] = xrid
    _bindings._buf.append(rec)
    _bindings._start_writer()
    if len(_bindings._buf) >= _bindings.BATCH:
        _bindings.flush(block=False)


def _wrap_add_request(cls: type) -> None:
    orig = cls.__dict__.get("add_request")
    if orig is None or getattr(orig, "__verifier_probe__", False):
        return

    def add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        new = None
        try:
            rid = request.request_id
            states = getattr(self, "request_states", None)
            if states is None or rid not in states:  # a repeat is a streaming update
                new = rid, getattr(request, "external_req_id", None)
        except Exception as e:  # noqa: BLE001 - a probe never raises into vLLM
            _core.report_error("bindings", f"add_request: {type(e).__name__}: {e}")
        result = orig(self, request, *args, **kwargs)
        if new is not None:
            try:
                ext(*new)
            except Exception as e:  # noqa: BLE001
                _core.report_error("bindings", f"add_request: {type(e).__name__}: {e}")
        return result

    functools.update_wrapper(add_request, orig)
    add_request.__verifier_probe__ = True  # type: ignore[attr-defined]
    cls.add_request = add_request  # type: ignore[attr-defined]


def _wrap_base_request_id(cls: type) -> None:
    raw = cls.__dict__.get("_base_request_id")
    if not isinstance(raw, staticmethod):
        return
    orig = raw.__func__
    if getattr(orig, "__verifier_probe__", False):
        return

    def _base_request_id(raw_request: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            headers = getattr(raw_request, "headers", None)
            _xrid.set(None if headers is None else headers.get("X-Request-Id"))
        except Exception as e:  # noqa: BLE001 - a probe never raises into vLLM
            _core.report_error("bindings", f"X-Request-Id: {type(e).__name__}: {e}")
        return orig(raw_request, *args, **kwargs)

    functools.update_wrapper(_base_request_id, orig)
    _base_request_id.__verifier_probe__ = True  # type: ignore[attr-defined]
    cls._base_request_id = staticmethod(_base_request_id)  # type: ignore[attr-defined]


def on_output_processor(module: Any) -> None:
    _wrap_add_request(module.OutputProcessor)


def on_serving(module: Any) -> None:
    _wrap_base_request_id(module.BaseServing)
