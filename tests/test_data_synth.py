"""The SYNTH-format generator: determinism, the planted world, and the recall/context contrast."""

from __future__ import annotations

import re

import pytest

from sanlab.config import apply_overrides
from sanlab.data.regions import ANSWER, OTHER, QUERY, TRACE
from sanlab.data.synth import EXERCISES, SynthConfig, document, world_for
from sanlab.errors import ConfigError

CFG = SynthConfig(people=60, cities=16)
DOCS = [document(CFG, 3, i) for i in range(600)]


def _before_answer(doc) -> str:
    """Everything the model has seen when the answer region begins (query and trace)."""
    text = doc.text
    return text[: text.rindex("</think>")]


def test_same_seed_same_documents_and_different_seed_differs() -> None:
    assert [document(CFG, 3, i).text for i in range(20)] == [d.text for d in DOCS[:20]]
    assert [document(CFG, 4, i).text for i in range(20)] != [d.text for d in DOCS[:20]]


def test_every_exercise_type_occurs_with_varied_surface_forms() -> None:
    kinds = {d.exercise for d in DOCS}
    assert kinds == set(EXERCISES)
    first_lines = {d.exercise: set() for d in DOCS}
    for d in DOCS:
        # The question's wording with names and numbers blanked out: the template.
        first_lines[d.exercise].add(re.sub(r"[A-Z][a-z]+|\d+", "_", d.region_text(QUERY).split("\n")[1]))
    for kind, forms in first_lines.items():
        assert len(forms) >= 3, f"{kind} has only {len(forms)} surface forms"


def test_documents_follow_the_chat_format_and_regions() -> None:
    pattern = re.compile(
        r"<\|im_start\|>user\n.*<\|im_end\|>\n<\|im_start\|>assistant\n<think>\n.*\n</think>\n.*<\|im_end\|>",
        re.S,
    )
    for d in DOCS[:50]:
        assert pattern.fullmatch(d.text)
        assert d.region_text(QUERY).startswith("user\n")
        assert d.region_text(ANSWER).startswith("assistant\n")
        assert d.region_text(TRACE).startswith("\n") and d.region_text(TRACE).endswith("\n")
        assert d.region_text(OTHER) == "<|im_start|><|im_end|>\n<|im_start|><think></think><|im_end|>"


def test_memorization_answers_are_not_in_their_own_context() -> None:
    memo = [d for d in DOCS if d.exercise == "memorization"]
    assert len(memo) > 50
    for d in memo:
        context = _before_answer(d)
        for value in d.targets:
            assert value not in context, f"{value!r} leaks into the context of: {d.text}"
            assert value in d.region_text(ANSWER)


def test_context_grounded_answers_are_in_the_query() -> None:
    for kind in ("rag", "multihop", "mcq"):
        docs = [d for d in DOCS if d.exercise == kind]
        assert docs
        for d in docs:
            assert d.targets[-1] in d.region_text(QUERY), d.text
    for d in (d for d in DOCS if d.exercise == "math"):
        assert d.targets[0] in d.region_text(TRACE)  # computed in the worked trace


def test_rag_notes_state_true_world_facts() -> None:
    world = world_for(CFG)
    for d in (d for d in DOCS if d.exercise == "rag"):
        answer = d.region_text(ANSWER)
        # Some entity named in the answer really has the stated value in the world.
        assert any(d.targets[0] in e.facts.values() for e in world.entities if e.name in answer)


def test_world_names_are_substring_free_and_world_is_seeded() -> None:
    world = world_for(CFG)
    words = sorted({w for e in world.entities for w in e.name.split()} | set(world.countries) | set(world.rivers))
    for a in words:
        for b in words:
            assert a == b or a.lower() not in b.lower()
    other = world_for(SynthConfig(people=60, cities=16, world_seed=1))
    assert [e.name for e in other.people] != [e.name for e in world.people]


def test_mix_selects_exercise_types() -> None:
    cfg = apply_overrides(SynthConfig, {}, ['mix={"math": 1.0, "rag": 0.0}'])
    assert {document(cfg, 0, i).exercise for i in range(30)} == {"math"}


@pytest.mark.parametrize(
    "override", ['mix={"poetry": 1.0}', 'mix={"math": -1.0}', "people=2"]
)
def test_bad_synth_config_is_a_config_error(override: str) -> None:
    with pytest.raises(ConfigError):
        apply_overrides(SynthConfig, {}, [override])
