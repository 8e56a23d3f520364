"""The documentation: links stay inside the repository, the configuration reference lists
every field of every config model, and the site builds with `mkdocs build --strict`."""

from __future__ import annotations

import html.parser
import importlib
import os
import pkgutil
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

import sanlab
from sanlab import configref
from sanlab.config import StrictModel

ROOT = Path(__file__).resolve().parents[1]
# Folders that are not the project's own files (environments, outputs, caches).
SKIP_DIRS = {".git", ".venv", "venv", "runs", "site", "data", "node_modules", ".pytest_cache", ".hypothesis"}

# [text](target) and ![alt](target), with an optional "title"; <a href="..."> / <img src="...">;
# reference definitions `[label]: target`.
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"""(?:href|src)\s*=\s*["']([^"']+)["']""")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
# A code span that names a Markdown file, e.g. `docs/gpu.md`.
CODE_MD_PATH = re.compile(r"`([A-Za-z0-9_./-]+\.md)`")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def markdown_files() -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        out += [Path(dirpath) / f for f in filenames if f.endswith(".md")]
    return sorted(out)


def links(text: str) -> list[str]:
    text = FENCE.sub("", text)  # code blocks show commands, not links
    return INLINE_LINK.findall(text) + HTML_LINK.findall(text) + REF_DEF.findall(text)


