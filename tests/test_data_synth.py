"""The SYNTH-format generator: determinism, the planted world, region shares, and every
exercise type's answer, checked by following the type's own logic against the world."""

from __future__ import annotations

import re

import pytest

from sanlab.config import apply_overrides
from sanlab.data.prepare import PrepareConfig, prepare
from sanlab.data.regions import ANSWER, OTHER, QUERY, TRACE
from sanlab.data.synth import (
    ANIMALS,
    ATTRS,
    EXERCISES,
    INSTRUMENTS,
    PROFESSIONS,
    SynthConfig,
    _a,
    document,
    world_for,
)
from sanlab.errors import ConfigError

CFG = SynthConfig(people=60, cities=16)
WORLD = world_for(CFG)
DOCS = [document(CFG, 3, i) for i in range(1500)]


def _of(kind: str) -> list:
    docs = [d for d in DOCS if d.exercise == kind]
    assert len(docs) >= 40, f"only {len(docs)} {kind} documents"
    return docs


def _q(d) -> str:
    return d.region_text(QUERY).removeprefix("user\n")


def _t(d) -> str:
    return d.region_text(TRACE).strip("\n")


def _ans(d) -> str:
    return d.region_text(ANSWER).removeprefix("assistant\n").removeprefix("\n")


def _named(text: str, pool) -> list:
    """Entities of `pool` whose name occurs in `text` (names are substring-free)."""
    return [e for e in pool if e.name in text]


def _states(text: str, e, attr: str, v: str | None = None) -> bool:
    """Whether `text` states attribute `attr` of `e` with value `v` (default: the world's)."""
    v = e.facts[attr] if v is None else v
    return any(t.format(e=e.name, v=v, av=_a(v)) in text for t in ATTRS[attr].statements)


def _asked(query: str, e) -> list[str]:
    return [a for a in e.facts if any(q.format(e=e.name) in query for q in ATTRS[a].questions)]


# --------------------------------------------------------------------------- stream and format


def test_same_seed_same_documents_and_different_seed_differs() -> None:
    assert [document(CFG, 3, i).text for i in range(20)] == [d.text for d in DOCS[:20]]
    assert [document(CFG, 4, i).text for i in range(20)] != [d.text for d in DOCS[:20]]
    assert [document(CFG, 3, i).draw_nats for i in range(20)] == [d.draw_nats for d in DOCS[:20]]


def test_every_exercise_type_occurs_with_varied_surface_forms() -> None:
    assert {d.exercise for d in DOCS} == set(EXERCISES)
    forms: dict[str, set[str]] = {k: set() for k in EXERCISES}
    for d in DOCS:
        # The question's wording with names and numbers blanked out: the template.
        forms[d.exercise].add(re.sub(r"[A-Z][a-z]+|\d+", "_", _q(d).split("\n")[0]))
    for kind, f in forms.items():
        assert len(f) >= 3, f"{kind} has only {len(f)} surface forms"


def test_documents_follow_the_chat_format_and_regions() -> None:
    pattern = re.compile(
        r"<\|im_start\|>user\n.*<\|im_end\|>\n<\|im_start\|>assistant\n<think>\n.*\n</think>\n.*<\|im_end\|>",
        re.S,
    )
    for d in DOCS[:100]:
        assert pattern.fullmatch(d.text)
        assert d.region_text(QUERY).startswith("user\n")
        assert d.region_text(ANSWER).startswith("assistant\n")
        assert d.region_text(TRACE).startswith("\n") and d.region_text(TRACE).endswith("\n")
        assert d.region_text(OTHER) == "<|im_start|><|im_end|>\n<|im_start|><think></think><|im_end|>"
        assert d.draw_nats is not None and d.draw_nats[OTHER] == 0 and min(d.draw_nats) >= 0


def test_default_region_shares_are_synths(tmp_path) -> None:
    """SPEC §1.6: SYNTH's training tokens are 5.8% query, 57.2% trace, 35.9% answer."""
    cfg = apply_overrides(PrepareConfig, {}, ["tokens=150000"])  # the default corpus, seed and vocab
    manifest = prepare(cfg, tmp_path / "d")
    train = manifest["splits"]["train"]
    share = {r: 100 * n / train["tokens"] for r, n in train["region_tokens"].items()}
    for region, synth in (("query", 5.8), ("trace", 57.2), ("answer", 35.9)):
        assert abs(share[region] - synth) <= 5, f"{region}: {share[region]:.1f}% vs SYNTH's {synth}%"
    assert set(manifest["exercises"]) == set(EXERCISES)


