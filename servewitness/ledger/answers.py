"""Checking an audit answer received over the wire (``verifier audit request|file|run
--verifier``), offline, with the verifier's public key alone.

An answer is a signed export bundle (:mod:`servewitness.ledger.export` ``answer``) and the same
checkpoint as a C2SP signed note. It is accepted only when:

1. the bundle verifies (:func:`servewitness.ledger.verify_bundle.check_bundle`): the checkpoint
   and every statement signed by the key, every entry included in the checkpoint's tree
   (inclusion proofs), every content recomputing its entry's subject;
2. the note verifies with the key and names the same tree (size and root);
3. the answer is about the query asked (a valid answer to another query, replayed or swapped
   in transit, is refused) and every record printed comes from signed statements whose
   ledgered content backs it: a request's record is a signed summary beside the batches of
   bindings that hold it; a file's sightings must list the queried file in the ledgered
   manifest, and each process's role, rank and container must be what the ledgered report
   says; a run's registration and verdicts are the ledgered rows themselves.

Anything else raises :class:`AnswerRefused` (exit 1) naming what failed.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from servewitness import wire
from servewitness.errors import CheckFailed
from servewitness.ledger import note
from servewitness.ledger.bindings import client_id
from servewitness.ledger.errors import BundleCorrupt, WrongKey
from servewitness.ledger.keys import Ed25519PublicKey
from servewitness.ledger.verify_bundle import check_bundle
from servewitness.wire import fields as F


class AnswerRefused(CheckFailed):
    """An answer from the verifier that does not verify offline (exit 1)."""


@dataclass
class CheckedAnswer:
    """A verified answer: its records (as the ``--db`` path's ``--json`` prints them, where
    they exist there) and the signed checkpoint they are included in."""

    kind: str
    query: str
    records: list[dict[str, Any]]
    size: int
    root: str
    at_unix: float
    verifier_id: str
    checks: list[str] = field(default_factory=list)


def _payload(envelope: Any) -> dict[str, Any]:
    got = json.loads(base64.b64decode(envelope["payload"]))
    return got if isinstance(got, dict) else {}


def check_answer(
    kind: str, query: str, bundle: bytes, note_text: str, key: Ed25519PublicKey
) -> CheckedAnswer:
    """The records of an answer to KIND (request, file, run) QUERY, once everything above
    holds; :class:`AnswerRefused` otherwise."""
    r = check_bundle(bundle, key)
    if not r.ok:
        where = f" at {r.location}" if r.location else ""
        raise AnswerRefused(f"the verifier's answer does not verify: {r.problem}{where}")
    try:
        signed = note.verify(note_text, key, "the answer's checkpoint note")
    except (BundleCorrupt, WrongKey) as e:
        raise AnswerRefused(f"the answer's checkpoint note does not verify: {e}") from None
    if (signed.size, signed.root_hex) != (r.size, r.root):
        raise AnswerRefused(
            f"the checkpoint note (size {signed.size}) is not the bundle's (size {r.size})"
        )
    try:
        data = json.loads(bundle)
        pairs = [
            (_payload(s), c) for s, c in zip(data["statements"], data["contents"], strict=True)
        ]
        records = {"request": _requests, "file": _files, "run": _runs}[kind](query, pairs)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise AnswerRefused(
            f"the answer's statements are not what an audit answer holds: {e!r}"
        ) from None
    if not records:
        raise AnswerRefused(f"the answer holds nothing about {kind} {query!r}")
    checks = [*r.checks, f"checkpoint note signed by the key: size {signed.size}"]
    checks.append(f"every record is about {kind} {query!r} and backed by ledgered content")
    return CheckedAnswer(kind, query, records, r.size, r.root, r.at_unix, r.verifier_id, checks)


Pair = tuple[dict[str, Any], dict[str, Any]]  # (in-toto statement, its content)


def _requests(query: str, pairs: list[Pair]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    # The query as the verifier looked it up: an id too long to report is stored bounded.
    forms = set(F.request_id_forms(query))
    for stmt, content in pairs:
        if content["kind"] != "bindings":
            continue
        d = stmt["predicate"]["details"]
        names = {d["request"], *d["external_ids"], *(client_id(e) for e in d["external_ids"])}
        if names.isdisjoint(forms):
            raise AnswerRefused(f"a statement is about request {d['request']!r}, not {query!r}")
        if content["fields"]["target"] != stmt["predicate"]["target"]:
            # A record rests on its own target's batches only (an id row of one target never
            # names another target's request).
            raise AnswerRefused(
                f"a record of target {stmt['predicate']['target']!r} rests on a batch of "
                f"target {content['fields']['target']!r}"
            )
        record = {"target": stmt["predicate"]["target"], **d}
        if record not in out:
            out.append(record)
    return out


def _files(query: str, pairs: list[Pair]) -> list[dict[str, Any]]:
    reports: dict[tuple[str, float], Any] = {}
    for _, content in pairs:
        if content["kind"] == "report":
            f = content["fields"]
            body = base64.b64decode(f["body_b64"])
            try:
                reports[(f["target"], float(f["received"]))] = wire.report_from_bytes(body)
            except wire.WireError as e:
                raise AnswerRefused(f"a ledgered report in the answer does not read: {e}") from None
    out: list[dict[str, Any]] = []
    for stmt, content in pairs:
        if content["kind"] != "manifest":
            continue
        d = stmt["predicate"]["details"]
        if d.get("query") != query:
            raise AnswerRefused(f"a statement answers file {d.get('query')!r}, not {query!r}")
        listed = {f["path"]: f.get("sha256") for f in json.loads(content["fields"]["files_json"])}
        for s in d["sightings"]:
            _file_matches(query, s, listed)
            _process_matches(s, reports.get((s["target"], float(s["last_unix"]))))
            out.append(s)
    return out


def _file_matches(query: str, s: dict[str, Any], listed: dict[str, Any]) -> None:
    """Sighting S names QUERY, and its manifest (ledgered) lists that path with that hash."""
    path, sha = s["path"], s["sha256"]
    if not (query in (sha, path) or path.endswith("/" + query.lstrip("/"))):
        raise AnswerRefused(f"a sighting names {path} ({sha}), which is not {query!r}")
    if path not in listed or listed[path] != sha:
        raise AnswerRefused(f"the ledgered manifest does not list {path} with sha256 {sha}")


def _process_matches(s: dict[str, Any], report: Any) -> None:
    """Sighting S's process, role, rank and container are what its last report says."""
    where = f"pid {s['pid']} of {s['target']}"
    if report is None:
        raise AnswerRefused(f"{where}: the answer holds no ledgered report that shows it")
    for p in report.processes:
        k = p.key
        if (k.pid, k.start_ticks, p.manifest_digest) != (
            s["pid"], s["start_ticks"], s["manifest_digest"]
        ):  # fmt: skip
            continue
        said = (p.role, p.rank, p.container_id)
        if said != (s["role"], s["rank"], s["container_id"]):
            claimed = (s["role"], s["rank"], s["container_id"])
            raise AnswerRefused(f"{where}: the answer says {claimed}; its ledgered report: {said}")
        return
    raise AnswerRefused(f"{where}: its ledgered report does not show it with that manifest")


def _runs(query: str, pairs: list[Pair]) -> list[dict[str, Any]]:
    run: dict[str, Any] | None = None
    history: list[list[Any]] = []
    for _, content in pairs:
        f = content["fields"]
        if content["kind"] == "run":
            if f["name"] != query:
                raise AnswerRefused(f"the answer is about run {f['name']!r}, not {query!r}")
            run = {"name": f["name"], "policy_digest": f["digest"], "source": f["source"],
                   "created_unix": f["created"]}  # fmt: skip
        elif content["kind"] == "verdict":
            if f["run"] != query:
                raise AnswerRefused(f"a verdict of run {f['run']!r} is not {query!r}'s")
            history.append([f["at"], f["verdict"]])
    if run is None:
        return []
    return [{**run, "history": history}]
