"""Finished iterators released on a thread of their own, so that the training thread never waits for them.

Releasing a tf.data iterator (its last reference going) joins its input pipeline's background threads, and
TensorFlow's destructor waits there until a thread in a timed wait (tf.data's own, with no CPU used) notices
the cancellation: measured on a 2-core machine, from 2 ms to 3 s, after every pass over a dataset (each
epoch of `loop=for_in`, each test and validation pass). On the training thread that wait stalls the run;
on this one it overlaps the next epoch (docs/performance.md, "Where an epoch's seconds went").
"""

from __future__ import annotations

import queue
import threading
from typing import Any


class IteratorReaper:
    """`release(iterator)` hands over an iterator the caller has finished with; the reaper's thread drops it.

    An iterator reaches that thread one release later, once the function that released it has returned and
    no frame of the training thread refers to it any more (were the training thread's reference the last,
    the wait would be its own again). `close()` drops the last one and waits until every release is done;
    leaving the reaper as a context manager closes it. It must: a process that exits while TensorFlow is still
    releasing an iterator on another thread aborts (2 of 4 runs, measured)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._held: Any = None  # the latest release, queued at the next one
        self._thread: threading.Thread | None = None

    def release(self, iterator: Any) -> None:
        if self._held is not None:
            self._start().put(self._held)
        self._held = iterator

    def close(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._start().put(held)
        del held
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def __enter__(self) -> IteratorReaper:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _start(self) -> queue.SimpleQueue[Any]:
        if self._thread is None:
            # A daemon: a process that never closes its reaper still exits.
            self._thread = threading.Thread(target=self._drop_each, name="runner-iterator-reaper", daemon=True)
            self._thread.start()
        return self._queue

    def _drop_each(self) -> None:
        while (iterator := self._queue.get()) is not None:
            del iterator  # the last reference: TensorFlow's destructor runs (and waits) here