def link_problem(md: Path, target: str) -> str | None:
    """Why `target`, linked from `md`, is not a file inside the repository (None if it is)."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
        return None  # a URL (https:, mailto:) or an anchor on the same page
    path = target.split("#", 1)[0].split("?", 1)[0]
    if path.startswith("/"):
        return "absolute path"
    resolved = (md.parent / path).resolve()
    try:
        resolved.relative_to(ROOT)
    except ValueError:
        return "outside the repository"
    if not resolved.exists():
        return "no such file"
    return None


def test_markdown_links_resolve_inside_the_repository():
    files = markdown_files()
    assert ROOT / "README.md" in files and ROOT / "docs" / "science.md" in files
    problems = []
    for md in files:
        text = md.read_text()
        for target in links(text):
            if (why := link_problem(md, target)) is not None:
                problems.append(f"{md.relative_to(ROOT)}: link {target!r}: {why}")
        # A Markdown file named in a code span must exist (beside the file or from the root).
        for name in CODE_MD_PATH.findall(FENCE.sub("", text)):
            if not ((md.parent / name).exists() or (ROOT / name).exists()):
                problems.append(f"{md.relative_to(ROOT)}: names {name!r}, which is not in the repository")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("target, why", [
    ("../outside.md", "outside the repository"),
    ("/etc/passwd", "absolute path"),
    ("docs/no-such-page.md", "no such file"),
    ("docs/architecture.md#errors", None),
    ("https://example.org/x.md", None),
    ("#a-heading", None),
])
def test_link_checker_tells_bad_links_from_good(target, why):
    assert link_problem(ROOT / "README.md", target) == why


def test_link_extraction_sees_every_link_form():
    text = ('[a](x.md) ![b](img.png "t") <a href="y.md">y</a>\n[ref]: z.md\n'
            "```\n[not](a-link.md)\n```\n")
    assert sorted(links(text)) == ["img.png", "x.md", "y.md", "z.md"]


# --------------------------------------------------------------------------- config reference


def _models_in(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def reachable_models() -> set[type[BaseModel]]:
    """Every config model a user can write, found from the roots by walking the fields."""
    found: set[type[BaseModel]] = set()
    todo = [r.model for r in configref.roots()]
    while todo:
        model = todo.pop()
        if model in found:
            continue
        found.add(model)
        for field in model.model_fields.values():
            todo += _models_in(field.annotation)
    return found


def page_tables(markdown: str) -> dict[str, set[str]]:
    """`module.Class` -> the field names its table lists (last part of each key)."""
    tables: dict[str, set[str]] = {}
    for part in re.split(r"^### ", markdown, flags=re.M)[1:]:
        owner = re.search(r"^`([\w.]+)`", part, flags=re.M)
        assert owner, part[:200]
        keys = re.findall(r"^\| `([^`]+)` \|", part, flags=re.M)
        tables[owner.group(1)] = {k.rsplit(".", 1)[-1] for k in keys}
    return tables


def test_config_reference_lists_every_field_of_every_model():
    tables = page_tables(configref.render_markdown())
    expected = {f"{m.__module__}.{m.__name__}": set(m.model_fields) for m in reachable_models()}
    assert tables == expected
    assert {"d_model", "attn_backend"} <= tables["sanlab.config.ModelConfig"]
    assert "slurm" in tables["sanlab.study.spec.RunnerSpec"]


def test_every_config_model_in_sanlab_is_documented():
    """A new config model must be reachable from `sanlab.configref.roots()`."""
    for info in pkgutil.walk_packages(sanlab.__path__, "sanlab."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:
            continue  # a module behind an optional dependency that is not installed
    todo, models = list(StrictModel.__subclasses__()), set()
    while todo:
        m = todo.pop()
        models.add(m)
        todo += m.__subclasses__()
    ours = {m for m in models if m.__module__.startswith("sanlab.")}
    reach = reachable_models()
    # A base model whose subclasses are documented (a probe task's TaskConfig) is covered:
    # its fields are listed with each subclass's.
    # A model without fields (a mixer's NoOptions) has nothing to list.
    missing = sorted(f"{m.__module__}.{m.__name__}" for m in ours - reach
                     if m.model_fields and not any(issubclass(r, m) for r in reach))
    assert not missing, f"config models not in the configuration reference (add a root to " \
                        f"sanlab.configref.roots() or a field that holds them): {missing}"


def test_a_field_without_description_is_still_listed():
    class Bare(StrictModel):
        width: int = 3

    (section,) = configref.sections(Bare)
    assert [(k.path, k.type, k.default, k.description) for k in section.keys] == [("width", "int", "3", "")]


def test_descriptions_come_from_docstrings_then_comments():
    class Described(StrictModel):
        a: int = 1
        """From the docstring."""
        b: int = 2  # from the trailing comment
        # from the comment above
        c: int = 3
        d: int = 4  # fmt: skip

    got = {k.path: k.description for k in configref.sections(Described)[0].keys}
    assert got == {"a": "From the docstring.", "b": "from the trailing comment",
                   "c": "from the comment above", "d": ""}


def test_types_and_defaults_read_like_the_toml():
    from sanlab.config import TrainConfig
    from sanlab.study.spec import FinalSpec, SweepSpec

    keys = {k.path: k for s in configref.sections(TrainConfig) for k in s.keys}
    assert keys["tokens"].type == "tokens | none" and keys["tokens"].default == "none"
    assert keys["device"].type == '"auto" | "cpu" | "cuda"'
    assert keys["milestones"].default == "[0.0, 0.25, 0.5, 0.75, 1.0]"
    sweep = {k.path: k for k in configref.sections(SweepSpec)[0].keys}
    assert sweep["tokens"].default == "5000000000 (5B)"
    final = {k.path: k for k in configref.sections(FinalSpec)[0].keys}
    assert final["tokens"].default == "[105000000000] (105B)"


# --------------------------------------------------------------------------- the site


class _FirstCells(html.parser.HTMLParser):
    """The text of the first cell of every table row."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []
        self._col = -1
        self._in_first = False

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self._col = -1
        elif tag in ("td", "th"):
            self._col += 1
            self._in_first = self._col == 0
            if self._in_first:
                self.cells.append("")

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._in_first = False

    def handle_data(self, data):
        if self._in_first:
            self.cells[-1] += data


