"""The `image_folder` dataset kind: dir/train/<class>/*.png and dir/test/<class>/*.png (the layout
tf.keras.utils.image_dataset_from_directory reads), streamed from disk and decoded in parallel.

Classes are the sub-folders of train/, in sorted order (label 0 is the first); images are uint8 (height,
width, channels), all resized to one size (by default the first training image's) so they batch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from runner.data.source import DataSplits, FileRecords
from runner.errors import RunnerError

IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")  # as image_dataset_from_directory lists them
COLOR_MODES = {"grayscale": 1, "rgb": 3, "rgba": 4}
LAYOUT = "dir/train/<class>/<image> and dir/test/<class>/<image>, one sub-folder per class"


def image_folder(
    dir: str,
    image_size: Sequence[int] | None = None,
    color_mode: str | None = None,  # noqa: A002
    shuffle_buffer: int = 10_000,
) -> DataSplits:
    """image_size: [height, width] (null: the first training image's); color_mode: grayscale, rgb or rgba
    (null: the first training image's channels)."""
    where = f"dataset.dir={dir!r}"
    root = _root(dir)
    _check_color_mode(color_mode)
    classes = _class_names(where, root)
    train_files, train_labels = _listing(where, root, "train", classes)
    test_files, test_labels = _listing(where, root, "test", classes)
    first = _first_image_shape(where, train_files[0])
    size = _size(image_size, first)
    channels = COLOR_MODES[color_mode] if color_mode is not None else first[2]
    decode_record = _record_decoder(size, channels)
    splits = [
        FileRecords(
            files,
            (*size, channels),
            "uint8",
            labels=labels,
            counts=[1] * len(files),
            decode_record=decode_record,
            shuffle_buffer=shuffle_buffer,
        )
        for files, labels in ((train_files, train_labels), (test_files, test_labels))
    ]
    return DataSplits(
        splits[0],
        splits[1],
        num_classes=len(classes),
        source={"uri": root},
        train_files=train_files,
        train_examples=len(train_files),
        test_examples=len(test_files),
    )


def _root(directory: str | None) -> str:
    """dataset.dir as an absolute path."""
    if directory is None:
        raise RunnerError(
            f"dataset.dir is missing: dataset=image_folder reads {LAYOUT}. Fix: pass dataset.dir=/path/to/images."
        )
    return os.path.abspath(os.path.expanduser(str(directory)))


def _check_color_mode(color_mode: str | None) -> None:
    if color_mode is not None and color_mode not in COLOR_MODES:
        raise RunnerError(
            f"dataset.color_mode={color_mode!r} is not one of {', '.join(COLOR_MODES)}. Fix: pick one, "
            "or null for the first image's channels."
        )


def _class_names(where: str, root: str) -> list[str]:
    """The sub-folders of train/, sorted (label 0 is the first), once both train/ and test/ are there."""
    for split in ("train", "test"):
        if not os.path.isdir(os.path.join(root, split)):
            raise RunnerError(f"{where}: there is no {split}/ folder in {root}. Fix: lay the images out as {LAYOUT}.")
    classes = sorted(entry.name for entry in os.scandir(os.path.join(root, "train")) if entry.is_dir())
    if not classes:
        raise RunnerError(
            f"{where}: {os.path.join(root, 'train')} has no class sub-folders. Fix: lay the images out as {LAYOUT}."
        )
    return classes


def _first_image_shape(where: str, file: str) -> tuple[int, int, int]:
    """The (height, width, channels) of the first training image, which the defaults are taken from."""
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: only once the config is valid

    try:
        first = tf.io.decode_image(tf.io.read_file(file), expand_animations=False, dtype=tf.uint8)
    except tf.errors.OpError as error:
        raise RunnerError(
            f"{where}: {file} is not a readable image ({type(error).__name__}). Fix: remove "
            "it or replace it with a PNG, JPEG, BMP or GIF file."
        ) from None
    height, width, channels = (int(d) for d in first.shape)
    return height, width, channels


def _size(image_size: Sequence[int] | None, first: tuple[int, int, int]) -> tuple[int, ...]:
    """The (height, width) every image is resized to: image_size, or the first image's."""
    if image_size is None:
        return first[:2]
    try:
        size = tuple(int(d) for d in image_size)
    except (TypeError, ValueError):
        size = ()
    if len(size) != 2 or min(size) < 1:
        raise RunnerError(
            f"dataset.image_size={image_size!r} is not a size. Fix: pass [height, width], e.g. "
            "dataset.image_size=[64,64], or null for the first image's size."
        )
    return size


def _record_decoder(size: tuple[int, ...], channels: int) -> Callable[[Any, Any], Any]:
    """FileRecords.decode_record: an image file's path and label -> its image, of `size` and `channels`."""
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: only once the config is valid

    shape = (*size, channels)

    def decode_record(path, label):
        image = tf.io.decode_image(tf.io.read_file(path), channels=channels, expand_animations=False, dtype=tf.uint8)
        image.set_shape((None, None, channels))
        # Images of another size are resized (bilinear, rounded back to uint8); same-sized ones pass untouched.
        image = tf.cond(
            tf.reduce_all(tf.shape(image)[:2] == size),
            lambda: image,
            lambda: tf.cast(tf.round(tf.clip_by_value(tf.image.resize(image, size), 0, 255)), tf.uint8),
        )
        return tf.ensure_shape(image, shape), label

    return decode_record


def _listing(where: str, root: str, split: str, classes: list[str]) -> tuple[list[str], list[int]]:
    """Every image under split/<class>/ (sub-folders included), class by class, sorted."""
    folder = os.path.join(root, split)
    unknown = sorted(entry.name for entry in os.scandir(folder) if entry.is_dir() and entry.name not in classes)
    if unknown:
        raise RunnerError(
            f"{where}: {folder} has class folders that train/ lacks ({', '.join(unknown)}). Fix: give "
            "train/ and test/ the same class sub-folders."
        )
    files, labels = [], []
    for label, name in enumerate(classes):
        for directory, subdirectories, names in os.walk(os.path.join(folder, name)):
            subdirectories.sort()
            for file in sorted(names):
                if file.lower().endswith(IMAGE_EXTENSIONS):
                    files.append(os.path.join(directory, file))
                    labels.append(label)
    if not files:
        raise RunnerError(
            f"{where}: {folder} holds no images ({', '.join(IMAGE_EXTENSIONS)}). Fix: lay the images out as {LAYOUT}."
        )
    return files, labels
