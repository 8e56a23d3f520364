"""Every synth exercise's answer, re-derived from the planted world by the exercise's own logic.

Checking only that an answer value appears in the document lets wrong answers through
(a multihop answer set to the first hop's value also appears in the query). Here each
exercise type has a checker that reads the document as a user would — the question, the
notes, the options, the list — works out the right answer from `world_for(cfg)`, and
compares it with the answer region and `Document.targets`.

To cover a new exercise type, add a checker to CHECKERS; the completeness test fails
until every type the generator knows has one.
"""

from __future__ import annotations

import re
from typing import Callable

import pytest

from sanlab.data.regions import ANSWER, QUERY, TRACE, Document
from sanlab.data.synth import ATTRS, EXERCISES, Entity, SynthConfig, World, document, world_for

CFG = SynthConfig(people=60, cities=16)
PER_TYPE = 120  # documents checked per exercise type


def _parts(doc: Document) -> tuple[str, str, str]:
    """(query, trace, answer) texts without role headers and framing newlines."""
    query = doc.region_text(QUERY).removeprefix("user\n")
    trace = doc.region_text(TRACE).strip("\n")
    answer = doc.region_text(ANSWER).removeprefix("assistant\n").removeprefix("\n")
    return query, trace, answer


def _a(v: str) -> str:
    return ("an " if v[0] in "aeiou" else "a ") + v


def _states(text: str, e: Entity, attr: str) -> bool:
    """Whether `text` states the world's value of `attr` for `e` (any paraphrase)."""
    v = e.facts[attr]
    return any(s.format(e=e.name, v=v, av=_a(v)) in text for s in ATTRS[attr].statements)


def _asked(w: World, query: str) -> list[tuple[Entity, str]]:
    """The (entity, attribute) questions asked in `query`, in the order they are asked."""
    found = []
    for e in w.entities:
        if e.name not in query:
            continue
        for attr in e.facts:
            for q in ATTRS[attr].questions:
                pos = query.find(q.format(e=e.name))
                if pos >= 0:
                    found.append((pos, e, attr))
                    break
    return [(e, attr) for _, e, attr in sorted(found, key=lambda t: t[0])]


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# --------------------------------------------------------------------------- checkers


def check_memorization(w: World, doc: Document) -> None:
    query, trace, answer = _parts(doc)
    asked = _asked(w, query)
    assert asked and len({e.name for e, _ in asked}) == 1, "one entity is asked about"
    values = tuple(e.facts[attr] for e, attr in asked)
    assert doc.targets == values
    for e, attr in asked:
        assert _states(answer, e, attr), f"the answer does not state {attr} of {e.name}"
        assert e.facts[attr] not in query + trace, "a closed-book answer leaks into its context"


def check_rag(w: World, doc: Document) -> None:
    query, trace, answer = _parts(doc)
    asked = _asked(w, query)
    assert len(asked) == 1, f"one question, got {asked}"
    e, attr = asked[0]
    v = e.facts[attr]
    assert _states(query, e, attr), "the notes hold the fact the answer is read from"
    assert _states(answer, e, attr)
    assert doc.targets == (v,)
    assert trace.endswith(f"{v}.")


