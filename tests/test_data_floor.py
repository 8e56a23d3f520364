"""The entropy floor: `Draws` charges each draw its exact log-probability, and `prepare`
turns a tiny generator of known entropy into exactly that floor per token."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch

import sanlab.data.prepare as prep
from sanlab.analysis.losses import TokenTable, add_entropy_floor, decompose, token_entropy_floor
from sanlab.config import apply_overrides
from sanlab.data.floor import FLOOR_FILE, load_floor, rates
from sanlab.data.prepare import PrepareConfig, prepare
from sanlab.data.shards import doc_metadata, unpack_documents
from sanlab.data.tokenizer import load_tokenizer
from sanlab.data.regions import ANSWER, OTHER, QUERY, REGION_NAMES, TRACE, chat_document
from sanlab.data.synth import Draws, SynthConfig, document
from sanlab.errors import DataError


def _step(d: Draws, region: int, fn):
    """Run one draw; return its value and the nats it charged to `region`."""
    before = list(d.nats)
    x = fn()
    charged = [a - b for a, b in zip(d.nats, before)]
    assert all(c == 0 for i, c in enumerate(charged) if i != region)
    return x, charged[region]


def test_each_draw_is_charged_its_exact_log_probability() -> None:
    d = Draws(7)
    d.region = TRACE
    for _ in range(200):
        x, c = _step(d, TRACE, lambda: d.choice(("a", "b", "b", "c")))
        assert c == pytest.approx(-math.log({"a": 0.25, "b": 0.5, "c": 0.25}[x]))
        x, c = _step(d, TRACE, lambda: d.weighted(("u", "v", "u"), (1.0, 2.0, 1.0)))
        assert c == pytest.approx(-math.log(0.5))
        x, c = _step(d, TRACE, lambda: d.randint(3, 9))
        assert 3 <= x <= 9 and c == pytest.approx(math.log(7))
        x, c = _step(d, TRACE, lambda: d.chance(0.2))
        assert c == pytest.approx(-math.log(0.2 if x else 0.8))
        x, c = _step(d, TRACE, lambda: d.sample(range(5), 3))
        assert len(set(x)) == 3 and c == pytest.approx(math.log(5 * 4 * 3))
        x, c = _step(d, TRACE, lambda: d.shuffled("wxyz"))
        assert sorted(x) == list("wxyz") and c == pytest.approx(math.log(24))
    d.region = ANSWER
    _, c = _step(d, ANSWER, lambda: d.choice(range(1000)))
    assert c == pytest.approx(math.log(1000))


def test_empirical_entropy_of_a_draw_matches_its_known_entropy() -> None:
    """The mean charged nats of many draws is the distribution's entropy (within 4 SE)."""
    d = Draws(11)
    w = (0.5, 0.25, 0.125, 0.125)
    h = -sum(p * math.log(p) for p in w)
    xs = []
    for _ in range(20_000):
        _, c = _step(d, QUERY, lambda: d.weighted("abcd", w))
        xs.append(c)
    mean = sum(xs) / len(xs)
    se = (sum((x - mean) ** 2 for x in xs) / len(xs)) ** 0.5 / len(xs) ** 0.5
    assert abs(mean - h) < 4 * se


WORDS = ("amber", "basalt", "cobalt", "dune", "ember", "flint", "garnet", "heath")
TRACE_WORDS = ("north", "south", "west")


def tiny_documents(seed: int):
    """Query: one of 8 words, uniform (exactly ln 8 nats). Trace: north with probability
    1/2, south or west 1/4 each (ln 2 or ln 4 nats). Answer: fixed text (0 nats)."""
    i = 0
    while True:
        d = Draws(seed * 1_000_003 + i)
        d.region = QUERY
        q = f"Say the word {d.choice(WORDS)}."
        d.region = TRACE
        t = f"The way is {d.weighted(TRACE_WORDS, (2, 1, 1))}."
        yield chat_document(q, t, "Done.", "tiny", (), d.nats)
        i += 1


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("floor") / "tiny"
    cfg = apply_overrides(PrepareConfig, {}, ["tokens=20000", "seq_len=64", "vocab_size=300", "val_frac=0.1"])
    mp = pytest.MonkeyPatch()
    mp.setattr(prep, "corpus_documents", lambda c: tiny_documents(c.seed))
    try:
        manifest = prepare(cfg, out)
    finally:
        mp.undo()
    return out, manifest


