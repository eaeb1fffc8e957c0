"""What keeps a sweep's training processes from outliving it, with real processes: runner.lifeline (a process
given a lifeline gets SIGTERM once a process it watches is gone) and runner.run_lock.wait_while_held (a sweep job
waits for the process still holding its run directory). End to end, killing a real sweep:
tests/test_optuna_sweeps.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from helpers.waiting import wait_for
from runner.lifeline import LIFELINE_VARIABLE, SWEEP_PROCESS_VARIABLE, Process, lifeline, sweep_process
from runner.run_lock import LOCK_FILE, wait_while_held

pytestmark = pytest.mark.alone  # a watcher must notice a gone process within seconds

# A process that watches its lifeline (runner.lifeline.watch) and, on SIGTERM, writes `stopped` and exits 0.
_WATCHING = textwrap.dedent(
    """
    import logging, signal, sys, time
    from runner.lifeline import watch
    logging.basicConfig(level=logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: (open(sys.argv[1], "w").write("stopped"), sys.exit(0)))
    watch(period=0.1)
    print("watching", flush=True)
    time.sleep(60)  # trains on, until its SIGTERM
    sys.exit(3)
    """
)


def test_a_process_is_alive_until_it_ends_and_a_reused_pid_is_not_it():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        process = Process.of(sleeper.pid)
        assert process.start is not None and process.alive()
        assert not Process(sleeper.pid, process.start + 1).alive()  # the same pid, another process's start
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not process.alive()


def test_a_process_whose_lifeline_ends_stops_as_on_sigterm_within_seconds(tmp_path):
    sweep = subprocess.Popen(["sleep", "60"])  # the sweep, killed below
    stopped = tmp_path / "stopped"
    environ = {**os.environ, **lifeline([Process.this(), Process.of(sweep.pid)])}
    watcher = subprocess.Popen(
        [sys.executable, "-c", _WATCHING, str(stopped)], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert watcher.stdout is not None and watcher.stdout.readline().strip() == b"watching"
        time.sleep(0.5)  # a sleep on purpose: that it does not stop needs time to pass (its watch polls every 0.1 s)
        assert watcher.poll() is None  # every process it watches lives: it trains on
        sweep.kill()  # kill -9
        sweep.wait()
        started = time.monotonic()
        assert watcher.wait(timeout=10) == 0
        assert time.monotonic() - started < 5 and stopped.read_text() == "stopped"
        assert f"pid {sweep.pid} ended" in watcher.stderr.read().decode()  # it says why
    finally:
        for process in (sweep, watcher):
            process.kill()
            process.wait()


def test_without_a_lifeline_nothing_is_watched_and_the_sweep_process_is_read_back():
    from runner.lifeline import watch

    assert watch({}) is None and watch({LIFELINE_VARIABLE: ""}) is None
    this = Process.this()
    assert sweep_process({SWEEP_PROCESS_VARIABLE: f'{{"pid": {this.pid}, "start": {this.start}}}'}) == this
    assert sweep_process({}) is None


def test_a_job_waits_for_the_process_holding_its_run_directory_then_goes_on(tmp_path):
    # It holds the directory for as long as it lives (its sleep stands for a training that goes on).
    holding = f"from runner.run_lock import hold; import time; hold({str(tmp_path)!r}); time.sleep(60)"
    holder = subprocess.Popen([sys.executable, "-c", holding])
    told: list[int | None] = []
    waited: list[bool] = []
    try:
        wait_for(lambda: (tmp_path / LOCK_FILE).exists() and (tmp_path / LOCK_FILE).read_text().strip(), 30, "the hold")
        thread = threading.Thread(target=lambda: waited.append(wait_while_held(str(tmp_path), told.append)))
        thread.start()
        wait_for(lambda: told, 10, "the waiting message")
        assert told == [holder.pid]
        time.sleep(0.5)  # a sleep on purpose: that it goes on waiting needs time to pass
        assert thread.is_alive()  # still waiting while the holder lives
        holder.kill()
        thread.join(timeout=10)
        assert waited == [True]
    finally:
        holder.kill()
        holder.wait()
    assert wait_while_held(str(tmp_path), told.append) is False and told == [holder.pid]  # free: no wait
    assert wait_while_held(str(tmp_path / "new"), told.append) is False  # never held
