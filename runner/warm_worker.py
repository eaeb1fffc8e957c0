"""A warm training worker of a sweep: one process that trains run after run, each as `python -m runner` would.

A sweep job on the basic, joblib or Ray launcher (runner.sweeps.launch.warm_pool) starts this process once, as
`python -m runner.warm_worker <reply fd>`, and hands it one run at a time on its standard input: a JSON line with
the run's command-line arguments, working directory and environment. The worker has imported TensorFlow, tf_keras,
MLflow, Hydra and the runner before the first run, and starts the next run's tracker process
(runner.tracking.tracker_process.start_spare) while it waits, so a run pays only for what is its own: Hydra's
compose, its strategy, data pipeline, model and optimizer (built fresh, seeded per run: runner.training.build), its
training, evaluation and model. It answers on the reply descriptor as soon as the run's outcome is written
(runner.outcome.listen_early), before the model's export and the MLflow run's end, which then finish while the job
goes on (runner.sweeps.launch.warm_pool); then it says it is free. It leaves nothing of the run behind: its
environment, working directory and command line are restored, its run directory let go (runner.run_lock), the Keras
session cleared.

What TensorFlow fixes for a whole process (the logical CPU devices of strategy.cpu_replicas, op determinism) is
fixed by the worker's first run: the pool gives a worker only runs that agree with it (WorkerKind). The worker
exits when its standard input closes (the pool retires it, or the job's process is gone), and stops as on
preemption once a process of its lifeline is gone (runner.lifeline: the sweep, killed).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import traceback
from typing import IO, Any

from runner.entry import prepare_for_tensorflow
from runner.lifeline import LIFELINE_VARIABLE, Process, stop_as_preempted, watch
from runner.outcome import FINISHED, Outcome, listen_early

log = logging.getLogger("runner")


def main(argv: list[str]) -> None:
    prepare_for_tensorflow()
    watch(then=_when_gone)  # once: the sweep (and the job's process) this worker serves; each run's is the worker's
    os.environ.pop(LIFELINE_VARIABLE, None)
    replies = os.fdopen(int(argv[0]), "w", buffering=1)
    from runner.tracking.tracker_process import discard_spare, start_spare  # noqa: PLC0415  after the lifeline's watch

    start_spare()  # its child imports MLflow beside this process's imports
    _load()
    answer = _Answer(replies)
    listen_early(answer.early)
    try:
        for line in sys.stdin:
            request = json.loads(line)
            answer.expect()
            code = _train(request["arguments"], request["cwd"], request["environ"])
            answer.late(code)
            replies.write(json.dumps({"done": code}) + "\n")
            if code != 0:  # a failed run may have left this process in any state: the pool retires the worker
                return
            start_spare()
    except BrokenPipeError:  # the job's process is gone (a killed sweep): nobody is left to answer
        pass
    finally:
        discard_spare()
    _exit_now()


def _exit_now() -> None:
    """Exit without the interpreter's teardown of TensorFlow and the rest (about a second a worker, which the sweep's
    end would wait for): every run has ended, and what is buffered is flushed here."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class _Answer:
    """A run's two replies: {"answer": status} once its job may go on (as soon as its outcome is written, before the
    model's export and the MLflow run's end, or else when the run has ended), then {"done": status} once the worker
    is free for the next run."""

    def __init__(self, replies: IO[str]):
        self.replies = replies
        self.given = False

    def expect(self) -> None:
        self.given = False

    def early(self, ended: Outcome) -> None:
        if not self.given and ended.status == FINISHED:
            self._give(0)

    def late(self, code: int) -> None:
        if not self.given:
            self._give(code)

    def _give(self, code: int) -> None:
        self.given = True
        try:
            self.replies.write(json.dumps({"answer": code}) + "\n")
        except BrokenPipeError:  # the job is gone: the run goes on to its end, then the worker exits
            pass


# Whether a run is being trained now (between taking it and its end).
_training: list[bool] = [False]


def _when_gone(gone: Process) -> None:
    """The sweep or the job's process is gone: a run in training stops as on preemption (then the worker exits, its
    standard input closed); an idle worker exits at once, its last run long ended."""
    if _training[0]:
        stop_as_preempted(gone)
    else:
        os._exit(0)


def _load() -> None:
    """Import what every run needs, TensorFlow's loading lines filtered as a run filters them."""
    from runner.verbosity import load_tensorflow  # noqa: PLC0415  after prepare_for_tensorflow

    load_tensorflow(os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0")
    import runner.__main__  # noqa: F401, PLC0415  Hydra, the config and the entry
    import runner.sweeps.study.pruning  # noqa: F401, PLC0415  an Optuna trial's reporter
    import runner.tracking.model_export  # noqa: F401, PLC0415  MLflow and its TensorFlow flavor
    import runner.train  # noqa: F401, PLC0415  the training core


def _train(arguments: list[str], cwd: str, environ: dict[str, str]) -> int:
    """One run, as `python -m runner <arguments>` in `cwd` with `environ` added; its exit status."""
    from runner.__main__ import cli  # noqa: PLC0415  loaded by _load
    from runner.training.progress import mark_run_taken  # noqa: PLC0415  loaded by _load

    mark_run_taken()
    _training[0] = True
    saved_environ, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    os.environ.update(environ)
    os.chdir(cwd)
    sys.argv = ["runner", *arguments]
    try:
        cli()
        code = 0
    except SystemExit as stop:
        code = _exit_status(stop.code)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # what would have ended `python -m runner` with a traceback
        traceback.print_exc()
        code = 1
    finally:
        _training[0] = False
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_environ)
        _forget_run()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _exit_status(code: Any) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _forget_run() -> None:
    """What a run leaves in the process: its run directory's lock, Keras' global state, its objects."""
    import tensorflow as tf  # noqa: PLC0415  loaded by _load

    from runner.compat.tf_internals import forget_tracing_counts  # noqa: PLC0415  TensorFlow: loaded by _load
    from runner.run_lock import release  # noqa: PLC0415  light

    release()
    tf.keras.backend.clear_session()
    forget_tracing_counts()
    if "keras" in sys.modules:  # a Keras 3 run's
        sys.modules["keras"].backend.clear_session()
    gc.collect()


if __name__ == "__main__":
    main(sys.argv[1:])
