"""Measurement windows, client side: the verifier opens and seals them (``OpenWindow``,
``SealWindow``; judged in ``servewitness.server.windows``); this module hashes the results file,
keeps the window file and writes the seal.

The window file (``verifier window --out W``) holds only the window's id, run and the
verifier's address: it is **not trust-bearing**. Everything a seal rests on (the evidence at
open, every hook's counts) is in the verifier's ledger under that id; editing the file can at
most name another window, which the verifier refuses (unknown, another run's, already sealed).
The seal (``RESULTS.seal.json``) is signed by the verifier and checked offline with
``verifier audit verify-seal``.

**Every answer is checked against what was asked** before it is used or written
(:func:`open_window`, :func:`seal_window`): the window OpenWindow opened must be on the run
asked, and the seal SealWindow hands back must, by its signed content (read as
``wire/seals.py`` reads it), name the window, the run, the results (sha256, size, name) and
the request ids this client sent, close the window entry OpenWindow answered, and say held
exactly when the answer's ``held`` does; the outcome is the content's, never the answer's
flag. Otherwise :class:`AnswerMismatch` (exit 7) names what differed and nothing is written:
a peer at the verifier's address (a plaintext default while the verifier is down) cannot pass
off a genuine seal of another window as this one. With the verifier's public key (``--key``,
``key=``, ``$VERIFIER_SEAL_KEY``) the seal's signature is checked too (``WrongKey``, exit 8;
``BundleCorrupt``, exit 7); without it the content could have been written by anyone, and
every output says the signature was not checked.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servewitness import wire
from servewitness.client.api import VerifierClient
from servewitness.errors import BundleCorrupt, ConfigError, UsageError, WrongKey
from servewitness.model import RunVerdict, request_ids_sha256
from servewitness.wire import dsse
from servewitness.wire.seals import SealClaims, SealUnreadable, read_seal

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

WINDOW_FILE_VERSION = 3  # 1, 2: the verdict at open, client-side (trusted what anyone typed)


def is_fresh(verdict: RunVerdict, since: float) -> bool:
    """Every target's evidence was read at or after SINCE (verifier clock), and there is one."""
    return bool(verdict.targets) and all((t.report_unix or 0) >= since for t in verdict.targets)


def save_window(path: Path, address: str, w: wire.OpenedWindow) -> None:
    data = {
        "window": WINDOW_FILE_VERSION,
        "window_id": w.window_id,
        "run": w.run,
        "verifier": address,
        "opened_unix": w.opened_unix,
        "ledger_seq": w.ledger_seq,
        "ledger_hash": w.ledger_hash,
        "policy_digest": w.policy_digest,
        "note": "not trust-bearing: the window's evidence is in the verifier's ledger",
    }
    path.write_text(json.dumps(data, indent=2) + "\n")


def load_window(path: Path) -> dict[str, Any]:
    """The window file's id, run and verifier address."""
    try:
        data = json.loads(path.read_text())
        version = data.get("window") if isinstance(data, dict) else None
        if version in (1, 2):
            raise ValueError(
                f"written by an older verifier (window file {version}, a client-side window): "
                "open the window again with `verifier window`"
            )
        if version != WINDOW_FILE_VERSION:
            raise ValueError("not a window file written by `verifier window`")
        for k in ("window_id", "run", "verifier"):
            if not isinstance(data.get(k), str) or not data[k]:
                raise ValueError(f"no {k}")
        return dict(data)
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: no such window file (open one with `verifier window`)") from e
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"{path}: not a window file: {e}") from e


def sha256_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    try:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
    except OSError as e:
        raise ConfigError(f"cannot read the results file {path}: {e}") from e
    return h.hexdigest(), size


def seal_path(results: Path, out: Path | None = None) -> Path:
    return out if out is not None else results.with_name(results.name + ".seal.json")


