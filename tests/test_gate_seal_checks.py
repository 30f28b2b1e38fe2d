"""The gate client checks every answer against what it asked (``client/window.py``): the window
OpenWindow opened is on the run asked; the seal SealWindow hands back names, in its signed
content, the window, run, results and request ids sent, closes the window entry OpenWindow
answered, and says held exactly when the answer does; with the verifier's public key, its
signature verifies; a verdict is of the run asked. What fails is refused by name (``GateFailed``
from ``measurement``; exit 7, or 8 for another key, from ``verifier seal``/``exec``/``window``)
and a refused seal is never written.

Real peers throughout: a real ``verifier serve`` over mutual TLS (``tests/test_gate_time_attacks``'s
lab), a real gRPC peer at the address the client is given (plaintext loopback, as the default
address is), either a fake verifier that answers from what it holds, or a relay that forwards
to the real verifier with the harness's credential and changes one thing on the way. Agents'
reports are the lab's (a worker whose hook fires on each step).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.api.v1 import verifier_pb2_grpc as pb_grpc
from servewitness.client.api import VerifierClient
from servewitness.client.gate import GateFailed, measurement, wait_for
from servewitness.errors import BundleCorrupt, Error, WrongKey
from servewitness.ledger import dsse, keys
from servewitness.ledger import statement as st
from servewitness.model import RunVerdict, Verdict
from servewitness.wire import dsse as wire_dsse
from servewitness.wire import seals
from tests.helpers import verifier_cli
from tests.test_gate_time_attacks import (
    SEAL_KEY,
    WINDOW_S,
    FakeVerifier,
    Lab,
    content_of,
    procs,
    serve_fake,
    started_lab,
    window,
)

EMPTY = hashlib.sha256(b"").hexdigest()

pytest_plugins = ["pytester"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with started_lab(tmp_path_factory.mktemp("seal-checks")) as L:
        yield L


@pytest.fixture(autouse=True)
def plain_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client connects in plaintext (as to the default address) and has no key unless
    given one."""
    for k in ("VERIFIER_TLS_CA", "VERIFIER_TLS_CERT", "VERIFIER_TLS_KEY", "VERIFIER_TOKEN",
              "VERIFIER_SEAL_KEY", "VERIFIER_ADDRESS"):  # fmt: skip
        monkeypatch.delenv(k, raising=False)


@pytest.fixture(scope="module")
def genuine(lab: Lab) -> str:
    """A genuine, held, signed seal of window W0 on run r-gen (over the empty string)."""
    sealed, out, _ = window(lab, "gen", procs(n=100), procs(n=140))
    assert sealed.held and out.returncode == 0, out.stdout + out.stderr
    return str(sealed.seal_json)


@contextmanager
def feeding(L: Lab, target: str, stepping: bool = True) -> Iterator[None]:
    """TARGET's agent reports every 0.3 s while the block runs: the worker stepping with its
    hook firing on each step (STEPPING), or idle (no step: the window cannot hold)."""
    stop = threading.Event()

    def loop() -> None:
        n = 1000
        while not stop.is_set():
            L.report(target, procs(n=n))
            n += 5 if stepping else 0
            stop.wait(0.3)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(10)


class Relay(pb_grpc.VerifierServiceServicer):
    """A peer between the client and the real verifier: plaintext to the client, the
    harness's certificate to the verifier. OpenWindow and GetRunStatus go through as they
    are; SealWindow through ON_SEAL (the request, a function that forwards a request)."""

    def __init__(
        self,
        L: Lab,
        on_seal: Callable[[Any, Callable[[Any], Any]], Any] | None = None,
        on_open: Callable[[Any], Any] | None = None,
    ) -> None:
        self.L = L
        self.on_seal = on_seal or (lambda req, forward: forward(req))
        self.on_open = on_open or (lambda resp: resp)

    def _forward(self, method: str, request: Any, context: Any) -> Any:
        with self.L.channel("ci") as ch:
            try:
                stub = pb_grpc.VerifierServiceStub(ch)
                return getattr(stub, method)(request, timeout=request.timeout_s + 5)
            except grpc.RpcError as e:
                context.abort(e.code(), e.details())
                raise  # abort raises; this line is not reached

    def OpenWindow(self, request: Any, context: Any) -> Any:
        return self.on_open(self._forward("OpenWindow", request, context))

    def SealWindow(self, request: Any, context: Any) -> Any:
        return self.on_seal(request, lambda r: self._forward("SealWindow", r, context))


