"""report.md: the report's sections as GitHub-flavoured Markdown, figures linked beside it."""

from __future__ import annotations

import os
from pathlib import Path

from sanlab.report.build import Block, Report


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _block(b: Block, out: Path) -> str:
    if b.kind == "text":
        return b.text
    if b.kind == "warning":
        return f"> **warning:** {b.text}"
    if b.kind == "placeholder":
        return f"> _{b.text}_"
    if b.kind == "code":
        title = b.columns[0] if b.columns else ""
        return f"<details><summary>{title}</summary>\n\n```toml\n{b.text}\n```\n\n</details>"
    if b.kind == "figure":
        assert b.path is not None
        rel = os.path.relpath(b.path, out)
        return f"![{_cell(b.text.split(':')[0])}]({rel})\n\n*{b.text}*"
    lines = [f"**{b.text}**", "", "| " + " | ".join(_cell(c) or " " for c in b.columns) + " |",
             "|" + "|".join("---" for _ in b.columns) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in b.rows]
    return "\n".join(lines)


def render(report: Report, out: Path) -> str:
    parts = [f"# {report.title}"]
    for s in report.sections:
        parts.append(f"## {s.title}")
        parts += [_block(b, out) for b in s.blocks]
    return "\n\n".join(parts) + "\n"
