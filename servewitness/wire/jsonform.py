"""The one JSON form of each domain object a user or a file sees, and the readers that take it
back (docs/gate.md "JSON output").

- **A run's verdict** (``status --json``, ``wait --json``, a window file's start): written by
  :func:`run_verdict_to_json` in the form people read (``fired_on_productive_steps`` next to
  ``productive_steps``), read back by :func:`run_verdict_from_json`, which checks the types
  of every field and then every value as the wire does (a count below zero, an unknown
  verdict), naming the field that is wrong.
- **A process report** (the ``report`` of each process in ``inspect --json``, which ``diff``
  and ``policy init`` read back): protobuf's JSON mapping of ``ProcessReport``
  (:func:`process_to_json`, :func:`process_from_json`).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

from google.protobuf import json_format

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import (
    Finding,
    HookCount,
    ProcessReport,
    RunVerdict,
    Severity,
    TargetVerdict,
    Verdict,
)
from servewitness.wire import fields as F
from servewitness.wire.fields import WireError
from servewitness.wire.process import process_from_pb, process_to_pb
from servewitness.wire.verdicts import run_verdict_from_pb, run_verdict_to_pb

E = TypeVar("E", bound=Enum)

# Process reports ---------------------------------------------------------------------------


def process_to_json(p: ProcessReport) -> dict[str, Any]:
    """A process report as JSON-ready data (protobuf's JSON mapping of ``ProcessReport``): the
    form ``verifier inspect --json`` stores, which ``process_from_json`` reads back."""
    data: dict[str, Any] = json_format.MessageToDict(
        process_to_pb(p), preserving_proto_field_name=True
    )
    return data


def process_from_json(data: object, at: str = "report") -> ProcessReport:
    """Read back what ``process_to_json`` wrote; WireError names the field that is wrong."""
    if not isinstance(data, dict):
        F.fail(at, f"must be a JSON object, not {type(data).__name__}")
    msg = pb.ProcessReport()
    try:
        json_format.ParseDict(data, msg)
    except json_format.ParseError as e:
        raise WireError(at, f"not a ProcessReport: {e}") from e
    return process_from_pb(msg, at)


# Verdicts ----------------------------------------------------------------------------------


def _finding_to_json(f: Finding) -> dict[str, Any]:
    return {
        "id": f.id,
        "severity": f.severity.value,
        "message": f.message,
        "target": f.target,
        "context": dict(f.context),
    }


def _hook_to_json(h: HookCount) -> dict[str, Any]:
    return {
        "name": h.name,
        "pid": h.pid,
        "role": h.role,
        "rank": h.rank,
        "fired": h.fired,
        "fired_on_productive_steps": h.fired_productive,
        "fired_on_decode_steps": h.fired_decode,
        "decode_steps": h.decode_steps,
        "fired_on_prefill_steps": h.fired_prefill,
        "prefill_steps": h.prefill_steps,
        "fired_outside_steps": h.fired_outside,
        "on": h.on,
        "min_fires_per_step": h.min_fires_per_step,
        "productive_steps": h.productive_steps,
        "total_steps": h.total_steps,
    }


def _target_to_json(t: TargetVerdict) -> dict[str, Any]:
    return {
        "target": t.target,
        "verdict": t.verdict.value,
        "evaluated_unix": t.evaluated_unix,
        "report_unix": t.report_unix,
        "findings": [_finding_to_json(f) for f in t.findings],
        "hooks": [_hook_to_json(h) for h in t.hooks],
    }


def run_verdict_to_json(v: RunVerdict) -> dict[str, Any]:
    """A run's verdict as JSON-ready data: verdicts, findings, and every hook's fires next to
    the steps it is judged on."""
    return {
        "run": v.run,
        "policy_digest": v.policy_digest,
        "verdict": v.verdict.value,
        "evaluated_unix": v.evaluated_unix,
        "findings": [_finding_to_json(f) for f in v.findings],
        "targets": [_target_to_json(t) for t in v.targets],
    }


class _Reader:
    """Typed access to one JSON object, each error naming the field's path."""

    def __init__(self, data: object, at: str) -> None:
        if not isinstance(data, dict):
            F.fail(at, f"must be a JSON object, not {type(data).__name__}")
        self.data: dict[str, Any] = data
        self.at = at

    def _get(self, key: str, types: tuple[type, ...], what: str) -> Any:
        """KEY's value, which must be one of TYPES (a bool is never a number here)."""
        if key not in self.data:
            F.fail(f"{self.at}.{key}", "required, but absent")
        v = self.data[key]
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            F.fail(f"{self.at}.{key}", f"must be {what}, not {type(v).__name__}")
        return v

    def string(self, key: str) -> str:
        return str(self._get(key, (str,), "a string"))

    def integer(self, key: str) -> int:
        return int(self._get(key, (int,), "an integer"))

    def number(self, key: str) -> float:
        return float(self._get(key, (int, float), "a number"))

    def array(self, key: str) -> list[Any]:
        return list(self._get(key, (list,), "a list"))

    def obj(self, key: str) -> dict[str, Any]:
        return dict(self._get(key, (dict,), "a JSON object"))

    def opt_integer(self, key: str) -> int | None:
        return None if self.data.get(key) is None else self.integer(key)

    def opt_number(self, key: str) -> float | None:
        return None if self.data.get(key) is None else self.number(key)


def _enum(cls: type[E], text: str, at: str) -> E:
    """The member of CLS whose value is TEXT (a verdict, a severity)."""
    try:
        return cls(text)
    except ValueError:
        F.fail(at, f"must be one of {[m.value for m in cls]}, got {text!r}")


def _finding_from_json(data: object, at: str) -> Finding:
    r = _Reader(data, at)
    return Finding(
        id=r.string("id"),
        severity=_enum(Severity, r.string("severity"), f"{at}.severity"),
        message=r.string("message"),
        target=r.string("target"),
        context=r.obj("context"),
    )


def _hook_from_json(data: object, at: str) -> HookCount:
    r = _Reader(data, at)
    return HookCount(
        name=r.string("name"),
        pid=r.integer("pid"),
        role=r.string("role"),
        rank=r.opt_integer("rank"),
        fired=r.integer("fired"),
        fired_productive=r.integer("fired_on_productive_steps"),
        productive_steps=r.integer("productive_steps"),
        total_steps=r.integer("total_steps"),
        fired_decode=r.integer("fired_on_decode_steps"),
        decode_steps=r.integer("decode_steps"),
        fired_prefill=r.integer("fired_on_prefill_steps"),
        prefill_steps=r.integer("prefill_steps"),
        fired_outside=r.integer("fired_outside_steps"),
        on=r.string("on"),
        min_fires_per_step=r.number("min_fires_per_step"),
    )


def _target_from_json(data: object, at: str) -> TargetVerdict:
    r = _Reader(data, at)
    return TargetVerdict(
        target=r.string("target"),
        verdict=_enum(Verdict, r.string("verdict"), f"{at}.verdict"),
        findings=tuple(
            _finding_from_json(f, f"{at}.findings[{i}]") for i, f in enumerate(r.array("findings"))
        ),
        evaluated_unix=r.number("evaluated_unix"),
        report_unix=r.opt_number("report_unix"),
        hooks=tuple(_hook_from_json(h, f"{at}.hooks[{i}]") for i, h in enumerate(r.array("hooks"))),
    )


def run_verdict_from_json(data: object, at: str = "run_verdict") -> RunVerdict:
    """Read back what :func:`run_verdict_to_json` wrote. Every field's type is checked, then
    every value as a received message's is (``run_verdict_from_pb``); WireError names the
    field that is wrong."""
    r = _Reader(data, at)
    v = RunVerdict(
        run=r.string("run"),
        policy_digest=r.string("policy_digest"),
        verdict=_enum(Verdict, r.string("verdict"), f"{at}.verdict"),
        targets=tuple(
            _target_from_json(t, f"{at}.targets[{i}]") for i, t in enumerate(r.array("targets"))
        ),
        findings=tuple(
            _finding_from_json(f, f"{at}.findings[{i}]") for i, f in enumerate(r.array("findings"))
        ),
        evaluated_unix=r.number("evaluated_unix"),
    )
    return run_verdict_from_pb(run_verdict_to_pb(v), at)