@contextmanager
def peer(servicer: Any) -> Iterator[str]:
    server, addr = serve_fake(servicer)
    try:
        yield addr
    finally:
        server.stop(0)


def pub(L: Lab) -> Path:
    return L.dir / SEAL_KEY


def resign(seal_json: str, edit: Callable[[dict[str, Any]], None]) -> str:
    """SEAL_JSON with its statement edited by EDIT and signed by a key of the forger's own."""
    doc = json.loads(seal_json)
    statement = json.loads(base64.b64decode(doc["envelope"]["payload"]))
    edit(statement)
    doc["envelope"] = dsse.sign(st.encode(statement), st.PAYLOAD_TYPE, keys.generate())
    return json.dumps(doc)


def renamed(statement: dict[str, Any], window_id: str, run: str) -> None:
    """STATEMENT made to name WINDOW_ID on RUN throughout (a forger's edit)."""
    p = statement["predicate"]
    for part in (p["window"], p["seal"]):
        part["window_id"] = window_id
        part["run"] = run
    p["run"] = run


class Forger(FakeVerifier):
    """FakeVerifier whose made-up window's answer agrees with the seal it will hand back (the
    window entry and policy digest that seal names): a forger that writes both answers."""

    def OpenWindow(self, request: Any, context: Any) -> pb.OpenWindowResponse:
        got = super().OpenWindow(request, context)
        sealed = content_of(self.seal_json)["seal"]
        got.ledger_seq, got.ledger_hash = sealed["open_entry"]["seq"], sealed["open_entry"]["hash"]
        got.policy_digest = sealed["policy_digest"]
        return got


# ------------------------------------------------------------------ the seal: replays, relays


def test_a_replayed_seal_of_an_older_window_on_the_same_run_is_refused(
    lab: Lab, genuine: str, tmp_path: Path
) -> None:
    """Variation on the attack (same run, older window): a relay lets the client open a real
    window on r-gen (the verifier's own answer), then answers the seal with the genuine held
    seal of an older window of r-gen instead of sealing this one. Refused: GateFailed naming
    both windows, and the results' seal file is never written."""
    results = tmp_path / "results.json"
    replay = pb.SealWindowResponse(held=True, seal_json=genuine)
    relay = Relay(lab, on_seal=lambda req, forward: replay)
    with (
        feeding(lab, "gen"),
        peer(relay) as addr,
        pytest.raises(GateFailed) as got,
        measurement("r-gen", address=addr, timeout_s=WINDOW_S, results=results) as m,
    ):
        results.write_text("{}")
    old = content_of(genuine)["seal"]["window_id"]
    assert f"it seals window {old}, not {m.window.window_id}" in got.value.explain()
    assert not (tmp_path / "results.json.seal.json").exists()
    assert m.sealed is None and "held" not in m.summary


def test_a_seal_that_says_not_held_inside_while_the_answer_says_held_is_refused(
    lab: Lab, tmp_path: Path
) -> None:
    """Variation (the flag and the content): a relay seals the client's own window with the
    real verifier, where it did not hold (the worker was idle: window.no_steps), and flips
    ``held`` to true on the wire. The seal is genuine and of this window; its signed content
    says held=false. Refused (GateFailed naming both), and never reported held."""

    def flip(req: Any, forward: Callable[[Any], Any]) -> Any:
        got = forward(req)
        assert not got.held  # the verifier's own answer
        return pb.SealWindowResponse(held=True, seal_json=got.seal_json)

    results = tmp_path / "results.json"
    with (
        feeding(lab, "spool", stepping=False),
        peer(Relay(lab, on_seal=flip)) as addr,
        pytest.raises(GateFailed) as got,
        measurement("r-spool", address=addr, timeout_s=WINDOW_S, results=results) as m,
    ):
        results.write_text("{}")
    assert "its signed content says held=False, the answer says held=True" in got.value.explain()
    assert "held" not in m.summary and not (tmp_path / "results.json.seal.json").exists()


