"""What the binary task's AUC costs per epoch: the runner's rank AUC (runner.builtins.metrics.rank_auc, 2**17 bins)
against Keras' 200-threshold AUC (tf_keras.metrics.AUC) and no AUC, each updated inside a tf.function on batches of
64 probabilities as the replica step updates it, plus one result() per pass (a pass reads its metrics once) and one
reset. Timed in alternating rounds in one process, so that the machine's load hits them alike; the per-epoch figure
is the per-batch update times the batches of a Fashion-MNIST-sized epoch (60,000 examples) plus the result and reset:

    python -m bench.auc_cost
    python -m bench.auc_cost --calls 200 --repeats 9 --labels 3    # multi-label: three labels per example
"""

from __future__ import annotations

import argparse
import math

from runner.entry import prepare_for_tensorflow

prepare_for_tensorflow()

import numpy as np  # noqa: E402 (after TensorFlow's environment is set)
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from bench.report import markdown  # noqa: E402
from bench.run import machine  # noqa: E402
from bench.step_costs import interleaved_us  # noqa: E402
from runner.builtins.metrics import rank_auc  # noqa: E402

BATCH = 64
EPOCH_EXAMPLES = 60_000


def metrics(labels: int):
    """The AUCs compared, new: the runner's and Keras'."""
    several = labels > 1
    return {
        "rank AUC (runner.builtins.metrics.rank_auc)": rank_auc(
            multi_label=several, num_labels=labels if several else None
        ),
        "Keras AUC (tf_keras.metrics.AUC, 200 thresholds)": tf_keras.metrics.AUC(
            multi_label=several, num_labels=labels if several else None
        ),
    }


def measure(calls: int, repeats: int, labels: int) -> list[list[str]]:
    rng = np.random.default_rng(0)
    truth = tf.constant(rng.integers(0, 2, (BATCH, labels)).astype(np.float32))
    probabilities = tf.constant(rng.random((BATCH, labels), dtype=np.float32))
    updates, reads = {}, {}
    for name, metric in metrics(labels).items():

        def update_state(metric=metric) -> None:
            metric.update_state(truth, probabilities)

        update = tf.function(update_state)
        read = tf.function(lambda metric=metric: metric.result())
        update()
        read()
        updates[name], reads[name] = update, read
        metric.reset_state()
    baseline = tf.function(lambda: tf.identity(probabilities))  # a tf.function call that does nothing
    baseline()
    timed = interleaved_us(
        {
            **{f"update {n}": f for n, f in updates.items()},
            **{f"read {n}": f for n, f in reads.items()},
            "no AUC": baseline,
        },
        calls,
        repeats,
        lambda: None,
    )
    batches = math.ceil(EPOCH_EXAMPLES / BATCH)
    rows = []
    for name in updates:
        update = timed[f"update {name}"] - timed["no AUC"]
        read = timed[f"read {name}"]
        per_epoch_ms = (update * batches + read) / 1000
        rows.append([name, f"{update:.1f}", f"{read:.1f}", f"{per_epoch_ms:.0f}"])
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.auc_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per timing")
    parser.add_argument("--repeats", type=int, default=7, help="rounds; the medians are reported")
    parser.add_argument("--labels", type=int, default=1, help="labels per example (1: task=binary)")
    args = parser.parse_args(argv)
    print(f"Machine: {machine()}\n")
    rows = measure(args.calls, args.repeats, args.labels)
    header = [
        f"metric ({args.labels} label(s), batches of {BATCH})",
        "update per batch µs (beyond an empty call)",
        "result() µs",
        f"per epoch of {EPOCH_EXAMPLES:,} examples ms",
    ]
    print(markdown(header, "lrrr", rows))


if __name__ == "__main__":
    main()
