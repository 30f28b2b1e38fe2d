"""Request ids over what a database indexes: any HTTP client of vLLM chooses its
``X-Request-Id``, of any length, and vLLM builds its API id (``cmpl-<id>-0``,
``chatcmpl-<id>``, ...) and the engine's id (``<API id>-<8 chars>``) around it. The agent
reports such an id with its client part made a digest, its prefix and suffix kept
(``fields.bounded_external_id``, ``bounded_internal_id``), so that a query by the client's id,
the API id or the engine's id computes what is stored, and the seal's request check counts
the request; a client's id shaped like such a digest is made a digest too, so that it never
stands for another client's long id. The same over a real verifier, the answer checked with
its key: ``test_a_long_chat_id_is_found_by_the_clients_id_over_the_wire``, and
``tests/test_audit_attacks.py::test_a_served_request_with_a_long_client_id_is_found_by_that_id``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servewitness import wire
from servewitness.agent.bindings import Bindings
from servewitness.evidence.journal import JournalCache
from servewitness.evidence.probe_reader import ProbeState
from servewitness.evidence.process import ProcessEvidence
from servewitness.evidence.procfs import ProcessIdentity
from servewitness.ledger.queries import find_request
from servewitness.model import RequestId, RequestSpan, StepEvidence, TargetReport
from servewitness.server.db import open_database
from servewitness.server.store import Store, StoredReport
from servewitness.wire import fields as F
from tests.test_audit_attacks import Lab, add_request, lab, procs_of

LONG = "L" * 3000
TAIL = "ab12cd34"  # the engine's 8 random characters
CLIENT_BOUND = F.MAX_CLIENT_ID_BYTES


def sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def api_ids(client: str) -> list[tuple[str, str]]:
    """(external id, internal id) of every form vLLM's API server builds around CLIENT's
    ``X-Request-Id``: a completion, a child of an ``n > 1`` request, each other prefix, and an
    id it passed on bare."""
    out = [(f"cmpl-{client}-0", f"cmpl-{client}-0-{TAIL}"),
           (f"cmpl-{client}-3", f"2_cmpl-{client}-3-{TAIL}")]  # fmt: skip
    out += [(f"{p}{client}", f"{p}{client}-{TAIL}") for p in F.REQUEST_ID_PREFIXES if p != "cmpl-"]
    return [*out, (client, f"{client}-{TAIL}")]


# ------------------------------------------------------------------ the ids' forms


@pytest.mark.parametrize(("external", "internal"), api_ids(LONG))
def test_every_api_id_form_of_a_long_client_id_stores_the_digest_of_that_client_id(
    external: str, internal: str
) -> None:
    """A client's id of 3,000 characters in every form of API id: the stored client id (what
    ``client_id`` reads out of the external id as reported) is the digest of the client's id,
    what a query by that id computes; the internal id as reported is the external id as
    reported with the engine's part kept (spans and id rows bound it alike); both are within
    the index's bound, and a query by the full id computes them."""
    got_ext, got_int = F.bounded_external_id(external), F.bounded_internal_id(internal)
    assert F.client_id(got_ext) == F.bounded_client_id(LONG) == sha(LONG)
    assert got_int.endswith(got_ext + "-" + TAIL)
    assert got_int.removesuffix(got_ext + "-" + TAIL) in ("", "2_")
    assert max(len(got_ext.encode()), len(got_int.encode())) <= F.MAX_INDEXED_BYTES
    assert got_ext in F.request_id_forms(external)
    assert got_int in F.request_id_forms(internal)
    assert sha(LONG) in F.request_id_forms(LONG)


