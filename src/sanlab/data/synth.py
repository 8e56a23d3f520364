"""The embedded default corpus: seeded SYNTH-format documents over a planted world.

SPEC §4: a user needs a corpus that runs offline in minutes and still shows the paper's
central contrast at tiny scale — tokens that only *parametric* knowledge can predict
versus tokens that can be read from the context. The generator therefore plants a fixed
"world" (fictional people and cities with attributes, size set by the user) and writes
exercises about it:

- memorization: closed-book questions; neither the question nor the trace states the
  fact, so the answer's value is nowhere earlier in the document (only the weights can
  predict it);
- rag: true world facts plus distractors in the query, the answer read from them; the
  answer is in the context, while the query's facts are recall-predictable tokens (the
  paper's low-context query tokens);
- math: arithmetic word problems with a worked step-by-step trace;
- mcq: a world-fact question with lettered options given in the query (recall picks one);
- editing: a transformation of text given in the query (reverse, sort, capitals,
  replace a name, join a list);
- multihop (this project's own type): a 2–3 hop question over facts in the query
  (person → teacher → birthplace → country); the trace walks the chain.

Every document is a pure function of (world, seed, index), so the stream is indexable,
reproducible and needs no state. Surface forms vary (several templates and paraphrases per
type, variable numbers of facts, items and steps) so that no single template is memorised;
documents are roughly 80–600 tokens with a small BPE.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterator

from pydantic import model_validator

from sanlab.config import StrictModel
from sanlab.data.regions import Document, chat_document

EXERCISES: tuple[str, ...] = ("memorization", "rag", "math", "mcq", "editing", "multihop")


class SynthConfig(StrictModel):
    """Size of the planted world and the mix of exercise types."""

    people: int = 200
    """People in the planted world."""
    cities: int = 40
    """Cities in the planted world."""
    countries: int = 8
    """Countries in the planted world."""
    world_seed: int = 0  # the world is fixed by this seed; the document stream by `prepare.seed`
    mix: dict[str, float] = {
        "memorization": 0.25,
        "rag": 0.2,
        "math": 0.15,
        "mcq": 0.1,
        "editing": 0.1,
        "multihop": 0.2,
    }
    """Relative weight of each exercise type (memorization, rag, math, mcq, editing, multihop)."""

    @model_validator(mode="after")
    def _check(self) -> "SynthConfig":
        if self.people < 4 or self.cities < 4 or self.countries < 2:
            raise ValueError("the world needs at least 4 people, 4 cities and 2 countries")
        if self.world_seed < 0:
            raise ValueError(f"world_seed must be non-negative, got {self.world_seed}")
        unknown = sorted(set(self.mix) - set(EXERCISES))
        if unknown:
            raise ValueError(f"mix: unknown exercise type {unknown[0]!r} (choose from {', '.join(EXERCISES)})")
        if any(w < 0 for w in self.mix.values()) or sum(self.mix.values()) <= 0:
            raise ValueError("mix: weights must be non-negative and not all zero")
        return self


# --------------------------------------------------------------------------- the world

PROFESSIONS = (
    "potter", "weaver", "clockmaker", "glassblower", "cartographer", "astronomer", "beekeeper",
    "bookbinder", "ferryman", "herbalist", "lamplighter", "locksmith", "miller", "navigator",
    "perfumer", "printer", "ropemaker", "saddler", "shipwright", "surveyor", "tanner",
    "tinsmith", "vintner", "botanist", "engraver", "falconer", "jeweller", "cooper",
    "chandler", "archivist",
)  # fmt: skip
INSTRUMENTS = (
    "lute", "harp", "cello", "oboe", "flute", "viola", "bagpipe", "dulcimer", "zither",
    "trumpet", "bassoon", "mandolin", "accordion", "clarinet", "harpsichord", "tambourine",
)  # fmt: skip
ANIMALS = (
    "heron", "badger", "ferret", "tortoise", "raven", "goat", "mule", "parrot", "hedgehog",
    "otter", "pony", "falcon", "lizard", "hound", "peacock", "rabbit",
)  # fmt: skip
PRODUCTS = (
    "glassworks", "salt markets", "copper bells", "wool fairs", "stone bridges", "paper mills",
    "spice gardens", "clock towers", "silver mines", "boat races", "cheese cellars",
    "lantern festivals", "dye works", "bell foundries", "olive groves", "tea houses",
)  # fmt: skip
ITEMS = (
    "lanterns", "clay pots", "loaves", "candles", "coils of rope", "maps", "baskets", "barrels",
    "jars of honey", "copper nails", "bolts of cloth", "bricks",
)  # fmt: skip

_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s",
           "st", "t", "th", "v", "z", "sh", "ch", "w", "y", "tr")  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ou", "ei", "ai", "y")
_CODAS = ("", "", "", "n", "r", "l", "s", "th", "nd", "rk", "m", "x")


@dataclass(frozen=True)
class Entity:
    """A person or city of the world with its facts (attribute name -> value)."""

    name: str
    kind: str  # "person" | "city"
    facts: dict[str, str]


@dataclass
class World:
    """The planted knowledge base every exercise draws its facts from."""

    people: tuple[Entity, ...]
    cities: tuple[Entity, ...]
    countries: tuple[str, ...]
    rivers: tuple[str, ...]

    def __post_init__(self) -> None:
        self.entities: tuple[Entity, ...] = self.people + self.cities
        self.by_name: dict[str, Entity] = {e.name: e for e in self.entities}


def _word(rng: random.Random, syllables: int) -> str:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)]
    return "".join(parts).capitalize()


def _fresh_words(rng: random.Random, n: int, taken: list[str], syllables: tuple[int, ...]) -> list[str]:
    """`n` new name words, none of which is a substring of another (or of a taken word).

    Substring-free names let a test (or an evaluation) decide by plain string search
    whether a document states a fact.
    """
    out: list[str] = []
    while len(out) < n:
        w = _word(rng, rng.choice(syllables))
        low = w.lower()
        if len(low) < 4 or any(low in t.lower() or t.lower() in low for t in taken + out):
            continue
        out.append(w)
    return out


@lru_cache(maxsize=8)
def build_world(people: int, cities: int, countries: int, world_seed: int) -> World:
    """The world for a given size and seed (cached: it is shared by every document)."""
    rng = random.Random(world_seed * 7919 + 17)
    taken: list[str] = []
    country_names = _fresh_words(rng, countries, taken, (2, 3))
    taken += country_names
    river_names = _fresh_words(rng, max(4, cities // 2), taken, (2,))
    taken += river_names
    city_names = _fresh_words(rng, cities, taken, (2, 3))
    taken += city_names
    first = _fresh_words(rng, max(4, people // 3), taken, (2,))
    taken += first
    last = _fresh_words(rng, max(4, people // 2), taken, (2, 3))
    full: list[str] = []
    seen: set[str] = set()
    while len(full) < people:
        name = f"{rng.choice(first)} {rng.choice(last)}"
        if name not in seen:
            seen.add(name)
            full.append(name)
    city_entities = tuple(
        Entity(
            name=c,
            kind="city",
            facts={
                "country": rng.choice(country_names),
                "river": rng.choice(river_names),
                "founded": str(rng.randint(800, 1800)),
                "known_for": rng.choice(PRODUCTS),
            },
        )
        for c in city_names
    )
    people_entities = []
    for i, name in enumerate(full):
        mentor = full[(i + rng.randint(1, people - 1)) % people]
        people_entities.append(
            Entity(
                name=name,
                kind="person",
                facts={
                    "birthplace": rng.choice(city_names),
                    "profession": rng.choice(PROFESSIONS),
                    "birth_year": str(rng.randint(1600, 1990)),
                    "instrument": rng.choice(INSTRUMENTS),
                    "animal": rng.choice(ANIMALS),
                    "mentor": mentor,
                },
            )
        )
    return World(tuple(people_entities), city_entities, tuple(country_names), tuple(river_names))


def world_for(cfg: SynthConfig) -> World:
    return build_world(cfg.people, cfg.cities, cfg.countries, cfg.world_seed)


# --------------------------------------------------------------------------- facts as text


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


@dataclass(frozen=True)
class Attr:
    """How one attribute is asked about and stated; `{e}` entity, `{v}` value, `{av}` 'a value'."""

    noun: str
    questions: tuple[str, ...]
    statements: tuple[str, ...]


ATTRS: dict[str, Attr] = {
    "birthplace": Attr(
        "the birthplace",
        ("Where was {e} born?", "In which city was {e} born?", "What is the birthplace of {e}?",
         "{e} was born in which town?", "Which city is the hometown of {e}?"),
        ("{e} was born in {v}.", "The birthplace of {e} is {v}.", "{v} is the city where {e} was born.",
         "{e} comes from {v}, where they were born."),
    ),
    "profession": Attr(
        "the profession",
        ("What does {e} do for a living?", "What is the profession of {e}?",
         "What kind of work does {e} do?", "What is {e}'s trade?"),
        ("{e} works as {av}.", "{e} is {av} by trade.", "By profession, {e} is {av}.",
         "{e} earns a living as {av}."),
    ),
    "birth_year": Attr(
        "the year of birth",
        ("In what year was {e} born?", "When was {e} born?", "What is the birth year of {e}?"),
        ("{e} was born in the year {v}.", "The birth year of {e} is {v}.", "{e} was born in {v}."),
    ),
    "instrument": Attr(
        "the instrument",
        ("Which instrument does {e} play?", "What instrument is {e} known to play?",
         "What does {e} play in the evenings?"),
        ("{e} plays the {v}.", "The instrument {e} plays is the {v}.", "In the evenings {e} plays the {v}."),
    ),
    "animal": Attr(
        "the pet",
        ("What animal does {e} keep?", "Which pet does {e} have?", "What kind of animal lives with {e}?"),
        ("{e} keeps {av}.", "The pet of {e} is {av}.", "{e} lives with {av}."),
    ),
    "mentor": Attr(
        "the teacher",
        ("Who trained {e}?", "Who was the teacher of {e}?", "Under whom did {e} learn their craft?"),
        ("{e} was trained by {v}.", "The teacher of {e} was {v}.", "{v} taught {e} their craft."),
    ),
    "country": Attr(
        "the country",
        ("In which country is {e}?", "Which country does {e} belong to?", "Where does {e} lie?"),
        ("{e} lies in {v}.", "The city of {e} is in {v}.", "{e} belongs to the country of {v}."),
    ),
    "river": Attr(
        "the river",
        ("Which river flows through {e}?", "What river runs past {e}?", "Name the river of {e}."),
        ("The {v} river flows through {e}.", "{e} stands on the {v} river.", "The river of {e} is the {v}."),
    ),
    "founded": Attr(
        "the founding year",
        ("When was {e} founded?", "In what year was {e} founded?", "How old is {e}, by its founding year?"),
        ("{e} was founded in {v}.", "The founding year of {e} is {v}.", "{e} dates from the year {v}."),
    ),
    "known_for": Attr(
        "what it is famous for",
        ("What is {e} famous for?", "What is {e} known for?", "Why do travellers visit {e}?"),
        ("{e} is famous for its {v}.", "{e} is known for its {v}.", "Travellers visit {e} for its {v}."),
    ),
}  # fmt: skip


def state(rng: random.Random, e: Entity, attr: str) -> str:
    """One fact of the world as a sentence, in a random paraphrase."""
    v = e.facts[attr]
    return rng.choice(ATTRS[attr].statements).format(e=e.name, v=v, av=_a(v))


def ask(rng: random.Random, e: Entity, attr: str) -> str:
    return rng.choice(ATTRS[attr].questions).format(e=e.name)


def _entity(rng: random.Random, w: World, person_share: float = 0.7) -> Entity:
    return rng.choice(w.people) if rng.random() < person_share else rng.choice(w.cities)


def _distractor_facts(rng: random.Random, w: World, n: int, avoid: set[tuple[str, str]]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        e = _entity(rng, w)
        attr = rng.choice(list(e.facts))
        if (e.name, attr) in avoid:
            continue
        avoid.add((e.name, attr))
        out.append(state(rng, e, attr))
    return out


def _render_notes(rng: random.Random, facts: list[str]) -> str:
    style = rng.randrange(3)
    if style == 0:
        return "\n".join(f"- {f}" for f in facts)
    if style == 1:
        return "\n".join(f"{i + 1}. {f}" for i, f in enumerate(facts))
    return " ".join(facts)


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# --------------------------------------------------------------------------- exercise types

_MEMO_PREAMBLES = ("", "Quick question. ", "I am putting together some notes for a class. ",
                   "Answer from memory, please, since I have no books with me. ",
                   "Without looking anything up: ", "Help me check something I half remember. ",
                   "For a quiz I am writing about the world and its people and places: ",
                   "My friend and I disagree about this and want a clear answer. ")  # fmt: skip


def ex_memorization(rng: random.Random, w: World) -> Document:
    e = _entity(rng, w)
    n = rng.choices((1, 2, 3, 4), (0.4, 0.3, 0.2, 0.1))[0]
    attrs = rng.sample(list(e.facts), n)
    query = rng.choice(_MEMO_PREAMBLES) + " ".join(ask(rng, e, a) for a in attrs)
    nouns = _join([ATTRS[a].noun for a in attrs])
    what = "one of the people" if e.kind == "person" else "one of the cities"
    # Every sentence here is free of the facts' values: the answer must come from the weights.
    pool = [
        f"The question is about {e.name}, {what} I know about.",
        f"It asks for {nouns}.",
        "Nothing in the question states this, so the answer has to come from memory.",
        "No notes or passages are given here, so there is nothing to copy from.",
        f"I need to recall {nouns} of {e.name} and state {'it' if n == 1 else 'them'} plainly.",
        f"I will answer with {'one sentence' if n == 1 else f'{n} sentences, one per fact'}, naming {e.name} each time.",
        "This is a closed-book question.",
    ]
    trace = " ".join(rng.sample(pool, rng.randint(2, 5)))
    answer = " ".join(state(rng, e, a) for a in attrs)
    if rng.random() < 0.4:
        answer = rng.choice(("Here is what I know. ", "From memory: ", "Certainly. ", "Good question. ")) + answer
    if rng.random() < 0.3:
        answer += rng.choice((f" Let me know if you need anything else about {e.name}.",
                              " I am confident about this.", " I hope that settles it."))  # fmt: skip
    return chat_document(query, trace, answer, "memorization", tuple(e.facts[a] for a in attrs))


def ex_rag(rng: random.Random, w: World) -> Document:
    e = _entity(rng, w)
    attr = rng.choice(list(e.facts))
    key = state(rng, e, attr)
    facts = _distractor_facts(rng, w, rng.randint(2, 30), {(e.name, attr)})
    pos = rng.randrange(len(facts) + 1)
    facts.insert(pos, key)
    intro = rng.choice(("Use the notes below to answer the question.",
                        "Read the following facts and answer using only them.",
                        "Here is some background material.", "Context:",
                        "Answer the question from this passage."))  # fmt: skip
    question = ask(rng, e, attr)
    notes = _render_notes(rng, facts)
    if rng.random() < 0.7:
        query = f"{intro}\n\n{notes}\n\nQuestion: {question}"
    else:
        query = f"{question}\n\n{intro}\n{notes}"
    noun = ATTRS[attr].noun
    v = e.facts[attr]
    trace = rng.choice((
        f"I need {noun} of {e.name}. Scanning the notes for {e.name}, fact {pos + 1} says: \"{key}\" "
        f"The other {len(facts) - 1} facts are about other things and do not matter here. So the answer is {v}.",
        f"The question asks for {noun} of {e.name}. The relevant line is \"{key}\" That gives {v}.",
        f"Looking through the {len(facts)} facts, only one mentions {noun} of {e.name}: \"{key}\" "
        f"So it is {v}.",
    ))  # fmt: skip
    answer = state(rng, e, attr)
    if rng.random() < 0.4:
        answer += rng.choice((" This is stated in the notes.", " The passage says so directly."))
    return chat_document(query, trace, answer, "rag", (v,))


def _math_problem(rng: random.Random, w: World) -> tuple[str, list[str], str, int]:
    p = rng.choice(w.people).name
    c = rng.choice(w.cities).name
    item = rng.choice(ITEMS)
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.randint(3, 60), rng.randint(2, 12)
        d = rng.randint(1, a * b - 1)
        q = (f"{p} runs a workshop in {c}. Each day the workshop makes {a} {item}. "
             f"After {b} days, {d} of them have been sold. How many {item} are left?")
        steps = [f"Made in {b} days: {a} × {b} = {a * b}.", f"Left after selling: {a * b} − {d} = {a * b - d}."]
        return q, steps, f"{a * b - d} {item} are left.", a * b - d
    if kind == 1:
        a, b = rng.randint(2, 20), rng.randint(3, 24)
        d = rng.randint(1, a * b - 1)
        e = rng.randint(1, 50)
        r = a * b - d + e
        q = (f"{p} buys {a} crates of {item} with {b} in each crate, gives {d} to neighbours "
             f"in {c}, then buys {e} more. How many {item} does {p} have now?")
        steps = [f"Bought at first: {a} × {b} = {a * b}.", f"After giving some away: {a * b} − {d} = {a * b - d}.",
                 f"After buying more: {a * b - d} + {e} = {r}."]
        return q, steps, f"{p} now has {r} {item}.", r
    if kind == 2:
        b, d = rng.randint(5, 40), rng.randint(2, 9)
        a = b * d + rng.randint(1, 300)
        c2 = rng.choice(w.cities).name
        q = (f"The road from {c} to {c2} is {a} km long. {p} walks {b} km each day. "
             f"After {d} days, how many km are left?")
        steps = [f"Walked in {d} days: {b} × {d} = {b * d} km.", f"Left: {a} − {b * d} = {a - b * d} km."]
        return q, steps, f"{a - b * d} km are left.", a - b * d
    if kind == 3:
        b = rng.randint(2, 12)
        a = rng.randint(b + 1, 400)
        q = f"{p} shares {a} {item} equally among {b} friends in {c}. How many does each friend get, and how many are left over?"
        steps = [f"Divide: {a} ÷ {b} = {a // b} with remainder {a % b}.",
                 f"Check: {a // b} × {b} + {a % b} = {a}."]
        return q, steps, f"Each friend gets {a // b}, and {a % b} are left over.", a // b
    n = rng.randint(3, 16)
    xs = [rng.randint(10, 500) for _ in range(n)]
    q = (f"{p} counted the visitors to the {rng.choice(PRODUCTS)} of {c} on {n} days: "
         f"{', '.join(map(str, xs))}. How many visitors came in total?")
    steps, total = [], 0
    for i, x in enumerate(xs):
        steps.append(f"Day {i + 1}: {total} + {x} = {total + x}." if i else f"Day 1: {x}.")
        total += x
    return q, steps, f"In total {total} visitors came.", total


def ex_math(rng: random.Random, w: World) -> Document:
    q, steps, answer, result = _math_problem(rng, w)
    lead = rng.choice(("Let me work through this step by step.", "I will compute this in steps.",
                       "Break the problem into steps.", ""))  # fmt: skip
    trace = "\n".join(([lead] if lead else []) + steps + [f"The result is {result}."])
    if rng.random() < 0.3:
        q = rng.choice(("Solve this word problem. ", "Please help with some arithmetic. ")) + q
    return chat_document(q, trace, answer, "math", (str(result),))


_MCQ_POOLS: dict[str, Callable[[World], tuple[str, ...]]] = {
    "birthplace": lambda w: tuple(c.name for c in w.cities),
    "profession": lambda w: PROFESSIONS,
    "instrument": lambda w: INSTRUMENTS,
    "animal": lambda w: ANIMALS,
    "mentor": lambda w: tuple(p.name for p in w.people),
    "country": lambda w: w.countries,
    "river": lambda w: w.rivers,
    "known_for": lambda w: PRODUCTS,
}


def ex_mcq(rng: random.Random, w: World) -> Document:
    e = _entity(rng, w)
    attr = rng.choice([a for a in e.facts if a in _MCQ_POOLS])
    v = e.facts[attr]
    k = rng.choice((3, 4, 4, 5))
    options = rng.sample([o for o in _MCQ_POOLS[attr](w) if o != v and o != e.name], k - 1) + [v]
    rng.shuffle(options)
    letters = "ABCDE"[:k]
    right = letters[options.index(v)]
    lines = "\n".join(f"{letter}. {o}" for letter, o in zip(letters, options))
    tail = rng.choice(("Answer with the letter of the correct option.", "Choose one option.",
                       "Pick the right answer."))  # fmt: skip
    query = f"{ask(rng, e, attr)}\n{lines}\n{tail}"
    fact = state(rng, e, attr)
    lead = rng.choice((f"The options are {_join(options)}. I recall this fact: {fact}",
                       f"I need {ATTRS[attr].noun} of {e.name}. From memory: {fact}"))  # fmt: skip
    checks = [f"Option {letter}, {o}, {'matches' if o == v else 'does not match'}."
              for letter, o in zip(letters, options)]  # fmt: skip
    trace = "\n".join([lead] + checks + [f"So the answer is option {right}."])
    answer = rng.choice((f"{right}. {v}", f"The answer is {right}: {v}.", f"{right}"))
    return chat_document(query, trace, answer, "mcq", (right, v))


def ex_editing(rng: random.Random, w: World) -> Document:
    op = rng.randrange(5)
    names = [e.name for e in rng.sample(w.entities, rng.randint(3, 20))]
    listing = "\n".join(names)
    if op == 0:
        query = rng.choice(("Reverse the order of this list:", "Write this list backwards, last item first:"))
        query += "\n" + listing
        out = list(reversed(names))
        trace = f"The list has {len(names)} items. Reading from the last to the first: {_join(out)}."
        answer = "\n".join(out)
    elif op == 1:
        query = rng.choice(("Sort these names alphabetically:", "Put the following in alphabetical order:"))
        query += "\n" + listing
        out = sorted(names)
        trace = "Comparing first letters, then later letters where they tie: " + ", ".join(
            f"{n[0]} for {n}" for n in out
        ) + "."
        answer = "\n".join(out)
    elif op == 2:
        e = _entity(rng, w)
        text = " ".join(state(rng, e, a) for a in rng.sample(list(e.facts), rng.randint(1, 4)))
        query = f"Rewrite the following text in capital letters:\n\n{text}"
        trace = "I keep every word and every mark and change each letter to upper case."
        answer = text.upper()
    elif op == 3:
        e = rng.choice(w.people)
        new = rng.choice([p.name for p in w.people if p.name != e.name])
        text = " ".join(state(rng, e, a) for a in rng.sample(list(e.facts), rng.randint(2, 5)))
        count = text.count(e.name)
        query = rng.choice((f"In the text below, replace every \"{e.name}\" with \"{new}\".\n\n{text}",
                            f"Change the name {e.name} to {new} in this passage:\n{text}"))  # fmt: skip
        trace = (f"The name {e.name} appears {count} time{'s' if count != 1 else ''}. "
                 "I replace each occurrence and leave everything else unchanged.")
        answer = text.replace(e.name, new)
    else:
        query = rng.choice(("Turn this list into one sentence:", "Join these items into a sentence:"))
        query += "\n" + "\n".join(f"- {n}" for n in names)
        trace = f"There are {len(names)} items; I join them with commas and put 'and' before the last one."
        answer = f"The list names {_join(names)}."
    return chat_document(query, trace, answer, "editing", (answer.split("\n")[0],))


def ex_multihop(rng: random.Random, w: World) -> Document:
    p = rng.choice(w.people)
    chain = rng.choice((("birthplace", "country"), ("birthplace", "river"), ("mentor", "profession"),
                        ("mentor", "birthplace", "country"), ("mentor", "instrument"),
                        ("birthplace", "known_for")))  # fmt: skip
    hops: list[tuple[Entity, str]] = []
    e = p
    for attr in chain:
        hops.append((e, attr))
        v = e.facts[attr]
        if attr in ("mentor", "birthplace"):
            e = w.by_name[v]
    final = hops[-1][0].facts[hops[-1][1]]
    chain_facts = [state(rng, ent, attr) for ent, attr in hops]
    facts = _distractor_facts(rng, w, rng.randint(2, 25), {(ent.name, attr) for ent, attr in hops})
    for f in chain_facts:
        facts.insert(rng.randrange(len(facts) + 1), f)
    # The question names only the start of the chain and the last attribute.
    path = {
        ("birthplace", "country"): f"In which country was {p.name} born?",
        ("birthplace", "river"): f"Which river flows through the city where {p.name} was born?",
        ("mentor", "profession"): f"What is the profession of the person who trained {p.name}?",
        ("mentor", "birthplace", "country"): f"In which country was the teacher of {p.name} born?",
        ("mentor", "instrument"): f"Which instrument does the teacher of {p.name} play?",
        ("birthplace", "known_for"): f"What is the birthplace of {p.name} famous for?",
    }[chain]
    query = f"{rng.choice(('Facts:', 'Here are some notes.', 'Read carefully.'))}\n{_render_notes(rng, facts)}\n\n{path}"
    steps = []
    for i, ((ent, attr), f) in enumerate(zip(hops, chain_facts)):
        steps.append(f"Step {i + 1}: I need {ATTRS[attr].noun} of {ent.name}. The notes say: \"{f}\" "
                     f"So it is {ent.facts[attr]}.")
    trace = "\n".join(steps + [f"Following the chain, the answer is {final}."])
    answer = rng.choice((f"The answer is {final}.", f"{final}.", f"It is {final}, found by following the notes."))
    return chat_document(query, trace, answer, "multihop", (final,))


GENERATORS: dict[str, Callable[[random.Random, World], Document]] = {
    "memorization": ex_memorization,
    "rag": ex_rag,
    "math": ex_math,
    "mcq": ex_mcq,
    "editing": ex_editing,
    "multihop": ex_multihop,
}


# --------------------------------------------------------------------------- the stream


def document(cfg: SynthConfig, seed: int, index: int) -> Document:
    """Document `index` of the stream for `seed`: a pure function of its arguments."""
    rng = random.Random(seed * 2_147_483_659 + index)
    types = [t for t in EXERCISES if cfg.mix.get(t, 0.0) > 0]
    kind = rng.choices(types, [cfg.mix[t] for t in types])[0]
    return GENERATORS[kind](rng, world_for(cfg))


def documents(cfg: SynthConfig, seed: int, start: int = 0) -> Iterator[Document]:
    """The endless document stream for `seed`, from `start`."""
    index = start
    while True:
        yield document(cfg, seed, index)
        index += 1
