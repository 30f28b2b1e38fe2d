"""`verifier audit export` and the offline `verifier audit verify BUNDLE --key`, and signed
checkpoints in the database, on SQLite and a real PostgreSQL: an export verifies with the
verifier's public key alone; a tampered bundle (7), another key (8), an unknown id (6) and a
missing key (3) are told apart; a ledger rewritten behind a signed checkpoint is named."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from servewitness.ledger.keys import generate, load_private_key, save_keypair
from servewitness.server.db import open_database
from servewitness.server.store import Store
from tests.helpers import Backend, rechain, verifier_cli
from tests.test_bindings_store import stocked


def keys(tmp_path: Path, name: str = "verifier.key") -> tuple[Path, Path]:
    out = verifier_cli("keygen", "--out", str(tmp_path / name))
    assert out.returncode == 0, out.stderr
    return tmp_path / name, tmp_path / f"{name}.pub"


def test_an_export_verifies_offline_and_tampering_is_told_apart(
    backend: Backend, tmp_path: Path
) -> None:
    stocked(backend.target)
    key, pub = keys(tmp_path)
    bundle = tmp_path / "audit.json"
    out = verifier_cli(
        "audit", "export", "--db", backend.target, "--key", str(key), "--out", str(bundle),
        "--request", "alpha", "--run", "all", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(bundle.read_text())
    said = json.loads(out.stdout)
    assert said["bundle"] == str(bundle) and said["statements"] == len(data["statements"])
    kinds = sorted(c["kind"] for c in data["contents"])
    assert kinds == ["bindings", "manifest", "run", "verdict"], kinds
    out = verifier_cli("audit", "verify", str(bundle), "--key", str(pub))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "bundle verifies" in out.stdout

    # The request's runtime evidence statement names the runner and hook counts.
    (env,) = [s for s, c in zip(data["statements"], data["contents"], strict=True)
              if c["kind"] == "bindings"]  # fmt: skip
    payload = json.loads(base64.b64decode(env["payload"]))
    details = payload["predicate"]["details"]
    assert details["runner"].endswith("CPUModelRunner") and details["hooks"] == {"h": 16}

    # Another key: 8. A binding row edited inside the bundle: 7. Not JSON: 7.
    _, other = keys(tmp_path, "other.key")
    out = verifier_cli("audit", "verify", str(bundle), "--key", str(other))
    assert out.returncode == 8, out.stdout + out.stderr
    tampered = json.loads(bundle.read_text())
    for c in tampered["contents"]:
        if c["kind"] == "bindings":
            rows = base64.b64decode(c["fields"]["spans_b64"])
            assert b",31," in rows  # alpha's 31 tokens
            c["fields"]["spans_b64"] = base64.b64encode(rows.replace(b",31,", b",3,")).decode()
    (tmp_path / "tampered.json").write_text(json.dumps(tampered))
    out = verifier_cli("audit", "verify", str(tmp_path / "tampered.json"), "--key", str(pub))
    assert out.returncode == 7, out.stdout + out.stderr
    (tmp_path / "cut.json").write_bytes(bundle.read_bytes()[:500])
    out = verifier_cli("audit", "verify", str(tmp_path / "cut.json"), "--key", str(pub))
    assert out.returncode == 7 and "Traceback" not in out.stderr, out.stderr

    # Unknown request: 6. No key file: 3. Neither a bundle nor a database: 2.
    out = verifier_cli(
        "audit", "export", "--db", backend.target, "--key", str(key), "--out",
        str(tmp_path / "x.json"), "--request", "gamma",
    )  # fmt: skip
    assert out.returncode == 6 and not (tmp_path / "x.json").exists(), out.stderr
    out = verifier_cli("audit", "verify", str(bundle), "--key", str(tmp_path / "none.pub"))
    assert out.returncode == 3, out.stderr
    out = verifier_cli("audit", "verify")
    assert out.returncode == 2, out.stderr


def test_a_ledger_rewritten_behind_a_signed_checkpoint_is_named(
    backend: Backend, tmp_path: Path
) -> None:
    stocked(backend.target)
    key_path = tmp_path / "v.key"
    save_keypair(generate(), key_path)
    s = Store(backend.target)
    try:
        cp = s.sign_checkpoint(load_private_key(key_path))
        assert cp is not None and cp.size == s.verify_ledger().entries
        assert s.sign_checkpoint(load_private_key(key_path)) is None  # nothing new to sign
    finally:
        s.close()
    pub = str(key_path) + ".pub"
    out = verifier_cli("audit", "verify", "--db", backend.target, "--key", pub)
    assert out.returncode == 0 and "1 signed checkpoint(s) hold" in out.stdout, out.stderr

    # Edit a report and recompute the whole chain after it: the chain verifies, the signed
    # checkpoint does not.
    db = open_database(backend.target)
    db.execute("UPDATE reports SET target = 'elsewhere' WHERE seq = 1")
    rechain(db)
    db.close()
    out = verifier_cli("audit", "verify", "--db", backend.target, "--json")
    got = json.loads(out.stdout)
    assert out.returncode == 1 and not got["ok"], got
    assert "chain was rewritten after it was signed" in got["problem"], got
