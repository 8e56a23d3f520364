"""`sanlab sample RUN_DIR --prompt TEXT [--max-new-tokens N --temperature T --top-k K --top-p P --seed S]`

Generates a continuation of the prompt with the run's checkpoint and streams it to
stdout token by token. The prompt is text in the run's own format: SYNTH-format chat
markers (`<|im_start|>user …<|im_end|>`, `<think>`) are encoded as their atomic special
ids by the run's tokenizer, and the prompt starts a document (BOS first), as in
training. Decoding uses a KV cache where the sequence mixer has one
(`sanlab.model.generate`); generation stops at EOS or after `--max-new-tokens`.

A prompt longer than the run's `seq_len` keeps its last `seq_len - 1` tokens (a
warning on stderr says how many were dropped); once the context fills `seq_len`, the
window slides (the oldest quarter is dropped).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sanlab.data.regions import EOS_ID
from sanlab.errors import ConfigError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, metavar="RUN_DIR", help="a trained run directory")
    parser.add_argument("--prompt", required=True, help="the text to continue (chat markers allowed)")
    parser.add_argument("--max-new-tokens", type=int, default=128, metavar="N",
                        help="tokens to generate (default 128; at most 1,000,000: past seq_len the window slides)")
    parser.add_argument("--temperature", type=float, default=1.0, metavar="T",
                        help="softmax temperature; 0 = greedy (default 1.0)")
    parser.add_argument("--top-k", type=int, default=0, metavar="K", help="sample among the K likeliest; 0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, metavar="P",
                        help="nucleus sampling: the smallest set with probability >= P; 1 = off")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="sampling seed (default 0)")
    parser.add_argument("--checkpoint", default="latest", metavar="NAME",
                        help="checkpoint: latest, milestone-050 or 50 (default latest)")
    parser.add_argument("--data", type=Path, default=None, metavar="DIR",
                        help="prepared data dir holding the run's tokenizer (default: the run's data.dir)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    parser.add_argument("--no-cache", action="store_true", help="full forward pass per token (for comparison)")
    parser.add_argument("--stats", action="store_true", help="print tokens/s on stderr at the end")


def run(args: argparse.Namespace) -> int:
    # lazy: torch; `sanlab sample --help` runs without it
    import torch

    from sanlab.eval.run import open_run
    from sanlab.model.generate import Decoder, SamplingConfig, generate

    cfg = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, seed=args.seed)
    if not args.prompt:
        raise ConfigError("--prompt: give some text to continue")
    try:
        args.prompt.encode("utf-8")  # the shell's bytes, decoded with surrogate escapes where they are not UTF-8
    except UnicodeEncodeError as e:
        bad = args.prompt[e.start].encode("utf-8", "surrogateescape")
        raise ConfigError(f"--prompt: not valid UTF-8 text (byte {bad!r} at character {e.start})") from None
    loaded = open_run(args.run, args.checkpoint, args.data, args.device)
    ids = loaded.encode_document(args.prompt)
    L = loaded.seq_len
    if len(ids) >= L:
        print(f"sanlab: warning: the prompt is {len(ids)} tokens, the run's seq_len is {L}: "
              f"keeping its last {L - 1}", file=sys.stderr)
        ids = ids[-(L - 1):]
    note = Decoder(loaded.model, max_len=L, use_cache=not args.no_cache).note
    if note:
        print(f"sanlab: note: {note}", file=sys.stderr)
    out = sys.stdout
    out.write(args.prompt)
    out.flush()
    new: list[int] = []
    shown = ""
    t0 = time.perf_counter()
    with torch.autocast(loaded.device.type, dtype=torch.bfloat16, enabled=loaded.autocast_dtype is not None):
        for tok in generate(loaded.model, torch.tensor(ids), cfg, max_len=L, stop_ids=(EOS_ID,),
                            use_cache=not args.no_cache):
            if tok == EOS_ID:
                break
            new.append(tok)
            text = loaded.decode(new)
            if not text.endswith("\ufffd"):  # a multi-byte character still incomplete: wait for its rest
                out.write(text[len(shown):])
                out.flush()
                shown = text
    dt = time.perf_counter() - t0
    out.write(loaded.decode(new)[len(shown):] + "\n")
    out.flush()
    if args.stats:
        print(f"{len(new)} tokens in {dt:.2f}s ({len(new) / dt if dt else 0:.1f} tokens/s)", file=sys.stderr)
    return 0
