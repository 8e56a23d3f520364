"""report.html: one self-contained page — figures embedded as data: URIs, inline CSS, no
script and no network reference, so it opens from a laptop, a mail or a cluster's disk."""

from __future__ import annotations

import base64
import html
import re

from sanlab.report.build import Block, Report

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0 auto;
       max-width: 1500px; padding: 1.5em 2em; color: #1f2328; line-height: 1.45; }
h1 { font-size: 1.7em; border-bottom: 2px solid #d0d7de; padding-bottom: .3em; }
h2 { font-size: 1.3em; margin-top: 2em; border-bottom: 1px solid #d0d7de; padding-bottom: .2em; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: .6em 0 1.2em; font-size: .88em; }
caption { text-align: left; font-weight: 600; padding: .3em 0; }
th, td { border: 1px solid #d0d7de; padding: .25em .6em; text-align: left; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f6f8fa; }
.wrap { overflow-x: auto; }
figure { margin: 1em 0 1.6em; }
figure img { max-width: 100%; border: 1px solid #eaeef2; }
figcaption { font-size: .9em; color: #57606a; margin-top: .3em; }
.placeholder { background: #f6f8fa; border: 1px dashed #8c959f; color: #57606a; padding: .8em 1em;
               margin: .8em 0; font-style: italic; }
.warning { background: #fff8c5; border-left: 4px solid #d4a72c; padding: .5em 1em; margin: .6em 0; }
pre { background: #f6f8fa; padding: 1em; overflow-x: auto; font-size: .8em; }
code { background: #f6f8fa; padding: 0 .2em; }
"""


def _inline(text: str) -> str:
    """Escaped text with the two Markdown marks the sections use: **bold** and `code`."""
    t = html.escape(text)
    t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", t)


def _block(b: Block) -> str:
    if b.kind == "text":
        return f"<p>{_inline(b.text)}</p>"
    if b.kind == "warning":
        return f'<div class="warning"><b>warning:</b> {_inline(b.text)}</div>'
    if b.kind == "placeholder":
        return f'<div class="placeholder">{_inline(b.text)}</div>'
    if b.kind == "code":
        title = html.escape(b.columns[0] if b.columns else "")
        return f"<details><summary>{title}</summary><pre>{html.escape(b.text)}</pre></details>"
    if b.kind == "figure":
        assert b.path is not None
        data = base64.b64encode(b.path.read_bytes()).decode("ascii")
        alt = html.escape(b.text.split(":")[0], quote=True)
        return (f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">'
                f"<figcaption>{_inline(b.text)}</figcaption></figure>")
    head = "".join(f"<th>{html.escape(c)}</th>" for c in b.columns)
    body = "".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in b.rows)
    return (f'<div class="wrap"><table><caption>{_inline(b.text)}</caption><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


_NUMERIC = re.compile(r"^(\*\*)?([-+]?[0-9][0-9,.]*(e[-+]?[0-9]+)?[%×KMB]?|…|—)(\*\*)?(\s|$)")


def _td(cell: str) -> str:
    """Numbers right-aligned (digits line up), words left."""
    cls = ' class="num"' if _NUMERIC.match(cell) else ""
    return f"<td{cls}>{_inline(cell)}</td>"


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def render(report: Report) -> str:
    nav = " ".join(f'<a href="#{_anchor(s.title)}">{html.escape(s.title)}</a>' for s in report.sections)
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{html.escape(report.title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{html.escape(report.title)}</h1>", f"<nav>{nav}</nav>"]
    for s in report.sections:
        parts.append(f'<h2 id="{_anchor(s.title)}">{html.escape(s.title)}</h2>')
        parts += [_block(b) for b in s.blocks]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