_NUM = r"(\d+)"
_MATH: list[tuple[re.Pattern[str], Callable[..., tuple[int, list[str]]]]] = [
    (re.compile(rf"Each day the workshop makes {_NUM} .+?\. After {_NUM} days, {_NUM} of them have been sold"),
     lambda a, b, d: (a * b - d, [str(a * b - d)])),
    (re.compile(rf"buys {_NUM} crates of .+? with {_NUM} in each crate, gives {_NUM} to neighbours .+?, then buys {_NUM} more"),
     lambda a, b, d, e: (a * b - d + e, [str(a * b - d + e)])),
    (re.compile(rf"is {_NUM} km long\. .+? walks {_NUM} km each day\. After {_NUM} days"),
     lambda a, b, d: (a - b * d, [str(a - b * d)])),
    (re.compile(rf"shares {_NUM} .+? equally among {_NUM} friends"),
     lambda a, b: (a // b, [f"gets {a // b}", f"{a % b} are left over"])),
]
_VISITORS = re.compile(r"on (\d+) days: ([\d, ]+)\. How many visitors came in total\?")
_STEP = re.compile(r"((?:\d+ [×+−÷] )+\d+) = (\d+)")
_OPS = str.maketrans({"×": "*", "−": "-", "÷": "/"})


def check_math(w: World, doc: Document) -> None:
    query, trace, answer = _parts(doc)
    results = []
    for pattern, solve in _MATH:
        m = pattern.search(query)
        if m:
            results.append(solve(*map(int, m.groups())))
    m = _VISITORS.search(query)
    if m:
        xs = [int(x) for x in m.group(2).split(", ")]
        assert len(xs) == int(m.group(1))
        results.append((sum(xs), [str(sum(xs))]))
    assert len(results) == 1, f"unrecognised or ambiguous math problem: {query!r}"
    result, stated = results[0]
    assert doc.targets == (str(result),)
    for s in stated:
        assert s in answer, f"{s!r} not in the answer {answer!r}"
    assert trace.endswith(f"The result is {result}.")
    steps = _STEP.findall(trace)
    assert steps
    for expr, value in steps:  # every worked step is right (÷ is integer division)
        assert eval(expr.translate(_OPS).replace("/", "//")) == int(value), f"{expr} = {value}"


_OPTION = re.compile(r"^([A-E])\. (.+)$", re.M)


def check_mcq(w: World, doc: Document) -> None:
    query, trace, answer = _parts(doc)
    asked = _asked(w, query)
    assert len(asked) == 1
    e, attr = asked[0]
    v = e.facts[attr]
    options = _OPTION.findall(query)
    assert 3 <= len(options) <= 5 and len({o for _, o in options}) == len(options)
    assert [letter for letter, _ in options] == list("ABCDE"[: len(options)])
    right = [letter for letter, o in options if o == v]
    assert len(right) == 1, "exactly one option is the world's value"
    assert doc.targets == (right[0], v)
    assert re.match(rf"(The answer is )?{right[0]}\b", answer), answer
    assert trace.endswith(f"So the answer is option {right[0]}.")


_EDITS: dict[str, Callable[[list[str]], str]] = {
    "Reverse the order of this list:": lambda items: "\n".join(reversed(items)),
    "Write this list backwards, last item first:": lambda items: "\n".join(reversed(items)),
    "Sort these names alphabetically:": lambda items: "\n".join(sorted(items)),
    "Put the following in alphabetical order:": lambda items: "\n".join(sorted(items)),
    "Turn this list into one sentence:": lambda items: f"The list names {_join([i.removeprefix('- ') for i in items])}.",
    "Join these items into a sentence:": lambda items: f"The list names {_join([i.removeprefix('- ') for i in items])}.",
}
_CAPS = "Rewrite the following text in capital letters:\n\n"
_REPLACE = (re.compile(r'In the text below, replace every "(.+?)" with "(.+?)"\.\n\n(.+)', re.S),
            re.compile(r"Change the name (.+?) to (.+?) in this passage:\n(.+)", re.S))


def check_editing(w: World, doc: Document) -> None:
    query, _, answer = _parts(doc)
    head, _, rest = query.partition("\n")
    if head in _EDITS:
        items = rest.split("\n")
        assert len(items) >= 3 and all(i.removeprefix("- ") in w.by_name for i in items)
        expected = _EDITS[head](items)
    elif query.startswith(_CAPS):
        expected = query.removeprefix(_CAPS).upper()
    else:
        m = next((m for p in _REPLACE if (m := p.fullmatch(query))), None)
        assert m is not None, f"unrecognised editing request: {query!r}"
        old, new, text = m.groups()
        assert old in w.by_name and new in w.by_name and old != new and old in text
        expected = text.replace(old, new)
    assert answer == expected
    assert doc.targets == (expected.split("\n")[0],)


_CHAINS = {
    "In which country was {p} born?": ("birthplace", "country"),
    "Which river flows through the city where {p} was born?": ("birthplace", "river"),
    "What is the profession of the person who trained {p}?": ("mentor", "profession"),
    "In which country was the teacher of {p} born?": ("mentor", "birthplace", "country"),
    "Which instrument does the teacher of {p} play?": ("mentor", "instrument"),
    "What is the birthplace of {p} famous for?": ("birthplace", "known_for"),
}
_CHAIN_RES = {re.compile(re.escape(q).replace(re.escape("{p}"), "(.+)") + "$"): c for q, c in _CHAINS.items()}


def check_multihop(w: World, doc: Document) -> None:
    query, trace, answer = _parts(doc)
    question = query.rsplit("\n", 1)[-1]
    hits = [(m.group(1), c) for r, c in _CHAIN_RES.items()
            if (m := r.fullmatch(question)) and m.group(1) in w.by_name]
    assert len(hits) == 1, f"unrecognised multihop question: {question!r}"
    start, chain = hits[0]
    e = w.by_name[start]
    values = []
    for i, attr in enumerate(chain):
        assert _states(query, e, attr), f"hop {i + 1} ({attr} of {e.name}) is not in the notes"
        values.append(e.facts[attr])
        if i < len(chain) - 1:
            e = w.by_name[e.facts[attr]]
    final = values[-1]
    assert doc.targets == (final,)
    assert final in answer
    for v in values[:-1]:
        assert v not in answer, f"the answer names an intermediate hop ({v})"
    assert trace.endswith(f"the answer is {final}.")


CHECKERS: dict[str, Callable[[World, Document], None]] = {
    "memorization": check_memorization,
    "rag": check_rag,
    "math": check_math,
    "mcq": check_mcq,
    "editing": check_editing,
    "multihop": check_multihop,
}


def test_every_exercise_type_has_an_answer_check() -> None:
    assert set(CHECKERS) == set(EXERCISES), f"write a checker for {sorted(set(EXERCISES) - set(CHECKERS))}"


@pytest.mark.parametrize("kind", EXERCISES)
def test_answers_follow_from_the_planted_world(kind: str) -> None:
    cfg = CFG.model_copy(update={"mix": {kind: 1.0}})
    w = world_for(cfg)
    check = CHECKERS.get(kind)
    assert check is not None, f"no answer check for {kind}"
    for i in range(PER_TYPE):
        doc = document(cfg, 11, i)
        assert doc.exercise == kind
        try:
            check(w, doc)
        except AssertionError as e:
            raise AssertionError(f"{kind} document {i}: {e}\n{doc.text}") from None
