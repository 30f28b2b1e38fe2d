"""Attacks by a writer of the verifier's database on the gate and its seals (found 2026-12-07
by an outside tester, second pass; each closed, the "Gets" of each docstring being what it got
before: the live verifier took stored policies, manifests, followed reports and seal rows at
the store's word).

The tester read the documentation only, then attacked through the public interfaces: a real
``verifier serve`` subprocess over mutual TLS (the lab of ``tests/test_gate_time_attacks``:
a lab CA, one agent certificate per target, a harness certificate), real gRPC, a real SQLite
database and ledger, and the real ``verifier audit verify-seal`` / ``audit verify`` CLI. No
vLLM is booted: reports carry the processes the policy-engine tests use.

The attacker here is the "auditor-facing liar" of the brief: whoever can write the
verifier's SQLite file (the database's owner, a backup restored by an operator, a sidecar
with the volume mounted), without the verifier's signing key. The product's promise: a held
seal that ``verify-seal --policy`` passes means the promised policy judged authenticated,
fresh evidence, and edits to the store are detected.

Each test builds the attack for real and asserts what a sound product does; its docstring
says what the attack got. What closed them: a stored policy judged only if its text is the
one its digest names (``Evaluator.policy``); stored files taken only if they derive their
digest (``Evaluator._manifest``); a followed report taken only with its ledger entry and a
receipt a verifier vouched for (``server/follow.py``, ``server/vouch.py``); a window sealed
if its ledger says so, and sealed only if its opening is what its ledger entry records
(``window_rows.get_window``); evidence without a ledger entry never holds a seal
(``window.evidence_unledgered``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import ProcessKey, ProcessReport, TargetReport, manifest_digest
from tests.helpers import PRISTINE_VLLM_CPU, verifier_cli
from tests.test_gate_time_attacks import (
    EVIDENCE,
    HOOKED,
    RUNNER_ONLY,
    SEAL_KEY,
    Lab,
    content_of,
    make_lab,
    named,
    outcome,
    procs,
)
from tests.test_policy_engine import (
    HOOK_V1,
    SITE,
    WORKER_FILES,
    api,
    dead_v2_hook,
    engine,
    entry,
    hook,
    steps,
    worker,
)

FORBID_EVIL = '[[forbid]]\nmodule = "evil.patch"\n'
FORBIDDING = "version = 1\n" + EVIDENCE + HOOK_V1 + PRISTINE_VLLM_CPU + FORBID_EVIL
LAX_HOOK = '[[hooks]]\nname = "v1_step"\nmin_fires_per_productive_step = 0.01\n'
# target -> the policy its run r-<target> was registered with (each names its target alone)
RUNS2 = {
    "pol": HOOKED,  # runs row edited: hooks dropped
    "pol2": HOOKED,  # runs row edited: the hook's ratio lowered
    "man": FORBIDDING,  # manifest row edited: the forbidden module dropped
    "man2": FORBIDDING,  # manifest row edited: every file but one dropped
    "fol": HOOKED,  # a report row inserted: no agent ran at all
    "fol2": HOOKED,  # a report row inserted at the seal, an honest open
    "fol3": HOOKED,  # a report row written with its ledger entry (the store's own code)
}
EVIL = entry(SITE + "evil/patch.py", module="evil.patch")
EVIL2 = entry(SITE + "evil/patch.py", module="evil.patch", sha256="c" * 64)  # a manifest of its own


def keyed(ps: list[ProcessReport], boot: str = "boot-a") -> tuple[ProcessReport, ...]:
    out = []
    for p in ps:
        m = dataclasses.replace(p, key=ProcessKey(boot, p.key.pid, p.key.start_ticks))
        out.append(dataclasses.replace(m, manifest_digest=manifest_digest(m.files or ())))
    return tuple(out)


def dead(n: int) -> tuple[ProcessReport, ...]:
    """An API server, an engine core and a CPU worker that ran N more steps than at the start
    while its v1_step hook never fired (the instrumentation the policy is about is dead)."""
    w = worker(
        step=steps(total=10 + n, productive=8 + n),
        hooks=(hook(fired=0, fired_productive=0), dead_v2_hook()),
    )
    return keyed([api(), engine(), w])


def sparse(n: int) -> tuple[ProcessReport, ...]:
    """As ``dead`` but the hook fires on one step in fifty (the code the policy is about runs
    on almost none of the measured steps)."""
    w = worker(
        step=steps(total=10 + n, productive=8 + n),
        hooks=(hook(fired=1 + n // 50, fired_productive=1 + n // 50), dead_v2_hook()),
    )
    return keyed([api(), engine(), w])


def with_evil(n: int, evil: Any = EVIL) -> tuple[ProcessReport, ...]:
    """An honest target whose worker loaded a module the policy forbids (``evil.patch``),
    the v1_step hook firing on every step."""
    w = worker(
        step=steps(total=10 + n, productive=8 + n),
        hooks=(hook(fired=10 + n, fired_productive=8 + n), dead_v2_hook()),
        files=(*WORKER_FILES, evil),
    )
    return keyed([api(), engine(), w])


def digests_only(ps: tuple[ProcessReport, ...]) -> tuple[ProcessReport, ...]:
    """PS as an agent sends processes whose manifests the verifier already has: their
    digests only (``ReportResponse.need_manifests`` asks for files it lacks)."""
    return tuple(dataclasses.replace(p, files=None) for p in ps)


@dataclasses.dataclass
class Lab2(Lab):
    """``tests.test_gate_time_attacks.Lab`` with the runs of ``RUNS2``."""

    def sql(self, statement: str, args: tuple[Any, ...] = ()) -> int:
        """The liar: one statement on the verifier's SQLite file, as its owner can."""
        db = sqlite3.connect(self.db, timeout=30)
        try:
            n = db.execute(statement, args).rowcount
            db.commit()
        finally:
            db.close()
        return n

    def verify_promised(self, seal_json: str, target: str) -> subprocess.CompletedProcess[str]:
        """``verify-seal`` as the auditor runs it: the key, and the policy pre-registered with
        the auditor (the file the run was registered with)."""
        path = self.dir / f"{target}.seal.json"
        path.write_text(seal_json)
        return verifier_cli(
            "audit", "verify-seal", str(path), "--key", str(self.dir / SEAL_KEY),
            "--policy", str(self.dir / f"{target}.toml"),
        )  # fmt: skip

    def audit_verify(self) -> subprocess.CompletedProcess[str]:
        return verifier_cli("audit", "verify", "--db", str(self.db))


