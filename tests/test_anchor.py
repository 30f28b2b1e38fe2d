"""The anchored ledger (issue 19, item 4): checkpoints always signed, as C2SP signed notes, and
a checkpoint kept outside the database that catches a rewrite of the chain and its
checkpoints, a truncation, and a note from another key; the honest ledger that grew verifies
with a consistency proof.

The notes are read here by a parser written from the C2SP spec text (signed-note,
tlog-checkpoint), not the production one, with signatures checked by `cryptography` and the
root recomputed by an RFC 6962 recursion of its own; the production code is also held to the
Go reference implementation's published vectors (golang.org/x/mod/sumdb/note).
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from servewitness.errors import BundleCorrupt, WrongKey
from servewitness.ledger import note
from servewitness.ledger.keys import load_private_key, save_keypair
from servewitness.server.db import open_database
from servewitness.server.store import Store, StoredReport
from tests.helpers import PRISTINE_VLLM_CPU, Backend, rechain, verifier_cli
from tests.test_gate_e2e import Daemon
from tests.test_ledger import populated

# The reference implementation's example (golang.org/x/mod/sumdb/note, doc.go and note_test.go)
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_SIG = (
    "x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM="
)
# A real checkpoint of sum.golang.org (as quoted by google/trillian-examples' gossip tests):
# its key name is not its origin, which the spec allows.
SUMDB_VKEY_RAW = "Ac4zctda0e5eza+HJyk9SxEdh+s3Ux18htTTAD8OuAn8"
SUMDB_NOTE = (
    "go.sum database tree\n13485\n/ZWur4obeiqK+ASdnPK+/Rmz6LPQMUeSmHh0+UkL54Y=\n\n"
    "\u2014 sum.golang.org Az3grnQReYTvpCrRxT+w50vixbqBlB/aPS8bL8f8KW4HHP+UjLSXOJgCh4f54n8hO6lr"
    "ESglzyRXMXnhaWzaeY3zqw8=\n"
)


def test_notes_match_the_reference_implementations_vectors() -> None:
    seed = base64.b64decode(GO_SKEY.split("+", 4)[4])
    assert seed[0] == 1
    key = Ed25519PrivateKey.from_private_bytes(seed[1:])
    assert note.sign(GO_TEXT, key, "PeterNeumann") == f"{GO_TEXT}\n\u2014 PeterNeumann {GO_SIG}\n"
    assert note.verifier_key("PeterNeumann", key.public_key()) == GO_VKEY
    pub = Ed25519PublicKey.from_public_bytes(base64.b64decode(SUMDB_VKEY_RAW)[1:])
    assert note.key_hash("sum.golang.org", pub).hex() == "033de0ae"
    cp = note.verify(SUMDB_NOTE, pub)
    assert (cp.origin, cp.size) == ("go.sum database tree", 13485)
    assert base64.b64encode(cp.root).decode() == "/ZWur4obeiqK+ASdnPK+/Rmz6LPQMUeSmHh0+UkL54Y="
    altered = SUMDB_NOTE.replace("13485", "13486")
    with pytest.raises(BundleCorrupt, match="does not verify"):
        note.verify(altered, pub)
    with pytest.raises(WrongKey):
        note.verify(SUMDB_NOTE, key.public_key())


# An independent reader of the spec: c2sp.org/signed-note and c2sp.org/tlog-checkpoint ------


def spec_parse(data: bytes) -> tuple[str, int, bytes, list[tuple[str, bytes, bytes]], bytes]:
    """(origin, size, root, [(key name, key ID, signature)], signed text) per the spec."""
    s = data.decode("utf-8")
    assert s.endswith("\n") and not any(ord(c) < 0x20 and c != "\n" for c in s)
    i = s.rindex("\n\n")  # the text is separated from the signatures by the last empty line
    text, sig_block = s[: i + 1], s[i + 2 :]
    sigs = []
    for line in sig_block.split("\n")[:-1]:
        assert line.startswith("\u2014 ")
        name, b64 = line[2:].split(" ")
        assert name and "+" not in name and " " not in name
        blob = base64.b64decode(b64)
        sigs.append((name, blob[:4], blob[4:]))
    lines = text.split("\n")[:-1]
    assert len(lines) >= 3 and all(lines)
    assert lines[1] == str(int(lines[1]))  # ASCII decimal, no leading zeroes
    root = base64.b64decode(lines[2])
    assert len(root) == 32
    return lines[0], int(lines[1]), root, sigs, text.encode()


def spec_mth(leaves: list[bytes]) -> bytes:
    """RFC 6962 section 2.1, recursively."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return hashlib.sha256(b"\x01" + spec_mth(leaves[:k]) + spec_mth(leaves[k:])).digest()


