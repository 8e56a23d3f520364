"""Results flow one way: the study computes, the report and the records render. A study
module never imports the report, the records or a command; the report and the records
never import each other or a command; and no sanlab module starts sanlab through a
subprocess, except the study's workers, which are how runs are isolated."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "sanlab"

# package -> packages it may not import (a layer above it, or a sibling renderer)
FORBIDDEN = {
    "study": ("sanlab.report", "sanlab.records", "sanlab.commands", "sanlab.cli"),
    "report": ("sanlab.records", "sanlab.commands", "sanlab.cli"),
    "records": ("sanlab.report", "sanlab.commands", "sanlab.cli"),
}
# The only `python -m sanlab…` children: a study run's worker process (one run, isolated
# from the others and from the study process: its own memory, signals and thread count),
# started directly or as the ranks of torchrun on a GPU node; a group's worker process
# (its runs trained as members of one model, sanlab.study.groups); and the step timing of
# `study plan`, which times as many processes side by side as the study will run.
# (the local runner starts `ENTRY_POINTS` of sanlab.study.warm by name: runner and groups)
WORKERS = {"study/runner.py": ["sanlab.study.runner"], "study/warm.py": ["sanlab.study.warm"],
           "study/speed.py": ["sanlab.study.speed"]}


def imported(path: Path) -> set[str]:
    """Every module an import statement in `path` names, wherever the statement is."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_imports_a_layer_above_it(package: str) -> None:
    bad = [f"{p.relative_to(SRC)} imports {m}" for p in sorted((SRC / package).rglob("*.py"))
           for m in sorted(imported(p)) if any(m == f or m.startswith(f + ".") for f in FORBIDDEN[package])]
    assert not bad, bad