def make_lab2(d: Path) -> Lab2:
    return make_lab(d, RUNS2, Lab2)


@pytest.fixture(scope="module")
def lab2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab2]:
    L = make_lab2(tmp_path_factory.mktemp("outside2"))
    L.start()
    try:
        yield L
    finally:
        L.stop()


@contextlib.contextmanager
def restarted(L: Lab2) -> Iterator[None]:
    """The verifier stopped (its database at rest, as for a backup or an upgrade), then
    started again on the same database and key."""
    L.stop()
    try:
        yield
    finally:
        L.start()


@dataclasses.dataclass(frozen=True)
class Attempt:
    """What a window attempt got: whether the attack took (a held seal that ``verify-seal
    --policy <promised>`` passes), what was said, and the seal's signed content (None: no
    seal, the open was refused)."""

    took: bool
    got: str
    content: dict[str, Any] | None = None


def window_on(L: Lab2, target: str, at_open: Any, at_seal: Any, open_s: float = 6.0) -> Attempt:
    """A window on run r-TARGET: AT_OPEN() and AT_SEAL() called every 0.5 s while the open and
    the seal wait (the open OPEN_S at most); what it got."""
    opened = L.open(target, at_open, timeout_s=open_s)
    if not isinstance(opened, pb.OpenWindowResponse):
        return Attempt(False, f"open refused: {opened.details()}")
    sealed = L.seal(target, opened.window_id, at_seal)
    assert isinstance(sealed, pb.SealWindowResponse), sealed
    out = L.verify_promised(sealed.seal_json, target)
    took = sealed.held and out.returncode == 0
    return Attempt(took, outcome(sealed, out), content_of(sealed.seal_json))


