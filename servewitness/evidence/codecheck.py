"""Whether the code that runs a step method or declared hook target is its file's own
definition, judged from outside the process.

The probe records, for each such attribute, the chain of what runs when it is called (a
``CodeChain``: outermost layer first, its own wrappers left out; ``servewitness_probe.layout``
describes the record). A plugin that replaces ``Cls.method`` after import, assigns its
``__code__``, wraps it, or sets it on the live object changes no file, so the files' hashes
cannot see it; this can. Each layer is judged against the file it claims, read as the process
sees it (``/proc/<pid>/root``):

* a layer with Python code must come from a file the process loaded (its manifest), compiled
  under the process's Python and optimization level to a code object with the same qualified
  name, first line and digest (``layout.code_digest``), and run in that file's module
  namespace. Otherwise it is ``patched``: code with no file (``exec``, ``compile``, built at
  run time), from a file the process never imported, whose bytecode differs from its file's
  (its ``__code__`` was replaced), or that runs with another module's globals;
* the innermost layer must be the owner's own definition: code compiled as
  ``Owner.method`` in the owner's module file, where Owner is the class (or module) that
  defines the attribute. A pristine function put there from elsewhere is a patch too;
* wrappers are allowed when each verifies against its own file (``torch.inference_mode()``
  lives in torch's) and the owner's source decorates its definition with at least as many
  decorators as there are wrappers (``staticmethod``/``classmethod`` aside): an extra wrapper
  was put around it at run time, and the finding names it. A ``functools.partial`` layer is
  built at run time by definition;
* what cannot be told is ``unverified``: another Python than this agent's, a file that cannot
  be read or compiled, or no longer holds the bytes the process loaded, a layer without code
  (a builtin), or a wrapper whose ``__wrapped__`` is not what it holds (a wrapper calls what
  its closure holds).

Each compiled file is cached under its identity (path, device, inode, size, mtime, ctime) and
the optimization level, so a scan costs one ``stat`` per file once its definitions are known.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import CodeType

from servewitness_probe import layout as L

from servewitness.evidence.distindex import DistIndex
from servewitness.evidence.origins import source_of_bytecode
from servewitness.evidence.pycfile import Identity, Outcome, identity, read
from servewitness.evidence.verdicts import VerdictStore, fact_key
from servewitness.model import (
    DRIFT_CODE_PATCHED,
    DRIFT_CODE_UNVERIFIED,
    CodeChain,
    CodeLayer,
    Drift,
    FileEntry,
)

VERIFIED, PATCHED, UNVERIFIED = "verified", "patched", "unverified"
CUT = "cut"  # the kind of the marker a chain cut after too many layers ends with
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
_STRUCTURAL = frozenset({"method", "staticmethod", "classmethod"})  # bind, call what they hold
_DESCRIPTORS = frozenset({"staticmethod", "classmethod"})  # decorators that add no layer


@dataclass
class _Compiled:
    """One source file as the process would compile it: its sha256, and what the judge asks of
    it, each answered from FACTS (outcomes kept by content across agent restarts,
    ``verdicts.VerdictStore``) where it holds the answer, else by compiling or parsing the
    source (once, when first needed) and kept there: whether it compiles (``error``), the
    digest of its code object of (co_qualname, co_firstlineno) (``digest``), how many
    decorators a definition has (``decorator_count``). Each answer depends on the source's
    bytes, the filename compiled under, the optimization level and the interpreter only
    (``verdicts.fact_key``)."""

    sha256: str
    source: bytes
    filename: str
    optimize: int
    facts: VerdictStore | None = None
    _codes: dict[tuple[str, int], CodeType] | None = None
    _error: str | None = None
    digests: dict[tuple[str, int], str | None] = field(default_factory=dict)
    decorators: dict[tuple[str, int], int] | None = None
    _parse_transient: bool = False  # the parse for the decorators failed for want of stack

    def _key(self, what: str, *detail: object) -> str:
        return fact_key(what, self.sha256, self.filename, self.optimize, *detail)

    def _kept(self, key: str) -> tuple[bool, Outcome]:
        return self.facts.get(key) if self.facts is not None else (False, None)

    def _keep(self, key: str, outcome: Outcome) -> None:
        if self.facts is not None:
            self.facts.put(key, outcome)

    def _compiled(self) -> dict[tuple[str, int], CodeType]:
        if self._codes is None:
            self._codes, self._error = _compile(self.source, self.filename, self.optimize)
        return self._codes

    @property
    def error(self) -> str | None:
        """Why the source does not compile here (None: it does)."""
        key = self._key("compile")
        found, outcome = self._kept(key)
        if found and outcome is not None:
            return None if outcome[0] else outcome[1]
        self._compiled()
        if not (self._error or "").startswith(_TRANSIENT):
            self._keep(key, (self._error is None, self._error or ""))
        return self._error

    def digest(self, key: tuple[str, int]) -> str | None:
        """``layout.code_digest`` of the code object KEY names; None when there is none."""
        if key not in self.digests:
            fact = self._key("code", *key)
            found, outcome = self._kept(fact)
            if found:
                self.digests[key] = outcome[1] if outcome is not None else None
            else:
                code = self._compiled().get(key)
                self.digests[key] = None if code is None else L.code_digest(code)
                if self._error is None:  # (a file that does not compile keeps no answer)
                    got = self.digests[key]
                    self._keep(fact, None if got is None else (True, got))
        return self.digests[key]

    def decorator_count(self, qualname: str, line: int) -> int | None:
        """Decorators on the definition of QUALNAME at LINE (its first decorator's line, as
        ``co_firstlineno`` says), ``staticmethod`` and ``classmethod`` not counted."""
        fact = self._key("decorators", qualname, line)
        found, outcome = self._kept(fact)
        if found:
            return int(outcome[1]) if outcome is not None and outcome[1].isdigit() else None
        if self.decorators is None:
            self.decorators = {}
            try:
                self.decorators = dict(_decorated(ast.parse(self.source, self.filename).body, ""))
            except (SyntaxError, ValueError):
                pass
            except (RecursionError, MemoryError):  # (see _TRANSIENT)
                self._parse_transient = True
        got = self.decorators.get((qualname, line))
        if not self._parse_transient:
            self._keep(fact, None if got is None else (True, str(got)))
        return got


def _decorated(body: list[ast.stmt], prefix: str) -> Iterator[tuple[tuple[str, int], int]]:
    """(qualified name, first line) and decorator count of every definition in BODY and the
    statements nested in it. Only statements are looked into: a definition is a statement,
    so no expression holds one (a lambda is no ``def``), and a big file's expressions are most
    of its nodes."""
    for child in body:
        if isinstance(child, ast.ClassDef):
            yield from _decorated(child.body, f"{prefix}{child.name}.")
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            decs = child.decorator_list
            first = decs[0].lineno if decs else child.lineno
            n = sum(1 for d in decs if not (isinstance(d, ast.Name) and d.id in _DESCRIPTORS))
            yield (f"{prefix}{child.name}", first), n
            yield from _decorated(child.body, f"{prefix}{child.name}.<locals>.")
        else:  # if, for, while, with, try, match: their statements keep the prefix
            for field_name in ("body", "orelse", "finalbody"):
                sub = getattr(child, field_name, None)
                if sub:
                    yield from _decorated(sub, prefix)
            for holder in (*getattr(child, "handlers", ()), *getattr(child, "cases", ())):
                yield from _decorated(holder.body, prefix)


def _walk(code: CodeType) -> Iterator[CodeType]:
    yield code
    for c in code.co_consts:
        if isinstance(c, CodeType):
            yield from _walk(c)


# Errors that say how deep the stack or how full the memory was, not what the file is: an
# answer that ends in one is not kept (a restart from another depth may compile it).
_TRANSIENT = ("RecursionError", "MemoryError")


def _compile(
    source: bytes, filename: str, optimize: int
) -> tuple[dict[tuple[str, int], CodeType], str | None]:
    """SOURCE compiled as the import system compiles a module (``dont_inherit``, OPTIMIZE):
    its code objects by (co_qualname, co_firstlineno), or why it does not compile. OPTIMIZE
    is the probed process's word (its code record): a level no interpreter runs at is said,
    not passed to ``compile``."""
    if optimize.__class__ is not int or not 0 <= optimize <= 2:
        return {}, f"optimization level {optimize!r} is none an interpreter runs at"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the source's SyntaxWarning, DeprecationWarning...
            top = compile(source, filename, "exec", dont_inherit=True, optimize=optimize)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as e:
        return {}, f"{type(e).__name__}: {e}"
    codes: dict[tuple[str, int], CodeType] = {}
    for c in _walk(top):
        codes.setdefault((getattr(c, "co_qualname", c.co_name), c.co_firstlineno), c)
    return codes, None


def compile_file(
    source: bytes, filename: str, optimize: int, facts: VerdictStore | None = None
) -> _Compiled:
    """SOURCE as the import system would compile it, compiled when first asked (see
    ``_Compiled``)."""
    return _Compiled(hashlib.sha256(source).hexdigest(), source, filename, optimize, facts)


class CodeCache:
    """Compiled files by (identity of the file as read, optimization level); emptied when
    LIMIT files are held (0: caches nothing)."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._files: dict[tuple[Identity, int], _Compiled] = {}

    def get(
        self, host: Path, filename: str, optimize: int, facts: VerdictStore | None = None
    ) -> _Compiled:
        """FILENAME (as the process names it) read at HOST, to be compiled (FACTS: answers kept
        by content, see ``_Compiled``). Raises OSError."""
        st = os.stat(host)
        key = (identity(str(host), st), optimize)
        hit = self._files.get(key)
        if hit is not None:
            if facts is not None:
                hit.facts = facts
            return hit
        source, st2 = read(host)
        compiled = compile_file(source, filename, optimize, facts)
        if self.limit > 0 and identity(str(host), st2) == key[0]:
            if len(self._files) >= self.limit:
                self._files.clear()
            self._files[key] = compiled
        return compiled

    def __len__(self) -> int:
        return len(self._files)


