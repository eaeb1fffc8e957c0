"""The one exception type for problems a user can cause and fix (bad config, missing data, no TPU)."""


class RunnerError(Exception):
    """A user-facing error: its message is one paragraph naming the bad value and the fix."""