def verdict_of(L: Lab2, run: str) -> str:
    with L.channel("ci") as ch:
        from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc

        got = pb_grpc.VerifierServiceStub(ch).GetRunStatus(pb.GetRunStatusRequest(name=run))
    return str(pb.Verdict.Name(got.verdict.verdict))


# ------------------------------------------------------------ the run's policy, edited at rest


def test_a_policy_edited_in_the_store_never_judges_a_seal_that_names_the_promised_one(
    lab2: Lab2,
) -> None:
    """Attack (a writer of the verifier's SQLite file, no key): run ``r-pol`` was registered
    with the promised policy (v1_step on every productive step, pristine vllm-cpu), and the
    auditor holds that file. While the verifier is stopped (an upgrade, a backup restored),
    the liar rewrites ``runs.policy_toml`` of ``r-pol`` to a runner-only policy (no hooks),
    leaving ``policy_digest`` as it was; the verifier is started again. The serving worker's
    hook is dead: it steps, v1_step never fires (the promised policy FAILs it,
    ``liveness.hook.not_firing``).

    Gets: ``OpenWindow`` opens, ``SealWindow`` held=True, and ``verifier audit verify-seal
    --key ... --policy r-pol.toml`` exits 0: "ok judged by the policy given (sha256:...)",
    "seal verified: window ... held"; the seal's ``hooks`` is ``{}``. The verifier loads a
    run's policy from ``runs.policy_toml`` and caches it under the stored ``policy_digest``
    (``Evaluator.policy``) without hashing the text again or checking the row against its
    ledger entry, and the seal names the stored digest. (``verifier audit verify --db``
    afterwards says "the stored run was changed", but the signed seal verifies offline.)
    Sound: a run whose stored policy is not the one its digest names is refused (no PASS, no
    window), or the seal names the digest of the policy that judged it, so that
    ``verify-seal --policy <promised>`` exits 1."""
    lab2.report("pol", dead(0))
    before = verdict_of(lab2, "r-pol")
    assert before == "VERDICT_FAIL", before  # control: the promised policy fails the dead hook
    with restarted(lab2):
        n = lab2.sql(
            "UPDATE runs SET policy_toml = ? WHERE name = 'r-pol'", (named(RUNNER_ONLY, "pol"),)
        )
        assert n == 1
    a = window_on(
        lab2, "pol", lambda: lab2.report("pol", dead(0)), lambda: lab2.report("pol", dead(40))
    )
    assert not a.took, a.got
    assert "the database was edited" in a.got, a.got  # refused, saying why


def test_a_hook_ratio_lowered_in_the_store_never_judges_a_seal_of_the_promised_policy(
    lab2: Lab2,
) -> None:
    """Variation: the liar keeps the hook but lowers its ratio in ``runs.policy_toml`` to
    0.01 fires per productive step, the digest column untouched, the verifier restarted. The
    hook fires on one productive step in fifty (the promised policy, 1.0 per step, FAILs it).

    Gets: held=True and ``verify-seal --policy <promised>`` exit 0, the seal's hook row for
    v1_step saying 4 fires on 200 productive steps against a minimum of 0.01 per step, under
    the promised policy's digest (which asks 1.0): the signed seal itself contradicts the
    policy it names, and verify-seal, given that policy, does not compare the two.
    Sound: not held, or verify-seal exit 1."""
    lab2.report("pol2", sparse(0))
    assert verdict_of(lab2, "r-pol2") == "VERDICT_FAIL"  # control: the promised policy
    with restarted(lab2):
        lax = "version = 1\n" + EVIDENCE + LAX_HOOK + PRISTINE_VLLM_CPU
        lab2.sql("UPDATE runs SET policy_toml = ? WHERE name = 'r-pol2'", (named(lax, "pol2"),))
    a = window_on(
        lab2,
        "pol2",
        lambda: lab2.report("pol2", sparse(0)),
        lambda: lab2.report("pol2", sparse(200)),
    )
    assert not a.took, a.got