def test_tiny_generator_gives_exactly_its_known_floor(tiny_dir) -> None:
    out, manifest = tiny_dir
    floor = load_floor(out)
    assert manifest["entropy_floor_file"] == FLOOR_FILE and floor is not None
    tok = load_tokenizer(out)
    for split in ("train", "val"):
        s, m = floor["splits"][split], manifest["splits"][split]
        n = m["documents"]
        assert s["documents"] == n
        # Every document's query carries exactly ln 8 nats: the floor is n·ln 8 over the query's tokens.
        q = s["region"]["query"]
        assert q["tokens"] == m["region_tokens"]["query"]
        assert q["nats"] == pytest.approx(n * math.log(8), rel=1e-12)
        assert q["nats_per_token"] == pytest.approx(n * math.log(8) / m["region_tokens"]["query"], rel=1e-12)
        # The trace's nats follow from which word each document's text shows.
        words = Counter()
        for ids in unpack_documents(out, split):
            text = tok.decode(ids.tolist(), skip_special_tokens=False)
            words[next(w for w in TRACE_WORDS if f"The way is {w}." in text)] += 1
        assert sum(words.values()) == n
        want = words["north"] * math.log(2) + (words["south"] + words["west"]) * math.log(4)
        assert s["region"]["trace"]["nats"] == pytest.approx(want, rel=1e-12)
        assert s["region"]["answer"]["nats"] == 0 and s["region"]["other"]["nats"] == 0
        # Scored tokens: every token but the BOS; the whole split's floor is total nats over them.
        assert s["tokens"] == m["tokens"] - n
        assert s["region"]["other"]["tokens"] == m["region_tokens"]["other"] - n
        assert s["nats_per_token"] == pytest.approx((n * math.log(8) + want) / (m["tokens"] - n), rel=1e-12)
        assert s["exercise"]["tiny"]["region"]["query"] == q
    # The mean over documents is the draws' entropy, ln 8 + 1.5 ln 2, up to sampling error.
    train = floor["splits"]["train"]
    per_doc = train["nats"] / train["documents"]
    assert per_doc == pytest.approx(math.log(8) + 1.5 * math.log(2), abs=0.06)


