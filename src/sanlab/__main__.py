"""`python -m sanlab …` (and `torchrun -m sanlab train …`)."""

from sanlab.cli import entry

entry()