# ------------------------------------------------------------ a stored manifest, edited at rest


def edit_manifest(L: Lab2, digest: str, edit: Any) -> None:
    db = sqlite3.connect(L.db, timeout=30)
    try:
        (text,) = db.execute(
            "SELECT files_json FROM manifests WHERE digest = ?", (digest,)
        ).fetchone()
        db.execute(
            "UPDATE manifests SET files_json = ? WHERE digest = ?",
            (json.dumps(edit(json.loads(text))), digest),
        )
        db.commit()
    finally:
        db.close()


def test_a_manifest_edited_in_the_store_never_hides_a_forbidden_module_from_a_seal(
    lab2: Lab2,
) -> None:
    """Attack (a writer of the SQLite file, no key): run ``r-man``'s promised policy forbids
    module ``evil.patch`` (``[[forbid]]``) besides the live hook. The serving worker loaded
    it: the agent's first report carries the worker's files, the verifier stores them under
    their digest and the run FAILs (``provenance.file.forbidden``). While the verifier is
    stopped, the liar removes ``evil.patch``'s entry from ``manifests.files_json`` under that
    digest. Started again, the verifier gets what an honest agent sends for an unchanged
    manifest: its digest only (the verifier has it, so ``need_manifests`` asks for nothing).

    Gets: the run PASSes, ``OpenWindow`` opens, ``SealWindow`` held=True, ``verify-seal
    --policy r-man.toml`` exit 0. ``Store.get_manifest`` reads the JSON under the digest and
    nothing checks that it still has that digest (a Merkle root over its entries,
    ``model.manifest_digest``) or its ledger entry, before the forbid rule judges it.
    Sound: a manifest whose files do not derive its digest is never judged as that digest's
    (the process's files unknown: PENDING, no window), so no held seal."""
    at_first = with_evil(0)
    lab2.report("man", at_first)
    assert verdict_of(lab2, "r-man") == "VERDICT_FAIL"  # control: the forbidden module is seen
    digest = at_first[2].manifest_digest
    assert digest is not None
    with restarted(lab2):
        edit_manifest(lab2, digest, lambda fs: [f for f in fs if f["module"] != "evil.patch"])
    a = window_on(
        lab2,
        "man",
        lambda: lab2.report("man", digests_only(with_evil(0))),
        lambda: lab2.report("man", digests_only(with_evil(40))),
    )
    assert not a.took, a.got


