"""The tutorial's own training loop, standalone: the yardstick the runner is measured against.

"Custom training with tf.distribute.Strategy" as written: in-memory arrays, shuffle/batch/prefetch,
experimental_distribute_dataset, `for x in dist_dataset` calling a tf.function distributed step, model
and optimizer built under strategy.scope() before the first step. No Hydra, no MLflow, no runner code.

With `--fit`, the same model, data, batch and strategy train with tf_keras `model.fit` instead
(`--steps-per-execution` steps per call of its train function, `verbose=0`): the yardstick a user who
compares a custom loop with Keras would use.

Prints one JSON object per line, prefixed with `BENCH `: `first_step` when the first training step has
completed, and `epoch` with the epoch's training examples/second (the test pass is not timed).
"""

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # Keras 2, as the runner uses
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import gzip
import json
import time

import numpy as np
import tensorflow as tf

FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)


def report(event: str, **values) -> None:
    print("BENCH " + json.dumps({"event": event, **values}), flush=True)


def read_idx_gz(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as handle:
        raw = handle.read()
    ndim = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load(directory: str | None, train_examples: int, test_examples: int, seed: int):
    if directory:
        train_x, train_y, test_x, test_y = (read_idx_gz(os.path.join(directory, name)) for name in FILES)
    else:  # random stand-in of the same shape, when the files are absent
        rng = np.random.default_rng(seed)
        train_x, test_x = (rng.integers(0, 256, (n, 28, 28), dtype=np.uint8) for n in (60000, 10000))
        train_y, test_y = (rng.integers(0, 10, n, dtype=np.uint8) for n in (60000, 10000))
    train_x, train_y = train_x[:train_examples], train_y[:train_examples]
    test_x, test_y = test_x[:test_examples], test_y[:test_examples]
    scale = lambda x: (x[..., None] / np.float32(255)).astype(np.float32)  # noqa: E731
    return scale(train_x), train_y.astype(np.int64), scale(test_x), test_y.astype(np.int64)


def create_model() -> tf.keras.Model:
    regularizer = tf.keras.regularizers.L2(1e-5)
    return tf.keras.Sequential(
        [
            tf.keras.layers.Conv2D(32, 3, activation="relu", kernel_regularizer=regularizer),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(64, 3, activation="relu", kernel_regularizer=regularizer),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu", kernel_regularizer=regularizer),
            tf.keras.layers.Dense(10, kernel_regularizer=regularizer),
        ]
    )


def make_strategy(name: str, replicas: int) -> tf.distribute.Strategy:
    if name == "one_device":
        if replicas != 1:
            raise SystemExit("--strategy=one_device has one replica")
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    if replicas > 1:  # split the CPU into logical devices, before TensorFlow initialises
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    return tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])


class FitReport(tf.keras.callbacks.Callback):
    """`model.fit`'s epochs as the loop's `BENCH` lines: the first step, then each epoch's examples/s.

    An epoch is timed from the end of the one before (the start of training for the first), as the loops
    time theirs: fit makes the epoch's iterator before `on_epoch_begin`, and the loops count making theirs."""

    def __init__(self, examples: int):
        super().__init__()
        self._supports_tf_logs = True  # logs stay tensors: the batch hook reads nothing from the device
        self.examples = examples
        self.first_step_reported = False
        self.started = 0.0

    def on_train_begin(self, logs=None):
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if not self.first_step_reported:
            float(logs["loss"])  # wait for the step itself, not only its dispatch
            report("first_step")
            self.first_step_reported = True

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self.started  # fit has read the epoch's logs back from the device
        report(
            "epoch",
            epoch=epoch + 1,
            examples_per_second=self.examples / seconds,
            train_seconds=seconds,
            train_loss=float(logs["loss"]),
            train_accuracy=float(logs["accuracy"]),
        )
        self.started = time.perf_counter()