def ledger_hashes(target: str) -> list[bytes]:
    db = open_database(target, read_only=True)
    try:
        return [bytes.fromhex(h) for (h,) in db.execute("SELECT hash FROM ledger ORDER BY seq")]
    finally:
        db.close()


def test_a_stored_checkpoint_is_a_c2sp_note_that_an_independent_reader_verifies(
    backend: Backend, tmp_path: Path
) -> None:
    populated(backend.target)
    key = Ed25519PrivateKey.generate()
    s = Store(backend.target)
    try:
        cp = s.sign_checkpoint(key)
    finally:
        s.close()
    assert cp is not None and cp.note is not None
    out = verifier_cli("audit", "checkpoint", "--db", backend.target)
    assert out.returncode == 0 and out.stdout == cp.note, out.stderr
    origin, size, root, sigs, text = spec_parse(out.stdout.encode())
    leaves = ledger_hashes(backend.target)
    assert size == len(leaves) == 6 and root == spec_mth(leaves)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    ((name, key_id, sig),) = sigs
    assert name == origin  # the key name is the origin line (tlog-checkpoint's SHOULD)
    assert key_id == hashlib.sha256(name.encode() + b"\n\x01" + raw).digest()[:4]
    Ed25519PublicKey.from_public_bytes(raw).verify(sig, text)  # raises if it does not verify


# The attacks, against a checkpoint kept elsewhere ------------------------------------------


def grow(target: str, n: int, start: int = 10) -> None:
    """N more honest reports, through the store (each one ledger entry)."""
    s = Store(target)
    try:
        for i in range(start, start + n):
            s.save_report(StoredReport("a", i, "t", 200.0 + i, f"r{i}".encode()), {})
    finally:
        s.close()


def signed(target: str, key: Ed25519PrivateKey) -> str:
    s = Store(target)
    try:
        cp = s.sign_checkpoint(key)
    finally:
        s.close()
    assert cp is not None and cp.note is not None
    return cp.note


def rewrite_chain(backend: Backend) -> None:
    """Edit report 2's bytes and recompute every entry's subject and hash after it: a chain
    that verifies on its own (test_ledger's consistent rewrite)."""
    db = open_database(backend.target)
    db.execute("UPDATE reports SET report = ? WHERE agent_id = 'a' AND seq = 2", (b"forged",))
    rechain(db)
    db.close()


@pytest.fixture
def anchored(backend: Backend, tmp_path: Path) -> tuple[Backend, Path, Path, Path]:
    """A ledger with a checkpoint exported to a file (OLD.note, kept outside the database)
    that then grew and was signed again: (backend, OLD.note, public key, private key)."""
    key_path = tmp_path / "v.key"
    save_keypair(Ed25519PrivateKey.generate(), key_path)
    key = load_private_key(key_path)
    populated(backend.target)
    signed(backend.target, key)
    old = tmp_path / "OLD.note"
    out = verifier_cli("audit", "checkpoint", "--db", backend.target, "--out", str(old))
    assert out.returncode == 0, out.stderr
    grow(backend.target, 5)
    signed(backend.target, key)
    return backend, old, tmp_path / "v.key.pub", key_path


def audit_verify(b: Backend, old: Path, pub: Path) -> tuple[int, dict[str, object], str]:
    out = verifier_cli(
        "audit", "verify", "--db", b.target, "--checkpoint", str(old), "--key", str(pub), "--json"
    )
    return out.returncode, json.loads(out.stdout or "{}"), out.stderr


