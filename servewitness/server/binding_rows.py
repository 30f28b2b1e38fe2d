"""A report's request bindings made the store's rows straight from its message, at the
verifier's edge (``VerifierService.Report``): the rows ``ledger.bindings.write_batch``
inserts, without building a ``RequestSpan`` or ``RequestId`` for a binding the fast path
takes. Before, every binding became objects (frozen dataclasses) and was read back field by
field into its row: at 500 agents with 20 spans and 20 ids per report, a third of the agents'
calls' interpreter time (BENCHMARKS.md, "Status answers from what is kept, a report's
bindings as rows")."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.ledger.bindings import Tails, client_id, hooks_json, id_row, real, span_row
from servewitness.wire import reports as R


def tails_from_pb(msg: pb.TargetReport, at: str = "report") -> Tails:
    """MSG's bindings' rows, straight from the message: each binding the fast path takes
    (``wire.reports.span_fields``, ``request_id_fields``) becomes its row without building
    its objects; any other is converted by the checked path (a WireError names its field)
    and made a row from those. The same rows as ``tails_of`` of the converted bindings (what
    ``wire.report_from_pb`` gives), with the same refusals; its bound checked first."""
    R.check_bindings(msg, at)
    spans = _rows(msg.spans, R.span_fields, _span_tail, R.span_checked, span_row, f"{at}.spans")
    ids = _rows(
        msg.request_ids, R.request_id_fields, _id_tail, R.request_id_checked, id_row,
        f"{at}.request_ids",
    )  # fmt: skip
    return Tails(spans, ids)


def _rows(  # noqa: PLR0917 - the two kinds of binding differ in these five only
    items: Iterable[Any],
    fields: Callable[[Any], Any],
    tail: Callable[[Any], tuple[Any, ...]],
    checked: Callable[[Any, str], Any],
    row: Callable[[str, str, Any], tuple[Any, ...]],
    at: str,
) -> list[tuple[Any, ...]]:
    """Each of ITEMS' row tail: from its FIELDS where the fast path takes it, else from its
    CHECKED conversion's ROW (which raises, naming the field, for one it refuses; the checked
    path alone, so a span with speculation counts is not looked at by the fast path twice)."""
    out = []
    for i, m in enumerate(items):
        f = fields(m)
        out.append(row("", "", checked(m, f"{at}[{i}]"))[2:] if f is None else tail(f))
    return out


def _span_tail(f: R.SpanFields) -> tuple[Any, ...]:
    """``span_row(...)[2:]`` of a span's checked fields."""
    return (
        f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], real(f[8]), real(f[9]), f[10], f[11],
        f[12], hooks_json(f[13]) if f[13] else "{}", int(f[14]), None,
    )  # fmt: skip


def _id_tail(g: R.RequestIdFields) -> tuple[Any, ...]:
    """``id_row(...)[2:]`` of a request id's checked fields."""
    return g[3], g[4], client_id(g[4]), real(g[5])
