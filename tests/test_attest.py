"""Signed attestations over the audit ledger: Merkle proofs against the RFC 6962 vectors,
DSSE, keys, and export bundles that verify offline, with negative controls that must fail
with the right exit code."""

from __future__ import annotations

import base64
import copy
import hashlib
import itertools
import json
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from servewitness._cli.audit_cmd import run_offline_verify
from servewitness.ledger import chain, dsse, keys, merkle
from servewitness.ledger import statement as st
from servewitness.ledger.bundle import (
    Attestation,
    LedgerEntry,
    build_bundle,
    content,
    dump,
    entries_from_db,
    tree_from_db,
)
from servewitness.ledger.errors import (
    BundleCorrupt,
    KeyExists,
    KeyFileMissing,
    NotAKey,
    NotEd25519,
    WrongKey,
)
from servewitness.ledger.verify_bundle import check_bundle, verify_bundle
from servewitness.server import schema
from servewitness.server.db import SQLiteDatabase
from tests.helpers import verifier_cli

# Merkle ----------------------------------------------------------------------------------

# RFC 6962 reference data as published with Certificate Transparency's implementations
# (transparency-dev/merkle testonly): leaves, then the tree head for every size 1..8.
CT_LEAVES = [bytes.fromhex(h) for h in ("", "00", "10", "2021", "3031", "40414243",
             "5051525354555657", "606162636465666768696a6b6c6d6e6f")]  # fmt: skip
CT_ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
CT_INCLUSION = {
    (0, 8): ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
             "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
    (5, 8): ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
}  # fmt: skip
CT_CONSISTENCY = {
    (1, 8): ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
             "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
    (2, 8): ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
    (6, 8): ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
    (2, 5): ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"],
}  # fmt: skip