def test_the_honest_ledger_that_grew_extends_the_checkpoint_kept_elsewhere(
    anchored: tuple[Backend, Path, Path, Path], tmp_path: Path
) -> None:
    """The negative control: exit 0, a consistency proof from OLD's 6 entries to 11; the
    same proof produced by `audit consistency` and checked offline against both notes."""
    b, old, pub, _ = anchored
    code, got, err = audit_verify(b, old, pub)
    assert code == 0 and got["ok"] and got["scope"] == "anchored", (got, err)
    anchor = got["anchor"]
    assert isinstance(anchor, dict)
    assert (anchor["size"], anchor["consistency"]["to"]["size"]) == (6, 11)
    assert anchor["consistency"]["proof"]
    out = verifier_cli("audit", "verify", "--db", b.target, "--checkpoint", str(old),
                       "--key", str(pub))  # fmt: skip
    assert out.returncode == 0 and "append-only since the checkpoint kept outside" in out.stdout
    new = tmp_path / "NEW.note"
    assert verifier_cli("audit", "checkpoint", "--db", b.target, "--out", str(new)).returncode == 0
    # --json: the note inside one object (stdout is JSON alone), the proof likewise
    noted = json.loads(verifier_cli("audit", "checkpoint", "--db", b.target, "--json").stdout)
    assert (noted["note"], noted["size"], noted["out"]) == (new.read_text(), 11, None)
    proved = verifier_cli("audit", "consistency", "--from", str(old), "--key", str(pub),
                          "--db", b.target, "--json")  # fmt: skip
    doc = json.loads(proved.stdout)
    assert (doc["consistent"], doc["from"], doc["to"], doc["proof"]["to"]["size"]) == (
        True, 6, 11, 11
    ), doc  # fmt: skip
    proof = tmp_path / "proof.json"
    out = verifier_cli("audit", "consistency", "--from", str(old), "--key", str(pub),
                       "--db", b.target, "--out", str(proof))  # fmt: skip
    assert out.returncode == 0, out.stderr
    offline = ["audit", "consistency", "--from", str(old), "--to", str(new), "--key", str(pub),
               "--proof", str(proof)]  # fmt: skip
    out = verifier_cli(*offline)
    assert out.returncode == 0 and "consistent: 6 entries -> 11" in out.stdout, out.stderr
    doc = json.loads(proof.read_text())
    doc["proof"][0] = base64.b64encode(b"\x00" * 32).decode()  # a forged proof
    proof.write_text(json.dumps(doc))
    out = verifier_cli(*offline)
    assert out.returncode == 1 and "does not verify" in out.stderr, out.stderr


def test_without_a_checkpoint_kept_elsewhere_verify_says_it_is_internal_only(
    anchored: tuple[Backend, Path, Path, Path],
) -> None:
    """What the database alone can show after the rewrite below: it agrees with itself, and
    `audit verify` says that this is all it shows instead of a bare OK."""
    b, _, _, _ = anchored
    rewrite_chain(b)
    b.sql("DELETE FROM checkpoints")
    out = verifier_cli("audit", "verify", "--db", b.target)
    assert out.returncode == 0 and "internal consistency only" in out.stdout, out.stderr
    out = verifier_cli("audit", "verify", "--db", b.target, "--json")
    assert json.loads(out.stdout)["scope"] == "internal"


def test_a_consistent_rewrite_with_its_checkpoints_deleted_is_caught(
    anchored: tuple[Backend, Path, Path, Path],
) -> None:
    """Edit report 2's bytes, re-chain every hash after it, delete every stored checkpoint:
    the chain verifies on its own, and the checkpoint kept elsewhere names the rewrite. Fails
    without the anchor (the run above shows the database alone says intact)."""
    b, old, pub, _ = anchored
    rewrite_chain(b)
    b.sql("DELETE FROM checkpoints")
    assert b.check().ok  # the chain alone is fooled
    code, got, err = audit_verify(b, old, pub)
    assert code == 1 and "the chain was rewritten after it was signed" in err, (got, err)
    assert got["anchor"]["kind"] == "rewritten"  # type: ignore[index]
    assert "Traceback" not in err