def test_a_manifest_entry_renamed_in_the_store_never_passes_the_forbid_rule(lab2: Lab2) -> None:
    """Variation: the liar keeps the entry count and renames the forbidden entry in place
    (``module`` and ``path`` of an innocuous vLLM module), so the manifest still lists as
    many files as the worker's report says it loaded.

    Gets: as above, held=True and verify-seal exit 0. Sound: not held."""
    at_first = with_evil(0, EVIL2)
    lab2.report("man2", at_first)
    assert verdict_of(lab2, "r-man2") == "VERDICT_FAIL"
    digest = at_first[2].manifest_digest
    assert digest is not None

    def rename(fs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for f in fs:
            if f["module"] == "evil.patch":
                f["module"] = "vllm.v1.worker.utils"
                f["path"] = SITE + "vllm/v1/worker/utils.py"
        return fs

    with restarted(lab2):
        edit_manifest(lab2, digest, rename)
    a = window_on(
        lab2,
        "man2",
        lambda: lab2.report("man2", digests_only(with_evil(0, EVIL2))),
        lambda: lab2.report("man2", digests_only(with_evil(40, EVIL2))),
    )
    assert not a.took, a.got


# ------------------------------------------------------------ report rows written into the store


def receipt_as(target: str) -> str:
    """The receipt a verifier stores with a report its agent sent over mTLS
    (``follow.receipt_json``), as the liar writes it: authenticated, received at once."""
    return json.dumps(
        {"authenticated_as": f"agent agent-{target}", "lag_s": 0.0, "transit_s": 0.0},
        sort_keys=True,
        separators=(",", ":"),
    )


class Forger:
    """The liar's report rows for TARGET, each a new seq of its agent, read 'now'."""

    def __init__(self, L: Lab2, target: str) -> None:
        self.L, self.target, self.seq = L, target, 1000

    def report(self, ps: tuple[ProcessReport, ...]) -> TargetReport:
        self.seq += 1
        now = time.time()
        who = f"agent-{self.target}"
        return TargetReport(who, self.target, self.seq, "", now, ps, collected_unix=now)

    def insert(self, ps: tuple[ProcessReport, ...]) -> None:
        """One INSERT into ``reports``: no agent, no nonce, no ledger entry."""
        rep = self.report(ps)
        self.L.sql(
            "INSERT INTO reports (agent_id, seq, target, received_unix, report, receipt_json) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (rep.agent_id, rep.seq, rep.target, rep.sent_unix, wire.report_to_bytes(rep),
             receipt_as(self.target)),
        )  # fmt: skip

    def store(self, ps: tuple[ProcessReport, ...]) -> None:
        """The same report written with the store's own code (``Store.save_report``: its row,
        manifests, index rows and ledger entries in one transaction), as a second verifier
        on the database writes what its agents send."""
        from servewitness.server.index import processes_seen
        from servewitness.server.store import Store, StoredReport

        rep = self.report(ps)
        stripped = dataclasses.replace(
            rep, processes=tuple(dataclasses.replace(p, files=None) for p in ps)
        )
        body = wire.stored_bytes(wire.report_to_pb(stripped))
        manifests = {p.manifest_digest: p.files for p in ps if p.manifest_digest and p.files}
        st = Store(self.L.db)
        try:
            st.save_report(
                StoredReport(rep.agent_id, rep.seq, rep.target, rep.sent_unix, body),
                st.prepare_manifests(manifests),
                processes_seen(ps),
                receipt=lambda: receipt_as(self.target),
            )
        finally:
            with contextlib.suppress(Exception):
                st.close()


def test_report_rows_written_into_the_store_never_open_or_seal_a_window(lab2: Lab2) -> None:
    """Attack (a writer of the SQLite file while the verifier runs, no key, no agent
    credential): no agent runs for target ``fol`` at all (nothing was measured). While a
    harness asks ``OpenWindow`` and then ``SealWindow``, the liar INSERTs rows into
    ``reports``: a well-formed report body (the processes of an honest server, v1_step firing
    on every step, 40 more steps at the seal), ``received_unix`` now, and a receipt
    ``{"authenticated_as": "agent agent-fol", "lag_s": 0, "transit_s": 0}``.

    Gets: ``OpenWindow`` opens, ``SealWindow`` held=True, ``verify-seal --policy fol.toml``
    exit 0; ``verifier status`` says "evidence.authenticated: target fol's evidence was sent
    by agent agent-fol". The verifier follows rows "other verifiers" stored
    (``server/follow.py``) and takes the receipt's word for who sent the report and when,
    with no nonce and no ledger entry behind the row: the seal's evidence rows name
    ``ledger_seq: null`` for every process, and verify-seal passes that. Only ``verifier
    audit verify --db`` afterwards says "stored row(s) are not in the ledger".
    Sound: a report row without its ledger entry is never evidence (the open times out), and
    a seal whose evidence rests on no ledger entry does not verify."""
    f = Forger(lab2, "fol")
    a = window_on(lab2, "fol", lambda: f.insert(procs(n=0)), lambda: f.insert(procs(n=40)))
    assert not a.took, a.got


