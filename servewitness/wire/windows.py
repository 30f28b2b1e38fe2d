"""Measurement windows on the wire (``OpenWindow``, ``SealWindow``): the requests a harness
sends and what the verifier answers. The seal document itself is JSON (``ledger/seal.py``),
carried as text: it is checked offline with the verifier's key, not trusted for its transport.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.wire import fields as F
from servewitness.wire import limits as L


@dataclass(frozen=True)
class WindowOpening:
    run: str
    timeout_s: float  # how long the verifier waits for a PASS on evidence after the call


@dataclass(frozen=True)
class OpenedWindow:
    window_id: str
    run: str
    policy_digest: str
    opened_unix: float  # the verifier's wall clock (display)
    ledger_seq: int  # the window's ledger entry
    ledger_hash: str


@dataclass(frozen=True)
class WindowSealing:
    window_id: str
    run: str
    results_sha256: str
    results_size: int
    results_name: str
    timeout_s: float
    # The request ids the harness sent during the window (``SealWindowRequest.request_ids``):
    # each must have been served by the window's processes. Empty: not checked.
    request_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class SealedWindow:
    held: bool
    seal_json: str  # the seal document (ledger/seal.py)


def _timeout(value: float, at: str) -> float:
    return F.finite_time(value, at)


def open_window_request_to_pb(o: WindowOpening) -> pb.OpenWindowRequest:
    return pb.OpenWindowRequest(run=o.run, timeout_s=o.timeout_s)


def open_window_request_from_pb(msg: pb.OpenWindowRequest) -> WindowOpening:
    return WindowOpening(
        L.ident(F.required(msg.run, "open_window_request.run"), "open_window_request.run"),
        _timeout(msg.timeout_s, "open_window_request.timeout_s"),
    )


def open_window_response_to_pb(w: OpenedWindow) -> pb.OpenWindowResponse:
    return pb.OpenWindowResponse(
        window_id=w.window_id,
        run=w.run,
        policy_digest=w.policy_digest,
        opened_unix=w.opened_unix,
        ledger_seq=w.ledger_seq,
        ledger_hash=w.ledger_hash,
    )


def open_window_response_from_pb(msg: pb.OpenWindowResponse) -> OpenedWindow:
    at = "open_window_response"
    return OpenedWindow(
        F.required(msg.window_id, f"{at}.window_id"),
        F.required(msg.run, f"{at}.run"),
        F.required(msg.policy_digest, f"{at}.policy_digest"),
        F.finite_time(msg.opened_unix, f"{at}.opened_unix"),
        F.count(msg.ledger_seq, f"{at}.ledger_seq", 1),
        F.sha256_hex(msg.ledger_hash, f"{at}.ledger_hash"),
    )


def seal_window_request_to_pb(s: WindowSealing) -> pb.SealWindowRequest:
    return pb.SealWindowRequest(
        window_id=s.window_id,
        run=s.run,
        results_sha256=s.results_sha256,
        results_size=s.results_size,
        results_name=s.results_name,
        timeout_s=s.timeout_s,
        request_ids=list(s.request_ids),
    )


def seal_window_request_from_pb(msg: pb.SealWindowRequest) -> WindowSealing:
    at = "seal_window_request"
    return WindowSealing(
        L.ident(F.required(msg.window_id, f"{at}.window_id"), f"{at}.window_id"),
        L.ident(F.required(msg.run, f"{at}.run"), f"{at}.run"),
        F.sha256_hex(msg.results_sha256, f"{at}.results_sha256"),
        F.count(msg.results_size, f"{at}.results_size"),
        F.text(F.required(msg.results_name, f"{at}.results_name"), f"{at}.results_name"),
        _timeout(msg.timeout_s, f"{at}.timeout_s"),
        request_ids(msg.request_ids, f"{at}.request_ids"),
    )


def request_ids(ids: Sequence[str], at: str) -> tuple[str, ...]:
    """IDS, checked (each a non-empty id within ``id_bytes``, at most ``request_ids_per_seal``
    of them) and without repeats, in their first order."""
    L.at_most(L.REQUEST_IDS_PER_SEAL, len(ids), at)
    for i, rid in enumerate(ids):
        L.ident(F.required(rid, f"{at}[{i}]"), f"{at}[{i}]")
        if not rid.isprintable() or rid != rid.strip():
            raise F.WireError(f"{at}[{i}]", "not a request id: blanks or control characters")
    return tuple(dict.fromkeys(ids))


def seal_window_response_to_pb(s: SealedWindow) -> pb.SealWindowResponse:
    return pb.SealWindowResponse(held=s.held, seal_json=s.seal_json)


def seal_window_response_from_pb(msg: pb.SealWindowResponse) -> SealedWindow:
    return SealedWindow(msg.held, F.required(msg.seal_json, "seal_window_response.seal_json"))
