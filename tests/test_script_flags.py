"""The developer scripts under scripts/ end a user mistake as `sanlab` does: one
`SCRIPT: error: …` line naming the problem and exit 2, never a traceback. Run as a user
runs them: from another directory, by a relative path."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _script(name: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    rel = os.path.relpath(SCRIPTS / name, cwd)
    return subprocess.run([sys.executable, rel, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture
def here(tmp_path: Path) -> Path:
    (tmp_path / "page.html").write_text('<html><body><h1>t</h1>\n<h2 id="gaps">Gaps</h2><p>x</p></body></html>\n')
    (tmp_path / "notes.toml").write_text('name = "x"\n')
    (tmp_path / "a.json").write_text('{"san": {"params": 1}}')
    return tmp_path


CASES = {
    "screenshots: missing page": ("report_screenshots.py", ["nope.html", "out"],
                                  "report_screenshots.py: error: nope.html: cannot be read as a report page "
                                  "(No such file or directory)"),
    "screenshots: page is a directory": ("report_screenshots.py", [".", "out"],
                                         "report_screenshots.py: error: .: cannot be read as a report page "
                                         "(Is a directory)"),
    "screenshots: not a report": ("report_screenshots.py", ["notes.toml", "out"],
                                  "report_screenshots.py: error: notes.toml: no report sections (<h2 id=...>) in it; "
                                  "is it a `sanlab report` page?"),
    "screenshots: out under a file": ("report_screenshots.py", ["page.html", "notes.toml/out"],
                                      "report_screenshots.py: error: OUT notes.toml/out: {here}/notes.toml is a file, "
                                      "not a directory"),
    "screenshots: height 0": ("report_screenshots.py", ["page.html", "out", "--height", "0"],
                              "report_screenshots.py: error: argument --height: must be >= 1, got '0' "
                              "(see `report_screenshots.py --help`)"),
    "fingerprint: missing file": ("mixer_fingerprint.py", ["--compare", "a.json", "nope.json"],
                                  "mixer_fingerprint.py: error: nope.json: cannot be read (No such file or directory)"),
    "fingerprint: not JSON": ("mixer_fingerprint.py", ["--compare", "notes.toml", "a.json"],
                              "mixer_fingerprint.py: error: notes.toml: malformed JSON "
                              "(Expecting value: line 1 column 1 (char 0))"),
    "fingerprint: unknown flag": ("mixer_fingerprint.py", ["--bogus"],
                                  "mixer_fingerprint.py: error: unrecognized arguments: --bogus "
                                  "(see `mixer_fingerprint.py --help`)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_mistake_is_one_line_and_exit_2(here: Path, case: str) -> None:
    name, args, line = CASES[case]
    r = _script(name, args, here)
    assert (r.returncode, r.stderr) == (2, line.format(here=here.resolve()) + "\n")
    assert not (here / "out").exists()  # refused before any output


def test_fingerprint_compare_reports_what_changed(here: Path) -> None:
    (here / "b.json").write_text('{"san": {"params": 2}}')
    same = _script("mixer_fingerprint.py", ["--compare", "a.json", "a.json"], here)
    assert (same.returncode, same.stdout) == (0, "identical: 1 configurations\n")
    diff = _script("mixer_fingerprint.py", ["--compare", "a.json", "b.json"], here)
    assert (diff.returncode, diff.stdout) == (1, "san.params: 1 -> 2\n")


def test_screenshot_sections_are_the_pages_h2s() -> None:
    spec = importlib.util.spec_from_file_location("report_screenshots", SCRIPTS / "report_screenshots.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    head = "<html><body><nav>n</nav>\n"
    page = head + '<h2 id="a">A</h2><p>1</p>\n<h2 id="b">B</h2><p>2</p></body></html>'
    assert mod.sections(page) == [("a", head + '<h2 id="a">A</h2><p>1</p>\n</body></html>\n'),
                                  ("b", head + '<h2 id="b">B</h2><p>2</p></body></html>\n')]
    assert mod.sections("<html><body><p>no sections</p></body></html>") == []