def reference_root(leaves: list[bytes]) -> bytes:
    """RFC 6962 §2.1 MTH, written the way the RFC states it (recursive, split at the largest
    power of two below n)."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return hashlib.sha256(
        b"\x01" + reference_root(leaves[:k]) + reference_root(leaves[k:])
    ).digest()


def test_merkle_roots_match_the_rfc6962_vectors() -> None:
    assert merkle.root([]).hex() == hashlib.sha256(b"").hexdigest()
    assert merkle.Tree([]).root() == merkle.EMPTY_ROOT
    for n in range(1, 9):
        assert merkle.root(CT_LEAVES[:n]).hex() == CT_ROOTS[n - 1], n
        assert merkle.Tree(CT_LEAVES[:n]).root().hex() == CT_ROOTS[n - 1], n
        assert merkle.Tree(CT_LEAVES).root(n).hex() == CT_ROOTS[n - 1], n


def test_merkle_hand_computed_small_trees() -> None:
    a, b, c = b"a", b"b", b"c"
    la, lb, lc = (hashlib.sha256(b"\x00" + x).digest() for x in (a, b, c))
    ab = hashlib.sha256(b"\x01" + la + lb).digest()
    assert merkle.root([a]) == la
    assert merkle.root([a, b]) == ab
    # three leaves: ((a b) c), not (a (b c)) and not c paired with itself
    assert merkle.root([a, b, c]) == hashlib.sha256(b"\x01" + ab + lc).digest()


def test_merkle_proofs_match_the_rfc6962_vectors() -> None:
    tree = merkle.Tree(CT_LEAVES)
    for (index, size), want in CT_INCLUSION.items():
        assert [p.hex() for p in tree.inclusion_proof(index, size)] == want
        proof = [bytes.fromhex(p) for p in want]
        root = bytes.fromhex(CT_ROOTS[size - 1])
        assert merkle.verify_inclusion(CT_LEAVES[index], index, size, proof, root)
    for (first, second), want in CT_CONSISTENCY.items():
        assert [p.hex() for p in tree.consistency_proof(first, second)] == want, (first, second)
        proof = [bytes.fromhex(p) for p in want]
        r1, r2 = bytes.fromhex(CT_ROOTS[first - 1]), bytes.fromhex(CT_ROOTS[second - 1])
        assert merkle.verify_consistency(first, second, r1, r2, proof)


def _leaves(n: int) -> list[bytes]:
    return [hashlib.sha256(b"leaf %d" % i).digest() for i in range(n)]


def test_merkle_every_size_1_to_70_agrees_with_the_rfc_recursion() -> None:
    leaves = _leaves(70)
    tree = merkle.Tree(leaves)
    roots = [merkle.EMPTY_ROOT] + [reference_root(leaves[:n]) for n in range(1, 71)]
    for n in range(1, 71):
        assert merkle.root(leaves[:n]) == roots[n], n
        assert tree.root(n) == roots[n], n
        for i in range(n):
            proof = tree.inclusion_proof(i, n)
            assert merkle.verify_inclusion(leaves[i], i, n, proof, roots[n]), (i, n)
            # the proof proves this leaf at this index of this size, nothing else
            assert not merkle.verify_inclusion(leaves[i] + b"x", i, n, proof, roots[n])
            if n > 1:
                assert not merkle.verify_inclusion(leaves[i], (i + 1) % n, n, proof, roots[n])
                assert not merkle.verify_inclusion(leaves[i], i, n, proof[:-1], roots[n])
                bad = [bytes([proof[0][0] ^ 1]) + proof[0][1:], *proof[1:]]
                assert not merkle.verify_inclusion(leaves[i], i, n, bad, roots[n])
            assert not merkle.verify_inclusion(leaves[i], i, n, [*proof, roots[n]], roots[n])
        for m in range(0, n + 1):
            proof = tree.consistency_proof(m, n)
            assert merkle.verify_consistency(m, n, roots[m], roots[n], proof), (m, n)
            if 0 < m < n:
                assert not merkle.verify_consistency(m, n, roots[m], roots[n - 1], proof)
                assert not merkle.verify_consistency(m, n, roots[m - 1], roots[n], proof)
                assert not merkle.verify_consistency(m, n, roots[m], roots[n], proof[:-1])
                bad = [*proof[:-1], bytes([proof[-1][0] ^ 1]) + proof[-1][1:]]
                assert not merkle.verify_consistency(m, n, roots[m], roots[n], bad)


def test_merkle_1000_leaves_every_index() -> None:
    leaves = _leaves(1000)
    tree = merkle.Tree(leaves)
    root = merkle.root(leaves)
    assert root == tree.root() == reference_root(leaves)
    for i in range(1000):
        assert merkle.verify_inclusion(leaves[i], i, 1000, tree.inclusion_proof(i), root), i
    assert merkle.inclusion_proof(leaves, 999) == tree.inclusion_proof(999)
    assert merkle.consistency_proof(leaves, 377) == tree.consistency_proof(377)


def test_merkle_streaming_root_of_many_leaves_is_bounded() -> None:
    """The root streams: 200k leaves from a generator, never held in a list."""
    n = 200_000
    r = merkle.root(i.to_bytes(32, "big") for i in range(n))
    assert r == merkle.Tree(i.to_bytes(32, "big") for i in range(n)).root()


def test_merkle_bad_arguments() -> None:
    tree = merkle.Tree(_leaves(5))
    with pytest.raises(ValueError):
        tree.inclusion_proof(5)
    with pytest.raises(ValueError):
        tree.root(6)
    with pytest.raises(ValueError):
        tree.consistency_proof(4, 3)
    assert not merkle.verify_inclusion(b"x", 0, 0, [], merkle.EMPTY_ROOT)
    assert not merkle.verify_consistency(3, 2, merkle.EMPTY_ROOT, merkle.EMPTY_ROOT, [])
    assert merkle.verify_consistency(0, 5, merkle.EMPTY_ROOT, tree.root(), [])


# Keys and DSSE -----------------------------------------------------------------------------


def test_dsse_pae_is_the_spec_example() -> None:
    assert (
        dsse.pae("http://example.com/HelloWorld", b"hello world")
        == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    assert dsse.pae("", b"") == b"DSSEv1 0  0 "
    # lengths are byte counts, not characters
    assert dsse.pae("t", "é".encode()) == b"DSSEv1 1 t 2 " + "é".encode()


def test_dsse_round_trip_and_tampering() -> None:
    key = keys.generate()
    env = dsse.sign(b'{"a":1}', "application/x-test", key)
    assert env["signatures"][0]["keyid"] == keys.key_id(key)
    v = dsse.verify(json.loads(json.dumps(env)), key.public_key())
    assert (v.payload, v.payload_type) == (b'{"a":1}', "application/x-test")
    # the signature covers PAE, not the payload alone: another type does not verify
    with pytest.raises(BundleCorrupt):
        dsse.verify({**env, "payloadType": "application/x-other"}, key.public_key())
    with pytest.raises(BundleCorrupt):
        dsse.verify({**env, "payload": dsse.b64encode(b'{"a":2}')}, key.public_key())
    # URL-safe, unpadded base64 is accepted too (the spec allows either)
    url = base64.urlsafe_b64encode(b'{"a":1}').decode().rstrip("=")
    assert dsse.verify({**env, "payload": url}, key.public_key()).payload == b'{"a":1}'
    with pytest.raises(WrongKey):
        dsse.verify(env, keys.generate().public_key())
    bad: object
    for bad in ([], {"payload": "", "payloadType": "t"}, {**env, "signatures": []}):
        with pytest.raises(BundleCorrupt):
            dsse.verify(bad, key.public_key())


def test_keys_save_load_and_refuse(tmp_path: Path) -> None:
    key = keys.generate()
    path = tmp_path / "signing.key"
    pub_path = keys.save_keypair(key, path)
    assert pub_path == tmp_path / "signing.key.pub"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert keys.key_id(keys.load_private_key(path)) == keys.key_id(key)
    assert keys.key_id(keys.load_public_key(pub_path)) == keys.key_id(key)
    with pytest.raises(KeyExists) as exists:
        keys.save_keypair(keys.generate(), path)
    assert exists.value.exit_code == 2
    assert keys.key_id(keys.load_private_key(path)) == keys.key_id(key)  # untouched
    other = keys.generate()
    keys.save_keypair(other, path, force=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert keys.key_id(keys.load_public_key(pub_path)) == keys.key_id(other)

    with pytest.raises(KeyFileMissing) as missing:
        keys.load_public_key(tmp_path / "nope.pub")
    (tmp_path / "junk").write_text("hello\n")
    with pytest.raises(NotAKey) as junk:
        keys.load_public_key(tmp_path / "junk")
    with pytest.raises(NotAKey):
        keys.load_private_key(tmp_path / "junk")
    # a private key where the public key is expected: refused, naming the .pub file
    with pytest.raises(NotAKey, match=r"private key.*signing\.key\.pub"):
        keys.load_public_key(path)
    with pytest.raises(NotAKey, match="public key"):
        keys.load_private_key(pub_path)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "ec.pub").write_bytes(
        ec_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    with pytest.raises(NotEd25519) as ec_err:
        keys.load_public_key(tmp_path / "ec.pub")
    assert {missing.value.exit_code, junk.value.exit_code, ec_err.value.exit_code} == {3}


def test_keygen_cli(tmp_path: Path) -> None:
    out = verifier_cli("keygen", "--out", str(tmp_path / "k"))
    assert out.returncode == 0, out.stderr
    key = keys.load_private_key(tmp_path / "k")
    assert keys.key_id(key) in out.stdout
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o600
    again = verifier_cli("keygen", "--out", str(tmp_path / "k"))
    assert again.returncode == 2 and "--force" in again.stderr
    nowhere = verifier_cli("keygen", "--out", str(tmp_path / "no" / "such" / "k"))
    assert nowhere.returncode == 3 and "cannot write" in nowhere.stderr, nowhere.stderr
    forced = verifier_cli("keygen", "--out", str(tmp_path / "k"), "--force")
    assert forced.returncode == 0, forced.stderr
    assert keys.key_id(keys.load_public_key(tmp_path / "k.pub")) in forced.stdout
    as_json = verifier_cli("keygen", "--out", str(tmp_path / "j"), "--json")
    assert json.loads(as_json.stdout) == {
        "private_key": str(tmp_path / "j"), "public_key": str(tmp_path / "j.pub"),
        "key_id": keys.key_id(keys.load_public_key(tmp_path / "j.pub")),
    }  # fmt: skip


# Bundles -----------------------------------------------------------------------------------


def _bindings_subject(ref: str, target: str, received: float, spans: str, ids: str) -> str:
    """chain.bindings_subject where the ledger has it (its layout, which the bundle's
    "bindings" content kind recomputes), else that layout written out."""
    fn = getattr(chain, "bindings_subject", None)
    if fn is not None:
        return str(fn(ref, target, received, spans, ids))
    return chain.sha("bindings", ref, target, received, spans, ids)


class Ledger:
    """A ledger built with chain.append (the verifier's own code), and its contents."""

    def __init__(self) -> None:
        self.db = SQLiteDatabase(":memory:")
        self.db.executescript(schema.SQLITE)
        self.contents: dict[int, dict[str, Any]] = {}

    def add(self, at: float, kind: str, ref: str, subject: str, c: dict[str, Any]) -> int:
        chain.append(self.db, at, kind, ref, subject)
        seq = int(self.db.execute("SELECT max(seq) FROM ledger").fetchone()[0])
        self.contents[seq] = c
        return seq


def _ledger(filler: int = 20) -> Ledger:
    lg = Ledger()
    policy, digest = "[run]\nname='r1'\n", "d" * 64
    lg.add(
        100.0, "run", chain.run_ref("r1"), chain.run_subject("r1", policy, digest, "cli", 100.0),
        content("run", name="r1", policy=policy, digest=digest, source="cli", created=100.0),
    )  # fmt: skip
    files = json.dumps([["vllm/x.py", "a" * 64]])
    lg.add(101.0, "manifest", "m" * 64, chain.manifest_subject(files),
           content("manifest", files_json=files, digest="m" * 64))  # fmt: skip
    for i in range(filler):
        body = b"report %d" % i
        lg.add(
            102.0 + i, "report", chain.report_ref("agent-1", i),
            chain.report_subject("agent-1", i, "t1", 102.0 + i, body),
            content("report", agent_id="agent-1", seq=i, target="t1", received=102.0 + i,
                    body_b64=dsse.b64encode(body)),
        )  # fmt: skip
    detail = json.dumps({"findings": []})
    lg.add(500.5, "verdict", chain.verdict_ref("r1", 500.5),
           chain.verdict_subject("r1", 500.5, "PASS", detail),
           content("verdict", run="r1", at=500.5, verdict="PASS", detail_json=detail))  # fmt: skip
    spans, ids = '["span",1]\n', '["req-1"]\n["req-2"]\n'
    lg.add(501.0, "bindings", chain.report_ref("agent-1", 5),
           _bindings_subject(chain.report_ref("agent-1", 5), "t1", 501.0,
                             hashlib.sha256(spans.encode()).hexdigest(),
                             hashlib.sha256(ids.encode()).hexdigest()),
           content("bindings", agent_id="agent-1", seq=5, target="t1", received=501.0,
                   spans_text=spans, ids_b64=dsse.b64encode(ids.encode())))  # fmt: skip
    lg.add(502.0, "report", chain.report_ref("agent-1", 99),
           chain.report_subject("agent-1", 99, "t1", 502.0, b"last"),
           content("report", agent_id="agent-1", seq=99, target="t1", received=502.0,
                   body_sha256=hashlib.sha256(b"last").hexdigest()))  # fmt: skip
    return lg


def _attest(lg: Ledger, seq: int) -> Attestation:
    c = lg.contents[seq]
    if c["kind"] == "verdict":
        pred = st.gate_decision(verifier_id="v1", time_verified=500.5, policy_digest="d" * 64,
                                run="r1", result="PASS")  # fmt: skip
        return Attestation(seq, c, st.GATE_DECISION, pred)
    pred = st.runtime_evidence(target="t1", collected_unix=1.0, details={"pid": 7})
    return Attestation(seq, c, st.RUNTIME_EVIDENCE, pred)


KEY = keys.generate()


def _bundle(lg: Ledger | None = None, seqs: tuple[int, ...] = (1, 2, 5, 6, 7, 23, 24, 25),
            **kw: Any) -> dict[str, Any]:  # fmt: skip
    lg = lg or _ledger()
    tree = tree_from_db(lg.db)
    entries = entries_from_db(lg.db, {*seqs, tree.size})
    return build_bundle(entries, tree, KEY, [_attest(lg, s) for s in seqs], at_unix=600.0, **kw)


def test_a_built_bundle_verifies() -> None:
    b = _bundle(since=3)
    r = verify_bundle(dump(b), KEY.public_key())
    assert r.ok and r.size == 25 and r.entries == 8 and r.statements == 8 and r.proofs == 8
    assert r.keyid == keys.key_id(KEY) and r.verifier_id == keys.key_id(KEY)
    assert r.head == b["entries"][-1]["hash"]
    assert r.consistency is not None and r.consistency["size"] == 3
    assert len(r.checks) == 5
    # the checkpoint's root is the tree head the ledger itself has
    lg = _ledger()
    assert r.root == merkle.root(bytes.fromhex(h) for (h,) in lg.db.execute(
        "SELECT hash FROM ledger ORDER BY seq")).hex()  # fmt: skip
    # compact JSON, re-serialised: the same verdict
    assert verify_bundle(json.dumps(b).encode(), KEY.public_key()).ok
    # every statement is an in-toto Statement v1 whose subject is its entry's subject
    for env, e in zip(b["statements"], b["entries"], strict=True):
        s = st.parse(dsse.b64decode(env["payload"]))
        assert env["payloadType"] == "application/vnd.in-toto+json"
        assert s.subjects[0][1] == e["subject"] and s.predicate["ledger"]["seq"] == e["seq"]


def test_a_checkpoint_over_part_of_the_ledger_verifies() -> None:
    lg = _ledger()
    tree = tree_from_db(lg.db)
    entries = entries_from_db(lg.db, [2, 10])
    b = build_bundle(entries, tree, KEY, [_attest(lg, 2)], at_unix=1.0, size=10)
    assert verify_bundle(dump(b), KEY.public_key()).size == 10
    with pytest.raises(ValueError, match="head"):
        build_bundle(entries, tree, KEY, [], at_unix=1.0, size=11)
    wrong = copy.deepcopy(lg.contents[2])
    wrong["fields"]["files_json"] = "[]"
    with pytest.raises(ValueError, match="recompute"):
        build_bundle(entries, tree, KEY, [Attestation(2, wrong, st.RUNTIME_EVIDENCE, {})],
                     at_unix=1.0, size=10)  # fmt: skip


def test_report_by_digest_matches_the_ledgers_report_subject() -> None:
    """The body_sha256 form recomputes the same subject as chain.report_subject."""
    from servewitness.ledger.bundle import content_subject

    want = chain.report_subject("a", 3, "t", 1.5, b"xyz")
    by_body = content("report", agent_id="a", seq=3, target="t", received=1.5,
                      body_b64=dsse.b64encode(b"xyz"))  # fmt: skip
    by_digest = content("report", agent_id="a", seq=3, target="t", received=1.5,
                        body_sha256=hashlib.sha256(b"xyz").hexdigest())  # fmt: skip
    assert content_subject(by_body)[1] == content_subject(by_digest)[1] == want


def _flip_b64(text: str, at: int = 10) -> str:
    raw = bytearray(dsse.b64decode(text))
    raw[at % len(raw)] ^= 0x01
    return dsse.b64encode(bytes(raw))


def _flip_hex(text: str) -> str:
    return ("1" if text[0] == "0" else "0") + text[1:]


def _resign_checkpoint(b: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> None:
    """Change the checkpoint's predicate and sign it again with KEY (a validly signed lie)."""
    s = json.loads(dsse.b64decode(b["checkpoint"]["payload"]))
    change(s)
    b["checkpoint"] = dsse.sign(st.encode(s), st.PAYLOAD_TYPE, KEY)


def _set_root(s: dict[str, Any]) -> None:
    s["predicate"]["root"] = s["subject"][0]["digest"]["sha256"] = "0" * 64


def _mut(name: str) -> Callable[[dict[str, Any]], None]:
    def payload(b: dict[str, Any]) -> None:
        b["statements"][2]["payload"] = _flip_b64(b["statements"][2]["payload"])

    def signature(b: dict[str, Any]) -> None:
        s = b["statements"][1]["signatures"][0]
        s["sig"] = _flip_b64(s["sig"], 5)

    def checkpoint_sig(b: dict[str, Any]) -> None:
        s = b["checkpoint"]["signatures"][0]
        s["sig"] = _flip_b64(s["sig"], 40)

    def checkpoint_root(b: dict[str, Any]) -> None:
        s = json.loads(dsse.b64decode(b["checkpoint"]["payload"]))
        _set_root(s)
        b["checkpoint"]["payload"] = dsse.b64encode(st.encode(s))

    def subject(b: dict[str, Any]) -> None:
        b["entries"][3]["subject"] = _flip_hex(b["entries"][3]["subject"])

    def subject_rehashed(b: dict[str, Any]) -> None:
        # an edited entry whose hash is recomputed (and whose successor is not in the
        # bundle, so no chain link catches it): its inclusion proof fails instead
        e = b["entries"][4]
        e["subject"] = _flip_hex(e["subject"])
        e["hash"] = chain.entry_hash(
            (e["seq"], e["at"], e["kind"], e["ref"], e["subject"], e["prev"])
        )
        b["proofs"][str(e["seq"])] = b["proofs"].pop(str(e["seq"]))

    def proof(b: dict[str, Any]) -> None:
        p = b["proofs"]["6"]
        p[1] = _flip_hex(p[1])

    def removed_entry(b: dict[str, Any]) -> None:
        del b["entries"][2]

    def removed_entry_and_proof(b: dict[str, Any]) -> None:
        seq = b["entries"].pop(2)["seq"]
        del b["proofs"][str(seq)]

    def reordered(b: dict[str, Any]) -> None:
        e = b["entries"]
        e[2], e[3] = e[3], e[2]

    def reordered_statements(b: dict[str, Any]) -> None:
        s = b["statements"]
        s[0], s[1] = s[1], s[0]

    def content_field(b: dict[str, Any]) -> None:
        b["contents"][0]["fields"]["policy"] += " "

    def content_kind(b: dict[str, Any]) -> None:
        b["contents"][0]["kind"] = "manifest"

    def missing_contents(b: dict[str, Any]) -> None:
        b["contents"].pop()

    def statement_moved(b: dict[str, Any]) -> None:
        # a validly signed statement, but its binding now names another entry
        s = json.loads(dsse.b64decode(b["statements"][2]["payload"]))
        s["predicate"]["ledger"]["seq"] = 6
        b["statements"][2] = dsse.sign(st.encode(s), st.PAYLOAD_TYPE, KEY)

    def head_lie(b: dict[str, Any]) -> None:
        def change(s: dict[str, Any]) -> None:
            s["predicate"]["head"] = "1" * 64

        _resign_checkpoint(b, change)

    def root_lie(b: dict[str, Any]) -> None:
        _resign_checkpoint(b, _set_root)

    def no_checkpoint(b: dict[str, Any]) -> None:
        del b["checkpoint"]

    def consistency(b: dict[str, Any]) -> None:
        b["consistency"]["root"] = _flip_hex(b["consistency"]["root"])

    return locals()[name]  # type: ignore[no-any-return]


NEGATIVE = [
    "payload", "signature", "checkpoint_sig", "checkpoint_root", "subject", "subject_rehashed",
    "proof", "removed_entry", "removed_entry_and_proof", "reordered", "reordered_statements",
    "content_field", "content_kind", "missing_contents", "statement_moved", "head_lie",
    "root_lie", "no_checkpoint", "consistency",
]  # fmt: skip


@pytest.mark.parametrize("name", NEGATIVE)
def test_a_tampered_bundle_fails_with_exit_7(name: str) -> None:
    b = _bundle(since=3)
    assert verify_bundle(dump(b), KEY.public_key()).ok
    _mut(name)(b)
    with pytest.raises(BundleCorrupt) as e:
        verify_bundle(dump(b), KEY.public_key())
    assert e.value.exit_code == 7 and e.value.location, name
    r = check_bundle(dump(b), KEY.public_key())
    assert not r.ok and r.exit_code == 7 and r.problem and r.location


@pytest.mark.parametrize(
    "data", [b"", b"not json", b"[1, 2]", b'{"bundle": 2}', b"\xff\xfe", b'{"bundle": 1}']
)
def test_not_a_bundle_fails_with_exit_7(data: bytes) -> None:
    with pytest.raises(BundleCorrupt):
        verify_bundle(data, KEY.public_key())


def test_hostile_json_is_exit_7_not_a_traceback() -> None:
    for data in (b"[" * 100_000, b'{"bundle": 1' + b', "x": ' + b"9" * 5000 + b"}"):
        with pytest.raises(BundleCorrupt):
            verify_bundle(data, KEY.public_key())
    b = _bundle()
    b["entries"][0]["at"] = 10**400
    with pytest.raises(BundleCorrupt, match="out of range"):
        verify_bundle(dump(b), KEY.public_key())


def test_truncated_bundle_fails_with_exit_7() -> None:
    data = dump(_bundle())
    for cut in (1, len(data) // 3, len(data) // 2, len(data) - 3):
        with pytest.raises(BundleCorrupt):
            verify_bundle(data[:cut], KEY.public_key())


def test_another_key_is_exit_8() -> None:
    data = dump(_bundle())
    other = keys.generate()
    with pytest.raises(WrongKey) as e:
        verify_bundle(data, other.public_key())
    assert e.value.exit_code == 8 and keys.key_id(KEY)[:16] in str(e.value)
    # a bundle signed throughout by another key, verified with ours
    lg = _ledger(3)
    tree = tree_from_db(lg.db)
    b = build_bundle(entries_from_db(lg.db, [tree.size]), tree, other, [], at_unix=1.0)
    with pytest.raises(WrongKey):
        verify_bundle(dump(b), KEY.public_key())


def test_offline_verify_cli_function(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys.save_keypair(KEY, tmp_path / "k")
    path = tmp_path / "bundle.json"
    b = _bundle()
    path.write_bytes(dump(b))
    assert run_offline_verify(str(path), str(tmp_path / "k.pub"), as_json=False) == 0
    out = capsys.readouterr().out
    assert "bundle verifies" in out and "25 entries" in out
    assert run_offline_verify(str(path), str(tmp_path / "k.pub"), as_json=True) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["counts"] == {"entries": 8, "statements": 8, "proofs": 8}

    _mut("proof")(b)
    path.write_bytes(dump(b))
    with pytest.raises(BundleCorrupt, match=r"proofs\[6\]"):
        run_offline_verify(str(path), str(tmp_path / "k.pub"), as_json=True)
    report = json.loads(capsys.readouterr().out)
    assert not report["ok"] and report["exit_code"] == 7 and report["location"] == "proofs[6]"
    with pytest.raises(NotAKey):  # the private key is refused where the public key goes
        run_offline_verify(str(path), str(tmp_path / "k"), as_json=False)
    with pytest.raises(KeyFileMissing):
        run_offline_verify(str(path), str(tmp_path / "nope"), as_json=False)
    from servewitness.ledger.errors import BundleMissing

    with pytest.raises(BundleMissing):
        run_offline_verify(str(tmp_path / "nope.json"), str(tmp_path / "k.pub"), as_json=False)


def test_bundle_of_a_real_ledger_entry_list() -> None:
    """LedgerEntry round-trips the ledger's own rows and hashes."""
    lg = _ledger(2)
    rows = lg.db.execute("SELECT * FROM ledger ORDER BY seq").fetchall()
    es = [LedgerEntry.from_row(r) for r in rows]
    assert all(chain.entry_hash(e.fields()) == e.hash for e in es)
    assert all(b.prev == a.hash for a, b in itertools.pairwise(es))
