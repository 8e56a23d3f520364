"""`sanlab report STUDY_DIR [--out DIR] [--analyze [--milestones]]`: the study's figures
and tables as PNGs, report.md and one self-contained report.html.

Works on a finished study and on one still running (missing results become
placeholders). `--analyze` first runs `sanlab analyze` for the final pairs that have no
analysis yet (`STUDY_DIR/analysis/final-OPT-TOKENS-sSEED/`), which is what the region,
exercise, spectra, attention and stream figures are drawn from. `--milestones` also
analyses each of those groups' losses at every milestone checkpoint its runs share (not
0% or 100%), into `STUDY_DIR/analysis/GROUP/milestones/milestone-NNN/`: how the loss
against the floor and Δ by exercise type move during training (the learning-speed
confound). The report itself does not draw them; records read them
(`sanlab.analysis.output.load_milestone_analyses`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sanlab.errors import EXIT_OK, ConfigError, DataError
from sanlab.report.data import (
    analyze_groups,
    analyze_milestones,
    load,
    load_analyses,
    missing_analyses,
    missing_milestone_analyses,
)

REPORT_DIR = "report"  # default output inside the study dir; `sanlab study status` looks there

_EPILOG = """\
examples:
  sanlab report runs/quick                 # figures and tables from what is there now
  sanlab report runs/quick --analyze       # analyse the final pairs first (needs their checkpoints)
  sanlab report runs/quick --analyze --milestones
                                           # and their losses at each milestone checkpoint
                                           # (analysis/GROUP/milestones/milestone-NNN/)
  sanlab report runs/quick --out /tmp/rep  # write somewhere else
"""


def _rows(text: str) -> int | str:
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of rows or auto, got {text!r}") from None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    parser.add_argument("dir", type=Path, metavar="STUDY_DIR", help="a study dir (`sanlab study run --out`)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help=f"where to write the report (default: STUDY_DIR/{REPORT_DIR})")
    parser.add_argument("--analyze", action="store_true",
                        help="run `sanlab analyze` for the final pairs that have no analysis yet")
    parser.add_argument("--milestones", action="store_true",
                        help="with --analyze: also analyse those pairs' losses at every milestone checkpoint "
                             "the runs share, but 0%% and 100%% (--checkpoint milestone-NNN --skip "
                             "attention,stream,spectra), into STUDY_DIR/analysis/GROUP/milestones/milestone-NNN/; "
                             "existing ones are kept")
    parser.add_argument("--eval-rows", type=_rows, default="auto", metavar="N|auto",
                        help="held-out rows per analysis with --analyze (default auto: the fewest rows in "
                             "which every region and exercise type has 200 scored tokens)")


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def make_report(study_dir: Path, out: Path | None = None, *, analyze: bool = False, milestones: bool = False,
                eval_rows: int | str = "auto", log=print) -> tuple[Path, list[int]]:
    """Write the report; (path of report.html, corrupt results lines that were skipped).
    `milestones` (with `analyze`): the final pairs' milestone analyses too."""
    # lazy: matplotlib; `sanlab study status` imports this module and runs without it
    from sanlab.report import html, md
    from sanlab.report.build import build

    if milestones and not analyze:
        raise ConfigError("--milestones analyses the final pairs at their milestones: it needs --analyze")
    if eval_rows != "auto" and (not isinstance(eval_rows, int) or eval_rows <= 0):
        raise DataError(f"--eval-rows must be positive, got {eval_rows}")
    data = load(study_dir)  # first: a dir that is not a study gets no report dir
    out = out if out is not None else study_dir / REPORT_DIR
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = "it is a file, not a directory" if out.exists() and not out.is_dir() else e.strerror
        raise DataError(f"cannot write the report to {out}: {why}") from None
    if analyze:
        todo = missing_analyses(data)
        if todo:
            log(f"analysing {len(todo)} group(s) of final runs (`sanlab analyze ARM… --vs REFERENCE`)")
            data.analysis_errors = analyze_groups(data, todo, eval_rows=eval_rows, log=log)
            data.analyses = load_analyses(study_dir)
    if analyze and milestones:
        due = missing_milestone_analyses(data)
        if due:
            log(f"analysing {len(due)} milestone(s) of the final pair groups (losses only)")
            data.analysis_errors += analyze_milestones(data, due, eval_rows=eval_rows, log=log)
    report = build(data, out)
    _write(out / "report.md", md.render(report, out))
    html_path = out / "report.html"
    _write(html_path, html.render(report))
    log(f"wrote {len(report.figures)} figures, report.md and report.html to {out}")
    return html_path, data.corrupt_lines


def run(args: argparse.Namespace) -> int:
    html_path, corrupt = make_report(args.dir, args.out, analyze=args.analyze, milestones=args.milestones,
                                     eval_rows=args.eval_rows)
    print(html_path)
    if corrupt:
        sys.stdout.flush()
        raise DataError(f"{args.dir}/results.jsonl: corrupt line(s) {', '.join(map(str, corrupt[:10]))} "
                        "skipped; the report was written without them")
    return EXIT_OK
