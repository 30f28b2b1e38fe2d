"""Measurement windows, client side: the verifier opens and seals them (``OpenWindow``,
``SealWindow``; judged in ``servewitness.server.windows``); this module hashes the results file,
keeps the window file and writes the seal.

The window file (``verifier window --out W``) holds only the window's id, run and the
verifier's address: it is **not trust-bearing**. Everything a seal rests on (the evidence at
open, every hook's counts) is in the verifier's ledger under that id; editing the file can at
most name another window, which the verifier refuses (unknown, another run's, already sealed).
The seal (``RESULTS.seal.json``) is signed by the verifier and checked offline with
``verifier audit verify-seal``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from servewitness import wire
from servewitness.client.api import VerifierClient
from servewitness.errors import ConfigError, UsageError
from servewitness.model import RunVerdict

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


def seal(  # noqa: PLR0917 - the window, the run, the results, how long, where
    client: VerifierClient,
    window_id: str,
    run: str,
    results: Path,
    timeout_s: float,
    out: Path | None = None,
    request_ids: tuple[str, ...] = (),
) -> tuple[wire.SealedWindow, dict[str, Any], Path]:
    """Seal WINDOW_ID over RESULTS (hashed now) and write the signed seal to OUT (default
    RESULTS.seal.json); REQUEST_IDS, the requests the harness sent during the window, must
    each have been served by the window's processes (none: not checked). (The answer, the
    seal content, where it was written.)"""
    sha, size = sha256_file(results)
    sealing = wire.WindowSealing(
        window_id, run, sha, size, results.name, timeout_s, tuple(request_ids)
    )
    sealed = client.seal_window(sealing)
    path = seal_path(results, out)
    path.write_text(sealed.seal_json)
    return sealed, seal_content(sealed.seal_json), path


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
    """The seal content of a seal document (for display: unverified; `verify-seal` checks)."""
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
