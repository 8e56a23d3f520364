"""`sanlab eval` and `sanlab sample` end to end on a really trained tiny run, the built-in
tasks' contents, and the one-line errors."""

from __future__ import annotations

import importlib.util
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from sanlab.cli import main

TINY = ["model.d_model=32", "model.n_heads=4", "model.n_kv_heads=2", "model.vocab_size=320", "model.n_layers=2"]
TRAIN = ["data.seq_len=32", "train.steps=6", "train.batch_rows=4", "train.eval_rows=4", "train.eval_every=0",
         "train.log_every=100", "train.device=cpu", "train.precision=fp32"]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, train_data_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("evalcli")
    assert main(["train", "--out", str(root / "san"), f"data.dir={train_data_dir}", *TINY, *TRAIN]) == 0
    return root / "san"


def _error(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("sanlab: error: ") and err.count("\n") == 1, err
    return err


# --------------------------------------------------------------------------- sample


def test_sample_streams_a_greedy_continuation(run: Path, capsys: pytest.CaptureFixture) -> None:
    prompt = "<|im_start|>user\nWhere was"
    assert main(["sample", str(run), "--prompt", prompt, "--max-new-tokens", "8", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(prompt) and len(out) > len(prompt) + 1
    # greedy with the cache = greedy by full forward passes
    assert main(["sample", str(run), "--prompt", prompt, "--max-new-tokens", "8", "--temperature", "0",
                 "--no-cache"]) == 0  # fmt: skip
    assert capsys.readouterr().out == out


def test_sample_passes_the_temperature_through(run: Path, capsys: pytest.CaptureFixture) -> None:
    """Greedy (T = 0) is the same whatever the seed; at T = 5 (near-uniform draws) two
    seeds give different continuations."""
    def sample(t: str, seed: str) -> str:
        assert main(["sample", str(run), "--prompt", "The", "--max-new-tokens", "12", "--temperature", t,
                     "--seed", seed]) == 0
        return capsys.readouterr().out
    assert sample("0", "1") == sample("0", "2")
    assert sample("5", "1") != sample("5", "2")


def test_sample_truncates_a_long_prompt_with_a_warning(run: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["sample", str(run), "--prompt", "word " * 200, "--max-new-tokens", "2", "--seed", "3"]) == 0
    err = capsys.readouterr().err
    assert "sanlab: warning: the prompt is" in err and "keeping its last 31" in err


def test_sample_continues_the_last_seq_len_minus_one_tokens_of_a_long_prompt(
        run: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt the model continues is the tail of the long one (its last seq_len − 1 =
    31 ids, BOS-first document encoding), not its head."""
    import sanlab.model.generate as gen
    from sanlab.eval.run import open_run

    prompt = " ".join(f"w{i}" for i in range(120))
    seen: list[list[int]] = []
    real = gen.generate

    def spy(model, ids, *a, **k):  # noqa: ANN001, ANN202
        seen.append(ids.tolist())
        return real(model, ids, *a, **k)

    monkeypatch.setattr(gen, "generate", spy)
    assert main(["sample", str(run), "--prompt", prompt, "--max-new-tokens", "1", "--temperature", "0"]) == 0
    capsys.readouterr()
    ids = open_run(run).encode_document(prompt)
    assert len(ids) > 31 and seen == [ids[-31:]]


def test_sample_bad_input(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert "--temperature must be" in _error(capsys, ["sample", str(run), "--prompt", "x", "--temperature", "-1"])
    assert "--top-p must lie in" in _error(capsys, ["sample", str(run), "--prompt", "x", "--top-p", "0"])
    assert "run dir not found" in _error(capsys, ["sample", str(tmp_path / "nope"), "--prompt", "x"])
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((run / "config.json").read_text())
    assert "no checkpoint with model weights" in _error(capsys, ["sample", str(bare), "--prompt", "x"])


# --------------------------------------------------------------------------- eval

needs_lm_eval = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval not installed")


@needs_lm_eval
def test_builtin_tasks_state_what_training_saw(run: Path) -> None:
    from sanlab.data.synth import SynthConfig, world_for
    from sanlab.eval.builtin import Fact, _prefix, facts_in, write_builtin_tasks
    from sanlab.eval.run import open_run

    loaded = open_run(run)
    out = run / "eval" / "tasks-check"
    record = write_builtin_tasks(loaded, out)
    assert record["facts_seen"] + record["facts_unseen"] == record["facts_in_world"] > 0
    assert record["seen_from"].startswith("the 24 of ") and "read in 6 steps" in record["seen_from"]
    world = world_for(SynthConfig())
    # the rows the run read are the loader's first 6 batches of 4: their texts state every seen fact
    from sanlab.data.loader import Loader

    from collections import Counter

    loader = Loader(loaded.data_dir, "train", batch_rows=4, seed=0)
    read: Counter = Counter()  # each read of a row (decoded per read here) adds its facts once
    for step in range(6):
        for r in loader.rows_for_step(step):
            ids = loader._gather(r[None])["tokens"][0].tolist()
            read.update(facts_in(loaded.tokenizer.decode(ids, skip_special_tokens=False), world))
    unseen = [json.loads(line) for line in (out / "sanlab_closed_book_unseen.jsonl").read_text().splitlines()]
    seen = [json.loads(line) for line in (out / "sanlab_closed_book_qa.jsonl").read_text().splitlines()]
    assert unseen and seen and record["facts_seen"] == len(read)
    assert all((r["entity"], r["attr"]) in read for r in seen)
    assert not any((r["entity"], r["attr"]) in read for r in unseen)
    # how often each fact was read, over every world fact (the unread ones count 0)
    reads = record["fact_reads"]
    assert reads["facts"] == record["facts_in_world"]
    assert reads["mean"] * reads["facts"] == pytest.approx(sum(read.values()))
    assert reads["max"] == max(read.values()) and reads["min"] == 0 and reads["median"] == 0
    assert reads["epochs"] == pytest.approx(24 / loader.n_rows)
    # free-generation recall: every seen fact (a pool under N_RECALL), each once; the control over unseen facts
    recall = [json.loads(line) for line in (out / "sanlab_closed_book_recall.jsonl").read_text().splitlines()]
    control = [json.loads(line) for line in (out / "sanlab_closed_book_recall_unseen.jsonl").read_text().splitlines()]
    assert sorted((r["entity"], r["attr"]) for r in recall) == sorted(read)
    assert len(control) == 400 == len({(r["entity"], r["attr"]) for r in control})
    assert not any((r["entity"], r["attr"]) in read for r in control)
    domains = {a: v["values"] for a, v in world.information()["attributes"].items()}
    for r in recall + control:
        e = world.by_name[r["entity"]]
        assert r["values"] == domains[r["attr"]] and r["bits"] == pytest.approx(math.log2(r["values"]))
        assert r["target"] in (e.facts[r["attr"]], f"a {e.facts[r['attr']]}", f"an {e.facts[r['attr']]}")
        # "… was born in" opens a birthplace and a birth-year statement alike: recall names the attribute
        ending = {"birthplace": f"The birthplace of {e.name} is", "birth_year": f"The birth year of {e.name} is"}.get(
            r["attr"], _prefix(Fact(e.name, r["attr"], e.facts[r["attr"]])))
        assert r["context"].endswith("</think>\n" + ending)
        assert r["reads"] == read[(r["entity"], r["attr"])]
    assert record["recall"]["sanlab_closed_book_recall"]["pool"] == len(read)
    assert record["recall"]["sanlab_closed_book_recall_unseen"]["pool"] == record["facts_unseen"]
    # grounded: the true answer is in the prompt; closed book: it is not
    g = [json.loads(line) for line in (out / "sanlab_grounded_qa.jsonl").read_text().splitlines()]
    for r in g + seen:
        assert len(r["choices"]) == 4 and len(set(r["choices"])) == 4
        truth = r["choices"][r["label"]]
        assert (truth in r["context"]) == (r in g), r
    # every grounded item fits the run's rows whole, its key note kept (distractors dropped first)
    from sanlab.eval.builtin import VALUE_LAST, _a

    for r in g:
        e = world.by_name[r["entity"]]
        v = e.facts[r["attr"]]
        assert "- " + VALUE_LAST[r["attr"]].format(e=e.name, v=v, av=_a(v)) in r["context"]
        if r["notes_dropped"]:  # shortened only as far as needed: it fits, or it is down to the key alone
            longest = max(len(loaded.encode(r["context"] + " " + c)) for c in r["choices"])
            assert 1 + longest <= loaded.seq_len or r["context"].count("\n- ") == 1
    assert record["grounded_notes_dropped"] == sum(r["notes_dropped"] for r in g) > 0


def test_grounded_items_drop_distractors_not_draws() -> None:
    """Fitting an item to short rows drops its distractor notes (the other facts before the
    same-attribute ones, never the key) after every draw, so the tasks written after it
    ask the same questions whatever it drops."""
    import random

    from sanlab.data.synth import SynthConfig, world_for
    from sanlab.eval.builtin import SEED, grounded_items

    world = world_for(SynthConfig())
    a, b, c = random.Random(SEED), random.Random(SEED), random.Random(SEED)
    whole = grounded_items(world, 20, a)
    bare = grounded_items(world, 20, b, lambda ctx, ch: False)
    short = grounded_items(world, 20, c, lambda ctx, ch: ctx.count("\n- ") <= 2)
    assert a.random() == b.random() == c.random()  # the same draws, whatever was dropped
    for w, x, y in zip(whole, bare, short):
        assert (w["choices"], w["label"]) == (x["choices"], x["label"]) == (y["choices"], y["label"])
        n = w["context"].count("\n- ")
        assert w["notes_dropped"] == 0 and x["notes_dropped"] == n - 1 and x["context"].count("\n- ") == 1
        assert y["notes_dropped"] == max(0, n - 2)
        truth = w["choices"][w["label"]]
        assert truth in x["context"] and truth in y["context"]  # the key stays
        # a same-attribute distractor outlives the others: with two notes left, the one beside the
        # key states a peer's value of the asked attribute (the choices offer the peers' values)
        kept = [ln[2:] for ln in y["context"].split("\n") if ln.startswith("- ")]
        other = [k for k in kept if truth not in k]
        assert len(kept) == min(n, 2) and len(other) == 1
        assert any(ch in other[0] for i, ch in enumerate(w["choices"]) if i != w["label"]), (other, w["choices"])


def test_facts_in_finds_exactly_the_stated_facts() -> None:
    from sanlab.data.synth import SynthConfig, state, world_for
    from sanlab.eval.builtin import facts_in

    world = world_for(SynthConfig())
    e = world.people[3]
    # the instrument is stated; the birthplace only appears near the name, which states nothing
    text = (f"Some notes. {state(random.Random(1), e, 'instrument')} Then {e.name} visited "
            f"{e.facts['birthplace']} for a day.")
    assert facts_in(text, world) == {(e.name, "instrument")}


@needs_lm_eval
def test_eval_builtin_writes_results_and_prints_the_table(run: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["eval", str(run), "--tasks", "builtin", "--limit", "4"]) == 0
    out = capsys.readouterr().out
    for task in ("sanlab_grounded_qa", "sanlab_closed_book_qa", "sanlab_cloze", "sanlab_kjv_ppl"):
        assert task in out
    rec = json.loads((run / "eval" / "results-latest-limit4.json").read_text())
    acc = rec["tasks"]["sanlab_grounded_qa"]["metrics"]["acc"]
    assert 0 <= acc <= 1 and rec["tasks"]["sanlab_grounded_qa"]["n_samples"]["effective"] == 4
    assert rec["tasks"]["sanlab_kjv_ppl"]["metrics"]["bits_per_byte"] > 0
    assert rec["builtin"]["facts_seen"] > 0
    # the recall tasks by real greedy generation: exact match and the stored-bits count over 4 items
    for task in ("sanlab_closed_book_recall", "sanlab_closed_book_recall_unseen"):
        m = rec["tasks"][task]["metrics"]
        assert 0 <= m["exact_match"] <= 1 and m["pool"] == rec["builtin"]["recall"][task]["pool"]
        assert m["items"] == min(4, m["pool"]) == rec["tasks"][task]["n_samples"]["effective"]
        assert m["stored_bits"] is not None and m["stored_bits_per_param"] is not None


@needs_lm_eval
def test_a_limited_eval_never_replaces_the_full_one(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """From another directory, with a relative run path: `--limit 3` leaves the full
    evaluation's results-latest.json byte for byte, writes results-latest-limit3.json
    marked limit 3, and the printed table says it is limited. Each task's truncation
    count is its own: the KJV perplexity task (rolling windows, never truncated) has 0
    while the QA tasks' long passages are cut."""
    import shutil

    copy = tmp_path / "runs" / "san"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("eval"))
    (copy / "eval").mkdir()
    full = {"run": "runs/san", "checkpoint": "latest", "tasks": {"sanlab_cloze": {
        "metrics": {"acc": 0.5, "acc_stderr": 0.01}, "n_samples": {"effective": 200}, "limit": None}}}
    (copy / "eval" / "results-latest.json").write_text(json.dumps(full))
    before = (copy / "eval" / "results-latest.json").read_bytes()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["eval", "../runs/san", "--tasks", "builtin", "--limit", "3"]) == 0
    captured = capsys.readouterr()
    assert (copy / "eval" / "results-latest.json").read_bytes() == before
    rec = json.loads((copy / "eval" / "results-latest-limit3.json").read_text())
    assert rec["limit"] == 3 and all(t["limit"] == 3 for t in rec["tasks"].values())
    assert "LIMITED to the first 3 examples per task" in captured.out
    assert "results-latest-limit3.json" in captured.out + captured.err
    total = int(captured.out.split("warning: ../runs/san: ")[1].split(" requests longer")[0])
    counts = {t: v["truncated_requests"] for t, v in rec["tasks"].items()}
    assert counts["sanlab_kjv_ppl"] == 0 < total
    assert sum(counts.values()) == total, counts


@needs_lm_eval
def test_eval_unknown_task_is_one_line(run: Path, capsys: pytest.CaptureFixture) -> None:
    assert "unknown task 'no_such_task'" in _error(capsys, ["eval", str(run), "--tasks", "no_such_task"])


@needs_lm_eval
def test_eval_bad_input(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert "--limit must be positive" in _error(capsys, ["eval", str(run), "--tasks", "builtin", "--limit", "0"])
    assert "at least one task" in _error(capsys, ["eval", str(run), "--tasks", ","])
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((run / "config.json").read_text())
    assert "no checkpoint with model weights" in _error(capsys, ["eval", str(bare), "--tasks", "builtin"])


def test_eval_without_lm_eval_is_one_line(run: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    import builtins

    real = builtins.__import__

    def no_lm_eval(name, *a, **k):  # noqa: ANN001, ANN202
        if name == "lm_eval" or name.startswith("lm_eval."):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_lm_eval)
    assert "pip install 'sanlab[eval]'" in _error(capsys, ["eval", str(run), "--tasks", "builtin"])


def test_invented_people_are_outside_the_world() -> None:
    from sanlab.data.synth import SynthConfig, world_for
    from sanlab.eval.builtin import invented_people

    world = world_for(SynthConfig())
    people = invented_people(world, 50, random.Random(0))
    assert len({p.name for p in people}) == 50
    words = [w.lower() for e in world.entities for w in e.name.split()]
    for p in people:
        for w in p.name.lower().split():
            assert not any(w in x or x in w for x in words), p.name


def test_synth_cloze_asks_for_the_final_answer(tmp_path: Path) -> None:
    """Each SYNTH cloze item is a held-out document up to the last statement of one of its
    short answers, after the reasoning trace closes: the context runs past `</think>` and
    continues with the target exactly as the document does."""
    from sanlab.config import apply_overrides
    from sanlab.data.prepare import PrepareConfig, prepare
    from sanlab.data.regions import END_THINK
    from sanlab.data.shards import doc_metadata, load_manifest
    from sanlab.data.synth import SynthConfig, document
    from sanlab.data.tokenizer import load_tokenizer
    from sanlab.eval.builtin import _val_documents

    data = tmp_path / "synth"
    prepare(apply_overrides(PrepareConfig, {}, ["tokens=30000", "seq_len=64", "vocab_size=320", "val_frac=0.5"]), data)
    manifest = load_manifest(data)
    items = _val_documents(data, manifest, 200, load_tokenizer(data))
    cfg = SynthConfig(**manifest["config"]["synth"])
    docs = [document(cfg, int(manifest["seed"]), int(s)) for s in doc_metadata(data, manifest, "val")["source"]]
    assert len(items) >= 30
    for context, target in items:
        doc = next(d for d in docs if d.text.startswith(context + " " + target))
        assert target in doc.targets and len(target.split()) <= 4
        assert END_THINK in context  # the answer, not the trace or the question
        assert (context + " " + target) not in doc.text[: doc.text.index(END_THINK)]


def test_results_table_shows_each_tasks_main_metric_with_its_stderr() -> None:
    from sanlab.eval.cli import results_table

    records = [{"run": "runs/san", "checkpoint": "latest", "tasks": {
        "sanlab_grounded_qa": {"metrics": {"acc": 0.295, "acc_stderr": 0.0323, "acc_norm": 0.3}},
        "sanlab_cloze": {"metrics": {"perplexity": 80.1, "acc": 0.0255, "acc_stderr": 0.0126}},
        "sanlab_kjv_ppl": {"metrics": {"word_perplexity": 900.0, "bits_per_byte": 4.5519,
                                       "bits_per_byte_stderr": float("nan")}}}}]
    t = results_table(records, ["sanlab_grounded_qa", "sanlab_cloze", "sanlab_kjv_ppl"])
    assert [c.name for c in t.columns] == ["run", "sanlab_grounded_qa\nacc", "sanlab_cloze\nacc",
                                           "sanlab_kjv_ppl\nbits_per_byte"]
    assert t.rows == [["san", "0.2950 ± 0.0323", "0.0255 ± 0.0126", "4.5519"]]


# --------------------------------------------------------------------------- facts read, stored bits


def test_fact_reads_count_every_read_of_every_row_stating_the_fact() -> None:
    """Row A states X and is read 3 times, row B states X and Y (read once), row C states
    nothing (read 5 times): X was read 4 times, Y once, every other fact 0."""
    from sanlab.data.synth import SynthConfig, state, world_for
    from sanlab.eval.builtin import count_fact_reads, fact_reads_summary

    world = world_for(SynthConfig())
    x, y = world.people[3], world.people[5]
    a = f"Notes. {state(random.Random(1), x, 'instrument')}"
    b = f"{state(random.Random(2), x, 'instrument')} And {state(random.Random(3), y, 'birthplace')}"
    reads = count_fact_reads([a, b, "Nothing stated here."], [3, 1, 5], world)
    assert reads == {(x.name, "instrument"): 4, (y.name, "birthplace"): 1}
    facts = [(e.name, k) for e in world.entities for k in e.facts]
    s = fact_reads_summary([reads[f] for f in facts], 9, 3)
    assert s["facts"] == len(facts) and s["mean"] == pytest.approx(5 / len(facts))
    assert (s["min"], s["p10"], s["median"], s["p90"], s["max"], s["epochs"]) == (0, 0, 0, 0, 4, 3.0)
    s = fact_reads_summary(list(range(11)), None, None)  # 0..10: the percentiles are the values
    assert (s["p10"], s["median"], s["p90"], s["mean"], s["epochs"]) == (1, 5, 9, 5, None)


def test_rows_read_keeps_how_often_each_row_was_read(train_data_dir: Path) -> None:
    """Past one epoch a row is read more than once: rows_read returns each distinct row
    once with its count, as the loader's replay gives it, and the split's row count."""
    from collections import Counter

    from sanlab.data.loader import Loader
    from sanlab.data.shards import load_manifest
    from sanlab.eval.builtin import rows_read

    loader = Loader(train_data_dir, "train", batch_rows=64, seed=3)
    steps = loader.n_rows * 5 // (2 * 64)  # 2.5 epochs
    expect = Counter(int(r) for s in range(steps) for r in loader.rows_for_step(s))
    rows, times, n_rows, how = rows_read(train_data_dir, load_manifest(train_data_dir), steps, 64, 3)
    assert n_rows == loader.n_rows and int(times.sum()) == steps * 64 and set(times.tolist()) == {2, 3}
    full = {tuple(loader._gather(np.array([r]))["tokens"][0].tolist()): k for r, k in expect.items()}
    assert {tuple(r.tolist()): int(k) for r, k in zip(rows, times)} == full
    assert f"read in {steps} steps ({steps * 64 / loader.n_rows:.2f} epochs)" in how


def test_stored_bits_is_the_chance_corrected_count_of_bits_recalled() -> None:
    """(correct, K, bits) per item: all right over a whole pool = Σ log2 K; all wrong =
    −Σ log2 K / (K − 1); right exactly 1/K of the time = 0; a sample of a larger pool is
    scaled by the pool's size; per parameter divides by the parameters."""
    from sanlab.eval.builtin import stored_bits

    ks = [2, 4, 16, 100]
    right = stored_bits([(1, k, math.log2(k)) for k in ks], pool=4, params=1000)
    total = sum(math.log2(k) for k in ks)
    assert right["stored_bits"] == pytest.approx(total) and right["stored_fraction"] == pytest.approx(1)
    assert right["stored_bits_per_param"] == pytest.approx(total / 1000) and right["items"] == 4
    wrong = stored_bits([(0, k, math.log2(k)) for k in ks], pool=4)
    assert wrong["stored_bits"] == pytest.approx(-sum(math.log2(k) / (k - 1) for k in ks))
    assert wrong["stored_fraction"] == pytest.approx(-sum(1 / (k - 1) for k in ks) / 4)
    assert wrong["stored_bits_per_param"] is None
    # guessing: of K items of domain K, one is right
    guess = [(int(i == 0), k, math.log2(k)) for k in ks for i in range(k)]
    g = stored_bits(guess, pool=len(guess))
    assert g["stored_bits"] == pytest.approx(0, abs=1e-9) and g["stored_fraction"] == pytest.approx(0, abs=1e-12)
    # 10 items sampled from a pool of 1000, 5 right (K = 4, 2 bits): 1000 × mean(t × 2)
    half = stored_bits([(i % 2, 4, 2.0) for i in range(10)], pool=1000, params=500)
    t_right, t_wrong = 1.0, -1 / 3
    assert half["stored_bits"] == pytest.approx(1000 * 2 * (t_right + t_wrong) / 2)
    assert half["stored_bits_per_param"] == pytest.approx(half["stored_bits"] / 500)
    assert half["stored_bits_stderr"] == pytest.approx(1000 * 2 * (4 / 3) / 2 * math.sqrt(10 / 9) / math.sqrt(10))
    assert half["stored_bits_per_param_stderr"] == pytest.approx(half["stored_bits_stderr"] / 500)


def _fake_generation(monkeypatch: pytest.MonkeyPatch, answers: dict[str, str]) -> None:
    """SanlabLM.generate_until answers each context with answers[context]."""
    from sanlab.eval.adapter import SanlabLM

    monkeypatch.setattr(SanlabLM, "generate_until", lambda self, reqs, disable_tqdm=False: [
        answers[r.args[0]] for r in reqs])


@needs_lm_eval
def test_recall_is_exact_match_up_to_whitespace_and_counts_stored_bits(
        run: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted generations through lm-eval: the even items answered right with the
    whitespace changed ('  a  potter '), the odd ones with another value; exact_match is
    their share and the stored bits are the estimator's value on those outcomes over the
    pool of unseen facts, per non-embedding parameter of the run."""
    import shutil

    from sanlab.accounting import count_params
    from sanlab.eval.builtin import stored_bits, write_builtin_tasks
    from sanlab.eval.run import open_run

    copy = tmp_path / "san"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("eval"))
    loaded = open_run(copy)
    record = write_builtin_tasks(loaded, tmp_path / "tasks")
    items = [json.loads(line) for line in (tmp_path / "tasks" / "sanlab_closed_book_recall_unseen.jsonl")
             .read_text().splitlines()][:40]
    answers = {it["context"]: ("  " + it["target"].replace(" ", "  ") + " " if i % 2 == 0 else " " + it["target"] + "x")
               for i, it in enumerate(items)}
    _fake_generation(monkeypatch, answers)
    assert main(["eval", str(copy), "--tasks", "sanlab_closed_book_recall_unseen", "--limit", "40"]) == 0
    capsys.readouterr()
    m = json.loads((copy / "eval" / "results-latest-limit40.json").read_text())["tasks"][
        "sanlab_closed_book_recall_unseen"]["metrics"]
    assert m["exact_match"] == 0.5 and m["items"] == 40
    pool = record["recall"]["sanlab_closed_book_recall_unseen"]["pool"]
    assert pool == record["facts_unseen"] > 400
    want = stored_bits([(int(i % 2 == 0), it["values"], it["bits"]) for i, it in enumerate(items)], pool)
    params = count_params(loaded.run.config.model).non_embedding
    assert m["stored_bits"] == pytest.approx(want["stored_bits"]) and m["stored_bits"] > 0
    assert m["stored_fraction"] == pytest.approx(want["stored_fraction"])
    assert m["stored_bits_per_param"] == pytest.approx(want["stored_bits"] / params)


@needs_lm_eval
def test_recall_control_asks_about_invented_people_when_every_fact_was_read(
        run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that read every world fact: both unseen tasks ask about the same invented
    people (none in the world), the recall pool is all their facts, K as in the world."""
    from collections import Counter

    import sanlab.eval.builtin as b
    from sanlab.data.synth import SynthConfig, world_for
    from sanlab.eval.run import open_run

    world = world_for(SynthConfig())
    every = Counter({(e.name, a): 2 for e in world.entities for a in e.facts})
    monkeypatch.setattr(b, "count_fact_reads", lambda texts, times, w: every)
    record = b.write_builtin_tasks(open_run(run), tmp_path)
    assert record["facts_unseen"] == 0 and "invented people" in record["unseen_source"]
    assert record["fact_reads"]["min"] == record["fact_reads"]["max"] == 2
    mc = [json.loads(line) for line in (tmp_path / "sanlab_closed_book_unseen.jsonl").read_text().splitlines()]
    gen = [json.loads(line) for line in (tmp_path / "sanlab_closed_book_recall_unseen.jsonl").read_text().splitlines()]
    assert len(gen) == 400 and record["recall"]["sanlab_closed_book_recall_unseen"]["pool"] == 200 * 6
    assert not any(r["entity"] in world.by_name for r in gen + mc)
    assert len({r["entity"] for r in gen + mc}) <= 200  # the same 200 invented people
    domains = {a: v["values"] for a, v in world.information()["attributes"].items()}
    assert all(r["values"] == domains[r["attr"]] and r["reads"] == 0 for r in gen)
    seen = [json.loads(line) for line in (tmp_path / "sanlab_closed_book_recall.jsonl").read_text().splitlines()]
    assert len(seen) == 400 and record["recall"]["sanlab_closed_book_recall"]["pool"] == record["facts_in_world"]
