"""A seal document (``SealWindowResponse.seal_json``; written by ``ledger/seal.py``) read for
what its signed statement claims: which window, run and results it seals, and whether the
window held. Nothing here checks the signature (``wire/dsse.py`` does, with the verifier's
public key) or the ledger proofs (``verifier audit verify-seal``).

It lives in ``wire`` because the client, which checks every seal it is handed against what it
asked for, may not import ``ledger`` (docs/architecture.md), and ``ledger`` may import
``wire``: this is the one reading of a seal's claims both sides can share. The reading is the
one ``ledger/verify_seal.py`` makes (the same envelope, statement and predicate, and the same
agreement between the gate decision, the window content and the seal content); the constants
are defined here and used by ``ledger/statement.py`` and ``ledger/seal.py``
(``tests/test_gate_seal_checks.py`` checks that both read a real seal alike).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servewitness.wire import dsse

FORMAT = 1  # of a seal document (ledger/seal.py writes it)
PAYLOAD_TYPE = "application/vnd.in-toto+json"  # of every statement the verifier signs
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
MEASUREMENT_WINDOW = "https://verifier.dev/measurement-window/v1"  # a seal's predicate type


class SealUnreadable(ValueError):
    """Not a seal document, or one whose statement contradicts itself (what, in words)."""


@dataclass(frozen=True)
class SealClaims:
    """What a seal's statement says (unverified until its signature is checked)."""

    window_id: str
    run: str
    held: bool
    policy_digest: str
    verifier_key_id: str
    results_name: str
    results_sha256: str
    results_size: int | None
    open_entry: tuple[int, str] | None  # the window's ledger entry (seq, hash) the seal closes
    requests: Mapping[str, Any] | None  # sent, served, ids_sha256; None: not checked
    content: dict[str, Any]  # the seal content as signed (the `seal` ledger entry's)
    envelope: dict[str, Any]  # the DSSE envelope, for its signature
    payload: bytes  # the envelope's payload, decoded


def _b64decode(text: str) -> bytes:
    try:
        return dsse.b64decode(text)
    except ValueError as e:
        raise SealUnreadable(str(e)) from None


