"""MkDocs hooks (`hooks:` in mkdocs.yml): pages generated from the code at build time.

`reference/config.md` holds the marker below; the hook replaces it with the reference
rendered from the config models (`sanlab.configref`), so the page lists every key the
code accepts, including keys added after this page was written. The changelog page
includes the repository's CHANGELOG.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG_MARKER = "<!-- sanlab:config-reference -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if CONFIG_MARKER in markdown:
        if str(ROOT / "src") not in sys.path:
            sys.path.insert(0, str(ROOT / "src"))  # the checkout's sanlab, installed or not
        from sanlab.configref import render_markdown

        markdown = markdown.replace(CONFIG_MARKER, render_markdown())
    return markdown