def train_with_fit(strategy, train_dataset, examples: int, epochs: int, steps_per_execution: int) -> None:
    """The same model, optimizer and loss (the mean over the global batch, plus the regularisation losses,
    which `fit` adds itself), compiled under the strategy's scope and trained with `model.fit`."""
    with strategy.scope():
        model = create_model()
        model.build((None, 28, 28, 1))
        model.compile(
            optimizer=tf.keras.optimizers.Adam(),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=steps_per_execution,
        )
    model.fit(train_dataset, epochs=epochs, verbose=0, callbacks=[FitReport(examples)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="directory of the four Fashion-MNIST IDX .gz files")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument(
        "--strategy",
        choices=("mirrored", "one_device"),
        default="mirrored",
        help="mirrored (the tutorial's) over --replicas logical CPUs, or one_device",
    )
    parser.add_argument("--batch", type=int, default=64, help="per replica")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-examples", type=int, default=60000)
    parser.add_argument("--test-examples", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fit", action="store_true", help="train with tf_keras model.fit instead of the loop")
    parser.add_argument("--steps-per-execution", type=int, default=1, help="with --fit: steps per call")
    args = parser.parse_args()

    tf.keras.utils.set_random_seed(args.seed)
    strategy = make_strategy(args.strategy, args.replicas)
    global_batch = args.batch * strategy.num_replicas_in_sync
    train_images, train_labels, test_images, test_labels = load(
        args.data_dir, args.train_examples, args.test_examples, args.seed
    )

    train_dataset = (
        tf.data.Dataset.from_tensor_slices((train_images, train_labels))
        .shuffle(len(train_labels))
        .batch(global_batch)
        .prefetch(tf.data.AUTOTUNE)
    )
    if args.fit:
        train_with_fit(strategy, train_dataset, len(train_labels), args.epochs, args.steps_per_execution)
        return
    test_dataset = tf.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(global_batch)
    train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
    test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)

    with strategy.scope():
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=tf.keras.losses.Reduction.NONE
        )

        def compute_loss(labels, predictions, model_losses):
            loss = tf.nn.compute_average_loss(loss_object(labels, predictions), global_batch_size=global_batch)
            if model_losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
            return loss

        test_loss = tf.keras.metrics.Mean(name="test_loss")
        train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
        test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")
        model = create_model()
        model.build((None, 28, 28, 1))
        optimizer = tf.keras.optimizers.Adam()
        optimizer.build(model.trainable_variables)

    def train_step(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = compute_loss(labels, predictions, model.losses)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        train_accuracy.update_state(labels, predictions)
        return loss

    def test_step(inputs):
        images, labels = inputs
        predictions = model(images, training=False)
        test_loss.update_state(loss_object(labels, predictions))
        test_accuracy.update_state(labels, predictions)

    @tf.function
    def distributed_train_step(dataset_inputs):
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    @tf.function
    def distributed_test_step(dataset_inputs):
        return strategy.run(test_step, args=(dataset_inputs,))

    first_step_reported = False
    for epoch in range(1, args.epochs + 1):
        started = time.perf_counter()
        total_loss, num_batches = 0.0, 0
        for x in train_dist_dataset:
            total_loss += distributed_train_step(x)
            num_batches += 1
            if not first_step_reported:
                float(total_loss)  # wait for the step itself, not only its dispatch
                report("first_step")
                first_step_reported = True
        train_loss = float(total_loss / num_batches)
        seconds = time.perf_counter() - started
        examples = int(train_accuracy.count.numpy())
        for x in test_dist_dataset:
            distributed_test_step(x)
        report(
            "epoch",
            epoch=epoch,
            examples_per_second=examples / seconds,
            train_seconds=seconds,
            train_loss=train_loss,
            train_accuracy=float(train_accuracy.result()),
            test_accuracy=float(test_accuracy.result()),
        )
        test_loss.reset_state()
        train_accuracy.reset_state()
        test_accuracy.reset_state()


if __name__ == "__main__":
    main()
