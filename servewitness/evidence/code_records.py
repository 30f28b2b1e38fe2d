"""The probe's ``code`` journal records (``servewitness_probe.layout``: what runs each step method
and declared hook target) read into ``servewitness.model.CodeChain``, unjudged.

The journal is written by the probed process: a field of the wrong type reads as absent, a
record without a subject or layers that are not a list is skipped, never raises. The latest
record of each (subject, via) stands; one that says the attribute is ``absent`` again (an
instance attribute that was deleted) removes its chain.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from servewitness.model import CodeChain, CodeLayer

_HEX = re.compile(r"[0-9a-f]{64}")
MAX_LAYERS = 32  # more than the probe writes (16 and a cut marker): the rest is dropped


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _int(v: object) -> int | None:
    """A count or line number (what a protobuf int64 carries), else None."""
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63:
        return v
    return None


def _layer(rec: dict[str, Any]) -> CodeLayer:
    held = rec.get("held")
    sha = _str(rec.get("sha256"))
    return CodeLayer(
        kind="cut" if rec.get("cut") else str(_str(rec.get("kind")) or "other"),
        via=_str(rec.get("via")) or "",
        held=held if isinstance(held, bool) else None,
        module=_str(rec.get("module")),
        qualname=_str(rec.get("qualname")),
        code_qualname=_str(rec.get("code_qualname")),
        name=_str(rec.get("name")),
        file=_str(rec.get("file")),
        line=_int(rec.get("line")),
        sha256=sha if sha is not None and _HEX.fullmatch(sha) else None,
        globals_file=_str(rec.get("globals_file")),
        check="unverified" if rec.get("cut") else "",
        detail="the chain was cut here (too many layers)" if rec.get("cut") else "",
    )


def _layers(recs: list[Any]) -> tuple[CodeLayer, ...]:
    out = [_layer(x) for x in recs[:MAX_LAYERS] if isinstance(x, dict)]
    if len(recs) > MAX_LAYERS and (not out or out[-1].kind != "cut"):
        out.append(_layer({"cut": True}))
    return tuple(out)


def chains(records: Iterable[dict[str, Any]]) -> tuple[CodeChain, ...]:
    """The latest chain per (subject, via) in RECORDS (journal order), with how many
    records each had (``changes``)."""
    latest: dict[tuple[str, str], CodeChain | None] = {}
    counts: dict[tuple[str, str], int] = {}
    for rec in records:
        if rec.get("k") != "code":
            continue
        subject, via, attr = _str(rec.get("subject")), _str(rec.get("via")), _str(rec.get("attr"))
        layers = rec.get("layers")
        if not subject or not via or not attr or not isinstance(layers, list):
            continue
        key = (subject, via)
        counts[key] = counts.get(key, 0) + 1
        if rec.get("absent") is True:
            latest[key] = None
            continue
        t = rec.get("t")
        latest[key] = CodeChain(
            subject=subject,
            via=via,
            attr=attr,
            owner_module=_str(rec.get("owner_module")),
            owner_qualname=_str(rec.get("owner_qualname")),
            owner_file=_str(rec.get("owner_file")),
            layers=_layers(layers),
            probe_layers=_int(rec.get("probe_layers")) or 0,
            recorded_unix=float(t) if isinstance(t, (int, float)) and _time(t) else 0.0,
            python=_str(rec.get("python")) or "",
            optimize=_int(rec.get("optimize")) or 0,
        )
    out = [replace(c, changes=counts[key]) for key, c in latest.items() if c is not None]
    return tuple(sorted(out, key=lambda c: (c.subject, c.via)))


def _time(t: object) -> bool:
    return isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0