ENV_SEAL_KEY = "VERIFIER_SEAL_KEY"
NOT_CHECKED = (
    "the seal's signature was NOT checked (no verifier key given: --key, key=, "
    f"${ENV_SEAL_KEY}): it names this window, run and results, but anyone at the verifier's "
    "address could have written it; check it with `verifier audit verify-seal SEAL --key PUB`"
)


class AnswerMismatch(BundleCorrupt):
    """The verifier's answer is not for what this client asked: a seal of another window,
    run, results or request ids, a seal whose content and answer disagree on whether it held,
    a window opened on another run, a verdict of another run (exit 7)."""


# What a seal handed back is refused with (check_seal): its signature (with a key), or its
# content against what was asked.
SEAL_REFUSED = (BundleCorrupt, WrongKey)


def seal_key(path: Path | str | None) -> Ed25519PublicKey | None:
    """The verifier's public key that seals are checked with: PATH, else $VERIFIER_SEAL_KEY,
    else None (the signature is not checked, and the outputs say so). ConfigError (exit 3)
    when it cannot be read or is not an Ed25519 public key."""
    if path is None or str(path) == "":
        path = os.environ.get(ENV_SEAL_KEY, "").strip() or None
    return None if path is None else dsse.load_public_key(Path(path))


def open_window(client: VerifierClient, run: str, timeout_s: float) -> wire.OpenedWindow:
    """``client.open_window(RUN)``, its answer checked: the window opened is on RUN
    (AnswerMismatch otherwise: the caller must not measure in a window of another run)."""
    opened = client.open_window(run, timeout_s)
    if opened.run != run:
        raise AnswerMismatch(
            f"the verifier opened window {opened.window_id} on run {opened.run!r}, not on run "
            f"{run!r} as asked: not measuring in it",
            "OpenWindow",
        )
    return opened


@dataclass(frozen=True)
class Expected:
    """What this client knows of the window it seals beyond the sealing request, as
    OpenWindow answered it: the window's ledger entry (seq, hash) and policy digest (None:
    unknown, as in a window file written before they were kept)."""

    open_entry: tuple[int, str] | None = None
    policy_digest: str | None = None

    @classmethod
    def of(cls, opened: wire.OpenedWindow) -> Expected:
        return cls((opened.ledger_seq, opened.ledger_hash), opened.policy_digest)


@dataclass(frozen=True)
class CheckedSeal:
    """A seal checked against what was asked: HELD is its signed content's; KEY_ID is the key
    its signature was checked with (None: not checked)."""

    held: bool
    seal_json: str
    claims: SealClaims
    key_id: str | None

    @property
    def content(self) -> dict[str, Any]:
        return self.claims.content

    @property
    def sealed(self) -> wire.SealedWindow:
        """As the wire type, with the checked outcome."""
        return wire.SealedWindow(self.held, self.seal_json)

    def signature(self) -> str:
        """One line: whether and with which key the signature was checked."""
        if self.key_id is None:
            return NOT_CHECKED
        return f"the seal's signature checked with the verifier's key {self.key_id[:16]}"

    def signature_json(self) -> dict[str, Any]:
        return {"checked": self.key_id is not None, "key_id": self.key_id}


