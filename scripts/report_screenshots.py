#!/usr/bin/env python3
"""Screenshots of a report's sections in headless Chromium, for the report guide.

    python scripts/report_screenshots.py runs/quick/report/report.html docs/img

writes `report-<section>.png` (the page's title and nav, then one section) for every
section of the page, cropped to what the section shows. Needs Debian's `chromium`
(`apt-get install chromium`); the flags are the ones the browser test uses.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from sanlab.cliargs import ArgumentParser, positive_int, script_main
from sanlab.errors import ConfigError, DataError
from sanlab.paths import check_out_dir

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1")
WIDTH = 1560


def sections(page: str) -> list[tuple[str, str]]:
    """(anchor, page with only that section after the header) for each <h2> section."""
    head, found, rest = page.partition('<h2 id="')
    if not found:
        return []
    parts = ('<h2 id="' + rest).split('<h2 id="')[1:]
    out = []
    for part in parts:
        anchor = part.split('"', 1)[0]
        body = re.sub(r"</body></html>\s*$", "", '<h2 id="' + part)
        out.append((anchor, head + body + "</body></html>\n"))
    return out


def crop(path: Path) -> None:
    """Cut the white space under the content (the window is taller than any section)."""
    from PIL import Image

    img = Image.open(path).convert("RGB")
    gray = img.convert("L")
    w, h = gray.size
    px = gray.load()
    last = max((y for y in range(h) if any(px[x, y] < 245 for x in range(0, w, 4))), default=h - 1)
    # 256 colours: a page of text and line plots loses nothing visible, and the file a third
    img.crop((0, 0, w, min(h, last + 24))).quantize(256).save(path, optimize=True)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="report_screenshots.py", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("html", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--height", type=positive_int, default=4000, help="window height (taller than any section)")
    args = ap.parse_args(argv)
    try:
        page = args.html.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{args.html}: cannot be read as a report page ({getattr(e, 'strerror', None) or e})") from None
    found = sections(page)
    if not found:
        raise DataError(f"{args.html}: no report sections (<h2 id=...>) in it; is it a `sanlab report` page?")
    check_out_dir(args.out, "OUT")
    browser = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    if browser is None:
        raise ConfigError("no Chromium (apt-get install chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for anchor, page in found:
            src = Path(tmp) / f"{anchor}.html"
            src.write_text(page, encoding="utf-8")
            shot = args.out / f"report-{anchor}.png"
            try:
                subprocess.run([browser, *FLAGS, f"--user-data-dir={Path(tmp) / 'profile'}",
                                f"--window-size={WIDTH},{args.height}", f"--screenshot={shot}", src.as_uri()],
                               check=True, capture_output=True, timeout=180)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
                raise DataError(f"{browser} failed on section {anchor!r}: "
                                f"{'timed out' if isinstance(e, subprocess.TimeoutExpired) else f'exit {e.returncode}'}"
                                ) from None
            crop(shot)
            print(shot)
    return 0


if __name__ == "__main__":
    raise SystemExit(script_main(main))
