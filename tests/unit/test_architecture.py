"""
The layout docs/architecture.md describes, checked: every module of the product is on that page
(and every module the page names exists), no module imports another of the product in a cycle or
inside a function, no folder imports another in a loop, nothing below the command-line views
(``sparkinfra/cli/``) imports them, no private name of pyinfra is imported, a module over 400 lines
says why at its top, and the product never imports the test bed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ROOT / "sparkinfra"
SCRIPTS = PRODUCT / "scripts"  # run on nodes: named as a folder on the page
DOC = ROOT / "docs" / "architecture.md"
LIMIT = 400
VIEWS = ("sparkinfra.cli", "sparkinfra.__main__")  # the command-line views: nothing else imports them


def modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the product (node scripts excluded)."""
    found = {}
    for path in sorted(PRODUCT.rglob("*.py")):
        if SCRIPTS in path.parents or path.name == "__init__.py" and path.parent == PRODUCT:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imported(name: str, path: Path) -> tuple[set[str], list[str]]:
    """(product modules imported at the top, product imports inside a function or class)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    known = modules()
    top, nested = set(), []
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.append(full if full in known else base)
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        targets = [t for t in targets if t == "sparkinfra" or t.startswith(("sparkinfra.", "sparkbed"))]
        if not targets:
            continue
        inside = parents.get(node)
        while inside is not None and not isinstance(inside, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inside = parents.get(inside)
        if inside is not None:
            nested += [f"{name} line {node.lineno}: {t}" for t in targets]
        else:
            top.update(t for t in targets if t in known and t != name)
            nested += [f"{name} line {node.lineno}: imports the bed ({t})" for t in targets if t.startswith("sparkbed")]
    return top, nested


def test_the_page_names_every_module_and_nothing_else():
    text = DOC.read_text(encoding="utf-8")
    named = set(re.findall(r"`(sparkinfra/[\w/]+(?:\.py|/))`", text))
    files = {str(p.relative_to(ROOT)) for p in modules().values() if p.name != "__init__.py"}
    missing = sorted(files - named)
    assert not missing, f"docs/architecture.md does not name {missing}"
    gone = sorted(n for n in named if not (ROOT / n).exists())
    assert not gone, f"docs/architecture.md names what does not exist: {gone}"


def test_no_import_cycle_and_no_import_inside_a_function():
    graph, nested = {}, []
    for name, path in modules().items():
        graph[name], inner = imported(name, path)
        nested += inner
    assert not nested, "imports of the product inside a function (a cycle dodged?), or of the bed:\n" + "\n".join(nested)
    # A package's __init__ importing its own modules is not a cycle through them.
    edges = {n: {t for t in ts if not n.startswith(t + ".")} for n, ts in graph.items()}
    cycles = find_cycles(edges)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def graph() -> dict[str, set[str]]:
    """Module -> the product's modules it imports at its top."""
    return {name: imported(name, path)[0] for name, path in modules().items()}


def folder(module: str) -> str:
    """A module's folder as the loop check sees it: ``sparkinfra.lanes.schema`` -> ``sparkinfra.lanes``;
    a module at the package's top is its own (``sparkinfra.serving``)."""
    return ".".join(module.split(".")[:2])


def folder_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Folder -> the other folders its modules import."""
    found: dict[str, set[str]] = {}
    for name, targets in edges.items():
        found.setdefault(folder(name), set()).update(folder(t) for t in targets if folder(t) != folder(name))
    return found


def is_view(module: str) -> bool:
    return module in VIEWS or module.startswith(tuple(f"{view}." for view in VIEWS))


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Imports of a command-line view by a module below the views."""
    return sorted(f"{name} imports {t}" for name, targets in edges.items() if not is_view(name)
                  for t in targets if is_view(t))


def private_pyinfra(path: Path) -> list[str]:
    """``from pyinfra... import _name``: pyinfra's private names (its API may change them in any release)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{path.name} line {node.lineno}: {node.module}.{alias.name}" for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("pyinfra", "pyinfra_cli")
            for alias in node.names if alias.name.startswith("_") and alias.name != "__version__"]


def test_no_import_loop_between_folders():
    edges = folder_edges(graph())
    cycles = find_cycles(edges)
    assert not cycles, "folders importing each other in a loop: " + "; ".join(" -> ".join(c) for c in cycles)


def test_nothing_below_the_views_imports_them():
    assert not upward(graph())


def test_no_private_pyinfra_name_is_imported():
    found = [p for path in modules().values() for p in private_pyinfra(path)]
    assert not found, f"pyinfra's private names (use its public API or the project's own code): {found}"


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    seen, stack, cycles = set(), [], []

    def visit(node):
        if node in stack:
            cycles.append(stack[stack.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            visit(target)
        stack.pop()

    for node in sorted(edges):
        visit(node)
    return cycles


def test_a_long_module_says_why_at_its_top():
    long = []
    for path in [*modules().values(), *SCRIPTS.glob("*")]:
        if path.suffix not in (".py", ".sh"):
            continue
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > LIMIT and "Over 400 lines:" not in text[:2000]:
            long.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not long, f"over {LIMIT} lines without 'Over 400 lines: <why>' at the top: {long}"


def test_the_checks_can_fail(tmp_path, monkeypatch):
    """A cycle is found (of modules, of folders), and so are an import of the product inside a
    function, a view imported from below and a private name of pyinfra."""
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
    edges = {"sparkinfra.lanes.show": {"sparkinfra.serving"}, "sparkinfra.serving": {"sparkinfra.lanes.schema"},
             "sparkinfra.lanes.schema": set(), "sparkinfra.cli.status": {"sparkinfra.serving"}}
    assert find_cycles(folder_edges(edges)) == [["sparkinfra.serving", "sparkinfra.lanes", "sparkinfra.serving"]]
    assert upward(edges) == []
    edges["sparkinfra.serving"].add("sparkinfra.cli.status")
    assert upward(edges) == ["sparkinfra.serving imports sparkinfra.cli.status"]
    private = tmp_path / "private.py"
    private.write_text("from pyinfra_cli.cli import _apply_inventory_limit\nfrom pyinfra.api import State\n")
    assert private_pyinfra(private) == ["private.py line 1: pyinfra_cli.cli._apply_inventory_limit"]
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    from sparkinfra import lanes\n    return lanes\n")
    assert imported("sparkinfra.lazy", lazy)[1] == ["sparkinfra.lazy line 2: sparkinfra.lanes"]