def test_a_restarted_verifier_signing_the_rewrite_does_not_launder_it(
    anchored: tuple[Backend, Path, Path, Path],
) -> None:
    """Variation: after the rewrite and the deletion, the verifier restarts and signs a fresh
    checkpoint over the rewritten ledger (it cannot know), so the database holds a valid
    note by the right key again. The checkpoint kept elsewhere still names the rewrite."""
    b, old, pub, key_path = anchored
    rewrite_chain(b)
    b.sql("DELETE FROM checkpoints")
    signed(b.target, load_private_key(key_path))
    code, got, err = audit_verify(b, old, pub)
    assert code == 1 and got["anchor"]["kind"] == "rewritten", (got, err)  # type: ignore[index]


def test_a_verifier_refuses_to_sign_over_a_rewrite_its_checkpoints_show(
    anchored: tuple[Backend, Path, Path, Path],
) -> None:
    """With the stored checkpoints left in place, a verifier restarted on the rewritten ledger
    refuses to sign a checkpoint inconsistent with those it signed (tlog-checkpoint's first
    rule), instead of blessing the rewrite."""
    b, _, _, key_path = anchored
    grow(b.target, 2, start=50)  # something new to sign
    rewrite_chain(b)
    s = Store(b.target)
    try:
        with pytest.raises(Exception, match="rewritten"):
            s.sign_checkpoint(load_private_key(key_path))
    finally:
        s.close()


def test_a_truncated_ledger_is_caught(anchored: tuple[Backend, Path, Path, Path]) -> None:
    """Delete every entry from 4 on, with the rows they record and the checkpoints: a shorter
    chain that verifies on its own, below OLD's 6 entries."""
    b, old, pub, _ = anchored
    b.sql(
        "DELETE FROM reports WHERE NOT (agent_id = 'a' AND seq = 1)",
        "DELETE FROM verdicts",
        "DELETE FROM ledger WHERE seq > 3",
        "DELETE FROM checkpoints",
    )
    assert b.check().ok, b.check()
    code, got, err = audit_verify(b, old, pub)
    assert code == 1 and got["anchor"]["kind"] == "truncated", (got, err)  # type: ignore[index]
    assert "fewer than the 6" in err


def test_dropped_or_resigned_stored_checkpoints_are_caught(
    anchored: tuple[Backend, Path, Path, Path], tmp_path: Path
) -> None:
    """Deleting the stored checkpoints alone is caught (OLD is no longer among them); so is
    replacing them with ones the attacker signed with a key of their own."""
    b, old, pub, _ = anchored
    b.sql("DELETE FROM checkpoints")
    code, got, err = audit_verify(b, old, pub)
    assert code == 1 and got["anchor"]["kind"] == "checkpoint_dropped", (got, err)  # type: ignore[index]
    signed(b.target, Ed25519PrivateKey.generate())  # the attacker's own checkpoint
    b.sql(("UPDATE checkpoints SET size = ?", (6,)))  # claims OLD's size (root differs)
    code, got, err = audit_verify(b, old, pub)
    assert code == 1, (got, err)


def test_a_checkpoint_signed_by_another_key_or_altered_is_refused(
    anchored: tuple[Backend, Path, Path, Path], tmp_path: Path
) -> None:
    """The attacker swaps in a note for the rewritten ledger signed by their own key: exit 8.
    An altered note (another size, same signature): exit 7."""
    b, old, pub, _ = anchored
    rewrite_chain(b)
    b.sql("DELETE FROM checkpoints")
    forged = tmp_path / "forged.note"
    forged.write_text(signed(b.target, Ed25519PrivateKey.generate()))
    code, got, err = audit_verify(b, forged, pub)
    assert code == 8 and "not by the key given" in err, (got, err)
    text = old.read_text()
    lines = text.split("\n")
    lines[1] = "5"
    edited = tmp_path / "edited.note"
    edited.write_text("\n".join(lines))
    code, got, err = audit_verify(b, edited, pub)
    assert code == 7 and "does not verify" in err, (got, err)
    edited.write_text("not a note\n")
    code, got, err = audit_verify(b, edited, pub)
    assert code == 7 and "not a signed note" in err, (got, err)


