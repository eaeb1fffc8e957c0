"""IDX files, the format Fashion-MNIST (and MNIST) ship in: a zero-prefixed magic number, big-endian
dimensions, then the values."""

from __future__ import annotations

import functools
import gzip
import os
import zlib
from typing import Any

import numpy as np

from runner.errors import RunnerError

# Fashion-MNIST's image size: the IDX files hold (n, 28, 28) uint8 images.
IMAGE_SIZE = (28, 28)
IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str) -> np.ndarray:
    """Read one IDX file (optionally gzipped) into an array of its declared type and shape: read-only, and decoded
    once per process while the file is unchanged (a warm sweep worker's runs share it: runner.warm_worker)."""
    stat = os.stat(path)
    return _decoded(path, (stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size))


@functools.lru_cache(maxsize=len(IDX_FILES))
def _decoded(path: str, version: tuple[int, ...]) -> np.ndarray:
    """The array of the IDX file at `path` as it was at `version` (its inode, times and size)."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            raw = handle.read()
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise RunnerError(
            f"{path} is not a readable gzip file ({error}). Fix: replace it with an intact copy of the "
            "Fashion-MNIST file of that name, or give it without the .gz suffix if it is not compressed."
        ) from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise RunnerError(
            f"{path} is not an IDX file (bad magic number {raw[:4].hex() or 'empty'}). Fix: point "
            "dataset.dir at the original Fashion-MNIST files (train-images-idx3-ubyte.gz, ...)."
        )
    dtype, ndim = np.dtype(_IDX_DTYPES[raw[2]]), raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if len(raw) != expected:
        raise RunnerError(
            f"{path} is truncated or malformed: its header declares shape {shape} ({expected} bytes) "
            f"but the file holds {len(raw)} bytes. Fix: replace it with an intact copy."
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


def _find_idx(directory: str, stem: str) -> str:
    for candidate in (stem + ".gz", stem):
        path = os.path.join(directory, candidate)
        if os.path.exists(path):
            return path
    raise RunnerError(
        f"dataset.dir={directory!r} has no {stem}.gz (nor {stem}). Fix: point dataset.dir at a directory "
        f"holding all four Fashion-MNIST IDX files: {', '.join(f + '.gz' for f in IDX_FILES.values())}."
    )


def load_idx_directory(directory: str) -> tuple[np.ndarray, ...]:
    """(train_images, train_labels, test_images, test_labels) from the four IDX files in a directory."""
    arrays = [read_idx(_find_idx(directory, stem)) for stem in IDX_FILES.values()]
    for images, labels, split in ((arrays[0], arrays[1], "train"), (arrays[2], arrays[3], "test")):
        if images.ndim != 3 or images.shape[1:] != IMAGE_SIZE or labels.shape != images.shape[:1]:
            raise RunnerError(
                f"dataset.dir={directory!r}: the {split} files hold images {images.shape} and labels "
                f"{labels.shape}; expected (n, 28, 28) images and n labels. Fix: use Fashion-MNIST's own files."
            )
    return tuple(arrays)
