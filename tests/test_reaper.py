"""The iterator reaper: finished iterators are released on its thread, never on the training thread.

TensorFlow's iterator destructor can wait seconds for tf.data's autotuning thread (docs/performance.md, "Where an
epoch's seconds went"); what these tests pin is where that destructor runs: a weakref's callback runs on the
thread that drops the object's last reference.
"""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np
import pytest
import tensorflow as tf

from helpers.waiting import wait_for
from runner.training.controller import make_evaluate
from runner.training.loop import EpochDatasets, make_loop
from runner.training.reaper import IteratorReaper
from runner.training.steps import ReplicaSteps, TrainingState

REAPER_THREAD = "runner-iterator-reaper"


class _Iterator:
    """An object whose release is seen: the thread it is dropped on, after `linger` seconds of its destructor."""

    def __init__(self, name: str, dropped: list[tuple[str, str]], linger: float = 0.0):
        self.name, self.dropped, self.linger = name, dropped, linger

    def __del__(self):
        time.sleep(self.linger)  # a slow destructor, as TensorFlow's iterator's can be
        self.dropped.append((self.name, threading.current_thread().name))


def test_a_release_is_dropped_on_the_reapers_thread_one_release_later_and_close_drops_the_last():
    dropped: list[tuple[str, str]] = []
    reaper = IteratorReaper()
    reaper.release(_Iterator("first", dropped))
    time.sleep(0.05)  # a sleep on purpose: a release that does not come cannot be waited for, only given time
    assert dropped == []  # held until the next release: the releasing function may still refer to it
    reaper.release(_Iterator("second", dropped))
    wait_for(lambda: dropped, timeout=10, what="the first release")
    assert dropped == [("first", REAPER_THREAD)]
    reaper.close()
    assert dropped == [("first", REAPER_THREAD), ("second", REAPER_THREAD)]
    assert not [thread for thread in threading.enumerate() if thread.name == REAPER_THREAD]


def test_close_waits_for_a_slow_release_and_a_reaper_used_as_a_context_manager_closes():
    dropped: list[tuple[str, str]] = []
    with IteratorReaper() as reaper:
        reaper.release(_Iterator("slow", dropped, linger=0.5))
        reaper.release(_Iterator("last", dropped, linger=0.5))
        started = time.monotonic()
    assert sorted(dropped) == [("last", REAPER_THREAD), ("slow", REAPER_THREAD)]  # on threads of their own
    assert time.monotonic() - started >= 0.5  # the last release's wait was close's, not the training thread's
    assert not [thread for thread in threading.enumerate() if thread.name == REAPER_THREAD]


def test_flush_drops_the_held_release_at_once():
    dropped: list[tuple[str, str]] = []
    with IteratorReaper() as reaper:
        reaper.release(_Iterator("last", dropped))
        reaper.flush()
        wait_for(lambda: dropped, timeout=10, what="the flushed release")
        assert dropped == [("last", REAPER_THREAD)]


@pytest.mark.alone  # the quick release must come within 1.5 s
def test_a_slow_release_delays_no_other():
    dropped: list[tuple[str, str]] = []
    reaper = IteratorReaper()
    reaper.release(_Iterator("slow", dropped, linger=2.0))
    reaper.release(_Iterator("quick", dropped))
    reaper.release(_Iterator("held", dropped))
    wait_for(lambda: dropped, timeout=1.5, what="the quick release, while the slow one still waits")
    assert dropped == [("quick", REAPER_THREAD)]
    reaper.close()
    assert sorted(dropped) == [("held", REAPER_THREAD), ("quick", REAPER_THREAD), ("slow", REAPER_THREAD)]


class _WatchingReaper(IteratorReaper):
    """The runner's reaper, noting for each iterator it is given the thread that finally drops it."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped_on: list[str] = []
        self.watched: list[weakref.ref] = []

    def release(self, iterator) -> None:
        self.watched.append(weakref.ref(iterator, lambda _: self.dropped_on.append(threading.current_thread().name)))
        super().release(iterator)


def _steps(strategy: tf.distribute.Strategy, global_batch: int) -> ReplicaSteps:
    with strategy.scope():
        state = TrainingState.create(
            lambda: tf.keras.Sequential([tf.keras.layers.Flatten(input_shape=(4, 4, 1)), tf.keras.layers.Dense(3)]),
            lambda variables: tf.keras.optimizers.SGD(0.1),
        )
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    return ReplicaSteps(strategy, state, global_batch, loss)


@pytest.mark.parametrize("style", ["for_in", "in_function"])
def test_a_loops_epochs_and_the_test_passes_release_each_passs_tf_data_iterator_on_a_reapers_thread(style):
    """Real distributed tf.data iterators (OneDeviceStrategy, a prefetching pipeline): the epochs of the loops that
    start an iterator each epoch and the test passes hand every iterator they finish to the reaper, and each is
    finalized on its thread."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    steps = _steps(strategy, global_batch=8)
    images = np.random.default_rng(0).random((40, 4, 4, 1), dtype=np.float32)
    labels = np.arange(40, dtype=np.int64) % 3

    def make_dataset(first_epoch=1, epochs=1, skip_batches=0):
        dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(8).skip(skip_batches)
        return strategy.experimental_distribute_dataset(dataset.prefetch(tf.data.AUTOTUNE))

    reaper = _WatchingReaper()
    loop = make_loop(style, steps, make_dataset, 5, 1, reaper=reaper)
    assert isinstance(loop.datasets, EpochDatasets)
    evaluate = make_evaluate(steps, make_dataset(), reaper)

    class _Progress:
        def advance(self, steps, loss, total):
            pass

    with reaper:
        for epoch in (1, 2):
            _, count = loop.train_epoch(epoch, _Progress())
            assert count == 5
            evaluate()
        assert len(reaper.watched) == 4  # an iterator per epoch and per test pass
        # All but the one held until the next release.
        wait_for(lambda: len(reaper.dropped_on) == 3, timeout=30, what="three releases")
        reaper.flush()  # after the last epoch (Trainer._release_iterators): the held one too, before close
        wait_for(lambda: len(reaper.dropped_on) == 4, timeout=30, what="the last release")
    assert reaper.dropped_on == [REAPER_THREAD] * 4
    assert all(ref() is None for ref in reaper.watched)
