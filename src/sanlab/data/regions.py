"""The document format: special tokens, regions, and documents as region-tagged spans.

Every token the trainer sees carries one region (SPEC §1.6), so the loss gap between two
architectures can be split into where it comes from:

    OTHER  (0)  BOS / EOS / chat markers (`<|im_start|>`, `<|im_end|>`, `<think>`,
                `</think>`) and the newline between two turns
    QUERY  (1)  the user turn, including its role header `user\\n`
    TRACE  (2)  everything inside `<think> … </think>`
    ANSWER (3)  assistant text outside the trace, including its role header `assistant\\n`

Plain text (books, web pages) has no turns; its tokens are all OTHER, so a region table of
a plain-text corpus shows one row, which is the honest answer.

A `Document` is an ordered tuple of `Span`s, each a piece of text with one region; a
special token is a span of its own. Tokenizing span by span (`sanlab.data.tokenizer`)
gives every token exactly one region without any offset bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

OTHER, QUERY, TRACE, ANSWER = 0, 1, 2, 3
REGION_NAMES: tuple[str, ...] = ("other", "query", "trace", "answer")

# Special tokens as atomic ids (SPEC §1.5). The order of this tuple *is* the id assignment.
PAD_ID, EOS_ID, BOS_ID, UNK_ID, IM_START_ID, IM_END_ID, THINK_ID, END_THINK_ID = range(8)
PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
IM_START, IM_END, THINK, END_THINK = "<|im_start|>", "<|im_end|>", "<think>", "</think>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, EOS, BOS, UNK, IM_START, IM_END, THINK, END_THINK)
SPECIAL_IDS: dict[str, int] = {s: i for i, s in enumerate(SPECIAL_TOKENS)}
N_SPECIAL = len(SPECIAL_TOKENS)


@dataclass(frozen=True)
class Span:
    """A piece of a document's text that lies wholly in one region."""

    text: str
    region: int


@dataclass(frozen=True)
class Document:
    """One training document: region-tagged spans plus its exercise type.

    `targets` are the short answers the answer region states (an entity, a number, a
    letter); they let an evaluation or a test check recall against context exactly.
    `draw_nats`, when the generator knows it, is the information its random draws put
    into each region (indexed by region id, in nats; `sanlab.data.floor`): the
    document's share of the corpus's entropy floor. BOS and EOS are not part of the
    spans: packing adds them.
    """

    spans: tuple[Span, ...]
    exercise: str
    targets: tuple[str, ...] = field(default=())
    draw_nats: tuple[float, ...] | None = None

    @property
    def text(self) -> str:
        """The full text, special tokens included, as one string."""
        return "".join(s.text for s in self.spans)

    def region_text(self, region: int) -> str:
        """The concatenated text of every span of `region` (special tokens included)."""
        return "".join(s.text for s in self.spans if s.region == region)

    def plain_text(self) -> str:
        """The text without special tokens: what the tokenizer is trained on."""
        return "".join(s.text for s in self.spans if s.text not in SPECIAL_IDS)


def chat_document(
    query: str,
    reasoning: str,
    answer: str,
    exercise: str,
    targets: tuple[str, ...] = (),
    draw_nats: Sequence[float] | None = None,
) -> Document:
    """A SYNTH-format document (SPEC §1.5), split into regions (SPEC §1.6).

    `<|im_start|>user\\n{query}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n{reasoning}\\n</think>\\n{answer}<|im_end|>`
    """
    spans = (
        Span(IM_START, OTHER),
        Span("user\n" + query, QUERY),
        Span(IM_END, OTHER),
        Span("\n", OTHER),
        Span(IM_START, OTHER),
        Span("assistant\n", ANSWER),
        Span(THINK, OTHER),
        Span("\n" + reasoning + "\n", TRACE),
        Span(END_THINK, OTHER),
        Span("\n" + answer, ANSWER),
        Span(IM_END, OTHER),
    )
    nats = tuple(float(x) for x in draw_nats) if draw_nats is not None else None
    return Document(spans=spans, exercise=exercise, targets=targets, draw_nats=nats)


def text_document(text: str, exercise: str = "text") -> Document:
    """A plain-text document: one span, region OTHER (it has no turns)."""
    return Document(spans=(Span(text, OTHER),), exercise=exercise)
