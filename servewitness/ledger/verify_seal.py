"""Checking a sealed measurement window (:mod:`servewitness.ledger.seal`) offline, with the
verifier's public key alone (and optionally the results file and a checkpoint kept elsewhere).

Checked, in order (each failure is named; later checks still run where they can):

1. the DSSE envelope is signed by the key given (another key's signature is named as such);
2. the payload is an in-toto Statement of the measurement-window predicate type, and its
   gate decision agrees with the seal content: same run, policy digest and verifier key id
   (the key given), ``verificationResult`` PASS exactly when ``held``, the same findings, and
   the subject is the sealed results' name and sha256; the count of the other windows
   (``other_windows``) is well formed, and (with 4) taken over the ledger before the seal
   entry; the seal is not dated before its open (any seal, an older one too), its
   ``elapsed`` recomputes from the verifier's clocks recorded at each end
   (``verifier_clock``) and the findings they call for are the seal's
   (``policy/window_ends.elapsed``); and a held seal's own evidence shows the same processes
   at both ends, each process that runs steps having stepped (``window_ends.same_processes``,
   ``progress``: derived again, so a held seal that should not have held fails). What an
   older seal lacks for these is said under ``not_checked``;
3. the checkpoint note is signed by the same key;
4. the open and seal ledger entries: each hash recomputes from its fields, their kinds and
   refs are ``window``/``seal`` of this window id, their subjects recompute from the
   statement's ``window`` and ``seal`` contents (``chain.canonical``), the statement's ledger
   binding names exactly these entries, the seal names this open entry, and both are included
   in the checkpoint's tree (RFC 9162 inclusion proofs);
5. with ``results``: the file's bytes hash to the subject (and its size is the sealed size);
   with ``requests`` (the harness's request ids): the seal checked requests, and its
   ``ids_sha256`` is the digest of exactly those ids (``model.request_ids_sha256``);
6. with ``old_note`` (a checkpoint kept elsewhere, signed by the same key): the seal's
   checkpoint extends it, when the seal carries a consistency proof from that size (or the
   sizes are equal); otherwise that is reported as not checked.

``ok`` (exit 0) needs every check to pass AND the window to have held.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servewitness.ledger import chain, dsse, merkle, note
from servewitness.ledger import statement as st
from servewitness.ledger.bundle import Fields, LedgerEntry
from servewitness.ledger.errors import BundleCorrupt, WrongKey
from servewitness.ledger.keys import Ed25519PublicKey, key_id
from servewitness.ledger.seal import OTHER_OUTCOMES
from servewitness.ledger.verify_bundle import _entry, _hex_list
from servewitness.wire import seals


class Unreadable(Exception):
    """The seal file is not a seal document at all (exit 3)."""


@dataclass
class SealCheck:
    keyid: str
    verified: bool = False  # every check that ran passed
    held: bool | None = None  # what the (verified or not) statement says
    run: str | None = None
    window_id: str | None = None
    policy_digest: str | None = None  # the policy the window was judged by, as the seal says
    results: dict[str, Any] | None = None
    requests: dict[str, Any] | None = None  # the seal's requests summary (None: not checked)
    # the windows the ledger held beside this one at the seal (None: the seal predates them)
    other_windows: dict[str, Any] | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    ledger_range: list[int] | None = None
    checkpoint_size: int | None = None
    checks: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verified and self.held is True

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "verified": self.verified,
            "held": self.held,
            "keyid": self.keyid,
            "run": self.run,
            "window_id": self.window_id,
            "policy_digest": self.policy_digest,
            "results": self.results,
            "requests": self.requests,
            "other_windows": self.other_windows,
            "findings": self.findings,
            "ledger_range": self.ledger_range,
            "checkpoint_size": self.checkpoint_size,
            "checks": self.checks,
            "problems": self.problems,
            "not_checked": self.not_checked,
        }


def read(data: bytes) -> dict[str, Any]:
    """The seal document in DATA; :class:`Unreadable` when it is not one."""
    try:
        return seals.document(data)
    except seals.SealUnreadable as e:
        raise Unreadable(str(e)) from None


class _Check:
    def __init__(self, key: Ed25519PublicKey) -> None:
        self.key = key
        self.r = SealCheck(keyid=key_id(key))

    def fail(self, what: str) -> None:
        self.r.problems.append(what)

    def run(
        self,
        doc: Mapping[str, Any],
        results: Path | None,
        old_note: bytes | None,
        requests: tuple[str, ...] | None = None,
        policy: str | None = None,
    ) -> None:
        pred, subjects = self.statement(doc.get("envelope"))
        self.pinned(policy)
        root_size = self.checkpoint(doc.get("checkpoint"))
        if pred is not None:
            self.entries(doc, pred, root_size)
            self.subject_file(subjects, pred, results)
            self.requests_of(pred, requests)
        if old_note is not None:
            self.anchored(doc, old_note, root_size)
        self.r.verified = not self.r.problems

    # 1-2 -----------------------------------------------------------------------------------
    def statement(  # noqa: PLR0911 - one return per way it can fail
        self, env: object
    ) -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
        try:
            v = dsse.verify(env, self.key, "envelope")
        except WrongKey as e:
            self.fail(f"the seal is not signed by the key given: {e.problem}")
            return None, []
        except BundleCorrupt as e:
            self.fail(f"the seal's signature does not verify: {e.problem}")
            return None, []
        self.r.checks.append(f"envelope signed by key {self.r.keyid[:16]}")
        if v.payload_type != st.PAYLOAD_TYPE:
            self.fail(f"payloadType {v.payload_type!r}, not {st.PAYLOAD_TYPE}")
            return None, []
        try:
            s = st.parse(v.payload)
        except ValueError as e:
            self.fail(f"the statement: {e}")
            return None, []
        if s.predicate_type != st.MEASUREMENT_WINDOW:
            self.fail(f"predicateType {s.predicate_type!r}, not {st.MEASUREMENT_WINDOW}")
            return None, []
        p = s.predicate
        w, sl = p.get("window"), p.get("seal")
        if not isinstance(w, dict) or not isinstance(sl, dict):
            self.fail("the predicate lacks the window's or the seal's content")
            return None, []
        self.r.run, self.r.window_id = sl.get("run"), sl.get("window_id")
        digest = sl.get("policy_digest")
        self.r.policy_digest = digest if isinstance(digest, str) else None
        self.r.held = sl.get("held") is True
        self.r.results = sl.get("results") if isinstance(sl.get("results"), dict) else None
        self.r.findings = list(sl.get("findings") or [])
        self.shape(p, w, sl, s.subjects)
        self.others(sl)
        self.ends(w, sl)
        return p, s.subjects

    def pinned(self, policy: str | None) -> None:
        """With POLICY (a ``sha256:`` digest the auditor holds: the pre-registered policy),
        the window must have been judged by exactly that policy; without it, say so: a run
        name alone lets the lab register any policy under it."""
        if policy is None:
            self.r.not_checked.append(
                "which policy judged the window: the seal names "
                f"{self.r.policy_digest or 'none'}; give --policy to pin the one registered"
            )
        elif self.r.policy_digest != policy:
            self.fail(
                f"the window was judged by policy {self.r.policy_digest}, not by the policy "
                f"given ({policy})"
            )
        else:
            self.r.checks.append(f"judged by the policy given ({policy})")

    def shape(
        self,
        p: Mapping[str, Any],
        w: Mapping[str, Any],
        sl: Mapping[str, Any],
        subjects: list[tuple[str, str]],
    ) -> None:
        before = len(self.r.problems)
        for problem in seals.agreement(p, w, sl):  # the client's reading makes these too
            self.fail(problem)
        if sl.get("verifier_key_id") != self.r.keyid:
            self.fail("the statement names another verifier key than the one that signed it")
        res = sl.get("results")
        if not isinstance(res, dict) or subjects != [(res.get("name"), res.get("sha256"))]:
            self.fail("the statement's subject is not the sealed results file")
        if len(self.r.problems) == before:
            self.r.checks.append(
                "statement: measurement-window predicate; decision, window and seal agree; "
                "subject is the sealed results"
            )

    def others(self, sl: Mapping[str, Any]) -> None:
        """The seal's count of the other windows (``server/window_rows.other_windows``): read,
        its shape checked; that its ledger size is the seal entry's is checked with the
        entries."""
        if "other_windows" not in sl:
            self.r.not_checked.append(
                "which other windows the verifier had opened when it sealed this one: the "
                "seal predates that count (a later seal counts them)"
            )
            return
        c = sl["other_windows"]
        if not other_windows_shape(c):
            self.fail("the seal's count of the other windows is malformed")
            return
        self.r.other_windows = c

    def ends(self, w: Mapping[str, Any], sl: Mapping[str, Any]) -> None:
        """The window's times, processes and steps derived again from the seal's content
        (``policy/window_ends.recheck``)."""
        from servewitness.policy.window_ends import recheck

        got = recheck(w, sl)
        self.r.problems += got.problems
        self.r.checks += got.checks
        self.r.not_checked += got.not_checked

    # 3 -------------------------------------------------------------------------------------
    def checkpoint(self, text: object) -> tuple[bytes, int] | None:
        if not isinstance(text, str):
            self.fail("no checkpoint note")
            return None
        try:
            cp = note.verify(text, self.key, "checkpoint")
        except (WrongKey, BundleCorrupt) as e:
            self.fail(f"the checkpoint note: {e.problem}")
            return None
        self.r.checkpoint_size = cp.size
        self.r.checks.append(f"checkpoint note signed by the key: {cp.size} entries")
        return cp.root, cp.size

    # 4 -------------------------------------------------------------------------------------
    def entries(
        self, doc: Mapping[str, Any], p: Mapping[str, Any], root_size: tuple[bytes, int] | None
    ) -> None:
        before = len(self.r.problems)
        ents, proofs = doc.get("entries"), doc.get("proofs")
        if not isinstance(ents, dict) or not isinstance(proofs, dict):
            self.fail("the seal lacks its ledger entries or their proofs")
            return
        got: dict[str, LedgerEntry] = {}
        for name, kind, content in (("open", "window", p["window"]), ("seal", "seal", p["seal"])):
            e = self.entry(name, kind, content, ents, proofs, root_size, p["seal"].get("window_id"))
            if e is not None:
                got[name] = e
        binding = p.get("ledger")
        if len(got) == 2:
            o, s = got["open"], got["seal"]
            want = {
                "range": [o.seq, s.seq],
                "open": {"seq": o.seq, "hash": o.hash},
                "seal": {"seq": s.seq, "hash": s.hash},
            }
            if binding != want:
                self.fail("the statement's ledger binding does not name these entries")
            if p["seal"].get("open_entry") != want["open"]:
                self.fail("the seal closes another window entry")
            if not o.seq < s.seq:
                self.fail("the seal entry does not come after the window's")
            counted = self.r.other_windows
            if counted is not None and counted["ledger_size"] != s.seq - 1:
                self.fail(
                    f"the seal counts the other windows of a ledger of {counted['ledger_size']} "
                    f"entries, not of the {s.seq - 1} before its own entry"
                )
            self.r.ledger_range = [o.seq, s.seq]
        if len(self.r.problems) == before:
            self.r.checks.append(
                "open and seal entries: hashes recompute, subjects recompute from the "
                "statement, both included in the signed checkpoint"
            )

    def entry(  # noqa: PLR0917 - one entry's check needs each of these
        self,
        name: str,
        kind: str,
        content: object,
        ents: Mapping[str, Any],
        proofs: Mapping[str, Any],
        root_size: tuple[bytes, int] | None,
        window_id: object,
    ) -> LedgerEntry | None:
        """Entry NAME: its hash, kind and ref, its subject from CONTENT, its inclusion."""
        try:
            e = _entry(ents.get(name), f"entries.{name}")
        except BundleCorrupt as ex:
            self.fail(f"the {name} entry: {ex.problem}")
            return None
        if chain.entry_hash(e.fields()) != e.hash:
            self.fail(f"the {name} entry's fields do not match its hash")
        if e.kind != kind or e.ref != window_id:
            self.fail(f"the {name} entry is not the {kind} entry of this window")
        try:
            text = chain.canonical(content)
        except ValueError:
            text = ""
        subject = chain.window_subject(text) if kind == "window" else chain.seal_subject(text)
        if subject != e.subject:
            self.fail(
                f"the statement's {kind} content does not recompute the {name} entry's "
                "subject (the content was edited)"
            )
        if root_size is not None:
            try:
                path = _hex_list(proofs.get(name), f"proofs.{name}")
            except BundleCorrupt as ex:
                self.fail(f"the {name} entry's proof: {ex.problem}")
                return e
            root, size = root_size
            if not merkle.verify_inclusion(e.leaf, e.seq - 1, size, path, root):
                self.fail(f"the {name} entry (seq {e.seq}) is not in the checkpoint's tree")
        return e

    # 5 -------------------------------------------------------------------------------------
    def subject_file(
        self, subjects: list[tuple[str, str]], p: Mapping[str, Any], results: Path | None
    ) -> None:
        if results is None:
            self.r.not_checked.append("the results file's bytes (give --results FILE)")
            return
        h, size = hashlib.sha256(), 0
        try:
            with results.open("rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
                    size += len(chunk)
        except OSError as e:
            raise Unreadable(f"cannot read the results file {results}: {e}") from e
        sealed = [d for _, d in subjects]
        if h.hexdigest() not in sealed:
            self.fail(
                f"{results}: its sha256 {h.hexdigest()[:16]} is not the sealed "
                f"{(sealed or ['?'])[0][:16]}: the results changed after sealing (or are others)"
            )
            return
        res = p["seal"].get("results") or {}
        if Fields(res, "results").has("size") and res.get("size") != size:
            self.fail(f"{results}: {size} bytes, the seal says {res.get('size')}")
            return
        self.r.checks.append(f"results file {results.name}: sha256 and size match the subject")

    def requests_of(self, p: Mapping[str, Any], ids: tuple[str, ...] | None) -> None:
        """The seal's requests check against the harness's own ids, when given."""
        from servewitness.model import request_ids_sha256 as ids_sha256

        req = p["seal"].get("requests")
        self.r.requests = req if isinstance(req, dict) else None
        if ids is None:
            if self.r.requests is None:
                self.r.not_checked.append(
                    "whether the measured requests were served by the window's processes: "
                    "the seal was made without request ids (seal --requests)"
                )
            else:
                self.r.not_checked.append(
                    "that the seal's request ids are the harness's (give --requests FILE)"
                )
            return
        if self.r.requests is None:
            self.fail("--requests: the seal did not check requests (it was made without ids)")
            return
        mine = ids_sha256(ids)
        if self.r.requests.get("ids_sha256") != mine or self.r.requests.get("sent") != len(ids):
            self.fail(
                f"--requests: the seal checked {self.r.requests.get('sent')} ids with digest "
                f"{str(self.r.requests.get('ids_sha256'))[:16]}, not these {len(ids)} "
                f"({mine[:16]}): it covers other requests"
            )
            return
        self.r.checks.append(
            f"request ids: the seal checked these {len(ids)} "
            f"({self.r.requests.get('served')} served by the window's processes)"
        )

    # 6 -------------------------------------------------------------------------------------
    def anchored(  # noqa: PLR0911 - one return per outcome
        self, doc: Mapping[str, Any], old_note: bytes, root_size: tuple[bytes, int] | None
    ) -> None:
        try:
            old = note.verify(old_note, self.key, "--checkpoint")
        except (WrongKey, BundleCorrupt) as e:
            self.fail(f"--checkpoint: {e.problem}")
            return
        if root_size is None:
            self.not_anchored(old.size, "the seal's own checkpoint did not verify")
            return
        root, size = root_size
        if old.size == size:
            if old.root != root:
                self.fail(f"--checkpoint has size {size} with another root: the log forked")
                return
            self.r.checks.append(f"the seal's checkpoint is the one kept elsewhere ({size})")
            return
        if old.size > size:
            self.not_anchored(old.size, f"it is newer than the seal's checkpoint ({size})")
            return
        cons = doc.get("consistency")
        if not isinstance(cons, dict) or not isinstance(cons.get("note"), str):
            self.not_anchored(old.size, "the seal carries no consistency proof")
            return
        try:
            mid = note.verify(cons["note"], self.key, "consistency.note")
            path = _hex_list(cons.get("proof"), "consistency.proof")
        except (WrongKey, BundleCorrupt) as e:
            self.fail(f"the seal's consistency proof: {e.problem}")
            return
        if not merkle.verify_consistency(mid.size, size, mid.root, root, path):
            self.fail(f"the seal's checkpoint does not extend its earlier one (size {mid.size})")
            return
        if mid.size != old.size:
            self.not_anchored(old.size, f"the seal proves consistency from size {mid.size} only")
            return
        if mid.root != old.root:
            self.fail(f"--checkpoint has size {old.size} with another root: the log forked")
            return
        self.r.checks.append(f"the seal's checkpoint extends the one kept elsewhere ({old.size})")

    def not_anchored(self, old_size: int, why: str) -> None:
        """A --checkpoint the seal alone cannot be checked against: a failure, not a pass
        (asked to check against a note kept elsewhere, an unchecked one must not exit 0)."""
        self.fail(
            f"cannot check the seal against --checkpoint (size {old_size}) from the seal alone: "
            f"{why}; prove the ledger extends it with `verifier audit consistency --from NOTE "
            "--key KEY --verifier ADDR` (or `--db DB`), then check the seal against that "
            "command's newer note"
        )


def other_windows_shape(c: object) -> bool:
    """C is ``{ledger_size, ledger: COUNTS, run: COUNTS}`` of non-negative integers, each
    COUNTS' outcomes adding up to its ``opened``, the run's inside the ledger's."""

    def nat(x: object) -> bool:
        return type(x) is int and x >= 0

    if not isinstance(c, dict) or set(c) != {"ledger_size", "ledger", "run"}:
        return False
    scopes = [c["ledger"], c["run"]]
    if not nat(c["ledger_size"]) or not all(
        isinstance(x, dict) and set(x) == {"opened", *OTHER_OUTCOMES} and all(map(nat, x.values()))
        for x in scopes
    ):
        return False
    return (
        all(x["opened"] == sum(x[k] for k in OTHER_OUTCOMES) for x in scopes)
        and all(c["run"][k] <= c["ledger"][k] for k in ("opened", *OTHER_OUTCOMES))
        and c["ledger"]["opened"] < c["ledger_size"]  # its own window entry is among them
    )


def check_seal(
    data: bytes,
    key: Ed25519PublicKey,
    results: Path | None = None,
    old_note: bytes | None = None,
    requests: tuple[str, ...] | None = None,
    *,
    policy: str | None = None,
) -> SealCheck:
    """Check seal document DATA with KEY (module docstring); with POLICY (``sha256:<hex>``)
    the window must have been judged by that policy. Raises :class:`Unreadable` when DATA is
    not a seal document or RESULTS cannot be read; every other problem is reported."""
    doc = read(data)
    c = _Check(key)
    c.run(doc, results, old_note, requests, policy)
    return c.r
