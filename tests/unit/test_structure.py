"""Structure of the ``hvd_gradq`` package: no import cycles, no oversized modules.

The import graph is built from the source with ``ast`` (no module is imported), so the test
needs neither framework. Every import counts, including those inside functions: a lazy import
only hides a cycle from the interpreter, not from the reader. Imports under
``if TYPE_CHECKING:`` are left out: they never run and exist only for annotations.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "hvd_gradq"
MAX_LINES = 400

# Import edges that still close a cycle, left to the work that owns those files. The test fails
# on an entry whose edge is gone, so the list can only shrink. (Empty: the last two, the level
# searches dispatching back to their compiled versions, went with ``kernels/search.py``.)
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()

def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, annotations: bool = False) -> list[tuple[int, str | None, list[str]]]:
    """(level, module, names) of each import statement outside ``if TYPE_CHECKING:`` (inside it
    too with ``annotations``)."""
    found: list[tuple[int, str | None, list[str]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not annotations:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((0, alias.name, []))
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module, [a.name for a in node.names]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(annotations: bool = False) -> dict[str, set[str]]:
    """Module -> the hvd_gradq modules it imports (relative imports resolved; ``annotations``:
    the imports made for type annotations only count too)."""
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        edges: set[str] = set()
        for level, target, names in _imports(ast.parse(path.read_text(), str(path)), annotations):
            if level:
                base = package.split(".")
                base = base[: len(base) - (level - 1)]
                target = ".".join(base + ([target] if target else []))
            if not target or not (target == "hvd_gradq" or target.startswith("hvd_gradq.")):
                continue
            # ``from pkg import sub`` imports the submodule pkg.sub when there is one.
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in files]
            edges.update(subs or ([target] if target in files else []))
            if subs and len(subs) < len(names) and target in files:
                edges.add(target)
        edges.discard(mod)
        graph[mod] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of modules (first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = dfs(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def test_cycle_finder_finds_a_planted_cycle() -> None:
    # The checker itself: a graph with a three-module loop must be reported, a DAG must not.
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_graph_sees_relative_and_lazy_imports() -> None:
    graph = import_graph()
    # ``from .api import ...`` at package level and ``from . import schemes`` style imports.
    assert "hvd_gradq.api" in graph["hvd_gradq"]
    assert "hvd_gradq.errors" in graph["hvd_gradq.spec"]


def test_no_import_cycle() -> None:
    graph = import_graph()
    for src, dst in sorted(KNOWN_CYCLE_EDGES):
        assert dst in graph[src], f"{src} no longer imports {dst}: remove it from KNOWN_CYCLE_EDGES"
        graph[src].discard(dst)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in hvd_gradq: " + " -> ".join(cycle or [])


def test_no_cycle_even_through_annotation_imports() -> None:
    # an import made for annotations only never runs, but a reader still has to hold both files
    # in mind at once (a compressor and its elastic side once imported each other so)
    cycle = find_cycle(import_graph(annotations=True))
    assert cycle is None, "modules that import each other (annotations included): " + " -> ".join(cycle or [])


#: Every layer of the package, from the ground up, and what each may import (every import counts,
#: those inside functions too): a scheme is maths on ``xp.Ops`` laid out by ``wire``; the kernels
#: above it, then error feedback (whose classic rule runs compiled on host arrays), the policy and
#: the spec parser; the plan (the cost model and what decides) below
#: the reduction core, which cuts tensors by the plan's layout; the frontends' shared middle
#: above the core; the command line and the two frameworks' compressors on top. A lower layer
#: that needs something from above offers a slot the upper one fills (``schemes/searches.py``,
#: filled by ``kernels/search.py``).
LAYERS: dict[str, tuple[str, ...]] = {
    "hvd_gradq.errors": (),
    "hvd_gradq.xp": ("hvd_gradq.errors",),
    "hvd_gradq.wire": ("hvd_gradq.errors", "hvd_gradq.xp"),
    "hvd_gradq.schemes": ("hvd_gradq.errors", "hvd_gradq.xp", "hvd_gradq.wire"),
    "hvd_gradq.kernels": ("hvd_gradq.errors", "hvd_gradq.xp", "hvd_gradq.wire", "hvd_gradq.schemes"),
    "hvd_gradq.ef_rules": ("hvd_gradq.errors", "hvd_gradq.xp"),
    "hvd_gradq.feedback": ("hvd_gradq.errors", "hvd_gradq.xp", "hvd_gradq.kernels", "hvd_gradq.ef_rules"),
    "hvd_gradq.policy": ("hvd_gradq.errors", "hvd_gradq.ef_rules", "hvd_gradq.feedback", "hvd_gradq.schemes.options"),
    "hvd_gradq.spec": ("hvd_gradq.errors", "hvd_gradq.feedback", "hvd_gradq.policy", "hvd_gradq.schemes"),
    "hvd_gradq.api": ("hvd_gradq.errors", "hvd_gradq.xp", "hvd_gradq.wire", "hvd_gradq.schemes",
                      "hvd_gradq.kernels", "hvd_gradq.spec"),
    "hvd_gradq.plan": ("hvd_gradq.errors", "hvd_gradq.wire", "hvd_gradq.schemes", "hvd_gradq.policy",
                       "hvd_gradq.spec"),
    "hvd_gradq.reduce": ("hvd_gradq.errors", "hvd_gradq.xp", "hvd_gradq.wire", "hvd_gradq.schemes",
                         "hvd_gradq.feedback", "hvd_gradq.spec", "hvd_gradq.api", "hvd_gradq.plan"),
    "hvd_gradq.log": ("hvd_gradq.errors", "hvd_gradq.spec", "hvd_gradq.plan", "hvd_gradq.reduce"),
    "hvd_gradq.frontend": ("hvd_gradq.errors", "hvd_gradq.feedback", "hvd_gradq.schemes", "hvd_gradq.policy",
                           "hvd_gradq.kernels", "hvd_gradq.spec", "hvd_gradq.api", "hvd_gradq.plan",
                           "hvd_gradq.reduce", "hvd_gradq.log"),
    "hvd_gradq.cli": ("hvd_gradq.errors", "hvd_gradq.wire", "hvd_gradq.schemes", "hvd_gradq.kernels",
                      "hvd_gradq.spec", "hvd_gradq.api", "hvd_gradq.plan", "hvd_gradq.reduce", "hvd_gradq.frontend"),
}
#: The two frameworks' compressors: on top, and never importing each other.
FRONTENDS = ("hvd_gradq.torch", "hvd_gradq.tensorflow")


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """``module -> target`` for each import a layer (:data:`LAYERS`) may not make: upward, or
    from one framework's compressor into the other's."""
    out = []
    rules = dict(LAYERS)
    for frontend in FRONTENDS:
        rules[frontend] = tuple(LAYERS)  # every layer below, not the other framework
    for layer, allowed in rules.items():
        for mod in sorted(m for m in graph if _under(m, layer)):
            for dst in sorted(graph[mod]):
                if not _under(dst, layer) and not any(_under(dst, a) for a in allowed):
                    out.append(f"{mod} -> {dst}")
    return out


def test_the_graph_counts_imports_inside_functions_but_not_type_checking_blocks() -> None:
    src = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..kernels import search\n"
        "def choose():\n    from ..kernels.search import levels\n    return levels\n"
    )
    found = _imports(ast.parse(src))
    assert (2, "kernels.search", ["levels"]) in found  # the lazy one counts
    assert (2, "kernels", ["search"]) not in found  # the annotation-only one does not


def test_layer_checker_finds_a_planted_lazy_import() -> None:
    planted = {"hvd_gradq.schemes.orq": {"hvd_gradq.kernels.search", "hvd_gradq.xp"},
               "hvd_gradq.kernels.search": {"hvd_gradq.schemes.searches"}}
    assert layer_violations(planted) == ["hvd_gradq.schemes.orq -> hvd_gradq.kernels.search"]


def test_lower_layers_import_nothing_from_above() -> None:
    # e.g. a scheme reaching into the kernels (a lazy ``from ..kernels.search import levels`` once
    # did) or the registry importing a scheme class back
    assert layer_violations(import_graph()) == []


def test_schemes_and_the_registry_do_not_import_each_other_back() -> None:
    graph = import_graph()
    assert "hvd_gradq.schemes.registry" not in graph["hvd_gradq.schemes.scheme"]
    assert not {m for m in graph["hvd_gradq.schemes.registry"] if m != "hvd_gradq.schemes.options"
                and _under(m, "hvd_gradq.schemes")}


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: str(p.relative_to(PKG.parent)))
def test_module_size(path: Path) -> None:
    rel = str(path.relative_to(PKG.parent))
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{rel} has {lines} lines (> {MAX_LINES}): split it by responsibility"


def test_every_module_has_a_layer() -> None:
    # a new top-level module or package must be placed in LAYERS (or be the package's face)
    layers = (*LAYERS, *FRONTENDS, "hvd_gradq.__main__")
    placed = [m for m in import_graph() if m != "hvd_gradq" and not any(_under(m, lay) for lay in layers)]
    assert placed == [], f"modules outside every layer of LAYERS: {placed}"


def listing(graph: dict[str, set[str]]) -> str:
    """The layers from the top down, the layers each imports, the upward imports and one cycle:
    ``python tests/unit/test_structure.py`` prints it."""
    order = [*FRONTENDS, *reversed(list(LAYERS))]

    def layer(m: str) -> str:
        return next((lay for lay in order if _under(m, lay)), m)

    lines = []
    for lay in order:
        mods = [m for m in graph if _under(m, lay)]
        deps = sorted({layer(d) for m in mods for d in graph[m]} - {lay})
        lines.append(f"{lay.removeprefix('hvd_gradq.'):<11} {len(mods):>3} modules -> "
                     + ", ".join(d.removeprefix("hvd_gradq.") for d in deps))
    upward = layer_violations(graph)
    cycle = find_cycle(graph)
    lines.append(f"imports that run upward: {len(upward)}" + "".join(f"\n  {u}" for u in upward))
    lines.append("cycles: " + (" -> ".join(cycle) if cycle else "0"))
    return "\n".join(lines)


if __name__ == "__main__":
    print(listing(import_graph()))
