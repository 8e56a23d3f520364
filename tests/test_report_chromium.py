"""report.html in headless Chromium: every figure loads (decoded, at its PNG's own size) and
every section's figures and tables carry their captions.

The page is the report of `tests/report_study.py` (every figure drawn). A copy of it gets a
small probe script that, once the page has loaded, writes what the browser sees into the
DOM; `chromium --dump-dom` prints that DOM. CI installs Debian's `chromium` (`.ci/run`);
without it the test skips and says so.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest


CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# The flags a closed, root-run CI machine needs (no sandbox as root; no background networking,
# which this network refuses; a fresh profile).
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars")

PROBE = """<script>
window.addEventListener('load', () => {
  const images = [...document.images].map(i => ({alt: i.alt, loaded: i.complete && i.naturalWidth > 0,
                                                  width: i.naturalWidth, height: i.naturalHeight}));
  const sections = [...document.querySelectorAll('h2')].map(h => {
    const blocks = [];
    for (let n = h.nextElementSibling; n && n.tagName !== 'H2'; n = n.nextElementSibling) {
      for (const f of (n.tagName === 'FIGURE' ? [n] : n.querySelectorAll('figure')))
        blocks.push({kind: 'figure', caption: (f.querySelector('figcaption') || {}).textContent || ''});
      for (const t of (n.tagName === 'TABLE' ? [n] : n.querySelectorAll('table')))
        blocks.push({kind: 'table', caption: (t.querySelector('caption') || {}).textContent || ''});
      if (n.classList.contains('placeholder')) blocks.push({kind: 'placeholder', caption: n.textContent});
    }
    return {title: h.textContent, blocks};
  });
  const pre = document.createElement('pre');
  pre.id = 'sanlab-probe';
  pre.textContent = JSON.stringify({images, sections});
  document.body.appendChild(pre);
});
</script>"""


def chromium() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.mark.skipif(chromium() is None, reason="no Chromium on this machine (Debian: apt-get install chromium; "
                                               ".ci/run installs it)")
def test_chromium_loads_every_figure_and_every_section_has_its_captions(synthetic_report, tmp_path: Path) -> None:
    from sanlab.report import html as report_html

    report, _ = synthetic_report
    page = report_html.render(report)
    assert "<script" not in page  # the report itself runs no script; only the probed copy does
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    cmd = [chromium(), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000",
           "--dump-dom", probed.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "HOME": str(tmp_path)})
    m = re.search(r'<pre id="sanlab-probe">(.*?)</pre>', proc.stdout, re.S)
    assert m, f"no probe output (rc {proc.returncode}): {proc.stderr[-2000:]}"
    seen = json.loads(html.unescape(m.group(1)))

    figures = [b for s in report.sections for b in s.blocks if b.kind == "figure"]
    assert len(seen["images"]) == len(figures) == 10
    for img, fig in zip(seen["images"], figures):
        assert img["loaded"], img
        assert (img["width"], img["height"]) == _png_size(fig.path.read_bytes())  # decoded whole, not broken
    titles = [s.title for s in report.sections]
    assert [s["title"] for s in seen["sections"]] == titles
    for s in seen["sections"]:
        assert s["blocks"], f"section {s['title']!r} shows nothing"
        for b in s["blocks"]:
            assert b["caption"].strip(), f"a {b['kind']} of section {s['title']!r} has no caption"
    shown = [b["caption"] for s in seen["sections"] for b in s["blocks"] if b["kind"] == "figure"]
    # the captions are the report's own (as rendered: the `code` and **bold** marks become markup)
    assert [c.strip() for c in shown] == [re.sub(r"\*\*|`", "", f.text) for f in figures]
