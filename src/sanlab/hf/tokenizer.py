"""The tokenizer files of an exported folder: the run's byte-level BPE as transformers reads it.

The ids are the run's own (SPEC §1.5: PAD 0, EOS 1, BOS 2, UNK 3, `<|im_start|>` 4,
`<|im_end|>` 5, `<think>` 6, `</think>` 7). Encoding adds BOS in front, as every training
document starts (`tokenizer(text)` gives exactly the ids `sanlab sample` feeds the model);
no EOS is added. The chat template writes the SYNTH format:

    <bos><|im_start|>user\\n{query}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n{reasoning}\\n</think>\\n{answer}<|im_end|>

(the assistant's `reasoning_content`, when given, becomes the `<think>` trace), and the
generation prompt is `\\n<|im_start|>assistant\\n` after the last turn.
"""

from __future__ import annotations

import json
from typing import Any

from tokenizers import Tokenizer, processors

from sanlab.data.regions import BOS, BOS_ID, END_THINK, EOS, IM_END, IM_START, PAD, SPECIAL_TOKENS, THINK, UNK

# transformers renders templates with trim_blocks: a newline right after a block tag is
# dropped, so the newlines of the format are written as expressions.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' and message.get('reasoning_content') is not none %}"
    "{{ '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n' }}"
    "{% endif %}"
    "{{ message['content'] + '<|im_end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '\\n<|im_start|>assistant\\n' }}{% endif %}"
)
EXTRA_SPECIAL = [IM_START, IM_END, THINK, END_THINK]


def with_bos(tok: Tokenizer) -> Tokenizer:
    """A copy of `tok` whose encode (with special tokens) puts BOS first."""
    out = Tokenizer.from_str(tok.to_str())
    out.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, BOS_ID)])
    return out


def files(tok: Tokenizer, seq_len: int) -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
    special: dict[str, Any] = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK,
                               "additional_special_tokens": EXTRA_SPECIAL}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": seq_len,
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(i): {"content": s, "special": True, "lstrip": False, "rstrip": False,
                                          "normalized": False, "single_word": False}
                                 for i, s in enumerate(SPECIAL_TOKENS)},
    }
    tokenizer_json = json.dumps(json.loads(with_bos(tok).to_str()), sort_keys=True, ensure_ascii=False)
    return {"tokenizer.json": tokenizer_json,
            "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n",
            "special_tokens_map.json": json.dumps(special, indent=2, ensure_ascii=False) + "\n"}