SHARED_CACHE = CodeCache()


def check_chains(
    chains: Sequence[CodeChain],
    files: Sequence[FileEntry],
    to_host: Callable[[str], Path],
    *,
    index: DistIndex | None = None,
    owners: Mapping[str, str | None] | None = None,
    cache: CodeCache | None = None,
    python: str = PYTHON,
    facts: VerdictStore | None = None,
) -> tuple[tuple[CodeChain, ...], list[Drift]]:
    """CHAINS judged (status, detail, each layer's check) and a drift for each that is not
    verified. FILES: the process's manifest. TO_HOST: a path as the process sees it to one
    this code can read. INDEX: to name the distribution that owns each owner's file, unless
    OWNERS (path -> distribution, ``judge.chain_owners``) names it already: a restarted agent
    that kept its judgement parses no RECORD for a label. PYTHON: the major.minor this code
    compiles with. FACTS: what compiling each file answered, kept by content across agent
    restarts (``_Compiled``). Never raises on odd files or records."""
    if not chains:
        return (), []  # most processes (the API server) run no step method: nothing to index
    judge = _Judge(files, to_host, cache or SHARED_CACHE, python, facts)
    out: list[CodeChain] = []
    drift: list[Drift] = []
    for chain in chains:
        judged = judge.chain(chain)
        path = chain.owner_file
        if path and owners is not None and path in owners:
            if owners[path] is not None:
                judged = replace(judged, distribution=owners[path])
        elif index is not None and path:
            try:
                claim = index.claim(path)
            except (OSError, ValueError):
                claim = None
            if claim is not None:
                judged = replace(judged, distribution=claim.distribution)
        out.append(judged)
        if judged.status in (PATCHED, UNVERIFIED):
            drift.append(
                Drift(
                    DRIFT_CODE_PATCHED if judged.status == PATCHED else DRIFT_CODE_UNVERIFIED,
                    chain.owner_file or "<unknown>",
                    chain.owner_module,
                    judged.detail,
                )
            )
    return tuple(out), drift


