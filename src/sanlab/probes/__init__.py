"""`sanlab probe`: what each architecture can do at all (SPEC §2).

    arms.py      arm presets (standard, san, frozen_qk, frozen_mlp, mixit) and custom arms
    evaluate.py  exact-match accuracy on the answer tokens of a split
    capacity.py  trainable parameters and memorization capacity in bits per parameter
    runner.py    one task × arm: probe data, LR sweep with boundary extension, results
    suite.py     the variants × tasks grid, its table, JSON and CSV
    cli.py       the command

The task generators live in `sanlab.data.probes`; training is the regular trainer.
"""
