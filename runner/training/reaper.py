"""Finished iterators released on threads of their own, so that the training thread never waits for them.

Releasing a tf.data iterator (its last reference going) joins its input pipeline's background threads, and
TensorFlow's destructor waits there until tf.data's autotuning thread leaves a timed wait, whose period grows
with the iterator's age (no CPU used): measured on a 2-core machine, from 2 ms to 8 s after a pass over a
dataset (each epoch of `loop=for_in` and `loop=in_function`, each test and validation pass), 16 s for the one
iterator of a `loop=iterator` run. On the training thread that wait stalls the run; on its own thread it
overlaps the next epoch (docs/performance.md, "Where an epoch's seconds went").
"""

from __future__ import annotations

import threading
from typing import Any


class IteratorReaper:
    """`release(iterator)` hands over an iterator the caller has finished with; a thread of its own drops it.

    An iterator is dropped one release later, once the function that released it has returned and no frame
    of the training thread refers to it any more (were the training thread's reference the last, the wait
    would be its own again); each on its own thread, so that one long wait delays no other release.
    `close()` drops the last one and waits until every release is done; leaving the reaper as a context
    manager closes it. It must: a process that exits while TensorFlow is still releasing an iterator on
    another thread aborts (2 of 4 runs, measured)."""

    def __init__(self) -> None:
        self._held: list[Any] = []  # the latest release, dropped at the next one
        self._dropping: list[threading.Thread] = []

    def release(self, iterator: Any) -> None:
        self.flush()
        self._held.append(iterator)

    def flush(self) -> None:
        """Drop the held iterator now, where no frame refers to it any more (after the last epoch): its wait,
        which grows with its age, then overlaps the end-of-run actions instead of lengthening `close()`."""
        if not self._held:
            return
        held, self._held = self._held, []  # the list is the only reference left: the thread empties it
        # A daemon, so that a process that never closes its reaper still ends.
        thread = threading.Thread(target=held.clear, name="runner-iterator-reaper", daemon=True)
        thread.start()
        self._dropping = [each for each in self._dropping if each.is_alive()] + [thread]

    def close(self) -> None:
        self.flush()
        for thread in self._dropping:
            thread.join()
        self._dropping = []

    def __enter__(self) -> IteratorReaper:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
