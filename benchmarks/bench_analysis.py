"""Wall time of `sanlab analyze` on a 20-layer SAN on the CPU, default evaluation sample.

A short real run (the trainer, 5 milestone checkpoints) of the paper's SAN depth at CPU
width (20 layers, d=128, 4/2 heads, vocab 2,048, T=256), then `sanlab analyze` with its
defaults (32 held-out rows = 8,192 tokens; losses, attention, stream, spectra over the
milestones). Prints the time of each section and the total; the analysis is meant to
take well under a minute.

    python benchmarks/bench_analysis.py [--layers 20] [--d 128] [--eval-rows 32]
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from sanlab.cliargs import ArgumentParser, positive_int, script_main


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="bench_analysis.py", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=positive_int, default=20)
    p.add_argument("--d", type=positive_int, default=128)
    p.add_argument("--eval-rows", type=positive_int, default=32)
    a = p.parse_args(argv)

    import torch

    from sanlab.cli import main as sanlab_main

    def sanlab(args: list[str]) -> None:
        """A sanlab command; one that fails has printed its one line: the benchmark ends with its code."""
        code = sanlab_main(args)
        if code:
            raise SystemExit(code)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data, run = root / "data", root / "san"
        sanlab(["prepare", "--corpus", "synth", "--out", str(data), "--tokens", "60k", "val_frac=0.15"])
        t0 = time.perf_counter()
        sanlab(["train", "--out", str(run), f"data.dir={data}", f"model.n_layers={a.layers}",
                       f"model.d_model={a.d}", "train.steps=4", "train.batch_rows=8", "train.eval_every=0",
                       "train.eval_rows=8", "train.device=cpu"])  # fmt: skip
        train_s = time.perf_counter() - t0

        timings = {}
        for label, skip in (("losses+attention+stream", ["--skip", "spectra"]),
                            ("spectra (5 milestones)", ["--skip", "losses,attention,stream"]),
                            ("everything (default)", [])):  # fmt: skip
            out = root / f"out-{len(timings)}"
            t0 = time.perf_counter()
            sanlab(["analyze", str(run), "--out", str(out), "--eval-rows", str(a.eval_rows), *skip])
            timings[label] = time.perf_counter() - t0
        sample = json.loads((out / "analysis.json").read_text())["sample"]

    print()
    print(f"model: SAN {a.layers} layers, d={a.d}; torch threads {torch.get_num_threads()}; "
          f"(training the 4-step run took {train_s:.1f} s)")  # fmt: skip
    print(f"evaluation sample: {sample['rows']} rows x {sample['seq_len']} tokens ({sample['tokens']} scored)")
    for label, s in timings.items():
        print(f"  analyze {label:28s} {s:6.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(script_main(main))
