"""Compile verdicts kept by content across agent restarts (``bytecode.judge_bytecode``), and
what compiling a step method's file answered (``codecheck``: whether it compiles, a code
object's digest, a definition's decorator count: ``fact_key``).

Comparing a loaded pyc with its source (``pycfile.compare``) compiles the source: about 1.5 s
of CPU for the ~1,000 pycs of a vLLM container, on every cold start. The outcome depends only
on the bytes of both files, the interpreter that compiles (its magic number and full
version), the optimization level, the pyc's flags and the filename compiled under (it appears
in a SyntaxError's message), so it is kept under a digest of exactly those: a pyc or source
whose bytes differ has another key and is compiled again. Nothing else is kept: the pyc is
still read and hashed (it must hold the bytes the process loaded) and the source read and
hashed on every cold start; only the compile is skipped.

The store is a file in the agent's state directory (beside its spool, which the agent trusts
already: whoever can write there can forge reports, so the store adds no trust assumption;
docs/threat-model.md). It is written atomically (a temporary file, then ``os.replace``) and
carries a sha256 of its content: a file that is truncated, edited or of another format or
interpreter is ignored whole, with a log line, and rebuilt; never trusted in part. Bounded
to LIMIT verdicts: the least recently used go first.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

import structlog

from servewitness.evidence import statefile
from servewitness.evidence.pycfile import Outcome

log = structlog.get_logger(__name__)

FORMAT = "verifier-compile-verdicts/1"
FILENAME = "compile-verdicts.json"
LIMIT = 1 << 15  # ~60 bytes each on disk: at most ~2 MB, many vLLM images' worth of pycs
MAGIC = importlib.util.MAGIC_NUMBER.hex()


def content_key(
    pyc_sha256: str, source_sha256: str, filename: str, optimize: int, flags: int
) -> str:
    """The key of one compile verdict: both files' bytes (their sha256), the filename compiled
    under, the optimization level, the pyc's flags, and this interpreter (magic number and
    full version: a patch release may compile otherwise)."""
    text = repr((MAGIC, sys.version, pyc_sha256, source_sha256, filename, optimize, flags))
    return hashlib.blake2b(text.encode(errors="backslashreplace"), digest_size=16).hexdigest()


def fact_key(what: str, source_sha256: str, filename: str, optimize: int, *detail: object) -> str:
    """The key of one fact about compiling a source file for the code chains
    (``codecheck._Compiled``): WHAT ("compile": whether it compiles; "code": the digest of a
    code object; "decorators": a definition's decorator count), the source's bytes (its
    sha256), the filename compiled under, the optimization level, this interpreter, and
    DETAIL (a definition's qualified name and first line)."""
    text = repr(
        (MAGIC, sys.version, "chain-fact", what, source_sha256, filename, optimize, *detail)
    )
    return hashlib.blake2b(text.encode(errors="backslashreplace"), digest_size=16).hexdigest()


class VerdictStore:
    """Outcomes of ``pycfile.compare`` by ``content_key``, loaded from PATH (None: kept in
    memory only) and written back by ``save`` when something was added."""

    def __init__(self, path: Path | None, limit: int = LIMIT) -> None:
        self.path = path
        self.limit = limit
        self.dirty = False
        self._verdicts: dict[str, Outcome] = {}
        if path is not None:
            self._verdicts = _load(path)

    def get(self, key: str) -> tuple[bool, Outcome]:
        """(True, the outcome kept under KEY), or (False, None) when none is."""
        if key not in self._verdicts:
            return False, None
        outcome = self._verdicts.pop(key)  # moved to the end: recently used
        self._verdicts[key] = outcome
        return True, outcome

    def put(self, key: str, outcome: Outcome) -> None:
        if self.limit <= 0:
            return
        statefile.put_bounded(self._verdicts, key, outcome, self.limit)
        self.dirty = True

    def save(self) -> None:
        """Write the verdicts to PATH atomically, if any was added since the last save. A
        failure to write is logged, never raised: the store only saves time."""
        if self.path is None or not self.dirty:
            return
        doc = {
            "format": FORMAT,
            "magic": MAGIC,
            "python": sys.version,
            "verdicts": [[k, v] for k, v in self._verdicts.items()],
        }
        if statefile.save(self.path, doc, "compile_cache"):
            self.dirty = False

    def __len__(self) -> int:
        return len(self._verdicts)


def _load(path: Path) -> dict[str, Outcome]:
    """The verdicts PATH holds, or none (with a log line) if it is not a whole, unedited store
    of this format written by this interpreter (``statefile.load``)."""
    doc = statefile.load(path, "compile_cache")
    if doc is None:
        return {}
    try:
        verdicts = _parse(doc)
    except ValueError as e:
        log.warning("compile_cache_ignored", path=str(path), reason=str(e))
        return {}
    if doc["magic"] != MAGIC or doc["python"] != sys.version:
        log.info("compile_cache_other_python", path=str(path), python=doc["python"])
        return {}
    return verdicts


def _parse(doc: object) -> dict[str, Outcome]:
    """The verdicts of a decoded store. Raises ValueError on anything not as ``save`` writes."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError("not a compile verdict store of this format")
    if not isinstance(doc.get("magic"), str) or not isinstance(doc.get("python"), str):
        raise ValueError("no interpreter named")
    rows = doc.get("verdicts")
    if not isinstance(rows, list):
        raise ValueError("no verdict list")
    out: dict[str, Outcome] = {}
    for row in rows:
        if not (isinstance(row, list) and len(row) == 2 and isinstance(row[0], str)):
            raise ValueError("a malformed verdict")
        key, value = row
        if value is None:
            out[key] = None
        elif (
            isinstance(value, list)
            and len(value) == 2
            and isinstance(value[0], bool)
            and isinstance(value[1], str)
        ):
            out[key] = (value[0], value[1])
        else:
            raise ValueError("a malformed verdict")
    return out
