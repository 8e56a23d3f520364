"""The embedded default corpus: seeded SYNTH-format documents over a planted world.

SPEC §4: a user needs a corpus that runs offline in minutes and still shows the paper's
central contrast at tiny scale — tokens that only *parametric* knowledge can predict
versus tokens that can be read from the context. The generator plants a fixed "world"
(fictional people and cities with attributes; its size, in facts, is a knob) and writes
SYNTH-shaped exercises about it (SPEC §1.5, §1.6): a short, low-context user turn, a long
reasoning trace grounded in what came before, and an answer that states the result.
By default about 6% of tokens are query, 57% trace and 36% answer, as in SYNTH.

Recall types (`RECALL_TYPES`) need the weights: the trace states world facts that
nothing earlier in the document states, and only a model that has memorised the world
can predict them (their values cost nothing in the entropy floor: the world is fixed).

- memorization: a closed-book question; the trace recalls what it knows about the entity
  and picks out the asked facts, the answer states them;
- mcq: a world-fact question with lettered options; the trace recalls the fact and checks
  every option;
- multihop (this project's own type): a 2–3 hop question (person → teacher → birthplace →
  country); the trace retrieves notes (true world facts, the chain among distractors) and
  walks the chain, the answer is the last hop's value. Mixed: the notes are recall (a
  model that knows the world predicts them), the walk is read from them.

Context-grounded types carry their material in the document itself:

- rag: the trace retrieves records that exist only in this document (a market ledger of
  who bought what, how many, on which day) and reads the answer from them;
- math: a word problem worked step by step, with a check;
- math-mcq: an arithmetic question with numeric options; long multiplication by partial
  products, then each option compared with the result;
- cooking (procedural): a recipe retrieved in the trace, every amount scaled to the number
  of people asked for, the method written out;
- editing: reverse, sort, capitalise, rename or join short material given in the query,
  item by item in the trace (the one type whose material is in the query);
- constrained-writing: describe a person in exactly N words (the trace recalls facts,
  adds them while they fit and pads with filler; the answer is the N words);
- creative-writing: a short story about a person, planned in the trace (recalled facts and
  a plot of random beats) and told in the answer.

The two writing types open with a recalled profile too; what follows it is grounded in it.

Every document is a pure function of (world, seed, index), so the stream is indexable,
reproducible and needs no state. All randomness goes through `Draws`, which keeps the
log-probability of every draw by region: `Document.draw_nats` is the information the
generator put into each region of the document, the corpus's *entropy floor*
(`sanlab.data.floor`). The world itself is fixed, so a world fact costs nothing there: a
model that knew the world and every template perfectly would reach the floor exactly.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterator, Sequence, TypeVar

from pydantic import model_validator

from sanlab.config import StrictModel
from sanlab.data.regions import ANSWER, QUERY, REGION_NAMES, TRACE, Document, chat_document

T = TypeVar("T")

EXERCISES: tuple[str, ...] = (
    "memorization", "mcq", "multihop", "rag", "math", "math-mcq", "cooking", "editing",
    "constrained-writing", "creative-writing",
)  # fmt: skip
RECALL_TYPES: tuple[str, ...] = ("memorization", "mcq", "multihop")

# The default mix, as shares of documents (token shares follow document lengths;
# `sanlab prepare` prints them: about 23% memorization, 15% rag, 11% multihop, 9% math
# and creative writing, 7–8% mcq, cooking, editing and constrained writing, 4% math-mcq).
# About 40% of documents and tokens are recall types (what only the weights can predict:
# the paper's deficit sits there), the rest context-grounded, so both sides of the
# contrast get enough tokens for per-type deltas at CPU budgets. Memorization is the
# largest single type because it carries the most distinct world facts per document; rag
# and math, the paper's context-grounded examples, come next; the writing, cooking and
# editing types fill out SYNTH's nine. The mix also sets the region shares (query ≈ 6%,
# trace ≈ 57%, answer ≈ 36%; a test holds them within ±5 points of SYNTH's).
DEFAULT_MIX: dict[str, float] = {
    "memorization": 0.2,
    "mcq": 0.08,
    "multihop": 0.1,
    "rag": 0.14,
    "math": 0.12,
    "math-mcq": 0.06,
    "cooking": 0.08,
    "editing": 0.08,
    "constrained-writing": 0.07,
    "creative-writing": 0.07,
}
CITIES_PER_PERSON = 0.1  # the world's shape when it is sized by `facts`


class SynthConfig(StrictModel):
    """Size of the planted world and the mix of exercise types.

    `facts`, when set, sizes the world and `people` / `cities` are ignored: people and
    cities in a 10:1 ratio with about that many facts in all (6 per person, 4 per city),
    so a study can set facts per parameter (`World.n_facts` is the exact count). The default world (1000 people, 100 cities: 6400 facts) is
    large enough that no CPU-scale arm memorises it within a few million tokens.
    """

    people: int = 1000
    """People in the planted world (ignored when `facts` is set)."""
    cities: int = 100
    """Cities in the planted world (ignored when `facts` is set)."""
    countries: int = 12
    """Countries in the planted world."""
    facts: int | None = None
    """World size in facts (about 6 per person, 4 per city); overrides `people` / `cities`."""
    world_seed: int = 0
    """The world is fixed by this seed; the document stream by `prepare.seed`."""
    mix: dict[str, float] = DEFAULT_MIX
    """Relative weight of each exercise type (see `DEFAULT_MIX` for the names and the default)."""

    @model_validator(mode="after")
    def _check(self) -> "SynthConfig":
        if self.facts is not None and self.facts < 64:
            raise ValueError(f"facts must be at least 64, got {self.facts}")
        people, cities = self.world_size()
        if people < 10 or cities < 4 or self.countries < 2:
            raise ValueError("the world needs at least 10 people, 4 cities and 2 countries")
        if self.world_seed < 0:
            raise ValueError(f"world_seed must be non-negative, got {self.world_seed}")
        unknown = sorted(set(self.mix) - set(EXERCISES))
        if unknown:
            raise ValueError(f"mix: unknown exercise type {unknown[0]!r} (choose from {', '.join(EXERCISES)})")
        if any(not math.isfinite(w) or w < 0 for w in self.mix.values()) or sum(self.mix.values()) <= 0:
            raise ValueError("mix: weights must be finite, non-negative and not all zero")
        return self

    def world_size(self) -> tuple[int, int]:
        """(people, cities) of the world: from `facts` when it is set, else as given."""
        if self.facts is None:
            return self.people, self.cities
        people = max(10, round(self.facts / (6 + 4 * CITIES_PER_PERSON)))
        return people, max(4, round(people * CITIES_PER_PERSON))


# --------------------------------------------------------------------------- draws


class Draws:
    """A seeded random source that keeps the log-probability of every draw, by region.

    Generators get a `Draws`, never a bare `random.Random`, so no draw goes uncounted.
    Set `region` before drawing what that region's text will express; `nats[r]` is then
    −Σ log p(draw) over the draws charged to region r. Each method's log-probability is
    that of the value it returns (so `choice` over a tuple with repeats charges the
    value's total probability); `sample`, `shuffled` and `choice` over more than 256 items
    (the world's entity lists) assume distinct items.
    """

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self.nats = [0.0] * len(REGION_NAMES)
        self.region = QUERY

    def _charge(self, p: float) -> None:
        self.nats[self.region] -= math.log(p)

    def choice(self, seq: Sequence[T]) -> T:
        """A uniform pick from `seq`."""
        x = seq[self._rng.randrange(len(seq))]
        self._charge(seq.count(x) / len(seq) if len(seq) <= 256 else 1 / len(seq))
        return x

    def weighted(self, seq: Sequence[T], weights: Sequence[float]) -> T:
        """A pick from `seq` with probability proportional to `weights`."""
        x = self._rng.choices(seq, weights)[0]
        self._charge(sum(w for s, w in zip(seq, weights) if s == x) / sum(weights))
        return x

    def randint(self, a: int, b: int) -> int:
        """A uniform integer in [a, b]."""
        self._charge(1 / (b - a + 1))
        return self._rng.randint(a, b)

    def chance(self, p: float) -> bool:
        """True with probability p (0 < p < 1)."""
        hit = self._rng.random() < p
        self._charge(p if hit else 1 - p)
        return hit

    def sample(self, seq: Sequence[T], k: int) -> list[T]:
        """`k` distinct items of `seq` in random order (an ordered draw: n!/(n−k)! outcomes)."""
        n = len(seq)
        out = self._rng.sample(list(seq), k)
        self.nats[self.region] += math.lgamma(n + 1) - math.lgamma(n - k + 1)
        return out

    def shuffled(self, seq: Sequence[T]) -> list[T]:
        """The items of `seq` in a uniformly random order."""
        return self.sample(seq, len(seq))
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

BIRTH_YEARS = (1600, 1990)  # a person's birth year: uniform over this range (inclusive)
FOUNDED = (800, 1800)  # a city's founding year: uniform over this range (inclusive)

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

    @property
    def n_facts(self) -> int:
        """Facts the world holds: one per (entity, attribute)."""
        return sum(len(e.facts) for e in self.entities)

    def value_counts(self) -> dict[str, int]:
        """Attribute -> how many values `build_world` draws it from, uniformly (its own
        distributions: the same lists and ranges it draws with)."""
        return fact_domains(len(self.people), len(self.cities), len(self.countries), len(self.rivers))

    def information(self) -> dict[str, Any]:
        """The world's information content: each fact is an independent uniform draw from
        its attribute's values, so it carries log2(values) bits, and the world holds
        Σ over facts of log2(values) bits (the entities' names are not counted: they are
        the keys the facts are stored under, not facts).

        {"facts", "bits", "bits_per_fact" (their ratio), "attributes": {attr: {"facts",
        "values", "bits_per_fact"}}}."""
        counts = self.value_counts()
        per: dict[str, dict[str, Any]] = {}
        for e in self.entities:
            for attr in e.facts:
                row = per.setdefault(attr, {"facts": 0, "values": counts[attr],
                                            "bits_per_fact": math.log2(counts[attr])})
                row["facts"] += 1
        bits = sum(r["facts"] * r["bits_per_fact"] for r in per.values())
        n = self.n_facts
        return {"facts": n, "bits": bits, "bits_per_fact": bits / n if n else None, "attributes": per}


def fact_domains(people: int, cities: int, countries: int, rivers: int) -> dict[str, int]:
    """Attribute -> number of equally likely values `build_world` draws it from."""
    return {
        "birthplace": cities,
        "profession": len(PROFESSIONS),
        "birth_year": BIRTH_YEARS[1] - BIRTH_YEARS[0] + 1,
        "instrument": len(INSTRUMENTS),
        "animal": len(ANIMALS),
        "mentor": people - 1,  # anyone but the person: (i + randint(1, people − 1)) mod people
        "country": countries,
        "river": rivers,
        "founded": FOUNDED[1] - FOUNDED[0] + 1,
        "known_for": len(PRODUCTS),
    }


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
                "founded": str(rng.randint(*FOUNDED)),
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
                    "birth_year": str(rng.randint(*BIRTH_YEARS)),
                    "instrument": rng.choice(INSTRUMENTS),
                    "animal": rng.choice(ANIMALS),
                    "mentor": mentor,
                },
            )
        )
    return World(tuple(people_entities), city_entities, tuple(country_names), tuple(river_names))


def world_for(cfg: SynthConfig) -> World:
    return build_world(*cfg.world_size(), cfg.countries, cfg.world_seed)


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


def state(rng: random.Random | Draws, e: Entity, attr: str) -> str:
    """One fact of the world as a sentence, in a random paraphrase."""
    v = e.facts[attr]
    return rng.choice(ATTRS[attr].statements).format(e=e.name, v=v, av=_a(v))


def ask(rng: random.Random | Draws, e: Entity, attr: str) -> str:
    return rng.choice(ATTRS[attr].questions).format(e=e.name)




def _entity(d: Draws, w: World, person_share: float = 0.7) -> Entity:
    return d.choice(w.people) if d.chance(person_share) else d.choice(w.cities)


def _join(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _render_list(d: Draws, lines: Sequence[str]) -> str:
    """Lines as a bulleted or numbered list (the style is a draw)."""
    if d.chance(0.5):
        return "\n".join(f"- {x}" for x in lines)
    return "\n".join(f"{i + 1}. {x}" for i, x in enumerate(lines))


# --------------------------------------------------------------------------- recall types

_MEMO_PREAMBLES = ("", "", "Quick question. ", "From memory: ")


def ex_memorization(d: Draws, w: World) -> Document:
    d.region = QUERY
    e = _entity(d, w)
    attrs = d.sample(list(e.facts), d.weighted((1, 2), (0.7, 0.3)))
    query = d.choice(_MEMO_PREAMBLES) + " ".join(ask(d, e, a) for a in attrs)

    d.region = TRACE
    what = "a person" if e.kind == "person" else "a city"
    nouns = _join([ATTRS[a].noun for a in attrs])
    opener = d.choice((f"The question is about {e.name}, {what} of this world.", f"This asks for {nouns} of {e.name}.",
                       f"{e.name} is {what} I should know about."))  # fmt: skip
    closed = d.choice(("Nothing is given to read, so the answer has to come from memory.",
                       "No notes or passages come with the question; I have to recall it.",
                       "This is a closed-book question."))  # fmt: skip
    lead = d.choice((f"What I remember about {e.name}:", f"Let me recall everything I know about {e.name}.",
                     f"Recalling {e.name}:"))  # fmt: skip
    recalled = d.shuffled(list(e.facts))
    memory = _render_list(d, [state(d, e, a) for a in recalled])
    parts = [f"{opener} {closed}", f"{lead}\n{memory}"]
    if e.kind == "person":
        home = w.by_name[e.facts["birthplace"]]
        parts.append(f"And about {home.name}, where {e.name} was born: {state(d, home, 'country')}")
    picked = " ".join(state(d, e, a) for a in attrs)
    parts.append(f"The question asks for {nouns}. From what I recalled: {picked}")
    parts.append(d.choice((f"I will state {'it' if len(attrs) == 1 else 'them'} plainly and add a little context.",
                           f"I answer in full sentences, naming {e.name}.", "I keep the answer short and exact.")))  # fmt: skip
    trace = "\n".join(parts)

    d.region = ANSWER
    answer = d.choice(("", "Here is what I know. ", "From memory: ", "Certainly. ")) + " ".join(state(d, e, a) for a in attrs)
    others = [a for a in recalled if a not in attrs]
    context = d.sample(others, d.randint(2, len(others)))
    answer += "\n\n" + d.choice(("For context: ", "Some background: ", "A little more about them: " if e.kind == "person"
                                  else "A little more about the city: ")) + " ".join(state(d, e, a) for a in context)
    if e.kind == "person" and d.chance(0.5):
        home = w.by_name[e.facts["birthplace"]]
        answer += f" {home.name}, where {e.name} was born, lies in {home.facts['country']}."
    answer += "\n\n" + d.choice(("I am recalling this from memory; nothing in the question states it.",
                                  f"Let me know if you need anything else about {e.name}."))
    answer += f" So, in short: {' '.join(state(d, e, a) for a in attrs)}"
    return chat_document(query, trace, answer, "memorization", tuple(e.facts[a] for a in attrs), d.nats)


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
LETTERS = "ABCDE"


def ex_mcq(d: Draws, w: World) -> Document:
    d.region = QUERY
    e = _entity(d, w)
    attr = d.choice([a for a in e.facts if a in _MCQ_POOLS])
    v = e.facts[attr]
    k = d.choice((3, 4))
    wrong = d.sample([o for o in _MCQ_POOLS[attr](w) if o != v and o != e.name], k - 1)
    pos = d.randint(0, k - 1)
    options = wrong[:pos] + [v] + wrong[pos:]
    right = LETTERS[pos]
    lines = "\n".join(f"{letter}. {o}" for letter, o in zip(LETTERS, options))
    query = f"{ask(d, e, attr)}\n{lines}\n" + d.choice(("Answer with the letter.", "Choose one option.", "Pick the right answer."))

    d.region = TRACE
    noun = ATTRS[attr].noun
    recall = d.choice(("I recall this fact: ", "From memory: ", f"What I know about {e.name}: ")) + state(d, e, attr)
    extra = d.choice([a for a in e.facts if a != attr])
    checks = [f"Option {letter}, {o}: {'this is ' + noun + ' I recalled, so it matches' if o == v else 'this is not ' + noun + ' of ' + e.name}."
              for letter, o in zip(LETTERS, options)]  # fmt: skip
    trace = "\n".join([f"I need {noun} of {e.name}. The options are {_join(options)}.",
                       f"{recall} I also remember that {state(d, e, extra)}", "Checking each option:", *checks,
                       f"Only option {right} fits, so the answer is {right}."])  # fmt: skip

    d.region = ANSWER
    answer = d.choice((f"The answer is {right}: {v}.", f"{right}. {v}.", f"Option {right}, {v}.")) + " " + state(d, e, attr)
    answer += f" The other options, {_join(wrong)}, do not match {noun} of {e.name}."
    answer += "\n\n" + d.choice((f"I answered from memory: I recalled {noun} of {e.name} and compared it with each option.",
                                  f"Nothing in the question says which is right; I recalled {noun} of {e.name}."))
    answer += f" For context: {state(d, e, extra)} So the right letter is {right}."
    return chat_document(query, trace, answer, "mcq", (right, v), d.nats)


# (attributes followed from the person, question naming only the start and the last attribute)
_CHAINS: dict[tuple[str, ...], str] = {
    ("birthplace", "country"): "In which country was {p} born?",
    ("birthplace", "river"): "Which river flows through the city where {p} was born?",
    ("mentor", "profession"): "What is the profession of the person who trained {p}?",
    ("mentor", "birthplace", "country"): "In which country was the teacher of {p} born?",
    ("mentor", "instrument"): "Which instrument does the teacher of {p} play?",
    ("birthplace", "known_for"): "What is the birthplace of {p} famous for?",
    ("mentor", "mentor", "profession"): "What is the trade of the teacher of the teacher of {p}?",
}


def multihop_chain(w: World, person: Entity, chain: Sequence[str]) -> list[tuple[Entity, str, str]]:
    """The hops of a chain from `person`: (entity, attribute, value), following the world."""
    hops, e = [], person
    for attr in chain:
        v = e.facts[attr]
        hops.append((e, attr, v))
        if attr in ("mentor", "birthplace"):
            e = w.by_name[v]
    return hops


def ex_multihop(d: Draws, w: World) -> Document:
    d.region = QUERY
    p = d.choice(w.people)
    chain = d.choice(tuple(_CHAINS))
    query = _CHAINS[chain].format(p=p.name)
    hops = multihop_chain(w, p, chain)
    final = hops[-1][2]

    d.region = TRACE
    in_chain = {ent.name for ent, _, _ in hops}
    pool = [e for e in w.entities if e.name not in in_chain]
    notes = [state(d, e, d.choice(list(e.facts))) for e in d.sample(pool, d.randint(1, 4))]
    where: list[int] = []
    for ent, attr, _ in hops:  # each chain fact goes in at a random place among the notes so far
        i = d.randint(0, len(notes))
        notes.insert(i, state(d, ent, attr))
        where = [j + (j >= i) for j in where] + [i]
    lead = d.choice(("To answer, I follow a chain of facts, one hop at a time.",
                     "This needs several facts in a row. I retrieve notes that may help.",
                     f"The question starts from {p.name}; I look up each link."))  # fmt: skip
    steps = [f"Step {s + 1}: I need {ATTRS[attr].noun} of {ent.name}. Note {where[s] + 1} says: \"{notes[where[s]]}\" So it is {v}."
             for s, (ent, attr, v) in enumerate(hops)]  # fmt: skip
    trace = "\n".join([lead, "Retrieved notes:", "\n".join(f"{i + 1}. {n}" for i, n in enumerate(notes)), *steps,
                       f"Following the chain, the answer is {final}."])  # fmt: skip

    d.region = ANSWER
    answer = d.choice((f"The answer is {final}.", f"{final}.", f"It is {final}."))
    answer += "\n\n" + d.choice(("The chain: ", "Here is why: ", "Step by step: ")) + " ".join(
        f"{'First' if i == 0 else 'Then'}, {ATTRS[attr].noun} of {ent.name} is {v}." for i, (ent, attr, v) in enumerate(hops))
    unused = [n for i, n in enumerate(notes) if i not in where]
    answer += f" The other note{'s' if len(unused) > 1 else ''} ({' '.join(unused)}) {'are' if len(unused) > 1 else 'is'} not part of the chain."
    answer += "\n\n" + d.choice((f"So the answer to \"{query}\" is {final}.", f"Following the notes from {p.name}, I arrive at {final}."))
    return chat_document(query, trace, answer, "multihop", (final,), d.nats)


# --------------------------------------------------------------------------- context-grounded types

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_LEDGER_ENTRY = ("On {day}, {q} bought {n} {item}.", "{q} bought {n} {item} on {day}.", "{day}: {q}, {n} {item}.")
_RAG_QUESTIONS = {
    "count": ("How many {item} did {p} buy at the {c} market?", "At the {c} market, how many {item} did {p} get?"),
    "what": ("What did {p} buy at the {c} market?", "What did {p} get at the {c} market this week?"),
    "day": ("On which day did {p} shop at the {c} market?", "When did {p} go to the {c} market?"),
}


def ex_rag(d: Draws, w: World) -> Document:
    """Records that exist only in this document, retrieved in the trace and read there."""
    d.region = QUERY
    p, c = d.choice(w.people), d.choice(w.cities)
    kind = d.choice(tuple(_RAG_QUESTIONS))
    item = d.choice(ITEMS) if kind == "count" else None
    query = d.choice(_RAG_QUESTIONS[kind]).format(p=p.name, c=c.name, item=item)

    d.region = TRACE
    if item is None:
        item = d.choice(ITEMS)
    n, day = d.randint(2, 60), d.choice(DAYS)
    others = d.sample([q for q in w.people if q is not p], d.randint(2, 6))
    rows = [(q.name, d.randint(2, 60), d.choice(ITEMS), d.choice(DAYS)) for q in others]
    pos = d.randint(0, len(rows))
    rows.insert(pos, (p.name, n, item, day))
    entries = [d.choice(_LEDGER_ENTRY).format(q=q, n=k, item=it, day=dy) for q, k, it, dy in rows]
    lead = d.choice((f"I search the records of the {c.name} market.", f"Let me retrieve the {c.name} market ledger for the week.",
                     f"The question is about the market ledger of {c.name}; I look it up."))  # fmt: skip
    result = {"count": str(n), "what": f"{n} {item}", "day": day}[kind]
    parts = [lead, f"Retrieved {len(rows)} entries:", "\n".join(f"{i + 1}. {x}" for i, x in enumerate(entries)),
             f"The entry about {p.name} is number {pos + 1}: \"{entries[pos]}\"",
             f"It says that on {day}, {p.name} bought {n} {item}."]  # fmt: skip
    parts.append(f"So the answer is {result}.")
    trace = "\n".join(parts)

    d.region = ANSWER
    answer = d.choice((f"According to the {c.name} market ledger, {p.name} bought {n} {item} on {day}.",
                       f"{p.name} bought {n} {item} at the {c.name} market on {day}, as the ledger records."))  # fmt: skip
    answer += f"\n\nThe ledger has {len(rows)} entries for the week; the one about {p.name} is entry {pos + 1}, which says: \"{entries[pos]}\""
    answer += f" The other entries are about {_join([q.name for q in others])}, so they do not matter here."
    answer += "\n\n" + d.choice((f"So the answer is {result}.", f"In short: {result}.", f"The answer to your question is {result}."))
    return chat_document(query, trace, answer, "rag", (result,), d.nats)


def _mul(a: int, b: int) -> str:
    """a × b worked by partial products when b has two digits."""
    if b < 10:
        return f"{a} × {b} = {a * b}."
    tens, ones = b - b % 10, b % 10
    if ones == 0:
        return f"{a} × {b} = {a} × {b // 10} × 10 = {a * (b // 10)} × 10 = {a * b}."
    return f"{a} × {b} = {a} × {tens} + {a} × {ones} = {a * tens} + {a * ones} = {a * b}."


def _math_problem(d: Draws, w: World) -> tuple[str, list[str], str, int]:
    """(question, worked steps, answer sentence, result); the question's draws are QUERY's."""
    d.region = QUERY
    kind = d.randint(0, 4)
    # Only what the question names is drawn: an unused draw would not show in the text.
    p = d.choice(w.people).name if kind in (0, 1, 3) else ""
    c = d.choice(w.cities).name if kind in (2, 4) else ""
    item = d.choice(ITEMS) if kind in (0, 1, 3) else ""
    if kind == 0:
        a, b = d.randint(3, 60), d.randint(2, 24)
        s = d.randint(1, a * b - 1)
        r = a * b - s
        q = f"{p} makes {a} {item} a day for {b} days and sells {s}. How many are left?"
        steps = [f"Known: {a} {item} a day, for {b} days; {s} sold.", f"Made in {b} days: {_mul(a, b)}",
                 f"Left after selling: {a * b} − {s} = {r}.", f"Check: {r} + {s} = {a * b}, which matches."]  # fmt: skip
        return q, steps, f"{r} {item} are left. In {b} days the workshop makes {a * b}, and {a * b} − {s} = {r} remain.", r
    if kind == 1:
        a, b = d.randint(2, 20), d.randint(3, 24)
        s = d.randint(1, a * b - 1)
        e = d.randint(1, 50)
        r = a * b - s + e
        q = f"{p} buys {a} crates of {b} {item}, gives away {s}, then buys {e} more. How many now?"
        steps = [f"Known: {a} crates of {b}; {s} given away; {e} bought later.", f"Bought at first: {_mul(a, b)}",
                 f"After giving some away: {a * b} − {s} = {a * b - s}.", f"After buying more: {a * b - s} + {e} = {r}.",
                 f"Check: {r} − {e} + {s} = {a * b}, which matches."]  # fmt: skip
        return q, steps, f"{p} now has {r} {item}: {a * b} at first, {a * b - s} after giving {s} away, and {e} more.", r
    if kind == 2:
        b, n = d.randint(5, 40), d.randint(2, 9)
        extra = d.randint(1, 300)
        a = b * n + extra
        c2 = d.choice([x.name for x in w.cities if x.name != c])
        q = f"{c} to {c2} is {a} km. Walking {b} km a day, how many km are left after {n} days?"
        steps = [f"Known: {a} km in all; {b} km a day; {n} days.", f"Walked in {n} days: {_mul(b, n)}",
                 f"Left: {a} − {b * n} = {extra}.", f"Check: {b * n} + {extra} = {a}, which matches."]  # fmt: skip
        return q, steps, f"{extra} km are left: walking {b * n} km in {n} days leaves {a} − {b * n} = {extra}.", extra
    if kind == 3:
        b = d.randint(2, 12)
        a = d.randint(b + 1, 400)
        q = f"{p} shares {a} {item} equally among {b} friends. How many each, and how many left?"
        steps = [f"Known: {a} {item}, {b} friends.", f"Divide: {a} ÷ {b} = {a // b} with remainder {a % b}.",
                 f"Check: {_mul(a // b, b)[:-1]}, and {a // b * b} + {a % b} = {a}."]  # fmt: skip
        return q, steps, f"Each friend gets {a // b}, and {a % b} are left over, since {a // b} × {b} + {a % b} = {a}.", a // b
    n = d.randint(3, 8)
    xs = [d.randint(10, 500) for _ in range(n)]
    q = f"Visitors to {c} on {n} days: {', '.join(map(str, xs))}. How many in total?"
    steps, total = [f"Known: {n} daily counts to add."], 0
    for i, x in enumerate(xs):
        steps.append(f"Day {i + 1}: {total} + {x} = {total + x}." if i else f"Day 1: {x}.")
        total += x
    steps.append(f"Check: there are {n} numbers, and I added each once.")
    return q, steps, f"In total {total} visitors came over the {n} days.", total


def ex_math(d: Draws, w: World) -> Document:
    q, steps, answer, result = _math_problem(d, w)
    if d.chance(0.2):
        q = d.choice(("Solve this. ", "Help with some arithmetic. ")) + q
    d.region = TRACE
    lead = d.choice(("Let me work through this step by step.", "I will compute this in steps.", "Break the problem into steps."))
    trace = "\n".join([lead, *steps, f"The result is {result}."])
    d.region = ANSWER
    working = " ".join(x for x in steps if not x.startswith(("Known", "Check")))
    answer = (d.choice(("", "Here is the solution. ")) + answer + "\n\n" + d.choice(("Working: ", "How I got there: "))
              + working + "\n\n" + d.choice((f"So the answer is {result}.", f"The result is {result}.", f"Answer: {result}.")))
    return chat_document(q, trace, answer, "math", (str(result),), d.nats)


def ex_math_mcq(d: Draws, w: World) -> Document:
    d.region = QUERY
    a, b = d.randint(12, 99), d.randint(3, 99)
    plus = d.chance(0.5)
    ab = a * b
    c = d.randint(1, 99 if plus else min(99, ab - 1))
    r = ab + c if plus else ab - c
    op = "+" if plus else "−"
    cands = sorted({r + s * x for x in (1, 10, 100, a, b, 2 * c) for s in (1, -1)} - {r})
    k = d.choice((3, 4))
    wrong = d.sample([x for x in cands if x > 0], k - 1)
    pos = d.randint(0, k - 1)
    options = wrong[:pos] + [r] + wrong[pos:]
    right = LETTERS[pos]
    lines = "\n".join(f"{letter}. {o}" for letter, o in zip(LETTERS, options))
    query = d.choice((f"What is {a} × {b} {op} {c}?", f"Compute {a} × {b} {op} {c}.")) + "\n" + lines

    d.region = TRACE
    lead = d.choice(("First the product, then the rest.", "I work it out before looking at the options."))
    checks = [f"Option {letter}: {o} {'equals' if o == r else 'is not'} {r}." for letter, o in zip(LETTERS, options)]
    trace = "\n".join([lead, f"Product: {_mul(a, b)}", f"Then {'add' if plus else 'subtract'} {c}: {ab} {op} {c} = {r}.",
                       "Checking the options:", *checks, f"So the answer is {right}."])  # fmt: skip

    d.region = ANSWER
    answer = d.choice((f"The answer is {right}: {r}.", f"{right}. {r}.")) + f"\n\n{_mul(a, b)} Then {ab} {op} {c} = {r}."
    answer += f"\n\nOf the options, only {right} equals {r}; {_join([str(x) for x in wrong])} do not."
    return chat_document(query, trace, answer, "math-mcq", (right, str(r)), d.nats)


DISHES: dict[str, str] = {
    "honey bread": "bake", "plum cake": "bake", "onion tart": "bake", "oat biscuits": "bake", "apple dumplings": "bake",
    "lentil soup": "pot", "fish stew": "pot", "barley porridge": "pot", "bean stew": "pot", "pea soup": "pot",
}  # fmt: skip
# (ingredient, unit, step): a base amount is step × 1..8 units
INGREDIENTS: dict[str, tuple[tuple[str, str, int], ...]] = {
    "bake": (("flour", "g", 50), ("butter", "g", 25), ("sugar", "g", 25), ("milk", "ml", 50), ("eggs", "", 1),
             ("honey", "g", 20), ("salt", "pinch", 1), ("oats", "g", 40), ("plums", "", 2), ("apples", "", 1),
             ("yeast", "g", 5), ("onions", "", 1)),
    "pot": (("lentils", "g", 50), ("water", "ml", 250), ("onions", "", 1), ("carrots", "", 1), ("salt", "pinch", 1),
            ("barley", "g", 40), ("beans", "g", 50), ("fish", "g", 100), ("peas", "g", 50), ("butter", "g", 25),
            ("leeks", "", 1), ("milk", "ml", 100)),
}  # fmt: skip
METHODS: dict[str, tuple[tuple[str, ...], ...]] = {
    "bake": (("Mix the dry ingredients in a bowl.", "Sift the flour into a bowl with the salt."),
             ("Rub in the butter until it looks like crumbs.", "Stir in the wet ingredients."),
             ("Knead or fold until smooth.", "Rest the mixture for {rest} minutes."),
             ("Bake at {temp} degrees for {time} minutes.",)),
    "pot": (("Chop everything that needs chopping.", "Wash and chop the vegetables."),
            ("Soften them in the pot for {rest} minutes.", "Rinse anything dried and drain it."),
            ("Add the liquid and bring it to the boil.", "Cover with the liquid and heat until it bubbles."),
            ("Simmer for {time} minutes, stirring now and then.",)),
}  # fmt: skip
_SERVES_FOR = {2: (1, 2), 3: (1, 3), 4: (1, 2, 4), 6: (1, 2, 3), 8: (1, 2, 4), 10: (1, 2), 12: (1, 2, 3, 4)}


def _amount(n: int, unit: str, name: str) -> str:
    if unit == "pinch":
        return f"{n} pinch{'es' if n > 1 else ''} of {name}"
    return f"{n} {name}" if not unit else f"{n} {unit} {name}"


def ex_cooking(d: Draws, w: World) -> Document:
    """A procedural type: a recipe retrieved in the trace, scaled to the people asked for."""
    d.region = QUERY
    dish = d.choice(tuple(DISHES))
    people = d.choice(tuple(_SERVES_FOR))
    form = d.choice(("How do I make {dish} for {people} people?", "I need {dish} for {people}. What do I do?",
                     "Give me {cook}'s recipe for {dish}, for {people} people."))  # fmt: skip
    cook = d.choice(w.people).name if "{cook}" in form else ""
    query = form.format(dish=dish, people=people, cook=cook)

    d.region = TRACE
    style = DISHES[dish]
    base = d.choice(_SERVES_FOR[people])
    factor = people // base
    chosen = d.sample(INGREDIENTS[style], d.randint(4, 6))
    amounts = [(name, unit, step * d.randint(1, 8)) for name, unit, step in chosen]
    method = [d.choice(options) for options in METHODS[style]]
    text = "".join(method)  # temperatures and times are drawn only for the steps that state them
    temp = d.choice((160, 180, 200, 220)) if "{temp}" in text else 0
    time_ = 5 * d.randint(3, 12) if "{time}" in text else 0
    rest = 5 * d.randint(1, 4) if "{rest}" in text else 0
    method = [m.format(temp=temp, time=time_, rest=rest) for m in method]
    parts = [d.choice((f"I look up a recipe for {dish}.", f"Let me retrieve a good {dish} recipe.")),
             f"The recipe serves {base}. Ingredients:", "\n".join(f"- {_amount(n, u, x)}" for x, u, n in amounts),
             "Method:", "\n".join(f"{i + 1}. {m}" for i, m in enumerate(method))]  # fmt: skip
    if factor == 1:
        parts.append(f"The recipe already serves {people}, so the amounts stay as they are.")
    else:
        parts.append(f"The question asks for {people} people, so I multiply every amount by {people} ÷ {base} = {factor}.")
        parts += [f"{x}: {n} × {factor} = {n * factor}." for x, u, n in amounts]
    parts.append("The method stays the same; only the amounts change.")
    trace = "\n".join(parts)

    d.region = ANSWER
    lines = "\n".join(f"- {_amount(n * factor, u, x)}" for x, u, n in amounts)
    steps = "\n".join(f"{i + 1}. {m}" for i, m in enumerate(method))
    answer = f"To make {dish} for {people} people you need:\n{lines}\nMethod:\n{steps}"
    if d.chance(0.4):
        answer += "\n" + d.choice((f"Enjoy your {dish}.", "Serve it warm.", "It keeps for a day or two."))
    return chat_document(query, trace, answer, "cooking", tuple(str(n * factor) for _, _, n in amounts), d.nats)


def ex_editing(d: Draws, w: World) -> Document:
    d.region = QUERY
    op = d.choice(("reverse", "sort", "upper", "replace", "join"))
    if op in ("reverse", "sort", "join"):
        names = [e.name for e in d.sample(w.entities, d.randint(3, 6))]
        ask_ = {"reverse": ("Reverse this list:", "Write this list backwards:"),
                "sort": ("Sort these alphabetically:", "Put these in alphabetical order:"),
                "join": ("Join these into one sentence:", "Make one sentence of this list:")}[op]  # fmt: skip
        query = d.choice(ask_) + " " + "; ".join(names) + "."
        d.region = TRACE
        listing = "\n".join(f"{i + 1}. {n}" for i, n in enumerate(names))
        if op == "reverse":
            out = names[::-1]
            walk = [f"Item {len(names) - i} is {n}." for i, n in enumerate(out)]
            trace = "\n".join([f"The list has {len(names)} items:", listing, "Reading from the last to the first:", *walk,
                               f"So the reversed list is {'; '.join(out)}."])  # fmt: skip
            head = "Here is the list in reverse order:"
        elif op == "sort":
            out = sorted(names)
            walk = [f"{n} starts with {n[0]}." for n in names]
            trace = "\n".join([f"The list has {len(names)} items:", listing, *walk,
                               "Ordering by first letter, and by later letters where they tie:",
                               *(f"{i + 1}. {n}" for i, n in enumerate(out))])  # fmt: skip
            head = "Here is the list in alphabetical order:"
        else:
            out = [f"The list names {_join(names)}."]
            trace = "\n".join([f"The list has {len(names)} items:", listing,
                               "I join them with commas and put 'and' before the last one.",
                               f"Result: {out[0]}"])  # fmt: skip
            head = ""
        d.region = ANSWER
        body = "\n".join(out)
        answer = f"{head}\n{body}" if head else body
        answer += "\n\n" + {"reverse": f"The list had {len(names)} items; I wrote them from the last to the first.",
                             "sort": f"I ordered the {len(names)} names by their letters, first to last.",
                             "join": f"I joined the {len(names)} items with commas and 'and' before the last."}[op]
        return chat_document(query, trace, answer, "editing", (out[0],), d.nats)

    e = d.choice(w.people)
    facts = d.sample(list(e.facts), d.randint(1, 2) if op == "upper" else 2)
    text = " ".join(state(d, e, a) for a in facts)
    if op == "upper":
        query = d.choice(("Rewrite in capital letters: ", "Put this in upper case: ")) + text
        d.region = TRACE
        words = text.split()
        trace = "\n".join([f"The text has {len(words)} words. I change every letter to upper case and keep every mark.",
                           *(f"{x} becomes {x.upper()}" for x in words)])  # fmt: skip
        result = text.upper()
    else:
        new = d.choice([p.name for p in w.people if p.name != e.name])
        query = d.choice((f"Replace {e.name} with {new} in: ", f"Change {e.name} to {new}: ")) + text
        d.region = TRACE
        count = text.count(e.name)
        result = text.replace(e.name, new)
        sentences = [s.strip() + "." for s in text.split(".") if s.strip()]
        trace = "\n".join([f"The name {e.name} appears {count} time{'s' if count != 1 else ''}. I replace each one "
                           "and leave everything else unchanged.",
                           *(f"Sentence {i + 1}: {s} becomes: {s.replace(e.name, new)}" for i, s in enumerate(sentences))])  # fmt: skip
    d.region = ANSWER
    answer = d.choice(("", "Here is the edited text:\n")) + result
    answer += "\n\n" + (f"Every letter is now upper case; the words and marks are unchanged." if op == "upper" else
                         f"I replaced {e.name} with {new} and changed nothing else.")
    return chat_document(query, trace, answer, "editing", (result,), d.nats)


_FILLER = {1: "Truly.", 2: "Quite remarkable.", 3: "Everyone knows this.", 4: "That is worth knowing."}


def filler(n: int) -> str:
    """Exactly `n` words of closing filler (deterministic: no draw)."""
    parts = [_FILLER[4]] * (n // 4) + ([_FILLER[n % 4]] if n % 4 else [])
    return " ".join(parts)


def ex_constrained_writing(d: Draws, w: World) -> Document:
    d.region = QUERY
    e = d.choice(w.people)
    target = d.randint(14, 36)
    query = d.choice((f"Describe {e.name} in exactly {target} words.", f"Write exactly {target} words about {e.name}.",
                      f"In {target} words exactly, tell me about {e.name}."))  # fmt: skip

    d.region = TRACE
    order = d.shuffled(list(e.facts))
    sentences = [state(d, e, a) for a in order]
    parts = [f"I need exactly {target} words about {e.name}.", f"What I recall about {e.name}:",
             "\n".join(f"- {s}" for s in sentences), "I add the facts in this order while they fit."]  # fmt: skip
    kept: list[str] = []
    total = 0
    for s in sentences:
        n = len(s.split())
        if total + n > target:
            parts.append(f"Fact {len(kept) + 1} has {n} words; {total} + {n} = {total + n} is too many, so I stop.")
            break
        total += n
        kept.append(s)
        parts.append(f"Fact {len(kept)} has {n} words; {total} so far.")
    missing = target - total
    if missing:
        parts.append(f"{missing} word{'s are' if missing > 1 else ' is'} missing, so I add: \"{filler(missing)}\"")
        kept.append(filler(missing))
    text = " ".join(kept)
    counts = [len(x.split()) for x in kept]
    parts.append(f"Final count: {' + '.join(map(str, counts))} = {sum(counts)} words, as asked.")
    trace = "\n".join(parts)

    d.region = ANSWER
    return chat_document(query, trace, text, "constrained-writing", (str(target),), d.nats)


_OPENINGS = ("{p} lived in {home}, where the {product} draw visitors all year.",
             "Every morning {p} walked through {home}, past the {product}.",
             "In {home}, a city known for its {product}, there lived {a_prof} called {p}.")
_TROUBLES = ("One {season} day the {animal} ran off with a bag of {item}.",
             "One {season} night a storm broke the roof over the {instrument}.",
             "One {season} a rival {prof} came to town and took all the work.",
             "One {season} the {item} that {p} had made for the fair went missing.")
_TURNS = ("{p} played the {instrument} until the whole street came to listen.",
          "{p} remembered what {mentor} had once taught and tried again.",
          "The {animal} came back at dusk, proud and muddy.",
          "Friends from across {home} came to help.")
_ENDINGS = ("By the end of the {season}, everything was better than before.",
            "From then on, {p} kept the {animal} close and the {instrument} tuned.",
            "And {p} went back to work as {a_prof}, a little wiser.")
SEASONS = ("spring", "summer", "autumn", "winter")


def ex_creative_writing(d: Draws, w: World) -> Document:
    d.region = QUERY
    p = d.choice(w.people)
    form = d.choice(("story", "tale", "fable"))
    query = d.choice((f"Write a short {form} about {p.name}.", f"Tell me a {form} about {p.name}.",
                      f"I would like a {form} with {p.name} in it."))  # fmt: skip

    d.region = TRACE
    f = p.facts
    home = w.by_name[f["birthplace"]]
    recalled = d.shuffled(["profession", "instrument", "animal", "birthplace", "mentor"])
    plot = [d.choice(group) for group in (_OPENINGS, _TROUBLES, _TURNS, _ENDINGS)]
    fields = {"p": p.name, "home": home.name, "product": home.facts["known_for"], "prof": f["profession"],
              "a_prof": _a(f["profession"]), "animal": f["animal"], "instrument": f["instrument"],
              "mentor": f["mentor"], "season": d.choice(SEASONS),  # every trouble names a season
              "item": d.choice(ITEMS) if "{item}" in "".join(plot) else ""}  # fmt: skip
    beats = [b.format(**fields) for b in plot]
    tone = d.choice(("warm", "funny", "quiet"))
    trace = "\n".join([f"A {form} about {p.name}. First, what I know about {p.name}:",
                       "\n".join(f"- {state(d, p, a)}" for a in recalled),
                       f"- {state(d, home, 'known_for')}",
                       f"The setting is {home.name}. The tone will be {tone}. Plan:",
                       "\n".join(f"{i + 1}. {b}" for i, b in enumerate(beats)),
                       "I tell the beats in this order, one short paragraph each."])  # fmt: skip

    d.region = ANSWER
    title = d.choice((f"The {f['animal'].capitalize()} of {home.name}", f"{p.name} and the {f['instrument'].capitalize()}", ""))
    links = [d.choice(("It was a good life, and a busy one.", "Nobody expected what came next.")),
             d.choice(("At first nobody knew what to do.", "It was a hard time for everyone.")),
             d.choice(("Slowly, things began to change.", "Then came the best part of the year.")),
             d.choice((f"People in {home.name} still tell this {form}.", "And that is how it ended."))]  # fmt: skip
    body = "\n\n".join(b + (" " + x.strip() if x else "") for b, x in zip(beats, links))
    answer = (f"{title}\n\n" if title else "") + body
    return chat_document(query, trace, answer, "creative-writing", tuple(beats), d.nats)


GENERATORS: dict[str, Callable[[Draws, World], Document]] = {
    "memorization": ex_memorization,
    "mcq": ex_mcq,
    "multihop": ex_multihop,
    "rag": ex_rag,
    "math": ex_math,
    "math-mcq": ex_math_mcq,
    "cooking": ex_cooking,
    "editing": ex_editing,
    "constrained-writing": ex_constrained_writing,
    "creative-writing": ex_creative_writing,
}


# --------------------------------------------------------------------------- the stream


def document(cfg: SynthConfig, seed: int, index: int) -> Document:
    """Document `index` of the stream for `seed`: a pure function of its arguments.

    The exercise type's draw is charged to the query, whose wording reveals it.
    """
    d = Draws(seed * 2_147_483_659 + index)
    types = [t for t in EXERCISES if cfg.mix.get(t, 0.0) > 0]
    kind = d.weighted(types, [cfg.mix[t] for t in types]) if len(types) > 1 else types[0]
    return GENERATORS[kind](d, world_for(cfg))


def documents(cfg: SynthConfig, seed: int, start: int = 0) -> Iterator[Document]:
    """The endless document stream for `seed`, from `start`."""
    index = start
    while True:
        yield document(cfg, seed, index)
        index += 1