def _obj(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SealUnreadable(f"{what} is not a JSON object")
    return value


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise SealUnreadable(f"{what} is not a non-empty string")
    return value


@dataclass(frozen=True)
class Statement:
    subjects: list[tuple[str, str]]  # (name, sha256)
    predicate_type: str
    predicate: dict[str, Any]


def parse_statement(payload: bytes) -> Statement:
    """An in-toto statement from payload bytes (``ledger/statement.parse``); ValueError naming
    what is wrong."""
    try:
        st = json.loads(payload)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, too deep
        raise ValueError(f"the payload is not JSON: {e}") from None
    if not isinstance(st, dict):
        raise ValueError("the statement is not a JSON object")
    if st.get("_type") != STATEMENT_TYPE:
        raise ValueError(f"_type is {st.get('_type')!r}, not {STATEMENT_TYPE}")
    subs = st.get("subject")
    if not isinstance(subs, list) or not subs:
        raise ValueError("the statement has no subject")
    subjects: list[tuple[str, str]] = []
    for s in subs:
        digest = s.get("digest") if isinstance(s, dict) else None
        sha = digest.get("sha256") if isinstance(digest, dict) else None
        name = s.get("name", "") if isinstance(s, dict) else None
        if not isinstance(name, str) or not isinstance(sha, str):
            raise ValueError("a subject needs a name and a sha256 digest")
        subjects.append((name, sha))
    ptype = st.get("predicateType")
    predicate = st.get("predicate")
    if not isinstance(ptype, str) or not isinstance(predicate, dict):
        raise ValueError("the statement needs a predicateType and a predicate object")
    return Statement(subjects, ptype, predicate)


def _statement(doc: Mapping[str, Any]) -> tuple[dict[str, Any], bytes, Statement]:
    """(the envelope, its payload, the statement)."""
    env = _obj(doc.get("envelope"), "the envelope")
    if env.get("payloadType") != PAYLOAD_TYPE:
        raise SealUnreadable(f"payloadType {env.get('payloadType')!r}, not {PAYLOAD_TYPE}")
    payload = _b64decode(_text(env.get("payload"), "the envelope's payload"))
    try:
        st = parse_statement(payload)
    except ValueError as e:
        raise SealUnreadable(str(e)) from None
    if st.predicate_type != MEASUREMENT_WINDOW:
        raise SealUnreadable(f"predicateType {st.predicate_type!r}, not {MEASUREMENT_WINDOW}")
    return env, payload, st


def agreement(p: Mapping[str, Any], w: Mapping[str, Any], sl: Mapping[str, Any]) -> list[str]:
    """Where the gate decision P, the window content W and the seal content SL of one seal's
    statement disagree: the checks that need no key, made alike by the gate client (here) and
    ``verify-seal`` (``ledger/verify_seal.py``, which adds those that need the key)."""
    wrong = []
    if w.get("window_id") != sl.get("window_id") or not w.get("window_id"):
        wrong.append("the seal content names another window than the window content")
    if w.get("opened_unix") != sl.get("opened_unix"):
        wrong.append("the seal dates the window's open otherwise than the window content")
    if not (p.get("run") == w.get("run") == sl.get("run")):
        wrong.append("the run differs between the decision, the window and the seal")
    digest = (p.get("policy") or {}).get("digest", {}).get("sha256")
    if not (digest == w.get("policy_digest") == sl.get("policy_digest")):
        wrong.append("the policy digest differs between the decision, the window and the seal")
    if (p.get("verifier") or {}).get("id") != sl.get("verifier_key_id"):
        wrong.append("the decision and the seal name different verifier keys")
    result = p.get("verificationResult")
    if result != ("PASS" if sl.get("held") is True else "FAIL"):
        wrong.append(f"verificationResult {result!r} does not match held={sl.get('held')!r}")
    if p.get("findings") != sl.get("findings"):
        wrong.append("the decision's findings are not the seal's")
    if sl.get("held") is True and sl.get("findings"):
        wrong.append("held, yet the seal lists findings")
    return wrong


def document(seal_json: str | bytes) -> dict[str, Any]:
    """The seal document in SEAL_JSON (``verify-seal`` reads it so too);
    :class:`SealUnreadable` when it is not one."""
    try:
        doc = json.loads(seal_json)
    except (ValueError, RecursionError) as e:
        raise SealUnreadable(f"not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("seal") != FORMAT:
        raise SealUnreadable(f"not a seal document (format {FORMAT}) written by `verifier seal`")
    return doc


def read_seal(seal_json: str) -> SealClaims:
    """What SEAL_JSON's statement claims; :class:`SealUnreadable` when it is not a seal
    document, or its decision, window and seal contents or its subject disagree."""
    doc = document(seal_json)
    env, payload, st = _statement(doc)
    p = st.predicate
    w, sl = _obj(p.get("window"), "the window content"), _obj(p.get("seal"), "the seal content")
    wrong = agreement(p, w, sl)
    if wrong:
        raise SealUnreadable("; ".join(wrong))
    held = sl.get("held")
    if not isinstance(held, bool):
        raise SealUnreadable(f"held is {held!r}, not true or false")
    res = _obj(sl.get("results"), "the seal's results")
    if st.subjects != [(res.get("name"), res.get("sha256"))]:
        raise SealUnreadable("the statement's subject is not the sealed results file")
    size = res.get("size")
    opened = sl.get("open_entry")
    requests = sl.get("requests")
    if requests is not None and not isinstance(requests, dict):
        raise SealUnreadable("the seal's requests are neither a summary nor null")
    return SealClaims(
        window_id=_text(sl.get("window_id"), "the seal's window_id"),
        run=_text(sl.get("run"), "the seal's run"),
        held=held,
        policy_digest=_text(sl.get("policy_digest"), "the seal's policy_digest"),
        verifier_key_id=_text(sl.get("verifier_key_id"), "the seal's verifier_key_id"),
        results_name=_text(res.get("name"), "the sealed results' name"),
        results_sha256=_text(res.get("sha256"), "the sealed results' sha256"),
        results_size=size if type(size) is int else None,
        open_entry=(opened["seq"], opened["hash"])
        if isinstance(opened, dict) and type(opened.get("seq")) is int
        and isinstance(opened.get("hash"), str)
        else None,
        requests=requests,
        content=sl,
        envelope=env,
        payload=payload,
    )  # fmt: skip
