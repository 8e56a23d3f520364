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
from dataclasses import dataclass
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
from sanlab.model.generate import Decoder, SamplingConfig, generate


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
        """Each request's continuation. Greedy requests (lm-eval's `do_sample: false`, as every
        built-in recall task asks) of the same context length and token budget decode
        together, up to `batch_size` rows at a time (`_greedy_rows`); a sampled request
        decodes alone, on its own seeded stream."""
        jobs = [self._job(*r.args, task=r.task_name) for r in requests]
        out: list[str] = [""] * len(jobs)
        buckets: dict[tuple[int, int], list[int]] = {}
        for i, job in enumerate(jobs):
            if job.cfg.temperature == 0:
                buckets.setdefault((len(job.ids), job.cfg.max_new_tokens), []).append(i)
            else:
                out[i] = self._finish(job, self._sampled(job))
        for idx in buckets.values():
            for c in range(0, len(idx), self.batch_rows):
                chunk = idx[c:c + self.batch_rows]
                for i, text in zip(chunk, self._greedy_rows([jobs[i] for i in chunk])):
                    out[i] = text
        return out

    def _job(self, context: str, gen_kwargs: dict[str, Any], task: str | None = None) -> _GenJob:
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
        return _GenJob(ids, until, cfg)

    def _stopped(self, job: _GenJob, new: list[int]) -> bool:
        """Whether the decoded continuation `new` holds one of the job's stop strings."""
        text = self.loaded.decode(new)
        return any(s in text for s in job.until)

    def _finish(self, job: _GenJob, new: list[int]) -> str:
        text = self.loaded.decode(new)
        for s in job.until:
            text = text.split(s)[0]
        return text

    def _autocast(self) -> Any:
        dt = self.loaded.autocast_dtype
        return torch.autocast(self.loaded.device.type, dtype=dt or torch.float32, enabled=dt is not None)

    def _sampled(self, job: _GenJob) -> list[int]:
        """One request's tokens (before EOS and up to its first stop string), decoded alone."""
        new: list[int] = []
        with self._autocast():
            for tok in generate(self.loaded.model, torch.tensor(job.ids), job.cfg, max_len=self.loaded.seq_len,
                                stop_ids=(EOS_ID,)):
                if tok == EOS_ID:
                    break
                new.append(tok)
                if self._stopped(job, new):
                    break
        return new

    def _greedy_rows(self, jobs: list[_GenJob]) -> list[str]:
        """Greedy continuations of contexts of one length and one token budget, decoded as
        the rows of one batch: a row stops at EOS or at its first stop string and its later
        tokens are ignored; the batch stops when every row has. Each row's tokens are those
        it gets decoded alone (`generate`, greedy) wherever its top two logits differ by more
        than the batch's rounding (fp32 products over B rows instead of one: logits within
        ~4e-6 of a lone row's on the demo's models, tests/test_eval_adapter.py)."""
        B, budget = len(jobs), jobs[0].cfg.max_new_tokens
        news: list[list[int]] = [[] for _ in jobs]
        live = [budget > 0] * B
        with self._autocast():
            dec = Decoder(self.loaded.model, max_len=self.loaded.seq_len, batch=B)
            logits = dec.prefill(torch.tensor([j.ids for j in jobs]))
            for step in range(budget):
                nxt = logits.argmax(dim=-1)
                for r, tok in enumerate(nxt.tolist()):
                    if not live[r]:
                        continue
                    if tok == EOS_ID:
                        live[r] = False
                        continue
                    news[r].append(tok)
                    live[r] = not self._stopped(jobs[r], news[r])
                if not any(live) or step == budget - 1:
                    break
                logits = dec.append(nxt.view(B, 1))
        return [self._finish(j, n) for j, n in zip(jobs, news)]


@dataclass(frozen=True)
class _GenJob:
    """A generate_until request, parsed: the context's ids (truncated from the left to
    leave room for the answer), its stop strings and how it decodes."""

    ids: list[int]
    until: list[str]
    cfg: SamplingConfig
