"""A seal says which other windows its result could have been chosen from.

The attack: a lab opens a window, runs the benchmark, seals it; the numbers disappoint, or a
hook lagged and the seal says so; it tries again, on the same run or a new one, and shows the
auditor the one seal that held with the best numbers. That seal verifies: it is true of its
own window. So every seal counts, in its signed content, every other window its verifier's
ledger held when it was sealed, by outcome (held, did not hold, never sealed, unreadable in
the database), on its run and on the whole ledger; `verify-seal` prints and returns the
count. A fresh database with the same key is a fork a kept checkpoint note names
(tests/test_window_seal.py); another key is not the auditor's.

Real verifier, real gRPC, a real agent over a probed stepping worker (tests/test_window_seal.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from servewitness import wire
from servewitness.client.api import VerifierClient
from servewitness.client.window import sha256_file
from servewitness.ledger import dsse, keys
from servewitness.ledger import statement as st
from servewitness.ledger.verify_seal import other_windows_shape
from tests import test_window_seal as ws
from tests.test_gate_e2e import Daemon
from tests.test_window_seal import Stepper, V, cli, payload, rewrite, verify_seal

# The seal tests' fixtures: a real verifier, a probed stepping worker, an agent reporting it.
verifier, stepper, reporting = ws.verifier, ws.stepper, ws.reporting

ZERO = dict.fromkeys(("opened", "held", "not_held", "not_sealed", "unreadable"), 0)


def _seal(
    c: VerifierClient, run: str, results: Path, stepper: Stepper, ids: tuple[str, ...] = ()
) -> bool:
    """A window on RUN with steps that fire the hook, sealed over RESULTS (naming IDS)."""
    opened = c.open_window(run, 30)
    stepper.do("step", 3)
    sha, size = sha256_file(results)
    timeout = 2.0 if ids else 30.0  # named ids that are never served: waited for, then broken
    sealing = wire.WindowSealing(opened.window_id, run, sha, size, results.name, timeout, ids)
    return c.seal_window(sealing).held


def _harness(v: V, stepper: Stepper, results: Path) -> subprocess.CompletedProcess[str]:
    """A window on run r as a harness makes one (`verifier window`, steps, `verifier seal`
    over RESULTS, held): the seal command's output."""
    w = v.tmp / "w.json"
    out = cli("window", "r", "--out", str(w), "--timeout", "30", "--verifier", v.addr)
    assert out.returncode == 0, out.stderr
    stepper.do("step", 3)
    out = cli("seal", "r", "--window", str(w), "--results", str(results), "--timeout", "30")
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def test_the_seal_shown_names_the_attempts_it_was_chosen_from(
    verifier: V, stepper: Stepper, reporting: Daemon
) -> None:
    v = verifier
    results = v.tmp / "results.json"
    results.write_text('{"tokens_per_s": 99.0}\n')
    with VerifierClient(v.addr) as c:
        assert not _seal(c, "r", results, stepper, ("never-served",))  # 1: did not hold
        c.open_window("r", 30)  # attempt 2: abandoned, never sealed
        assert _seal(c, "other", results, stepper)  # 3, on another run: no hiding place
    results.write_text('{"tokens_per_s": 123.4}\n')
    out = _harness(v, stepper, results)  # the attempt shown
    line = (
        "other windows when this one was sealed: 2 (1 did not hold, 1 never sealed) on run r, "
        "3 (1 held, 1 did not hold, 1 never sealed) on the whole ledger"
    )
    assert line in out.stdout, out.stdout
    seal = results.with_name("results.json.seal.json")

    code, r = verify_seal(v, seal, "--results", str(results))
    assert code == 0, r  # true of its own window: it verifies, and says what it was among
    assert r["other_windows"]["run"] == {**ZERO, "opened": 2, "not_held": 1, "not_sealed": 1}
    assert r["other_windows"]["ledger"] == {
        **ZERO, "opened": 3, "held": 1, "not_held": 1, "not_sealed": 1,
    }  # fmt: skip
    text = cli("audit", "verify-seal", str(seal), "--key", str(v.pub))
    assert text.returncode == 0 and line in text.stdout, text.stdout + text.stderr

    # The lab edits the count away: a typed seal fails its signature; the same statement
    # re-signed with the verifier's own key (a key holder) no longer recomputes its ledger
    # entry, which the signed checkpoint covers.
    doc, stmt = payload(seal)
    clean = json.loads(json.dumps(stmt))
    clean["predicate"]["seal"]["other_windows"]["run"] = dict(ZERO)
    clean["predicate"]["seal"]["other_windows"]["ledger"] = dict(ZERO)
    code, r = verify_seal(v, rewrite(seal, doc, clean, v.tmp / "typed.json"))
    assert code == 1 and "signature does not verify" in " ".join(r["problems"]), r
    resigned = json.loads(json.dumps(doc))
    own = keys.load_private_key(v.server.key_path)
    resigned["envelope"] = dsse.sign(st.encode(clean), st.PAYLOAD_TYPE, own)
    (v.tmp / "resigned.json").write_text(json.dumps(resigned))
    code, r = verify_seal(v, v.tmp / "resigned.json")
    assert code == 1, r
    assert "does not recompute the seal entry's subject" in " ".join(r["problems"]), r


def test_the_first_window_says_it_was_the_first(
    verifier: V, stepper: Stepper, reporting: Daemon
) -> None:
    v = verifier
    results = v.tmp / "results.json"
    results.write_text("{}\n")
    out = _harness(v, stepper, results)
    assert "other windows: none (the first window on this verifier's ledger)" in out.stdout
    code, r = verify_seal(v, results.with_name("results.json.seal.json"))
    assert code == 0 and r["other_windows"]["ledger"] == ZERO, r


def _counts(**over: Any) -> dict[str, Any]:
    c: dict[str, Any] = {
        "ledger_size": 9,
        "ledger": {**ZERO, "opened": 3, "held": 1, "not_held": 1, "not_sealed": 1},
        "run": {**ZERO, "opened": 1, "not_sealed": 1},
    }
    c.update(over)
    return c


@pytest.mark.parametrize(
    "counts",
    [
        _counts(ledger_size=-1),
        _counts(ledger_size=3),  # three other windows and its own need four entries
        _counts(run={**ZERO, "opened": 2, "not_sealed": 2}),  # more not_sealed than the ledger
        _counts(run={**ZERO, "opened": 2, "not_sealed": 1}),  # outcomes short of opened
        _counts(run={**ZERO, "opened": True, "not_sealed": True}),  # a bool is no count
        _counts(run={**ZERO, "opened": 1.0, "not_sealed": 1}),
        _counts(run={"opened": 0}),
        _counts(extra=1),
        [],
    ],
)
def test_a_malformed_count_is_refused(counts: object) -> None:
    assert other_windows_shape(_counts())
    assert not other_windows_shape(counts)