# --------------------------------------------------------------------------- recall types


def test_memorization_recalls_the_world_and_answers_with_it() -> None:
    for d in _of("memorization"):
        q, t, a = _q(d), _t(d), _ans(d)
        (e,) = _named(q, WORLD.entities)
        asked = _asked(q, e)
        assert asked and sorted(e.facts[x] for x in asked) == sorted(d.targets)
        direct = a.split("\n\n")[0]  # the answer proper, before context and recap
        for attr in asked:
            assert e.facts[attr] not in q  # nothing earlier than the recall states it
            assert _states(direct, e, attr), f"answer does not state {attr} of {e.name}: {a}"
            wrong = {x.facts[attr] for x in WORLD.entities if attr in x.facts} - {e.facts[attr]}
            assert not any(_states(a + t, e, attr, v) for v in wrong), f"a false {attr} of {e.name}: {a}"
        for attr in e.facts:  # the recalled profile is the world's, fact by fact
            assert _states(t, e, attr), f"trace does not recall {attr} of {e.name}: {t}"


def test_mcq_answer_is_the_option_that_holds_in_the_world() -> None:
    for d in _of("mcq"):
        q = _q(d)
        (e,) = _named(q.split("\n")[0], WORLD.entities)
        (attr,) = _asked(q.split("\n")[0], e)
        options = dict(re.findall(r"^([A-E])\. (.+)$", q, re.M))
        right = [letter for letter, o in options.items() if o == e.facts[attr]]
        assert len(right) == 1
        said = re.match(r"(?:The answer is |Option )?([A-E])[.:,]", _ans(d))
        assert said and said.group(1) == right[0] == d.targets[0]


def _chain_question(q: str):
    from sanlab.data.synth import _CHAINS

    for chain, template in _CHAINS.items():
        for p in WORLD.people:
            if template.format(p=p.name) == q:
                return p, chain
    raise AssertionError(f"no chain question matches {q!r}")


def test_multihop_answer_is_the_last_hops_value_and_notes_are_world_facts() -> None:
    for d in _of("multihop"):
        p, chain = _chain_question(_q(d))
        e, values = p, []
        for attr in chain:  # follow the world from the person, hop by hop
            values.append(e.facts[attr])
            e = WORLD.by_name.get(values[-1], e)
        first_sentence = _ans(d).split("\n")[0]
        assert values[-1] in first_sentence and d.targets == (values[-1],)
        assert values[0] not in first_sentence  # not the first hop's value
        notes = re.findall(r"^\d+\. (.+)$", _t(d).split("Retrieved notes:\n")[1], re.M)
        assert len(notes) >= len(chain) + 1
        for note in notes:  # every retrieved note is true in the world
            assert any(_states(note, x, attr) for x in _named(note, WORLD.entities) for attr in x.facts), note


# --------------------------------------------------------------------------- context-grounded types


def test_rag_answer_is_read_from_the_retrieved_records() -> None:
    entry = re.compile(r"^\d+\. (?:On (?P<d1>\w+), (?P<p1>.+?) bought (?P<n1>\d+) (?P<i1>.+?)\."
                       r"|(?P<p2>.+?) bought (?P<n2>\d+) (?P<i2>.+?) on (?P<d2>\w+)\."
                       r"|(?P<d3>\w+): (?P<p3>.+?), (?P<n3>\d+) (?P<i3>.+?)\.)$", re.M)  # fmt: skip
    for d in _of("rag"):
        q, t, a = _q(d), _t(d), _ans(d)
        (p,) = _named(q, WORLD.people)
        rows = []
        for m in entry.finditer(t):
            k = next(i for i in "123" if m.group("p" + i))
            rows.append(tuple(m.group(x + k) for x in "pnid"))
        mine = [r for r in rows if r[0] == p.name]
        assert len(rows) >= 3 and len(mine) == 1
        _, n, item, day = mine[0]
        if q.startswith(("How many", "At the")):
            assert item in q
            want = n
        elif q.startswith(("On which day", "When")):
            want = day
        else:
            want = f"{n} {item}"
        assert d.targets == (want,)
        assert f"{p.name} bought {n} {item}" in a and day in a and a.rstrip(".").endswith(want)
        assert n not in q  # the count is only in the retrieved records


