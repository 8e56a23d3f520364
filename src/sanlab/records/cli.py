"""`sanlab record export|readme|check`: committed records of finished studies."""

from __future__ import annotations

import argparse
from pathlib import Path

from sanlab.errors import EXIT_OK
from sanlab.records.export import export
from sanlab.records.readme import check, readme

_EPILOG = """\
examples:
  sanlab record export runs/quick records/my-record   # no checkpoints, no shards
  sanlab record readme records/my-record              # rewrite the README's generated blocks
  sanlab record check                                 # every record under records/ (make records-check)
  sanlab record check records/my-record               # one record; exit 1 when a block is stale
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    e = sub.add_parser("export", help="copy a finished study dir into a record (no checkpoints, no shards)")
    e.add_argument("study_dir", type=Path, metavar="STUDY_DIR")
    e.add_argument("record_dir", type=Path, metavar="RECORD_DIR")
    r = sub.add_parser("readme", help="rewrite the README's generated blocks from the committed results")
    r.add_argument("record_dir", type=Path, metavar="RECORD_DIR")
    c = sub.add_parser("check", help="write nothing; exit 1 when a README block differs from its results")
    c.add_argument("dirs", type=Path, nargs="*", metavar="DIR",
                   help="record dirs, or dirs holding records (default: records)")


def run(args: argparse.Namespace) -> int:
    if args.action == "export":
        export(args.study_dir, args.record_dir)
        return EXIT_OK
    if args.action == "readme":
        return readme(args.record_dir)
    return check(args.dirs or [Path("records")])
