"""The one exception type for problems a user can cause and fix (bad config, missing data, no TPU)."""

import logging
import sys


class RunnerError(Exception):
    """A user-facing error: its message is one paragraph naming the bad value and the fix. `key`: the config key
    it refuses, where it refuses one (the command-line check matches it to an override)."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


class Preempted(Exception):
    """The job was asked to stop (SIGTERM); it saves a checkpoint and can be resumed."""


def report(kind: str, message: object) -> str:
    """The paragraph a job ends with ("error: ...", "preempted: ..."): on the terminal on a line of its own, even
    while a progress bar is drawn there, and as the last line of the run's log file (Hydra's runner.log). Returns
    it, for the process's outcome (runner.outcome), which is where a supervisor reads it."""
    from runner.compat.tqdm_internals import close_open_bars  # noqa: PLC0415  tqdm: only once a paragraph is reported

    text = f"{kind}: {message}"
    # A progress bar still drawn ends its line first, so the paragraph starts a line of its own (which is where
    # whoever reads the terminal looks for it).
    close_open_bars()
    print(text, file=sys.stderr, flush=True)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and handler.stream is not None:
            handler.acquire()
            try:
                handler.stream.write(text + "\n")
                handler.flush()
            finally:
                handler.release()
    return text
