"""sanlab: controlled architecture studies of language models.

Importing sanlab has no side effects: no device probing, no downloads, no process groups.
"""

__version__ = "0.2.0.dev0"
