"""The mutation check (scripts/mutate.py) stays honest as the code moves: every mutant's
snippet is still in the tree exactly once, so `make mutate` never counts a mutant that
no longer applies. The mutants themselves run only under `make mutate`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("sanlab_mutate", ROOT / "scripts" / "mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


mutate = _load()
ISSUE_SEVEN = ("trainer-clip-off", "tokenizer-sees-val", "noise-pair-shifted", "multihop-first-hop",
               "pad-eos-swapped", "accum-one-over-n", "rope-no-restart")


def test_the_mutants_are_many_distinct_and_include_the_known_escapes() -> None:
    names = [m.name for m in mutate.MUTANTS]
    assert len(names) == len(set(names)) >= 30
    assert set(ISSUE_SEVEN) <= set(names)
    for m in mutate.MUTANTS:
        assert m.original != m.mutated and m.tests and m.what, m.name


@pytest.mark.parametrize("m", mutate.MUTANTS, ids=lambda m: m.name)
def test_every_mutant_applies_to_the_current_tree(m) -> None:  # noqa: ANN001
    assert mutate.stale_reason(ROOT, m) is None, f"{m.name} is stale: {mutate.stale_reason(ROOT, m)}"
    text = (ROOT / m.path).read_text()
    mutated = m.apply(text)
    assert mutated is not None and mutated != text
    if m.path.endswith(".py"):
        compile(mutated, m.path, "exec")  # a mutant is a bug, not a syntax error


def test_a_snippet_that_moved_is_stale_not_caught(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\nx = 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("")
    gone = mutate.Mutant("gone", "src/a.py", "y = 2", "y = 3", ("tests/test_a.py",), "moved away")
    twice = mutate.Mutant("twice", "src/a.py", "x = 1", "x = 2", ("tests/test_a.py",), "ambiguous")
    no_tests = mutate.Mutant("no-tests", "src/a.py", "x = 1\nx", "x = 2\nx", ("tests/test_b.py",), "no tests")
    assert "occurs 0 times" in mutate.stale_reason(tmp_path, gone)
    assert "occurs 2 times" in mutate.stale_reason(tmp_path, twice)
    assert "does not exist" in mutate.stale_reason(tmp_path, no_tests)
    assert mutate.run_mutant(tmp_path, gone, 10, None).status == "stale"


def test_a_mutant_whose_hardware_is_missing_is_untestable_not_survived(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The AMX kernel's mutants can only be caught where the AMX tests run; elsewhere the
    run says so and changes nothing, and on an AMX machine they run as any other."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_a():\n    pass\n")
    m = mutate.Mutant("amx-only", "src/a.py", "x = 1", "x = 2", ("tests/test_a.py",), "an AMX bug", needs="amx")
    monkeypatch.setitem(mutate._HARDWARE, "amx", False)
    o = mutate.run_mutant(tmp_path, m, 60, None)
    assert (o.status, (tmp_path / "src" / "a.py").read_text()) == ("untestable", "x = 1\n")
    monkeypatch.setitem(mutate._HARDWARE, "amx", True)
    assert mutate.run_mutant(tmp_path, m, 60, None).status == "survived"  # test_a checks nothing
    assert {x.name: x.needs for x in mutate.MUTANTS if x.needs} == {
        "fused-amx-sees-next-token": "amx", "fused-amx-split-dropped": "amx", "fused-amx-transpose-lanes-swapped": "amx",
        "fused-amx-product-half-width": "amx", "fused-amx-dd-drops-partial-block": "amx",
        "fused-amx-masked-exp-one": "amx", "bf16-store-subnormals-to-zero": "avx512bf16",
        "vexp-scalef-unmasked": "avx512", "silu-gate-table-act-unrounded": "sleef-exp",
        "silu-gate-fp32-slope-unfused": "sleef-exp", "silu-gate-no-libm-tail": "sleef-exp",
        "silu-gate-exp-truncates": "sleef-exp",
        # caught on the AVX-512 bf16 CPU; on an AVX2 one (fp32 training) the bits they change are the same
        "qkv-one-vector-rope-unswapped": "avx512", "members-linear-autograd-through-bmm": "avx512bf16",
        "members-linear-batched-weight-grad": "avx512bf16"}
    import torch

    from sanlab.model import native

    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.exists() else ""
    here = {"amx": native.available() and bool(native.library().sanlab_amx_available()),
            "avx512": native.available() and "avx512f" in flags,
            "avx512bf16": native.available() and "avx512_bf16" in flags,
            "sleef-exp": native.available() and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")}
    for needs, expected in here.items():  # the probes answer for this machine
        monkeypatch.delitem(mutate._HARDWARE, needs, raising=False)
        assert mutate.has_hardware(ROOT, needs) == expected, needs


@pytest.mark.parametrize("m", mutate.EQUIVALENT, ids=lambda m: m.name)
def test_every_equivalent_mutant_still_applies_and_says_why(m) -> None:  # noqa: ANN001
    assert mutate.stale_reason(ROOT, m) is None, f"{m.name} is stale: {mutate.stale_reason(ROOT, m)}"
    assert m.name not in {x.name for x in mutate.MUTANTS} and m.what


# the modules that hold a formula or a decision: each has at least 3 mutants
FORMULA_MODULES = ("probes", "eval", "generate", "report", "records", "variants", "study", "data", "analysis",
                   "accounting", "matching", "train", "model", "hf")


def test_every_module_holding_a_formula_has_at_least_three_mutants() -> None:
    counts = {mod: sum(m.module == mod for m in mutate.MUTANTS) for mod in mutate.tree_modules(ROOT)}
    assert set(FORMULA_MODULES) <= set(counts)
    assert {mod: counts[mod] for mod in FORMULA_MODULES if counts[mod] < 3} == {}


def test_module_of_names_packages_top_level_modules_and_the_split_model() -> None:
    assert mutate.module_of("src/sanlab/eval/scoring.py") == "eval"
    assert mutate.module_of("src/sanlab/model/mixers/mixit.py") == "variants"
    assert mutate.module_of("src/sanlab/model/generate.py") == "generate"
    assert mutate.module_of("src/sanlab/model/csrc/attention.c") == "model"
    assert mutate.module_of("src/sanlab/matching.py") == "matching"
    assert mutate.module_of("scripts/mutate.py") == "scripts"
    assert mutate.module_of("benchmarks/bench_arms.py") == "benchmarks"
    modules = mutate.tree_modules(ROOT)
    assert {"analysis", "commands", "data", "eval", "hf", "model", "variants", "generate", "probes", "records",
            "report", "study", "train", "accounting", "matching", "scripts"} <= set(modules)
    assert not {m.module for m in mutate.MUTANTS} - set(modules)


def test_the_module_table_lists_modules_without_mutants_and_the_totals() -> None:
    a = mutate.Mutant("a", "src/sanlab/eval/x.py", "1", "2", ("tests/t.py",), "a")
    b = mutate.Mutant("b", "src/sanlab/eval/y.py", "1", "2", ("tests/t.py",), "b")
    c = mutate.Mutant("c", "src/sanlab/probes/z.py", "1", "2", ("tests/t.py",), "c")
    outcomes = [mutate.Outcome(a, "caught", "", 0.0), mutate.Outcome(b, "survived", "", 0.0),
                mutate.Outcome(c, "caught", "", 0.0)]
    rows = [line.split() for line in mutate.module_table([a, b, c], outcomes, ["eval", "generate", "probes"])
            .splitlines()]
    assert rows[0] == ["module", "mutants", "caught", "survived", "stale"]
    assert ["eval", "2", "1", "1", "0"] in rows and ["generate", "0", "0", "0", "0"] in rows
    assert rows[-1] == ["total", "3", "2", "1", "0"]
    listed = [line.split() for line in mutate.module_table([a, b, c], None, ["eval", "generate", "probes"])
              .splitlines()]
    assert listed[0] == ["module", "mutants"] and ["generate", "0"] in listed and listed[-1] == ["total", "3"]


def test_the_copy_keeps_committed_records_run_metadata_and_drops_the_users_runs(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A committed record's `study/runs/` is what its README's zero-shot block reads, so the
    mutants' copy of the tree keeps it; the top-level `runs/` (the user's studies) is not copied."""
    src = tmp_path / "repo"
    for rel in ("records/r/study/runs/a/meta.json", "runs/quick/results.jsonl", "src/pkg/runs/x.py",
                ".venv/bin/python", "src/pkg/__pycache__/m.pyc", "site/index.html"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("x")
    monkeypatch.setattr(mutate, "ROOT", src)
    dest = mutate.copy_tree(tmp_path / "copy")
    kept = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert kept == ["records/r/study/runs/a/meta.json", "src/pkg/runs/x.py"]