def _math_result(q: str) -> int:
    q = re.sub(r"^(Solve this\. |Help with some arithmetic\. )", "", q)
    if m := re.search(r"makes (\d+) .+ a day for (\d+) days and sells (\d+)\.", q):
        a, b, s = map(int, m.groups())
        return a * b - s
    if m := re.search(r"buys (\d+) crates of (\d+) .+, gives away (\d+), then buys (\d+) more", q):
        a, b, s, e = map(int, m.groups())
        return a * b - s + e
    if m := re.search(r"is (\d+) km\. Walking (\d+) km a day, how many km are left after (\d+) days", q):
        a, b, n = map(int, m.groups())
        return a - b * n
    if m := re.search(r"shares (\d+) .+ equally among (\d+) friends", q):
        a, b = map(int, m.groups())
        return a // b
    m = re.search(r"on (\d+) days: ([\d, ]+)\. How many in total", q)
    assert m, q
    xs = [int(x) for x in m.group(2).split(", ")]
    assert len(xs) == int(m.group(1))
    return sum(xs)


def test_math_answer_follows_from_the_question() -> None:
    for d in _of("math"):
        r = _math_result(_q(d))
        assert d.targets == (str(r),)
        assert f"The result is {r}." in _t(d)
        assert re.search(rf"\b{r}\b", _ans(d).split("\n")[0]), _ans(d)


def test_math_mcq_answer_is_the_option_equal_to_the_result() -> None:
    for d in _of("math-mcq"):
        q = _q(d)
        a, b, op, c = re.search(r"(\d+) × (\d+) ([+−]) (\d+)", q).groups()
        r = int(a) * int(b) + (int(c) if op == "+" else -int(c))
        options = {letter: int(o) for letter, o in re.findall(r"^([A-E])\. (\d+)$", q, re.M)}
        right = [letter for letter, o in options.items() if o == r]
        assert len(right) == 1 and len(options) >= 3
        said = re.match(r"(?:The answer is )?([A-E])[.:]", _ans(d))
        assert said and said.group(1) == right[0]