@pytest.mark.parametrize("keyed", [False, True], ids=["no key", "with the key"])
def test_a_genuine_seal_of_this_window_over_other_results_is_refused_even_signed(
    lab: Lab, tmp_path: Path, keyed: bool
) -> None:
    """Variation (a relay that swaps the results): it forwards the seal of the client's own
    window to the real verifier with the digest of results of its own. The verifier signs a
    held seal of this window, this run, with the verifier's key (so the signature verifies
    with --key): it binds other results. Refused by content (GateFailed naming both digests);
    the key does not make it pass."""
    theirs = hashlib.sha256(b"the relay's numbers").hexdigest()

    def swap(req: Any, forward: Callable[[Any], Any]) -> Any:
        req.results_sha256 = theirs
        return forward(req)

    results = tmp_path / "results.json"
    with (
        feeding(lab, "api"),
        peer(Relay(lab, on_seal=swap)) as addr,
        pytest.raises(GateFailed) as got,
        measurement("r-api", address=addr, timeout_s=WINDOW_S, results=results,
                    **({"key": pub(lab)} if keyed else {})),
    ):  # fmt: skip
        results.write_text('{"tokens_per_s": 1}')
    mine = hashlib.sha256(b'{"tokens_per_s": 1}').hexdigest()
    assert f"its results sha256 is {theirs[:16]}, not {mine[:16]}" in got.value.explain()
    assert not (tmp_path / "results.json.seal.json").exists()


@pytest.mark.parametrize("strip", [False, True], ids=["ids forwarded", "ids stripped"])
def test_a_relay_that_drops_the_request_ids_cannot_skip_the_requests_check(
    lab: Lab, strip: bool
) -> None:
    """Variation (the requests check): the block sends two request ids (``m.request_ids``).
    Forwarded as they are, the verifier checks them (no agent here binds them: unserved, the
    window does not hold) and the client accepts that genuine seal as the answer: GateFailed
    says the window did not hold. A relay that strips the ids from SealWindow gets a genuine,
    held seal that checked no request: refused, naming the ids."""

    def seal(req: Any, forward: Callable[[Any], Any]) -> Any:
        if strip:
            del req.request_ids[:]
        return forward(req)

    with (
        feeding(lab, "restart"),
        peer(Relay(lab, on_seal=seal)) as addr,
        pytest.raises(GateFailed) as got,
        measurement("r-restart", address=addr, timeout_s=WINDOW_S) as m,
    ):
        m.request_ids += ["req-1", "req-2", "req-1"]
    if strip:
        assert "it checked no request ids; this client sent 2" in got.value.explain()
        assert "held" not in m.summary
    else:
        assert got.value.explain().startswith("the window did not hold"), got.value.explain()
        assert m.summary["requests"]["sent"] == 2 and m.summary["held"] is False


def test_an_honest_window_through_the_relay_holds_with_its_signature_checked(
    lab: Lab, tmp_path: Path
) -> None:
    """Control: the relay changes nothing. The window holds, the seal is written, its
    signature is checked with the key given and the summary says so; without a key the same
    seal is accepted and the summary says the signature was not checked."""
    results = tmp_path / "results.json"
    with feeding(lab, "reboot"), peer(Relay(lab)) as addr:
        with measurement("r-reboot", address=addr, timeout_s=WINDOW_S, results=results,
                         key=pub(lab)) as m:  # fmt: skip
            results.write_text("{}")
        with measurement("r-reboot", address=addr, timeout_s=WINDOW_S) as unkeyed:
            pass
    kid = keys.key_id(keys.load_public_key(pub(lab)))
    assert (m.summary["held"], m.summary["signature_key_id"]) == (True, kid)
    assert (tmp_path / "results.json.seal.json").is_file()
    assert (unkeyed.summary["held"], unkeyed.summary["signature_checked"]) == (True, False)
    assert "NOT checked" in unkeyed.summary["signature"]


# ------------------------------------------------------------------ forged seals and the key


