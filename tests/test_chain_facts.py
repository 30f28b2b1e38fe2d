"""What compiling a code chain's file answered is kept by content (``verdicts.fact_key``, in
the compile verdict store): a restarted agent answers the same without compiling or parsing,
and a file whose bytes, name or optimization level differ is compiled again."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from servewitness.evidence import codecheck
from servewitness.evidence.codecheck import CodeCache, compile_file
from servewitness.evidence.verdicts import FILENAME, VerdictStore

SOURCE = b"""
import functools

class Runner:
    @functools.lru_cache
    @staticmethod
    def step(x):
        return x + 1

    def other(self):
        return 2
"""

STEP = ("Runner.step", 5)  # (qualified name, first decorator's line)


def _answers(compiled: codecheck._Compiled) -> tuple[object, ...]:
    return (
        compiled.error,
        compiled.digest(STEP),
        compiled.digest(("Runner.other", 10)),
        compiled.digest(("Runner.nothing", 3)),
        compiled.decorator_count(*STEP),
        compiled.decorator_count("Runner.nothing", 3),
    )


def _no_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> object:
        raise AssertionError("compiled or parsed although the answer was kept")

    monkeypatch.setattr(codecheck, "_compile", refuse)
    monkeypatch.setattr(ast, "parse", refuse)


def test_a_restart_answers_from_the_store_without_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = VerdictStore(tmp_path / FILENAME)
    first = _answers(compile_file(SOURCE, "/site/runner.py", 0, store))
    assert first[0] is None and isinstance(first[1], str) and first[3] is None
    assert (first[4], first[5]) == (1, None)  # staticmethod is not counted
    store.save()
    reloaded = VerdictStore(tmp_path / FILENAME)
    _no_compiling(monkeypatch)
    assert _answers(compile_file(SOURCE, "/site/runner.py", 0, reloaded)) == first


@pytest.mark.parametrize(
    ("source", "filename", "optimize"),
    [
        (SOURCE.replace(b"x + 1", b"x + 2"), "/site/runner.py", 0),  # edited on disk
        (SOURCE, "/elsewhere/runner.py", 0),
        (SOURCE, "/site/runner.py", 2),
    ],
)
def test_other_bytes_name_or_level_are_compiled_again(
    tmp_path: Path, source: bytes, filename: str, optimize: int
) -> None:
    store = VerdictStore(tmp_path / FILENAME)
    kept = compile_file(SOURCE, "/site/runner.py", 0, store).digest(STEP)
    compiled: list[bytes] = []
    real = codecheck._compile

    def counting(src: bytes, name: str, level: int) -> object:
        compiled.append(src)
        return real(src, name, level)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(codecheck, "_compile", counting)
        got = compile_file(source, filename, optimize, store).digest(STEP)
    assert compiled == [source]
    fresh = compile_file(source, filename, optimize).digest(STEP)  # no store: the truth
    assert got == fresh
    if source != SOURCE:
        assert got != kept  # the edit is seen, not answered from what was kept


def test_a_file_that_does_not_compile_keeps_its_error_and_no_digest(tmp_path: Path) -> None:
    store = VerdictStore(tmp_path / FILENAME)
    broken = compile_file(b"def f(:\n", "/site/broken.py", 0, store)
    assert broken.error is not None and broken.error.startswith("SyntaxError")
    assert broken.digest(("f", 1)) is None
    store.save()
    again = compile_file(b"def f(:\n", "/site/broken.py", 0, VerdictStore(tmp_path / FILENAME))
    assert again.error == broken.error


def test_the_code_cache_hands_its_files_the_callers_store(tmp_path: Path) -> None:
    src = tmp_path / "runner.py"
    src.write_bytes(SOURCE)
    store = VerdictStore(tmp_path / FILENAME)
    cache = CodeCache()
    first = cache.get(src, "/site/runner.py", 0)  # no store yet
    assert cache.get(src, "/site/runner.py", 0, store) is first
    first.digest(STEP)
    assert len(store) == 1  # the answer went to the store handed last