def test_plain_text_has_no_floor(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    src.write_text("\n\n".join(f"Paragraph {i} of plain text, with no generator behind it." for i in range(40)))
    cfg = apply_overrides(PrepareConfig, {}, ["corpus=text", "seq_len=32", "vocab_size=300", "val_frac=0.2",
                                              f'text.paths=["{src}"]'])  # fmt: skip
    manifest = prepare(cfg, tmp_path / "d")
    assert "entropy_floor_file" not in manifest and load_floor(tmp_path / "d") is None


def test_malformed_floor_file_is_a_data_error(tmp_path: Path) -> None:
    (tmp_path / FLOOR_FILE).write_text("{not json")
    with pytest.raises(DataError, match="malformed"):
        load_floor(tmp_path)
    (tmp_path / FLOOR_FILE).write_text(json.dumps({"format": "other"}))
    with pytest.raises(DataError, match="not a sanlab-entropy-floor"):
        load_floor(tmp_path)


def test_synth_prepare_writes_the_floor_of_its_documents(tmp_path: Path) -> None:
    cfg = apply_overrides(PrepareConfig, {}, ["tokens=8000", "seq_len=64", "vocab_size=300", "val_frac=0.1",
                                              "synth.people=30", "synth.cities=8"])  # fmt: skip
    manifest = prepare(cfg, tmp_path / "d")
    floor = load_floor(tmp_path / "d")
    world = floor["world"]
    assert {k: world[k] for k in ("people", "cities", "countries", "facts")} == {
        "people": 30, "cities": 8, "countries": 12, "facts": 30 * 6 + 8 * 4}
    # its bits (tests/test_study_axis.py derives them by hand): 8 cities, 30 professions, 391 birth
    # years, 16 instruments and pets, 29 mentors; 12 countries, 4 rivers, 1001 founding years, 16 fames
    import math

    bits = (30 * sum(map(math.log2, (8, 30, 391, 16, 16, 29)))
            + 8 * sum(map(math.log2, (12, 4, 1001, 16))))
    assert world["bits"] == pytest.approx(bits) and world["bits_per_fact"] == pytest.approx(bits / 212)
    meta = doc_metadata(tmp_path / "d", manifest, "train")
    want = [0.0] * len(REGION_NAMES)
    for source in meta["source"]:  # re-generate each training document from its stream position
        for r, x in enumerate(document(cfg.synth, cfg.seed, int(source)).draw_nats):
            want[r] += x
    got = floor["splits"]["train"]["region"]
    for r, name in enumerate(REGION_NAMES):
        assert got[name]["nats"] == pytest.approx(want[r], rel=1e-12)
    assert got["other"]["nats"] == 0 and got["query"]["nats_per_token"] > got["answer"]["nats_per_token"] > 0
    by_type = floor["splits"]["train"]["exercise"]
    assert sum(e["nats"] for e in by_type.values()) == pytest.approx(floor["splits"]["train"]["nats"], rel=1e-12)


def test_sample_floor_and_loss_above_it_by_region_and_type() -> None:
    region = torch.tensor([QUERY, QUERY, TRACE, TRACE, ANSWER, OTHER])
    exercise = torch.tensor([0, 1, 0, 1, 1, 0])
    table = TokenTable(region=region, exercise=exercise, position=torch.arange(6), token=torch.arange(6),
                       exercise_names=("a", "b"))  # fmt: skip
    r = torch.zeros(2, 4, dtype=torch.float64)
    r[0, QUERY], r[1, QUERY], r[0, TRACE], r[1, TRACE], r[1, ANSWER] = 2.0, 4.0, 0.5, 1.5, 0.25
    loss = torch.tensor([3.0, 5.0, 1.0, 2.0, 0.5, 0.0])
    out = add_entropy_floor(decompose(loss, table), token_entropy_floor(r, table), table)
    assert out["entropy_floor"] == pytest.approx((2 + 4 + 0.5 + 1.5 + 0.25) / 6)
    assert out["loss_above_floor"] == pytest.approx(out["loss"] - out["entropy_floor"])
    rows = {x["group"]: x for x in out["region"]}
    assert rows["query"]["entropy_floor"] == pytest.approx(3.0) and rows["query"]["loss_above_floor"] == pytest.approx(1.0)
    assert rows["trace"]["entropy_floor"] == pytest.approx(1.0) and rows["other"]["entropy_floor"] == 0
    types = {x["group"]: x for x in out["exercise"]}
    assert types["a"]["entropy_floor"] == pytest.approx(2.5 / 3)
    assert types["b"]["loss_above_floor"] == pytest.approx(7.5 / 3 - 5.75 / 3)
    assert "entropy_floor" not in out["position"][0]  # only whole (type, region) cells get a floor


def test_rates_table_follows_the_manifest_order(tiny_dir) -> None:
    out, manifest = tiny_dir
    floor = load_floor(out)
    table = rates(floor, "val", ["absent", "tiny"])
    assert table[0].tolist() == [0, 0, 0, 0]
    assert table[1, QUERY] == pytest.approx(floor["splits"]["val"]["exercise"]["tiny"]["region"]["query"]["nats_per_token"])
    with pytest.raises(DataError):
        rates(floor, "test", ["tiny"])


def test_default_synth_floor_is_charged_where_it_is_revealed() -> None:
    """Recall values are world facts (free); the query carries the most information per
    token; a memorization answer that only restates the trace costs only its wording."""
    cfg = SynthConfig(people=60, cities=16)
    docs = [document(cfg, 0, i) for i in range(400)]
    for d in docs:
        assert d.draw_nats[OTHER] == 0 and d.draw_nats[QUERY] > 0
    memo = [d for d in docs if d.exercise == "memorization"]
    rag = [d for d in docs if d.exercise == "rag"]
    # A rag trace's records are fresh per document: far more information than a recalled profile.
    assert min(d.draw_nats[TRACE] for d in rag) > sum(d.draw_nats[TRACE] for d in memo) / len(memo)


class _Perturbed(Draws):
    """Draws whose k-th draw returns another allowed value (the rest of the stream unchanged)."""

    def __init__(self, seed: int, k: int) -> None:
        super().__init__(seed)
        self.k, self.calls, self.changed = k, 0, False

    def _hit(self) -> bool:
        self.calls += 1
        return self.calls - 1 == self.k

    def choice(self, seq):
        x = super().choice(seq)
        other = [y for y in seq if y != x]
        if self._hit() and other:
            self.changed = True
            return other[0]
        return x

    def weighted(self, seq, weights):
        x = super().weighted(seq, weights)
        other = [y for y, w in zip(seq, weights) if y != x and w > 0]
        if self._hit() and other:
            self.changed = True
            return other[0]
        return x

    def randint(self, a, b):
        x = super().randint(a, b)
        if self._hit() and b > a:
            self.changed = True
            return a if x != a else a + 1
        return x

    def chance(self, p):
        x = super().chance(p)
        if self._hit():
            self.changed = True
            return not x
        return x

    def sample(self, seq, k):
        x = super().sample(seq, k)
        if self._hit():
            if k >= 2:
                self.changed = True
                x[0], x[1] = x[1], x[0]
            elif k == 1 and len(seq) > 1:
                self.changed = True
                x[0] = next(y for y in seq if y != x[0])
        return x


@pytest.mark.parametrize("kind", sorted(__import__("sanlab.data.synth", fromlist=["GENERATORS"]).GENERATORS))
def test_every_draw_shows_in_the_text(kind: str) -> None:
    """The floor is the documents' entropy only if the text determines every draw: change
    any one draw to another allowed value and the document's text must change."""
    from sanlab.data.synth import GENERATORS, world_for

    gen, world = GENERATORS[kind], world_for(SynthConfig(people=40, cities=10))
    for seed in range(12):
        base = gen(Draws(seed), world).text
        probe = _Perturbed(seed, -1)
        gen(probe, world)
        for k in range(probe.calls):
            d = _Perturbed(seed, k)
            text = gen(d, world).text
            assert not d.changed or text != base, f"{kind}: draw {k} of seed {seed} does not show in the text"
