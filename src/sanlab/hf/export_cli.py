"""`sanlab export RUN_DIR --hf OUT [--checkpoint latest|milestone-050] [--as FAMILY] [--data DIR]`

Writes the run's checkpoint as a 🤗 transformers folder (`sanlab.hf.export`; the layout is
in docs/sharing.md). Without `--as` the folder carries its own modeling code (load it with
`trust_remote_code=True`); `--as llama|qwen3|gemma|gemma2|gemma3` writes a stock
architecture where that computes exactly the run's model, and refuses in one line where it
does not (`sanlab.hf.stock`). OUT must not exist or be empty; nothing is written until
every check has passed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sanlab.hf.export import export
from sanlab.hf.stock import FAMILIES


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, metavar="RUN_DIR", help="a trained run directory")
    parser.add_argument("--hf", type=Path, required=True, metavar="OUT",
                        help="the folder to write (must not exist, or be empty)")
    parser.add_argument("--checkpoint", default="latest", metavar="NAME",
                        help="checkpoint: latest, milestone-050 or 50 (default latest)")
    parser.add_argument("--as", dest="family", choices=FAMILIES, default=None,
                        help="write a stock transformers architecture instead of sanlab's own modeling code "
                             "(only where it is exact)")
    parser.add_argument("--data", type=Path, default=None, metavar="DIR",
                        help="prepared data dir holding the run's tokenizer (default: the run's data.dir)")


def run(args: argparse.Namespace) -> int:
    out = export(args.run, args.hf, args.checkpoint, args.family, args.data)
    how = f"a stock {args.family} model" if args.family else "load with trust_remote_code=True"
    print(f"exported {args.run} ({args.checkpoint}) to {out} ({how})")
    return 0