def _where(layer: CodeLayer) -> str:
    name = layer.code_qualname or layer.qualname or "?"
    if layer.file is None:
        return f"{name} ({layer.kind}, no Python code)"
    return f"{name} in {layer.file} line {layer.line}"


class _Judge:
    def __init__(
        self,
        files: Sequence[FileEntry],
        to_host: Callable[[str], Path],
        cache: CodeCache,
        python: str,
        facts: VerdictStore | None = None,
    ) -> None:
        self.to_host = to_host
        self.cache = cache
        self.python = python
        self.facts = facts
        self.loaded = {f.path: f for f in files if f.at != "rejected"}
        self.via_pyc = {
            src
            for f in files
            if f.kind == "bytecode" and (src := source_of_bytecode(f.path)) is not None
        }

    def chain(self, chain: CodeChain) -> CodeChain:
        layers = list(chain.layers)
        if not layers:
            return self._done(chain, layers, UNVERIFIED, "the probe recorded no layer")
        same_python = chain.python == self.python
        for i, layer in enumerate(layers):
            if layer.kind != CUT:
                check, detail = self.layer(layer, same_python, chain.optimize)
                layers[i] = replace(layer, check=check, detail=detail)
        for i in range(1, len(layers)):
            # A wrapper calls what its closure holds; its __wrapped__ is only a label.
            above, layer = layers[i - 1], layers[i]
            if layer.via == "__wrapped__" and layer.held is False and above.check != PATCHED:
                layers[i - 1] = replace(
                    above,
                    check=UNVERIFIED,
                    detail=(
                        f"{_where(above)} names {_where(layer)} as its __wrapped__ but does not "
                        "hold it, so what it calls cannot be told"
                    ),
                )
        inner = len(layers) - 1
        if layers[inner].kind != CUT:
            verdict = self.innermost(chain, layers[inner])
            if verdict is not None and layers[inner].check != PATCHED:
                layers[inner] = replace(layers[inner], check=PATCHED, detail=verdict)
            elif verdict is None and layers[inner].check == VERIFIED:
                self.extra_wrappers(chain, layers, inner)
        for status in (PATCHED, UNVERIFIED):
            for i, layer in enumerate(layers):
                if layer.check == status:
                    return self._done(chain, layers, status, self._say(chain, i, layer, status))
        return self._done(chain, layers, VERIFIED, "")

    @staticmethod
    def _done(chain: CodeChain, layers: list[CodeLayer], status: str, detail: str) -> CodeChain:
        return replace(chain, layers=tuple(layers), status=status, detail=detail)

    @staticmethod
    def _say(chain: CodeChain, i: int, layer: CodeLayer, status: str) -> str:
        runs = f"the code that runs {chain.owner}.{chain.attr} ({chain.subject}" + (
            ", set on the live object itself)" if chain.via == "instance" else ")"
        )
        which = "" if len(chain.layers) == 1 else f"layer {i} of {len(chain.layers)}, "
        if status == PATCHED:
            return f"{runs} is not its file's definition: {which}{layer.detail}"
        return f"{runs} could not be verified against its file: {which}{layer.detail}"

    def layer(self, layer: CodeLayer, same_python: bool, optimize: int) -> tuple[str, str]:
        """One layer's check and why."""
        if layer.kind in _STRUCTURAL:
            return "", ""
        if layer.kind == "partial":
            return PATCHED, "a functools.partial built at run time around the next layer"
        if layer.file is None:
            if layer.kind == "function":
                return PATCHED, f"{_where(layer)} has no code the probe could read"
            return UNVERIFIED, f"{_where(layer)}: there is no code to verify"
        return self.against_file(layer, same_python, optimize)

    def against_file(self, layer: CodeLayer, same_python: bool, optimize: int) -> tuple[str, str]:
        """A layer with Python code against the file it names."""
        found = self.provenance(layer)
        if found is not None:
            return found
        file, line, qual = layer.file or "", layer.line or 0, layer.code_qualname or ""
        where = _where(layer)
        try:
            compiled = self.cache.get(self.to_host(file), file, optimize, self.facts)
        except (OSError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
            return UNVERIFIED, f"{where}: {file} cannot be read ({reason})"
        entry = self.loaded.get(file)
        if compiled.error is not None:
            why = f"{file} does not compile here ({compiled.error})"
        elif entry is not None and entry.sha256 is not None and entry.sha256 != compiled.sha256:
            why = f"{file} no longer holds the bytes the process loaded"
        elif not same_python:
            why = "compiled by another Python than this agent's"
        else:
            want = compiled.digest((qual, line))
            if want is None:
                return PATCHED, (
                    f"{file} has no definition of {qual} at line {line}: {where} was built at "
                    "run time"
                )
            if want != layer.sha256:
                return PATCHED, (
                    f"its bytecode differs from {file}'s {qual} at line {line} (its __code__ "
                    "was replaced)"
                )
            return VERIFIED, ""
        return UNVERIFIED, f"{where}: {why}"

    def provenance(self, layer: CodeLayer) -> tuple[str, str] | None:
        """What is wrong with where a layer's code says it comes from, before its file is
        compiled (None: nothing)."""
        file, qual = layer.file or "", layer.code_qualname or "?"
        where = _where(layer)
        if not file.startswith("/"):  # "<string>", "<stdin>", "" or a relative name
            return PATCHED, f"{qual} has no file (exec'd or built at run time: {file!r})"
        if layer.globals_file != file:
            return PATCHED, (
                f"{where} runs in the namespace of {layer.globals_file or 'a module with no file'}"
                ", not of the file its code was compiled from (a function rebuilt around another "
                "module's globals)"
            )
        if file not in self.loaded and file not in self.via_pyc:
            return PATCHED, (
                f"{where}: {file} is not among the files the process loaded (code compiled "
                "at run time, by exec or compile)"
            )
        if layer.line is None or layer.sha256 is None:
            return UNVERIFIED, f"{where}: the probe recorded no line or digest"
        return None

    def innermost(self, chain: CodeChain, layer: CodeLayer) -> str | None:
        """Why the innermost LAYER is not the owner's own definition (None: it is)."""
        expected = f"{chain.owner_qualname}.{chain.attr}" if chain.owner_qualname else chain.attr
        if layer.kind != "function":
            return (
                f"what runs last is {_where(layer)}, a {layer.kind}, not the function "
                f"{expected} defined in {chain.owner_file}"
            )
        if layer.file != chain.owner_file or layer.code_qualname != expected:
            return (
                f"it is {layer.module}.{layer.code_qualname}, defined in {layer.file} line "
                f"{layer.line}, not {expected} of {chain.owner_file}"
            )
        if layer.qualname != expected or layer.module != chain.owner_module:
            return (
                f"its code is {expected} of {chain.owner_file}, but the function says it is "
                f"{layer.module}.{layer.qualname}"
            )
        return None

    def extra_wrappers(self, chain: CodeChain, layers: list[CodeLayer], inner: int) -> None:
        """Mark the wrappers above the innermost that its definition's decorators do not
        account for (the outermost ones: decorators apply innermost first)."""
        wrappers = [i for i in range(inner) if layers[i].kind not in _STRUCTURAL]
        if not wrappers:
            return
        core = layers[inner]
        if core.file is None or core.line is None:
            return
        try:
            compiled = self.cache.get(
                self.to_host(core.file), core.file, chain.optimize, self.facts
            )
        except (OSError, ValueError):
            return  # the innermost layer says it could not be read
        declared = compiled.decorator_count(core.code_qualname or "", core.line) or 0
        extra = len(wrappers) - declared
        for i in wrappers[:extra]:
            if layers[i].check == PATCHED:
                continue
            layers[i] = replace(
                layers[i],
                check=PATCHED,
                detail=(
                    f"{_where(layers[i])} is a wrapper put around it at run time: "
                    f"{core.code_qualname} in {core.file} has {declared} decorator(s), and "
                    f"{len(wrappers)} wrapper(s) run around it"
                ),
            )
