"""The import graph of ``ppo_ref/`` has no circle (issue 12) and never reaches the suite (issue 25).

Every ``import`` and ``from ... import`` statement counts, wherever it is: at module level, inside
``if TYPE_CHECKING:``, or inside a function (a circle through a deferred import is still a circle
in the design). An edge goes from a module to the module it names: ``from a.b import c`` names
``a.b.c`` when that is a module of ``ppo_ref`` and ``a.b`` otherwise; relative imports are resolved.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ppo_ref

ROOT = Path(ppo_ref.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module name -> the ``ppo_ref`` modules it imports (module-level and function-level)."""
    files = {_module_name(path): path for path in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.append(full if full in files else base)
            for target in targets:
                while target and target not in files:  # `import a.b.c` of a non-module: its nearest module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_the_graph_sees_the_trainer() -> None:
    graph = import_graph()
    assert "ppo_ref.trainer.loop" in graph
    assert "ppo_ref.trainer.config" in graph["ppo_ref.trainer.loop"]


def test_a_circle_is_found() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_ppo_ref_has_no_import_circle() -> None:
    cycles = find_cycles(import_graph())
    assert cycles == [], "import circles in ppo_ref/: " + "; ".join(" <-> ".join(c) for c in cycles)


SUITE_PACKAGES = ("conformance", "ppo_ref_conformance")
"""The conformance suite, in the checkout and as installed from the wheel."""


def suite_imports(source: str) -> list[str]:
    """The modules of the conformance suite that ``source`` imports, wherever the statement is."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.append(node.module)
    return [name for name in names if name.split(".")[0] in SUITE_PACKAGES]


def test_a_suite_import_is_found() -> None:
    source = "import torch\ndef f():\n    from conformance.variant import ReferenceVariant\n"
    assert suite_imports(source + "import ppo_ref_conformance\n") == [
        "ppo_ref_conformance",
        "conformance.variant",
    ]
    assert suite_imports("import conformance_tools\nfrom ppo_ref.conformance import x\n") == []


def test_ppo_ref_never_imports_the_suite() -> None:
    """Dependencies point one way: the suite (its expected side, ``conformance.variant``, included)
    imports the math and the adapters, never the reverse (issue 25)."""
    found = {
        str(path.relative_to(ROOT.parent)): names
        for path in sorted(ROOT.rglob("*.py"))
        if (names := suite_imports(path.read_text(encoding="utf-8")))
    }
    assert found == {}, f"ppo_ref/ imports the conformance suite: {found}"
