"""What a run shows on the terminal and in its log file.

By default: the runner's own lines, and the warnings and errors of TensorFlow and MLflow that matter.
`verbose=true` (or Hydra's `hydra.verbose`) brings back every library's INFO lines. The libraries speak
on separate channels, each quieted in its own way:

- TensorFlow's C++ logging writes to file descriptor 2. While TensorFlow loads, absl prints every line
  whatever TF_CPP_MIN_LOG_LEVEL says (absl is not initialised yet), so a CPU-only machine always gets the
  CUDA probe ("Could not find cuda drivers", "failed call to cuInit") and the oneDNN notice:
  load_tensorflow() imports TensorFlow and lets it probe for GPUs with those lines filtered out of fd 2.
  Afterwards TF_CPP_MIN_LOG_LEVEL (2 by default, set by runner.entry before anything imports
  TensorFlow) keeps C++ errors and drops INFO and WARNING lines such as "Input of GeneratorDatasetOp
  will not be optimized".
- TensorFlow's Python logger `tensorflow` ("Reduce to /job:localhost/... then broadcast", "Using
  MirroredStrategy with devices ...") and absl's Python logger `absl` ("Sharding callback duration") log
  INFO lines through Hydra's handlers: their level is WARNING unless verbose. So is matplotlib's, which says
  "generated new fontManager" the first time it draws a run's curves on a machine.
- MLflow reads MLFLOW_LOGGING_LEVEL when it is imported, here and in the tracker process and sweep jobs,
  which inherit the environment ("Creating initial MLflow database tables...").
- MLflow's client prints "View run ... at: ..." and "View experiment at: ..." to stdout whenever it ends a run on
  a tracking server (`set_terminated`), unless MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT is true; the runner logs its
  own link to the run (runner.tracking.ui) instead.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# C++ lines TensorFlow prints while it loads on a machine without a GPU: absl's note that it is not
# initialised, any INFO line (absl's format: I<mmdd> <time> <thread> <file>:<line>]), the CUDA probe's
# errors, and the second line of the CPU-instructions notice.
_LOADING_NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|I\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] "
    r"|[EW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] .*(cuInit|CUDA|cuda|cuDNN|cuFFT|cuBLAS|TensorRT)"
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\."
)
_PYTHON_LOGGERS = ("tensorflow", "absl", "matplotlib")


def is_verbose(verbose_key: bool, hydra_verbose) -> bool:
    """`verbose=true`, or Hydra's `hydra.verbose` (true, or the names of loggers to show at DEBUG)."""
    return verbose_key is True or bool(hydra_verbose)


def configure(verbose: bool) -> None:
    """Set the channels' levels; call before TensorFlow or MLflow is imported, here or in a child process."""
    if verbose:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
        os.environ["MLFLOW_LOGGING_LEVEL"] = "INFO"
        return
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    for name in _PYTHON_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def load_tensorflow(verbose: bool) -> None:
    """Import TensorFlow and let it look for GPUs (where the CUDA probe prints), quietly unless verbose."""
    with loading_tensorflow(verbose):
        import tensorflow as tf  # noqa: PLC0415  TensorFlow: loaded here, once the config is good

        tf.config.list_physical_devices("GPU")  # initialises CUDA if there is any: its errors print now


@contextmanager
def loading_tensorflow(verbose: bool) -> Iterator[None]:
    """A block that may import TensorFlow, its loading lines filtered out unless verbose: load_tensorflow, and
    the import of a user's `_target_` module that imports TensorFlow or tf_keras at its top."""
    if verbose:
        yield
        return
    try:
        with _filtered_stderr(lambda line: _LOADING_NOISE.match(line) is None):
            yield
    finally:
        for name in _PYTHON_LOGGERS:  # in case importing them reset their level
            logging.getLogger(name).setLevel(logging.WARNING)


@contextmanager
def _filtered_stderr(keep: Callable[[str], bool]) -> Iterator[None]:
    """Pass what this process writes to file descriptor 2 (C++ code included) through `keep`, line by line.

    A thread pumps a pipe that stands in for fd 2 to the real stderr as lines arrive, so a crash inside
    loses at most a line; the real fd 2 is back, and every line passed on, when the block ends."""
    sys.stderr.flush()
    real_stderr = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def pump() -> None:
        with os.fdopen(read_end, "rb") as pipe:
            for raw in pipe:
                if keep(raw.decode("utf-8", "replace")):
                    os.write(real_stderr, raw)

    thread = threading.Thread(target=pump, name="runner-stderr-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(real_stderr, 2)  # closes the pipe's only write end: the pump reads to the end and stops
        thread.join(timeout=10)
        os.close(real_stderr)
