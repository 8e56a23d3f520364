"""The lm-evaluation-harness model `sanlab`: any sanlab run dir, in process.

    import lm_eval
    import sanlab.eval.adapter  # registers the model name "sanlab"
    lm_eval.simple_evaluate(model="sanlab", model_args="run_dir=runs/san,checkpoint=latest",
                            tasks=["lambada_openai"])
    # or with an instance: lm_eval.simple_evaluate(model=SanlabLM("runs/san"), tasks=[...])

Strings are tokenized with the run's own tokenizer; every request starts with BOS (as a
training document does) and is scored as its own document in packed rows
(`sanlab.eval.scoring`). Context and continuation are split the way lm-eval's HF model
splits them: trailing spaces of the context move to the continuation, the pair is
encoded whole and the continuation is what follows the context's own tokens.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from sanlab.data.regions import BOS_ID, EOS_ID
from sanlab.errors import ConfigError
from sanlab.eval.run import LoadedRun, open_run
from sanlab.eval.scoring import score
from sanlab.model.generate import SamplingConfig, generate


def _int(value: Any, name: str, default: int) -> int:
    if value is None or value == "auto":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected an integer, got {value!r}") from None


@register_model("sanlab")
class SanlabLM(LM):
    """A sanlab checkpoint as an lm-eval model (loglikelihood, rolling, generate_until)."""

    def __init__(
        self,
        run_dir: str | Path | None = None,
        checkpoint: str = "latest",
        data: str | Path | None = None,
        device: str | None = "auto",
        batch_size: int | str | None = 16,
        max_gen_toks: int | str = 128,
        loaded: LoadedRun | None = None,
        **_ignored: Any,  # max_batch_size and the like, which lm-eval passes to every model
    ) -> None:
        super().__init__()
        if loaded is None:
            if run_dir is None:
                raise ConfigError("model_args: run_dir=PATH is required")
            loaded = open_run(run_dir, checkpoint, data, device or "auto")
        self.loaded = loaded
        self.batch_rows = max(1, _int(batch_size, "batch_size", 16))
        self.max_gen_toks = _int(max_gen_toks, "max_gen_toks", 128)
        self.truncated = 0  # requests whose context lost tokens on the left
        self.truncated_by_task: Counter[str] = Counter()  # the same, by the request's task

    # ------------------------------------------------------------------ log-likelihood

    def _pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.loaded.encode(context + continuation)
        ctx = self.loaded.encode(context)
        return [BOS_ID] + ctx, whole[len(ctx):]

    def _score(self, pairs: list[tuple[list[int], list[int]]], tasks: list[str | None]) -> list[tuple[float, bool]]:
        """Score the pairs; `tasks[i]` is the task pair i belongs to (its truncation's count)."""
        out = score(self.loaded.model, pairs, self.loaded.seq_len, self.batch_rows, self.loaded.autocast_dtype)
        for s, task in zip(out, tasks):
            if s.truncated:
                self._count_truncated(task)
        return [(s.logprob, s.greedy) for s in out]

    def _count_truncated(self, task: str | None) -> None:
        self.truncated += 1
        self.truncated_by_task[task or ""] += 1

    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return self._score([self._pair(*r.args) for r in requests], [r.task_name for r in requests])

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        """log p(text) over disjoint windows of seq_len tokens, the first conditioned on
        BOS and each later one on the tokens just before it (lm-eval's rolling windows)."""
        windows: list[tuple[list[int], list[int]]] = []
        owner: list[int] = []
        for i, r in enumerate(requests):
            ids = self.loaded.encode(r.args[0])
            for w in get_rolling_token_windows(ids, BOS_ID, self.loaded.seq_len, 1):
                windows.append(make_disjoint_window(w))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (ll, _) in zip(owner, self._score(windows, [requests[i].task_name for i in owner])):
            totals[i] += ll
        return totals

    # ------------------------------------------------------------------ generation

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        return [self._generate(*r.args, task=r.task_name) for r in requests]

    def _generate(self, context: str, gen_kwargs: dict[str, Any], task: str | None = None) -> str:
        kw = dict(gen_kwargs or {})
        until = kw.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = _int(kw.pop("max_gen_toks", None), "max_gen_toks", self.max_gen_toks)
        sample = bool(kw.pop("do_sample", False))
        temperature = float(kw.pop("temperature", 0.0) or 0.0) if sample else 0.0
        cfg = SamplingConfig(max_new_tokens=max_new, temperature=temperature, top_k=int(kw.pop("top_k", 0) or 0),
                             top_p=float(kw.pop("top_p", 1.0) or 1.0), seed=int(kw.pop("seed", 0) or 0))
        L = self.loaded.seq_len
        ids = self.loaded.encode_document(context)
        keep = max(1, L - max_new)  # room for the answer inside the trained row length
        if len(ids) > keep:
            ids = ids[-keep:]
            self._count_truncated(task)
        new: list[int] = []
        text = ""
        dt = self.loaded.autocast_dtype
        with torch.autocast(self.loaded.device.type, dtype=dt or torch.float32, enabled=dt is not None):
            for tok in generate(self.loaded.model, torch.tensor(ids), cfg, max_len=L, stop_ids=(EOS_ID,)):
                if tok == EOS_ID:
                    break
                new.append(tok)
                text = self.loaded.decode(new)
                if any(s in text for s in until):
                    break
        for s in until:
            text = text.split(s)[0]
        return text
