"""The modeling code of an exported sanlab model (`sanlab export --hf`).

`configuration_sanlab.py` and `modeling_sanlab.py` are copied byte for byte into every
exported folder, where 🤗 transformers loads them with `trust_remote_code=True`. They
import torch and transformers only (never sanlab), so a user without sanlab installed can
load the model. They are written against the checkpoint format (parameter names) and the
run's `config.json`, not against sanlab's model code.
"""