@pytest.mark.parametrize("how", ["another key", "payload changed"])
def test_a_forged_seal_naming_this_window_is_refused_with_the_key(
    lab: Lab, genuine: str, how: str
) -> None:
    """A fake verifier writes a seal that names the very window it made up, run and results
    (held), and signs it with a key of its own (``another key``: WrongKey, exit 8) or keeps
    the verifier's signature over a payload it changed (``payload changed``: BundleCorrupt,
    exit 7). Its content matches what was asked, so only the signature can tell: with the
    verifier's key, GateFailed; without one the gate passes and says the signature was NOT
    checked."""
    wid = "f" * 32  # FakeVerifier's window

    if how == "another key":
        forged = resign(genuine, lambda s: renamed(s, wid, "r-gen"))
    else:
        doc = json.loads(genuine)
        statement = json.loads(base64.b64decode(doc["envelope"]["payload"]))
        renamed(statement, wid, "r-gen")
        doc["envelope"]["payload"] = base64.b64encode(st.encode(statement)).decode()
        forged = json.dumps(doc)

    with peer(Forger(forged)) as addr:
        with (
            pytest.raises(GateFailed) as got,
            measurement("r-gen", address=addr, timeout_s=5, key=pub(lab)),
        ):
            pass
        with measurement("r-gen", address=addr, timeout_s=5) as m:
            pass
    why = "signed by key" if how == "another key" else "does not verify"
    assert why in got.value.explain(), got.value.explain()
    assert (m.summary["held"], m.summary["signature_checked"]) == (True, False)


# ------------------------------------------------------------------ OpenWindow and verdicts


def test_a_window_opened_on_another_run_never_runs_the_block(genuine: str, tmp_path: Path) -> None:
    """A peer answers OpenWindow for run r-gen with a window on another run: the block never
    runs (GateFailed naming both runs), and ``verifier window`` saves no window file (exit 7)."""

    class OtherRun(FakeVerifier):
        def OpenWindow(self, request: Any, context: Any) -> Any:
            got = super().OpenWindow(request, context)
            got.run = "r-other"
            return got

    ran = []
    with peer(OtherRun(genuine)) as addr:
        with pytest.raises(GateFailed) as got, measurement("r-gen", address=addr, timeout_s=5):
            ran.append(True)
        saved = tmp_path / "w.json"
        out = verifier_cli("window", "r-gen", "--out", str(saved), "--timeout", "5",
                           "--verifier", addr)  # fmt: skip
    assert ran == [] and "on run 'r-other', not on run 'r-gen'" in got.value.explain()
    assert (out.returncode, saved.exists()) == (7, False), out.stdout + out.stderr


def test_a_verdict_of_another_run_is_no_pass_of_this_one() -> None:
    """``wait_for`` (``verifier wait``) asks about run r; a peer answers PASS for run r-other:
    AnswerMismatch (exit 7), not a PASS."""

    class Passes(pb_grpc.VerifierServiceServicer):
        def GetRunStatus(self, request: Any, context: Any) -> Any:
            v = RunVerdict("r-other", "0" * 64, Verdict.PASS, (), (), time.time())
            return wire.get_run_status_response_to_pb(v)

    with (
        peer(Passes()) as addr,
        VerifierClient(addr, 5.0) as client,
        pytest.raises(Error) as got,
    ):
        wait_for(client, "r", 5.0)
    assert got.value.exit_code == 7
    assert "verdict of run 'r-other', not of run 'r'" in got.value.explain()


# ------------------------------------------------------------------ the CLI


def test_seal_and_exec_refuse_a_replayed_seal_and_write_nothing(
    lab: Lab, genuine: str, tmp_path: Path
) -> None:
    """``verifier exec`` and ``verifier seal`` against the peer of the original attack (a made-up
    window, the replayed genuine seal of another window): exit 7, the reason named, no seal
    file. With --key, the forged seal of this window is exit 8 (another key)."""
    results = tmp_path / "results.json"
    results.write_text("{}")
    with peer(FakeVerifier(genuine)) as addr:
        ex = verifier_cli("exec", "r-gen", "--results", str(results), "--timeout", "5",
                          "--verifier", addr, "--", "true")  # fmt: skip
        w = tmp_path / "w.json"
        assert verifier_cli("window", "r-gen", "--out", str(w), "--timeout", "5",
                            "--verifier", addr).returncode == 0  # fmt: skip
        sl = verifier_cli("seal", "r-gen", "--window", str(w), "--results", str(results),
                          "--timeout", "5")  # fmt: skip
    old = content_of(genuine)["seal"]["window_id"]
    assert ex.returncode == 7 and f"it seals window {old}" in ex.stderr, ex.stdout + ex.stderr
    assert sl.returncode == 7 and f"it seals window {old}" in sl.stderr, sl.stdout + sl.stderr
    assert not (tmp_path / "results.json.seal.json").exists()

    sha = hashlib.sha256(b"{}").hexdigest()

    def mine(s: dict[str, Any]) -> None:
        renamed(s, "f" * 32, "r-gen")
        s["predicate"]["seal"]["results"] = {"name": "results.json", "sha256": sha, "size": 2}
        s["subject"] = [st.subject("results.json", sha)]

    with peer(Forger(resign(genuine, mine))) as addr:
        unkeyed = verifier_cli("exec", "r-gen", "--results", str(results), "--timeout", "5",
                               "--verifier", addr, "--", "true")  # fmt: skip
        keyed = verifier_cli("exec", "r-gen", "--results", str(results), "--timeout", "5",
                             "--key", str(pub(lab)), "--verifier", addr, "--", "true")  # fmt: skip
    assert unkeyed.returncode == 0, unkeyed.stdout + unkeyed.stderr  # the content matches...
    assert "signature was NOT checked" in unkeyed.stderr  # ...and the output says what it lacks
    assert keyed.returncode == 8 and "signed by key" in keyed.stderr, keyed.stdout + keyed.stderr


