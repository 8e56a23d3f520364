"""User-facing errors.

A `SanlabError` is a user mistake or an impossible request (bad config, missing file,
impossible matching). The CLI prints its message on one line and exits with its
`exit_code` (`EXIT_USAGE` unless the class says otherwise); it never shows a traceback
for these.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # an unexpected internal error (a bug): traceback shown
EXIT_USAGE = 2  # user error: one line, no traceback
EXIT_DIVERGED = 3  # a training run diverged: a recorded result, not a crash
EXIT_INTERRUPTED = 4  # stopped by a signal after saving a checkpoint
EXIT_NO_SPACE = 5  # the disk filled up while writing (the previous checkpoint is intact)


class SanlabError(Exception):
    """An error caused by the user's input; its message is shown on one line."""

    exit_code = EXIT_USAGE


class ConfigError(SanlabError):
    """A config file or override that does not validate."""


class DataError(SanlabError):
    """Missing, empty, malformed or corrupt data."""


class CheckpointError(SanlabError):
    """A missing, corrupt or incompatible checkpoint."""


class MatchingError(SanlabError):
    """An impossible matching request."""


class NoSpaceError(SanlabError):
    """The disk (or quota) filled up while writing; what was there before is intact."""

    exit_code = EXIT_NO_SPACE
