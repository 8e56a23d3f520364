"""Free-recall generation (`sanlab eval`'s `generate_until`): greedy requests decoded as the
rows of a batch against the same requests decoded one at a time.

The requests are the built-in recall tasks' (`sanlab_closed_book_recall` and its
`_unseen` control: up to 400 facts each, their stop strings and token budget), built for the
run as `sanlab eval --tasks builtin` builds them. `batched` is `SanlabLM.generate_until` at
`--batch-size` rows (same-length contexts with the same budget share a batch); `one at a
time` is the same method at batch size 1, each request a batch of its own (what
`generate_until` did before it batched). The two alternate, `--rounds` times; the table gives
the median seconds per pass over all requests, requests/s, the ratio, and how many answers
the two passes agree on (every one: each row decodes as it would alone, up to the batch's
fp32 rounding).

Without `--run`, a short real run of the demo's SAN (5L d64, T128, vocab 1,024, 200 steps on
a small synth corpus) is trained first; `--run DIR` times a run of your own (the demo's:
`runs/quick/runs/san-L5-d64-muon-lr0.08-500K-s1`).

    python benchmarks/bench_generate.py [--run RUN_DIR] [--batch-size 16] [--rounds 3] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

RECALL = ("sanlab_closed_book_recall", "sanlab_closed_book_recall_unseen")


def recall_requests(lm, out: Path, limit: int | None = None) -> list:  # noqa: ANN001 - a SanlabLM
    """The recall tasks' requests for this run (the first `limit` of each task), as lm-eval
    hands them to `generate_until`."""
    from lm_eval.api.instance import Instance

    from sanlab.eval.builtin import RECALL_STOP, write_builtin_tasks

    info = write_builtin_tasks(lm.loaded, out)
    reqs = []
    for task in RECALL:
        path = out / f"{task}.jsonl"
        if not path.is_file():
            continue
        budget = info["recall"][task]["max_gen_toks"]
        for i, line in enumerate(path.read_text().splitlines()[:limit]):
            ctx = json.loads(line)["context"]
            reqs.append(Instance(request_type="generate_until", doc={}, idx=i, task_name=task,
                                 arguments=(ctx, {"until": list(RECALL_STOP), "max_gen_toks": budget,
                                                  "do_sample": False})))
    return reqs


def short_run(root: Path, steps: int) -> Path:
    from sanlab.cli import main as sanlab

    data, run = root / "data", root / "san"
    assert sanlab(["prepare", "--corpus", "synth", "--out", str(data), "--tokens", "300k", "seq_len=128", "vocab_size=1024"]) == 0
    assert sanlab(["train", "--out", str(run), f"data.dir={data}", "model.d_model=64", "model.n_layers=5",
                   "model.n_heads=4", "model.n_kv_heads=2", "model.vocab_size=1024", "model.ffn=false",
                   "data.seq_len=128", f"train.steps={steps}", "train.batch_rows=16", "train.eval_every=0",
                   "train.device=cpu"]) == 0  # fmt: skip
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", help="a trained run dir (default: train a short demo-shape SAN first)")
    p.add_argument("--batch-size", type=int, default=16, help="rows per decode batch (sanlab eval --batch-size)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--limit", type=int, help="at most this many requests per task (default: all)")
    p.add_argument("--steps", type=int, default=200, help="training steps of the short run (without --run)")
    a = p.parse_args(argv)
    if a.batch_size < 2 or a.rounds < 1 or a.steps < 1 or (a.limit is not None and a.limit < 1):
        print("bench_generate: --batch-size must be >= 2, --rounds, --steps and --limit >= 1", file=sys.stderr)
        return 2

    import torch

    from sanlab.errors import SanlabError
    from sanlab.eval.adapter import SanlabLM

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        try:
            run = Path(a.run) if a.run is not None else short_run(root, a.steps)
            batched = SanlabLM(run, batch_size=a.batch_size, device="cpu")
        except (SanlabError, OSError) as e:
            name = a.run if a.run is None or len(a.run) <= 60 else a.run[:60] + "…"
            print(f"bench_generate: {name}: {e.strerror or e}" if isinstance(e, OSError) else f"bench_generate: {e}",
                  file=sys.stderr)
            return 2
        alone = SanlabLM(loaded=batched.loaded, batch_size=1)
        reqs = recall_requests(batched, root / "tasks", a.limit)
        if not reqs:
            print("bench_generate: the run's data has no recall facts (a synth corpus's world)", file=sys.stderr)
            return 2
        lengths = {(len(batched._job(*r.args).ids), r.args[1]["max_gen_toks"]) for r in reqs}
        times: dict[str, list[float]] = {"batched": [], "one at a time": []}
        answers: dict[str, list[str]] = {}
        for r in range(a.rounds):
            order = [("batched", batched), ("one at a time", alone)]
            for name, lm in order if r % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                answers[name] = lm.generate_until(reqs)
                times[name].append(time.perf_counter() - t0)
    agree = sum(x == y for x, y in zip(answers["batched"], answers["one at a time"]))
    print(f"{len(reqs)} recall requests in {len(lengths)} (context length, budget) buckets; one thread; "
          f"median of {a.rounds} alternating round(s)")
    base = statistics.median(times["one at a time"])
    print(f"{'mode':<22}{'s per pass':>11}{'requests/s':>12}{'ratio':>8}")
    for name, ts in times.items():
        label = f"{name} ({a.batch_size} rows)" if name == "batched" else name
        med = statistics.median(ts)
        print(f"{label:<22}{med:>11.2f}{len(reqs) / med:>12.1f}{base / med:>7.2f}x")
    print(f"answers the same in both: {agree} of {len(reqs)}")
    return 0 if agree == len(reqs) else 1


if __name__ == "__main__":
    sys.exit(main())
