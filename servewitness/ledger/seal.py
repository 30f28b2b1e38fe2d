"""The sealed measurement window: a signed statement that a results file was produced inside a
window the verifier opened and sealed, and what an offline check needs beside it.

Document (``"seal": 1``), what ``SealWindow`` returns and ``verifier exec`` writes to
``RESULTS.seal.json``::

    {"seal": 1,
     "envelope": DSSE(in-toto Statement v1,
                      subject [{name: RESULTS NAME, digest: {sha256: RESULTS SHA256}}],
                      predicateType MEASUREMENT_WINDOW,
                      predicate {<SLSA verification summary: verifier.id, timeVerified,
                                  policy.digest.sha256, run, verificationResult, findings>,
                                 "window": OPEN CONTENT, "seal": SEAL CONTENT,
                                 "ledger": {"range": [OPEN SEQ, SEAL SEQ],
                                            "open": {seq, hash}, "seal": {seq, hash}}}),
     "checkpoint": C2SP signed note of the ledger at a size covering the seal entry,
     "entries": {"open": ledger entry, "seal": ledger entry},
     "proofs": {"open": [hex, ...], "seal": [hex, ...]},   (inclusion in the checkpoint)
     "consistency": {"note": an earlier signed note, "proof": [hex, ...]} | null}

OPEN CONTENT is the ``window`` ledger entry's content and SEAL CONTENT the ``seal`` entry's, as
stored (``chain.canonical`` of each recomputes the entry's subject): the window id, run,
policy digest, times, the verifier's clock at each end (``verifier_clock``: its host's boot
id and ``CLOCK_BOOTTIME``) and the window's length on both clocks (``elapsed``), the evidence
per process at each end (agent id, report seq, that report's ledger entry, identity, step
counts and whether it runs steps, manifest digest, authenticated_as, evidence age, the
probe's own errors: the first ten and their count), every hook's counts,
the findings, held or not, the unsafe policy flags, the results' digest, the verifier's key
id, and every other window the ledger held just before the seal entry, counted by outcome on
the run and on the whole ledger (``other_windows``: a result chosen from several attempts says
so). The statement is signed by the verifier's ledger key (the one that signs checkpoints).
Checking it is :mod:`servewitness.ledger.verify_seal`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from servewitness.ledger import dsse
from servewitness.ledger import statement as st
from servewitness.ledger.bundle import LedgerEntry
from servewitness.ledger.keys import Ed25519PrivateKey, key_id
from servewitness.wire import seals

FORMAT = seals.FORMAT  # what a client reads (wire/seals.py) is what this writes

# What a seal's ``other_windows`` counts each other window as (``server/window_rows``): its
# seal held, did not hold, it has no seal, or its stored rows cannot tell (a row missing or
# edited: `audit verify` names which). Written by the verifier, checked by ``verify_seal``.
OTHER_OUTCOMES = ("held", "not_held", "not_sealed", "unreadable")


def predicate(
    open_content: Mapping[str, Any],
    seal_content: Mapping[str, Any],
    open_entry: LedgerEntry,
    seal_entry: LedgerEntry,
) -> dict[str, Any]:
    """The measurement-window predicate: the gate decision over the window (SLSA verification
    summary shape, ``statement.gate_decision``) with both ledger contents and the range."""
    held = bool(seal_content["held"])
    decision = st.gate_decision(
        verifier_id=str(seal_content["verifier_key_id"]),
        time_verified=float(seal_content["sealed_unix"]),
        policy_digest=str(seal_content["policy_digest"]),
        run=str(seal_content["run"]),
        result="PASS" if held else "FAIL",
        findings=seal_content["findings"],
    )
    return {
        **decision,
        "window": dict(open_content),
        "seal": dict(seal_content),
        "ledger": {
            "range": [open_entry.seq, seal_entry.seq],
            "open": {"seq": open_entry.seq, "hash": open_entry.hash},
            "seal": {"seq": seal_entry.seq, "hash": seal_entry.hash},
        },
    }


def envelope(
    key: Ed25519PrivateKey,
    open_content: Mapping[str, Any],
    seal_content: Mapping[str, Any],
    open_entry: LedgerEntry,
    seal_entry: LedgerEntry,
) -> dict[str, Any]:
    """The DSSE envelope of the statement, signed by KEY, whose subject is the results file."""
    if seal_content["verifier_key_id"] != key_id(key):
        raise ValueError("the seal names another verifier key than the one signing it")
    results = seal_content["results"]
    statement = st.statement(
        [st.subject(str(results["name"]), str(results["sha256"]))],
        st.MEASUREMENT_WINDOW,
        predicate(open_content, seal_content, open_entry, seal_entry),
    )
    return dsse.sign(st.encode(statement), st.PAYLOAD_TYPE, key)


def document(
    env: Mapping[str, Any],
    checkpoint_note: str,
    entries: tuple[LedgerEntry, LedgerEntry],
    proofs: tuple[Sequence[bytes], Sequence[bytes]],
    consistency: tuple[str, Sequence[bytes]] | None = None,
) -> dict[str, Any]:
    """The seal document (module docstring): ENV, the checkpoint note covering both ENTRIES
    (open, seal), their inclusion PROOFS in it, and optionally a CONSISTENCY proof (an earlier
    signed note, the proof) from an earlier checkpoint to this one."""
    return {
        "seal": FORMAT,
        "envelope": dict(env),
        "checkpoint": checkpoint_note,
        "entries": {"open": entries[0].to_json(), "seal": entries[1].to_json()},
        "proofs": {"open": [p.hex() for p in proofs[0]], "seal": [p.hex() for p in proofs[1]]},
        "consistency": None
        if consistency is None
        else {"note": consistency[0], "proof": [p.hex() for p in consistency[1]]},
    }


def dump(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"