# The verifier signs without being asked, with a key it made once ----------------------------


def test_the_verifier_signs_checkpoints_unasked_with_a_key_made_once(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real `verifier serve` given no key: it generates one (beside an SQLite database, in
    the state directory for PostgreSQL), prints its id and public key path, signs while
    serving; restarted, it keeps the same key; a checkpoint exported from the first run
    anchors the ledger the second run extended."""
    state = tmp_path / "state"
    monkeypatch.setenv("VERIFIER_STATE_DIR", str(state))
    sock = tmp_path / "v.sock"
    (tmp_path / "p.toml").write_text('version = 1\n[[hooks]]\nname = "h"\n' + PRISTINE_VLLM_CPU)

    def serve(run: str, log: str) -> Daemon:
        args = ["serve", "--listen", f"unix:{sock}", "--db", backend.target,
                "--report-interval", "0.2", "--run", f"{run}={tmp_path / 'p.toml'}",
                "--checkpoint-every", "1"]  # fmt: skip
        d = Daemon(args, tmp_path / log).start()
        deadline = time.monotonic() + 30
        while "ledger checkpoints signed by key" not in (tmp_path / log).read_text():
            assert time.monotonic() < deadline, (tmp_path / log).read_text()
            time.sleep(0.1)
        return d

    def wait_checkpoint(size: int) -> str:
        deadline = time.monotonic() + 60
        while True:
            out = verifier_cli("audit", "checkpoint", "--db", backend.target)
            if out.returncode == 0 and spec_parse(out.stdout.encode())[1] >= size:
                return out.stdout
            assert time.monotonic() < deadline, out.stderr
            time.sleep(0.2)

    first = serve("r1", "serve1.log")
    try:
        note1 = wait_checkpoint(1)  # signed while serving, nobody asked
    finally:
        first.stop()
    keys = list(state.glob("*.signing.key")) if "://" in backend.target else [
        Path(backend.target + ".signing.key")]  # fmt: skip
    assert len(keys) == 1 and keys[0].exists(), list(tmp_path.rglob("*"))
    key_bytes = keys[0].read_bytes()
    assert keys[0].stat().st_mode & 0o077 == 0
    log1 = (tmp_path / "serve1.log").read_text()
    pub_path = keys[0].with_name(keys[0].name + ".pub")
    assert "generated now" in log1 and str(pub_path) in log1, log1
    origin, _, _, ((_, _, sig),), text = spec_parse(note1.encode())
    load_private_key(keys[0]).public_key().verify(sig, text)  # `cryptography` itself
    old = tmp_path / "OLD.note"
    old.write_text(note1)

    second = serve("r2", "serve2.log")
    try:
        size1 = spec_parse(note1.encode())[1]
        note2 = wait_checkpoint(size1 + 2)  # run r2 and its first verdict
    finally:
        second.stop()
    assert keys[0].read_bytes() == key_bytes  # kept, never overwritten
    log2 = (tmp_path / "serve2.log").read_text()
    assert "(kept;" in log2 and origin.rsplit("/", 1)[1] in log2, log2
    assert spec_parse(note2.encode())[0] == origin
    code, got, err = audit_verify(backend, old, pub_path)
    assert code == 0 and got["anchor"]["consistency"]["from"]["size"] == size1, (got, err)  # type: ignore[index]


def test_a_public_key_without_its_private_half_is_never_replaced(tmp_path: Path) -> None:
    """A lost private key next to its public half: the verifier refuses to start rather than
    generate a new identity silently."""
    db = tmp_path / "db.sqlite3"
    save_keypair(Ed25519PrivateKey.generate(), tmp_path / "db.sqlite3.signing.key")
    (tmp_path / "db.sqlite3.signing.key").unlink()
    out = verifier_cli("serve", "--listen", f"unix:{tmp_path / 's'}", "--db", str(db), timeout=60)
    assert out.returncode == 3 and "exists without its private key" in out.stderr, out.stderr
