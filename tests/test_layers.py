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
# started directly or as the ranks of torchrun on a GPU node, and the step timing of
# `study plan`, which times as many processes side by side as the study will run.
WORKERS = {"study/runner.py": ["sanlab.study.runner", "sanlab.study.runner"], "study/speed.py": ["sanlab.study.speed"]}


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
