"""User-facing errors.

A `SanlabError` is a user mistake or an impossible request (bad config, missing file,
impossible matching). The CLI prints its message on one line and exits with
`EXIT_USAGE`; it never shows a traceback for these.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # an unexpected internal error (a bug): traceback shown
EXIT_USAGE = 2  # user error: one line, no traceback
EXIT_DIVERGED = 3  # a training run diverged: a recorded result, not a crash
EXIT_INTERRUPTED = 4  # stopped by a signal after saving a checkpoint


class SanlabError(Exception):
    """An error caused by the user's input; its message is shown on one line."""


class ConfigError(SanlabError):
    """A config file or override that does not validate."""


class DataError(SanlabError):
    """Missing, empty, malformed or corrupt data."""


class CheckpointError(SanlabError):
    """A missing, corrupt or incompatible checkpoint."""


class MatchingError(SanlabError):
    """An impossible matching request."""
