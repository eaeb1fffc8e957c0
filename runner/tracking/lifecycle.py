"""A job's MLflow run from its start to its end, in one place, and how its end is recorded (the error and
resumable tags).

On the way out of its block the run ends FINISHED, KILLED and resumable (a preemption), or FAILED with its
error in the `error` tag; a run that does not finish keeps no model. A step of that clean-up that fails (the
tracking server refusing to delete the model, say) is reported in one warning line and never keeps the run
from ending, nor hides the error that ended it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from runner.errors import Preempted
from runner.tracking.protocol import Tracker

log = logging.getLogger("runner")

# The tags of a run that did not finish: its error in words, and whether re-running the command resumes it.
ERROR_TAG = "error"
RESUMABLE_TAG = "resumable"


class RunLifecycle:
    def __init__(
        self,
        tracker: Tracker,
        discard_model: Callable[[], None] = lambda: None,
        explain: Callable[[BaseException], BaseException] = lambda error: error,
    ):
        """`discard_model`: delete the run's model (a run that does not finish has none); `explain`: the error
        as the user should read it (the same error, or a one-paragraph RunnerError that replaces it)."""
        self.tracker = tracker
        self.discard_model = discard_model
        self.explain = explain

    def __enter__(self) -> RunLifecycle:
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if error is None:
            self.tracker.finish()
            return False
        explained = self.explain(error)
        _reported("discarding the model of the run that did not finish", self.discard_model)
        resumable = isinstance(explained, Preempted)
        _reported("ending the MLflow run", lambda: self.tracker.finish(explained, resumable=resumable))
        if explained is not error:
            # Nothing may keep the replaced error's frames alive (the raised error's context, this frame's
            # arguments): TensorFlow's aborted all-reduce holds a thread pool there, which collected at interpreter
            # exit prints its own traceback after the paragraph.
            error.__traceback__ = None
            del error, traceback
            try:
                raise explained from None
            finally:
                explained.__context__ = None
        return False


def failure_message(error: BaseException, resumable: bool = False) -> str:
    """The `error` tag of a run that ended with `error` (KILLED and resumable, or FAILED)."""
    if resumable:
        return f"{error} (resume: re-run the same command with the same hydra.run.dir)"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _reported(what: str, step: Callable[[], None]) -> None:
    try:
        step()
    except Exception as failure:  # a clean-up step never hides the error that ended the run
        log.warning(
            "%s failed (%s: %s); the run's own error follows",
            what,
            type(failure).__name__,
            " ".join(str(failure).split())[:300],
        )
