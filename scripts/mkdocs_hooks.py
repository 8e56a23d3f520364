"""MkDocs hooks (`hooks:` in mkdocs.yml): what the site builds from the code itself.

- `reference/config.md` holds the marker below; the hook replaces it with the reference
  rendered from the config models (`sanlab.configref`), so the page lists every key the
  code accepts, including keys added after the page was written.
- An API page that holds `<!-- sanlab:api PACKAGE -->` gets a `::: module` entry for
  every module of PACKAGE, so a module added to the package appears without editing
  the page; `<!-- sanlab:api-rest -->` lists every part of sanlab no other API page
  covers (a new subpackage lands there until it gets a page of its own).
- Docstrings and comments cite the science as "SPEC §1.4"; on every page (the API pages
  included) such a citation becomes a link to that section of `science.md`, whose
  headings carry the same numbers.
"""

from __future__ import annotations

import pkgutil
import re
import sys
from pathlib import Path

from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[1]
CONFIG_MARKER = "<!-- sanlab:config-reference -->"
SCIENCE = "science.md"
_CITATION = re.compile(r"SPEC §(\d+(?:\.\d+)?)")
_HEADING = re.compile(r"^#{2,3} §(\d+(?:\.\d+)?) .*$", re.M)
_PRE = re.compile(r"(<pre\b.*?</pre>|<a\b.*?</a>)", re.S)
_API = re.compile(r"<!-- sanlab:api ([\w.]+) -->")
_API_REST = "<!-- sanlab:api-rest -->"
_EXPLICIT = re.compile(r"^::: ([\w.]+)", re.M)


def _modules(package: str) -> list[str]:
    """`package` and its modules, by file (nothing is imported), `__main__` left out."""
    path = ROOT / "src" / Path(*package.split("."))
    if not path.is_dir():
        return [package]
    found = [package]
    for info in pkgutil.iter_modules([str(path)]):
        if info.name != "__main__":
            found += _modules(f"{package}.{info.name}") if info.ispkg else [f"{package}.{info.name}"]
    return found


def _covered(config) -> set[str]:
    """Modules some API page already shows, explicitly or through a package marker."""
    covered: set[str] = set()
    for md in (Path(config["docs_dir"]) / "api").glob("*.md"):
        text = md.read_text()
        covered.update(_EXPLICIT.findall(text))
        for package in _API.findall(text):
            covered.update(_modules(package))
    return covered


def _api_markdown(markdown: str, config) -> str:
    def entries(names: list[str]) -> str:
        return "\n\n".join(f"::: {n}" for n in names)

    markdown = _API.sub(lambda m: entries(_modules(m.group(1))), markdown)
    if _API_REST in markdown:
        covered = _covered(config)
        rest = [m for m in _modules("sanlab") if m != "sanlab" and m not in covered]
        markdown = markdown.replace(_API_REST, entries(rest) if rest else "Every module has its page.")
    return markdown


def _science_anchors(config) -> dict[str, str]:
    """Section number -> anchor of its heading in science.md."""
    text = (Path(config["docs_dir"]) / SCIENCE).read_text()
    return {m.group(1): slugify(m.group(0).lstrip("#").strip(), "-") for m in _HEADING.finditer(text)}


def on_page_markdown(markdown: str, page, config, files) -> str:
    if CONFIG_MARKER in markdown:
        if str(ROOT / "src") not in sys.path:
            sys.path.insert(0, str(ROOT / "src"))  # the checkout's sanlab, installed or not
        from sanlab.configref import render_markdown

        markdown = markdown.replace(CONFIG_MARKER, render_markdown())
    return _api_markdown(markdown, config)


def on_page_content(html: str, page, config, files) -> str:
    anchors = _science_anchors(config)
    target = "../" * page.file.dest_uri.count("/") + files.get_file_from_path(SCIENCE).dest_uri

    def link(m: re.Match) -> str:
        number = m.group(1)
        anchor = anchors.get(number) or anchors.get(number.split(".")[0])
        return f'<a href="{target}#{anchor}">{m.group(0)}</a>' if anchor else m.group(0)

    # Not inside code blocks or existing links.
    parts = _PRE.split(html)
    return "".join(p if i % 2 else _CITATION.sub(link, p) for i, p in enumerate(parts))
