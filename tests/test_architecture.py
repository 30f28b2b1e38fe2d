"""The rules of docs/architecture.md, checked on the source: who may import whom, no import
cycles, no private probe module imported from outside the probe, no module over about 500
lines without a written reason. Imports are read from the code (``ast``), function-level and
``TYPE_CHECKING`` ones included."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO

PKG = REPO / "servewitness"
PROBE = REPO / "probe" / "servewitness_probe"  # its own distribution, the table's "probe"
MAX_LINES = 500

# docs/architecture.md's table: what each package (or root module) may import of `servewitness`
# (and of `servewitness_probe`, the table's "probe"). "servewitness" itself is the package's
# __init__ (its version).
FOUNDATION = {"servewitness", "errors", "model", "instances", "ageclock"}
ALLOWED: dict[str, set[str]] = {
    "servewitness": set(),
    "probe": set(),
    "errors": set(),
    "model": {"errors", "ageclock"},
    "instances": set(),
    "ageclock": set(),
    "api": set(),
    "_logging": {"servewitness"},
    "_stop_signals": set(),
    "__main__": {"_cli"},
    "evidence": FOUNDATION | {"probe.layout"},
    "wire": FOUNDATION | {"api"},
    "policy": FOUNDATION,
    "ledger": FOUNDATION | {"wire", "policy"},
    "security": FOUNDATION,
    "measure": FOUNDATION,
    "metrics": FOUNDATION,
    "agent": FOUNDATION
    | {"evidence", "wire", "api", "security", "metrics", "probe.layout", "_stop_signals"},
    "server": FOUNDATION
    | {"wire", "api", "policy", "ledger", "security", "metrics", "_stop_signals"},
    "client": FOUNDATION | {"wire", "api", "security"},
    "testing": FOUNDATION | {"evidence"},
    "report": FOUNDATION | {"wire", "policy", "ledger"},
    "_cli": {"*"},
}


def _modules() -> Iterator[tuple[str, Path]]:
    for root in (PKG, PROBE):
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root.parent).with_suffix("")
            if rel.parts[:3] == ("servewitness", "api", "v1"):
                continue  # generated
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            yield ".".join(parts), path


MODULES = dict(_modules())


def _imports(name: str, path: Path) -> set[str]:
    """The verifier modules NAME imports: each `import` and `from ... import` names a module,
    or a package whose attribute it takes (then the package's __init__)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in MODULES else base)
    return {m for m in out if m.split(".")[0] in ("servewitness", "servewitness_probe")}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _package(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "servewitness_probe":
        return "probe"
    return "servewitness" if len(parts) == 1 else parts[1]


def _allows(allowed: set[str], target: str) -> bool:
    """Whether ALLOWED names TARGET's package, or the very module (``probe.layout``)."""
    if target.startswith("servewitness_probe"):
        rest = "probe" + target.removeprefix("servewitness_probe")
    else:
        rest = target.split(".", 1)[1] if "." in target else "servewitness"
    return "*" in allowed or _package(target) in allowed or rest in allowed


def test_every_package_is_in_the_table() -> None:
    assert {_package(m) for m in MODULES} <= set(ALLOWED), set(map(_package, MODULES))


def test_each_package_imports_only_what_docs_architecture_md_allows() -> None:
    wrong = sorted(
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        for t in targets
        if _package(t) != _package(m) and not _allows(ALLOWED[_package(m)], t)
    )
    assert wrong == []


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """Depth-first search over GRAPH; each cycle found, as its path."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []
    cycles: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if t not in graph:
                continue
            if state.get(t) == 1:
                cycles.append(" -> ".join([*stack[stack.index(t) :], t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles


def test_there_is_no_import_cycle() -> None:
    assert _cycles(GRAPH) == []


def test_the_cycle_search_finds_a_cycle_and_a_late_import_counts() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a -> b -> c -> a"]
    late = "def f():\n    from servewitness_probe import _hooks\n"
    tree = ast.parse(late)
    assert any(isinstance(n, ast.ImportFrom) for n in ast.walk(tree))  # ast.walk sees it


def test_nothing_outside_the_probe_imports_a_private_probe_module() -> None:
    wrong = sorted(
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if _package(m) != "probe"
        for t in targets
        if t.startswith("servewitness_probe.") and t.split(".")[1].startswith("_")
    )
    assert wrong == []


def test_the_probe_imports_nothing_of_the_package_outside_it() -> None:
    wrong = sorted(
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if _package(m) == "probe"
        for t in targets
        if _package(t) != "probe"
    )
    assert wrong == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_over_500_lines_says_why_it_is_one(name: str) -> None:
    path = MODULES[name]
    lines = path.read_text().count("\n")
    if lines <= MAX_LINES:
        return
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert re.search(r"^Size: \S", doc, flags=re.M), (
        f"{path.relative_to(REPO)} has {lines} lines: split it, or say why it is one module "
        "in a docstring line starting 'Size:'"
    )


def test_the_checks_see_the_package() -> None:
    """The rules above are only as good as the graph: it holds every layer, and edges."""
    assert {"probe", "evidence", "agent", "wire", "server", "policy", "ledger", "client"} <= {
        _package(m) for m in MODULES
    }
    assert "servewitness.wire" in GRAPH["servewitness.server.service"]
    assert "servewitness_probe.layout" in GRAPH["servewitness.evidence.procfs"]
    assert (
        "servewitness_probe._hooks"
        in GRAPH["servewitness_probe._firsthit"] | GRAPH["servewitness_probe"]
    )
    assert not _allows(ALLOWED["evidence"], "servewitness.server.store")
    assert not _allows(ALLOWED["evidence"], "servewitness_probe._vllm")
    assert _allows(ALLOWED["agent"], "servewitness_probe.layout")