def test_the_import_scan_sees_imports_inside_functions(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from sanlab.report.cli import make_report\n    import sanlab.records\n")
    assert {"sanlab.report.cli", "sanlab.records"} <= imported(f)


SANLAB_CHILD = re.compile(r"""["']-m["']\s*,\s*["'](sanlab[\w.]*)["']""")


def test_no_module_starts_sanlab_as_a_subprocess_but_the_study_workers() -> None:
    found = {str(p.relative_to(SRC)): SANLAB_CHILD.findall(p.read_text()) for p in sorted(SRC.rglob("*.py"))}
    found = {k: v for k, v in found.items() if v}
    assert found == WORKERS
    assert SANLAB_CHILD.findall('cmd = [sys.executable, "-m", "sanlab", "analyze"]') == ["sanlab"]


# --------------------------------------------------------------------------- no circles

MIXERS_PKG = "sanlab.model.mixers"


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _torch_cut(tree: ast.Module) -> int:
    """Index of a mixer file's first top-level `import torch`: its spec part ends there."""
    for i, node in enumerate(tree.body):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        if any(n == "torch" or n.startswith("torch.") for n in names):
            return i
    return len(tree.body)


def _imports(nodes: list[ast.stmt], package: str) -> list[tuple[str, tuple[str, ...]]]:
    """(module, names) of every sanlab import in `nodes`, at any depth, but not under
    `if TYPE_CHECKING:` (annotations only)."""
    out: list[tuple[str, tuple[str, ...]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend((a.name, ()) for a in node.names if a.name.split(".")[0] == "sanlab")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            if base.split(".")[0] == "sanlab":
                out.append((base, tuple(a.name for a in node.names)))
        for child in ast.iter_child_nodes(node):
            visit(child)

    for n in nodes:
        visit(n)
    return out


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module → the sanlab modules it imports, at the top or inside a function. A mixer
    file is two nodes, as the registry loads it (`sanlab.model.mixers`): its spec part (up
    to its first `import torch`), which the package runs for every file when it is
    imported, and its module part (`NAME[module]`), run when a name defined there is asked
    for. A module does not import its own parent packages (Python runs those first)."""
    files = {_module_name(p, src): p for p in sorted(src.rglob("*.py"))}
    trees = {m: ast.parse(p.read_text(encoding="utf-8")) for m, p in files.items()}
    split = {m for m in files if m.startswith(MIXERS_PKG + ".") and _torch_cut(trees[m]) < len(trees[m].body)}
    spec_names = {m: {n.name for n in trees[m].body[:_torch_cut(trees[m])]
                      if isinstance(n, (ast.ClassDef, ast.FunctionDef))} |
                     {t.id for n in trees[m].body[:_torch_cut(trees[m])] if isinstance(n, ast.Assign)
                      for t in n.targets if isinstance(t, ast.Name)} |
                     {a.asname or a.name for n in trees[m].body[:_torch_cut(trees[m])]
                      if isinstance(n, ast.ImportFrom) for a in n.names} for m in split}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for m, tree in trees.items():
        package = m if files[m].name == "__init__.py" else m.rpartition(".")[0]
        cut = _torch_cut(tree) if m in split else len(tree.body)
        for node, body in ((m, tree.body[:cut]), (f"{m}[module]", tree.body[cut:])):
            if node != m and m not in split:
                continue
            edges = graph.setdefault(node, set())
            for module, names in _imports(body, package):
                targets = {resolve(f"{module}.{n}") for n in names} | {resolve(module)} if names else {resolve(module)}
                for t in targets - {None}:
                    if m == t or m.startswith(f"{t}."):
                        continue
                    edges.add(t)
                    if t in split and (not names or any(n not in spec_names[t] for n in names)):
                        edges.add(f"{t}[module]")
    graph.setdefault(MIXERS_PKG, set()).update(m for m in files if m.startswith(MIXERS_PKG + "."))  # discovery
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def room(node: str) -> str:
    """A node's room: its top-level package or module, with the mixer registry and the
    mixers' spec parts (torch-free, below `sanlab.config`) a room of their own."""
    parts = node.split(".")
    if node.startswith(MIXERS_PKG) and not node.endswith("[module]"):
        return MIXERS_PKG
    return ".".join(parts[:2]).removesuffix("[module]")


def test_imports_go_one_way_no_circle_of_modules_or_rooms() -> None:
    """Every import counts, also those inside functions (a lazy import only hides a circle):
    no module reaches itself, and neither does a room (docs/architecture.md)."""
    graph = import_graph()
    assert circles(graph) == []
    rooms: dict[str, set[str]] = {}
    for a, targets in graph.items():
        rooms.setdefault(room(a), set()).update(room(b) for b in targets if room(b) != room(a))
    assert circles(rooms) == []


def test_the_circle_check_finds_a_lazy_circle_and_a_spec_part_that_imports_the_config(tmp_path: Path) -> None:
    src = tmp_path / "sanlab"
    (src / "model" / "mixers").mkdir(parents=True)
    for f in ("__init__.py", "model/__init__.py", "configbase.py"):
        (src / f).write_text("")
    (src / "config.py").write_text("from sanlab.configbase import X\nfrom sanlab.model.mixers import check\n")
    (src / "model" / "mixers" / "__init__.py").write_text("from sanlab.configbase import X\n")
    (src / "model" / "mixers" / "softmax.py").write_text(
        "from sanlab.configbase import X\nclass Spec: pass\nimport torch\nfrom sanlab.config import ModelConfig\n")
    assert circles(import_graph(src)) == []  # the module part may import the config
    (src / "model" / "mixers" / "mlp.py").write_text("from sanlab.config import ModelConfig\nimport torch\n")
    assert circles(import_graph(src)) == [["sanlab.config", "sanlab.model.mixers", "sanlab.model.mixers.mlp"]]
    (src / "model" / "mixers" / "mlp.py").write_text("import torch\n")
    (src / "a.py").write_text("import sanlab.b\n")
    (src / "b.py").write_text("def f():\n    from sanlab.a import g  # lazy: import cycle\n")
    assert circles(import_graph(src)) == [["sanlab.a", "sanlab.b"]]
