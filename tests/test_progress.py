"""The progress bar redraws only on a terminal: `progress=null` (the default) draws it when stderr is a terminal,
`true` always, `false` never; the per-epoch summary lines go out either way."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import termios
import threading

import pytest

from helpers.cli import cli_env, run_cli
from helpers.config import compose, mlflow_settings
from helpers.presets import TINY

# After TINY, whose progress=false the last value overrides.
DEFAULT_PROGRESS = "progress=null"


def _run_on_a_terminal(*args: str, cwd) -> tuple[int, str]:
    """`python -m runner <args>` with its stderr on a pseudo-terminal, as in an interactive shell; returns the
    exit status and what reached the terminal."""
    controller, terminal = os.openpty()
    # A terminal of 24 rows and 120 columns (a new pseudo-terminal has 0 columns, in which tqdm draws nothing).
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "runner", *args],
        cwd=cwd,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=terminal,
        stdin=subprocess.DEVNULL,
    )
    os.close(terminal)
    received = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the process closed its end
                return
            if not chunk:
                return
            received.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        status = process.wait(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(timeout=10)
    os.close(controller)
    return status, received.decode("utf-8", "replace")


@pytest.mark.slow
def test_a_run_draws_its_bar_on_a_terminal_and_none_into_a_pipe(tmp_path):
    args = [*TINY, DEFAULT_PROGRESS, "strategy=one_device", f"mlflow.tracking_uri=sqlite:///{tmp_path / 'm.db'}"]
    piped = run_cli(*args, "hydra.run.dir=piped", cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr[-3000:]
    assert "\r" not in piped.stderr, piped.stderr[-3000:]
    assert "epoch 1/1: train_loss" in piped.stdout + piped.stderr
    status, terminal = _run_on_a_terminal(*args, "hydra.run.dir=terminal", cwd=tmp_path)
    assert status == 0, terminal[-3000:]
    # The bar is there (the check above can fail): drawn and redrawn with carriage returns.
    assert "\repoch 1/1:" in terminal, terminal[-3000:]


def test_the_setting_is_null_by_default_and_takes_true_false_or_null():
    from omegaconf import OmegaConf

    from runner.config.settings import validate

    def progress(*overrides: str):
        return validate(OmegaConf.to_container(compose(list(overrides)), resolve=True)).progress

    assert progress() is None
    assert progress("progress=null") is None
    assert progress("progress=true") is True
    assert progress("progress=false") is False


def test_bar_enabled_follows_the_stream_unless_forced(tmp_path):
    from runner.training.progress import bar_enabled

    controller, terminal = os.openpty()
    try:
        with open(tmp_path / "log", "w") as file, os.fdopen(terminal, "w", closefd=False) as tty:
            assert bar_enabled(None, tty) is True
            assert bar_enabled(None, file) is False
            assert bar_enabled(True, file) is True
            assert bar_enabled(False, tty) is False
    finally:
        os.close(terminal)
        os.close(controller)


def test_a_sweep_job_asks_for_the_bar_only_when_the_sweep_is_on_a_terminal(tmp_path):
    """A sweep job's training process writes to the job's stderr: with progress=null the job asks
    for the bar when its own stderr, the sweep's, is a terminal."""
    from runner.sweeps.job.job import progress_overrides

    controller, terminal = os.openpty()
    try:
        with open(tmp_path / "log", "w") as file, os.fdopen(terminal, "w", closefd=False) as tty:
            assert progress_overrides(None, tty) == ["progress=true"]
            assert progress_overrides(None, file) == []  # submitit's and Ray's log files
            assert progress_overrides(False, tty) == []
            assert progress_overrides(True, file) == []  # the training process draws it anyway
    finally:
        os.close(terminal)
        os.close(controller)


def test_a_run_resumes_whatever_its_progress_setting_now(tmp_path):
    """`progress` and `verbose` change the terminal, not the run: resuming with another value is not refused,
    unlike another batch."""
    import pytest

    from runner.errors import RunnerError
    from runner.tracking.mlflow_tracker import MlflowTracker

    settings = mlflow_settings(f"sqlite:///{tmp_path / 'm.db'}")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = MlflowTracker(settings)
    run_id = first.start(str(run_dir), {"batch": 64, "progress": True, "verbose": False})
    first.finish(KeyboardInterrupt(), resumable=True)
    again = MlflowTracker(settings)
    assert again.start(str(run_dir), {"batch": 64, "progress": None, "verbose": True}) == run_id
    again.finish(KeyboardInterrupt(), resumable=True)
    with pytest.raises(RunnerError, match=r"batch=128 \(the run has 64\)"):
        MlflowTracker(settings).start(str(run_dir), {"batch": 128, "progress": True, "verbose": False})