def _differences(
    c: SealClaims, held: bool, asked: wire.WindowSealing, expected: Expected
) -> list[str]:
    """What C (a seal's claims) says other than ASKED and EXPECTED, one phrase each."""
    out = []
    if c.window_id != asked.window_id:
        out.append(f"it seals window {c.window_id}, not {asked.window_id}")
    if c.run != asked.run:
        out.append(f"it is on run {c.run!r}, not {asked.run!r}")
    if c.results_sha256 != asked.results_sha256:
        out.append(
            f"its results sha256 is {c.results_sha256[:16]}, not {asked.results_sha256[:16]}"
        )
    if c.results_size != asked.results_size:
        out.append(f"its results are {c.results_size} bytes, not {asked.results_size}")
    if c.results_name != asked.results_name:
        out.append(f"its results are named {c.results_name!r}, not {asked.results_name!r}")
    ids = tuple(dict.fromkeys(asked.request_ids))
    if not ids and c.requests is not None:
        out.append(f"it checked {c.requests.get('sent')} request ids; this client sent none")
    elif ids and c.requests is None:
        out.append(f"it checked no request ids; this client sent {len(ids)}")
    elif ids and c.requests is not None:
        mine = request_ids_sha256(ids)
        if c.requests.get("sent") != len(ids) or c.requests.get("ids_sha256") != mine:
            out.append(
                f"it checked {c.requests.get('sent')} request ids "
                f"({str(c.requests.get('ids_sha256'))[:16]}), not these {len(ids)} ({mine[:16]})"
            )
    if c.held != held:
        out.append(f"its signed content says held={c.held}, the answer says held={held}")
    if expected.open_entry is not None and c.open_entry != expected.open_entry:
        seq, h = expected.open_entry
        got = "none" if c.open_entry is None else f"#{c.open_entry[0]} {c.open_entry[1][:16]}"
        out.append(f"it closes window entry {got}, not #{seq} {h[:16]} (OpenWindow's)")
    if expected.policy_digest is not None and c.policy_digest != expected.policy_digest:
        out.append(
            f"its policy digest is {c.policy_digest[:16]}, not {expected.policy_digest[:16]} "
            "(OpenWindow's)"
        )
    return out


def check_seal(
    sealed: wire.SealedWindow,
    asked: wire.WindowSealing,
    expected: Expected | None = None,
    key: Ed25519PublicKey | None = None,
) -> CheckedSeal:
    """SEALED (SealWindow's answer to ASKED) checked: with KEY, its signature first (WrongKey,
    exit 8; BundleCorrupt, exit 7); then its signed content must name what ASKED and EXPECTED
    name and agree with the answer's ``held`` (AnswerMismatch, exit 7, naming each
    difference)."""
    where = f"the seal handed back for window {asked.window_id}"
    try:
        c = read_seal(sealed.seal_json)
    except SealUnreadable as e:
        raise AnswerMismatch(f"not a seal the client can read: {e}", where) from None
    kid = None
    if key is not None:
        dsse.verify(c.envelope, key, where)
        kid = dsse.key_id(key)
    wrong = _differences(c, sealed.held, asked, expected or Expected())
    if kid is not None and c.verifier_key_id != kid:
        wrong.append(f"it names verifier key {c.verifier_key_id[:16]}, not {kid[:16]} (--key)")
    if wrong:
        raise AnswerMismatch(
            "not the seal this client asked for (not written): " + "; ".join(wrong), where
        )
    return CheckedSeal(c.held, sealed.seal_json, c, kid)


def seal_window(
    client: VerifierClient,
    sealing: wire.WindowSealing,
    expected: Expected | None = None,
    key: Ed25519PublicKey | None = None,
    out: Path | None = None,
) -> CheckedSeal:
    """Seal (``client.seal_window``), check the answer (:func:`check_seal`), and only then
    write it to OUT (when given): a seal of anything else is never written."""
    checked = check_seal(client.seal_window(sealing), sealing, expected, key)
    if out is not None:
        out.write_text(checked.seal_json)
    return checked


def seal(  # noqa: PLR0917 - the window, the run, the results, how long, where
    client: VerifierClient,
    window_id: str,
    run: str,
    results: Path,
    timeout_s: float,
    out: Path | None = None,
    request_ids: tuple[str, ...] = (),
    *,
    expected: Expected | None = None,
    key: Ed25519PublicKey | None = None,
) -> tuple[CheckedSeal, Path]:
    """Seal WINDOW_ID over RESULTS (hashed now) and write the signed seal to OUT (default
    RESULTS.seal.json) once it is checked (:func:`check_seal`); REQUEST_IDS, the requests the
    harness sent during the window, must each have been served by the window's processes
    (none: not checked). (The checked seal, where it was written.)"""
    sha, size = sha256_file(results)
    sealing = wire.WindowSealing(
        window_id, run, sha, size, results.name, timeout_s, tuple(request_ids)
    )
    path = seal_path(results, out)
    return seal_window(client, sealing, expected, key, path), path