def test_exec_and_seal_check_the_signature_of_an_honest_seal_with_the_key(
    lab: Lab, tmp_path: Path
) -> None:
    """Control through the relay (nothing changed): ``exec --key`` and ``seal --key --json``
    exit 0 and say the signature was checked with the verifier's key; the window file keeps
    OpenWindow's ledger entry, which the seal must close."""
    results = tmp_path / "results.json"
    kid = keys.key_id(keys.load_public_key(pub(lab)))
    with feeding(lab, "late"), peer(Relay(lab)) as addr:
        ex = verifier_cli("exec", "r-late", "--results", str(results), "--timeout", "12",
                          "--key", str(pub(lab)), "--verifier", addr, "--",
                          "sh", "-c", f"echo '{{}}' > {results}")  # fmt: skip
        w = tmp_path / "w.json"
        assert verifier_cli("window", "r-late", "--out", str(w), "--timeout", "12",
                            "--verifier", addr).returncode == 0  # fmt: skip
        sealed = tmp_path / "two-step.seal.json"
        sl = verifier_cli("seal", "r-late", "--window", str(w), "--results", str(results),
                          "--out", str(sealed), "--timeout", "12", "--key", str(pub(lab)),
                          "--json")  # fmt: skip
    assert ex.returncode == 0 and f"checked with the verifier's key {kid[:16]}" in ex.stdout, (
        ex.stdout + ex.stderr
    )
    assert sl.returncode == 0, sl.stdout + sl.stderr
    assert json.loads(sl.stdout)["signature"] == {"checked": True, "key_id": kid}
    closes = content_of(sealed.read_text())["seal"]["open_entry"]
    assert json.loads(w.read_text())["ledger_hash"] == closes["hash"]


# ------------------------------------------------------------------ the pytest plugin

INNER = """
def test_replayed(gated_measurement):
    with gated_measurement("r-gen"):
        pass
"""


def test_the_plugin_fails_a_test_handed_another_windows_seal_and_records_the_signature(
    pytester: pytest.Pytester, lab: Lab, genuine: str
) -> None:
    """``gated_measurement`` against the attack's peer (a genuine held seal of another window):
    the test fails with the reason, no ``verifier_held`` is recorded. Against a forger whose
    seal names the window it made up: without ``--verifier-key`` the test passes and records
    ``verifier_seal_signature`` "not checked"; with the verifier's key it fails."""
    pytester.makepyfile(test_inner=INNER)

    def inner(addr: str, *extra: str) -> tuple[pytest.RunResult, dict[str, str]]:
        junit = pytester.path / "junit.xml"
        got = pytester.runpytest_subprocess(
            "-p", "servewitness.client.pytest_plugin", "-p", "no:cacheprovider",
            "--verifier-address", addr, "--verifier-timeout", "5", f"--junitxml={junit}", *extra
        )  # fmt: skip
        case = next(ET.parse(junit).getroot().iter("testcase"))  # noqa: S314 - its own report
        return got, {p.get("name") or "": p.get("value") or "" for p in case.iter("property")}

    with peer(FakeVerifier(genuine)) as addr:
        replayed, props = inner(addr)
    old = content_of(genuine)["seal"]["window_id"]
    assert replayed.ret == pytest.ExitCode.TESTS_FAILED
    replayed.stdout.fnmatch_lines([f"*verifier gate on run r-gen:*it seals window {old}*"])
    assert "verifier_held" not in props and props["verifier_window"] == "f" * 32

    forged = resign(genuine, lambda s: renamed(s, "f" * 32, "r-gen"))
    with peer(Forger(forged)) as addr:
        unkeyed, props = inner(addr)
        keyed, _ = inner(addr, "--verifier-key", str(pub(lab)))
    assert unkeyed.ret == pytest.ExitCode.OK, unkeyed.stdout.str()
    assert (props["verifier_held"], props["verifier_seal_signature"]) == ("True", "not checked")
    assert keyed.ret == pytest.ExitCode.TESTS_FAILED
    keyed.stdout.fnmatch_lines(["*verifier gate on run r-gen:*signed by key*"])