def test_a_report_row_written_into_the_store_never_seals_an_honestly_opened_window(
    lab2: Lab2,
) -> None:
    """Variation: the window is opened on the real agent's reports (an honest server, hook
    firing); then the instrumentation stops (the agent is killed, or the hook goes dead) and
    the liar supplies the seal's evidence as inserted rows, 40 more steps with the hook
    firing on each.

    Gets: held=True, verify-seal exit 0: the last seconds of the measurement rest on rows
    nobody sent. Sound: not held (``window.no_fresh_evidence``: no agent reported after the
    seal began)."""
    f = Forger(lab2, "fol2")
    a = window_on(
        lab2,
        "fol2",
        lambda: lab2.report("fol2", procs(n=0)),
        lambda: f.insert(procs(n=40)),
    )
    assert not a.took, a.got
    assert a.content is not None  # opened on the agent's reports; the seal found none after
    ids = [x["id"] for x in a.content["seal"]["findings"]]
    assert "window.no_fresh_evidence" in ids, ids


def test_a_report_ledgered_by_a_store_writer_is_not_an_agents_evidence(tmp_path: Path) -> None:
    """Variation: the liar writes the rows with the product's own ``Store.save_report`` (row,
    manifests, index rows and ledger entries in one transaction, as a second verifier on the
    database would), the receipt naming agent-fol3 as authenticated; no agent runs.

    Gets: held=True, verify-seal exit 0, and afterwards ``verifier audit verify --db`` exit 0
    too ("ledger intact ... index tables ... match"): nothing anywhere says that no agent
    sent that evidence. The receipt (who sent it, when) is the database writer's word
    (security.md lists the CA and the agent key's holders as who must be trusted for "evidence
    for target T came from an agent allowed to report for T", not the database's writers).
    Sound: a verifier takes as evidence only reports it (or a replica holding a secret the
    database's writers do not) received and vouched for; here, the open times out."""
    lab = make_lab2(tmp_path / "v")  # a database of its own: the others' edits are not in it
    lab.start()
    try:
        f = Forger(lab, "fol3")
        a = window_on(lab, "fol3", lambda: f.store(procs(n=0)), lambda: f.store(procs(n=40)))
    finally:
        lab.stop()
    audit = lab.audit_verify()
    assert not a.took, f"{a.got}; audit verify --db exit {audit.returncode}"


# ------------------------------------------------------------ a broken seal, deleted and redone


HIDE_SEAL = {
    "deleted": "DELETE FROM seals WHERE window_id = ?",
    # variation: the row kept, under another window id (no row is missing from the table)
    "moved": "UPDATE seals SET window_id = 'x' || window_id WHERE window_id = ?",
}


@pytest.mark.parametrize("how", list(HIDE_SEAL))
def test_a_window_sealed_broken_cannot_be_sealed_again_after_its_seal_row_is_deleted(
    lab2: Lab2, how: str
) -> None:
    """Attack (a writer of the SQLite file while the verifier runs, no key; e.g. the lab that
    runs the harness and the verifier): a window on run ``r-fol2`` is sealed and does not
    hold. Here: the agent stopped reporting while the benchmark ran, so the seal found no
    fresh evidence (``window.no_fresh_evidence``, held=False, signed and ledgered). The liar
    deletes that window's row from ``seals`` (its ``seal`` ledger entry stays), the agent
    reports again, and the harness asks ``SealWindow`` for the same window once more.

    Gets: a second seal of the same window, held=True, ``verify-seal --policy`` exit 0, and
    its ``other_windows`` counts nothing for the broken seal (it is of this very window, which
    the count leaves out). Whether a window was sealed is read from the ``seals`` table only
    (``window_rows.get_window``), not from the ledger, though "a window has one seal" is the
    documented defence against "sealing a window twice (to replace a broken seal with a
    better one)". ``verifier audit verify --db`` afterwards names the seal entry ("the stored
    seal was changed"), but the second seal verifies offline. Variation ``moved``: the
    broken seal's row kept under another window id: the same. Sound: ALREADY_EXISTS (the
    ledger holds a seal of that window), or the second seal does not verify."""
    target = "fol2"  # HOOKED; reports of its real agent
    opened = lab2.open(target, lambda: lab2.report(target, procs(n=100)))
    assert isinstance(opened, pb.OpenWindowResponse), opened
    req = pb.SealWindowRequest(
        window_id=opened.window_id, run=f"r-{target}", results_name="-", results_size=0,
        results_sha256=hashlib.sha256(b"").hexdigest(), timeout_s=1.5,
    )  # fmt: skip
    first = lab2.call("SealWindow", req, 10)  # the agent is silent: no fresh evidence
    assert isinstance(first, pb.SealWindowResponse) and not first.held, first
    assert "window.no_fresh_evidence" in json.dumps(content_of(first.seal_json)["seal"]["findings"])
    assert lab2.sql(HIDE_SEAL[how], (opened.window_id,)) == 1
    second = lab2.seal(target, opened.window_id, lambda: lab2.report(target, procs(n=140)))
    if not isinstance(second, pb.SealWindowResponse):
        return  # sound: refused
    out = lab2.verify_promised(second.seal_json, target)
    others = content_of(second.seal_json)["seal"].get("other_windows")
    got = f"second seal: {outcome(second, out)}; other_windows {others}"
    assert not (second.held and out.returncode == 0), got


