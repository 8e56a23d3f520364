"""What the analysis sample and its evaluation give, value by value (bugs an audit planted
in `sanlab.analysis.evaluate` and `sanlab.analysis.output` that the rest of the suite let
through).

- `load_sample`: the token counts are the training split's, over at most
  MAX_COUNT_TOKENS tokens (whole rows, from the first); each scored token's exercise
  type is its own document's.
- `rows_for_groups`: the fewest rows of the validation order in which every region and
  exercise type present reaches `min_tokens` (reaching it exactly is enough); types that
  never occur do not count; when some group stays short, all the rows and the short
  present groups with their counts.
- `evaluate`: PAD input positions count in no attention or stream statistic.
- output: analysis.json is strict JSON (NaN and ±inf are null); a CSV's columns are the
  keys of all its rows (a row's missing ones empty, NaN empty); the identity rows name
  the run and what it is compared with; crystallisation rows hold the rank changes; a
  group of exactly MIN_GROUP_TOKENS scored tokens is not noted as too thin.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import sanlab.analysis.evaluate as E
from sanlab.analysis.evaluate import EvalSample, evaluate, load_sample, rows_for_groups
from sanlab.analysis.output import MIN_GROUP_TOKENS, print_tables, tables, write_outputs
from sanlab.config import ModelConfig, apply_overrides
from sanlab.data.loader import Loader
from sanlab.data.prepare import PrepareConfig, prepare
from sanlab.data.regions import PAD_ID, REGION_NAMES
from sanlab.data.shards import doc_metadata, load_manifest, open_split
from sanlab.model.lm import LM
from sanlab.tables import Output

# --------------------------------------------------------------------------- the sample


def test_token_counts_are_the_training_splits_within_the_budget(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"  # shards of 2 rows: the budget runs across shards
    prepare(apply_overrides(PrepareConfig, {}, ["tokens=6000", "seq_len=32", "vocab_size=320", "val_frac=0.1",
                                                "shard_rows=2"]), data)
    manifest = load_manifest(data, verify=False)
    vocab = manifest["vocab_size"]
    train = np.concatenate([np.asarray(s["tokens"]) for s in open_split(data, manifest, "train")])
    assert len(manifest["splits"]["train"]["shards"]) > 3
    s = load_sample(data, 4)
    assert s.token_counts is not None
    assert s.token_counts.tolist() == np.bincount(train.reshape(-1), minlength=vocab).tolist()
    # A budget of 3.5 rows counts the first 3 whole rows (2 of the first shard, 1 of the second).
    row_len = train.shape[1]
    monkeypatch.setattr(E, "MAX_COUNT_TOKENS", 3 * row_len + row_len // 2)
    s = load_sample(data, 4)
    assert s.token_counts is not None and int(s.token_counts.sum()) == 3 * row_len
    assert s.token_counts.tolist() == np.bincount(train[:3].reshape(-1), minlength=vocab).tolist()


def test_each_scored_tokens_exercise_is_its_documents(train_data_dir: Path) -> None:
    loader = Loader(train_data_dir, split="val", batch_rows=1, verify=False)
    b = next(loader.eval_batches(16, batch_rows=16))
    doc_ex = doc_metadata(train_data_dir, loader.manifest, "val")["exercise"]
    s = load_sample(train_data_dir, 16)
    m = s.loss_mask.bool()
    expected = torch.from_numpy(doc_ex.astype(np.int64))[b["doc_ids"][m]]
    assert s.exercise[m].tolist() == expected.tolist()
    assert len(set(expected.tolist())) > 1  # the check has teeth: several types in these rows


# --------------------------------------------------------------------------- rows for groups


def _group_counts(data_dir: Path) -> tuple[np.ndarray, list[str]]:
    """Per-row scored tokens of every region and exercise type, cumulated over the
    validation order, from the sample itself."""
    n = Loader(data_dir, split="val", batch_rows=1, verify=False).n_rows
    s = load_sample(data_dir, n)
    m = s.loss_mask.bool()
    per = [(m & (s.region_ids == i)).sum(1) for i in range(len(REGION_NAMES))]
    per += [(m & (s.exercise == i)).sum(1) for i in range(len(s.exercise_names))]
    names = [f"region {r}" for r in REGION_NAMES] + [f"exercise {e}" for e in s.exercise_names]
    return torch.stack(per, 1).cumsum(0).numpy(), names


def test_rows_for_groups_is_the_first_prefix_where_every_present_group_has_enough(train_data_dir: Path) -> None:
    cum, names = _group_counts(train_data_dir)
    present = cum[-1] > 0
    assert not present.all()  # some exercise types never occur: they do not count
    tried = 0
    for min_tokens in (1, 4, 8, 16, int(cum[-1][present].min())):  # the last: a group reaches it exactly at the end
        ok = [r for r in range(len(cum)) if (cum[r, present] >= min_tokens).all()]
        if not ok:
            continue
        tried += 1
        assert rows_for_groups(train_data_dir, min_tokens) == (ok[0] + 1, {}), min_tokens
    assert tried >= 3
    # Nobody reaches it: every row, and the present groups that stay short, with their counts.
    big = int(cum[-1].max()) + 1
    short_groups = {names[g]: int(cum[-1, g]) for g in np.flatnonzero(present)}
    assert rows_for_groups(train_data_dir, big) == (len(cum), short_groups)
    # Only the first max_rows rows are looked at.
    short = rows_for_groups(train_data_dir, big, max_rows=5)
    assert short == (5, {names[g]: int(cum[4, g]) for g in np.flatnonzero(cum[4] > 0)})


# --------------------------------------------------------------------------- PAD positions


def test_pad_positions_count_in_no_attention_or_stream_statistic() -> None:
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64)
    torch.manual_seed(0)
    model = LM(cfg)
    g = torch.Generator().manual_seed(1)
    rows, t, real = 3, 12, 9
    tokens = torch.randint(8, 64, (rows, t + 1), generator=g)
    tokens[:, real:] = PAD_ID  # the last row of a split: PAD after the last document
    seg = torch.zeros(rows, t, dtype=torch.long)
    seg[:, real:] = 1  # PAD is a segment of its own
    mask = tokens[:, 1:] != PAD_ID

    def sample(n: int) -> EvalSample:
        return EvalSample(inputs=tokens[:, :-1][:, :n], targets=tokens[:, 1:][:, :n], segment_ids=seg[:, :n],
                          region_ids=torch.zeros(rows, n, dtype=torch.long), loss_mask=mask[:, :n],
                          exercise=torch.zeros(rows, n, dtype=torch.long), exercise_names=("text",))

    padded, cut = evaluate(model, sample(t), batch_rows=2), evaluate(model, sample(real), batch_rows=2)
    assert padded.losses.tolist() == pytest.approx(cut.losses.tolist(), rel=1e-5)
    assert padded.stream is not None and cut.stream is not None and padded.attention is not None
    for a, b in zip(padded.stream, cut.stream):
        assert a["hook"] == b["hook"]
        assert (a["rms"], a["max_abs"]) == pytest.approx((b["rms"], b["max_abs"]), rel=1e-4), a["hook"]
    for a, b in zip(padded.attention["heads"], cut.attention["heads"]):
        assert a["entropy"] == pytest.approx(b["entropy"], rel=1e-4, abs=1e-6), (a["layer"], a["head"])
        assert a["sink"] == pytest.approx(b["sink"], rel=1e-4, abs=1e-6), (a["layer"], a["head"])


# --------------------------------------------------------------------------- output files and tables


def _group(name: str, tokens: int, loss: float) -> dict:
    return {"group": name, "tokens": tokens, "token_share": 0.5, "loss": loss, "loss_share": 0.5}


def _result() -> dict:
    losses = {"loss": 2.0, "tokens": 400, "region": [_group("answer", MIN_GROUP_TOKENS, 1.5),
                                                     {**_group("query", MIN_GROUP_TOKENS, float("nan")), "extra": 7}],
              "exercise": [_group("math", MIN_GROUP_TOKENS, 2.0), _group("rag", MIN_GROUP_TOKENS, float("inf"))]}
    spectra = {"tol": 0.05, "per_matrix": [],
               "per_type": [{"type": "attn.q", "milestone": 1.0, "stable_rank": 3.0, "effective_rank": 5.0}],
               "crystallisation": [{"type": "attn.q", "milestone": 0.5, "distances": [0.25, 0.125],
                                    "rank_changes": [0.5, 0.0625]}]}
    comparison = {"run": "san", "vs": "ffn",
                  "region": {"rows": [{"group": "answer", "tokens": 200, "token_share": 1.0, "loss_a": 1.25,
                                        "loss_b": 1.5, "delta": -0.25, "weighted": -0.25, "contribution": 1.0}],
                             "identity": {"aggregate_delta": -0.25, "weighted_sum": -0.25, "abs_error": 0.0,
                                          "rel_error": 0.0}}}
    return {"runs": {"san": {"losses": losses, "spectra": spectra}, "ffn": {"losses": losses}},
            "comparisons": [comparison]}


def test_analysis_json_is_strict_and_csv_columns_are_every_rows_keys(tmp_path: Path) -> None:
    written = write_outputs(_result(), tmp_path)
    assert {p.name for p in written} >= {"analysis.json", "losses.csv", "deltas.csv", "delta_identity.csv",
                                          "crystallisation.csv"}

    def no_constants(name: str) -> None:
        raise AssertionError(f"analysis.json holds {name}: not strict JSON")

    a = json.loads((tmp_path / "analysis.json").read_text(), parse_constant=no_constants)
    assert a["runs"]["san"]["losses"]["region"][1]["loss"] is None  # NaN -> null
    assert a["runs"]["san"]["losses"]["exercise"][1]["loss"] is None  # inf -> null
    with (tmp_path / "losses.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["run", "grouping", "group", "tokens", "token_share", "loss", "loss_share", "extra"]
    assert [(r["run"], r["group"], r["loss"], r["extra"]) for r in rows[:4]] == [
        ("san", "answer", "1.5", ""), ("san", "query", "", "7"), ("san", "math", "2.0", ""), ("san", "rag", "inf", "")]


def test_the_identity_and_crystallisation_rows_say_which_run_and_which_numbers() -> None:
    t = tables(_result())
    assert t["delta_identity"] == [{"run": "san", "vs": "ffn", "grouping": "region", "aggregate_delta": -0.25,
                                    "weighted_sum": -0.25, "abs_error": 0.0, "rel_error": 0.0}]
    assert [(r["run"], r["vs"], r["group"]) for r in t["deltas"]] == [("san", "ffn", "answer")]
    (c,) = t["crystallisation"]
    assert (c["distances"], c["rank_changes"], c["tol"]) == ("0.25 0.125", "0.5 0.0625", 0.05)


def test_a_group_of_exactly_the_minimum_tokens_is_not_thin() -> None:
    result = _result()
    with Output("json", io.StringIO()) as out:
        print_tables(result, out)
    assert not [n for n in out.notes if "fewer than" in n]
    result["runs"]["san"]["losses"]["exercise"][0]["tokens"] = MIN_GROUP_TOKENS - 1
    with Output("json", io.StringIO()) as out:
        print_tables(result, out)
    (note,) = [n for n in out.notes if "fewer than" in n]
    assert f"fewer than {MIN_GROUP_TOKENS} scored tokens in this sample for math {MIN_GROUP_TOKENS - 1}:" in note
