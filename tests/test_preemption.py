"""SIGTERM is recorded by the handler and raised only at safe points: never inside library code."""

import os
import signal
import threading

import pytest

from helpers.waiting import wait_for
from runner.clusters.preemption import PreemptionGuard
from runner.errors import Preempted


def _sigterm_self_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, args=(os.getpid(), signal.SIGTERM))
    timer.start()
    return timer


def test_a_sigterm_during_a_wait_lets_the_wait_finish_and_stops_at_the_next_check():
    """What ClusterCoordinator does while the chief reads a step's loss: wait on a threading.Event. A
    handler that raised there left the Condition's lock released twice ("release unlocked lock")."""
    guard = PreemptionGuard()
    result_ready = threading.Event()
    before = signal.getsignal(signal.SIGTERM)
    with guard.installed():
        _sigterm_self_after(0.1)
        threading.Timer(0.6, result_ready.set).start()
        assert result_ready.wait(timeout=10)  # the wait ends with its result, not with an exception
        assert guard.requested
        with pytest.raises(Preempted):
            guard.check()
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is the guard's only while it is installed


def test_a_sigterm_inside_a_deferred_block_is_raised_when_the_block_ends():
    guard = PreemptionGuard()
    written = []
    with guard.installed():
        guard.check()  # nothing requested: a safe point passes
        with pytest.raises(Preempted):
            with guard.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                wait_for(lambda: guard.requested, 10, "the SIGTERM handler to run", every=0.01)
                guard.check()  # inside the block the request waits
                written.append("checkpoint")
    assert written == ["checkpoint"]


def test_a_settled_run_finishes_its_ending_whatever_sigterm_comes():
    """Once a warm worker has answered its job with the run's result (settle), a SIGTERM no longer stops the run: its
    ending (the model's export, the run's end) finishes, so that no trial the sweep has counted is left unfinished."""
    guard = PreemptionGuard()
    ended = []
    with guard.installed():
        guard.settle()
        with guard.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            wait_for(lambda: guard.requested, 10, "the SIGTERM handler to run", every=0.01)
            ended.append("model exported")
        guard.check()  # a safe point after it: still no stop
        ended.append("run ended")
    assert ended == ["model exported", "run ended"]