def test_verify_seal_fails_a_held_seal_whose_evidence_has_no_ledger_entry() -> None:
    """What a seal from a verifier that took such rows would show: held, its evidence naming
    no ledger entry at one end. ``verify-seal`` (``window_ends.recheck``) fails it; the same
    evidence with its entries passes (control)."""
    from servewitness.policy.window_ends import recheck

    def rows(ledger_seq: int | None, n: int) -> list[dict[str, Any]]:
        return [
            {"target": "t", "agent_id": "agent-t", "report_seq": n, "ledger_seq": ledger_seq,
             "boot_id": "b", "pid": 7, "start_ticks": 1, "role": "worker", "rank": 0,
             "steps_total": n, "steps_productive": n, "runs_steps": True}
        ]  # fmt: skip

    w = {"evidence": rows(3, 1), "opened_unix": 1.0}
    honest = {"held": True, "evidence": rows(9, 50), "sealed_unix": 2.0, "hooks": {}}
    forged = {**honest, "evidence": rows(None, 50)}
    assert not [p for p in recheck(w, honest).problems if "ledger" in p]
    problems = recheck(w, forged).problems
    assert any("window.evidence_unledgered" in p for p in problems), problems


def test_a_window_whose_stored_opening_was_edited_is_never_sealed(lab2: Lab2) -> None:
    """Attack (a writer of the database, while the window is open): the window's stored
    content edited, still valid JSON: every step count at the open lowered by 100, so the
    window looks as if it ran 100 more steps per process than it did. Before: ``SealWindow``
    judged the edited opening (``verify-seal`` caught it later, from the ledger entry).
    Sound: the seal is refused, saying the database was edited, and nothing is signed."""
    target = "fol2"
    opened = lab2.open(target, lambda: lab2.report(target, procs(n=200)))
    assert isinstance(opened, pb.OpenWindowResponse), opened
    db = sqlite3.connect(lab2.db, timeout=30)
    try:
        (text,) = db.execute(
            "SELECT content_json FROM windows WHERE id = ?", (opened.window_id,)
        ).fetchone()
        content = json.loads(text)
        for row in content["evidence"]:
            if isinstance(row.get("steps_productive"), int):
                row["steps_productive"] -= 100
        edited = json.dumps(content, sort_keys=True, separators=(",", ":"))
        assert edited != text
        db.execute("UPDATE windows SET content_json = ? WHERE id = ?", (edited, opened.window_id))
        db.commit()
    finally:
        db.close()
    sealed = lab2.seal(target, opened.window_id, lambda: lab2.report(target, procs(n=240)))
    assert not isinstance(sealed, pb.SealWindowResponse), "sealed on an edited opening"
    assert sealed.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "the database was edited" in (sealed.details() or ""), sealed.details()