# ------------------------------------------------------------------ check_seal, field by field


def _requests(s: dict[str, Any], wid: str) -> None:
    s["predicate"]["seal"]["requests"] = {"sent": 1, "served": 1, "ids_sha256": "0" * 64}


def _entry(s: dict[str, Any], wid: str) -> None:
    s["predicate"]["seal"]["open_entry"] = {"seq": 1, "hash": "0" * 64}


def _size(s: dict[str, Any], wid: str) -> None:
    s["predicate"]["seal"]["results"]["size"] = 7


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda s, wid: renamed(s, "e" * 32, "r-gen"), "it seals window eeee"),
        (lambda s, wid: renamed(s, wid, "r-x"), "it is on run 'r-x', not 'r-gen'"),
        (_size, "its results are 7 bytes, not 0"),
        (_requests, "it checked 1 request ids; this client sent none"),
        (_entry, "it closes window entry #1 "),
    ],
)
def test_each_field_a_seal_names_is_checked(
    genuine: str, edit: Callable[[dict[str, Any], str], None], named: str
) -> None:
    """Each claim of the signed content is compared with what was asked (here without a key:
    the content alone): the window, the run, the results' size, the request ids, the window
    entry it closes. The genuine seal as asked passes; each edit is named (exit 7)."""
    from servewitness.client.window import AnswerMismatch, Expected, check_seal

    c = content_of(genuine)["seal"]
    asked = wire.WindowSealing(c["window_id"], c["run"], EMPTY, 0, "-", 5.0)
    expected = Expected((c["open_entry"]["seq"], c["open_entry"]["hash"]), c["policy_digest"])
    assert check_seal(wire.SealedWindow(True, genuine), asked, expected).held is True
    doc = json.loads(genuine)
    statement = json.loads(base64.b64decode(doc["envelope"]["payload"]))
    edit(statement, c["window_id"])
    doc["envelope"]["payload"] = base64.b64encode(st.encode(statement)).decode()
    with pytest.raises(AnswerMismatch) as got:
        check_seal(wire.SealedWindow(True, json.dumps(doc)), asked, expected)
    assert named in got.value.explain() and got.value.exit_code == 7


def test_the_clients_reading_of_a_seal_is_the_ledgers(lab: Lab, genuine: str) -> None:
    """``wire/seals.py`` (what the client may import) reads a real seal as ``ledger/`` wrote
    it: the same window, run, outcome and results, the same request-id digest; and the
    signature is checked by the one DSSE implementation both use (``wire/dsse.py``)."""
    claims = seals.read_seal(genuine)
    c = content_of(genuine)["seal"]
    assert (claims.window_id, claims.run, claims.held, claims.results_sha256) == (
        c["window_id"], c["run"], True, c["results"]["sha256"])  # fmt: skip
    assert dsse.verify is wire_dsse.verify  # the ledger's checks and the client's are one
    key = wire_dsse.load_public_key(pub(lab))
    assert wire_dsse.key_id(key) == keys.key_id(key) == claims.verifier_key_id
    assert wire_dsse.verify(claims.envelope, key).payload == claims.payload
    other = keys.generate().public_key()
    changed = {**claims.envelope, "payload": base64.b64encode(b"{}").decode()}
    with pytest.raises(WrongKey):
        wire_dsse.verify(claims.envelope, other)
    with pytest.raises(BundleCorrupt):
        wire_dsse.verify(changed, key)