def test_a_client_id_at_its_bound_is_kept_and_one_byte_over_is_bounded() -> None:
    """The bound is on the client's id, in UTF-8 bytes: ``MAX_CLIENT_ID_BYTES`` is kept as it
    is, one byte more is its digest, in every API id form; so an API id exactly at the
    index's bound (2,048 bytes) and one byte over both store the digest of the client id
    inside (whose id is over the client bound), never the whole id's digest."""
    at, wide_at = "r" * CLIENT_BOUND, "é" * (CLIENT_BOUND // 2)  # the same bytes
    over, wide_over = at + "r", wide_at + "r"
    for client in (at, wide_at):
        assert F.bounded_client_id(client) == client
        for external, internal in api_ids(client):
            assert (F.bounded_external_id(external), F.bounded_internal_id(internal)) == (
                external, internal,
            )  # fmt: skip
    for client in (over, wide_over):
        assert F.bounded_client_id(client) == sha(client)
        for external, _ in api_ids(client):
            assert F.client_id(F.bounded_external_id(external)) == sha(client), external[:12]
    for size in (F.MAX_INDEXED_BYTES, F.MAX_INDEXED_BYTES + 1):
        external = "cmpl-" + "x" * (size - len("cmpl--0")) + "-0"
        assert len(external.encode()) == size
        client = F.client_id(external)
        assert F.bounded_external_id(external) == f"cmpl-{sha(client)}-0"


def test_a_client_cannot_take_another_clients_long_id_by_sending_its_digest() -> None:
    """A client sends ``X-Request-Id: sha256:<digest of another client's long id>`` (71
    characters, what that long id is stored as): its id is shaped like a digest, so it is
    stored as the digest of that text, never as the other client's id; and the suffix vLLM
    adds after a client's id is read back as such, never as part of a digest."""
    mimic = sha(LONG)
    for (ext_long, int_long), (ext_mimic, int_mimic) in zip(
        api_ids(LONG), api_ids(mimic), strict=True
    ):
        assert F.client_id(F.bounded_external_id(ext_mimic)) == sha(mimic) != sha(LONG)
        assert F.bounded_external_id(ext_mimic) != F.bounded_external_id(ext_long)
        assert F.bounded_internal_id(int_mimic) != F.bounded_internal_id(int_long)


def test_an_id_too_long_even_bounded_is_one_digest_within_the_bound() -> None:
    """What vLLM never adds, a suffix of thousands of characters after a short client id
    (``cmpl-a-<3,000 digits>``, an engine id with a 3,000-character tail), cannot be
    shortened around the client's id: the whole id is one digest, within the bound, found by
    the whole id. A suffix of the length vLLM adds is kept around the client's digest."""
    for value, bounded in (
        ("cmpl-a-" + "9" * 3000, F.bounded_external_id),
        ("cmpl-a-0-" + "x" * 3000, F.bounded_internal_id),
        ("3" * 3000 + "_cmpl-a-0-" + TAIL, F.bounded_internal_id),
    ):
        assert bounded(value) == sha(value)
        assert sha(value) in F.request_id_forms(value)
    assert F.bounded_external_id(f"cmpl-{LONG}-" + "9" * 3000) == sha(f"cmpl-{LONG}-" + "9" * 3000)
    assert F.bounded_external_id(f"cmpl-{LONG}-" + "9" * 12) == f"cmpl-{sha(LONG)}-" + "9" * 12


PREFIX = st.sampled_from(["", "cmpl-", *F.REQUEST_ID_PREFIXES])
SUFFIX = st.sampled_from(["", "-0", "-17"])


@settings(max_examples=300, deadline=None)
@given(
    PREFIX,
    st.text(min_size=1, max_size=40) | st.builds(sha, st.text(max_size=8)),
    st.integers(0, 2 * F.MAX_INDEXED_BYTES),
    SUFFIX,
)
def test_the_client_id_stored_is_always_what_a_query_by_it_computes(
    prefix: str, head: str, pad: int, suffix: str
) -> None:
    """For any client id (short, at the bounds, over them, shaped like a digest), in any
    API id form: the client id stored (read out of the external id as reported) is
    ``bounded_client_id`` of the client id read out of the external id as sent, the
    engine's id as reported is the external one as reported with its tail kept, and neither
    is over the index's bound."""
    client = head + "q" * pad if pad else head
    external = prefix + client + suffix
    reported = F.bounded_external_id(external)
    assert len(reported.encode("utf-8", "surrogatepass")) <= F.MAX_INDEXED_BYTES
    assert F.client_id(reported) == F.bounded_client_id(F.client_id(external))
    if not re.match(r"\d+_", external):  # else read as an n > 1 request's child
        assert F.bounded_internal_id(f"{external}-{TAIL}") == f"{reported}-{TAIL}"


# ------------------------------------------------------------------ the agent, the store


def _records(
    directory: Path, records: list[dict[str, object]]
) -> tuple[ProcessEvidence, ProcessIdentity]:
    directory.mkdir()
    (directory / "bindings.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    pid = 20 if directory.name == "worker" else 10
    ident = ProcessIdentity(pid, pid, 1, pid * 10, 0.0, "boot", "python", (), "")
    probe = ProbeState(
        directory=str(directory), pid=pid, start_ticks=pid * 10, mode="", shared=False,
        roles=[], runner=None, steps=StepEvidence(0, 0, 0, 0, 0, 0, 0), hooks=(), files=(),
        errors=[], error_count=0, manifest_digest="",
    )  # fmt: skip
    return ProcessEvidence(ident, directory.name, None, probe, str(directory)), ident


def completion(client: str) -> tuple[str, str, str]:
    """(CLIENT, its completion's external id, its internal id)."""
    return client, f"cmpl-{client}-0", f"cmpl-{client}-0-{TAIL}"


# (client's X-Request-Id, external id, internal id) the agent reads, one request each
SERVED = [
    completion(LONG),
    ("c" * 2500, f"chatcmpl-{'c' * 2500}", f"chatcmpl-{'c' * 2500}-{TAIL}"),
    ("n" * 2500, f"cmpl-{'n' * 2500}-1", f"1_cmpl-{'n' * 2500}-1-{TAIL}"),  # a child
    ("g" * 2500, f"generate-tokens-{'g' * 2500}", f"generate-tokens-{'g' * 2500}-{TAIL}"),
    completion("a" * CLIENT_BOUND),
    completion("b" * (CLIENT_BOUND + 1)),
    completion(sha(LONG)),  # mimics LONG's id as stored
]

ENGINE_ONLY = f"{'e' * 2500}-{TAIL}"  # an engine's request no API server named


def _collect(tmp_path: Path) -> tuple[tuple[RequestSpan, ...], tuple[RequestId, ...]]:
    """What the agent reports of SERVED, read from real bindings files: the worker's spans
    (first step 10 + i) and the API server's id records."""
    reqs: list[dict[str, object]] = [
        {"k": "req", "id": internal, "s0": 10 + i, "s1": 12 + i, "n": 3, "tok": 3, "t0": 1,
         "t1": 2, "f0": 0, "f1": 0, "hooks": {}, "end": "finished"}
        for i, (_, _, internal) in enumerate(SERVED)
    ]  # fmt: skip
    exts: list[dict[str, object]] = [
        {"k": "ext", "id": internal, "ext": external, "t": 1_000_000_000}
        for _, external, internal in SERVED
    ]
    worker, _ = _records(tmp_path / "worker", reqs)
    api, _ = _records(tmp_path / "api", exts)
    return Bindings().collect([worker, api], JournalCache())


def test_the_agent_reports_a_long_requests_ids_as_the_queries_derive_them(tmp_path: Path) -> None:
    """The agent's reports of requests whose ids are long, a chat id, a child of an ``n > 1``
    request, a client id at the bound and one byte over, and one mimicking a long id's
    digest: the span's internal id is the id row's (the two still meet), the id row's client
    id is what a query by the client's id computes, and a query by the full API or engine id
    computes what was reported."""
    spans, ids = _collect(tmp_path)
    assert len(spans) == len(ids) == len(SERVED)
    for span, rid, (client, external, internal) in zip(spans, ids, SERVED, strict=True):
        assert span.internal_id == rid.internal_id
        assert F.client_id(rid.external_id) == F.bounded_client_id(client)
        assert rid.external_id in F.request_id_forms(external)
        assert rid.internal_id in F.request_id_forms(internal)
        assert max(len(rid.external_id), len(rid.internal_id)) <= F.MAX_INDEXED_BYTES
    assert ids[4].external_id == SERVED[4][1]  # at the bound: as it is
    assert F.client_id(ids[6].external_id) == sha(sha(LONG))  # the mimic: its own digest


@pytest.fixture
def stored(tmp_path: Path) -> Iterator[tuple[Store, Path]]:
    """A real SQLite store holding, as one ledgered batch, what the agent reported of SERVED
    and the span of ENGINE_ONLY (no API server: no id row); in a second batch, one more long
    request as an older agent reported it (each id as the digest of the whole id)."""
    spans, ids = _collect(tmp_path)
    alone = RequestSpan(spans[0].process, F.bounded_internal_id(ENGINE_ONLY), 80, 81, 2, 2, 1.0,
                        2.0, "m", "m", "R")  # fmt: skip
    old = f"cmpl-{'o' * 2500}-0"
    old_span = RequestSpan(spans[0].process, F.bounded_id(f"{old}-{TAIL}"), 90, 91, 2, 2, 1.0,
                           2.0, "m", "m", "R")  # fmt: skip
    old_id = RequestId(ids[0].process, F.bounded_id(f"{old}-{TAIL}"), F.bounded_id(old), 1.0)
    db = tmp_path / "v.sqlite3"
    st_ = Store(db)
    body = wire.report_to_bytes(TargetReport("ag", "t", 1, "", time.time(), ()))
    assert st_.save_report(StoredReport("ag", 1, "t", 1.0, body), {}, (), [*spans, alone], ids)
    assert st_.save_report(StoredReport("ag", 2, "t", 2.0, body), {}, (), [old_span], [old_id])
    try:
        yield st_, db
    finally:
        st_.close()


def test_a_seals_request_check_counts_each_long_id_as_the_request_it_names(
    stored: tuple[Store, Path],
) -> None:
    """The seal's ``--requests`` lookup (``Store.request_steps``, ledgered rows only) on a
    real SQLite store: each client's id, long, a chat id, at the bound and over it, is bound
    to its own request's steps, and to no other; the id mimicking a long id's digest only
    to its own request (not to LONG's), and LONG not to the mimic's."""
    st_, _ = stored
    clients = [client for client, _, _ in SERVED]
    got = st_.request_steps(clients)
    assert {c: got[c] for c in clients} == {
        c: [("t", "boot", 20, 200, 10 + i)] for i, c in enumerate(clients)
    }


def test_a_long_request_is_found_by_each_of_its_ids_and_an_older_agents_too(
    stored: tuple[Store, Path],
) -> None:
    """``audit request`` on the same store: each request by its client's id, its full API
    id and its full engine id, that request alone, as reported (its internal id the reported
    one); LONG's ids never find the mimic's request. An engine's span with no id row is found
    by its full engine id; a long request an older agent reported (whole-id digests) by its
    full API and engine id.

    (The mimic's ids, ``sha256:<digest of LONG>`` and the API and engine ids around it, are
    also what LONG's ids are stored as, and a query is looked up as stored too (an id
    copied from an answer), so they list LONG's request beside the mimic's own, as a client
    sending LONG's id itself would be listed. The seal's check, which looks a client's id
    up only as an agent stores it, counts the mimic's alone.)"""
    _, path = stored
    db = open_database(path, read_only=True)
    try:
        for i, (client, external, internal) in enumerate(SERVED):
            reported = (F.bounded_internal_id(internal), 10 + i)
            for query in (client, external, internal):
                got = [(s.internal_id, s.first_step) for s in find_request(db, query)]
                if client == sha(LONG):
                    assert reported in got, got
                else:
                    assert got == [reported], (query[:20], got)
        assert [s.first_step for s in find_request(db, ENGINE_ONLY)] == [80]
        old = f"cmpl-{'o' * 2500}-0"
        for query in (old, f"{old}-{TAIL}"):
            assert [s.first_step for s in find_request(db, query)] == [90]
    finally:
        db.close()


# ------------------------------------------------------------------ over the wire


@pytest.fixture(scope="module")
def verifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with lab(tmp_path_factory.mktemp("long")) as L:
        yield L


def test_a_long_chat_id_is_found_by_the_clients_id_over_the_wire(verifier: Lab) -> None:
    """A chat request (``chatcmpl-<id>``) whose X-Request-Id is 2,500 characters, reported as
    the agent reports it: ``verifier audit request <id>`` finds it from the database and over
    the wire, the signed answer checked with the verifier's key (its records name the
    bounded ids, and the check takes the query as the verifier looked it up)."""
    client = "w" * 2500
    a = procs_of("boot-a")
    internal = F.bounded_internal_id(f"chatcmpl-{client}-{TAIL}")
    external = F.bounded_external_id(f"chatcmpl-{client}")
    verifier.report("agent-a", "a", a, lambda m: add_request(m, a, internal, external))
    local = verifier.audit("request", client)
    remote = verifier.audit_wire("request", client, "--json")
    assert local.returncode == 0, local.stderr
    assert remote.returncode == 0, remote.stderr
    assert [r["request"] for r in json.loads(remote.stdout)] == [internal]