MAX_REQUESTS_FILE_BYTES = 64 << 20  # 100,000 ids of up to a few hundred bytes each


def read_request_ids(path: Path) -> tuple[str, ...]:
    """The request ids a harness wrote to PATH, one per line (blank lines skipped; every other
    line is an id, as it stands: an ``X-Request-Id`` may begin with ``#``), checked as the
    verifier will check them: UsageError naming the file for a missing or oversized file, one
    with no id (asked to check requests, nothing is never checked silently), too many ids or
    one that is not an id (blanks around it included)."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_REQUESTS_FILE_BYTES + 1)
    except OSError as e:
        raise UsageError(f"--requests {path}: {e.strerror or e}") from None
    if len(data) > MAX_REQUESTS_FILE_BYTES:
        raise UsageError(f"--requests {path}: over {MAX_REQUESTS_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        why = f"not UTF-8 text ({e.reason} at byte {e.start})"
        raise UsageError(f"--requests {path}: {why}") from None
    ids = [line.removesuffix("\r") for line in text.split("\n") if line.strip()]
    if not ids:
        raise UsageError(f"--requests {path}: holds no request id")
    return wire.request_ids(ids, f"--requests {path}")  # a WireError is a UsageError


def seal_content(seal_json: str) -> dict[str, Any]:
    """The seal content of a seal document (for display: unverified, unchecked; use
    :func:`check_seal` for a seal just handed back, `verify-seal` for one kept)."""
    import base64

    doc = json.loads(seal_json)
    payload = json.loads(base64.b64decode(doc["envelope"]["payload"]))
    content: dict[str, Any] = payload["predicate"]["seal"]
    return content


def describe(content: dict[str, Any]) -> list[str]:
    """One line per hook during the window, then per finding."""
    lines = [
        f"hook {row['name']} (pid {row['pid']}, {row['role']}): fired {row['fired']} on "
        f"{row['steps']} {row['on']} steps during the window ({row['fired_in_all']} in all, "
        f"{row['total_steps']} steps)"
        for row in content.get("hooks", {}).values()
    ]
    req = content.get("requests")
    if isinstance(req, dict):
        lines.append(
            f"requests: {req['served']} of the {req['sent']} the harness sent were served by "
            "the window's processes"
        )
    else:
        lines.append("requests: not checked (no request ids given: --requests)")
    lines.append(other_windows_line(content.get("other_windows"), str(content.get("run"))))
    lines += [f"FAIL {f['id']}: {f['message']}" for f in content.get("findings", [])]
    return lines


_OUTCOME_WORDS = (("held", "held"), ("not_held", "did not hold"), ("not_sealed", "never sealed"),
                  ("unreadable", "unreadable in the database"))  # fmt: skip


def other_windows_line(counts: object, run: str) -> str:
    """What a seal says of the other windows its verifier's ledger held when it was sealed
    (``server/window_rows.other_windows``): the ones a result could have been chosen from."""
    if not isinstance(counts, dict):
        return "other windows: not counted (a seal made before seals counted them)"

    def scope(c: dict[str, Any]) -> str:
        parts = [f"{c.get(k, 0)} {words}" for k, words in _OUTCOME_WORDS if c.get(k)]
        return f"{c.get('opened', 0)}" + (f" ({', '.join(parts)})" if parts else "")

    on_run, on_ledger = counts.get("run") or {}, counts.get("ledger") or {}
    if not on_ledger.get("opened"):
        return "other windows: none (the first window on this verifier's ledger)"
    return (
        f"other windows when this one was sealed: {scope(on_run)} on run {run}, "
        f"{scope(on_ledger)} on the whole ledger"
    )
