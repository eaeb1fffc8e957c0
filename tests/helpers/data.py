"""Data files written for a test: Fashion-MNIST's IDX layout holding random images."""

from __future__ import annotations

import gzip
import struct

import numpy as np


def write_idx(path, array: np.ndarray, compress: bool = True) -> None:
    """IDX: two zero bytes, a type code (0x08 = uint8), the rank, big-endian dims, then the data."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if compress:
        with gzip.open(path, "wb") as handle:
            handle.write(payload)
    else:
        path.write_bytes(payload)


def write_fashion_mnist(directory, train: int = 30, test: int = 10, compress: bool = True, seed: int = 0):
    """Fashion-MNIST's four files under their names in `directory`, random images and labels; the arrays."""
    from runner.data.idx import IDX_FILES

    rng = np.random.default_rng(seed)
    arrays = {
        "train_images": rng.integers(0, 256, (train, 28, 28)),
        "train_labels": rng.integers(0, 10, train),
        "test_images": rng.integers(0, 256, (test, 28, 28)),
        "test_labels": rng.integers(0, 10, test),
    }
    for key, stem in IDX_FILES.items():
        write_idx(directory / (stem + (".gz" if compress else "")), arrays[key], compress)
    return arrays
