"""Sharing trained models as 🤗 transformers folders (`sanlab export --hf`, `sanlab import --hf`).

- `sanlab.hf.export`: a run dir's checkpoint → a folder `AutoModelForCausalLM` loads
  (remote code in `sanlab.hf.remote`, or a stock architecture through `sanlab.hf.stock`);
- `sanlab.hf.importer`: such a folder → a run dir sanlab's commands read;
- `sanlab.hf.tokenizer`, `sanlab.hf.card`: the tokenizer files and the model card.

Nothing here imports transformers: exporting needs sanlab alone; loading needs transformers.
"""