def test_cooking_scales_the_retrieved_recipe_to_the_people_asked_for() -> None:
    line = re.compile(r"^- (\d+) (?:(g|ml) )?(?:pinch(?:es)? of )?(.+)$", re.M)
    for d in _of("cooking"):
        people = int(re.search(r"for (\d+)", _q(d)).group(1))
        t, a = _t(d), _ans(d)
        base = int(re.search(r"The recipe serves (\d+)\.", t).group(1))
        assert people % base == 0
        recipe = line.findall(t.split("Method:")[0])
        scaled = line.findall(a.split("Method:")[0])
        assert len(recipe) >= 4
        assert scaled == [(str(int(n) * people // base), u, x) for n, u, x in recipe]
        assert t.split("Method:\n")[1].split("\n")[:4] == a.split("Method:\n")[1].split("\n")[:4]


def test_editing_applies_the_asked_operation_to_the_given_text() -> None:
    ops = {"Reverse this list:": lambda xs: xs[::-1], "Write this list backwards:": lambda xs: xs[::-1],
           "Sort these alphabetically:": sorted, "Put these in alphabetical order:": sorted}  # fmt: skip
    seen = set()
    for d in _of("editing"):
        q, a = _q(d), _ans(d)
        lead = next((k for k in ops if q.startswith(k)), None)
        if lead is not None:
            items = q[len(lead) + 1 : -1].split("; ")
            want = "\n".join(ops[lead](items))
            seen.add("list")
        elif q.startswith(("Join these into one sentence:", "Make one sentence of this list:")):
            items = q.split(": ", 1)[1][:-1].split("; ")
            want = "The list names " + (", ".join(items[:-1]) + " and " + items[-1]) + "."
            seen.add("join")
        elif q.startswith(("Rewrite in capital letters: ", "Put this in upper case: ")):
            want = q.split(": ", 1)[1].upper()
            seen.add("upper")
        else:
            m = re.match(r"(?:Replace (.+) with (.+) in|Change (.+) to (.+?)): (.+)$", q, re.S)
            old, new = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            want = m.group(5).replace(old, new)
            assert old not in want and new in want
            seen.add("replace")
        assert want in a and d.targets[0] in a, (q, a)
    assert seen == {"list", "join", "upper", "replace"}


def test_constrained_writing_has_exactly_the_asked_words_of_true_facts() -> None:
    from sanlab.data.synth import filler

    for d in _of("constrained-writing"):
        q, a = _q(d), _ans(d)
        n = int(re.search(r"(\d+) words", q).group(1))
        (e,) = _named(q, WORLD.people)
        assert len(a.split()) == n, (n, a)
        body = a
        for k in range(n, 0, -1):  # strip the closing filler, if any
            if k and body.endswith(filler(k)):
                body = body[: -len(filler(k))].rstrip()
                break
        sentences = re.findall(r"[^.]+\.", body)
        assert sentences and all(any(_states(s.strip(), e, attr) for attr in e.facts) for s in sentences), a


def test_creative_writing_tells_the_planned_beats_with_the_persons_true_facts() -> None:
    for d in _of("creative-writing"):
        q, t, a = _q(d), _t(d), _ans(d)
        (p,) = _named(q, WORLD.people)
        beats = re.findall(r"^\d+\. (.+)$", t.split("Plan:\n")[1], re.M)
        assert len(beats) == 4
        positions = [a.index(b) for b in beats]  # every beat is told, in the planned order
        assert positions == sorted(positions)
        for pool, attr in ((ANIMALS, "animal"), (INSTRUMENTS, "instrument"), (PROFESSIONS, "profession")):
            used = {x for x in pool if re.search(rf"\b{x}\b", a.lower())}
            assert used <= {p.facts[attr]}, (attr, used, p.facts[attr])


# --------------------------------------------------------------------------- the world and the config


# Each exercise type's answer test (above): a type added to the generator without one fails
# the completeness check below.
ANSWER_TESTS = {
    "memorization": test_memorization_recalls_the_world_and_answers_with_it,
    "mcq": test_mcq_answer_is_the_option_that_holds_in_the_world,
    "multihop": test_multihop_answer_is_the_last_hops_value_and_notes_are_world_facts,
    "rag": test_rag_answer_is_read_from_the_retrieved_records,
    "math": test_math_answer_follows_from_the_question,
    "math-mcq": test_math_mcq_answer_is_the_option_equal_to_the_result,
    "cooking": test_cooking_scales_the_retrieved_recipe_to_the_people_asked_for,
    "editing": test_editing_applies_the_asked_operation_to_the_given_text,
    "constrained-writing": test_constrained_writing_has_exactly_the_asked_words_of_true_facts,
    "creative-writing": test_creative_writing_tells_the_planned_beats_with_the_persons_true_facts,
}


def test_every_exercise_type_has_an_answer_test() -> None:
    from sanlab.data.synth import EXERCISES

    assert set(ANSWER_TESTS) == set(EXERCISES)


def test_world_names_are_substring_free_and_world_is_seeded() -> None:
    words = sorted({w for e in WORLD.entities for w in e.name.split()} | set(WORLD.countries) | set(WORLD.rivers))
    for a in words:
        for b in words:
            assert a == b or a.lower() not in b.lower()
    other = world_for(SynthConfig(people=60, cities=16, world_seed=1))
    assert [e.name for e in other.people] != [e.name for e in WORLD.people]


def test_world_size_is_a_knob_in_facts() -> None:
    assert world_for(SynthConfig()).n_facts == 6 * 1000 + 4 * 100
    cfg = apply_overrides(SynthConfig, {}, ["facts=3200"])
    w = world_for(cfg)
    assert (len(w.people), len(w.cities)) == (500, 50) and w.n_facts == 3200


def test_mix_selects_exercise_types() -> None:
    cfg = apply_overrides(SynthConfig, {}, ['mix={"math": 1.0, "rag": 0.0}'])
    assert {document(cfg, 0, i).exercise for i in range(30)} == {"math"}
    cfg = apply_overrides(SynthConfig, {}, ["mix.math-mcq=50"])
    assert sum(document(cfg, 0, i).exercise == "math-mcq" for i in range(40)) > 30


@pytest.mark.parametrize(
    "override", ['mix={"poetry": 1.0}', 'mix={"math": -1.0}', "people=2", "facts=10"]
)
def test_bad_synth_config_is_a_config_error(override: str) -> None:
    with pytest.raises(ConfigError):
        apply_overrides(SynthConfig, {}, [override])
