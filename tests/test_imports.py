"""Imports sit at the top of a module. A sanlab import inside a function says why with a
`# lazy: reason` comment (torch, numpy or matplotlib kept out of a command that runs
without it, an import cycle, an optional dependency); see docs/development.md, "Imports".
The dispatcher, every command's `--help` (but `export`'s) and the config reference start
without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from torch_block import BLOCK_TORCH

SRC = Path(__file__).resolve().parents[1] / "src" / "sanlab"
MARK = "# lazy:"



def _is_sanlab(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name == "sanlab" or a.name.startswith("sanlab.") for a in node.names)
    return node.level > 0 or (node.module or "").split(".")[0] == "sanlab"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _comment_above(lines: list[str], lineno: int) -> bool:
    """A `# lazy:` line in the comment lines directly above line `lineno` (1-based)."""
    i = lineno - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        if lines[i].strip().startswith(MARK):
            return True
        i -= 1
    return False


def unmarked_imports(source: str) -> list[int]:
    """Lines of the sanlab imports inside a function that carry no `# lazy:` comment: on
    the import's own lines, directly above it, or directly above an earlier import of the
    consecutive run of import statements it belongs to (one comment covers a block)."""
    lines = source.splitlines()
    bad: list[int] = []

    def marked(node: ast.stmt) -> bool:
        own = lines[node.lineno - 1:node.end_lineno]
        return any(MARK in ln for ln in own) or _comment_above(lines, node.lineno)

    def visit(body: list[ast.stmt], in_function: bool) -> None:
        run_marked = False
        previous_was_import = False
        for stmt in body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                run_marked = (run_marked and previous_was_import) or _comment_above(lines, stmt.lineno)
                previous_was_import = True
                if in_function and _is_sanlab(stmt) and not (run_marked or marked(stmt)):
                    bad.append(stmt.lineno)
                continue
            previous_was_import = False
            if isinstance(stmt, ast.If) and _is_type_checking(stmt.test):
                visit(stmt.orelse, in_function)
                continue
            inner = in_function or isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
            for child in ast.iter_child_nodes(stmt):
                if isinstance(child, (ast.excepthandler, ast.match_case)):
                    visit(child.body, inner)
            for field in ("body", "orelse", "finalbody"):
                block = getattr(stmt, field, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    visit(block, inner)

    visit(ast.parse(source).body, False)
    return bad


def test_every_lazy_sanlab_import_says_why() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for line in unmarked_imports(path.read_text(encoding="utf-8")):
            found.append(f"{path.relative_to(SRC.parent)}:{line}")
    assert not found, ("sanlab imports inside a function without a `# lazy: reason` comment "
                       "(move them to the top, or say why they wait):\n  " + "\n  ".join(found))


def test_the_check_finds_a_bare_import_and_accepts_the_marked_ones() -> None:
    source = '''\
from sanlab.errors import ConfigError


def bare():
    from sanlab.config import Config
    return Config


def marked():
    from sanlab.model.lm import LM  # lazy: torch
    # lazy: torch; a block under one comment
    import torch

    from sanlab.train import checkpoint
    from sanlab.train.optim import route
    x = 1
    from sanlab.paths import check_out_dir
    return LM, torch, checkpoint, route, x, check_out_dir


class Thing:
    def method(self):
        if self:
            try:
                from .fileio import read_json
            except ImportError:
                # lazy: optional
                # (a comment of two lines)
                from sanlab import tables
        return read_json, tables


if TYPE_CHECKING:
    from sanlab.model.lm import LM
'''
    assert unmarked_imports(source) == [5, 17, 25]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + code], capture_output=True, text=True)


def test_the_dispatcher_starts_without_torch() -> None:
    proc = _run("import sanlab.cli\n"
                "from sanlab.cli import main\n"
                "try:\n"
                "    main(['--help'])\n"
                "except SystemExit:\n"
                "    pass\n"
                "assert main([]) == 2\n"
                "assert 'torch' not in sys.modules, 'torch was imported'\n")
    assert proc.returncode == 0, proc.stderr
    assert "usage: sanlab" in proc.stdout


def test_the_config_reference_needs_no_torch() -> None:
    """The docs build renders the config reference from the models alone."""
    proc = _run("from sanlab import configref\n"
                "assert configref.render_markdown()\n"
                "assert 'torch' not in sys.modules, 'torch was imported'\n")
    assert proc.returncode == 0, proc.stderr


QUICK = str(SRC.parents[1] / "examples" / "quick.toml")


def test_a_study_groups_and_plans_its_runs_without_torch() -> None:
    """The study's own process groups its runs into members (its workers import torch, it
    does not: ~2.5 s before its first run started), and `study plan --no-timing` shows the
    groups and their estimate without it."""
    proc = _run("import os, tempfile\n"
                "from sanlab.cli import main\n"
                "from sanlab.study.groups import plan_groups\n"
                "from sanlab.study.plan import plan_study\n"
                "from sanlab.study.spec import load_spec\n"
                f"spec = load_spec({QUICK!r}, [])\n"
                "runs = [r for r in plan_study(spec, None, {}).runs if 'sweep' in r.phases]\n"
                "groups = plan_groups([r.config.model_dump(mode='json') for r in runs], 'auto', 2)\n"
                "assert sorted(len(g) for g in groups) == [3, 3, 3, 3], groups\n"
                "out = os.path.join(tempfile.mkdtemp(), 'plan')\n"
                f"assert main(['study', 'plan', {QUICK!r}, '--out', out, '--no-timing']) == 0\n"
                "assert 'torch' not in sys.modules, 'torch was imported'\n")
    assert proc.returncode == 0, proc.stderr


# `sanlab export --help` lists `--as` families from sanlab.hf.stock, which imports torch
TORCH_FREE = ["match", "prepare", "train", "study", "analyze", "signal", "eval", "sample", "report", "probe",
              "record", "import"]


@pytest.mark.parametrize("argv", [[c, "--help"] for c in TORCH_FREE] + [["study", "table", "--help"],
                                                                         ["probe", "--list"]],
                         ids=" ".join)
def test_a_command_s_help_starts_without_torch(argv: list[str]) -> None:
    proc = _run("from sanlab.cli import main\n"
                "try:\n"
                f"    rc = main({argv!r})\n"
                "except SystemExit as e:\n"
                "    rc = e.code\n"
                "assert rc == 0, rc\n"
                "assert 'torch' not in sys.modules, 'torch was imported'\n")
    assert proc.returncode == 0, proc.stderr


def test_every_command_is_checked() -> None:
    from sanlab.cli import COMMANDS

    assert set(COMMANDS) == {*TORCH_FREE, "export"}
