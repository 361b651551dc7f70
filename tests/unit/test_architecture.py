"""
The layout docs/architecture.md describes, checked: every module of the product is on that page
(and every module the page names exists), no module imports another of the product in a cycle or
inside a function, a module over 400 lines says why at its top, and the product never imports the
test bed.
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
    """A cycle is found, and so is an import of the product inside a function."""
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    from sparkinfra import lanes\n    return lanes\n")
    assert imported("sparkinfra.lazy", lazy)[1] == ["sparkinfra.lazy line 2: sparkinfra.lanes"]
