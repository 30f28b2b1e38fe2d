"""``CodeChain`` and ``CodeLayer`` (what runs a step method or hook target) to and from their
messages."""

from __future__ import annotations

from typing import Any

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import CodeChain, CodeLayer
from servewitness.wire import fields as F

STATUSES = frozenset({"", "verified", "patched", "unverified"})
MAX_LAYERS = 64  # the probe writes at most 17


def _opt(msg: Any, name: str) -> str | None:
    return str(getattr(msg, name)) if msg.HasField(name) else None


def layer_to_pb(x: CodeLayer) -> pb.CodeLayer:
    return pb.CodeLayer(
        kind=x.kind,
        via=x.via,
        held=x.held,
        module=x.module,
        qualname=x.qualname,
        code_qualname=x.code_qualname,
        name=x.name,
        file=x.file,
        line=x.line,
        sha256=x.sha256,
        globals_file=x.globals_file,
        check=x.check,
        detail=x.detail,
    )


def layer_from_pb(msg: pb.CodeLayer, at: str) -> CodeLayer:
    if msg.check not in STATUSES:
        F.fail(f"{at}.check", f"must be one of {sorted(STATUSES)}, got {msg.check!r}")
    sha = _opt(msg, "sha256")
    return CodeLayer(
        kind=F.required(msg.kind, f"{at}.kind"),
        via=msg.via,
        held=msg.held if msg.HasField("held") else None,
        module=_opt(msg, "module"),
        qualname=_opt(msg, "qualname"),
        code_qualname=_opt(msg, "code_qualname"),
        name=_opt(msg, "name"),
        file=_opt(msg, "file"),
        line=F.count(msg.line, f"{at}.line") if msg.HasField("line") else None,
        sha256=None if sha is None else F.sha256_hex(sha, f"{at}.sha256"),
        globals_file=_opt(msg, "globals_file"),
        check=msg.check,
        detail=msg.detail,
    )


def chain_to_pb(c: CodeChain) -> pb.CodeChain:
    return pb.CodeChain(
        subject=c.subject,
        via=c.via,
        attr=c.attr,
        owner_module=c.owner_module,
        owner_qualname=c.owner_qualname,
        owner_file=c.owner_file,
        layers=[layer_to_pb(x) for x in c.layers],
        probe_layers=c.probe_layers,
        changes=c.changes,
        recorded_unix=c.recorded_unix,
        python=c.python,
        optimize=c.optimize,
        status=c.status,
        detail=c.detail,
        distribution=c.distribution,
    )


def chain_from_pb(msg: pb.CodeChain, at: str) -> CodeChain:
    if msg.status not in STATUSES:
        F.fail(f"{at}.status", f"must be one of {sorted(STATUSES)}, got {msg.status!r}")
    if len(msg.layers) > MAX_LAYERS:
        F.fail(f"{at}.layers", f"more than {MAX_LAYERS} layers")
    return CodeChain(
        subject=F.required(msg.subject, f"{at}.subject"),
        via=F.required(msg.via, f"{at}.via"),
        attr=F.required(msg.attr, f"{at}.attr"),
        owner_module=_opt(msg, "owner_module"),
        owner_qualname=_opt(msg, "owner_qualname"),
        owner_file=_opt(msg, "owner_file"),
        layers=tuple(layer_from_pb(x, f"{at}.layers[{i}]") for i, x in enumerate(msg.layers)),
        probe_layers=F.count(msg.probe_layers, f"{at}.probe_layers"),
        changes=F.count(msg.changes, f"{at}.changes"),
        recorded_unix=F.finite_time(msg.recorded_unix, f"{at}.recorded_unix"),
        python=msg.python,
        optimize=F.count(msg.optimize, f"{at}.optimize"),
        status=msg.status,
        detail=msg.detail,
        distribution=_opt(msg, "distribution"),
    )
