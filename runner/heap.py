"""glibc heap tuning for TensorFlow on CPU: keep freed memory in the process instead of handing it back.

TensorFlow's CPU kernels allocate and free scratch buffers (GEMM packing, convolution workspaces) in
every op, on the threads of its thread pools, whose glibc arenas return the freed top of their heap to
the kernel and fault it back in at the next op, a page fault per 4 KiB. Once a tf.distribute input
pipeline is running this happens on every step, and on a virtual machine, where page faults are dear,
it halves training speed (measured in docs/performance.md). Padding every heap top (M_TOP_PAD) keeps
that memory mapped. It is set before TensorFlow starts its threads, by the entry points (runner.entry).
"""

from __future__ import annotations

import ctypes
import os

# mallopt(3) parameter number of M_TOP_PAD in glibc's malloc.h.
_M_TOP_PAD = -2
DEFAULT_TOP_PAD_BYTES = 64 * 2**20
# Bytes of padding; 0 leaves glibc's default. glibc's own MALLOC_TOP_PAD_, when set, wins.
ENV_VAR = "RUNNER_MALLOC_TOP_PAD"


def keep_freed_memory() -> int | None:
    """Set glibc's M_TOP_PAD as configured; return the bytes set, or None where nothing was changed."""
    if "MALLOC_TOP_PAD_" in os.environ:
        return None
    try:
        pad = int(os.environ.get(ENV_VAR, DEFAULT_TOP_PAD_BYTES))
    except ValueError:
        return None
    if pad <= 0:
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
    except (OSError, AttributeError):  # no mallopt (macOS, Windows): nothing to tune
        return None
    return pad if mallopt(_M_TOP_PAD, pad) == 1 else None