def test_site_builds_strictly_and_its_config_page_lists_every_key(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    # Not -q: mkdocs counts warnings for --strict only when they are logged.
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    # The offline plugin writes page.html (no directory URLs), so the site opens from disk.
    for page in ("index", "getting-started", "science", "reference/config", "reference/formats",
                 "guides/cluster", "variants", "api/config", "changelog"):
        assert (site / f"{page}.html").is_file(), page
    for command in ("match", "prepare", "train", "study", "analyze", "signal"):
        assert (site / "commands" / f"{command}.html").is_file(), command
    study_api = (site / "api" / "study.html").read_text()
    assert "doc-heading" in study_api  # API pages from docstrings
    # API pages list every module of their package, and "other" every module no page covers.
    assert 'id="sanlab.study.sweep"' in study_api
    assert 'id="sanlab.commands.match"' in (site / "api" / "other.html").read_text()
    assert not [p for p in site.rglob("*.html") if "sanlab:api" in p.read_text() or "sanlab:config" in p.read_text()]
    # Docstrings' "SPEC §1.4" citations link to that section of the science page.
    assert '<a href="../science.html#14-learning-rate-fairness-and-the-noise-floor">SPEC §1.4</a>' in study_api
    parser = _FirstCells()
    parser.feed((site / "reference" / "config.html").read_text())
    on_page = {c.strip() for c in parser.cells} - {"key"}
    # The page is the generated reference (built by the hook at build time, not a stale copy).
    generated = set(re.findall(r"^\| `([^`]+)` \|", configref.render_markdown(), flags=re.M))
    assert on_page == generated, (sorted(generated - on_page), sorted(on_page - generated))


def test_the_home_page_commands_row_links_every_command():
    from sanlab.cli import COMMANDS

    row = next(ln for ln in (ROOT / "docs" / "index.md").read_text().splitlines() if ln.startswith("| Commands |"))
    linked = re.findall(r"\[([a-z]+)\]\(commands/([a-z]+)\.md\)", row)
    assert [name for name, _ in linked] == [page for _, page in linked]
    assert {name for name, _ in linked} == set(COMMANDS), set(COMMANDS) ^ {name for name, _ in linked}


# --------------------------------------------------------------------------- generated from the registry


def test_the_mixer_tables_are_what_the_registry_gives():
    """docs/variants.md and docs/architecture.md hold the registry's tables
    (`python -m sanlab.configref --write-docs` rewrites them)."""
    assert configref.stale_docs(ROOT) == [], "stale: run `python -m sanlab.configref --write-docs`"


def test_a_stale_or_unmarked_table_is_caught_and_nothing_is_written(tmp_path):
    for rel in configref.GENERATED:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    variants = tmp_path / "docs" / "variants.md"
    variants.write_text(variants.read_text().replace("| `softmax` |", "| `softmax2` |"))
    assert configref.stale_docs(tmp_path) == ["docs/variants.md"]
    assert configref.main(["--check-docs", "--root", str(tmp_path)]) == 1
    assert configref.main(["--write-docs", "--root", str(tmp_path)]) == 0
    assert configref.stale_docs(tmp_path) == []
    arch = tmp_path / "docs" / "architecture.md"
    arch.write_text(arch.read_text().replace("<!-- /sanlab:mixer-files -->", ""))
    variants.write_text(variants.read_text().replace("| `softmax` |", "| `softmax2` |"))
    before = variants.read_text()
    assert configref.main(["--write-docs", "--root", str(tmp_path)]) == 2  # one line, nothing written
    assert variants.read_text() == before


def test_the_variant_guide_shows_its_example_file_and_test():
    """docs/variants.md's "Write a variant" includes the sliding-window and the sinks +
    window mixers' files and their tests (mkdocs snippets): all exist, the files are
    registered mixers of the package, and the tests are ones the suite runs."""
    from sanlab.model import mixers

    section = (ROOT / "docs" / "variants.md").read_text().split("## Write a variant", 1)[1].split("\n## ", 1)[0]
    included = re.findall(r'^--8<-- "([^"]+)"$', section, flags=re.M)
    assert included == ["src/sanlab/model/mixers/sliding_window.py", "tests/test_sliding_window.py",
                        "src/sanlab/model/mixers/sink_window.py", "tests/test_sink_window.py"]
    assert all((ROOT / path).is_file() for path in included)
    for name in ("sliding_window", "sink_window"):
        assert mixers.MIXERS[name].__module__ == f"sanlab.model.mixers.{name}"
