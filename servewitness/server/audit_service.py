"""The audit queries over gRPC (``AuditService``, issue 19 item 6a): what ``verifier audit
request|file|run --db`` answers, for a peer with the ``auditor`` or ``operator`` role, on the
verifier's own listener and authentication. Each answer is a bundle signed now with the
ledger key (``servewitness.ledger.export.answer``): the entries it rests on, their inclusion
proofs, the checkpoint also as a C2SP signed note; the client checks it offline
(``servewitness.ledger.answers``). Answers are bounded: at most ``limit`` records (default
``DEFAULT_LIMIT``, at most ``MAX_LIMIT``), and a bundle that would not fit in a gRPC message
is RESOURCE_EXHAUSTED, never sent cut.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.errors import CheckFailed, NotFound
from servewitness.ledger import checkpoints, merkle, note
from servewitness.ledger.bundle import dump
from servewitness.ledger.export import Answer, answer
from servewitness.ledger.interface import Database
from servewitness.ledger.keys import Ed25519PrivateKey
from servewitness.ledger.tiles import TileRewritten
from servewitness.security.auth import Authorizer
from servewitness.server.store import Store

AUDIT_ROLES = frozenset({"auditor", "operator"})
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_ANSWER_BYTES = wire.MAX_MESSAGE_BYTES - 64 * 1024  # room for the rest of the message
# What the records' content may take, estimated as it is added (``export.answer``): the
# bundle's own parts (checkpoint, proofs, the statements' envelopes) are estimated too, and
# the answer is measured again once built.
ANSWER_BUDGET = MAX_ANSWER_BYTES - 1024 * 1024


class Rewritten(CheckFailed):
    """The ledger no longer extends a checkpoint this verifier signed, or an answer's proofs
    reach entries rewritten behind it: nothing is signed."""


T = TypeVar("T")


def _over_kept_tree(
    store: Store, key: Ed25519PrivateKey, fn: Callable[[Database, merkle.Proofs], T]
) -> T:
    """FN over the ledger's tree as this verifier keeps it (``Store.audit_read``). Without
    the checks there, a database rewritten behind the running verifier (consistently, with
    its hashes re-chained) would be signed afresh for any auditor who asks, laundering the
    rewrite the stored checkpoints show (as ``Store.sign_checkpoint`` refuses to)."""
    try:
        return store.audit_read(key, fn)
    except (checkpoints.NotAppendOnly, TileRewritten) as e:
        raise Rewritten(f"refused to sign an answer: {e}") from e


class AuditService(pb_grpc.AuditServiceServicer):
    def __init__(self, store: Store, key: Ed25519PrivateKey, auth: Authorizer) -> None:
        self.store = store
        self.key = key
        self.auth = auth

    def _answer(self, kind: str, req: Any, context: grpc.ServicerContext) -> Any:
        self.auth.require_role(context, AUDIT_ROLES)
        limit = req.limit or DEFAULT_LIMIT
        if limit > MAX_LIMIT:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"limit {limit} is above the most one answer holds ({MAX_LIMIT}): page with "
                "a narrower query",
            )
        if not req.query:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"an audit {kind} query needs an id")

        def build(db: Database, tree: merkle.Proofs) -> tuple[bytes, Answer, str]:
            got = answer(db, self.key, kind, req.query, limit, tree=tree, budget=ANSWER_BUDGET)
            text = note.sign_checkpoint(self.key, tree.size, tree.root())
            return dump(got.bundle), got, text

        try:
            data, got, text = _over_kept_tree(self.store, self.key, build)
        except Rewritten as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except NotFound as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except CheckFailed as e:  # the index disagrees with the ledger: never answered
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        if got.omitted and not got.shown:
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"no record of {kind} {req.query!r} fits in one answer: "
                + "; ".join(f"{o.record} of target {o.target} rests on {o.bytes} bytes"
                            for o in got.omitted[:3])
                + f" (one message holds {MAX_ANSWER_BYTES}); ask with --db, or `audit export`",
            )  # fmt: skip
        if len(data) > MAX_ANSWER_BYTES:
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the answer is {len(data)} bytes, over the {MAX_ANSWER_BYTES} one message "
                "holds: ask for fewer records (--limit)",
            )
        left = [pb.AuditOmitted(target=o.target, record=o.record, bytes=o.bytes)
                for o in got.omitted]  # fmt: skip
        return pb.AuditAnswer(
            bundle=data, total=got.total, truncated=got.total > got.shown + len(left),
            note=text, omitted=left,
        )  # fmt: skip

    def _signed(self, context: grpc.ServicerContext, fn: Callable[[merkle.Proofs], T]) -> T:
        """FN of the ledger's tree, once it is shown to extend every checkpoint signed before."""
        try:
            return _over_kept_tree(self.store, self.key, lambda _db, tree: fn(tree))
        except Rewritten as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))

    def AuditServed(self, req: pb.AuditServedRequest, context: grpc.ServicerContext) -> Any:
        return pb.AuditServedResponse(answer=self._answer("request", req, context))

    def AuditFile(self, req: pb.AuditFileRequest, context: grpc.ServicerContext) -> Any:
        return pb.AuditFileResponse(answer=self._answer("file", req, context))

    def AuditRun(self, req: pb.AuditRunRequest, context: grpc.ServicerContext) -> Any:
        return pb.AuditRunResponse(answer=self._answer("run", req, context))

    def AuditCheckpoint(self, req: pb.AuditCheckpointRequest, context: grpc.ServicerContext) -> Any:
        self.auth.require_role(context, AUDIT_ROLES)

        def head(tree: merkle.Proofs) -> str | None:
            return note.sign_checkpoint(self.key, tree.size, tree.root()) if tree.size else None

        signed = self._signed(context, head)
        if signed is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "the ledger is empty")
        return pb.AuditCheckpointResponse(note=signed)

    def AuditConsistency(
        self, req: pb.AuditConsistencyRequest, context: grpc.ServicerContext
    ) -> Any:
        self.auth.require_role(context, AUDIT_ROLES)

        def prove(tree: merkle.Proofs) -> tuple[int, Any]:
            if not 0 < req.old_size <= tree.size:
                return tree.size, None
            return tree.size, pb.AuditConsistencyResponse(
                note=note.sign_checkpoint(self.key, tree.size, tree.root()),
                proof=tree.consistency_proof(req.old_size),
                old_root=tree.root(req.old_size),
            )

        size, got = self._signed(context, prove)
        if got is None:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"old size {req.old_size} is not between 1 and the ledger's {size}",
            )
        return got
