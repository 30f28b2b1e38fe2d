"""in-toto Statement v1 (github.com/in-toto/attestation, spec/v1) and this project's
predicates.

A statement says ``predicate`` about each ``subject`` (a name and its sha256). It travels as
the payload of a DSSE envelope of type :data:`PAYLOAD_TYPE`, serialised as compact JSON with
sorted keys (any serialisation verifies: the signature covers the bytes that are there).

Predicate types (URIs in the project's namespace, versioned):

- :data:`CHECKPOINT`: the ledger's Merkle tree head at a size, signed by the verifier.
- :data:`RUNTIME_EVIDENCE`: what a stored report (or run, manifest, request binding batch)
  says, bound to its ledger entry.
- :data:`MEASUREMENT_WINDOW`: a results file (the subject) produced inside a window the
  verifier opened and sealed: a gate decision (below) over the window, with the window's and
  the seal's ledger contents and range (:mod:`servewitness.ledger.seal`).
- :data:`GATE_DECISION`: a verdict, in the shape of a SLSA Verification Summary: who verified,
  when, against which policy digest, which run, with which result.

Every predicate bound to a ledger entry carries ``ledger: {seq, kind, ref, hash}``; see
:mod:`servewitness.ledger.verify_bundle` for how that binding is checked.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

# the types a client reads seals by (wire/seals.py), defined there once
from servewitness.wire.seals import MEASUREMENT_WINDOW as MEASUREMENT_WINDOW  # noqa: PLC0414
from servewitness.wire.seals import PAYLOAD_TYPE as PAYLOAD_TYPE  # noqa: PLC0414
from servewitness.wire.seals import STATEMENT_TYPE as STATEMENT_TYPE  # noqa: PLC0414

# A statement read back: one reader for the ledger's checks and the gate client's (wire/seals)
from servewitness.wire.seals import Statement as Statement  # noqa: PLC0414
from servewitness.wire.seals import parse_statement

NAMESPACE = "https://verifier.dev"
RUNTIME_EVIDENCE = f"{NAMESPACE}/runtime-evidence/v1"
GATE_DECISION = f"{NAMESPACE}/gate-decision/v1"
CHECKPOINT = f"{NAMESPACE}/checkpoint/v1"
PREDICATE_TYPES = (RUNTIME_EVIDENCE, GATE_DECISION, CHECKPOINT, MEASUREMENT_WINDOW)
RESULTS = ("PASS", "FAIL", "PENDING", "STALE")


def subject(name: str, sha256: str) -> dict[str, Any]:
    return {"name": name, "digest": {"sha256": sha256}}


def statement(
    subjects: Sequence[Mapping[str, Any]], predicate_type: str, predicate: Mapping[str, Any]
) -> dict[str, Any]:
    return {
        "_type": STATEMENT_TYPE,
        "subject": [dict(s) for s in subjects],
        "predicateType": predicate_type,
        "predicate": dict(predicate),
    }


def encode(st: Mapping[str, Any]) -> bytes:
    """The payload bytes of statement ST (compact, sorted keys)."""
    return json.dumps(st, sort_keys=True, separators=(",", ":")).encode()


# Predicates --------------------------------------------------------------------------------


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def checkpoint(
    *, size: int, root: str, at_unix: float, verifier_id: str, head: str
) -> dict[str, Any]:
    """The ledger's tree head ROOT (hex) over its first SIZE entries, whose last is HEAD."""
    return {
        "size": size,
        "root": root,
        "at_unix": at_unix,
        "verifier_id": verifier_id,
        "head": head,
    }


def gate_decision(
    *,
    verifier_id: str,
    time_verified: float,
    policy_digest: str,
    run: str,
    result: str,
    findings: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A verdict as a Verification Summary: VERIFIER_ID checked RUN against the policy with
    POLICY_DIGEST (sha256) at TIME_VERIFIED and found RESULT (PASS, FAIL, PENDING, STALE)."""
    if result not in RESULTS:
        raise ValueError(f"result {result!r} is not one of {', '.join(RESULTS)}")
    return {
        "verifier": {"id": verifier_id},
        "timeVerified": rfc3339(time_verified),
        "time_verified_unix": time_verified,
        "policy": {"digest": {"sha256": policy_digest}},
        "run": run,
        "verificationResult": result,
        "findings": [dict(f) for f in findings],
    }


def runtime_evidence(
    *, target: str, collected_unix: float, details: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Evidence about TARGET collected at COLLECTED_UNIX; DETAILS is free-form JSON (agent id,
    process, manifest digest, hook counts...)."""
    return {"target": target, "collected_unix": collected_unix, "details": dict(details or {})}


parse = parse_statement  # ``parse(payload)``: the reader wire/seals.py defines for both sides
